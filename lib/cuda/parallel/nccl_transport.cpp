#include "cuda/parallel/nccl_transport.hpp"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "core/error.hpp"
#include "cuda/cuda_util.hpp"

namespace flashattn {
namespace cuda {

namespace {

// NCCL's C ABI, as nccl.h of NCCL 2 states it (stable across its releases): ncclResult_t and
// ncclDataType_t are ints, ncclComm_t a pointer.
using NcclResult = int;
constexpr NcclResult kNcclSuccess = 0;
constexpr int kNcclUint8 = 1;  // ncclUint8: the ring moves bytes

struct NcclApi {
  NcclResult (*send)(const void*, size_t, int, int, void*, cudaStream_t) = nullptr;
  NcclResult (*recv)(void*, size_t, int, int, void*, cudaStream_t) = nullptr;
  NcclResult (*group_start)() = nullptr;
  NcclResult (*group_end)() = nullptr;
  NcclResult (*comm_count)(void*, int*) = nullptr;
  NcclResult (*comm_user_rank)(void*, int*) = nullptr;
  NcclResult (*comm_cu_device)(void*, int*) = nullptr;
  const char* (*error_string)(NcclResult) = nullptr;
};

std::mutex g_mutex;
NcclApi g_api;
bool g_loaded = false;
std::string g_error;

template <class F>
bool resolve(void* lib, const char* name, F* out) {
  void* sym = dlsym(lib, name);
  if (sym == nullptr) {
    if (!g_error.empty()) g_error += ", ";
    g_error += name;
    return false;
  }
  *out = reinterpret_cast<F>(sym);
  return true;
}

const NcclApi& nccl_api() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_loaded) return g_api;
  if (!g_error.empty()) fail(FLASHATTN_ERROR_UNSUPPORTED, "cp: %s", g_error.c_str());
  void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    g_error = std::string("libnccl.so.2 could not be opened (") + (why ? why : "no reason given") +
              "); context parallelism on CUDA needs NCCL 2";
    fail(FLASHATTN_ERROR_UNSUPPORTED, "cp: %s", g_error.c_str());
  }
  NcclApi api;
  bool ok = resolve(lib, "ncclSend", &api.send);
  ok &= resolve(lib, "ncclRecv", &api.recv);
  ok &= resolve(lib, "ncclGroupStart", &api.group_start);
  ok &= resolve(lib, "ncclGroupEnd", &api.group_end);
  ok &= resolve(lib, "ncclCommCount", &api.comm_count);
  ok &= resolve(lib, "ncclCommUserRank", &api.comm_user_rank);
  ok &= resolve(lib, "ncclCommCuDevice", &api.comm_cu_device);
  ok &= resolve(lib, "ncclGetErrorString", &api.error_string);
  if (!ok) {
    g_error = "libnccl.so.2 lacks " + g_error + " (NCCL 2.7 or newer has them)";
    fail(FLASHATTN_ERROR_UNSUPPORTED, "cp: %s", g_error.c_str());
  }
  g_api = api;
  g_loaded = true;  // the library stays open: the process's NCCL outlives any context
  return g_api;
}

void check_nccl(const NcclApi& api, NcclResult r, const char* what) {
  if (r != kNcclSuccess) {
    fail(FLASHATTN_ERROR_DEVICE, "cp: %s failed: %s (NCCL status %d)", what, api.error_string(r),
         r);
  }
}

class NcclTransport final : public RingTransport {
 public:
  NcclTransport(const NcclApi& api, RingStreams& streams, cudaStream_t compute, void* comm,
                int next, int prev)
      : api_(api), streams_(streams), compute_(compute), comm_(comm), next_(next), prev_(prev) {}

  int start(const void* send, void* recv, size_t bytes) override {
    const int slot = issued_++ % RingStreams::kSlots;
    check_cuda(cudaEventRecord(streams_.ready(slot), compute_), "cp: cudaEventRecord");
    check_cuda(cudaStreamWaitEvent(streams_.stream(), streams_.ready(slot), 0),
               "cp: cudaStreamWaitEvent");
    check_nccl(api_, api_.group_start(), "ncclGroupStart");
    const NcclResult s = api_.send(send, bytes, kNcclUint8, next_, comm_, streams_.stream());
    const NcclResult r = api_.recv(recv, bytes, kNcclUint8, prev_, comm_, streams_.stream());
    const NcclResult e = api_.group_end();
    check_nccl(api_, s, "ncclSend");
    check_nccl(api_, r, "ncclRecv");
    check_nccl(api_, e, "ncclGroupEnd");
    check_cuda(cudaEventRecord(streams_.done(slot), streams_.stream()), "cp: cudaEventRecord");
    return slot;
  }

  void wait(int ticket) override {
    check_cuda(cudaStreamWaitEvent(compute_, streams_.done(ticket), 0), "cp: cudaStreamWaitEvent");
  }

 private:
  const NcclApi& api_;
  RingStreams& streams_;
  cudaStream_t compute_;
  void* comm_;
  int next_, prev_;
  int issued_ = 0;
};

}  // namespace

RingStreams::RingStreams(int device) {
  DeviceGuard guard(device);
  cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
  for (int i = 0; i < kSlots && e == cudaSuccess; ++i) {
    e = cudaEventCreateWithFlags(&ready_[i], cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&done_[i], cudaEventDisableTiming);
  }
  if (e != cudaSuccess) {
    release();
    check_cuda(e, "cp: creating the transfer stream and events");
  }
}

RingStreams::~RingStreams() { release(); }

void RingStreams::release() noexcept {
  if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
  for (int i = 0; i < kSlots; ++i) {
    if (ready_[i] != nullptr) (void)cudaEventDestroy(ready_[i]);
    if (done_[i] != nullptr) (void)cudaEventDestroy(done_[i]);
    ready_[i] = done_[i] = nullptr;
  }
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  stream_ = nullptr;
}

std::unique_ptr<RingTransport> make_nccl_transport(RingStreams& streams, cudaStream_t compute,
                                                   void* comm, int64_t ranks, int64_t rank,
                                                   int device) {
  const NcclApi& api = nccl_api();
  int count = 0, user_rank = -1, comm_device = -1;
  check_nccl(api, api.comm_count(comm, &count), "ncclCommCount");
  check_nccl(api, api.comm_user_rank(comm, &user_rank), "ncclCommUserRank");
  check_nccl(api, api.comm_cu_device(comm, &comm_device), "ncclCommCuDevice");
  if (count != ranks || user_rank != rank) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
         "cp: nccl_comm has %d ranks and is rank %d; cp says %lld ranks, rank %lld", count,
         user_rank, static_cast<long long>(ranks), static_cast<long long>(rank));
  }
  if (comm_device != device) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
         "cp: nccl_comm is on device %d; this context is on device %d", comm_device, device);
  }
  const int next = static_cast<int>((rank + 1) % ranks);
  const int prev = static_cast<int>((rank + ranks - 1) % ranks);
  return std::make_unique<NcclTransport>(api, streams, compute, comm, next, prev);
}

}  // namespace cuda
}  // namespace flashattn
