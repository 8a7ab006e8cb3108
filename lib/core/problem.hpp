// What a backend is asked to compute, after the API layer has validated every view and option.
// Backends and kernels see only these plain structs: no handles, no error state.
#pragma once

#include <cstddef>
#include <cstdint>

#include <flashattn/flashattn.h>

namespace flashattn {

enum class DType : int { F32 = FLASHATTN_DTYPE_FLOAT32, F16 = FLASHATTN_DTYPE_FLOAT16, BF16 = FLASHATTN_DTYPE_BFLOAT16 };

inline size_t dtype_size(DType t) { return t == DType::F32 ? 4 : 2; }
inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
  }
  return "unknown";
}

enum class Algorithm : int { Flash = FLASHATTN_ALGORITHM_FLASH, Standard = FLASHATTN_ALGORITHM_STANDARD };

// The problem's sizes and options, identical for forward and backward.
struct Problem {
  DType dtype = DType::F32;
  int64_t batch = 0;
  int64_t seqlen_q = 0;
  int64_t seqlen_k = 0;
  int64_t heads_q = 0;
  int64_t heads_kv = 0;
  int64_t head_dim = 0;
  float scale = 0.0f;  // resolved by the API layer: 1/sqrt(head_dim) when the caller gave 0
  bool causal = false;
  Algorithm algorithm = Algorithm::Flash;
  bool deterministic = false;

  int64_t group_size() const { return heads_q / heads_kv; }
};

// A [batch, seqlen, heads, head_dim] view: strides in elements, the head_dim stride is 1.
struct Tensor4 {
  void* data = nullptr;
  int64_t stride_batch = 0;
  int64_t stride_seq = 0;
  int64_t stride_head = 0;
};

// The [batch, heads_q, seqlen_q] fp32 log-sum-exp. data may be null in the forward (not wanted).
struct LseView {
  float* data = nullptr;
  int64_t stride_batch = 0;
  int64_t stride_head = 0;
  int64_t stride_seq = 0;
};

struct ForwardArgs {
  Problem problem;
  Tensor4 q, k, v, out;
  LseView lse;
};

struct BackwardArgs {
  Problem problem;
  Tensor4 q, k, v, out, dout, dq, dk, dv;
  LseView lse;
};

// Scratch memory for one call, in the backend's memory (host for CPU, device for CUDA).
struct Workspace {
  void* data = nullptr;
  size_t size = 0;
};

}  // namespace flashattn
