// Chooses and launches the flash kernel for a problem from the generated kernel table
// (lib/cuda/generate.py): by device capability, dtype and padded head dim. What this build did
// not compile answers "unsupported", never a link error.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "cuda/bulk_store_mark.hpp"
#include "cuda/flash/flash.hpp"
#include "cuda/flash/params.hpp"
#include "cuda/common/bwd_repair.cuh"
#include "cuda/common/dq_layout.cuh"
#include "cuda/common/dsink.cuh"
#include "cuda/decode/decode.hpp"
#include "cuda/kvcache/kv_cache.hpp"
#include "cuda/flash/launchers.hpp"
#include "cuda/sm80/bwd_config.cuh"
#include "cuda/sm80/fwd_config.cuh"
#include "cuda/sm90/bwd_config.cuh"
#include "cuda/sm90/fwd_config.cuh"
#include "cuda/staging/staging.hpp"

namespace flashattn {
namespace cuda {

namespace {

// ---- the compiled kernels (lib/cuda/generate.py's table) ------------------------------------

enum class Arch { Sm80, Sm90 };

using FwdLauncher = cudaError_t (*)(const FwdParams&, const LaunchInfo&, cudaStream_t);
using BwdLauncher = cudaError_t (*)(const BwdParams&, const LaunchInfo&, cudaStream_t);

template <class Launcher>
struct Kernel {
  Arch arch;
  DType dtype;
  int head_dim;
  Launcher launch;
  int smem_bytes;
};

#define FLASHATTN_KERNEL(arch, kind, dtype, hdim, launcher, smem) \
  FLASHATTN_KERNEL_##kind(arch, dtype, hdim, launcher, smem)
#define FLASHATTN_KERNEL_Fwd(arch, dtype, hdim, launcher, smem) \
  {Arch::arch, DType::dtype, hdim, launcher, smem},
#define FLASHATTN_KERNEL_Bwd(arch, dtype, hdim, launcher, smem)
const Kernel<FwdLauncher> kFwdKernels[] = {
#include "cuda/flash/kernel_table.inc"
    {Arch::Sm80, DType::F32, 0, nullptr, 0}};  // the end (no kernel takes float32)
#undef FLASHATTN_KERNEL_Fwd
#undef FLASHATTN_KERNEL_Bwd
#define FLASHATTN_KERNEL_Fwd(arch, dtype, hdim, launcher, smem)
#define FLASHATTN_KERNEL_Bwd(arch, dtype, hdim, launcher, smem) \
  {Arch::arch, DType::dtype, hdim, launcher, smem},
const Kernel<BwdLauncher> kBwdKernels[] = {
#include "cuda/flash/kernel_table.inc"
    {Arch::Sm80, DType::F32, 0, nullptr, 0}};
#undef FLASHATTN_KERNEL_Fwd
#undef FLASHATTN_KERNEL_Bwd
#undef FLASHATTN_KERNEL

template <class Launcher, size_t N>
const Kernel<Launcher>* find(const Kernel<Launcher> (&table)[N], Arch arch, DType dtype,
                             int head_dim) {
  for (const Kernel<Launcher>& k : table) {
    if (k.launch != nullptr && k.arch == arch && k.dtype == dtype && k.head_dim == head_dim) {
      return &k;
    }
  }
  return nullptr;
}

// The compiled kernel of `arch` with the smallest head dim that holds head_dim, or null (the
// sm80 families cover every head dim of the table but the Hopper forward's 112).
template <class Launcher, size_t N>
const Kernel<Launcher>* smallest_holding(const Kernel<Launcher> (&table)[N], Arch arch,
                                         DType dtype, int64_t head_dim) {
  const Kernel<Launcher>* best = nullptr;
  for (const Kernel<Launcher>& k : table) {
    if (k.launch != nullptr && k.arch == arch && k.dtype == dtype && k.head_dim >= head_dim &&
        (best == nullptr || k.head_dim < best->head_dim)) {
      best = &k;
    }
  }
  return best;
}

bool have_dtype(DType dtype) {
  for (const auto& k : kFwdKernels) {
    if (k.launch != nullptr && k.dtype == dtype) return true;
  }
  return false;
}

// The kernels to take on dev: Hopper's where one exists, else the mma.sync (sm80) ones. A
// library built with FLASHATTN_TEST_HOOKS lets FLASHATTN_TEST_FORCE_SM80=1 pick the sm80
// kernels on Hopper too, so tests and benchmarks reach both families on one machine; a library
// built without it has no such switch.
bool force_sm80() {
#ifdef FLASHATTN_TEST_HOOKS
  static const bool forced = [] {
    const char* v = std::getenv("FLASHATTN_TEST_FORCE_SM80");
    return v != nullptr && std::strcmp(v, "1") == 0;
  }();
  return forced;
#else
  return false;
#endif
}

Arch device_arch(const DeviceInfo& dev) {
  return dev.sm_major == 9 && dev.sm_minor == 0 && !force_sm80() ? Arch::Sm90 : Arch::Sm80;
}

// Whether the kernels that take p on dev read its rows in TMA boxes, which plan_staging copies
// more views for: the Hopper family, but not the decode kernel (few query rows, read by
// cp.async), for which copying K and V would only add their traffic. Asked of the problem as
// the caller gives it: its copies only widen the head dims, which never makes the decode
// kernel apply where it did not.
bool tma_kernels(const Problem& p, const DeviceInfo& dev) {
  return device_arch(dev) == Arch::Sm90 && !plan_decode(p, dev).applies;
}

template <class Launcher, size_t N>
const Kernel<Launcher>* choose(const Kernel<Launcher> (&table)[N], const DeviceInfo& dev,
                               DType dtype, int64_t head_dim) {
  const Kernel<Launcher>* fast_path = smallest_holding(table, Arch::Sm80, dtype, head_dim);
  const Arch arch = device_arch(dev);
  if (fast_path == nullptr || arch == Arch::Sm80) return fast_path;
  // The device's family at the smallest head dim of its own that holds this one: where it has
  // none of the sm80 family's (the Hopper backward at 192), the next larger, since
  // computing zero columns outruns the sm80 kernel (kernel-log run 69); where it has one the
  // sm80 family lacks (the Hopper forward at 112), that one.
  const Kernel<Launcher>* k = smallest_holding(table, arch, dtype, head_dim);
  return k != nullptr ? k : fast_path;
}

template <class Launcher>
int smem_of(const Kernel<Launcher>* k) {
  return k == nullptr ? 0 : k->smem_bytes;
}

// The bytes from the output's first element to one past its last ([batch, seqlen_q, heads_q,
// head_dim_v]; strides are non-negative).
size_t output_bytes(const Tensor4& o, const Problem& pr) {
  const int64_t rows = pr.varlen ? pr.total_q : pr.seqlen_q;  // a packed batch: batch stride 0
  const int64_t last = (pr.batch - 1) * o.stride_batch + (rows - 1) * o.stride_seq +
                       (pr.heads_q - 1) * o.stride_head + pr.head_dim_v - 1;
  return static_cast<size_t>(last + 1) * dtype_size(pr.dtype);
}

LaunchInfo launch_info(const DeviceInfo& dev) { return LaunchInfo{dev.sm_count}; }

// A kernel is compiled for one head dim, which holds q's and v's: the larger decides.
int64_t kernel_head_dim(const Problem& p) { return std::max(p.head_dim, p.head_dim_v); }

// The columns of a backward kernel's fp32 dQ accumulator: its head dim; on Hopper whole
// tiles of it (common::dq_tiled_cols).
int dq_accum_cols(const Kernel<BwdLauncher>& k) {
  return k.arch == Arch::Sm90 ? common::dq_tiled_cols(k.head_dim) : k.head_dim;
}

// The backward's fp32 scratch, carved from the workspace in this order, each 256-byte aligned.
struct BwdWorkspace {
  size_t dq_accum = 0, dsum = 0, lse_log2 = 0, semaphore = 0, repair_flags = 0,
         dsink_partial = 0, total = 0;
};

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// Query rows are rounded up to 128, the largest query block of a backward kernel, so that a
// kernel's last block reads its rows' statistics inside the head they belong to.
int64_t bwd_rows_rounded(int64_t seqlen_q) { return (seqlen_q + 127) / 128 * 128; }
// Keys likewise, to the largest key block.
int64_t bwd_keys_rounded(int64_t seqlen_k) { return (seqlen_k + 127) / 128 * 128; }

BwdWorkspace bwd_workspace(const Problem& p, const DeviceInfo& dev) {
  const size_t rows = static_cast<size_t>(p.batch) * static_cast<size_t>(p.heads_q) *
                      static_cast<size_t>(bwd_rows_rounded(p.seqlen_q));
  // The dQ accumulator's rows: as wide as the kernel that runs adds them.
  const Kernel<BwdLauncher>* k = choose(kBwdKernels, dev, p.dtype, kernel_head_dim(p));
  const size_t hdim = static_cast<size_t>(k != nullptr ? dq_accum_cols(*k) : 0);
  BwdWorkspace w;
  w.dq_accum = 0;
  w.dsum = align256(rows * hdim * 4);
  w.lse_log2 = w.dsum + align256(rows * 4);
  w.semaphore = w.lse_log2 + align256(rows * 4);
  // One bit per query row and per key (common/bwd_repair.cuh).
  w.repair_flags = w.semaphore + align256(rows / 64 * 4);
  const size_t keys = static_cast<size_t>(p.batch) * static_cast<size_t>(p.heads_kv) *
                      static_cast<size_t>(bwd_keys_rounded(p.seqlen_k));
  // The sinks' gradient's partial sums (common/dsink.cuh; only with sinks).
  w.dsink_partial = w.repair_flags + align256((rows + keys) / common::kFlagBits * 4);
  const size_t dsink_floats = static_cast<size_t>(p.batch) * static_cast<size_t>(p.heads_q) *
                              static_cast<size_t>(common::dsink_key_slots(p.seqlen_k)) *
                              common::kDsinkWarpSlots;
  w.total = w.dsink_partial + (p.sinks ? align256(dsink_floats * 4) : 0);
  return w;
}

// Views are copied to aligned rows (cuda/staging) except a KV cache's, which is read and
// appended in place.
constexpr uint32_t kCacheCallViews = kRowsQ | kRowsK | kRowsV | kRowsOut;
bool cache_rows_aligned(const Problem& p, uint32_t unaligned_rows) {
  return p.head_dim % kGranuleElems == 0 && p.head_dim_v % kGranuleElems == 0 &&
         (unaligned_rows & kCacheCallViews) == 0;
}
constexpr const char* kCacheLayoutReason =
    "a KV cache on CUDA needs 16-byte aligned rows in q, the cache and out: head dims that are "
    "multiples of 8, data pointers 16-byte aligned, batch (page), seqlen and heads strides "
    "multiples of 8 elements (other views are copied to aligned rows; a cache is appended in "
    "place)";

}  // namespace

const char* flash_unsupported_reason(const Problem& p, bool backward, const DeviceInfo& dev) {
  if (dev.sm_major < 8) {
    return "the flash CUDA kernels need compute capability 8.0 (Ampere) or newer";
  }
  if (p.dtype == DType::F32) {
    return "the flash CUDA kernels compute in float16 and bfloat16 (float32 runs on the CPU)";
  }
  if (!have_dtype(p.dtype)) {
    return p.dtype == DType::F16 ? "this build has no float16 flash kernels (see FLASHATTN_DTYPES)"
                                 : "this build has no bfloat16 flash kernels (see FLASHATTN_DTYPES)";
  }
  if (p.kv_cache != KvCache::None && !cache_rows_aligned(p, p.unaligned_rows)) {
    return kCacheLayoutReason;
  }
  // The decode kernel reads pages (common/kv_rows.cuh); the tiled kernels address K and V by
  // strides (TMA on Hopper) and take contiguous caches only.
  if (p.kv_cache == KvCache::Paged && !plan_decode(p, dev).applies) {
    return "a paged KV cache is read by the decode path (query tokens x a KV group's heads at "
           "most 16, every key visible to all of a sequence's queries or to none); more query "
           "rows against pages are not implemented on CUDA yet (a contiguous cache is)";
  }
  const int64_t hdim = kernel_head_dim(p);
  const int smem = backward ? smem_of(choose(kBwdKernels, dev, p.dtype, hdim))
                            : smem_of(choose(kFwdKernels, dev, p.dtype, hdim));
  if (smem == 0) {
    return "this build has no flash kernel for a head_dim this large (see FLASHATTN_HEAD_DIMS)";
  }
  if (static_cast<size_t>(smem) > dev.smem_per_block_optin) {
    return "this device has too little shared memory per block for this head_dim's flash kernel";
  }
  return nullptr;
}

const char* flash_unsupported_layout(const ForwardArgs& a) {
  if (a.problem.kv_cache == KvCache::None) return nullptr;
  return cache_rows_aligned(a.problem, unaligned_rows_of(a)) ? nullptr : kCacheLayoutReason;
}

namespace {

// The workspace of the kernels themselves, for the problem they see (after any copies).
size_t kernel_workspace_size(const Problem& p, bool backward, const DeviceInfo& dev) {
  if (backward) return bwd_workspace(p, dev).total;
  // q's rotated copy (a KV cache with rotary tables) first, then the split keys' partials.
  const DecodePlan decode = plan_decode(p, dev);
  return rotated_q_bytes(p) + (decode.applies ? decode.workspace_bytes : 0);
}

}  // namespace

// The copies of unaligned views (cuda/staging) first, then the kernels' own workspace.
size_t flash_workspace_size(const Problem& p, bool backward, const DeviceInfo& dev) {
  const Staging s = plan_staging(p, backward, tma_kernels(p, dev));
  const size_t kernels = kernel_workspace_size(staged_problem(p, s), backward, dev);
  size_t total;
  return __builtin_add_overflow(s.bytes, kernels, &total) ? SIZE_MAX : total;
}

size_t flash_call_workspace_size(const ForwardArgs& a, const DeviceInfo& dev) {
  Problem p = a.problem;
  p.unaligned_rows = unaligned_rows_of(a);
  return flash_workspace_size(p, false, dev);
}

size_t flash_call_workspace_size(const BackwardArgs& a, const DeviceInfo& dev) {
  Problem p = a.problem;
  p.unaligned_rows = unaligned_rows_of(a);
  return flash_workspace_size(p, true, dev);
}

namespace {

// The fields the forward and backward parameters share (FwdParams and BwdParams name them
// alike): the inputs' and LSE's pointers and strides, sizes, scale and mask.
// A window bound at least this far from the diagonal hides no key: unbounded (-1), which
// also keeps the kernels' index arithmetic far from int overflow.
int window_bound(int64_t bound, const Problem& pr) {
  return bound < 0 || bound >= pr.seqlen_q + pr.seqlen_k ? -1 : static_cast<int>(bound);
}

template <class Params>
void fill_common(Params& p, const Problem& pr, const Tensor4& q, const Tensor4& k,
                 const Tensor4& v, const Tensor4& out, const LseView& lse,
                 const VariantViews& variants) {
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
  p.head_dim_v = static_cast<int>(pr.head_dim_v);
  p.scale = pr.scale;
  p.scale_log2 = static_cast<float>(static_cast<double>(pr.scale) * 1.4426950408889634);
  p.causal = pr.causal;
  p.window_left = window_bound(pr.window_left, pr);
  p.window_right = window_bound(pr.window_right, pr);
  p.softcap = pr.softcap;
  p.alibi = variants.alibi.data;
  p.alibi_batch_stride = variants.alibi.stride_batch;
  p.alibi_head_stride = variants.alibi.stride_head;
  p.sinks = variants.sinks.data;
  p.sinks_stride = variants.sinks.stride;
  p.cu_seqlens_q = variants.cu_seqlens_q.data;
  p.cu_seqlens_k = variants.cu_seqlens_k.data;
  p.cu_seqlens_q_stride = variants.cu_seqlens_q.stride;
  p.cu_seqlens_k_stride = variants.cu_seqlens_k.stride;
  p.total_q = pr.total_q;
  p.total_k = pr.total_k;
}

}  // namespace

namespace {

// The kernels on views they can take in place (aligned rows, or a KV cache).
cudaError_t kernel_forward(const ForwardArgs& a, void* workspace, size_t workspace_size,
                           const DeviceInfo& dev, cudaStream_t stream) {
  const Problem& pr = a.problem;
  FwdParams p{};
  fill_common(p, pr, a.q, a.k, a.v, a.out, a.lse, a.variants);
  fill_cache_params(p, pr, a.variants);
  if (pr.kv_cache != KvCache::None) {
    // The rows appended (and q rotated) first, on the same stream: the attention reads them.
    const size_t rotated = rotated_q_bytes(pr);
    if (workspace_size < rotated || (rotated > 0 && workspace == nullptr)) {
      return cudaErrorInvalidValue;
    }
    const cudaError_t e = launch_cache_update(a, p, workspace, stream);
    if (e != cudaSuccess) return e;
    if (rotated > 0) {
      p.q = workspace;
      p.q_head_stride = pr.head_dim;
      p.q_row_stride = pr.heads_q * pr.head_dim;
      p.q_batch_stride = pr.seqlen_q * p.q_row_stride;
      workspace = static_cast<char*>(workspace) + rotated;
      workspace_size -= rotated;
    }
  }
  // A few query rows against many keys: the decode kernel (GQA-packed rows, split keys).
  const DecodePlan decode = plan_decode(pr, dev);
  if (decode.applies) {
    if (workspace_size < decode.workspace_bytes ||
        (decode.workspace_bytes > 0 && workspace == nullptr)) {
      return cudaErrorInvalidValue;
    }
    return launch_decode(p, pr.dtype, decode, workspace, stream);
  }
  if (pr.kv_cache == KvCache::Paged) return cudaErrorNotSupported;  // refused before (above)
  const Kernel<FwdLauncher>* k = choose(kFwdKernels, dev, pr.dtype, kernel_head_dim(pr));
  if (k == nullptr) return cudaErrorNotSupported;
  const cudaError_t err = k->launch(p, launch_info(dev), stream);
  if (err == cudaSuccess && k->arch == Arch::Sm90) {
    mark_written(a.out.data, output_bytes(a.out, pr), stream);  // O was written by TMA stores
  }
  if (err != cudaErrorNotSupported || k->arch == Arch::Sm80) return err;
  // The Hopper kernel declined the views (no tensor map for them): the sm80 kernel takes them.
  const Kernel<FwdLauncher>* fallback = find(kFwdKernels, Arch::Sm80, pr.dtype, k->head_dim);
  return fallback == nullptr ? err : fallback->launch(p, launch_info(dev), stream);
}

cudaError_t kernel_backward(const BackwardArgs& a, void* workspace, size_t workspace_size,
                            const DeviceInfo& dev, cudaStream_t stream) {
  const Problem& pr = a.problem;
  const BwdWorkspace w = bwd_workspace(pr, dev);
  if (workspace_size < w.total || workspace == nullptr) return cudaErrorInvalidValue;
  char* ws = static_cast<char*>(workspace);
  BwdParams p{};
  fill_common(p, pr, a.q, a.k, a.v, a.out, a.lse, a.variants);
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
  p.dsinks = a.dsinks.data;
  p.dsinks_stride = a.dsinks.stride;
  p.dsink_partial = reinterpret_cast<float*>(ws + w.dsink_partial);
  p.repair_flags = reinterpret_cast<uint32_t*>(ws + w.repair_flags);
  p.seqlen_q_rounded = static_cast<int>(bwd_rows_rounded(pr.seqlen_q));
  p.seqlen_k_rounded = static_cast<int>(bwd_keys_rounded(pr.seqlen_k));
  p.deterministic = pr.deterministic;
  const Kernel<BwdLauncher>* k = choose(kBwdKernels, dev, pr.dtype, kernel_head_dim(pr));
  if (k == nullptr) return cudaErrorNotSupported;
  p.head_dim_padded = dq_accum_cols(*k);
  return k->launch(p, launch_info(dev), stream);
}

// Unaligned views through their copies: in, the kernels on the copies, out. The copies lie at
// the workspace's start, the kernels' workspace after them.
template <class Args, class Kernels>
cudaError_t staged_call(const Args& user, bool backward, void* workspace, size_t workspace_size,
                        const DeviceInfo& dev, cudaStream_t stream, Kernels kernels) {
  Problem actual = user.problem;
  actual.unaligned_rows = unaligned_rows_of(user);
  const Staging s = plan_staging(actual, backward, tma_kernels(actual, dev));
  if (!s.any()) return kernels(user, workspace, workspace_size);
  if (workspace == nullptr || workspace_size < s.bytes) return cudaErrorInvalidValue;
  Args staged = user;
  staged.problem = actual;
  cudaError_t e = stage_inputs(s, workspace, staged, stream);
  if (e != cudaSuccess) return e;
  e = kernels(staged, static_cast<char*>(workspace) + s.bytes, workspace_size - s.bytes);
  if (e != cudaSuccess) return e;
  return unstage_outputs(s, staged, user, stream);
}

}  // namespace

cudaError_t flash_forward(const ForwardArgs& a, void* workspace, size_t workspace_size,
                          const DeviceInfo& dev, cudaStream_t stream) {
  return staged_call(a, false, workspace, workspace_size, dev, stream,
                     [&](const ForwardArgs& k, void* ws, size_t size) {
                       return kernel_forward(k, ws, size, dev, stream);
                     });
}

cudaError_t flash_backward(const BackwardArgs& a, void* workspace, size_t workspace_size,
                           const DeviceInfo& dev, cudaStream_t stream) {
  return staged_call(a, true, workspace, workspace_size, dev, stream,
                     [&](const BackwardArgs& k, void* ws, size_t size) {
                       return kernel_backward(k, ws, size, dev, stream);
                     });
}

}  // namespace cuda
}  // namespace flashattn
