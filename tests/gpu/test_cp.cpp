// Context parallelism on CUDA contexts (tests/common/cp_check.hpp, as the CPU tests): each
// rank's results against one call over the whole sequence by the tolerance rule.
//  - One GPU: every rank a context on device 0, the shards passed by an exchange function that
//    copies device memory (cudaMemcpy): the ring's steps and kernels on the GPU.
//  - NCCL, one rank per GPU (ncclCommInitAll over the devices, at most 8): the transport of
//    real use, overlapped with the attention. Skipped, with the reason, where fewer than two
//    GPUs are visible or libnccl.so.2 cannot be opened.
#include <dlfcn.h>

#include <cuda_runtime.h>

#include <memory>
#include <string>
#include <vector>

#include "common/cp_check.hpp"
#include "gpu_harness.hpp"

namespace {

using flashattn_test::CpCase;
using flashattn_test::CpRank;
using flashattn_test::HostTensor;
using flashattn_test::RankLink;

constexpr flashattn_dtype_t F16 = FLASHATTN_DTYPE_FLOAT16;
constexpr flashattn_dtype_t BF16 = FLASHATTN_DTYPE_BFLOAT16;

// A CUDA rank on `device`, with its device mirrors; `comm` (an ncclComm_t) or an exchange.
class CudaRank final : public CpRank {
 public:
  CudaRank(int device, void* comm) : comm_(comm) {
    cudaSetDevice(device);
    REQUIRE(flashattn_context_create(&ctx_, FLASHATTN_BACKEND_CUDA, device) == FLASHATTN_SUCCESS);
  }
  ~CudaRank() override { flashattn_context_destroy(ctx_); }
  flashattn_context_t context() override { return ctx_; }
  flashattn_tensor_t place(const HostTensor& t) override { return set_.upload(t); }
  void fetch(HostTensor& t) override { set_.download(t); }
  void* workspace(size_t bytes) override {
    ws_ = gpu_test::DeviceMemory(bytes);
    return ws_.get();
  }
  void set_transport(flashattn_cp_args_t* cp, RankLink* link) override {
    if (comm_ != nullptr) {
      cp->nccl_comm = comm_;
    } else {
      cp->exchange = flashattn_test::ring_exchange;
      cp->exchange_user = link;
    }
  }

 private:
  flashattn_context_t ctx_ = nullptr;
  void* comm_;
  gpu_test::DeviceSet set_;
  gpu_test::DeviceMemory ws_;
};

// A cudaMemcpy between device pointers may return before the copy is done, and an exchange
// must return once it is (the header's contract: the ranks go on to overwrite send and read
// recv on streams that do not wait for the legacy one), so the copy is waited for. Without the
// wait the dk and dv that travel came out wrong when other work slowed the GPU down.
void device_copy(void* dst, const void* src, size_t bytes) {
  REQUIRE(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault) == cudaSuccess);
  REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
}

CpCase make_case(flashattn_dtype_t dtype, int ranks, int64_t layout, int64_t n, bool causal) {
  CpCase c;
  c.dtype = dtype;
  c.ranks = ranks;
  c.layout = layout;
  c.batch = 1;
  c.n = n;
  c.hq = 8;
  c.hkv = 2;
  c.d = c.dv = 128;
  c.causal = causal;
  return c;
}

void check_one_gpu(const CpCase& c) {
  flashattn_test::check_cp(
      c, [](int) { return std::unique_ptr<CpRank>(new CudaRank(0, nullptr)); }, device_copy);
}

// NCCL's few entry points the test needs (its C ABI; the library opens its own copy too).
struct Nccl {
  void* lib = nullptr;
  int (*comm_init_all)(void** comms, int ndev, const int* devlist) = nullptr;
  int (*comm_destroy)(void* comm) = nullptr;
  std::string why;
  Nccl() {
    lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
    if (lib == nullptr) {
      const char* e = dlerror();
      why = std::string("libnccl.so.2 cannot be opened: ") + (e ? e : "?");
      return;
    }
    comm_init_all = reinterpret_cast<int (*)(void**, int, const int*)>(dlsym(lib, "ncclCommInitAll"));
    comm_destroy = reinterpret_cast<int (*)(void*)>(dlsym(lib, "ncclCommDestroy"));
    if (comm_init_all == nullptr || comm_destroy == nullptr) why = "libnccl.so.2 lacks ncclCommInitAll";
  }
  bool ok() const { return why.empty(); }
};

Nccl& nccl() {
  static Nccl n;
  return n;
}

}  // namespace

TEST_SUITE("gpu_cp") {
  TEST_CASE("one GPU, shards copied by an exchange: layouts, causal or not, GQA") {
    for (int64_t layout : {FLASHATTN_CP_LAYOUT_CONTIGUOUS, FLASHATTN_CP_LAYOUT_ZIGZAG}) {
      for (bool causal : {true, false}) {
        for (int ranks : {2, 3, 4}) check_one_gpu(make_case(BF16, ranks, layout, 192, causal));
      }
    }
  }

  TEST_CASE("one GPU: fp16, sinks, softcap, windows, the caller's workspace") {
    CpCase c = make_case(F16, 4, FLASHATTN_CP_LAYOUT_ZIGZAG, 256, true);
    c.sinks = true;
    c.caller_workspace = true;
    check_one_gpu(c);
    c.softcap = 30.0f;
    check_one_gpu(c);
    CpCase w = make_case(BF16, 3, FLASHATTN_CP_LAYOUT_CONTIGUOUS, 160, true);
    w.window = 1;
    w.window_left = 100;
    check_one_gpu(w);
    w.layout = FLASHATTN_CP_LAYOUT_ZIGZAG;
    w.causal = false;
    w.window_right = 37;
    check_one_gpu(w);
  }

  TEST_CASE("NCCL: one rank per GPU") {
    int devices = 0;
    REQUIRE(cudaGetDeviceCount(&devices) == cudaSuccess);
    if (!nccl().ok()) {
      MESSAGE("skipped: " << nccl().why);
      return;
    }
    // One rank on one GPU: the library opens NCCL and checks the communicator.
    {
      void* comm = nullptr;
      REQUIRE(nccl().comm_init_all(&comm, 1, nullptr) == 0);
      CpCase c = make_case(BF16, 1, FLASHATTN_CP_LAYOUT_ZIGZAG, 512, true);
      flashattn_test::check_cp(
          c, [comm](int) { return std::unique_ptr<CpRank>(new CudaRank(0, comm)); },
          device_copy);
      nccl().comm_destroy(comm);
    }
    if (devices < 2) {
      MESSAGE("skipped the multi-GPU ring: " << devices << " GPU visible");
      return;
    }
    const int ranks = devices < 8 ? devices : 8;
    std::vector<void*> comms(static_cast<size_t>(ranks), nullptr);
    REQUIRE(nccl().comm_init_all(comms.data(), ranks, nullptr) == 0);
    auto factory = [&comms](int r) {
      const int device = r < 0 ? 0 : r;
      return std::unique_ptr<CpRank>(new CudaRank(device, r < 0 ? nullptr : comms[static_cast<size_t>(r)]));
    };
    for (int64_t layout : {FLASHATTN_CP_LAYOUT_ZIGZAG, FLASHATTN_CP_LAYOUT_CONTIGUOUS}) {
      for (bool causal : {true, false}) {
        flashattn_test::check_cp(make_case(BF16, ranks, layout, 256, causal), factory, device_copy);
      }
    }
    CpCase s = make_case(F16, ranks, FLASHATTN_CP_LAYOUT_ZIGZAG, 512, true);
    s.sinks = true;
    s.window = 1;
    s.window_left = 300;
    flashattn_test::check_cp(s, factory, device_copy);
    for (void* comm : comms) nccl().comm_destroy(comm);
  }
}
