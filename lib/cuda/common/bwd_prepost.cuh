// The backward's first and last launches, shared by the sm80 and sm90 main kernels (they use
// the same workspace layout, cuda::BwdParams): D = rowsum(dO * O), LSE * log2(e), a zeroed dQ
// accumulator and semaphores; and dQ = scale * accumulator in the input dtype.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "cuda/flash/params.hpp"
#include "cuda/common/ptx.cuh"
#include "cuda/common/arch.cuh"
#include "cuda/common/bwd_repair.cuh"
#include "cuda/common/dq_layout.cuh"
#include "cuda/common/dsink.cuh"
#include "cuda/common/scheduler.cuh"
#include "cuda/common/seqlen.cuh"
#include "cuda/common/score_mod.cuh"

namespace flashattn {
namespace common {

// Both run one CTA per block of kPrepostRows query rows of one head, in a 1-D grid.
constexpr int kPrepostRows = 64;
__host__ __device__ inline TileScheduler prepost_blocks(const cuda::BwdParams& p, int rows) {
  return TileScheduler{(rows + kPrepostRows - 1) / kPrepostRows, p.heads_q, p.batch,
                       TileOrder::kHeadMajor};
}

// ---- 1. preprocess ---------------------------------------------------------------------------

template <class T>
__global__ void __launch_bounds__(256)
    bwd_preprocess_kernel(const __grid_constant__ cuda::BwdParams p) {
  constexpr int kRows = kPrepostRows;
  const TileCoord blk = prepost_blocks(p, p.seqlen_q_rounded).at(blockIdx.x);
  const int m0 = blk.m_block * kRows;
  const int head = blk.head;
  const int batch = blk.batch;
  const int tid = threadIdx.x;
  const int64_t row_base = (int64_t(batch) * p.heads_q + head) * p.seqlen_q_rounded + m0;
  const SeqlenInfo seq(p, batch);

  // D and LSE * log2(e): four threads per row. Rows past the end and rows no key may attend
  // to get LSE +inf, which makes their P exactly 0 in the main kernel.
  {
    const int r = tid / 4;
    const int part = tid % 4;
    const int row = m0 + r;
    float acc = 0.0f;
    if (row < seq.seqlen_q) {
      const int64_t packed_row = seq.offset_q + row;
      const T* o = static_cast<const T*>(p.o) + batch * p.o_batch_stride +
                   head * p.o_head_stride + packed_row * p.o_row_stride;
      const T* d_o = static_cast<const T*>(p.dout) + batch * p.do_batch_stride +
                     head * p.do_head_stride + packed_row * p.do_row_stride;
      for (int c = part * 8; c < p.head_dim_v; c += 32) {
        if (c + 8 <= p.head_dim_v) {
          const uint4 a = *reinterpret_cast<const uint4*>(o + c);
          const uint4 b = *reinterpret_cast<const uint4*>(d_o + c);
          const uint32_t aw[4] = {a.x, a.y, a.z, a.w};
          const uint32_t bw[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            const float2 fa = unpack2<T>(aw[j]);
            const float2 fb = unpack2<T>(bw[j]);
            acc += fa.x * fb.x + fa.y * fb.y;
          }
        } else {
          for (int j = c; j < p.head_dim_v; ++j) acc += float(o[j]) * float(d_o[j]);
        }
      }
    }
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    acc += __shfl_xor_sync(0xffffffffu, acc, 2);
    if (part == 0) {
      float l2 = INFINITY;
      p.dsum[row_base + r] = acc;
      if (row < seq.seqlen_q) {
        const float lse = p.lse[batch * p.lse_batch_stride + head * p.lse_head_stride +
                                int64_t(seq.offset_q + row) * p.lse_row_stride];
        if (lse != -INFINITY) l2 = lse * 1.4426950408889634f;
      }
      p.lse_log2[row_base + r] = l2;
    }
  }
  // Zero this block's rows of the dQ accumulator.
  float4* acc = reinterpret_cast<float4*>(p.dq_accum + row_base * p.head_dim_padded);
  const int n4 = kRows * p.head_dim_padded / 4;
  for (int i = tid; i < n4; i += 256) acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
  if (p.deterministic && tid == 0) {
    p.dq_semaphore[(int64_t(batch) * p.heads_q + head) * (p.seqlen_q_rounded / kRows) +
                   blk.m_block] = 0;
  }
}

// ---- 3. postprocess --------------------------------------------------------------------------

constexpr int kTiledChunk = 8;  // columns per thread in the sm90 tiles' path
template <class T>
__global__ void __launch_bounds__(256)
    bwd_postprocess_kernel(const __grid_constant__ cuda::BwdParams p) {
  constexpr int kRows = kPrepostRows;
  // Last (batch, head) first: the main kernel's key blocks ran in (batch, head) order, so the
  // accumulator rows it added into last are the ones still in L2.
  const TileScheduler blocks = prepost_blocks(p, p.seqlen_q);
  const TileCoord blk = blocks.at(static_cast<int>(blocks.num_tiles() - 1 - blockIdx.x));
  const int m0 = blk.m_block * kRows;
  const int head = blk.head;
  const int batch = blk.batch;
  const float* head_acc =
      p.dq_accum + (int64_t(batch) * p.heads_q + head) * p.seqlen_q_rounded * p.head_dim_padded;
  const float* acc = head_acc + int64_t(m0) * p.head_dim_padded;
  const SeqlenInfo seq(p, batch);
  T* dq = static_cast<T*>(p.dq) + batch * p.dq_batch_stride + head * p.dq_head_stride +
          int64_t(seq.offset_q + m0) * p.dq_row_stride;
  const int rows = min(kRows, seq.seqlen_q - m0);
  if (p.dq_tiled && p.head_dim % kTiledChunk == 0) {
    // The sm90 tiles, eight columns at a time: the tile's swizzle moves column pairs in groups
    // of four, so eight columns from a multiple of 8 are 32 contiguous, aligned bytes; one
    // 16-byte store each (the rows of dq are 16-byte aligned on this path).
    const int chunks = p.head_dim / kTiledChunk;
    for (int i = threadIdx.x; i < rows * chunks; i += 256) {
      const int r = i / chunks;
      const int c = (i % chunks) * kTiledChunk;
      const float* src = acc + (c / 64) * 4096 + dq_tile_offset(r, c % 64);
      const float4 lo = *reinterpret_cast<const float4*>(src);
      const float4 hi = *reinterpret_cast<const float4*>(src + 4);
      const float f[kTiledChunk] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
      bool finite = true;
      uint32_t w[kTiledChunk / 2];
#pragma unroll
      for (int e = 0; e < kTiledChunk / 2; ++e) {
        finite = finite && isfinite(f[2 * e]) && isfinite(f[2 * e + 1]);
        w[e] = pack2<T>(f[2 * e] * p.scale, f[2 * e + 1] * p.scale);
      }
      if (!finite) flag_spoiled_row(p, batch, head, m0 + r);  // common/bwd_repair.cuh
      *reinterpret_cast<uint4*>(dq + int64_t(r) * p.dq_row_stride + c) =
          make_uint4(w[0], w[1], w[2], w[3]);
    }
    return;
  }
  const int chunks = (p.head_dim + 1) / 2;  // pairs of elements
  const bool blocked = bulk_dq(p.head_dim_padded);
  for (int i = threadIdx.x; i < rows * chunks; i += 256) {
    const int r = i / chunks;
    const int c = (i % chunks) * 2;
    // The sm90 kernel's 64 x 64 tiles (dq_tile_offset), the sm80 kernel's 32 x 32
    // blocks, or row-major.
    const float* src = p.dq_tiled ? acc + (c / 64) * 4096 + dq_tile_offset(r, c % 64)
                       : blocked  ? acc + dq_block_offset(r, c, p.head_dim_padded)
                                  : acc + int64_t(r) * p.head_dim_padded + c;
    T* dst = dq + int64_t(r) * p.dq_row_stride + c;
    const bool pair = c + 1 < p.head_dim;  // c is even: the pair is adjacent in both layouts
    if (!isfinite(src[0]) || (pair && !isfinite(src[1]))) {
      flag_spoiled_row(p, batch, head, m0 + r);  // common/bwd_repair.cuh
    }
    if (pair) {
      *reinterpret_cast<uint32_t*>(dst) = pack2<T>(src[0] * p.scale, src[1] * p.scale);
    } else {
      dst[0] = T(src[0] * p.scale);
    }
  }
}

// ---- 4. the sinks' gradient (when wanted) ----------------------------------------------------

// dsinks[h] = -(sum of the main kernel's slots of head h, common/dsink.cuh), one CTA per head,
// in double and a fixed order.
constexpr int kDsinkThreads = 256;
template <class T>  // a template, so that every instance file including this may define it
__global__ void __launch_bounds__(kDsinkThreads)
    bwd_dsinks_kernel(const __grid_constant__ cuda::BwdParams p) {
  const int head = blockIdx.x;
  const int64_t per_head = dsink_key_slots(p.seqlen_k) * kDsinkWarpSlots;
  const int64_t n = int64_t(p.batch) * per_head;
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += kDsinkThreads) {
    const int64_t b = i / per_head, s = i % per_head;
    sum += p.dsink_partial[(b * p.heads_q + head) * per_head + s];
  }
  __shared__ double part[kDsinkThreads];
  part[threadIdx.x] = sum;
  __syncthreads();
  for (int w = kDsinkThreads / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) p.dsinks[head * p.dsinks_stride] = static_cast<float>(-part[0]);
}

// The backward's three launches around a main kernel: preprocess, main(p), postprocess (which
// reads the dQ accumulator in the layout p.dq_tiled names).
template <class T, class Main>
cudaError_t launch_bwd_with(const cuda::BwdParams& p, cudaStream_t stream, Main&& main) {
  const int64_t pre = prepost_blocks(p, p.seqlen_q_rounded).num_tiles();
  const int64_t post = prepost_blocks(p, p.seqlen_q).num_tiles();
  if (pre > INT32_MAX) return cudaErrorNotSupported;
  // No gradient flagged yet (common/bwd_repair.cuh).
  cudaError_t e = cudaMemsetAsync(
      p.repair_flags, 0, (repair_row_words(p) + repair_key_words(p)) * sizeof(uint32_t), stream);
  if (e != cudaSuccess) return e;
  if (p.dsinks != nullptr) {  // the slots no CTA owns must read 0
    e = cudaMemsetAsync(p.dsink_partial, 0,
                                    dsink_partial_count(p) * sizeof(float), stream);
    if (e != cudaSuccess) return e;
  }
  bwd_preprocess_kernel<T><<<static_cast<unsigned>(pre), 256, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  err = main(p);
  if (err != cudaSuccess) return err;
  bwd_postprocess_kernel<T><<<static_cast<unsigned>(post), 256, 0, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  bwd_repair_kernel<T><<<static_cast<unsigned>(repair_blocks(p)), kRepairThreads, 0, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess || p.dsinks == nullptr) return err;
  bwd_dsinks_kernel<T><<<p.heads_q, kDsinkThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace common
}  // namespace flashattn
