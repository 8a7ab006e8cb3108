// algorithm = STANDARD on CUDA: attention the textbook way, the baseline the FlashAttention
// paper compares against and an independent check of the flash kernels.
//
//   forward:  S = scale * Q K^T (cuBLAS, fp32)  ->  P = softmax(logits(S) + mask) (own kernel,
//             dtype)  ->  O = P V (cuBLAS)
//   backward: S and P recomputed as in the forward (the forward's P is not trusted to exist),
//             dV = P^T dO, dP = dO V^T, D = rowsum(P * dP), dS = P * (dP - D) (* the softcap's
//             derivative), dQ = scale * dS K, dK = scale * dS^T Q (cuBLAS; our kernel for D and
//             dS), dsinks = -sum over rows of P_sink * D.
//   Masked entries of P and dS are 0, and a GEMM would still multiply them with whatever the
//   mask hides (0 * inf = NaN); elements of O, dV, dQ, dK that come out non-finite are
//   recomputed without those terms.
//
// The variants live in the row kernels only (row_policies.cuh): the mask (causal and sliding
// window, bottom-right aligned per sequence), the logits (softcap, then ALiBi) and the sink's
// term in each row's softmax; the GEMMs are the same for all. head_dim_v only sizes the v-side
// arrays (v, out, dout, dv).
//
// S and P live in device memory (the workspace): S (and dP) in fp32, P (and dS) in the input
// dtype, which is what the P V and gradient GEMMs take. Q, K, V (dO) are first copied into a
// packed [batch, heads, seqlen, head_dim] layout so that every GEMM is ONE strided-batched
// cuBLAS call for the whole problem, whatever the caller's strides: batched over (batch,
// kv head), with the g query heads of a GQA group stacked as g*seqlen_q rows. GQA's dK and dV
// sums over the group are the GEMMs' own k-loop, so nothing is accumulated across launches and
// the results are deterministic. Outputs are written back to the caller's layout by a copy.
// A variable-length batch is packed the same way, each sequence padded with zero rows to the
// promised maximum lengths (the copy kernels read the offsets on the device; the mask hides the
// padding), so no launch looks at the offsets on the host and the calls may be captured in a
// CUDA graph. The price is memory: S and P are sized by batch * max_seqlen_q * max_seqlen_k.
#pragma once

#include <cstddef>

#include <cublas_api.h>
#include <cuda_runtime.h>

#include "core/problem.hpp"
#include "cuda/cublas_loader.hpp"

namespace flashattn {
namespace cuda {
namespace standard {

struct Context {
  const CublasApi* api = nullptr;
  cublasHandle_t handle = nullptr;  // bound to `stream` and to its own cuBLAS workspace
  cudaStream_t stream = nullptr;
};

// nullptr when the standard algorithm can run p (the dtype is F16 or BF16 and the sizes fit
// cuBLAS's int arguments), else a sentence saying why not. Does not look at the device.
const char* unsupported_reason(const Problem& p);

// Workspace bytes for p; throws UNSUPPORTED when they would overflow size_t.
size_t workspace_size(const Problem& p, bool backward);

// Enqueue on c.stream. ws holds at least workspace_size(p, ...) bytes of device memory.
// Throw DEVICE (with the CUDA or cuBLAS error) when a launch fails.
void forward(const ForwardArgs& a, void* ws, size_t ws_size, const Context& c);
void backward(const BackwardArgs& a, void* ws, size_t ws_size, const Context& c);

}  // namespace standard
}  // namespace cuda
}  // namespace flashattn
