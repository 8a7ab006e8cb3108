// The CUDA context's contract: memory checks (host pointers, other devices, views past their
// allocation), out of device memory as a status with the context still usable, streams (own,
// the caller's, no hidden synchronization), caller-owned workspace, graph capture and replay,
// the caller's current device left alone, float32 unsupported.
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gpu_harness.hpp"
#include "standard_emulation.hpp"
#include "variant_harness.hpp"

namespace {

using gpu_test::Case;
using gpu_test::DeviceMemory;
using gpu_test::DeviceSet;
using gpu_test::HostTensor;
using gpu_test::Layout;

constexpr flashattn_dtype_t BF16 = FLASHATTN_DTYPE_BFLOAT16;

const Case kSmall{"context case", BF16, 2, 64, 80, 4, 2, 64, true, 0.0f, Layout::Contiguous};

bool contains(const char* text, const char* part) { return std::strstr(text, part) != nullptr; }

// A fresh CUDA context for one test (its own stream, scratch and cuBLAS handle).
struct Context {
  flashattn_context_t ctx = nullptr;
  Context() { GPU_FA_OK(flashattn_context_create(&ctx, FLASHATTN_BACKEND_CUDA, 0)); }
  ~Context() { flashattn_context_destroy(ctx); }
};

struct Stream {
  cudaStream_t s = nullptr;
  Stream() { GPU_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
  ~Stream() { cudaStreamDestroy(s); }
};

// The small problem's host tensors, device copies and float64/emulated expectations.
struct Small {
  Case c;
  gpu_test::Inputs in;
  HostTensor out, lse;
  DeviceSet dev;
  flashattn_tensor_t q{}, k{}, v{}, o{}, l{};

  explicit Small(uint64_t seed = 1, const Case& shape = kSmall) : c(shape) {
    in = gpu_test::make_inputs(c, seed);
    out = HostTensor::make(c.dtype, c.b, c.nq, c.hq, c.d);
    lse = HostTensor::lse(c.b, c.hq, c.nq);
    out.poison();
    lse.poison();
    q = dev.upload(in.q);
    k = dev.upload(in.k);
    v = dev.upload(in.v);
    o = dev.upload(out);
    l = dev.upload(lse);
  }
  // New input values in the same device memory.
  void refill(uint64_t seed) {
    gpu_test::Inputs fresh = gpu_test::make_inputs(c, seed);
    in.q.from_double(fresh.q.to_double());
    in.k.from_double(fresh.k.to_double());
    in.v.from_double(fresh.v.to_double());
    dev.upload(in.q);
    dev.upload(in.k);
    dev.upload(in.v);
    out.poison();
    dev.upload(out);
  }
  flashattn_options_t options(flashattn_algorithm_t a = FLASHATTN_ALGORITHM_STANDARD) const {
    return gpu_test::options_for(c, a);
  }
  flashattn_status_t forward(flashattn_context_t ctx, void* ws = nullptr, size_t ws_size = 0,
                             flashattn_algorithm_t a = FLASHATTN_ALGORITHM_STANDARD) {
    const flashattn_options_t opts = options(a);
    return flashattn_forward(ctx, &q, &k, &v, &o, &l, &opts, ws, ws_size);
  }
  std::vector<double> fetch_out() {
    dev.download(out);
    return out.to_double();
  }
  // The standard forward's result, checked against the host emulation.
  void expect_standard_result() {
    std::vector<double> o_emu, lse_emu;
    gpu_test::emulate_standard_forward(gpu_test::ref_of(c), c.dtype, in.q.to_double(),
                                       in.k.to_double(), in.v.to_double(), &o_emu, &lse_emu);
    const flashattn_test::Comparison cmp = flashattn_test::check_close(
        "out vs emulation", fetch_out(), o_emu, gpu_test::emulation_tolerance(c.dtype, o_emu));
    INFO(cmp.message);
    CHECK(cmp.ok);
  }
};

}  // namespace

TEST_SUITE("gpu_context") {

TEST_CASE("context: device, backend, own stream; float32 is unsupported") {
  Context c;
  flashattn_backend_t backend = FLASHATTN_BACKEND_AUTO;
  GPU_FA_OK(flashattn_context_get_backend(&backend, c.ctx));
  CHECK(backend == FLASHATTN_BACKEND_CUDA);
  int device = -1;
  GPU_FA_OK(flashattn_context_get_device(&device, c.ctx));
  CHECK(device == 0);
  void* stream = nullptr;
  GPU_FA_OK(flashattn_context_get_stream(&stream, c.ctx));
  CHECK(stream != nullptr);  // its own non-blocking stream, not the legacy default stream
  unsigned int flags = 0;
  GPU_CUDA_OK(cudaStreamGetFlags(static_cast<cudaStream_t>(stream), &flags));
  CHECK((flags & cudaStreamNonBlocking) != 0);

  int count = 0;
  GPU_FA_OK(flashattn_cuda_device_count(&count));
  flashattn_context_t none = nullptr;
  CHECK(flashattn_context_create(&none, FLASHATTN_BACKEND_CUDA, count) ==
        FLASHATTN_ERROR_BACKEND_UNAVAILABLE);
  CHECK(contains(flashattn_last_error(), "does not exist"));
  CHECK(none == nullptr);

  flashattn_tensor_t q{}, k{}, v{};
  GPU_FA_OK(flashattn_tensor_4d(&q, nullptr, FLASHATTN_DTYPE_FLOAT32, 1, 16, 2, 64));
  GPU_FA_OK(flashattn_tensor_4d(&k, nullptr, FLASHATTN_DTYPE_FLOAT32, 1, 16, 2, 64));
  GPU_FA_OK(flashattn_tensor_4d(&v, nullptr, FLASHATTN_DTYPE_FLOAT32, 1, 16, 2, 64));
  for (flashattn_algorithm_t a : {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD}) {
    flashattn_options_t opts = FLASHATTN_OPTIONS_INIT;
    opts.algorithm = a;
    CHECK(flashattn_supported(c.ctx, &q, &k, &v, &opts, 0) == FLASHATTN_ERROR_UNSUPPORTED);
    CHECK(contains(flashattn_last_error(), "float32"));
    CHECK(flashattn_supported(c.ctx, &q, &k, &v, &opts, 1) == FLASHATTN_ERROR_UNSUPPORTED);
  }
}

TEST_CASE("memory: host pointers, pinned memory and views past an allocation are rejected") {
  Context c;
  Small s;
  // Host memory for q.
  std::vector<unsigned char> host(s.in.q.storage_bytes() + 256);
  flashattn_tensor_t hq = s.in.q.view_at(host.data());
  flashattn_options_t opts = s.options();
  CHECK(flashattn_forward(c.ctx, &hq, &s.k, &s.v, &s.o, &s.l, &opts, nullptr, 0) ==
        FLASHATTN_ERROR_INVALID_MEMORY);
  CHECK(contains(flashattn_last_error(), "q: is host memory"));

  // Pinned host memory for the output.
  void* pinned = nullptr;
  GPU_CUDA_OK(cudaMallocHost(&pinned, s.out.storage_bytes()));
  flashattn_tensor_t po = s.out.view_at(pinned);
  CHECK(flashattn_forward(c.ctx, &s.q, &s.k, &s.v, &po, &s.l, &opts, nullptr, 0) ==
        FLASHATTN_ERROR_INVALID_MEMORY);
  CHECK(contains(flashattn_last_error(), "out: is pinned host memory"));
  cudaFreeHost(pinned);

  // k's view runs past the end of its cudaMalloc allocation, by more than any allocation
  // granularity could hide (2 MiB).
  {
    const int64_t n = 2048, h = 8, d = 128;  // 4 MiB in bf16
    const size_t full = size_t(n) * h * d * 2;
    // `shorter` is allocated last, so no view of this call lies in the memory after it (the
    // aliasing check would report that first).
    DeviceMemory whole(full), out(full), shorter(full - (size_t(2) << 20) - 4096);
    GPU_CUDA_OK(cudaMemset(whole.get(), 0, full));
    GPU_CUDA_OK(cudaMemset(shorter.get(), 0, shorter.size()));
    flashattn_tensor_t x{}, sk{}, o{};
    GPU_FA_OK(flashattn_tensor_4d(&x, whole.get(), BF16, 1, n, h, d));
    GPU_FA_OK(flashattn_tensor_4d(&sk, shorter.get(), BF16, 1, n, h, d));
    GPU_FA_OK(flashattn_tensor_4d(&o, out.get(), BF16, 1, n, h, d));
    CHECK(flashattn_forward(c.ctx, &x, &sk, &x, &o, nullptr, &opts, nullptr, 0) ==
          FLASHATTN_ERROR_INVALID_MEMORY);
    INFO("last error: " << std::string(flashattn_last_error()));
    CHECK(contains(flashattn_last_error(), "k: the view spans"));
    CHECK(contains(flashattn_last_error(), "remain in its allocation"));
    GPU_FA_OK(flashattn_forward(c.ctx, &x, &x, &x, &o, nullptr, &opts, nullptr, 0));
  }

  // A view inside a flashattn buffer too small for it (the buffer registry's check).
  flashattn_buffer_t buf = nullptr;
  GPU_FA_OK(flashattn_buffer_create(&buf, c.ctx, s.in.v.storage_bytes() - 2));
  void* bufp = nullptr;
  GPU_FA_OK(flashattn_buffer_data(&bufp, buf));
  flashattn_tensor_t bv = s.in.v.view_at(bufp);
  CHECK(flashattn_forward(c.ctx, &s.q, &s.k, &bv, &s.o, &s.l, &opts, nullptr, 0) ==
        FLASHATTN_ERROR_INVALID_MEMORY);
  GPU_FA_OK(flashattn_buffer_destroy(buf));

  // The output was never touched (still all NaN), and the context still works.
  bool all_poisoned = true;
  for (double x : s.fetch_out()) all_poisoned = all_poisoned && std::isnan(x);
  CHECK(all_poisoned);
  GPU_FA_OK(s.forward(c.ctx));
  GPU_FA_OK(flashattn_context_synchronize(c.ctx));
  s.expect_standard_result();
}

TEST_CASE("memory: managed memory is accepted; another device's memory is not") {
  Context c;
  Small s;
  void* managed = nullptr;
  GPU_CUDA_OK(cudaMallocManaged(&managed, s.in.q.storage_bytes()));
  std::memcpy(managed, s.in.q.storage_data(), s.in.q.storage_bytes());
  flashattn_tensor_t mq = s.in.q.view_at(managed);
  const flashattn_options_t opts = s.options();
  GPU_FA_OK(flashattn_forward(c.ctx, &mq, &s.k, &s.v, &s.o, &s.l, &opts, nullptr, 0));
  GPU_FA_OK(flashattn_context_synchronize(c.ctx));
  s.expect_standard_result();
  cudaFree(managed);

  int count = 0;
  GPU_CUDA_OK(cudaGetDeviceCount(&count));
  if (count < 2) {
    MESSAGE("one CUDA device: the other-device memory check is not exercised");
    return;
  }
  GPU_CUDA_OK(cudaSetDevice(1));
  void* other = nullptr;
  const cudaError_t e = cudaMalloc(&other, s.in.q.storage_bytes());
  GPU_CUDA_OK(cudaSetDevice(0));
  REQUIRE(e == cudaSuccess);
  flashattn_tensor_t oq = s.in.q.view_at(other);
  CHECK(flashattn_forward(c.ctx, &oq, &s.k, &s.v, &s.o, &s.l, &opts, nullptr, 0) ==
        FLASHATTN_ERROR_INVALID_MEMORY);
  CHECK(contains(flashattn_last_error(), "is memory of device 1"));
  cudaFree(other);
}

TEST_CASE("out of device memory is a status, and the context stays usable") {
  Context c;
  Small s;
  flashattn_buffer_t huge = nullptr;
  CHECK(flashattn_buffer_create(&huge, c.ctx, size_t(1) << 50) ==
        FLASHATTN_ERROR_DEVICE_OUT_OF_MEMORY);  // 1 PiB
  CHECK(huge == nullptr);
  CHECK(contains(flashattn_last_error(), "1125899906842624 bytes"));
  CHECK(cudaGetLastError() == cudaSuccess);  // no error left behind for the caller either
  GPU_FA_OK(s.forward(c.ctx));
  GPU_FA_OK(flashattn_context_synchronize(c.ctx));
  s.expect_standard_result();

  // A standard problem whose S and P need ~190 GiB of scratch: inputs broadcast (stride 0), so
  // only the output is real memory.
  const int64_t n = 65536, h = 8, d = 64;
  DeviceMemory row(d * 2), out(size_t(n) * h * d * 2);
  GPU_CUDA_OK(cudaMemset(row.get(), 0, row.size()));
  flashattn_tensor_t q{};
  q.data = row.get();
  q.dtype = BF16;
  q.rank = 4;
  const int64_t shape[4] = {1, n, h, d};
  for (int i = 0; i < 4; ++i) q.shape[i] = shape[i];
  q.strides[3] = 1;  // the others 0: every row is the same row
  flashattn_tensor_t o{};
  GPU_FA_OK(flashattn_tensor_4d(&o, out.get(), BF16, 1, n, h, d));
  flashattn_options_t opts = FLASHATTN_OPTIONS_INIT;
  opts.algorithm = FLASHATTN_ALGORITHM_STANDARD;
  size_t need = 0;
  GPU_FA_OK(flashattn_workspace_size(&need, c.ctx, &q, &q, &q, &opts, 0));
  CHECK(need > (size_t(160) << 30));
  CHECK(flashattn_forward(c.ctx, &q, &q, &q, &o, nullptr, &opts, nullptr, 0) ==
        FLASHATTN_ERROR_DEVICE_OUT_OF_MEMORY);
  CHECK(cudaGetLastError() == cudaSuccess);
  s.refill(2);
  GPU_FA_OK(s.forward(c.ctx));
  GPU_FA_OK(flashattn_context_synchronize(c.ctx));
  s.expect_standard_result();
}

TEST_CASE("workspace: caller-owned memory of the queried size gives the same results") {
  Context c;
  Small s;
  for (flashattn_algorithm_t a : {FLASHATTN_ALGORITHM_STANDARD, FLASHATTN_ALGORITHM_FLASH}) {
    CAPTURE(a);
    const flashattn_options_t opts = s.options(a);
    if (flashattn_supported(c.ctx, &s.q, &s.k, &s.v, &opts, 0) != FLASHATTN_SUCCESS) {
      MESSAGE("flash algorithm not available: " << flashattn_last_error());
      if (gpu_test::flash_required()) FAIL_CHECK("FLASHATTN_REQUIRE_FLASH=1");
      continue;
    }
    size_t need = 0;
    GPU_FA_OK(flashattn_workspace_size(&need, c.ctx, &s.q, &s.k, &s.v, &opts, 0));
    if (a == FLASHATTN_ALGORITHM_STANDARD) CHECK(need > 0);  // S and P live there
    GPU_FA_OK(s.forward(c.ctx, nullptr, 0, a));
    GPU_FA_OK(flashattn_context_synchronize(c.ctx));
    const std::vector<double> with_scratch = s.fetch_out();
    if (a == FLASHATTN_ALGORITHM_STANDARD) s.expect_standard_result();

    DeviceMemory ws(need > 0 ? need : 256);
    s.out.poison();
    s.dev.upload(s.out);
    GPU_FA_OK(s.forward(c.ctx, ws.get(), need > 0 ? need : 256, a));
    GPU_FA_OK(flashattn_context_synchronize(c.ctx));
    CHECK(s.fetch_out() == with_scratch);  // NaN would differ: the poison shows
    if (need > 0) {
      CHECK(s.forward(c.ctx, ws.get(), need - 1, a) == FLASHATTN_ERROR_WORKSPACE_TOO_SMALL);
      std::vector<unsigned char> host(need);
      CHECK(s.forward(c.ctx, host.data(), need, a) == FLASHATTN_ERROR_INVALID_MEMORY);
    }
  }
}

TEST_CASE("workspace: rows off 16 bytes are copied there; the query counts what it is shown") {
  // Head dim 100 (tight rows of 200 bytes): q, k, v and out go through aligned copies (of 112
  // columns: at least 104), which the query counts from the shapes alone.
  Context c;
  Case odd = kSmall;
  odd.name = "head dim 100";
  odd.d = 100;
  Small s(3, odd);
  const flashattn_options_t opts = s.options(FLASHATTN_ALGORITHM_FLASH);
  REQUIRE(flashattn_supported(c.ctx, &s.q, &s.k, &s.v, &opts, 0) == FLASHATTN_SUCCESS);
  size_t need = 0;
  GPU_FA_OK(flashattn_workspace_size(&need, c.ctx, &s.q, &s.k, &s.v, &opts, 0));
  const size_t rows_q = size_t(odd.b * odd.nq * odd.hq), rows_k = size_t(odd.b * odd.nk * odd.hkv);
  CHECK(need >= (2 * rows_q + 2 * rows_k) * 104 * 2);
  GPU_FA_OK(s.forward(c.ctx, nullptr, 0, FLASHATTN_ALGORITHM_FLASH));
  GPU_FA_OK(flashattn_context_synchronize(c.ctx));
  const std::vector<double> with_scratch = s.fetch_out();
  for (double x : with_scratch) REQUIRE(std::isfinite(x));
  {
    DeviceMemory ws(need);
    s.out.poison();
    s.dev.upload(s.out);
    GPU_FA_OK(s.forward(c.ctx, ws.get(), need, FLASHATTN_ALGORITHM_FLASH));
    GPU_FA_OK(flashattn_context_synchronize(c.ctx));
    CHECK(s.fetch_out() == with_scratch);
    CHECK(s.forward(c.ctx, ws.get(), need - 1, FLASHATTN_ALGORITHM_FLASH) ==
          FLASHATTN_ERROR_WORKSPACE_TOO_SMALL);
  }

  // Head dim 64 with q one element off 16 bytes: a query shown the pointer counts q's copy; one
  // given no data pointer cannot, and the call says how much it needs.
  Small a(5);
  const flashattn_options_t fo = a.options(FLASHATTN_ALGORITHM_FLASH);
  GPU_FA_OK(a.forward(c.ctx, nullptr, 0, FLASHATTN_ALGORITHM_FLASH));
  GPU_FA_OK(flashattn_context_synchronize(c.ctx));
  const std::vector<double> aligned_out = a.fetch_out();
  const size_t q_bytes = a.in.q.storage_bytes();  // contiguous: the view is all of it
  DeviceMemory shifted(q_bytes + 16);
  flashattn_tensor_t q_off = a.q;
  q_off.data = static_cast<char*>(shifted.get()) + 2;  // one 16-bit element past 16 bytes
  GPU_CUDA_OK(cudaMemcpy(q_off.data, a.q.data, q_bytes, cudaMemcpyDeviceToDevice));
  size_t blind = 0, shown = 0;
  flashattn_tensor_t q_blind = q_off;
  q_blind.data = nullptr;
  GPU_FA_OK(flashattn_workspace_size(&blind, c.ctx, &q_blind, &a.k, &a.v, &fo, 0));
  GPU_FA_OK(flashattn_workspace_size(&shown, c.ctx, &q_off, &a.k, &a.v, &fo, 0));
  CHECK(shown >= blind + q_bytes);
  DeviceMemory ws(shown);
  a.out.poison();
  a.dev.upload(a.out);
  CHECK(flashattn_forward(c.ctx, &q_off, &a.k, &a.v, &a.o, &a.l, &fo, ws.get(), blind) ==
        FLASHATTN_ERROR_WORKSPACE_TOO_SMALL);
  GPU_FA_OK(flashattn_forward(c.ctx, &q_off, &a.k, &a.v, &a.o, &a.l, &fo, ws.get(), shown));
  GPU_FA_OK(flashattn_context_synchronize(c.ctx));
  CHECK(a.fetch_out() == aligned_out);  // the same kernel on the same values
}

TEST_CASE("workspace: head dim 104 is copied for the Hopper forward, not for a decode step") {
  // Aligned rows of 104 columns (208 bytes): the Hopper flash forward reads them faster copied
  // to 112 columns (kernel log, run 122), so there the query counts copies of q, k, v and out.
  // A decode step (one query row) runs the decode kernel, which reads rows by cp.async: copying
  // K and V would only add to its traffic, and nothing is copied. Nor is anything on sm80.
  Context c;
  const bool hopper = gpu_variants::family_of(FLASHATTN_ALGORITHM_FLASH,
                                              gpu_variants::Pass::Forward, {}) ==
                      gpu_variants::Family::FlashSm90;
  Case wide{"head dim 104", BF16, 1, 256, 4096, 4, 2, 104, false, 0.0f, Layout::Contiguous};
  wide.emulate = false;
  const size_t kv_bytes = size_t(2) * size_t(wide.b * wide.nk * wide.hkv) * 104 * 2;  // K and V
  for (const int64_t nq : {int64_t(256), int64_t(1)}) {
    CAPTURE(nq);
    Case shape = wide;
    shape.nq = nq;
    Small s(11, shape);
    const flashattn_options_t opts = s.options(FLASHATTN_ALGORITHM_FLASH);
    REQUIRE(flashattn_supported(c.ctx, &s.q, &s.k, &s.v, &opts, 0) == FLASHATTN_SUCCESS);
    size_t need = 0;
    GPU_FA_OK(flashattn_workspace_size(&need, c.ctx, &s.q, &s.k, &s.v, &opts, 0));
    const size_t rows_q = size_t(shape.b * shape.nq * shape.hq);
    if (hopper && nq > 1) {
      CHECK(need >= 2 * rows_q * 112 * 2 + kv_bytes / 104 * 112);
    } else {
      CHECK(need < kv_bytes);
    }
    GPU_FA_OK(s.forward(c.ctx, nullptr, 0, FLASHATTN_ALGORITHM_FLASH));
    GPU_FA_OK(flashattn_context_synchronize(c.ctx));
    const std::vector<double> with_scratch = s.fetch_out();
    for (double x : with_scratch) REQUIRE(std::isfinite(x));
    DeviceMemory ws(need > 0 ? need : 256);
    s.out.poison();
    s.dev.upload(s.out);
    GPU_FA_OK(s.forward(c.ctx, ws.get(), need > 0 ? need : 256, FLASHATTN_ALGORITHM_FLASH));
    GPU_FA_OK(flashattn_context_synchronize(c.ctx));
    CHECK(s.fetch_out() == with_scratch);
  }
}

TEST_CASE("streams: the caller's stream is used as given; NULL returns to the context's own") {
  // The stream outlives the context that uses it (the header's contract for set_stream).
  Stream user;
  Context c;
  void* own = nullptr;
  GPU_FA_OK(flashattn_context_get_stream(&own, c.ctx));
  GPU_FA_OK(flashattn_context_set_stream(c.ctx, user.s));
  void* now = nullptr;
  GPU_FA_OK(flashattn_context_get_stream(&now, c.ctx));
  CHECK(now == static_cast<void*>(user.s));

  // Work is ordered on the user's stream: waiting for that stream alone is enough.
  Small s;
  GPU_FA_OK(s.forward(c.ctx));
  GPU_CUDA_OK(cudaStreamSynchronize(user.s));
  s.expect_standard_result();

  GPU_FA_OK(flashattn_context_set_stream(c.ctx, nullptr));
  GPU_FA_OK(flashattn_context_get_stream(&now, c.ctx));
  CHECK(now == own);
  s.refill(3);
  GPU_FA_OK(s.forward(c.ctx));
  GPU_CUDA_OK(cudaStreamSynchronize(static_cast<cudaStream_t>(own)));
  s.expect_standard_result();
}

TEST_CASE("streams: forward and backward return without waiting for the stream") {
  // A host function blocks the stream until the test opens the gate; if a call waited for the
  // stream it would only return when the gate's timeout expired, and the test fails then.
  struct Gate {
    std::atomic<int> open{0};
    std::atomic<int> timed_out{0};
  };
  static Gate gate;
  gate.open = 0;
  gate.timed_out = 0;
  auto block = [](void*) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!gate.open.load()) {
      if (std::chrono::steady_clock::now() > until) {
        gate.timed_out = 1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  };
  // The stream outlives the context that uses it (the header's contract for set_stream).
  Stream user;
  Context c;
  GPU_FA_OK(flashattn_context_set_stream(c.ctx, user.s));
  Small s;
  GPU_FA_OK(s.forward(c.ctx));  // warm: the scratch is sized
  GPU_CUDA_OK(cudaStreamSynchronize(user.s));

  HostTensor dout = HostTensor::make(s.c.dtype, s.c.b, s.c.nq, s.c.hq, s.c.d);
  dout.fill_normal(3);
  HostTensor dq = HostTensor::make(s.c.dtype, s.c.b, s.c.nq, s.c.hq, s.c.d);
  HostTensor dk = HostTensor::make(s.c.dtype, s.c.b, s.c.nk, s.c.hkv, s.c.d);
  HostTensor dv = HostTensor::make(s.c.dtype, s.c.b, s.c.nk, s.c.hkv, s.c.d);
  const flashattn_tensor_t dod = s.dev.upload(dout), dqd = s.dev.upload(dq),
                           dkd = s.dev.upload(dk), dvd = s.dev.upload(dv);
  const flashattn_options_t opts = s.options();
  GPU_FA_OK(flashattn_backward(c.ctx, &s.q, &s.k, &s.v, &s.o, &dod, &s.l, &dqd, &dkd, &dvd,
                               &opts, nullptr, 0));  // warm the backward's scratch too
  GPU_CUDA_OK(cudaStreamSynchronize(user.s));

  GPU_CUDA_OK(cudaLaunchHostFunc(user.s, block, nullptr));
  GPU_FA_OK(s.forward(c.ctx));
  GPU_FA_OK(flashattn_backward(c.ctx, &s.q, &s.k, &s.v, &s.o, &dod, &s.l, &dqd, &dkd, &dvd,
                               &opts, nullptr, 0));
  CHECK(cudaStreamQuery(user.s) == cudaErrorNotReady);
  gate.open = 1;
  GPU_CUDA_OK(cudaStreamSynchronize(user.s));
  CHECK(gate.timed_out == 0);
  s.expect_standard_result();
}

TEST_CASE("graph capture: forward and backward captured on the caller's stream, replayed") {
  // The stream outlives the context that uses it (the header's contract for set_stream).
  Stream user;
  Context c;
  GPU_FA_OK(flashattn_context_set_stream(c.ctx, user.s));
  for (flashattn_algorithm_t a : {FLASHATTN_ALGORITHM_STANDARD, FLASHATTN_ALGORITHM_FLASH}) {
    CAPTURE(a);
    Small s(10);
    const flashattn_options_t opts = s.options(a);
    if (flashattn_supported(c.ctx, &s.q, &s.k, &s.v, &opts, 1) != FLASHATTN_SUCCESS) {
      MESSAGE("flash algorithm not available: " << flashattn_last_error());
      if (gpu_test::flash_required()) FAIL_CHECK("FLASHATTN_REQUIRE_FLASH=1");
      continue;
    }
    HostTensor dout = HostTensor::make(s.c.dtype, s.c.b, s.c.nq, s.c.hq, s.c.d);
    dout.fill_normal(4);
    HostTensor dq = HostTensor::make(s.c.dtype, s.c.b, s.c.nq, s.c.hq, s.c.d);
    HostTensor dk = HostTensor::make(s.c.dtype, s.c.b, s.c.nk, s.c.hkv, s.c.d);
    HostTensor dv = HostTensor::make(s.c.dtype, s.c.b, s.c.nk, s.c.hkv, s.c.d);
    const flashattn_tensor_t dod = s.dev.upload(dout), dqd = s.dev.upload(dq),
                             dkd = s.dev.upload(dk), dvd = s.dev.upload(dv);
    auto enqueue = [&] {
      GPU_FA_OK(flashattn_forward(c.ctx, &s.q, &s.k, &s.v, &s.o, &s.l, &opts, nullptr, 0));
      GPU_FA_OK(flashattn_backward(c.ctx, &s.q, &s.k, &s.v, &s.o, &dod, &s.l, &dqd, &dkd, &dvd,
                                   &opts, nullptr, 0));
    };
    enqueue();  // warm-up: scratch sized, kernels loaded
    GPU_CUDA_OK(cudaStreamSynchronize(user.s));

    cudaGraph_t graph = nullptr;
    GPU_CUDA_OK(cudaStreamBeginCapture(user.s, cudaStreamCaptureModeGlobal));
    enqueue();
    GPU_CUDA_OK(cudaStreamEndCapture(user.s, &graph));  // fails if anything broke the capture
    cudaGraphExec_t exec = nullptr;
    GPU_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));

    for (uint64_t seed : {20, 30}) {
      CAPTURE(seed);
      s.refill(seed);
      s.out.poison();
      s.dev.upload(s.out);
      for (HostTensor* g : {&dq, &dk, &dv}) {
        g->poison();
        s.dev.upload(*g);
      }
      GPU_CUDA_OK(cudaGraphLaunch(exec, user.s));
      GPU_CUDA_OK(cudaStreamSynchronize(user.s));
      const std::vector<double> replay_out = s.fetch_out();
      s.dev.download(dq);
      s.dev.download(dk);
      s.dev.download(dv);
      const std::vector<double> r_dq = dq.to_double(), r_dk = dk.to_double(),
                                r_dv = dv.to_double();

      // The same inputs run eagerly: the replay must agree.
      enqueue();
      GPU_CUDA_OK(cudaStreamSynchronize(user.s));
      const std::vector<double> eager_out = s.fetch_out();
      s.dev.download(dq);
      s.dev.download(dk);
      s.dev.download(dv);
      const auto close = [&](const char* what, const std::vector<double>& got,
                             const std::vector<double>& want) {
        const flashattn_test::Comparison cmp = flashattn_test::check_close(
            what, got, want, gpu_test::emulation_tolerance(s.c.dtype, want));
        INFO(cmp.message);
        CHECK(cmp.ok);
      };
      close("replayed out vs eager", replay_out, eager_out);
      close("replayed dq vs eager", r_dq, dq.to_double());
      close("replayed dk vs eager", r_dk, dk.to_double());
      close("replayed dv vs eager", r_dv, dv.to_double());
      if (a == FLASHATTN_ALGORITHM_STANDARD) s.expect_standard_result();
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
}

TEST_CASE("the caller's current device is left as it was") {
  int count = 0;
  GPU_CUDA_OK(cudaGetDeviceCount(&count));
  const int target = count > 1 ? 1 : 0;
  GPU_CUDA_OK(cudaSetDevice(0));
  flashattn_context_t ctx = nullptr;
  GPU_FA_OK(flashattn_context_create(&ctx, FLASHATTN_BACKEND_CUDA, target));
  int current = -1;
  GPU_CUDA_OK(cudaGetDevice(&current));
  CHECK(current == 0);
  flashattn_buffer_t buf = nullptr;
  GPU_FA_OK(flashattn_buffer_create(&buf, ctx, 4096));
  std::vector<unsigned char> bytes(4096, 0x5A), back(4096, 0);
  GPU_FA_OK(flashattn_buffer_write(buf, 0, bytes.data(), bytes.size()));
  GPU_FA_OK(flashattn_buffer_read(buf, 0, back.data(), back.size()));
  CHECK(bytes == back);
  GPU_CUDA_OK(cudaGetDevice(&current));
  CHECK(current == 0);
  GPU_FA_OK(flashattn_context_destroy(ctx));  // the buffer outlives its context
  GPU_FA_OK(flashattn_buffer_read(buf, 0, back.data(), back.size()));
  CHECK(bytes == back);
  GPU_FA_OK(flashattn_buffer_destroy(buf));
  GPU_CUDA_OK(cudaGetDevice(&current));
  CHECK(current == 0);
  if (count < 2) MESSAGE("one CUDA device: the context ran on the current device");
}

TEST_CASE("a forward without lse, in flashattn buffers") {
  Context c;
  Small s;
  flashattn_buffer_t bq = nullptr, bk = nullptr, bv = nullptr, bo = nullptr;
  GPU_FA_OK(flashattn_buffer_create(&bq, c.ctx, s.in.q.storage_bytes()));
  GPU_FA_OK(flashattn_buffer_create(&bk, c.ctx, s.in.k.storage_bytes()));
  GPU_FA_OK(flashattn_buffer_create(&bv, c.ctx, s.in.v.storage_bytes()));
  GPU_FA_OK(flashattn_buffer_create(&bo, c.ctx, s.out.storage_bytes()));
  GPU_FA_OK(flashattn_buffer_write(bq, 0, s.in.q.storage_data(), s.in.q.storage_bytes()));
  GPU_FA_OK(flashattn_buffer_write(bk, 0, s.in.k.storage_data(), s.in.k.storage_bytes()));
  GPU_FA_OK(flashattn_buffer_write(bv, 0, s.in.v.storage_data(), s.in.v.storage_bytes()));
  void *pq, *pk, *pv, *po;
  GPU_FA_OK(flashattn_buffer_data(&pq, bq));
  GPU_FA_OK(flashattn_buffer_data(&pk, bk));
  GPU_FA_OK(flashattn_buffer_data(&pv, bv));
  GPU_FA_OK(flashattn_buffer_data(&po, bo));
  const flashattn_tensor_t q = s.in.q.view_at(pq), k = s.in.k.view_at(pk),
                           v = s.in.v.view_at(pv), o = s.out.view_at(po);
  const flashattn_options_t opts = s.options();
  GPU_FA_OK(flashattn_forward(c.ctx, &q, &k, &v, &o, nullptr, &opts, nullptr, 0));
  GPU_FA_OK(flashattn_buffer_read(bo, 0, s.out.storage_data(), s.out.storage_bytes()));
  std::vector<double> o_emu, lse_emu;
  gpu_test::emulate_standard_forward(gpu_test::ref_of(s.c), s.c.dtype, s.in.q.to_double(),
                                     s.in.k.to_double(), s.in.v.to_double(), &o_emu, &lse_emu);
  const flashattn_test::Comparison cmp = flashattn_test::check_close(
      "out vs emulation", s.out.to_double(), o_emu,
      gpu_test::emulation_tolerance(s.c.dtype, o_emu));
  INFO(cmp.message);
  CHECK(cmp.ok);
  for (flashattn_buffer_t b : {bq, bk, bv, bo}) GPU_FA_OK(flashattn_buffer_destroy(b));
}

}  // TEST_SUITE
