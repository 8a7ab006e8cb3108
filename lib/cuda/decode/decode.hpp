// The decode path of the flash forward (decode_kernel.cuh): which problems it takes, how it
// splits their keys, what workspace that needs, and the launch.
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "core/problem.hpp"
#include "cuda/decode/decode_shape.hpp"
#include "cuda/flash/flash.hpp"
#include "cuda/flash/params.hpp"

namespace flashattn {
namespace cuda {

struct DecodePlan {
  bool applies = false;
  int head_dim = 0;  // the kernel's padded head dim
  decode::DecodeSplit split;
  size_t workspace_bytes = 0;
};

// From the problem's shapes and longest lengths only (never its data), so a CUDA graph captured
// with one set of lengths stays valid and the workspace query answers for the call: taken when
// the query tokens times a KV group's heads fill at most one packed tile, every key is visible
// to all rows or hidden from all (one token with any window; more with no key hidden below the
// end), and d_v == d; split so that the grid fills the GPU.
DecodePlan plan_decode(const Problem& p, const DeviceInfo& dev);

// Enqueues the decode kernel (and the merge of its splits) for a plan that applies.
cudaError_t launch_decode(const FwdParams& p, DType dtype, const DecodePlan& plan,
                          void* workspace, cudaStream_t stream);

}  // namespace cuda
}  // namespace flashattn
