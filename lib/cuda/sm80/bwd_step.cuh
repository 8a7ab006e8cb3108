// What every backward main kernel (sm80, and the sm90 ones) shares: the key block a CTA owns
// and the steps it takes over query blocks, the loads of K, V and of one step's tiles, and the
// masks of a score tile held transposed (rows = keys, columns = queries).
#pragma once

#include <cstdint>

#include "cuda/flash/params.hpp"
#include "cuda/sm80/ptx.cuh"
#include "cuda/sm80/tile.cuh"

namespace flashattn {
namespace sm80 {

// One CTA's key block (blockIdx: key block, kv head, batch) and its steps: the query blocks it
// meets (with the causal mask, rows i >= n0 - diag only), for each query head of its group in
// turn.
template <int kBlockM, int kBlockN>
struct BwdBlock {
  int n_block, head_kv, batch;
  int n0;      // first key
  int rows_k;  // keys in the block
  int diag;    // seqlen_k - seqlen_q: the causal mask's bottom-right alignment
  int m_begin, m_end;
  int steps;

  __device__ explicit BwdBlock(const cuda::BwdParams& p)
      : n_block(blockIdx.x), head_kv(blockIdx.y), batch(blockIdx.z) {
    n0 = n_block * kBlockN;
    rows_k = min(kBlockN, p.seqlen_k - n0);
    diag = p.seqlen_k - p.seqlen_q;
    m_begin = p.causal ? max(0, n0 - diag) / kBlockM : 0;
    m_end = (p.seqlen_q + kBlockM - 1) / kBlockM;
    steps = max(0, m_end - m_begin) * p.group;
  }
  __device__ int first_head(const cuda::BwdParams& p) const { return head_kv * p.group; }
  // The step after (head, m_block).
  __device__ void next(int& head, int& m_block) const {
    if (++m_block == m_end) {
      m_block = m_begin;
      ++head;
    }
  }
};

// K and V rows of the block into their tiles (part of the caller's cp.async group).
template <class TileKV, int kThreads, class T, class Block>
__device__ __forceinline__ void load_kv(const cuda::BwdParams& p, const Block& b, T* sK, T* sV,
                                        int tid) {
  const T* kg = static_cast<const T*>(p.k) + b.batch * p.k_batch_stride +
                b.head_kv * p.k_head_stride + int64_t(b.n0) * p.k_row_stride;
  const T* vg = static_cast<const T*>(p.v) + b.batch * p.v_batch_stride +
                b.head_kv * p.v_head_stride + int64_t(b.n0) * p.v_row_stride;
  load_tile<TileKV, kThreads>(sK, kg, p.k_row_stride, b.rows_k, p.head_dim, tid);
  load_tile<TileKV, kThreads>(sV, vg, p.v_row_stride, b.rows_k, p.head_dim, tid);
}

// dK and dV of the block, staged (converted) in the K and V tiles, to global memory.
template <class TileKV, int kThreads, class T, class Block>
__device__ __forceinline__ void store_dkdv(const cuda::BwdParams& p, const Block& b, const T* sdK,
                                           const T* sdV, int tid) {
  T* dkg = static_cast<T*>(p.dk) + b.batch * p.dk_batch_stride + b.head_kv * p.dk_head_stride +
           int64_t(b.n0) * p.dk_row_stride;
  T* dvg = static_cast<T*>(p.dv) + b.batch * p.dv_batch_stride + b.head_kv * p.dv_head_stride +
           int64_t(b.n0) * p.dv_row_stride;
  store_tile<TileKV, kThreads>(dkg, p.dk_row_stride, sdK, b.rows_k, p.head_dim, tid);
  store_tile<TileKV, kThreads>(dvg, p.dv_row_stride, sdV, b.rows_k, p.head_dim, tid);
}

// One step's tiles: rows of query block m_block of `head` from Q and dO, and their LSE*log2(e)
// and D into stats[0, kBlockM) and stats[kBlockM, 2 kBlockM) (padded rows of the workspace hold
// +inf and 0, so they need no predicate). Part of the caller's cp.async group.
template <class TileQ, int kThreads, class T>
__device__ __forceinline__ void load_bwd_step(const cuda::BwdParams& p, int batch, int head,
                                              int m_block, T* sQ, T* sdO, float* stats,
                                              int tid) {
  constexpr int kBlockM = TileQ::kRows;
  const int m0 = m_block * kBlockM;
  const T* qg = static_cast<const T*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride +
                int64_t(m0) * p.q_row_stride;
  const T* dog = static_cast<const T*>(p.dout) + batch * p.do_batch_stride +
                 head * p.do_head_stride + int64_t(m0) * p.do_row_stride;
  load_tile<TileQ, kThreads>(sQ, qg, p.q_row_stride, p.seqlen_q - m0, p.head_dim, tid);
  load_tile<TileQ, kThreads>(sdO, dog, p.do_row_stride, p.seqlen_q - m0, p.head_dim, tid);
  constexpr int kChunks = kBlockM / 4;  // 16-byte chunks per statistic
  if (tid < 2 * kChunks) {
    const int64_t row = (int64_t(batch) * p.heads_q + head) * p.seqlen_q_rounded + m0;
    const float* src = (tid < kChunks ? p.lse_log2 : p.dsum) + row + (tid % kChunks) * 4;
    cp_async_16(smem_u32(stats + tid * 4), src, 16);
  }
}

// Deterministic dQ: the key blocks add into a query block's accumulator in key-block order,
// behind a per-query-block semaphore (zeroed by the preprocess). CTA-wide: waits until it is
// key block n_block's turn.
__device__ __forceinline__ void wait_dq_turn(int* sem, int n_block) {
  if (threadIdx.x == 0) {
    while (atomicAdd(sem, 0) != n_block) {
    }
    __threadfence();
  }
  __syncthreads();
}
// CTA-wide: hands the turn on, once every thread's adds are complete and visible (each thread
// fences or waits for its own before calling).
__device__ __forceinline__ void pass_dq_turn(int* sem, int n_block) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicExch(sem, n_block + 1);
  }
}

// Zeroes the masked probabilities of a transposed score tile in the accumulator layout (this
// thread: rows key0 and key0 + 8, columns q0 + 8 j + 2 t (+1) for j < kCols / 8, element
// 4 j + 2 hh + e): keys past seqlen_k, and with the causal mask keys after the query's diagonal
// (key > query + diag). One threshold per row; the column test is against compile-time values.
template <int kCols>
__device__ __forceinline__ void mask_transposed(float (&acc)[kCols / 2], int key0, int q0,
                                                int t, int diag, int seqlen_k, bool causal) {
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const int key = key0 + hh * 8;
    int lo = causal ? key - q0 - diag : 0;  // columns below lo are masked
    if (key >= seqlen_k) lo = kCols;
    lo -= 2 * t;
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (8 * j + e < lo) acc[4 * j + 2 * hh + e] = 0.0f;
      }
    }
  }
}

}  // namespace sm80
}  // namespace flashattn
