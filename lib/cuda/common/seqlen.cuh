// Where one batch entry's rows are and how many there are. Fixed shapes today: every batch entry
// holds seqlen_q queries and seqlen_k keys at batch * batch_stride. This is the one place that
// learns about packed variable-length batches and per-sequence KV-cache lengths.
#pragma once

#include <cstdint>

namespace flashattn {
namespace common {

struct SeqlenInfo {
  int seqlen_q, seqlen_k;

  template <class Params>
  __device__ __forceinline__ SeqlenInfo(const Params& p, int /*batch*/)
      : seqlen_q(p.seqlen_q), seqlen_k(p.seqlen_k) {}
};

}  // namespace common
}  // namespace flashattn
