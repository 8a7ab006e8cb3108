// The C API on a CUDA context (label `gpu`). Without a usable device the whole program exits 77,
// which CTest reports as skipped.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "api_helpers.hpp"
#include "core/half.hpp"

using namespace api_test;

namespace {

// Decided before doctest runs anything, so that no test case can run half-way.
const bool g_has_device = [] {
  int n = 0;
  if (flashattn_cuda_device_count(&n) != FLASHATTN_SUCCESS || n == 0) {
    std::fprintf(stderr, "no CUDA device: GPU API tests not run (has_cuda=%d)\n",
                 flashattn_has_cuda());
    std::exit(77);
  }
  return true;
}();

// fp16 host copies of a fp32 problem, uploaded into one device buffer per tensor.
struct DeviceForward {
  Shape s;
  flashattn_context_t ctx;
  std::vector<uint16_t> q, k, v;
  flashattn_buffer_t bq = nullptr, bk = nullptr, bv = nullptr, bout = nullptr, blse = nullptr;
  flashattn_tensor_t tq, tk, tv, tout, tlse;

  static std::vector<uint16_t> to_half(const std::vector<float>& x) {
    std::vector<uint16_t> r(x.size());
    for (size_t i = 0; i < x.size(); ++i) r[i] = flashattn::float_to_fp16(x[i]);
    return r;
  }
  flashattn_buffer_t upload(const void* src, size_t bytes) {
    flashattn_buffer_t b = nullptr;
    REQUIRE_OK(flashattn_buffer_create(&b, ctx, bytes));
    if (src != nullptr) REQUIRE_OK(flashattn_buffer_write(b, 0, src, bytes));
    return b;
  }
  static void* data(flashattn_buffer_t b) {
    void* p = nullptr;
    REQUIRE_OK(flashattn_buffer_data(&p, b));
    return p;
  }

  DeviceForward(flashattn_context_t c, const Forward& host) : s(host.s), ctx(c) {
    q = to_half(host.q);
    k = to_half(host.k);
    v = to_half(host.v);
    bq = upload(q.data(), q.size() * 2);
    bk = upload(k.data(), k.size() * 2);
    bv = upload(v.data(), v.size() * 2);
    bout = upload(nullptr, q.size() * 2);
    blse = upload(nullptr, s.lse_elems() * 4);
    const auto F16 = FLASHATTN_DTYPE_FLOAT16;
    tq = view4(data(bq), F16, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    tk = view4(data(bk), F16, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
    tv = view4(data(bv), F16, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
    tout = view4(data(bout), F16, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    tlse = view_lse(static_cast<float*>(data(blse)), s.batch, s.heads_q, s.seqlen_q);
  }
  ~DeviceForward() {
    for (flashattn_buffer_t b : {bq, bk, bv, bout, blse}) flashattn_buffer_destroy(b);
  }
  flashattn_status_t run() {
    return flashattn_forward(ctx, &tq, &tk, &tv, &tout, &tlse, nullptr, nullptr, 0);
  }
  std::vector<float> out() const {
    std::vector<uint16_t> h(q.size());
    REQUIRE_OK(flashattn_buffer_read(bout, 0, h.data(), h.size() * 2));
    std::vector<float> r(h.size());
    for (size_t i = 0; i < h.size(); ++i) r[i] = flashattn::fp16_to_float(h[i]);
    return r;
  }
};

// The inputs rounded to fp16, as fp32, so that the float64 reference sees what the GPU sees.
Forward rounded(Shape s, uint32_t seed) {
  Forward f(s, seed);
  for (auto* v : {&f.q, &f.k, &f.v})
    for (float& x : *v) x = flashattn::fp16_to_float(flashattn::float_to_fp16(x));
  return f;
}

}  // namespace

TEST_SUITE("gpu") {
  TEST_CASE("a CUDA context answers its queries") {
    REQUIRE(g_has_device);
    Context ctx(FLASHATTN_BACKEND_CUDA);
    flashattn_backend_t backend = FLASHATTN_BACKEND_AUTO;
    EXPECT_OK(flashattn_context_get_backend(&backend, ctx));
    CHECK(backend == FLASHATTN_BACKEND_CUDA);
    int device = -5;
    EXPECT_OK(flashattn_context_get_device(&device, ctx));
    CHECK(device == 0);
    flashattn_cpu_kernels_t kernels = FLASHATTN_CPU_KERNELS_AMX;
    EXPECT_OK(flashattn_context_get_cpu_kernels(&kernels, ctx));
    CHECK(kernels == FLASHATTN_CPU_KERNELS_NONE);
    void* stream = nullptr;
    EXPECT_OK(flashattn_context_get_stream(&stream, ctx));
    CHECK(stream != nullptr);  // the context's own non-blocking stream
    EXPECT_OK(flashattn_context_set_stream(ctx, nullptr));
    EXPECT_OK(flashattn_context_synchronize(ctx));
    Context auto_ctx(FLASHATTN_BACKEND_AUTO);
    EXPECT_OK(flashattn_context_get_backend(&backend, auto_ctx));
    CHECK(backend == FLASHATTN_BACKEND_CUDA);
  }

  TEST_CASE("device buffers round-trip and check their range") {
    Context ctx(FLASHATTN_BACKEND_CUDA);
    flashattn_buffer_t buf = nullptr;
    REQUIRE_OK(flashattn_buffer_create(&buf, ctx, 4096));
    std::vector<unsigned char> src(4096), dst(4096, 0);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + 1);
    EXPECT_OK(flashattn_buffer_write(buf, 0, src.data(), src.size()));
    EXPECT_OK(flashattn_buffer_read(buf, 0, dst.data(), dst.size()));
    CHECK(dst == src);
    EXPECT_STATUS(flashattn_buffer_read(buf, 4000, dst.data(), 100),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, "exceeds the buffer's 4096 bytes");
    void* p = nullptr;
    EXPECT_OK(flashattn_buffer_data(&p, buf));
    CHECK(reinterpret_cast<uintptr_t>(p) % 256 == 0);
    EXPECT_OK(flashattn_buffer_destroy(buf));
  }

  TEST_CASE("float32 is a CPU-only dtype: UNSUPPORTED on CUDA") {
    Context ctx(FLASHATTN_BACKEND_CUDA);
    Forward f;
    EXPECT_STATUS(flashattn_supported(ctx, &f.tq, &f.tk, &f.tv, nullptr, 0),
                  FLASHATTN_ERROR_UNSUPPORTED, "");
    CHECK(!std::string(flashattn_last_error()).empty());
  }

  TEST_CASE("host pointers given to a CUDA context are INVALID_MEMORY") {
    Context ctx(FLASHATTN_BACKEND_CUDA);
    Forward host;
    DeviceForward dev(ctx, host);
    std::vector<uint16_t> host_q = dev.q;
    flashattn_tensor_t q = dev.tq;
    q.data = host_q.data();
    EXPECT_STATUS(flashattn_forward(ctx, &q, &dev.tk, &dev.tv, &dev.tout, &dev.tlse, nullptr,
                                    nullptr, 0),
                  FLASHATTN_ERROR_INVALID_MEMORY, "q");
  }

  TEST_CASE("a buffer of a context of another backend is INVALID_MEMORY") {
    Context cuda(FLASHATTN_BACKEND_CUDA), cpu(FLASHATTN_BACKEND_CPU);
    Forward host;
    DeviceForward dev(cuda, host);
    // Device memory handed to a CPU context, by way of fp32 views of the right size.
    flashattn_buffer_t big = nullptr;
    REQUIRE_OK(flashattn_buffer_create(&big, cuda, host.q.size() * 4));
    void* p = nullptr;
    REQUIRE_OK(flashattn_buffer_data(&p, big));
    flashattn_tensor_t q = host.tq;
    q.data = p;
    EXPECT_STATUS(flashattn_forward(cpu, &q, &host.tk, &host.tv, &host.tout, &host.tlse, nullptr,
                                    nullptr, 0),
                  FLASHATTN_ERROR_INVALID_MEMORY,
                  "q: points into a buffer of another context's device memory");
    CHECK(host.untouched());
    flashattn_buffer_destroy(big);
    // Host memory of a CPU context's buffer handed to the CUDA context.
    flashattn_buffer_t hb = nullptr;
    REQUIRE_OK(flashattn_buffer_create(&hb, cpu, dev.q.size() * 2));
    REQUIRE_OK(flashattn_buffer_data(&p, hb));
    flashattn_tensor_t k = dev.tk;
    k.data = p;
    EXPECT_STATUS(flashattn_forward(cuda, &dev.tq, &k, &dev.tv, &dev.tout, &dev.tlse, nullptr,
                                    nullptr, 0),
                  FLASHATTN_ERROR_INVALID_MEMORY,
                  "k: points into a buffer of another context's host memory");
    flashattn_buffer_destroy(hb);
  }

  TEST_CASE("a buffer of another CUDA context is INVALID_MEMORY") {
    // Work on one context's stream is not ordered against the other's, which frees the buffer.
    Context a(FLASHATTN_BACKEND_CUDA), b(FLASHATTN_BACKEND_CUDA);
    Forward host;
    DeviceForward dev(b, host);
    flashattn_buffer_t other = nullptr;
    REQUIRE_OK(flashattn_buffer_create(&other, a, dev.q.size() * 2));
    void* p = nullptr;
    REQUIRE_OK(flashattn_buffer_data(&p, other));
    flashattn_tensor_t q = dev.tq;
    q.data = p;
    EXPECT_STATUS(flashattn_forward(b, &q, &dev.tk, &dev.tv, &dev.tout, &dev.tlse, nullptr,
                                    nullptr, 0),
                  FLASHATTN_ERROR_INVALID_MEMORY, "q: points into a buffer of another context");
    flashattn_buffer_destroy(other);
  }

  TEST_CASE("a view past the end of a device buffer is INVALID_MEMORY") {
    Context ctx(FLASHATTN_BACKEND_CUDA);
    Forward host;
    DeviceForward dev(ctx, host);
    flashattn_tensor_t v = dev.tv;
    v.data = static_cast<uint16_t*>(v.data) + 8;
    EXPECT_STATUS(flashattn_forward(ctx, &dev.tq, &dev.tk, &v, &dev.tout, &dev.tlse, nullptr,
                                    nullptr, 0),
                  FLASHATTN_ERROR_INVALID_MEMORY, "v: the view spans");
  }

  TEST_CASE("fp16 forward through buffers matches the float64 reference") {
    Context ctx(FLASHATTN_BACKEND_CUDA);
    Shape s;
    s.seqlen_q = 70;
    s.seqlen_k = 130;
    s.head_dim = 64;
    Forward host = rounded(s, 5);
    DeviceForward dev(ctx, host);
    REQUIRE_OK(dev.run());
    REQUIRE_OK(flashattn_context_synchronize(ctx));
    const Reference ref = reference_forward(host.tq, host.tk, host.tv, 0.0, false);
    std::vector<float> out = dev.out();
    double worst = 0;
    for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, std::fabs(out[i] - ref.out[i]));
    CHECK(worst <= 2e-3);  // fp16 output rounding (values <= 1) plus fp16 P in the PV product
  }

  TEST_CASE("two CUDA contexts on two threads compute at once") {
    Context a(FLASHATTN_BACKEND_CUDA), b(FLASHATTN_BACKEND_CUDA);
    Shape s;
    s.seqlen_q = s.seqlen_k = 256;
    s.head_dim = 64;
    Forward ha = rounded(s, 7), hb = rounded(s, 8);
    DeviceForward da(a, ha), db(b, hb);
    REQUIRE_OK(da.run());
    REQUIRE_OK(db.run());
    const std::vector<float> want_a = da.out(), want_b = db.out();
    flashattn_status_t sa = FLASHATTN_SUCCESS, sb = FLASHATTN_SUCCESS;
    auto loop = [](DeviceForward* d, flashattn_context_t c, flashattn_status_t* st) {
      for (int i = 0; i < 50 && *st == FLASHATTN_SUCCESS; ++i) *st = d->run();
      if (*st == FLASHATTN_SUCCESS) *st = flashattn_context_synchronize(c);
    };
    std::thread ta(loop, &da, static_cast<flashattn_context_t>(a), &sa);
    std::thread tb(loop, &db, static_cast<flashattn_context_t>(b), &sb);
    ta.join();
    tb.join();
    CHECK(sa == FLASHATTN_SUCCESS);
    CHECK(sb == FLASHATTN_SUCCESS);
    CHECK(da.out() == want_a);
    CHECK(db.out() == want_b);
  }
}
