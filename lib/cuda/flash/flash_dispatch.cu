// Chooses and launches the flash kernel for a problem: by device capability, dtype and padded
// head dim. What this build did not compile answers "unsupported", never a link error.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "cuda/flash/flash.hpp"
#include "cuda/flash/params.hpp"
#include "cuda/sm80/bwd_config.cuh"
#include "cuda/sm80/fwd_config.cuh"
#include "cuda/sm80/launch.hpp"
#include "cuda/sm90/bwd_config.cuh"
#include "cuda/sm90/fwd_config.cuh"
#include "cuda/sm90/launch.hpp"

namespace flashattn {
namespace cuda {

namespace {

// The compiled head-dim fast paths, ascending (FLASHATTN_HEAD_DIMS at configure time).
constexpr int kHeadDims[] = {
#ifdef FLASHATTN_HDIM_64
    64,
#endif
#ifdef FLASHATTN_HDIM_96
    96,
#endif
#ifdef FLASHATTN_HDIM_128
    128,
#endif
#ifdef FLASHATTN_HDIM_192
    192,
#endif
#ifdef FLASHATTN_HDIM_256
    256,
#endif
    0};

#ifdef FLASHATTN_DTYPE_FP16
constexpr bool kHaveFp16 = true;
#else
constexpr bool kHaveFp16 = false;
#endif
#ifdef FLASHATTN_DTYPE_BF16
constexpr bool kHaveBf16 = true;
#else
constexpr bool kHaveBf16 = false;
#endif

// The smallest compiled fast path that holds head_dim, or 0.
int padded_head_dim(int64_t head_dim) {
  for (int d : kHeadDims) {
    if (d != 0 && d >= head_dim) return d;
  }
  return 0;
}

// Shared memory per CTA of a kernel family's configuration for a padded head dim.
template <template <int> class Cfg>
int smem_of(int hdim) {
  switch (hdim) {
    case 64: return Cfg<64>::kSmemBytes;
    case 96: return Cfg<96>::kSmemBytes;
    case 128: return Cfg<128>::kSmemBytes;
    case 192: return Cfg<192>::kSmemBytes;
    case 256: return Cfg<256>::kSmemBytes;
  }
  return 0;
}

int fwd_smem(int hdim) { return smem_of<sm80::FwdConfig>(hdim); }

int sm90_fwd_smem(int hdim) { return smem_of<sm90::FwdConfig>(hdim); }

int bwd_smem(int hdim) { return smem_of<sm80::BwdConfig>(hdim); }

// The backward's fp32 scratch, carved from the workspace in this order, each 256-byte aligned.
struct BwdWorkspace {
  size_t dq_accum = 0, dsum = 0, lse_log2 = 0, semaphore = 0, total = 0;
};

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// Query rows are rounded up to 128, the largest query block of a backward kernel, so that a
// kernel's last block reads its rows' statistics inside the head they belong to.
int64_t bwd_rows_rounded(int64_t seqlen_q) { return (seqlen_q + 127) / 128 * 128; }

BwdWorkspace bwd_workspace(const Problem& p) {
  const size_t rows = static_cast<size_t>(p.batch) * static_cast<size_t>(p.heads_q) *
                      static_cast<size_t>(bwd_rows_rounded(p.seqlen_q));
  const size_t hdim = static_cast<size_t>(padded_head_dim(p.head_dim));
  BwdWorkspace w;
  w.dq_accum = 0;
  w.dsum = align256(rows * hdim * 4);
  w.lse_log2 = w.dsum + align256(rows * 4);
  w.semaphore = w.lse_log2 + align256(rows * 4);
  w.total = w.semaphore + align256(rows / 64 * 4);
  return w;
}

#ifdef FLASHATTN_HAVE_SM90A
constexpr bool kHaveSm90a = true;
#else
constexpr bool kHaveSm90a = false;
#endif

// FLASHATTN_FORCE_SM80=1 runs the mma.sync kernels on Hopper too: for tests of both paths on
// one machine and for side-by-side benchmarks.
bool force_sm80() {
  static const bool forced = [] {
    const char* v = std::getenv("FLASHATTN_FORCE_SM80");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return forced;
}

bool use_sm90_forward(const DeviceInfo& dev) {
  return kHaveSm90a && dev.sm_major == 9 && dev.sm_minor == 0 && !force_sm80();
}

bool use_sm90_backward(const DeviceInfo& dev, int hdim) {
  return use_sm90_forward(dev) && sm90::has_backward(hdim);
}

int bwd_smem_for(const DeviceInfo& dev, int hdim) {
  return use_sm90_backward(dev, hdim) ? sm90::bwd_smem_bytes(hdim) : bwd_smem(hdim);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
bool strides_ok(const Tensor4& t) {
  return t.stride_batch % 8 == 0 && t.stride_seq % 8 == 0 && t.stride_head % 8 == 0;
}
bool layout_ok(const Tensor4& t) { return aligned16(t.data) && strides_ok(t); }

constexpr const char* kLayoutReason =
    "the flash CUDA kernels need 16-byte aligned rows: every data pointer 16-byte aligned and "
    "the batch, seqlen and heads strides multiples of 8 elements (copy the tensor to a "
    "contiguous layout with head_dim padded to a multiple of 8)";

template <int kHeadDim>
cudaError_t bwd_for_dtype(DType dtype, const BwdParams& p, bool sm90, cudaStream_t stream) {
  constexpr bool kSm90Path = sm90::has_backward(kHeadDim);
  if (dtype == DType::BF16) {
#ifdef FLASHATTN_DTYPE_BF16
#ifdef FLASHATTN_HAVE_SM90A
    if constexpr (kSm90Path) {
      if (sm90) return sm90::launch_bwd<__nv_bfloat16, kHeadDim>(p, stream);
    }
#endif
    return sm80::launch_bwd<__nv_bfloat16, kHeadDim>(p, stream);
#endif
  } else if (dtype == DType::F16) {
#ifdef FLASHATTN_DTYPE_FP16
#ifdef FLASHATTN_HAVE_SM90A
    if constexpr (kSm90Path) {
      if (sm90) return sm90::launch_bwd<__half, kHeadDim>(p, stream);
    }
#endif
    return sm80::launch_bwd<__half, kHeadDim>(p, stream);
#endif
  }
  (void)sm90;
  (void)kSm90Path;
  return cudaErrorNotSupported;
}

template <int kHeadDim>
cudaError_t fwd_for_dtype(DType dtype, const FwdParams& p, bool sm90, cudaStream_t stream) {
  if (dtype == DType::BF16) {
#ifdef FLASHATTN_DTYPE_BF16
#ifdef FLASHATTN_HAVE_SM90A
    if (sm90) return sm90::launch_fwd<__nv_bfloat16, kHeadDim>(p, stream);
#endif
    return sm80::launch_fwd<__nv_bfloat16, kHeadDim>(p, stream);
#endif
  } else if (dtype == DType::F16) {
#ifdef FLASHATTN_DTYPE_FP16
#ifdef FLASHATTN_HAVE_SM90A
    if (sm90) return sm90::launch_fwd<__half, kHeadDim>(p, stream);
#endif
    return sm80::launch_fwd<__half, kHeadDim>(p, stream);
#endif
  }
  (void)sm90;
  return cudaErrorNotSupported;
}

}  // namespace

const char* flash_unsupported_reason(const Problem& p, bool backward, const DeviceInfo& dev) {
  if (dev.sm_major < 8) {
    return "the flash CUDA kernels need compute capability 8.0 (Ampere) or newer";
  }
  if (p.dtype == DType::F32) {
    return "the flash CUDA kernels compute in float16 and bfloat16 (float32 runs on the CPU)";
  }
  if (p.dtype == DType::F16 && !kHaveFp16) {
    return "this build has no float16 flash kernels (see FLASHATTN_DTYPES)";
  }
  if (p.dtype == DType::BF16 && !kHaveBf16) {
    return "this build has no bfloat16 flash kernels (see FLASHATTN_DTYPES)";
  }
  const int hdim = padded_head_dim(p.head_dim);
  if (hdim == 0) {
    return "this build has no flash kernel for a head_dim this large (see FLASHATTN_HEAD_DIMS)";
  }
  if (p.batch > 65535 || p.heads_q > 65535) {
    return "the flash CUDA kernels take at most 65535 batches and 65535 heads";
  }
  const int smem = backward                 ? bwd_smem_for(dev, hdim)
                   : use_sm90_forward(dev) ? sm90_fwd_smem(hdim)
                                           : fwd_smem(hdim);
  if (static_cast<size_t>(smem) > dev.smem_per_block_optin) {
    return "this device has too little shared memory per block for this head_dim's flash kernel";
  }
  return nullptr;
}

const char* flash_unsupported_layout(const ForwardArgs& a) {
  if (!layout_ok(a.q) || !layout_ok(a.k) || !layout_ok(a.v) || !layout_ok(a.out)) {
    return kLayoutReason;
  }
  return nullptr;
}

const char* flash_unsupported_layout(const BackwardArgs& a) {
  for (const Tensor4* t : {&a.q, &a.k, &a.v, &a.out, &a.dout, &a.dq, &a.dk, &a.dv}) {
    if (!layout_ok(*t)) return kLayoutReason;
  }
  return nullptr;
}

size_t flash_workspace_size(const Problem& p, bool backward, const DeviceInfo&) {
  return backward ? bwd_workspace(p).total : 0;
}

namespace {

// The fields the forward and backward parameters share (FwdParams and BwdParams name them
// alike): the inputs' and LSE's pointers and strides, sizes, scale and mask.
template <class Params>
void fill_common(Params& p, const Problem& pr, const Tensor4& q, const Tensor4& k,
                 const Tensor4& v, const Tensor4& out, const LseView& lse) {
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.o = out.data;
  p.lse = lse.data;
  p.q_batch_stride = q.stride_batch;
  p.q_row_stride = q.stride_seq;
  p.q_head_stride = q.stride_head;
  p.k_batch_stride = k.stride_batch;
  p.k_row_stride = k.stride_seq;
  p.k_head_stride = k.stride_head;
  p.v_batch_stride = v.stride_batch;
  p.v_row_stride = v.stride_seq;
  p.v_head_stride = v.stride_head;
  p.o_batch_stride = out.stride_batch;
  p.o_row_stride = out.stride_seq;
  p.o_head_stride = out.stride_head;
  p.lse_batch_stride = lse.stride_batch;
  p.lse_head_stride = lse.stride_head;
  p.lse_row_stride = lse.stride_seq;
  p.batch = static_cast<int>(pr.batch);
  p.seqlen_q = static_cast<int>(pr.seqlen_q);
  p.seqlen_k = static_cast<int>(pr.seqlen_k);
  p.heads_q = static_cast<int>(pr.heads_q);
  p.heads_kv = static_cast<int>(pr.heads_kv);
  p.group = static_cast<int>(pr.heads_q / pr.heads_kv);
  p.head_dim = static_cast<int>(pr.head_dim);
  p.scale = pr.scale;
  p.scale_log2 = static_cast<float>(static_cast<double>(pr.scale) * 1.4426950408889634);
  p.causal = pr.causal;
}

// Calls launch(std::integral_constant<int, D>{}) for the compiled fast path D of a padded head
// dim; what this build did not compile is unsupported.
template <class Launch>
cudaError_t for_head_dim(int padded, Launch&& launch) {
  switch (padded) {
#ifdef FLASHATTN_HDIM_64
    case 64: return launch(std::integral_constant<int, 64>{});
#endif
#ifdef FLASHATTN_HDIM_96
    case 96: return launch(std::integral_constant<int, 96>{});
#endif
#ifdef FLASHATTN_HDIM_128
    case 128: return launch(std::integral_constant<int, 128>{});
#endif
#ifdef FLASHATTN_HDIM_192
    case 192: return launch(std::integral_constant<int, 192>{});
#endif
#ifdef FLASHATTN_HDIM_256
    case 256: return launch(std::integral_constant<int, 256>{});
#endif
    default: return cudaErrorNotSupported;
  }
}

}  // namespace

cudaError_t flash_forward(const ForwardArgs& a, void*, size_t, const DeviceInfo& dev,
                          cudaStream_t stream) {
  const bool sm90 = use_sm90_forward(dev);
  const Problem& pr = a.problem;
  FwdParams p{};
  fill_common(p, pr, a.q, a.k, a.v, a.out, a.lse);
  return for_head_dim(padded_head_dim(pr.head_dim), [&](auto hdim) {
    return fwd_for_dtype<decltype(hdim)::value>(pr.dtype, p, sm90, stream);
  });
}

cudaError_t flash_backward(const BackwardArgs& a, void* workspace, size_t workspace_size,
                           const DeviceInfo& dev, cudaStream_t stream) {
  const Problem& pr = a.problem;
  const BwdWorkspace w = bwd_workspace(pr);
  if (workspace_size < w.total || workspace == nullptr) return cudaErrorInvalidValue;
  char* ws = static_cast<char*>(workspace);
  BwdParams p{};
  fill_common(p, pr, a.q, a.k, a.v, a.out, a.lse);
  p.dout = a.dout.data;
  p.dq = a.dq.data;
  p.dk = a.dk.data;
  p.dv = a.dv.data;
  p.do_batch_stride = a.dout.stride_batch;
  p.do_row_stride = a.dout.stride_seq;
  p.do_head_stride = a.dout.stride_head;
  p.dq_batch_stride = a.dq.stride_batch;
  p.dq_row_stride = a.dq.stride_seq;
  p.dq_head_stride = a.dq.stride_head;
  p.dk_batch_stride = a.dk.stride_batch;
  p.dk_row_stride = a.dk.stride_seq;
  p.dk_head_stride = a.dk.stride_head;
  p.dv_batch_stride = a.dv.stride_batch;
  p.dv_row_stride = a.dv.stride_seq;
  p.dv_head_stride = a.dv.stride_head;
  p.dq_accum = reinterpret_cast<float*>(ws + w.dq_accum);
  p.dsum = reinterpret_cast<float*>(ws + w.dsum);
  p.lse_log2 = reinterpret_cast<float*>(ws + w.lse_log2);
  p.dq_semaphore = reinterpret_cast<int*>(ws + w.semaphore);
  p.seqlen_q_rounded = static_cast<int>(bwd_rows_rounded(pr.seqlen_q));
  p.seqlen_k_rounded = static_cast<int>((pr.seqlen_k + 127) / 128 * 128);
  p.head_dim_padded = padded_head_dim(pr.head_dim);
  p.deterministic = pr.deterministic;
  const bool sm90 = use_sm90_backward(dev, p.head_dim_padded);
  return for_head_dim(p.head_dim_padded, [&](auto hdim) {
    return bwd_for_dtype<decltype(hdim)::value>(pr.dtype, p, sm90, stream);
  });
}

}  // namespace cuda
}  // namespace flashattn
