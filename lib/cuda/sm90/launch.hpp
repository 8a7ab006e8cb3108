// Declarations of the sm90 kernel launchers; explicit instantiations live in instances/.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/flash/params.hpp"

namespace flashattn {
namespace sm90 {

template <class T, int kHeadDim>
cudaError_t launch_fwd(const cuda::FwdParams& p, cudaStream_t stream);

// Head dims 64, 128 and 256 only (see generate.py's BWD_HEAD_DIMS).
template <class T, int kHeadDim>
cudaError_t launch_bwd(const cuda::BwdParams& p, cudaStream_t stream);

}  // namespace sm90
}  // namespace flashattn
