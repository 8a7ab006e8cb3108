// The Hopper backward kernels' loads by TMA: the tensor maps of Q, K, V and dO (encoded on the
// host where they can describe the inputs) and the copies of K and V once and of one step's
// Q, dO and statistics, each issued by one thread and completing on an mbarrier. Where the maps
// cannot serve, the kernels load by every thread's cp.async (common/bwd_step.cuh) instead.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda.h>
#include <cuda_bf16.h>

#include "cuda/flash/params.hpp"
#include "cuda/sm90/pipeline.cuh"
#include "cuda/sm90/tensor_map.hpp"

namespace flashattn {
namespace sm90 {

// A backward main kernel's one parameter (a __grid_constant__, so that the maps are
// addressable).
struct BwdTmaArgs {
  CUtensorMap q, k, v, dout;  // [batch, heads, rows, head dim]; set only when `tma`
  cuda::BwdParams p;
  bool tma;  // the loads by TMA (else by every thread's cp.async)
};

// Encodes the maps for query boxes of block_m rows and key boxes of block_n rows; false where
// they cannot serve: a packed batch (rows past a sequence's end would read the next one's, not
// zeros), or a view the encoder refuses (strides that are not multiples of 16 bytes, such as
// head dim 100 in [batch, rows, heads, 100]).
template <class T>
bool encode_bwd_maps(BwdTmaArgs& a, int block_m, int block_n) {
  const cuda::BwdParams& p = a.p;
  if (p.cu_seqlens_q != nullptr || p.cu_seqlens_k != nullptr) return false;
  constexpr bool kBf16 = std::is_same<T, __nv_bfloat16>::value;
  const TensorMapView q{p.q, kBf16, p.head_dim, p.seqlen_q, p.heads_q, p.batch,
                        p.q_row_stride, p.q_head_stride, p.q_batch_stride};
  const TensorMapView k{p.k, kBf16, p.head_dim, p.seqlen_k, p.heads_kv, p.batch,
                        p.k_row_stride, p.k_head_stride, p.k_batch_stride};
  const TensorMapView v{p.v, kBf16, p.head_dim_v, p.seqlen_k, p.heads_kv, p.batch,
                        p.v_row_stride, p.v_head_stride, p.v_batch_stride};
  const TensorMapView dout{p.dout, kBf16, p.head_dim_v, p.seqlen_q, p.heads_q, p.batch,
                           p.do_row_stride, p.do_head_stride, p.do_batch_stride};
  return encode_tensor_map(&a.q, q, block_m) && encode_tensor_map(&a.k, k, block_n) &&
         encode_tensor_map(&a.v, v, block_n) && encode_tensor_map(&a.dout, dout, block_m);
}

// Whether the kernel loads by TMA, read through a shuffle so that the compiler knows it is
// uniform (branches on it stay non-divergent around the wgmmas).
__device__ __forceinline__ bool bwd_uses_tma(const BwdTmaArgs& a) {
  return __shfl_sync(0xffffffffu, a.tma ? 1 : 0, 0) != 0;
}

// K and V rows [n0, n0 + rows of TileKV) of a kv head, completing on `bar` (one thread).
template <class TileKV, class T>
__device__ __forceinline__ void tma_load_kv(const BwdTmaArgs& a, uint64_t* bar, T* sK, T* sV,
                                            int n0, int head_kv, int batch) {
  prefetch_tensor_map(&a.q);
  prefetch_tensor_map(&a.dout);
  mbar_arrive_expect_tx(bar, 2 * TileKV::kElems * sizeof(T));
#pragma unroll
  for (int cb = 0; cb < TileKV::kColBlocks; ++cb) {
    tma_load_4d(sK + cb * TileKV::kRows * 64, &a.k, bar, cb * kTmaBoxCols, n0, head_kv, batch);
    tma_load_4d(sV + cb * TileKV::kRows * 64, &a.v, bar, cb * kTmaBoxCols, n0, head_kv, batch);
  }
}

// One step's tiles, completing on `bar` (one thread): rows of query block m_block of `head`
// from Q and dO in boxes of 64 columns (rows past seqlen_q read as zero), and their LSE*log2(e)
// and D into stats[0, kBlockM) and stats[kBlockM, 2 kBlockM) by bulk copy (the workspace's
// padded rows hold +inf and 0).
template <class TileQ, class T>
__device__ __forceinline__ void tma_load_step(const BwdTmaArgs& a, uint64_t* bar, T* sQ, T* sdO,
                                              float* stats, int batch, int head, int m_block) {
  constexpr int kBlockM = TileQ::kRows;
  constexpr uint32_t kStatBytes = kBlockM * sizeof(float);
  const cuda::BwdParams& p = a.p;
  const int m0 = m_block * kBlockM;
  mbar_arrive_expect_tx(bar, 2 * TileQ::kElems * sizeof(T) + 2 * kStatBytes);
#pragma unroll
  for (int cb = 0; cb < TileQ::kColBlocks; ++cb) {
    tma_load_4d(sQ + cb * kBlockM * 64, &a.q, bar, cb * kTmaBoxCols, m0, head, batch);
    tma_load_4d(sdO + cb * kBlockM * 64, &a.dout, bar, cb * kTmaBoxCols, m0, head, batch);
  }
  const int64_t row = (int64_t(batch) * p.heads_q + head) * p.seqlen_q_rounded + m0;
  bulk_load(stats, p.lse_log2 + row, kStatBytes, bar);
  bulk_load(stats + kBlockM, p.dsum + row, kStatBytes, bar);
}

}  // namespace sm90
}  // namespace flashattn
