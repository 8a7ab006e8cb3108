// NaN and infinity in the inputs. Where the causal mask hides a value (a key a query row does not
// see, a row that sees no key) it never reaches a result: every result that does not depend on
// it is bit for bit what it is with finite values there, and a row without keys is 0 / -inf.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>

#include "cpu/harness.hpp"

using namespace flashattn_test;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Causal, Nq > Nk: query i sees keys [0, i - 29]; rows 0..29 see none. Key 50 is first seen by
// row 80, which lies in the query tile of rows 64..127: that tile's rows 64..79 must not see it.
// Key 51 as well (row 81 first): the bf16 kernels multiply keys in pairs, 50 the lower half of
// one and 51 the upper.
constexpr int64_t kNq = 100, kNk = 70, kNoKeyRows = 30;
constexpr int64_t kHiddenKeys[] = {50, 51};
constexpr int64_t first_row_seeing(int64_t key) { return key + kNq - kNk; }

Case make(flashattn_dtype_t dtype) {
  Case c;
  c.dtype = dtype;
  c.seqlen_q = kNq;
  c.seqlen_k = kNk;
  c.heads_q = 2;
  c.heads_kv = 1;  // GQA: dk and dv sum over both query heads
  c.head_dim = 16;
  c.causal = true;
  c.seed = 5;
  return c;
}

void poison_key(HostTensor* t, int64_t key) { t->set_nonfinite_row(key); }
void poison_keyless_rows(HostTensor* t) { t->set_nonfinite_rows(kNoKeyRows); }

const char* algorithm_name(flashattn_algorithm_t alg) {
  return alg == FLASHATTN_ALGORITHM_FLASH ? "flash" : "standard";
}

// Rows [0, rows_end) of a [1, N, H, D] result equal between two runs (== on every element: a
// NaN never matches).
void expect_rows_equal(const std::string& what, const HostTensor& got, const HostTensor& want,
                       int64_t rows_end, int64_t skip_row = -1) {
  int64_t mismatches = 0, first = -1;
  for (int64_t i = 0; i < rows_end; ++i) {
    if (i == skip_row) continue;
    for (int64_t h = 0; h < got.shape(2); ++h)
      for (int64_t x = 0; x < got.shape(3); ++x) {
        if (!(got.get(0, i, h, x) == want.get(0, i, h, x))) {
          if (first < 0) first = i;
          ++mismatches;
        }
      }
  }
  CHECK_MESSAGE(mismatches == 0, what, ": ", mismatches, " elements differ, the first in row ",
                first);
}

void expect_keyless_rows_empty(const std::string& what, const ForwardResult& f) {
  for (int64_t h = 0; h < f.out.shape(2); ++h)
    for (int64_t i = 0; i < kNoKeyRows; ++i) {
      CHECK_MESSAGE(f.lse.get(0, h, i) == -kInf, what, ": lse of row ", i);
      for (int64_t x = 0; x < f.out.shape(3); ++x) {
        CHECK_MESSAGE(f.out.get(0, i, h, x) == 0.0, what, ": out of row ", i);
      }
    }
}

void expect_lse_rows_equal(const std::string& what, const HostTensor& got, const HostTensor& want,
                           int64_t rows_end) {
  for (int64_t h = 0; h < got.shape(1); ++h)
    for (int64_t i = 0; i < rows_end; ++i) {
      CHECK_MESSAGE(got.get(0, h, i) == want.get(0, h, i), what, ": lse of row ", i);
    }
}

// Runs check(case, algorithm, name, context) for every dtype and both algorithms.
template <class Check>
void for_each_dtype_and_algorithm(Check&& check) {
  for (flashattn_dtype_t dtype :
       {FLASHATTN_DTYPE_FLOAT32, FLASHATTN_DTYPE_FLOAT16, FLASHATTN_DTYPE_BFLOAT16})
    for (flashattn_algorithm_t alg : {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD}) {
      const Case c = make(dtype);
      CpuContext ctx;
      check(c, alg, c.name() + " " + algorithm_name(alg), ctx.get());
    }
}

}  // namespace

TEST_SUITE("cpu_nonfinite") {
  TEST_CASE("forward: values the mask hides never reach out or lse") {
    for_each_dtype_and_algorithm([](const Case& c, flashattn_algorithm_t alg,
                                    const std::string& name, flashattn_context_t ctx) {
      const ForwardResult want = run_forward(ctx, c, make_inputs(c), alg);
      expect_keyless_rows_empty(name + " clean", want);

      // Inf and NaN in v, then in k, at a key the rows before first_row_seeing(key) do not see.
      for (const int64_t key : kHiddenKeys)
        for (int which = 0; which < 2; ++which) {
          Inputs in = make_inputs(c);
          poison_key(which == 0 ? &in.v : &in.k, key);
          const std::string what = name + (which == 0 ? ", v" : ", k") +
                                   " poisoned at hidden key " + std::to_string(key);
          const ForwardResult got = run_forward(ctx, c, in, alg);
          expect_rows_equal(what + ": out", got.out, want.out, first_row_seeing(key));
          expect_lse_rows_equal(what, got.lse, want.lse, first_row_seeing(key));
          expect_keyless_rows_empty(what, got);
        }
      // NaN and inf in q at the rows that see no key.
      Inputs in = make_inputs(c);
      poison_keyless_rows(&in.q);
      const ForwardResult got = run_forward(ctx, c, in, alg);
      expect_rows_equal(name + ", q poisoned in rows without keys: out", got.out, want.out, kNq);
      expect_lse_rows_equal(name + ", q poisoned in rows without keys", got.lse, want.lse, kNq);
    });
  }

  TEST_CASE("backward: values the mask hides never reach dq, dk or dv") {
    for_each_dtype_and_algorithm([](const Case& c, flashattn_algorithm_t alg,
                                    const std::string& name, flashattn_context_t ctx) {
      const Inputs clean = make_inputs(c);
      // Every run gets the clean forward's out and lse, so that only the poisoned input differs.
      const ForwardResult fwd = run_forward(ctx, c, clean, alg);
      const BackwardResult want = run_backward(ctx, c, clean, fwd, alg);

      for (const int64_t key : kHiddenKeys) {
        const std::string at = " poisoned at key " + std::to_string(key);
        // v at the hidden key: only the rows that see it (dq) and that key's dk may change.
        Inputs in = make_inputs(c);
        poison_key(&in.v, key);
        BackwardResult got = run_backward(ctx, c, in, fwd, alg);
        expect_rows_equal(name + ", v" + at + ": dq", got.dq, want.dq, first_row_seeing(key));
        expect_rows_equal(name + ", v" + at + ": dk", got.dk, want.dk, kNk, key);
        expect_rows_equal(name + ", v" + at + ": dv", got.dv, want.dv, kNk);

        // k at the hidden key: the rows that see it (dq), and that key's dk and dv.
        in = make_inputs(c);
        poison_key(&in.k, key);
        got = run_backward(ctx, c, in, fwd, alg);
        expect_rows_equal(name + ", k" + at + ": dq", got.dq, want.dq, first_row_seeing(key));
        expect_rows_equal(name + ", k" + at + ": dk", got.dk, want.dk, kNk, key);
        expect_rows_equal(name + ", k" + at + ": dv", got.dv, want.dv, kNk, key);
      }

      // q, dout and out in the rows that see no key: nothing changes.
      Inputs in = make_inputs(c);
      poison_keyless_rows(&in.q);
      poison_keyless_rows(&in.dout);
      ForwardResult poisoned_fwd = fwd;
      poisoned_fwd.out = make_output(c, false, c.head_dim);
      poisoned_fwd.out.from_double(fwd.out.to_double());
      poison_keyless_rows(&poisoned_fwd.out);
      const BackwardResult got = run_backward(ctx, c, in, poisoned_fwd, alg);
      expect_rows_equal(name + ", rows without keys poisoned: dq", got.dq, want.dq, kNq);
      expect_rows_equal(name + ", rows without keys poisoned: dk", got.dk, want.dk, kNk);
      expect_rows_equal(name + ", rows without keys poisoned: dv", got.dv, want.dv, kNk);
    });
  }
}
