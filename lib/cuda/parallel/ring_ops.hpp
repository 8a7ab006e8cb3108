// The elementwise steps of ring attention (core/ring.hpp) on device memory: a plain launcher
// that enqueues on `stream` and returns the launch's cudaError_t.
#pragma once

#include <cuda_runtime.h>

#include "core/ring.hpp"

namespace flashattn {
namespace cuda {

cudaError_t launch_ring_op(const RingOp& op, cudaStream_t stream);

}  // namespace cuda
}  // namespace flashattn
