// Library-owned buffers: create/write/read/data/size, their range errors, lifetimes, and views
// that point into them.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "api_helpers.hpp"

using namespace api_test;

#if defined(__SANITIZE_ADDRESS__)
#define API_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define API_TEST_ASAN 1
#endif
#endif
#ifdef API_TEST_ASAN
// Impossible allocations must come back as NULL (and so as OUT_OF_MEMORY) under ASan too, whose
// allocator otherwise stops the program on them.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }
#endif

namespace {

// A buffer destroyed with the test.
class Buffer {
 public:
  Buffer(flashattn_context_t ctx, size_t bytes) { REQUIRE_OK(flashattn_buffer_create(&buf_, ctx, bytes)); }
  ~Buffer() { flashattn_buffer_destroy(buf_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  operator flashattn_buffer_t() const { return buf_; }
  float* data() const {
    void* p = nullptr;
    REQUIRE_OK(flashattn_buffer_data(&p, buf_));
    return static_cast<float*>(p);
  }

 private:
  flashattn_buffer_t buf_ = nullptr;
};

std::vector<unsigned char> pattern(size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>(i * 31 + seed);
  return v;
}

}  // namespace

TEST_SUITE("buffers") {
  TEST_CASE("create, size, data, write and read back") {
    Context ctx;
    flashattn_buffer_t buf = nullptr;
    EXPECT_OK(flashattn_buffer_create(&buf, ctx, 1000));
    REQUIRE(buf != nullptr);
    size_t size = 0;
    EXPECT_OK(flashattn_buffer_size(&size, buf));
    CHECK(size == 1000);
    void* data = nullptr;
    EXPECT_OK(flashattn_buffer_data(&data, buf));
    REQUIRE(data != nullptr);
    CHECK(reinterpret_cast<uintptr_t>(data) % 256 == 0);

    const auto src = pattern(1000, 7);
    EXPECT_OK(flashattn_buffer_write(buf, 0, src.data(), src.size()));
    std::vector<unsigned char> dst(1000, 0);
    EXPECT_OK(flashattn_buffer_read(buf, 0, dst.data(), dst.size()));
    CHECK(dst == src);

    // Partial write at an offset, partial read of the same bytes.
    const auto part = pattern(100, 99);
    EXPECT_OK(flashattn_buffer_write(buf, 900, part.data(), part.size()));
    std::vector<unsigned char> back(100, 0);
    EXPECT_OK(flashattn_buffer_read(buf, 900, back.data(), back.size()));
    CHECK(back == part);
    std::vector<unsigned char> head(900, 0);
    EXPECT_OK(flashattn_buffer_read(buf, 0, head.data(), head.size()));
    CHECK(std::equal(head.begin(), head.end(), src.begin()));

    // Zero bytes at the very end is a valid, empty copy.
    EXPECT_OK(flashattn_buffer_write(buf, 1000, src.data(), 0));
    EXPECT_OK(flashattn_buffer_read(buf, 1000, dst.data(), 0));
    EXPECT_OK(flashattn_buffer_destroy(buf));
  }

  TEST_CASE("create rejects NULL out, NULL ctx and 0 bytes, leaving *out alone") {
    Context ctx;
    flashattn_buffer_t sentinel = reinterpret_cast<flashattn_buffer_t>(0x5678);
    flashattn_buffer_t buf = sentinel;
    EXPECT_STATUS(flashattn_buffer_create(nullptr, ctx, 16), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  "flashattn_buffer_create: out is NULL");
    EXPECT_STATUS(flashattn_buffer_create(&buf, nullptr, 16), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  "flashattn_buffer_create: ctx is NULL");
    EXPECT_STATUS(flashattn_buffer_create(&buf, ctx, 0), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  "bytes is 0");
    CHECK(buf == sentinel);
  }

  TEST_CASE("an allocation the host cannot satisfy is OUT_OF_MEMORY, not a crash") {
    Context ctx;
    flashattn_buffer_t buf = nullptr;
    EXPECT_STATUS(flashattn_buffer_create(&buf, ctx, size_t(1) << 62), FLASHATTN_ERROR_OUT_OF_MEMORY,
                  "flashattn_buffer_create: ");
    CHECK(buf == nullptr);
    // Sizes near SIZE_MAX must not wrap around when rounded up to the alignment.
    for (size_t bytes : {SIZE_MAX, SIZE_MAX - 100, SIZE_MAX / 2 + 1}) {
      CAPTURE(bytes);
      EXPECT_STATUS(flashattn_buffer_create(&buf, ctx, bytes), FLASHATTN_ERROR_OUT_OF_MEMORY,
                    "flashattn_buffer_create: ");
      CHECK(buf == nullptr);
    }
    // The context is still usable.
    Buffer ok(ctx, 64);
  }

  TEST_CASE("write and read reject bad arguments and touch nothing") {
    Context ctx;
    Buffer buf(ctx, 64);
    const auto original = pattern(64, 3);
    REQUIRE_OK(flashattn_buffer_write(buf, 0, original.data(), 64));
    const auto src = pattern(64, 200);
    std::vector<unsigned char> dst(64, 0xEE);
    const auto dst_before = dst;

    EXPECT_STATUS(flashattn_buffer_write(nullptr, 0, src.data(), 8),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, "flashattn_buffer_write: buf is NULL");
    EXPECT_STATUS(flashattn_buffer_write(buf, 0, nullptr, 8), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  "src is NULL");
    EXPECT_STATUS(flashattn_buffer_write(buf, 60, src.data(), 8),
                  FLASHATTN_ERROR_INVALID_ARGUMENT,
                  "offset 60 + bytes 8 exceeds the buffer's 64 bytes");
    EXPECT_STATUS(flashattn_buffer_write(buf, 65, src.data(), 0),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, "exceeds the buffer's 64 bytes");
    EXPECT_STATUS(flashattn_buffer_write(buf, SIZE_MAX, src.data(), 2),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, "exceeds the buffer");  // offset + bytes wraps
    EXPECT_STATUS(flashattn_buffer_read(nullptr, 0, dst.data(), 8),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, "flashattn_buffer_read: buf is NULL");
    EXPECT_STATUS(flashattn_buffer_read(buf, 0, nullptr, 8), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  "dst is NULL");
    EXPECT_STATUS(flashattn_buffer_read(buf, 0, dst.data(), 65), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  "offset 0 + bytes 65 exceeds the buffer's 64 bytes");
    EXPECT_STATUS(flashattn_buffer_read(buf, 8, dst.data(), SIZE_MAX - 4),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, "exceeds the buffer");
    CHECK(dst == dst_before);

    std::vector<unsigned char> now(64);
    REQUIRE_OK(flashattn_buffer_read(buf, 0, now.data(), 64));
    CHECK(now == original);
  }

  TEST_CASE("data and size reject NULL and leave *out alone") {
    Context ctx;
    Buffer buf(ctx, 64);
    void* data = &buf;
    size_t size = 12345;
    EXPECT_STATUS(flashattn_buffer_data(nullptr, buf), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  "flashattn_buffer_data: out is NULL");
    EXPECT_STATUS(flashattn_buffer_data(&data, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  "buf is NULL");
    EXPECT_STATUS(flashattn_buffer_size(nullptr, buf), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  "flashattn_buffer_size: out is NULL");
    EXPECT_STATUS(flashattn_buffer_size(&size, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  "buf is NULL");
    CHECK(data == static_cast<void*>(&buf));
    CHECK(size == 12345);
  }

  TEST_CASE("destroy(NULL) is a no-op that succeeds") {
    flashattn_options_init_sized(nullptr, sizeof(flashattn_options_t));
    EXPECT_OK(flashattn_buffer_destroy(nullptr));
  }

  TEST_CASE("a destroyed buffer is refused by every function, never read or freed again") {
    Context ctx;
    flashattn_buffer_t buf = nullptr;
    REQUIRE_OK(flashattn_buffer_create(&buf, ctx, 64));
    REQUIRE_OK(flashattn_buffer_destroy(buf));
    const char* const stale = "buf is not a live buffer";
    void* data = &buf;
    size_t size = 12345;
    EXPECT_STATUS(flashattn_buffer_data(&data, buf), FLASHATTN_ERROR_INVALID_ARGUMENT, stale);
    EXPECT_STATUS(flashattn_buffer_size(&size, buf), FLASHATTN_ERROR_INVALID_ARGUMENT, stale);
    CHECK(data == static_cast<void*>(&buf));
    CHECK(size == 12345);
    std::vector<unsigned char> bytes(16, 0x5a);
    EXPECT_STATUS(flashattn_buffer_write(buf, 0, bytes.data(), bytes.size()),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, stale);
    EXPECT_STATUS(flashattn_buffer_read(buf, 0, bytes.data(), bytes.size()),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, stale);
    CHECK(bytes == std::vector<unsigned char>(16, 0x5a));
    EXPECT_STATUS(flashattn_buffer_destroy(buf), FLASHATTN_ERROR_INVALID_ARGUMENT, stale);
    // A context handle is no buffer.
    EXPECT_STATUS(flashattn_buffer_size(&size, reinterpret_cast<flashattn_buffer_t>(
                                                   static_cast<flashattn_context_t>(ctx))),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, stale);
    CHECK(size == 12345);
  }

  TEST_CASE("a buffer outlives its context and stays usable") {
    flashattn_context_t ctx = nullptr;
    REQUIRE_OK(flashattn_context_create(&ctx, FLASHATTN_BACKEND_CPU, 0));
    flashattn_buffer_t a = nullptr, b = nullptr;
    REQUIRE_OK(flashattn_buffer_create(&a, ctx, 256));
    REQUIRE_OK(flashattn_buffer_create(&b, ctx, 512));
    EXPECT_OK(flashattn_context_destroy(ctx));

    const auto src = pattern(256, 5);
    EXPECT_OK(flashattn_buffer_write(a, 0, src.data(), src.size()));
    std::vector<unsigned char> dst(256);
    EXPECT_OK(flashattn_buffer_read(a, 0, dst.data(), dst.size()));
    CHECK(dst == src);
    size_t size = 0;
    EXPECT_OK(flashattn_buffer_size(&size, b));
    CHECK(size == 512);
    EXPECT_OK(flashattn_buffer_destroy(a));
    EXPECT_OK(flashattn_buffer_destroy(b));
  }

  TEST_CASE("many buffers created and destroyed in any order") {
    Context ctx;
    std::vector<flashattn_buffer_t> bufs;
    for (size_t i = 1; i <= 64; ++i) {
      flashattn_buffer_t b = nullptr;
      REQUIRE_OK(flashattn_buffer_create(&b, ctx, i * 40));
      const auto src = pattern(i * 40, static_cast<unsigned>(i));
      REQUIRE_OK(flashattn_buffer_write(b, 0, src.data(), src.size()));
      bufs.push_back(b);
    }
    for (size_t i = 0; i < bufs.size(); i += 2) CHECK(flashattn_buffer_destroy(bufs[i]) == FLASHATTN_SUCCESS);
    for (size_t i = 1; i < bufs.size(); i += 2) {
      std::vector<unsigned char> dst((i + 1) * 40);
      REQUIRE_OK(flashattn_buffer_read(bufs[i], 0, dst.data(), dst.size()));
      CHECK(dst == pattern((i + 1) * 40, static_cast<unsigned>(i + 1)));
      CHECK(flashattn_buffer_destroy(bufs[i]) == FLASHATTN_SUCCESS);
    }
  }
}

// Views whose data lies in buffers: checked against the buffer's end, and computed through.
TEST_SUITE("memory") {
  // q, k, v, out and lse laid out one after another in one buffer.
  struct InBuffer {
    Shape s;
    size_t off_q, off_k, off_v, off_out, off_lse, total;
    explicit InBuffer(Shape shape) : s(shape) {
      off_q = 0;
      off_k = off_q + s.q_elems();
      off_v = off_k + s.kv_elems();
      off_out = off_v + s.kv_elems();
      off_lse = off_out + s.q_elems();
      total = off_lse + s.lse_elems();  // in floats
    }
  };

  TEST_CASE("views into a buffer compute like host views") {
    Context ctx;
    Forward host;
    REQUIRE_OK(host.run(ctx));
    InBuffer l(host.s);
    Buffer buf(ctx, l.total * sizeof(float));
    REQUIRE_OK(flashattn_buffer_write(buf, l.off_q * 4, host.q.data(), host.q.size() * 4));
    REQUIRE_OK(flashattn_buffer_write(buf, l.off_k * 4, host.k.data(), host.k.size() * 4));
    REQUIRE_OK(flashattn_buffer_write(buf, l.off_v * 4, host.v.data(), host.v.size() * 4));
    float* base = buf.data();
    const Shape& s = host.s;
    auto q = view4(base + l.off_q, FLASHATTN_DTYPE_FLOAT32, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    auto k = view4(base + l.off_k, FLASHATTN_DTYPE_FLOAT32, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
    auto v = view4(base + l.off_v, FLASHATTN_DTYPE_FLOAT32, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
    auto o = view4(base + l.off_out, FLASHATTN_DTYPE_FLOAT32, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    auto lse = view_lse(base + l.off_lse, s.batch, s.heads_q, s.seqlen_q);
    EXPECT_OK(flashattn_forward(ctx, &q, &k, &v, &o, &lse, nullptr, nullptr, 0));
    std::vector<float> out(host.out.size()), lse_back(host.lse.size());
    REQUIRE_OK(flashattn_buffer_read(buf, l.off_out * 4, out.data(), out.size() * 4));
    REQUIRE_OK(flashattn_buffer_read(buf, l.off_lse * 4, lse_back.data(), lse_back.size() * 4));
    CHECK(out == host.out);
    CHECK(lse_back == host.lse);
  }

  TEST_CASE("a view running past the end of its buffer is INVALID_MEMORY") {
    Context ctx;
    Forward host;
    InBuffer l(host.s);
    // One float short: the lse's last element would lie past the end.
    Buffer buf(ctx, (l.total - 1) * sizeof(float));
    float* base = buf.data();
    const Shape& s = host.s;
    auto q = view4(base + l.off_q, FLASHATTN_DTYPE_FLOAT32, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    auto k = view4(base + l.off_k, FLASHATTN_DTYPE_FLOAT32, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
    auto v = view4(base + l.off_v, FLASHATTN_DTYPE_FLOAT32, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
    auto o = view4(base + l.off_out, FLASHATTN_DTYPE_FLOAT32, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    auto lse = view_lse(base + l.off_lse, s.batch, s.heads_q, s.seqlen_q);
    std::vector<float> poisoned((l.total - 1), 0.0f);
    poison(poisoned);
    REQUIRE_OK(flashattn_buffer_write(buf, 0, poisoned.data(), poisoned.size() * 4));
    EXPECT_STATUS(flashattn_forward(ctx, &q, &k, &v, &o, &lse, nullptr, nullptr, 0),
                  FLASHATTN_ERROR_INVALID_MEMORY, "lse: the view spans 160 bytes from offset");
    CHECK(contains(flashattn_last_error(), "past the end of its"));

    std::vector<float> after(poisoned.size());
    REQUIRE_OK(flashattn_buffer_read(buf, 0, after.data(), after.size() * 4));
    CHECK(all_poison(after));
  }

  TEST_CASE("an input running past the end of its buffer is INVALID_MEMORY") {
    Context ctx;
    Forward f;
    const size_t k_bytes = f.k.size() * sizeof(float);
    Buffer buf(ctx, k_bytes - 2);  // the last element of k would straddle the end
    REQUIRE_OK(flashattn_buffer_write(buf, 0, f.k.data(), k_bytes - 2));
    flashattn_tensor_t k = f.tk;
    k.data = buf.data();
    EXPECT_STATUS(flashattn_forward(ctx, &f.tq, &k, &f.tv, &f.tout, &f.tlse, nullptr, nullptr, 0),
                  FLASHATTN_ERROR_INVALID_MEMORY,
                  "k: the view spans " + std::to_string(k_bytes) + " bytes from offset 0, past the "
                  "end of its " + std::to_string(k_bytes - 2) + "-byte buffer");
    CHECK(f.untouched());
    // The same view one element further in, with the buffer's full size: also past the end.
    Buffer exact(ctx, k_bytes);
    k.data = exact.data() + 1;
    EXPECT_STATUS(flashattn_forward(ctx, &f.tq, &k, &f.tv, &f.tout, &f.tlse, nullptr, nullptr, 0),
                  FLASHATTN_ERROR_INVALID_MEMORY, "k: the view spans");
    CHECK(f.untouched());
    k.data = exact.data();
    REQUIRE_OK(flashattn_buffer_write(exact, 0, f.k.data(), k_bytes));
    EXPECT_OK(flashattn_forward(ctx, &f.tq, &k, &f.tv, &f.tout, &f.tlse, nullptr, nullptr, 0));
  }

  TEST_CASE("a view that starts at its buffer's end, or just past it, is INVALID_MEMORY") {
    Context ctx;
    Forward f;
    // Buffers of exactly out's and k's sizes (multiples of 256 bytes: no allocator slack after
    // them), each view moved to the buffer's end and a little beyond.
    const size_t out_bytes = f.out.size() * sizeof(float);
    const size_t k_bytes = f.k.size() * sizeof(float);
    REQUIRE(out_bytes % 256 == 0);
    Buffer out_buf(ctx, out_bytes), k_buf(ctx, k_bytes);
    REQUIRE_OK(flashattn_buffer_write(k_buf, 0, f.k.data(), k_bytes));
    for (size_t past : {size_t(0), size_t(4), size_t(64), size_t(252)}) {
      INFO("bytes past the end: " << past);
      flashattn_tensor_t out = f.tout;
      out.data = reinterpret_cast<char*>(out_buf.data()) + out_bytes + past;
      EXPECT_STATUS(flashattn_forward(ctx, &f.tq, &f.tk, &f.tv, &out, &f.tlse, nullptr, nullptr, 0),
                    FLASHATTN_ERROR_INVALID_MEMORY,
                    "out: the view spans " + std::to_string(out_bytes) + " bytes from offset " +
                        std::to_string(out_bytes + past) + ", past the end of its " +
                        std::to_string(out_bytes) + "-byte buffer");
      CHECK(f.untouched());
      // (Past the end, k may also reach whatever host memory follows, such as f's outputs: the
      // message then names that overlap instead. Either way the call is refused.)
      flashattn_tensor_t k = f.tk;
      k.data = reinterpret_cast<char*>(k_buf.data()) + k_bytes + past;
      EXPECT_STATUS(flashattn_forward(ctx, &f.tq, &k, &f.tv, &f.tout, &f.tlse, nullptr, nullptr, 0),
                    FLASHATTN_ERROR_INVALID_MEMORY, "k");
      CHECK(f.untouched());
    }
  }

  TEST_CASE("a workspace inside a buffer is checked against its end too") {
    Context ctx;
    Forward f;
    size_t need = 0;
    REQUIRE_OK(flashattn_workspace_size(&need, ctx, &f.tq, &f.tk, &f.tv, nullptr, 0));
    const size_t bytes = need + 1024;
    Buffer buf(ctx, bytes);
    EXPECT_STATUS(flashattn_forward(ctx, &f.tq, &f.tk, &f.tv, &f.tout, &f.tlse, nullptr,
                                    buf.data() + 128, bytes),
                  FLASHATTN_ERROR_INVALID_MEMORY,
                  "workspace: the view spans " + std::to_string(bytes) + " bytes from offset 512");
    CHECK(f.untouched());
  }

  TEST_CASE("views into a buffer of another CPU context are host memory, accepted") {
    Context ctx, other;
    Forward host;
    REQUIRE_OK(host.run(ctx));
    InBuffer l(host.s);
    flashattn_buffer_t raw = nullptr;
    REQUIRE_OK(flashattn_buffer_create(&raw, other, l.total * sizeof(float)));
    void* p = nullptr;
    REQUIRE_OK(flashattn_buffer_data(&p, raw));
    float* base = static_cast<float*>(p);
    REQUIRE_OK(flashattn_buffer_write(raw, l.off_q * 4, host.q.data(), host.q.size() * 4));
    REQUIRE_OK(flashattn_buffer_write(raw, l.off_k * 4, host.k.data(), host.k.size() * 4));
    REQUIRE_OK(flashattn_buffer_write(raw, l.off_v * 4, host.v.data(), host.v.size() * 4));
    const Shape& s = host.s;
    auto q = view4(base + l.off_q, FLASHATTN_DTYPE_FLOAT32, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    auto k = view4(base + l.off_k, FLASHATTN_DTYPE_FLOAT32, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
    auto v = view4(base + l.off_v, FLASHATTN_DTYPE_FLOAT32, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
    auto o = view4(base + l.off_out, FLASHATTN_DTYPE_FLOAT32, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    EXPECT_OK(flashattn_forward(ctx, &q, &k, &v, &o, nullptr, nullptr, nullptr, 0));
    std::vector<float> out(host.out.size());
    REQUIRE_OK(flashattn_buffer_read(raw, l.off_out * 4, out.data(), out.size() * 4));
    CHECK(out == host.out);
    // Still fine once the owning context is gone: the buffer keeps what it needs.
    std::vector<float> poisoned(host.out.size());
    poison(poisoned);
    REQUIRE_OK(flashattn_buffer_write(raw, l.off_out * 4, poisoned.data(), poisoned.size() * 4));
    flashattn_context_t gone = nullptr;
    REQUIRE_OK(flashattn_context_create(&gone, FLASHATTN_BACKEND_CPU, 0));
    flashattn_buffer_t orphan = nullptr;
    REQUIRE_OK(flashattn_buffer_create(&orphan, gone, l.total * sizeof(float)));
    REQUIRE_OK(flashattn_context_destroy(gone));
    REQUIRE_OK(flashattn_buffer_write(orphan, 0, p, l.total * sizeof(float)));
    void* op = nullptr;
    REQUIRE_OK(flashattn_buffer_data(&op, orphan));
    float* obase = static_cast<float*>(op);
    auto oq = view4(obase + l.off_q, FLASHATTN_DTYPE_FLOAT32, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    auto ok = view4(obase + l.off_k, FLASHATTN_DTYPE_FLOAT32, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
    auto ov = view4(obase + l.off_v, FLASHATTN_DTYPE_FLOAT32, s.batch, s.seqlen_k, s.heads_kv, s.head_dim);
    auto oo = view4(obase + l.off_out, FLASHATTN_DTYPE_FLOAT32, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
    EXPECT_OK(flashattn_forward(ctx, &oq, &ok, &ov, &oo, nullptr, nullptr, nullptr, 0));
    REQUIRE_OK(flashattn_buffer_read(orphan, l.off_out * 4, out.data(), out.size() * 4));
    CHECK(out == host.out);
    flashattn_buffer_destroy(orphan);
    flashattn_buffer_destroy(raw);
  }
}
