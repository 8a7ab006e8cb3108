// Declarations of the sm80 kernel launchers. Their definitions are explicit instantiations, one
// (dtype, head dim) per generated file in instances/, so the dispatcher compiles no kernel body.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/flash/params.hpp"

namespace flashattn {
namespace sm80 {

template <class T, int kHeadDim>
cudaError_t launch_fwd(const cuda::FwdParams& p, cudaStream_t stream);

template <class T, int kHeadDim>
cudaError_t launch_bwd(const cuda::BwdParams& p, cudaStream_t stream);


}  // namespace sm80
}  // namespace flashattn
