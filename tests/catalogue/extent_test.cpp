// Size arithmetic of the C API, against an independent oracle: every extent a view can describe
// is computed here in 128 bits, and the library must agree on which views overflow 64 bits, which
// span more than 2^56 bytes, which run past the end of their buffer, and which are fine. A view
// that is rejected is never indexed: the outputs keep their poison. Also the other sizes a
// caller controls: buffer offsets, tensor constructors, workspace sizes and alignment.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <flashattn/flashattn.h>

namespace {

using i128 = __int128;

constexpr int64_t B = 2, NQ = 64, NK = 48, HQ = 4, HKV = 2, D = 32;
constexpr int64_t kI64Max = INT64_MAX;

struct Ctx {
  flashattn_context_t h = nullptr;
  Ctx() { REQUIRE(flashattn_context_create(&h, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_SUCCESS); }
  ~Ctx() { flashattn_context_destroy(h); }
};

struct Buf {
  flashattn_buffer_t h = nullptr;
  float* p = nullptr;
  size_t bytes = 0;
  Buf(flashattn_context_t ctx, size_t n, float fill) : bytes(n) {
    REQUIRE(flashattn_buffer_create(&h, ctx, n) == FLASHATTN_SUCCESS);
    void* d = nullptr;
    REQUIRE(flashattn_buffer_data(&d, h) == FLASHATTN_SUCCESS);
    p = static_cast<float*>(d);
    std::vector<float> v(n / 4, fill);
    REQUIRE(flashattn_buffer_write(h, 0, v.data(), n) == FLASHATTN_SUCCESS);
  }
  ~Buf() { flashattn_buffer_destroy(h); }
  std::vector<unsigned char> bytes_now() const {
    std::vector<unsigned char> v(bytes);
    REQUIRE(flashattn_buffer_read(h, 0, v.data(), bytes) == FLASHATTN_SUCCESS);
    return v;
  }
};

// The forward problem of the catalogue's baseline, each tensor in a buffer of exactly its size.
struct Forward {
  Ctx ctx;
  Buf q{ctx.h, size_t(B * NQ * HQ * D) * 4, 0.25f};
  Buf k{ctx.h, size_t(B * NK * HKV * D) * 4, 0.5f};
  Buf v{ctx.h, size_t(B * NK * HKV * D) * 4, -0.5f};
  Buf out{ctx.h, size_t(B * NQ * HQ * D) * 4, -777.0f};  // poison
  Buf lse{ctx.h, size_t(B * HQ * NQ) * 4, -777.0f};
  flashattn_tensor_t tq{}, tk{}, tv{}, tout{}, tlse{};
  Forward() {
    REQUIRE(flashattn_tensor_4d(&tq, q.p, FLASHATTN_DTYPE_FLOAT32, B, NQ, HQ, D) == 0);
    REQUIRE(flashattn_tensor_4d(&tk, k.p, FLASHATTN_DTYPE_FLOAT32, B, NK, HKV, D) == 0);
    REQUIRE(flashattn_tensor_4d(&tv, v.p, FLASHATTN_DTYPE_FLOAT32, B, NK, HKV, D) == 0);
    REQUIRE(flashattn_tensor_4d(&tout, out.p, FLASHATTN_DTYPE_FLOAT32, B, NQ, HQ, D) == 0);
    REQUIRE(flashattn_tensor_lse(&tlse, lse.p, B, HQ, NQ) == 0);
  }
  flashattn_status_t run(const flashattn_tensor_t& q_view) {
    return flashattn_forward(ctx.h, &q_view, &tk, &tv, &tout, &tlse, nullptr, nullptr, 0);
  }
};

enum class Verdict { Ok, Overflow64, Over2p56, PastBuffer };

// What a valid-shaped, non-negative-stride view deserves: the largest element offset
// sum (shape - 1) * stride and the byte extent, computed exactly.
Verdict judge(const int64_t* shape, const int64_t* strides, int rank, size_t elem, size_t buffer) {
  i128 offset = 0;
  for (int i = 0; i < rank; ++i) offset += i128(shape[i] - 1) * strides[i];
  if (offset > i128(kI64Max)) return Verdict::Overflow64;
  const i128 extent = (offset + 1) * i128(elem);
  if (extent > (i128(1) << 56)) return Verdict::Over2p56;
  if (extent > i128(buffer)) return Verdict::PastBuffer;
  return Verdict::Ok;
}

const int64_t kStrides[] = {0,
                            1,
                            2,
                            31,
                            32,
                            33,
                            127,
                            128,
                            129,
                            4095,
                            4096,
                            4097,
                            8191,
                            8192,
                            8193,
                            int64_t(1) << 20,
                            (int64_t(1) << 31) - 1,
                            int64_t(1) << 31,
                            int64_t(1) << 40,
                            (int64_t(1) << 54) / 63,
                            (int64_t(1) << 54) / 63 + 1,
                            int64_t(1) << 54,
                            (int64_t(1) << 54) + 1,
                            int64_t(1) << 56,
                            int64_t(1) << 61,
                            kI64Max / 63,
                            kI64Max / 63 + 1,
                            int64_t(1) << 62,
                            kI64Max};

}  // namespace

TEST_CASE("extent: every stride of q in the forward, judged against a 128-bit oracle") {
  int counts[4] = {0, 0, 0, 0};
  for (int dim = 0; dim < 3; ++dim) {
    for (int64_t stride : kStrides) {
      Forward f;
      flashattn_tensor_t q = f.tq;
      q.strides[dim] = stride;
      const Verdict want = judge(q.shape, q.strides, 4, 4, f.q.bytes);
      ++counts[static_cast<int>(want)];
      const auto out_before = f.out.bytes_now();
      const auto lse_before = f.lse.bytes_now();
      const flashattn_status_t st = f.run(q);
      const std::string msg = flashattn_last_error();
      INFO("q.strides[" << dim << "] = " << stride << ": " << msg);
      switch (want) {
        case Verdict::Overflow64:
          CHECK(st == FLASHATTN_ERROR_INVALID_STRIDE);
          CHECK(msg.find("with these strides overflows 64 bits") != std::string::npos);
          break;
        case Verdict::Over2p56:
          CHECK(st == FLASHATTN_ERROR_INVALID_STRIDE);
          CHECK(msg.find("spans more than 2^56 bytes") != std::string::npos);
          break;
        case Verdict::PastBuffer:
          // Past its buffer; a span that long may first be found to reach another tensor.
          CHECK(st == FLASHATTN_ERROR_INVALID_MEMORY);
          CHECK((msg.find("q: the view spans") != std::string::npos ||
                 msg.find("shares memory with q") != std::string::npos));
          break;
        case Verdict::Ok:
          CHECK(st == FLASHATTN_SUCCESS);
          break;
      }
      if (st != FLASHATTN_SUCCESS) {
        CHECK(f.out.bytes_now() == out_before);
        CHECK(f.lse.bytes_now() == lse_before);
      }
    }
  }
  // The grid reaches every verdict.
  for (int c : counts) CHECK(c > 0);
}

TEST_CASE("extent: huge sequence lengths with huge strides, through flashattn_supported") {
  // seqlen up to 2^31 - 1 (the largest accepted) with every stride on every dim: the library must
  // say exactly what the oracle says (no buffer here: supported() does not look at data).
  const int64_t seqlens[] = {1, 2, 64, 65536, (int64_t(1) << 31) - 2, (int64_t(1) << 31) - 1};
  Ctx ctx;
  flashattn_tensor_t k{}, v{};
  REQUIRE(flashattn_tensor_4d(&k, nullptr, FLASHATTN_DTYPE_FLOAT16, B, NK, HKV, D) == 0);
  REQUIRE(flashattn_tensor_4d(&v, nullptr, FLASHATTN_DTYPE_FLOAT16, B, NK, HKV, D) == 0);
  int rejected = 0, accepted = 0;
  for (int64_t n : seqlens) {
    for (int dim = 0; dim < 3; ++dim) {
      for (int64_t stride : kStrides) {
        flashattn_tensor_t q{};
        REQUIRE(flashattn_tensor_4d(&q, nullptr, FLASHATTN_DTYPE_FLOAT16, B, 1, HQ, D) == 0);
        q.shape[1] = n;
        q.strides[0] = n * HQ * D;  // contiguous for this n: fits for every n above
        q.strides[1] = HQ * D;
        q.strides[dim] = stride;
        const Verdict want = judge(q.shape, q.strides, 4, 2, SIZE_MAX);
        const flashattn_status_t st = flashattn_supported(ctx.h, &q, &k, &v, nullptr, 0);
        INFO("seqlen " << n << ", strides[" << dim << "] = " << stride << ": " << flashattn_last_error());
        if (want == Verdict::Ok) {
          CHECK(st == FLASHATTN_SUCCESS);
          ++accepted;
        } else {
          CHECK(st == FLASHATTN_ERROR_INVALID_STRIDE);
          ++rejected;
        }
      }
    }
  }
  CHECK(accepted > 0);
  CHECK(rejected > 0);
}

TEST_CASE("extent: shapes past 2^31 - 1 are refused before any product is formed") {
  Ctx ctx;
  flashattn_tensor_t k{}, v{};
  REQUIRE(flashattn_tensor_4d(&k, nullptr, FLASHATTN_DTYPE_FLOAT32, B, NK, HKV, D) == 0);
  REQUIRE(flashattn_tensor_4d(&v, nullptr, FLASHATTN_DTYPE_FLOAT32, B, NK, HKV, D) == 0);
  for (int64_t n : {int64_t(1) << 31, int64_t(1) << 32, int64_t(1) << 62, kI64Max}) {
    for (int64_t stride : {int64_t(0), int64_t(1), kI64Max}) {
      flashattn_tensor_t q{};
      REQUIRE(flashattn_tensor_4d(&q, nullptr, FLASHATTN_DTYPE_FLOAT32, B, NQ, HQ, D) == 0);
      q.shape[1] = n;
      q.strides[1] = stride;
      INFO("seqlen " << n << " stride " << stride);
      CHECK(flashattn_supported(ctx.h, &q, &k, &v, nullptr, 0) == FLASHATTN_ERROR_INVALID_SHAPE);
      CHECK(std::string(flashattn_last_error()).find("exceeds 2^31 - 1") != std::string::npos);
    }
  }
}

TEST_CASE("extent: the LSE output of the forward, judged the same way") {
  // An output must also map every index to its own element: checked here by enumerating the
  // 512 offsets, independently of how the library decides it.
  int verdicts = 0;
  for (int dim = 0; dim < 3; ++dim) {
    for (int64_t stride : kStrides) {
      Forward f;
      flashattn_tensor_t lse = f.tlse;
      lse.strides[dim] = stride;
      const Verdict want = judge(lse.shape, lse.strides, 3, 4, f.lse.bytes);
      std::vector<i128> offsets;
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t h = 0; h < HQ; ++h) {
          for (int64_t n = 0; n < NQ; ++n) {
            offsets.push_back(i128(b) * lse.strides[0] + i128(h) * lse.strides[1] + i128(n) * lse.strides[2]);
          }
        }
      }
      std::sort(offsets.begin(), offsets.end());
      const bool one_to_one = std::adjacent_find(offsets.begin(), offsets.end()) == offsets.end();
      // The sufficient condition the header's promise rests on: sorted by stride, each stride
      // exceeds the span of the smaller ones. The library accepts every such layout, refuses
      // every layout that is not one-to-one, and may refuse the exotic ones in between.
      std::pair<int64_t, int64_t> dims[3];
      for (int i = 0; i < 3; ++i) dims[i] = {lse.strides[i], lse.shape[i]};
      std::sort(dims, dims + 3);
      i128 span = 0;
      bool nested = true;
      for (const auto& d : dims) {
        if (d.second == 1) continue;
        nested = nested && i128(d.first) > span;
        span += i128(d.second - 1) * d.first;
      }
      const auto out_before = f.out.bytes_now();
      const auto lse_before = f.lse.bytes_now();
      const flashattn_status_t st =
          flashattn_forward(f.ctx.h, &f.tq, &f.tk, &f.tv, &f.tout, &lse, nullptr, nullptr, 0);
      const std::string msg = flashattn_last_error();
      INFO("lse.strides[" << dim << "] = " << stride << ": " << msg);
      if (want == Verdict::Overflow64 || want == Verdict::Over2p56) {
        CHECK(st == FLASHATTN_ERROR_INVALID_STRIDE);
      } else if (!one_to_one) {
        CHECK(st == FLASHATTN_ERROR_INVALID_STRIDE);
        CHECK(msg.find("lse: strides overlap") != std::string::npos);
      } else if (!nested && st == FLASHATTN_ERROR_INVALID_STRIDE) {
        CHECK(msg.find("lse: strides overlap") != std::string::npos);  // conservative, allowed
      } else if (want == Verdict::PastBuffer) {
        CHECK(st == FLASHATTN_ERROR_INVALID_MEMORY);
        CHECK((msg.find("lse: the view spans") != std::string::npos ||
               msg.find("shares memory with lse") != std::string::npos ||
               msg.find("lse: shares memory with") != std::string::npos));
      } else {
        CHECK(st == FLASHATTN_SUCCESS);
        ++verdicts;
      }
      if (st != FLASHATTN_SUCCESS) {
        CHECK(f.out.bytes_now() == out_before);
        CHECK(f.lse.bytes_now() == lse_before);
      }
    }
  }
  CHECK(verdicts > 0);
}

TEST_CASE("extent: buffer offsets and sizes whose sum wraps around are refused") {
  Ctx ctx;
  Buf b(ctx.h, 1024, 1.0f);
  unsigned char host[16];
  std::memset(host, 0x5a, sizeof host);
  const size_t cases[][2] = {{SIZE_MAX, 2},  {2, SIZE_MAX},        {1024, 1},
                             {1, 1024},      {SIZE_MAX, SIZE_MAX}, {SIZE_MAX - 1023, 1024},
                             {0, 1025},      {1025, 0}};
  for (const auto& c : cases) {
    INFO("offset " << c[0] << " bytes " << c[1]);
    CHECK(flashattn_buffer_write(b.h, c[0], host, c[1]) == FLASHATTN_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(flashattn_last_error()).find("exceeds the buffer's 1024 bytes") != std::string::npos);
    CHECK(flashattn_buffer_read(b.h, c[0], host, c[1]) == FLASHATTN_ERROR_INVALID_ARGUMENT);
    for (unsigned char x : host) CHECK(x == 0x5a);
  }
  // The edges that fit.
  CHECK(flashattn_buffer_write(b.h, 1024, host, 0) == FLASHATTN_SUCCESS);
  CHECK(flashattn_buffer_read(b.h, 1008, host, 16) == FLASHATTN_SUCCESS);
}

TEST_CASE("extent: tensor constructors refuse element counts that overflow 64 bits") {
  flashattn_tensor_t t;
  const int64_t big = int64_t(1) << 31;
  CHECK(flashattn_tensor_4d(&t, nullptr, FLASHATTN_DTYPE_FLOAT32, big, big, 2, 1) ==
        FLASHATTN_ERROR_INVALID_SHAPE);  // 2^63
  CHECK(std::string(flashattn_last_error()).find("overflows 64 bits") != std::string::npos);
  CHECK(flashattn_tensor_4d(&t, nullptr, FLASHATTN_DTYPE_FLOAT32, kI64Max, 1, 1, 2) ==
        FLASHATTN_ERROR_INVALID_SHAPE);
  CHECK(flashattn_tensor_lse(&t, nullptr, big, big, 2) == FLASHATTN_ERROR_INVALID_SHAPE);
  CHECK(flashattn_tensor_lse(&t, nullptr, 2, kI64Max, 2) == FLASHATTN_ERROR_INVALID_SHAPE);
  // Just below: 2^62 elements is a representable count (the views are refused later, by size).
  CHECK(flashattn_tensor_4d(&t, nullptr, FLASHATTN_DTYPE_FLOAT32, big, big, 1, 1) == FLASHATTN_SUCCESS);
  CHECK(t.strides[0] == big);
}

TEST_CASE("workspace: a huge workspace_size still finds the tensors it covers") {
  // One host block holds the workspace's start and, 4096 bytes after it, every tensor: a
  // workspace_size of at least what the call needs covers q, up to SIZE_MAX (which reaches the end
  // of the address space: the overlap test must not wrap around).
  Ctx ctx;
  const size_t elems_q = size_t(B * NQ * HQ * D), elems_k = size_t(B * NK * HKV * D);
  std::vector<float> block(1024 + 2 * elems_q + 2 * elems_k + size_t(B * HQ * NQ), 0.5f);
  float* p = block.data() + 1024;
  flashattn_tensor_t q, k, v, out, lse;
  REQUIRE(flashattn_tensor_4d(&q, p, FLASHATTN_DTYPE_FLOAT32, B, NQ, HQ, D) == 0);
  REQUIRE(flashattn_tensor_4d(&k, p + elems_q, FLASHATTN_DTYPE_FLOAT32, B, NK, HKV, D) == 0);
  REQUIRE(flashattn_tensor_4d(&v, p + elems_q + elems_k, FLASHATTN_DTYPE_FLOAT32, B, NK, HKV, D) == 0);
  REQUIRE(flashattn_tensor_4d(&out, p + elems_q + 2 * elems_k, FLASHATTN_DTYPE_FLOAT32, B, NQ, HQ, D) == 0);
  REQUIRE(flashattn_tensor_lse(&lse, p + 2 * elems_q + 2 * elems_k, B, HQ, NQ) == 0);
  size_t need = 0;
  REQUIRE(flashattn_workspace_size(&need, ctx.h, &q, &k, &v, nullptr, 0) == 0);
  REQUIRE(need > 4096);
  const std::vector<float> before = block;
  for (size_t size : {SIZE_MAX, SIZE_MAX - 4096, size_t(1) << 63, need}) {
    INFO("workspace_size " << size);
    CHECK(flashattn_forward(ctx.h, &q, &k, &v, &out, &lse, nullptr, block.data(), size) ==
          FLASHATTN_ERROR_INVALID_MEMORY);
    CHECK(std::string(flashattn_last_error()).find("workspace: shares memory with q") != std::string::npos);
  }
  CHECK(block == before);
}

TEST_CASE("workspace: any alignment of a caller's workspace gives the scratch result") {
  // The header asks no alignment of a workspace; the backends' scratch layouts need it.
  Forward f;
  for (int algorithm : {0, 1}) {
    flashattn_options_t o;
    REQUIRE(flashattn_options_init(&o) == 0);
    const int32_t alg = algorithm;
    std::memcpy(&o.algorithm, &alg, sizeof alg);
    size_t need = 0;
    REQUIRE(flashattn_workspace_size(&need, f.ctx.h, &f.tq, &f.tk, &f.tv, &o, 0) == 0);
    REQUIRE(flashattn_forward(f.ctx.h, &f.tq, &f.tk, &f.tv, &f.tout, &f.tlse, &o, nullptr, 0) == 0);
    const auto want_out = f.out.bytes_now();
    const auto want_lse = f.lse.bytes_now();
    for (size_t misalign : {size_t(1), size_t(2), size_t(3), size_t(4), size_t(8), size_t(17),
                            size_t(64), size_t(128), size_t(255)}) {
      INFO("algorithm " << algorithm << ", workspace at +" << misalign << " bytes");
      std::vector<unsigned char> ws(need + misalign, 0xFF);  // NaN bytes: must not be trusted
      REQUIRE(flashattn_forward(f.ctx.h, &f.tq, &f.tk, &f.tv, &f.tout, &f.tlse, &o,
                                ws.data() + misalign, need) == FLASHATTN_SUCCESS);
      CHECK(f.out.bytes_now() == want_out);
      CHECK(f.lse.bytes_now() == want_lse);
      if (need > 0) {
        CHECK(flashattn_forward(f.ctx.h, &f.tq, &f.tk, &f.tv, &f.tout, &f.tlse, &o,
                                ws.data() + misalign, need - 1) == FLASHATTN_ERROR_WORKSPACE_TOO_SMALL);
      }
    }
  }
}
