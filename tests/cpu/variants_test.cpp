// The attention variants on the CPU backend, forward and backward, flash and standard, against
// the float64 reference by the rule (3x with a softcap): sliding windows, softcap, ALiBi, sinks
// and their gradient, a head_dim of v of its own, variable-length batches, and combinations; on
// shapes that are not tile multiples, GQA, Nq != Nk, rows that see no key, strided and packed
// views, odd head dims. Outputs are poisoned with NaN (harness.cpp). The reference's own
// gradients are checked against finite differences first.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>

#include "cpu/harness.hpp"

using namespace flashattn_test;

namespace {

constexpr flashattn_dtype_t F32 = FLASHATTN_DTYPE_FLOAT32;
constexpr flashattn_dtype_t F16 = FLASHATTN_DTYPE_FLOAT16;
constexpr flashattn_dtype_t BF16 = FLASHATTN_DTYPE_BFLOAT16;
const flashattn_dtype_t kDtypes[] = {F32, F16, BF16};

Case make(flashattn_dtype_t dtype, int64_t b, int64_t nq, int64_t nk, int64_t hq, int64_t hkv,
          int64_t d, bool causal = false) {
  const uint64_t seed = static_cast<uint64_t>(nq * 37 + nk * 11 + d * 7 + (causal ? 3 : 0) +
                                            static_cast<int>(dtype) * 1000);
  return shaped_case(dtype, b, nq, nk, hq, hkv, d, causal, seed);
}

Case windowed(Case c, int32_t left, int32_t right) {
  c.window = true;
  c.window_left = left;
  c.window_right = right;
  return c;
}

Case softcapped(Case c, float cap) {
  c.softcap = cap;
  return c;
}

Case with_alibi(Case c, Slopes slopes = Slopes::PerHead) {
  c.alibi = slopes;
  return c;
}

Case with_sinks(Case c) {
  c.sinks = true;
  return c;
}

Case with_dv(Case c, int64_t dv) {
  c.head_dim_v = dv;
  return c;
}

// A variable-length batch of these sequence lengths (max lengths: the longest, plus `slack`).
Case varlen(Case c, std::vector<int64_t> lengths_q, std::vector<int64_t> lengths_k,
            int64_t slack = 0) {
  c.batch = static_cast<int64_t>(lengths_q.size());
  c.seqlen_q = slack;
  c.seqlen_k = slack;
  for (int64_t n : lengths_q) c.seqlen_q = std::max(c.seqlen_q, n + slack);
  for (int64_t n : lengths_k) c.seqlen_k = std::max(c.seqlen_k, n + slack);
  c.seqlens_q = std::move(lengths_q);
  c.seqlens_k = std::move(lengths_k);
  return c;
}

void check_both(const Case& c) {
  check_forward(c);
  check_backward(c);
}

// ---- Finite differences of the reference ------------------------------------------------------

double loss(const RefProblem& p, const std::vector<double>& q, const std::vector<double>& k,
            const std::vector<double>& v, const std::vector<double>& w) {
  std::vector<double> out;
  reference_forward(p, q, k, v, &out, nullptr);
  double s = 0.0;
  for (size_t i = 0; i < out.size(); ++i) s += out[i] * w[i];
  return s;
}

// Central differences of f with respect to every element of x.
std::vector<double> differences(std::vector<double>* x, const std::function<double()>& f) {
  std::vector<double> grad(x->size());
  const double h = 1e-5;
  for (size_t i = 0; i < x->size(); ++i) {
    const double keep = (*x)[i];
    (*x)[i] = keep + h;
    const double up = f();
    (*x)[i] = keep - h;
    const double down = f();
    (*x)[i] = keep;
    grad[i] = (up - down) / (2 * h);
  }
  return grad;
}

}  // namespace

TEST_SUITE("cpu_variants_reference") {
  TEST_CASE("the reference's gradients, every variant at once, are its finite differences") {
    // Large enough logits that the softcap bends them (scale 1.5), ALiBi per (batch, head),
    // sinks, a window with rows that see no key (Nq > Nk), d_v != d_qk, GQA; and a
    // variable-length batch with an empty sequence.
    Case fixed = make(F32, 2, 7, 5, 2, 1, 3, true);
    fixed.scale = 1.5f;
    fixed = with_dv(with_sinks(with_alibi(softcapped(windowed(fixed, 2, -1), 1.2f),
                                          Slopes::PerBatchHead)), 4);
    Case packed = with_dv(with_sinks(with_alibi(softcapped(windowed(make(F32, 1, 1, 1, 2, 2, 3), 1, 1), 2.0f))), 2);
    packed = varlen(packed, {4, 0, 3}, {3, 2, 5});
    for (const Case& c : {fixed, packed}) {
      INFO(c.name());
      const Inputs in = make_inputs(c);
      RefProblem p = in.ref(c);
      auto q = in.q.to_double(), k = in.k.to_double(), v = in.v.to_double();
      const auto w = in.dout.to_double();
      std::vector<double> ref[4];
      reference_backward(p, q, k, v, w, &ref[0], &ref[1], &ref[2], &ref[3]);
      const auto f = [&] { return loss(p, q, k, v, w); };
      const std::vector<double> fd[4] = {differences(&q, f), differences(&k, f),
                                         differences(&v, f), differences(&p.sinks, f)};
      const char* names[4] = {"dq", "dk", "dv", "dsinks"};
      for (int which = 0; which < 4; ++which) {
        const Comparison cmp = check_close(names[which], ref[which], fd[which], 1e-7);
        CHECK_MESSAGE(cmp.ok, cmp.message);
      }
      // The variants matter: without them the loss differs.
      RefProblem plain = p;
      plain.softcap = 0;
      plain.alibi.clear();
      plain.sinks.clear();
      CHECK(std::fabs(loss(plain, q, k, v, w) - f()) > 1e-3);
    }
  }
}

TEST_SUITE("cpu_variants_window") {
  TEST_CASE("sliding windows: left, right, both, with causal, Nq != Nk, rows that see no key") {
    for (flashattn_dtype_t dtype : kDtypes) {
      check_both(windowed(make(dtype, 2, 130, 130, 2, 2, 40), 17, 0));
      check_both(windowed(make(dtype, 1, 77, 200, 4, 2, 72), 64, 5));      // GQA, Nq < Nk
      check_both(windowed(make(dtype, 1, 200, 70, 2, 1, 24), 0, 30));      // Nq > Nk
      check_both(windowed(make(dtype, 1, 150, 90, 2, 2, 16, true), 9, 9));  // causal caps right
      check_both(windowed(make(dtype, 1, 100, 100, 1, 1, 8), -1, 3));      // only a right bound
    }
    // Rows far from the keys see none: Nq > Nk with a right bound below the diagonal reach.
    check_both(windowed(make(F32, 1, 300, 40, 1, 1, 8, true), 5, -1));
    // One key per row (left = right = 0), and windows wider than the sequence.
    check_both(windowed(make(BF16, 1, 65, 65, 2, 2, 32), 0, 0));
    check_both(windowed(make(F16, 2, 33, 47, 2, 2, 32), 1000, 1000));
  }

  TEST_CASE("a window of (-1, 0) is the causal mask, and (-1, -1) no mask, bit for bit") {
    for (flashattn_algorithm_t alg : {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD}) {
      const Case plain = make(BF16, 1, 90, 150, 2, 1, 32, true);
      const Case as_window = windowed(make(BF16, 1, 90, 150, 2, 1, 32, false), -1, 0);
      const Case open = windowed(make(BF16, 1, 90, 150, 2, 1, 32, false), -1, -1);
      const Case full = make(BF16, 1, 90, 150, 2, 1, 32, false);
      CpuContext ctx;
      const Inputs in = make_inputs(plain);
      const auto same = [&](const Case& a, const Case& b) {
        const ForwardResult fa = run_forward(ctx.get(), a, in, alg);
        const ForwardResult fb = run_forward(ctx.get(), b, in, alg);
        CHECK(fa.out.snapshot() == fb.out.snapshot());
        CHECK(fa.lse.snapshot() == fb.lse.snapshot());
        const BackwardResult ga = run_backward(ctx.get(), a, in, fa, alg);
        const BackwardResult gb = run_backward(ctx.get(), b, in, fb, alg);
        CHECK(ga.dq.snapshot() == gb.dq.snapshot());
        CHECK(ga.dk.snapshot() == gb.dk.snapshot());
        CHECK(ga.dv.snapshot() == gb.dv.snapshot());
      };
      same(plain, as_window);
      same(full, open);
    }
  }

  TEST_CASE("a narrow window visits only the key tiles it sees (work grows with the window)") {
    // 4096 queries and keys, a window of 65 keys: each 64-row query tile sees 160 keys, 3 of the
    // 64 key tiles. Against the full problem: about 20x fewer blocks, measured 8x faster on 2
    // cores (packing the query tiles costs the same in both). The check asks for 2x, the best
    // of five calls each, taken in turn, so that a machine busy with other work (a parallel
    // test run) cannot fail it, while a kernel visiting every tile (about 1x) still does.
    Case full = make(F32, 1, 4096, 4096, 1, 1, 64);
    const Case narrow = windowed(full, 32, 32);
    CpuContext ctx(1);
    const Inputs in = make_inputs(full);
    const auto seconds = [&](const Case& c) {
      const auto t0 = std::chrono::steady_clock::now();
      run_forward(ctx.get(), c, in, FLASHATTN_ALGORITHM_FLASH, false);
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    double t_full = 1e30, t_narrow = 1e30;
    for (int rep = 0; rep < 5; ++rep) {
      t_full = std::min(t_full, seconds(full));
      t_narrow = std::min(t_narrow, seconds(narrow));
    }
    MESSAGE("forward, 4096 x 4096: " << t_full * 1e3 << " ms full, " << t_narrow * 1e3
                                     << " ms with a window of 65 keys");
    CHECK(t_narrow * 2 < t_full);
  }
}

TEST_SUITE("cpu_variants_logits") {
  TEST_CASE("softcap: every dtype, caps that bend ordinary and large logits") {
    for (flashattn_dtype_t dtype : kDtypes) {
      Case c = make(dtype, 2, 67, 131, 4, 2, 40, true);
      c.scale = 1.0f;  // logits of a few units: a cap of 2 bends them, 30 hardly
      check_both(softcapped(c, 2.0f));
      check_both(softcapped(make(dtype, 1, 129, 65, 2, 2, 100), 30.0f));
      check_both(softcapped(make(dtype, 1, 1, 300, 2, 1, 3), 0.5f));  // decode, head dim 3
    }
  }

  TEST_CASE("ALiBi: per head and per (batch, head), causal and not, Nq != Nk") {
    for (flashattn_dtype_t dtype : kDtypes) {
      check_both(with_alibi(make(dtype, 2, 90, 90, 4, 2, 32, true)));
      check_both(with_alibi(make(dtype, 2, 50, 170, 2, 2, 72), Slopes::PerBatchHead));
      check_both(with_alibi(make(dtype, 1, 170, 50, 2, 1, 1, true), Slopes::PerBatchHead));
    }
  }

  TEST_CASE("attention sinks and their gradient: every dtype, GQA, rows that see no key") {
    for (flashattn_dtype_t dtype : kDtypes) {
      check_both(with_sinks(make(dtype, 2, 70, 90, 4, 2, 32)));
      check_both(with_sinks(make(dtype, 1, 150, 40, 2, 2, 16, true)));  // 110 rows see no key
      check_both(with_sinks(make(dtype, 3, 1, 129, 2, 1, 64)));         // decode
    }
  }
}

TEST_SUITE("cpu_variants_shapes") {
  TEST_CASE("a head_dim of v of its own: 192/128, 128/64, 40/72, 3/100, 200/1") {
    const int64_t pairs[][2] = {{192, 128}, {128, 64}, {40, 72}, {3, 100}, {200, 1}, {64, 256}};
    int n = 0;
    for (const auto& pr : pairs) {
      const flashattn_dtype_t dtype = kDtypes[n++ % 3];
      check_both(with_dv(make(dtype, 2, 65, 97, 2, 1, pr[0], n % 2 == 0), pr[1]));
    }
  }

  TEST_CASE("odd head dims with every variant: 1, 3, 40, 72, 100, 200") {
    int n = 0;
    for (int64_t d : {1, 3, 40, 72, 100, 200}) {
      const flashattn_dtype_t dtype = kDtypes[n++ % 3];
      Case c = make(dtype, 1, 70, 83, 2, 1, d, true);
      check_both(with_sinks(with_alibi(softcapped(windowed(c, 20, 3), 5.0f))));
    }
  }

  TEST_CASE("variable-length batches: lengths of 0, 1, not tile multiples, longer than a tile") {
    for (flashattn_dtype_t dtype : kDtypes) {
      check_both(varlen(make(dtype, 1, 1, 1, 2, 2, 32), {5, 0, 130, 1, 64}, {7, 3, 100, 0, 64}));
      check_both(varlen(make(dtype, 1, 1, 1, 4, 2, 40, true), {70, 1, 0}, {33, 90, 0}, 1));  // max lengths above the longest
    }
    // Sequences with keys and no query, and one with queries and no key (they see nothing).
    check_both(varlen(make(F32, 1, 1, 1, 2, 1, 8), {0, 0, 3}, {5, 9, 0}));
    check_both(varlen(make(F32, 1, 1, 1, 2, 1, 8, true), {4, 6, 0}, {0, 0, 7}));
  }

  TEST_CASE("combinations: window + softcap + sinks + ALiBi + GQA + varlen + d_v, strided") {
    for (flashattn_dtype_t dtype : kDtypes) {
      Case c = make(dtype, 1, 1, 1, 6, 2, 72, true);
      c = with_dv(with_sinks(softcapped(windowed(c, 40, 0), 8.0f)), 48);
      c = varlen(c, {100, 0, 37, 129}, {80, 64, 37, 200});
      check_both(c);
      c.layout = Layout::Padded;
      check_both(with_alibi(c, Slopes::PerBatchHead));
    }
    // Packed QKV (q, k, v slices of one tensor), fixed and variable-length.
    Case p = with_sinks(softcapped(windowed(make(BF16, 2, 67, 67, 4, 2, 40, true), 16, -1), 10.0f));
    p.layout = Layout::PackedQKV;
    check_both(p);
    check_both(varlen(p, {30, 67, 1}, {30, 67, 1}));
    // K and V broadcast over the batch.
    Case bc = with_alibi(with_sinks(make(F16, 3, 40, 90, 2, 1, 24)), Slopes::PerBatchHead);
    bc.layout = Layout::BroadcastKV;
    check_both(bc);
  }

  TEST_CASE("one thread and many: the same results bit for bit") {
    Case c = with_sinks(with_alibi(softcapped(windowed(make(F32, 2, 150, 170, 4, 2, 40), 30, 10), 4.0f)));
    c = varlen(c, {150, 3, 77}, {170, 0, 90});
    Case one = c;
    one.threads = 1;
    Case many = c;
    many.threads = 3;
    const Inputs in = make_inputs(c);
    for (flashattn_algorithm_t alg : {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD}) {
      CpuContext ctx1(1), ctx3(3);
      const ForwardResult f1 = run_forward(ctx1.get(), one, in, alg);
      const ForwardResult f3 = run_forward(ctx3.get(), many, in, alg);
      CHECK(f1.out.snapshot() == f3.out.snapshot());
      CHECK(f1.lse.snapshot() == f3.lse.snapshot());
      const BackwardResult g1 = run_backward(ctx1.get(), one, in, f1, alg);
      const BackwardResult g3 = run_backward(ctx3.get(), many, in, f3, alg);
      CHECK(g1.dq.snapshot() == g3.dq.snapshot());
      CHECK(g1.dk.snapshot() == g3.dk.snapshot());
      CHECK(g1.dv.snapshot() == g3.dv.snapshot());
      CHECK(g1.dsinks.snapshot() == g3.dsinks.snapshot());
    }
  }
}

TEST_SUITE("cpu_variants_varlen_layout") {
  TEST_CASE("a variable-length forward is each sequence's own forward, bit for bit") {
    for (flashattn_algorithm_t alg : {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD}) {
      const std::vector<int64_t> lq = {40, 0, 129, 3}, lk = {70, 5, 100, 3};
      Case packed = varlen(with_sinks(softcapped(make(BF16, 1, 1, 1, 4, 2, 40, true), 6.0f)), lq, lk);
      CpuContext ctx;
      const Inputs in = make_inputs(packed);
      const ForwardResult whole = run_forward(ctx.get(), packed, in, alg);
      int64_t q0 = 0, k0 = 0;
      for (size_t b = 0; b < lq.size(); ++b) {
        if (lq[b] > 0 && lk[b] > 0) {
          Case one = make(BF16, 1, lq[b], lk[b], 4, 2, 40, true);
          one.softcap = 6.0f;
          one.sinks = true;
          Inputs single = make_inputs(one);
          single.sinks = in.sinks;
          for (int64_t i = 0; i < lq[b]; ++i)
            for (int64_t h = 0; h < 4; ++h)
              for (int64_t x = 0; x < 40; ++x) single.q.set(0, i, h, x, in.q.get(0, q0 + i, h, x));
          for (int64_t j = 0; j < lk[b]; ++j)
            for (int64_t h = 0; h < 2; ++h)
              for (int64_t x = 0; x < 40; ++x) {
                single.k.set(0, j, h, x, in.k.get(0, k0 + j, h, x));
                single.v.set(0, j, h, x, in.v.get(0, k0 + j, h, x));
              }
          const ForwardResult alone = run_forward(ctx.get(), one, single, alg);
          int mismatches = 0;
          for (int64_t i = 0; i < lq[b]; ++i)
            for (int64_t h = 0; h < 4; ++h) {
              for (int64_t x = 0; x < 40; ++x)
                mismatches += alone.out.get(0, i, h, x) != whole.out.get(0, q0 + i, h, x);
              mismatches += alone.lse.get(0, h, i) != whole.lse.get(0, h, q0 + i);
            }
          CHECK_MESSAGE(mismatches == 0, "sequence ", b);
        }
        q0 += lq[b];
        k0 += lk[b];
      }
    }
  }

  TEST_CASE("rows past the last offset are neither read nor written") {
    // The packed tensors hold 5 more rows than the offsets cover: NaN in the inputs there, NaN
    // poison in the outputs, which must stay; the covered rows equal those of the exact fit.
    Case c = varlen(with_sinks(make(F32, 1, 1, 1, 2, 1, 16, true)), {20, 9}, {31, 4});
    CpuContext ctx;
    const Inputs in = make_inputs(c);
    const ForwardResult exact = run_forward(ctx.get(), c, in, FLASHATTN_ALGORITHM_FLASH);
    const BackwardResult exact_g = run_backward(ctx.get(), c, in, exact, FLASHATTN_ALGORITHM_FLASH);
    constexpr int64_t kExtra = 5;
    const int64_t tq = c.total_q(), tk = c.total_k();
    const auto grow = [&](const HostTensor& t, int64_t rows, int64_t heads, int64_t d, bool poison) {
      HostTensor g = HostTensor::make(F32, 1, rows + kExtra, heads, d);
      g.poison();
      if (!poison)
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t h = 0; h < heads; ++h)
            for (int64_t x = 0; x < d; ++x) g.set(0, i, h, x, t.get(0, i, h, x));
      return g;
    };
    const auto drop = [](flashattn_tensor_t t) {
      for (int i = 1; i < t.rank; ++i) {
        t.shape[i - 1] = t.shape[i];
        t.strides[i - 1] = t.strides[i];
      }
      --t.rank;
      return t;
    };
    const HostTensor q = grow(in.q, tq, 2, 16, false), k = grow(in.k, tk, 1, 16, false);
    const HostTensor v = grow(in.v, tk, 1, 16, false), dout = grow(in.dout, tq, 2, 16, false);
    const HostTensor out = grow(in.q, tq, 2, 16, true), dq = grow(in.q, tq, 2, 16, true);
    const HostTensor dk = grow(in.k, tk, 1, 16, true), dv = grow(in.v, tk, 1, 16, true);
    HostTensor lse = HostTensor::lse(1, 2, tq + kExtra);
    lse.poison();
    HostTensor dsinks = HostTensor::vector(2);
    flashattn_tensor_t vq = drop(q.view()), vk = drop(k.view()), vv = drop(v.view());
    flashattn_tensor_t vo = drop(out.view()), vl = drop(lse.view()), vdo = drop(dout.view());
    flashattn_tensor_t vdq = drop(dq.view()), vdk = drop(dk.view()), vdv = drop(dv.view());
    flashattn_tensor_t vs = in.sinks.view(), vds = dsinks.view();
    flashattn_tensor_t cu_q{}, cu_k{};
    for (auto* t : {&cu_q, &cu_k}) {
      t->dtype = FLASHATTN_DTYPE_INT32;
      t->rank = 1;
      t->shape[0] = 3;
      t->strides[0] = 1;
    }
    cu_q.data = const_cast<int32_t*>(in.cu_seqlens_q.data());
    cu_k.data = const_cast<int32_t*>(in.cu_seqlens_k.data());
    flashattn_options_t o = options_for(c, FLASHATTN_ALGORITHM_FLASH);
    flashattn_args_t a = FLASHATTN_ARGS_INIT;
    a.options = &o;
    a.q = &vq;
    a.k = &vk;
    a.v = &vv;
    a.out = &vo;
    a.lse = &vl;
    a.dout = &vdo;
    a.dq = &vdq;
    a.dk = &vdk;
    a.dv = &vdv;
    a.sinks = &vs;
    a.dsinks = &vds;
    a.cu_seqlens_q = &cu_q;
    a.cu_seqlens_k = &cu_k;
    a.max_seqlen_q = c.seqlen_q;
    a.max_seqlen_k = c.seqlen_k;
    REQUIRE_MESSAGE(flashattn_forward_ex(ctx.get(), &a, nullptr, 0) == FLASHATTN_SUCCESS,
                    flashattn_last_error());
    REQUIRE_MESSAGE(flashattn_backward_ex(ctx.get(), &a, nullptr, 0) == FLASHATTN_SUCCESS,
                    flashattn_last_error());
    const struct {
      const char* name;
      const HostTensor& got;
      const HostTensor& want;
      int64_t rows, heads, d;
    } checks[] = {{"out", out, exact.out, tq, 2, 16}, {"dq", dq, exact_g.dq, tq, 2, 16},
                  {"dk", dk, exact_g.dk, tk, 1, 16}, {"dv", dv, exact_g.dv, tk, 1, 16}};
    for (const auto& ch : checks) {
      int wrong = 0, written = 0;
      for (int64_t i = 0; i < ch.rows + kExtra; ++i)
        for (int64_t h = 0; h < ch.heads; ++h)
          for (int64_t x = 0; x < ch.d; ++x) {
            const double g = ch.got.get(0, i, h, x);
            if (i >= ch.rows) written += !std::isnan(g);
            else wrong += g != ch.want.get(0, i, h, x);
          }
      CHECK_MESSAGE(wrong == 0, ch.name, ": rows the offsets cover differ from the exact fit");
      CHECK_MESSAGE(written == 0, ch.name, ": rows past the last offset were written");
    }
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = tq; i < tq + kExtra; ++i) CHECK(std::isnan(lse.get(0, h, i)));
    CHECK(dsinks.snapshot() == exact_g.dsinks.snapshot());
  }
}
