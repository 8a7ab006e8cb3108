// What every backward main kernel (sm80, and the sm90 ones) shares: the key block a CTA owns
// and the steps it takes over query blocks, the loads of K, V and of one step's tiles, and the
// deterministic turn-taking of the dQ additions.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "cuda/common/bwd_repair.cuh"
#include "cuda/common/mask.cuh"
#include "cuda/common/scheduler.cuh"
#include "cuda/common/seqlen.cuh"
#include "cuda/flash/params.hpp"
#include "cuda/common/ptx.cuh"
#include "cuda/common/tile.cuh"

namespace flashattn {
namespace common {

// The backward's main kernels run one CTA per (key block, kv head, batch), in a 1-D grid. In
// deterministic mode each head's last key block is launched first: the dQ turns go in
// descending key-block order (BwdBlock::dq_turn), and a CTA may only wait for CTAs launched
// before it. Without a right bound to the window (no causal mask), a head's key blocks all start
// at the same query block and must go one turn apart; launched head after head, the blocks of a
// wave would start together and fall into line at every wave. So their heads are interleaved
// in groups of about a wave (one CTA per SM): the CTAs freed as a group's blocks finish take the
// next group's blocks in the order in which these need to start. Under a causal mask the blocks
// start at their diagonals, in line already, and head after head keeps each wave's blocks of
// mixed lengths, which ends the grid evener (kernel log, run 109).
template <int kBlockN>
__device__ inline TileScheduler key_blocks(const cuda::BwdParams& p) {
  const int n_blocks = (p.seqlen_k + kBlockN - 1) / kBlockN;
  if (!p.deterministic) return TileScheduler{n_blocks, p.heads_kv, p.batch, TileOrder::kHeadMajor};
  if (p.window_right >= 0) {
    return TileScheduler{n_blocks, p.heads_kv, p.batch, TileOrder::kHeadMajorReversed};
  }
  const int wave_heads = (sm_id_count() + n_blocks - 1) / n_blocks;
  return TileScheduler{n_blocks, p.heads_kv, p.batch, TileOrder::kInterleavedReversed,
                       wave_heads};
}

// Launches a main kernel over key_blocks of p; the kernel takes `args` (p itself, or a struct
// holding it beside what else the kernel reads, such as tensor maps).
template <class Kernel, class Args>
cudaError_t launch_key_blocks(Kernel kernel, const cuda::BwdParams& p, const Args& args,
                              int block_n, int threads, int smem_bytes, cudaStream_t stream) {
  const int64_t blocks =
      TileScheduler{(p.seqlen_k + block_n - 1) / block_n, p.heads_kv, p.batch}.num_tiles();
  if (blocks > INT32_MAX) return cudaErrorNotSupported;
  cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err != cudaSuccess) return err;
  kernel<<<static_cast<unsigned>(blocks), threads, smem_bytes, stream>>>(args);
  return cudaGetLastError();
}
template <class Kernel>
cudaError_t launch_key_blocks(Kernel kernel, const cuda::BwdParams& p, int block_n, int threads,
                              int smem_bytes, cudaStream_t stream) {
  return launch_key_blocks(kernel, p, p, block_n, threads, smem_bytes, stream);
}

// One CTA's key block and its steps: the query blocks that see a key of it (the mask's
// m_block_range), for each query head of its group in turn.
// kMayBePacked: the kernel may run a packed variable-length batch (its general loop); the plain
// kernels read fixed shapes only (SeqlenInfo's may_be_packed).
template <int kBlockM, int kBlockN, bool kMayBePacked>
struct BwdBlock {
  int n_block, head_kv, batch;
  SeqlenInfo seq;
  int n0;      // first key
  int rows_k;  // keys in the block (<= 0: a block past its sequence's end, with no steps)
  int m_begin, m_end;
  int steps;

  __device__ explicit BwdBlock(const cuda::BwdParams& p)
      : BwdBlock(p, key_blocks<kBlockN>(p).at(blockIdx.x)) {}
  __device__ BwdBlock(const cuda::BwdParams& p, TileCoord c)
      : n_block(c.m_block),
        head_kv(c.head),
        batch(c.batch),
        seq(p, c.batch, kMayBePacked),
        n0(c.m_block * kBlockN),
        rows_k(min(kBlockN, seq.seqlen_k - c.m_block * kBlockN)) {
    mask_of(p, seq).m_block_range(n0, rows_k, kBlockM, m_begin, m_end);
    if (rows_k <= 0) m_end = m_begin;
    steps = (m_end - m_begin) * p.group;
  }
  __device__ WindowMask mask(const cuda::BwdParams& p) const { return mask_of(p, seq); }
  __device__ int first_head(const cuda::BwdParams& p) const { return head_kv * p.group; }
  // Deterministic dQ: this key block's turn among those that add into query block m_block, 0
  // for the last key block that sees it. The key blocks a query block sees are contiguous, so
  // the turns are too. Descending, because that is the order in which they reach it under a
  // causal mask or a window (key block n starts at query block ~2n, n - 1 gets there two steps
  // later); ascending, the diagonal CTAs would wait most of their life for key block 0
  // (kernel log, run 106).
  __device__ int dq_turn(const cuda::BwdParams& p, int m_block) const {
    int begin, end;
    mask(p).n_block_range(m_block * kBlockM, kBlockM, kBlockN, begin, end);
    return end - 1 - n_block;
  }
  // Deterministic dQ: the semaphore of query block m_block of `head`, an index into
  // p.dq_semaphore. An int: 2^31 semaphores would stand for a 32 TB fp32 dQ accumulator.
  __device__ int dq_semaphore_index(const cuda::BwdParams& p, int head, int m_block) const {
    return (batch * p.heads_q + head) * (p.seqlen_q_rounded / kBlockM) + m_block;
  }
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
  const int64_t row = b.seq.offset_k + b.n0;
  const T* kg = static_cast<const T*>(p.k) + b.batch * p.k_batch_stride +
                b.head_kv * p.k_head_stride + row * p.k_row_stride;
  const T* vg = static_cast<const T*>(p.v) + b.batch * p.v_batch_stride +
                b.head_kv * p.v_head_stride + row * p.v_row_stride;
  load_tile<TileKV, kThreads>(sK, kg, p.k_row_stride, b.rows_k, p.head_dim, tid);
  load_tile<TileKV, kThreads>(sV, vg, p.v_row_stride, b.rows_k, p.head_dim_v, tid);
}

// The first `left` elements of a 16-byte chunk (value v, also at src in shared memory) to dst:
// one 16-byte store when the chunk is whole, element by element when it is the row's last.
template <class T>
__device__ __forceinline__ void store_chunk(T* dst, uint4 v, const T* src, int left) {
  if (left >= 8) {
    *reinterpret_cast<uint4*>(dst) = v;
  } else {
    for (int j = 0; j < left; ++j) dst[j] = src[j];
  }
}

// dK and dV of the block, staged (converted) in the K and V tiles, to global memory; a key
// whose dk or dv is not finite is flagged for the repair launch (common/bwd_repair.cuh). One loop
// for both tiles, not two store_tile calls with a check: two made the sm90 d128 kernel 1500
// instructions longer (each unrolled loop with its own index math and atomics).
template <class TileKV, int kThreads, class T, class Block>
__device__ __forceinline__ void store_dkdv(const cuda::BwdParams& p, const Block& b, const T* sdK,
                                           const T* sdV, int tid) {
  const int64_t row = b.seq.offset_k + b.n0;
  T* dkg = static_cast<T*>(p.dk) + b.batch * p.dk_batch_stride + b.head_kv * p.dk_head_stride +
           row * p.dk_row_stride;
  T* dvg = static_cast<T*>(p.dv) + b.batch * p.dv_batch_stride + b.head_kv * p.dv_head_stride +
           row * p.dv_row_stride;
  constexpr int kChunksPerRow = TileKV::kCols / 8;
  constexpr int kTotal = TileKV::kRows * kChunksPerRow;
#pragma unroll
  for (int i = 0; i < (kTotal + kThreads - 1) / kThreads; ++i) {
    const int idx = tid + i * kThreads;
    if (kTotal % kThreads == 0 || idx < kTotal) {
      const int r = idx / kChunksPerRow;
      const int c = (idx % kChunksPerRow) * 8;
      if (r < b.rows_k && (c < p.head_dim || c < p.head_dim_v)) {
        const uint4 dk = *reinterpret_cast<const uint4*>(sdK + TileKV::offset(r, c));
        const uint4 dv = *reinterpret_cast<const uint4*>(sdV + TileKV::offset(r, c));
        // Columns past head_dim (dk) and head_dim_v (dv) hold 0 (the operands' padding is
        // zero-filled).
        if (chunk_nonfinite<T>(dk) || chunk_nonfinite<T>(dv)) {
          flag_spoiled_key(p, b.batch, b.head_kv, b.n0 + r);
        }
        store_chunk(dkg + int64_t(r) * p.dk_row_stride + c, dk, sdK + TileKV::offset(r, c),
                    p.head_dim - c);
        store_chunk(dvg + int64_t(r) * p.dv_row_stride + c, dv, sdV + TileKV::offset(r, c),
                    p.head_dim_v - c);
      }
    }
  }
}

// One step's tiles: rows of query block m_block of `head` from Q and dO, and their LSE*log2(e)
// and D into stats[0, kBlockM) and stats[kBlockM, 2 kBlockM) (padded rows of the workspace hold
// +inf and 0, so they need no predicate). Part of the caller's cp.async group.
template <class TileQ, int kThreads, class T>
__device__ __forceinline__ void load_bwd_step(const cuda::BwdParams& p, int batch,
                                              const SeqlenInfo& seq, int head, int m_block,
                                              T* sQ, T* sdO, float* stats, int tid) {
  constexpr int kBlockM = TileQ::kRows;
  const int m0 = m_block * kBlockM;
  const int64_t row0 = seq.offset_q + m0;
  const T* qg = static_cast<const T*>(p.q) + batch * p.q_batch_stride + head * p.q_head_stride +
                row0 * p.q_row_stride;
  const T* dog = static_cast<const T*>(p.dout) + batch * p.do_batch_stride +
                 head * p.do_head_stride + row0 * p.do_row_stride;
  load_tile<TileQ, kThreads>(sQ, qg, p.q_row_stride, seq.seqlen_q - m0, p.head_dim, tid);
  load_tile<TileQ, kThreads>(sdO, dog, p.do_row_stride, seq.seqlen_q - m0, p.head_dim_v, tid);
  constexpr int kChunks = kBlockM / 4;  // 16-byte chunks per statistic
  if (tid < 2 * kChunks) {
    const int64_t row = (int64_t(batch) * p.heads_q + head) * p.seqlen_q_rounded + m0;
    const float* src = (tid < kChunks ? p.lse_log2 : p.dsum) + row + (tid % kChunks) * 4;
    cp_async_16(smem_u32(stats + tid * 4), src, 16);
  }
}

// Deterministic dQ: the key blocks add into a query block's accumulator in their turns
// (BwdBlock::dq_turn), behind a per-query-block semaphore (zeroed by the preprocess) that counts
// the adders done: one per CTA (here), or one per warp (WarpDqTurn). CTA-wide: waits until it is
// `turn`.
__device__ __forceinline__ void wait_dq_turn(int* sem, int turn) {
  if (threadIdx.x == 0) {
    while (ld_acquire_gpu(sem) < turn) {
    }
    __threadfence();
  }
  __syncthreads();
}
// CTA-wide: hands the turn on, once every thread's adds are complete and visible (each thread
// fences or waits for its own before calling).
__device__ __forceinline__ void pass_dq_turn(int* sem, int turn) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    atomicExch(sem, turn + 1);
  }
}
// Deterministic dQ where each warp adds its own part of the tile and waits and counts alone,
// so that no barrier of the CTA is spent on it: the query block's semaphore counts warps done,
// and a warp's turn is dq_turn * (the CTA's warps). A step calls, in order:
//   look(sem)              early, where the latency of a load is hidden: the count now;
//   wait(sem, need, seen)  before the add: until `need` warps are done (>=: the quicker warps
//                          of this turn may count on before every warp of it has left the wait);
//   issued(sem)            after the add (lane 0 issues it);
//   pass(sems)             as late as the next wait allows, where the add is likely complete:
//                          waits for it and counts this warp done (release: after its writes).
// The loads are relaxed: what follows the wait is only the warp's bulk reduce-add, issued after
// the count is read and performed at L2, where the adds the count stands for were performed
// before they were counted; nothing this warp reads depends on it. The whole warp loads (one
// request) and spins, so that no value lives in lane 0 alone across the step.
struct WarpDqTurn {
  int pending = -1;  // lane 0: the semaphore this warp's last add counts toward, -1 for none

  __device__ __forceinline__ static int look(const int* sem) { return ld_relaxed_gpu(sem); }
  __device__ __forceinline__ static void wait(const int* sem, int need, int seen) {
    while (seen < need) seen = ld_relaxed_gpu(sem);
    __syncwarp();
  }
  __device__ __forceinline__ void issued(int sem_index) { pending = sem_index; }
  __device__ __forceinline__ void pass(int* sems) {
    if (threadIdx.x % 32 == 0 && pending >= 0) {
      bulk_wait_all();
      red_release_gpu_add(sems + pending, 1);
    }
    pending = -1;
  }
};

}  // namespace common
}  // namespace flashattn
