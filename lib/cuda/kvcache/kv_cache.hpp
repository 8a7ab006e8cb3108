// What a KV cache call does on the device before attending: the rows k_new / v_new written into
// the cache (k_new rotated), and q's rotated copy in the workspace. The attention then reads
// the cache through the kernels' SeqlenInfo (its lengths) and KvRows (its pages).
#pragma once

#include <cstddef>

#include <cuda_runtime.h>

#include "core/problem.hpp"
#include "cuda/flash/params.hpp"

namespace flashattn {
namespace cuda {

// The cache's fields of the kernels' parameters (params.hpp) from a validated call.
void fill_cache_params(CacheParams& p, const Problem& pr, const VariantViews& v);

// Bytes of workspace for q's rotated copy ([B, N_q, H_q, d], contiguous; 0 without rotary),
// a multiple of 256 so that what follows stays aligned.
size_t rotated_q_bytes(const Problem& p);

// Enqueues the appends (when k_new is given) and, with rotary tables, q's rotation into
// q_rotated (rotated_q_bytes of workspace). `p` is the forward's parameters (the cache's
// fields filled); the rotated q then replaces p.q and its strides, the caller's job.
cudaError_t launch_cache_update(const ForwardArgs& a, const FwdParams& p, void* q_rotated,
                                cudaStream_t stream);

}  // namespace cuda
}  // namespace flashattn
