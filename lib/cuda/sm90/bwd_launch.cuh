// The Hopper backward's three launches: the sm80 preprocess, the main kernel for the head dim
// (bwd_kernel.cuh for 64 and 128, bwd_split_kernel.cuh for 256), the sm80 postprocess reading
// the sm90 accumulator's 64 x 64 tiles.
#pragma once

#include <cuda_runtime.h>

#include "cuda/flash/params.hpp"
#include "cuda/sm80/bwd_prepost.cuh"
#include "cuda/sm90/bwd_kernel.cuh"
#include "cuda/sm90/bwd_split_kernel.cuh"

namespace flashattn {
namespace sm90 {

template <class T, int kHeadDim>
cudaError_t launch_bwd(const cuda::BwdParams& params, cudaStream_t stream) {
  cuda::BwdParams p = params;
  p.dq_tiled = true;
  const dim3 rows_grid(p.seqlen_q_rounded / 64, p.heads_q, p.batch);
  sm80::bwd_preprocess_kernel<T><<<rows_grid, 256, 0, stream>>>(p);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  if constexpr (kHeadDim == 256) {
    err = launch_bwd_split_main<T, kHeadDim>(p, stream);
  } else {
    err = launch_bwd_main<T, kHeadDim>(p, stream);
  }
  if (err != cudaSuccess) return err;
  const dim3 post_grid((p.seqlen_q + 63) / 64, p.heads_q, p.batch);
  sm80::bwd_postprocess_kernel<T><<<post_grid, 256, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace sm90
}  // namespace flashattn
