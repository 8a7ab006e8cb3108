// The decode kernel's fixed shape and its split of the keys, as the host plan and the kernels
// both see them.
#pragma once

#include <cstdint>

#include "cuda/flash/params.hpp"

#ifndef __CUDACC__
#define FLASHATTN_HD
#else
#define FLASHATTN_HD __host__ __device__
#endif

namespace flashattn {
namespace decode {

constexpr int kRows = 16;      // packed query rows of a CTA: query tokens x heads of one KV group
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kWarpKeys = 16;  // each warp's keys of a block
constexpr int kBlockN = kWarps * kWarpKeys;
constexpr int kStages = 3;     // K/V blocks in the ring: two in flight while one is read

// The keys of each sequence in `splits` ranges of blocks_per_split key blocks (kBlockN keys);
// splits == 1 writes the output directly, more write fp32 partials that a second launch merges.
constexpr int kMaxSplits = 128;

struct DecodeSplit {
  int splits = 1;
  int blocks_per_split = 0;
  // The merge of the splits launched as a programmatic dependent of the decode grid (devices of
  // sm_90 on), its launch overlapping the decode grid's run.
  bool overlap_launch = false;
};

// The partials in the workspace: O [splits, batch, heads_q, seqlen_q, padded head dim] (fp32,
// rows of 16-byte chunks), then LSE [splits, batch, heads_q, seqlen_q]; seqlen_q is the longest
// sequence's.
FLASHATTN_HD inline int64_t partial_rows(const cuda::FwdParams& p, const DecodeSplit& s) {
  return int64_t(s.splits) * p.batch * p.heads_q * p.seqlen_q;
}
FLASHATTN_HD inline int64_t partial_row(const cuda::FwdParams& p, const DecodeSplit& s, int split,
                                        int batch, int head, int token) {
  (void)s;
  return ((int64_t(split) * p.batch + batch) * p.heads_q + head) * p.seqlen_q + token;
}

}  // namespace decode
}  // namespace flashattn

#undef FLASHATTN_HD
