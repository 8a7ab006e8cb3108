// The CUDA backend: one context = one device ordinal, a stream (its own or the caller's), a
// cuBLAS handle with its own workspace, the device's properties. Every entry point makes the
// context's device current for its duration and restores the caller's afterwards. Work is
// enqueued on the stream with no device synchronization and, once the API layer's scratch is
// sized, no allocation: calls can be captured into a CUDA graph.
#include <atomic>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include <cuda_runtime.h>
#include <dlfcn.h>

#include "core/backend.hpp"
#include "core/error.hpp"
#include "cuda/cublas_loader.hpp"
#include "cuda/cuda_util.hpp"
#include "cuda/device_memory.hpp"
#include "cuda/flash/flash.hpp"
#include "cuda/merge/merge.hpp"
#include "cuda/parallel/nccl_transport.hpp"
#include "cuda/parallel/ring_ops.hpp"
#include "cuda/standard/standard.hpp"
#include "cuda/standard/standard_kernels.hpp"

namespace flashattn {

namespace {

using cuda::check_cuda;
using cuda::DeviceGuard;
using cuda::DeviceInfo;

// cuBLAS's workspace, owned by the context so that no GEMM ever allocates (graph capture).
// 32 MiB is what cuBLAS recommends for Hopper.
constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;

std::string device_name(int device) {
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "?";
  }
  return prop.name;
}

// The NVIDIA driver's user-space library, which the CUDA runtime loads.
constexpr const char* kDriverLibrary = "libcuda.so.1";

bool driver_installed() {
  void* lib = dlopen(kDriverLibrary, RTLD_LAZY | RTLD_LOCAL);
  if (lib == nullptr) return false;
  dlclose(lib);
  return true;
}

// Why cudaGetDeviceCount failed, in words for the message. Without any NVIDIA driver the runtime
// says "CUDA driver version is insufficient for CUDA runtime version", which sends the reader
// after a driver update when there is no driver at all.
std::string cuda_unusable_reason(cudaError_t e) {
  if (e == cudaErrorInsufficientDriver && !driver_installed()) {
    return format("CUDA is unavailable: no NVIDIA driver was found (%s cannot be loaded)",
                  kDriverLibrary);
  }
  return format("no usable CUDA driver or device: %s (%s)", cudaGetErrorString(e),
                cudaGetErrorName(e));
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;

  flashattn_backend_t kind() const override { return FLASHATTN_BACKEND_CUDA; }
  int device() const override { return dev_.ordinal; }

  void check_supported(const Problem& p, bool backward) const override;
  size_t workspace_size(const Problem& p, bool backward) const override;
  void forward(const ForwardArgs& args, Workspace ws) override;
  void backward(const BackwardArgs& args, Workspace ws) override;
  void check_merge_supported(DType dtype) const override;
  void merge(const MergeArgs& args) override;
  void ring_op(const RingOp& op) override;
  std::unique_ptr<RingTransport> make_nccl_transport(void* comm, int64_t ranks,
                                                     int64_t rank) override;

  void* allocate(size_t bytes) override;
  void deallocate(void* ptr) noexcept override;
  void copy_from_host(void* dst, const void* src, size_t bytes) override;
  void copy_to_host(void* dst, const void* src, size_t bytes) override;
  void check_memory(const void* ptr, size_t bytes, const char* name) const override;

  void set_stream(void* stream) override;
  void* stream() const override { return current(); }
  void synchronize() override;
  void set_num_threads(int) override {}

 private:
  cudaStream_t current() const { return stream_.load(std::memory_order_acquire); }
  void bind_cublas(cudaStream_t stream);
  void release() noexcept;
  cuda::standard::Context standard_context() const {
    return cuda::standard::Context{api_, cublas_, current()};
  }

  DeviceInfo dev_;
  const cuda::CublasApi* api_ = nullptr;
  cudaStream_t own_stream_ = nullptr;
  // Read by deallocate(), which buffer finalizers may call from any thread.
  std::atomic<cudaStream_t> stream_{nullptr};
  cublasHandle_t cublas_ = nullptr;
  void* cublas_workspace_ = nullptr;
  const char* standard_unavailable_ = nullptr;  // why the standard kernels cannot run here
  std::string standard_unavailable_text_;
  std::unique_ptr<cuda::RingStreams> ring_streams_;  // context parallelism's, made on first use
};

CudaBackend::CudaBackend(int device) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    fail(FLASHATTN_ERROR_BACKEND_UNAVAILABLE, "%s", cuda_unusable_reason(e).c_str());
  }
  if (device >= count) {
    fail(FLASHATTN_ERROR_BACKEND_UNAVAILABLE, "device %d does not exist: %d CUDA device%s",
         device, count, count == 1 ? "" : "s");
  }
  std::optional<DeviceGuard> guard;
  try {
    guard.emplace(device);
  } catch (const Error& error) {
    fail(FLASHATTN_ERROR_BACKEND_UNAVAILABLE, "cannot use CUDA device %d: %s", device,
         error.what());
  }
  try {
    dev_.ordinal = device;
    int value = 0;
    check_cuda(cudaDeviceGetAttribute(&dev_.sm_major, cudaDevAttrComputeCapabilityMajor, device),
               "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&dev_.sm_minor, cudaDevAttrComputeCapabilityMinor, device),
               "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&dev_.sm_count, cudaDevAttrMultiProcessorCount, device),
               "cudaDeviceGetAttribute");
    check_cuda(cudaDeviceGetAttribute(&value, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
               "cudaDeviceGetAttribute");
    dev_.smem_per_block_optin = static_cast<size_t>(value);
    check_cuda(cudaDeviceGetAttribute(&value, cudaDevAttrL2CacheSize, device),
               "cudaDeviceGetAttribute");
    dev_.l2_bytes = static_cast<size_t>(value);

    api_ = &cuda::cublas();  // BACKEND_UNAVAILABLE naming the library when it cannot be loaded

    check_cuda(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking),
               "cudaStreamCreateWithFlags");
    stream_.store(own_stream_, std::memory_order_release);
    cublasStatus_t s = api_->create(&cublas_);
    if (s != CUBLAS_STATUS_SUCCESS) {
      cublas_ = nullptr;
      (void)cudaGetLastError();
      fail(s == CUBLAS_STATUS_ALLOC_FAILED ? FLASHATTN_ERROR_DEVICE_OUT_OF_MEMORY
                                           : FLASHATTN_ERROR_DEVICE,
           "cublasCreate on device %d (%s): %s", device, api_->path,
           cuda::cublas_status_text(s));
    }
    // fp32 accumulation everywhere, and no reduced-precision split-K reductions either.
    s = api_->set_math_mode(cublas_, static_cast<cublasMath_t>(
                                         CUBLAS_DEFAULT_MATH |
                                         CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
    if (s != CUBLAS_STATUS_SUCCESS) {
      fail(FLASHATTN_ERROR_DEVICE, "cublasSetMathMode: %s", cuda::cublas_status_text(s));
    }
    cublas_workspace_ = cuda::device_allocate(kCublasWorkspaceBytes);
    bind_cublas(own_stream_);

    e = cuda::standard::kernels_loadable();
    if (e != cudaSuccess) {
      standard_unavailable_text_ = format(
          "this libflashattn has no CUDA kernels that run on device %d (%s, sm_%d%d): %s; "
          "rebuild with FLASHATTN_CUDA_ARCHS including %d%d",
          device, device_name(device).c_str(), dev_.sm_major, dev_.sm_minor,
          cudaGetErrorString(e), dev_.sm_major, dev_.sm_minor);
      standard_unavailable_ = standard_unavailable_text_.c_str();
    }
  } catch (...) {
    release();
    throw;
  }
}

CudaBackend::~CudaBackend() {
  try {
    DeviceGuard guard(dev_.ordinal);
    release();
  } catch (...) {
    // Cannot make the device current (driver gone at exit): nothing left to release safely.
  }
}

void CudaBackend::release() noexcept {
  if (own_stream_ != nullptr) (void)cudaStreamSynchronize(own_stream_);
  if (cublas_ != nullptr) api_->destroy(cublas_);
  cublas_ = nullptr;
  if (cublas_workspace_ != nullptr) (void)cudaFree(cublas_workspace_);
  cublas_workspace_ = nullptr;
  if (own_stream_ != nullptr) (void)cudaStreamDestroy(own_stream_);
  own_stream_ = nullptr;
  (void)cudaGetLastError();
}

// cublasSetStream resets the handle's workspace to cuBLAS's own pool (which allocates on
// first use), so the workspace is set again every time.
void CudaBackend::bind_cublas(cudaStream_t stream) {
  cublasStatus_t s = api_->set_stream(cublas_, stream);
  if (s == CUBLAS_STATUS_SUCCESS) {
    s = api_->set_workspace(cublas_, cublas_workspace_, kCublasWorkspaceBytes);
  }
  if (s != CUBLAS_STATUS_SUCCESS) {
    fail(FLASHATTN_ERROR_DEVICE, "binding cuBLAS to the stream: %s", cuda::cublas_status_text(s));
  }
}

void CudaBackend::check_supported(const Problem& p, bool backward) const {
  if (p.dtype == DType::F32) {
    fail(FLASHATTN_ERROR_UNSUPPORTED,
         "the CUDA backend computes in float16 and bfloat16; float32 runs on the CPU backend");
  }
  if (p.kv_cache != KvCache::None && p.algorithm == Algorithm::Standard) {
    fail(FLASHATTN_ERROR_UNSUPPORTED,
         "standard algorithm: the KV cache (cache_seqlens) runs on the flash algorithm on CUDA");
  }
  if (p.algorithm == Algorithm::Flash) {
    const char* why = cuda::flash_unsupported_reason(p, backward, dev_);
    if (why != nullptr) fail(FLASHATTN_ERROR_UNSUPPORTED, "flash algorithm: %s", why);
    return;
  }
  if (standard_unavailable_ != nullptr) {
    fail(FLASHATTN_ERROR_UNSUPPORTED, "standard algorithm: %s", standard_unavailable_);
  }
  const char* why = cuda::standard::unsupported_reason(p);
  if (why != nullptr) fail(FLASHATTN_ERROR_UNSUPPORTED, "standard algorithm: %s", why);
}

size_t CudaBackend::workspace_size(const Problem& p, bool backward) const {
  if (p.algorithm == Algorithm::Flash) return cuda::flash_workspace_size(p, backward, dev_);
  return cuda::standard::workspace_size(p, backward);
}

// The views of a call may need more copies than a query saw (a data pointer off 16 bytes, an
// output's strides): the API layer sized the workspace from the same views, so this holds for
// its calls; it is checked for every caller all the same.
void check_call_workspace(size_t needed, const Workspace& ws) {
  if (ws.size < needed) {
    fail(FLASHATTN_ERROR_WORKSPACE_TOO_SMALL,
         "flash algorithm: this call's views need %zu bytes of workspace (rows off 16 bytes are "
         "copied there), %zu given", needed, ws.size);
  }
}

void CudaBackend::forward(const ForwardArgs& args, Workspace ws) {
  DeviceGuard guard(dev_.ordinal);
  if (args.problem.algorithm == Algorithm::Flash) {
    const char* why = cuda::flash_unsupported_layout(args);
    if (why != nullptr) fail(FLASHATTN_ERROR_UNSUPPORTED, "flash algorithm: %s", why);
    check_call_workspace(cuda::flash_call_workspace_size(args, dev_), ws);
    cudaError_t e = cuda::flash_forward(args, ws.data, ws.size, dev_, current());
    if (e == cudaErrorNotSupported) {
      fail(FLASHATTN_ERROR_INTERNAL,
           "flash forward declined a problem that flash_unsupported_reason accepted");
    }
    if (e == cudaSuccess) e = cudaGetLastError();
    check_cuda(e, "flash forward kernel launch");
    return;
  }
  cuda::standard::forward(args, ws.data, ws.size, standard_context());
}

void CudaBackend::backward(const BackwardArgs& args, Workspace ws) {
  DeviceGuard guard(dev_.ordinal);
  if (args.problem.algorithm == Algorithm::Flash) {
    check_call_workspace(cuda::flash_call_workspace_size(args, dev_), ws);
    cudaError_t e = cuda::flash_backward(args, ws.data, ws.size, dev_, current());
    if (e == cudaErrorNotSupported) {
      fail(FLASHATTN_ERROR_INTERNAL,
           "flash backward declined a problem that flash_unsupported_reason accepted");
    }
    if (e == cudaSuccess) e = cudaGetLastError();
    check_cuda(e, "flash backward kernel launch");
    return;
  }
  cuda::standard::backward(args, ws.data, ws.size, standard_context());
}

void CudaBackend::check_merge_supported(DType dtype) const {
  if (dtype == DType::F32) {
    fail(FLASHATTN_ERROR_UNSUPPORTED,
         "merge: the CUDA backend merges float16 and bfloat16; float32 runs on the CPU backend");
  }
}

void CudaBackend::merge(const MergeArgs& args) {
  DeviceGuard guard(dev_.ordinal);
  check_cuda(cuda::merge_partials(args, current()), "merge kernel launch");
}

void CudaBackend::ring_op(const RingOp& op) {
  DeviceGuard guard(dev_.ordinal);
  check_cuda(cuda::launch_ring_op(op, current()), "context-parallel step launch");
}

std::unique_ptr<RingTransport> CudaBackend::make_nccl_transport(void* comm, int64_t ranks,
                                                                int64_t rank) {
  if (ring_streams_ == nullptr) ring_streams_ = std::make_unique<cuda::RingStreams>(dev_.ordinal);
  return cuda::make_nccl_transport(*ring_streams_, current(), comm, ranks, rank, dev_.ordinal);
}

void* CudaBackend::allocate(size_t bytes) {
  DeviceGuard guard(dev_.ordinal);
  return cuda::device_allocate(bytes);
}

void CudaBackend::deallocate(void* ptr) noexcept {
  try {
    DeviceGuard guard(dev_.ordinal);
    (void)cuda::device_free(ptr, current());
  } catch (...) {
    // The device cannot be made current (driver shutting down): the memory goes with it.
  }
}

void CudaBackend::copy_from_host(void* dst, const void* src, size_t bytes) {
  DeviceGuard guard(dev_.ordinal);
  cuda::copy_host_to_device(dst, src, bytes, current());
}

void CudaBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
  DeviceGuard guard(dev_.ordinal);
  cuda::copy_device_to_host(dst, src, bytes, current());
}

void CudaBackend::check_memory(const void* ptr, size_t bytes, const char* name) const {
  DeviceGuard guard(dev_.ordinal);
  cuda::check_device_pointer(ptr, bytes, name, dev_.ordinal);
}

void CudaBackend::set_stream(void* stream) {
  DeviceGuard guard(dev_.ordinal);
  cudaStream_t s = stream != nullptr ? static_cast<cudaStream_t>(stream) : own_stream_;
  if (stream != nullptr) {
    cuda::RelaxedCaptureScope relaxed;  // the stream may be capturing already
    int stream_device = -1;
    cudaError_t e = cudaStreamGetDevice(s, &stream_device);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "stream: not a usable CUDA stream (%s)",
           cudaGetErrorString(e));
    }
    if (stream_device != dev_.ordinal) {
      fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
           "stream: belongs to device %d; this context is on device %d", stream_device,
           dev_.ordinal);
    }
  }
  bind_cublas(s);
  stream_.store(s, std::memory_order_release);
}

void CudaBackend::synchronize() {
  DeviceGuard guard(dev_.ordinal);
  check_cuda(cudaStreamSynchronize(current()), "cudaStreamSynchronize (an earlier launch failed)");
}

}  // namespace

std::unique_ptr<Backend> make_cuda_backend(int device) {
  return std::make_unique<CudaBackend>(device);
}

int cuda_device_count() noexcept {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

}  // namespace flashattn
