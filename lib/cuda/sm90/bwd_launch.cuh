// The Hopper backward's three launches: the shared preprocess, the main kernel for the head dim
// (bwd_kernel.cuh for 64 and 128, bwd_split_kernel.cuh for 256), the shared postprocess reading
// the sm90 accumulator's 64 x 64 tiles.
#pragma once

#include <cuda_runtime.h>

#include "cuda/flash/params.hpp"
#include "cuda/common/bwd_prepost.cuh"
#include "cuda/sm90/bwd_kernel.cuh"
#include "cuda/sm90/bwd_split_kernel.cuh"

namespace flashattn {
namespace sm90 {

template <class T, int kHeadDim>
cudaError_t launch_bwd(const cuda::BwdParams& params, const cuda::LaunchInfo&,
                       cudaStream_t stream) {
  cuda::BwdParams p = params;
  p.dq_tiled = true;
  return common::launch_bwd_with<T>(p, stream, [stream](const cuda::BwdParams& q) {
    if constexpr (kHeadDim == 256) {
      return launch_bwd_split_main<T, kHeadDim>(q, stream);
    } else {
      return launch_bwd_main<T, kHeadDim>(q, stream);
    }
  });
}

}  // namespace sm90
}  // namespace flashattn
