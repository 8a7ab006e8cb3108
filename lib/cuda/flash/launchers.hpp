// The kernel launchers the dispatcher calls, per arch. Their definitions are the explicit
// instantiations in lib/cuda/instances/ (one per kernel-table row, dtype and head dim), so the
// dispatcher compiles no kernel body. Each enqueues on `stream` and returns the launch's error;
// cudaErrorNotSupported when the kernel cannot take this problem after all (the sm90 forward,
// when the driver cannot describe a view as a tensor map).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/flash/params.hpp"

namespace flashattn {
namespace sm80 {
template <class T, int kHeadDim>
cudaError_t launch_fwd(const cuda::FwdParams& p, const cuda::LaunchInfo& info,
                       cudaStream_t stream);
template <class T, int kHeadDim>
cudaError_t launch_bwd(const cuda::BwdParams& p, const cuda::LaunchInfo& info,
                       cudaStream_t stream);
}  // namespace sm80

namespace sm90 {
template <class T, int kHeadDim>
cudaError_t launch_fwd(const cuda::FwdParams& p, const cuda::LaunchInfo& info,
                       cudaStream_t stream);
template <class T, int kHeadDim>
cudaError_t launch_bwd(const cuda::BwdParams& p, const cuda::LaunchInfo& info,
                       cudaStream_t stream);
}  // namespace sm90
}  // namespace flashattn
