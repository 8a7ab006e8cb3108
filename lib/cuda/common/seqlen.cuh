// Where one batch entry's rows are and how many there are: the one place that knows fixed
// shapes from packed variable-length batches and from KV caches. Fixed: every entry holds
// seqlen_q queries and seqlen_k keys at batch * batch_stride. Variable-length: the tensors are
// packed, their batch strides 0, and sequence b owns rows [cu_seqlens[b], cu_seqlens[b + 1]);
// seqlen_q and seqlen_k of the parameters are then the largest lengths (the grids' extents). A
// KV cache: seqlen_q queries each, and the cache's first cache_seqlens[b] + seqlen_new keys
// (seqlen_k of the parameters is the capacity).
#pragma once

#include <cstdint>

namespace flashattn {
namespace common {

struct SeqlenInfo {
  int seqlen_q, seqlen_k;
  int offset_q, offset_k;  // the entry's first row in the (packed) tensors

  // may_be_packed = false (a constant in kernels compiled for fixed shapes only) reads the
  // parameters alone: the lengths then stay uniform values the compiler keeps in the uniform
  // datapath, as the address arithmetic built on them.
  template <class Params>
  __device__ __forceinline__ SeqlenInfo(const Params& p, int batch, bool may_be_packed = true) {
    // (Only the forward's parameters have a cache: the backward kernels keep their code.)
    if constexpr (Params::kHasCache) {
      if (may_be_packed && p.cache_seqlens != nullptr) {
        offset_q = offset_k = 0;
        seqlen_q = p.seqlen_q;
        seqlen_k = p.cache_seqlens[batch * p.cache_seqlens_stride] + p.seqlen_new;
        return;
      }
    }
    if (may_be_packed && p.cu_seqlens_q != nullptr) {
      const int64_t sq = p.cu_seqlens_q_stride, sk = p.cu_seqlens_k_stride;
      offset_q = p.cu_seqlens_q[batch * sq];
      offset_k = p.cu_seqlens_k[batch * sk];
      seqlen_q = p.cu_seqlens_q[(batch + 1) * sq] - offset_q;
      seqlen_k = p.cu_seqlens_k[(batch + 1) * sk] - offset_k;
    } else {
      offset_q = offset_k = 0;
      seqlen_q = p.seqlen_q;
      seqlen_k = p.seqlen_k;
    }
  }
};

}  // namespace common
}  // namespace flashattn
