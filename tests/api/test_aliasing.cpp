// Outputs may share no byte with another view; views that interleave without touching (slices of
// a packed QKV tensor) are accepted and compute what separate tensors compute.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "api_helpers.hpp"

using namespace api_test;

namespace {

// Slice `slot` of a packed [B, N, slots, H, D] fp32 tensor, as a [B, N, H, D] view.
flashattn_tensor_t packed_slice(std::vector<float>& packed, int64_t slots, int64_t slot,
                                const Shape& s) {
  flashattn_tensor_t t = view4(packed.data() + slot * s.heads_q * s.head_dim,
                               FLASHATTN_DTYPE_FLOAT32, s.batch, s.seqlen_q, s.heads_q, s.head_dim);
  t.strides[0] = s.seqlen_q * slots * s.heads_q * s.head_dim;
  t.strides[1] = slots * s.heads_q * s.head_dim;
  return t;
}

// Self-attention shape (packed QKV needs equal seqlens and heads).
Shape self_shape() {
  Shape s;
  s.batch = 2;
  s.seqlen_q = s.seqlen_k = 9;
  s.heads_q = s.heads_kv = 3;
  s.head_dim = 8;
  return s;
}

std::vector<float> gather(const flashattn_tensor_t& t) {
  std::vector<float> r;
  for (int64_t b = 0; b < t.shape[0]; ++b)
    for (int64_t n = 0; n < t.shape[1]; ++n)
      for (int64_t h = 0; h < t.shape[2]; ++h)
        for (int64_t d = 0; d < t.shape[3]; ++d) r.push_back(at(t, b, n, h, d));
  return r;
}

void scatter(const std::vector<float>& src, const flashattn_tensor_t& t) {
  size_t i = 0;
  float* p = static_cast<float*>(t.data);
  for (int64_t b = 0; b < t.shape[0]; ++b)
    for (int64_t n = 0; n < t.shape[1]; ++n)
      for (int64_t h = 0; h < t.shape[2]; ++h)
        for (int64_t d = 0; d < t.shape[3]; ++d)
          p[b * t.strides[0] + n * t.strides[1] + h * t.strides[2] + d] = src[i++];
}

}  // namespace

TEST_SUITE("aliasing") {
  TEST_CASE("out sharing memory with an input is INVALID_MEMORY") {
    Context ctx;
    Forward f;
    std::vector<float> big(f.q.size() + f.k.size());
    std::string name;
    SUBCASE("out is q") {
      f.tout = f.tq;
      name = "q";
    }
    SUBCASE("out is q shifted by one element") {
      std::copy(f.q.begin(), f.q.end(), big.begin());
      f.tq.data = big.data();
      f.tout.data = big.data() + 1;
      name = "q";
    }
    SUBCASE("out starts inside k") {
      std::copy(f.k.begin(), f.k.end(), big.begin());
      f.tk.data = big.data();
      f.tout.data = big.data() + 100;
      name = "k";
    }
    EXPECT_STATUS(f.run(ctx), FLASHATTN_ERROR_INVALID_MEMORY, "out: shares memory with " + name);
    CHECK(all_poison(f.lse));
    CHECK(all_poison(f.out));
  }

  TEST_CASE("out and lse sharing memory is INVALID_MEMORY") {
    Context ctx;
    Forward f;
    f.tlse.data = f.out.data() + f.out.size() - 8;  // the lse's first floats are out's last
    EXPECT_STATUS(f.run(ctx), FLASHATTN_ERROR_INVALID_MEMORY, "out: shares memory with lse");
    CHECK(all_poison(f.out));
  }

  TEST_CASE("inputs may share memory with each other") {
    Context ctx;
    Shape s = self_shape();
    Forward f(s);
    f.tk = f.tq;
    f.tv = f.tq;
    EXPECT_OK(f.run(ctx));
    const Reference ref = reference_forward(f.tq, f.tq, f.tq, 0.0, false);
    CHECK(max_error(f.tout, ref.out) <= kFp32Tolerance);
  }

  TEST_CASE("q, k, v as slices of one packed QKV tensor compute like separate tensors") {
    Context ctx;
    const Shape s = self_shape();
    Forward sep(s);
    REQUIRE_OK(sep.run(ctx));
    std::vector<float> qkv(s.q_elems() * 3);
    flashattn_tensor_t q = packed_slice(qkv, 3, 0, s), k = packed_slice(qkv, 3, 1, s),
                       v = packed_slice(qkv, 3, 2, s);
    scatter(sep.q, q);
    scatter(sep.k, k);
    scatter(sep.v, v);
    Forward packed(s);
    EXPECT_OK(flashattn_forward(ctx, &q, &k, &v, &packed.tout, &packed.tlse, nullptr, nullptr, 0));
    CHECK(max_diff(packed.out, sep.out) <= 1e-5);
    CHECK(max_diff(packed.lse, sep.lse) <= 1e-5);
  }

  TEST_CASE("out interleaved with q in one packed tensor, disjoint, is accepted") {
    Context ctx;
    const Shape s = self_shape();
    Forward sep(s);
    REQUIRE_OK(sep.run(ctx));
    std::vector<float> qo(s.q_elems() * 2);
    poison(qo);
    flashattn_tensor_t q = packed_slice(qo, 2, 0, s), o = packed_slice(qo, 2, 1, s);
    scatter(sep.q, q);
    EXPECT_OK(flashattn_forward(ctx, &q, &sep.tk, &sep.tv, &o, nullptr, nullptr, nullptr, 0));
    CHECK(gather(q) == sep.q);  // the input is intact
    CHECK(max_diff(gather(o), sep.out) <= 1e-5);
  }

  TEST_CASE("backward: packed dQKV slices (interleaved, disjoint) are accepted") {
    Context ctx;
    const Shape s = self_shape();
    Backward sep(s);
    REQUIRE_OK(flashattn_forward(ctx, &sep.tq, &sep.tk, &sep.tv, &sep.tout, &sep.tlse, nullptr,
                                 nullptr, 0));
    REQUIRE_OK(sep.run(ctx));

    std::vector<float> dqkv(s.q_elems() * 3);
    poison(dqkv);
    flashattn_tensor_t dq = packed_slice(dqkv, 3, 0, s), dk = packed_slice(dqkv, 3, 1, s),
                       dv = packed_slice(dqkv, 3, 2, s);
    EXPECT_OK(flashattn_backward(ctx, &sep.tq, &sep.tk, &sep.tv, &sep.tout, &sep.tdout, &sep.tlse,
                                 &dq, &dk, &dv, nullptr, nullptr, 0));
    CHECK(max_diff(gather(dq), sep.dq) <= 1e-5);
    CHECK(max_diff(gather(dk), sep.dk) <= 1e-5);
    CHECK(max_diff(gather(dv), sep.dv) <= 1e-5);
  }

  TEST_CASE("backward: packed dQKV slices that overlap are INVALID_MEMORY") {
    Context ctx;
    const Shape s = self_shape();
    Backward b(s);
    std::vector<float> dqkv(s.q_elems() * 3);
    poison(dqkv);
    flashattn_tensor_t dq = packed_slice(dqkv, 3, 0, s), dk = packed_slice(dqkv, 3, 1, s),
                       dv = packed_slice(dqkv, 3, 2, s);
    dk.data = static_cast<float*>(dk.data) - 1;  // its first element is dq's last of a row
    EXPECT_STATUS(flashattn_backward(ctx, &b.tq, &b.tk, &b.tv, &b.tout, &b.tdout, &b.tlse, &dq,
                                     &dk, &dv, nullptr, nullptr, 0),
                  FLASHATTN_ERROR_INVALID_MEMORY, "dq: shares memory with dk");
    CHECK(all_poison(dqkv));
  }
}
