// NaN and infinity where the causal mask hides them, on the GPU, both algorithms: every result
// that does not depend on them matches the run with finite values there (to an ulp or two: the
// standard algorithm recomputes the elements a GEMM spoiled, in its own order), and a row that
// sees no key is exactly 0 / -inf. The header's rule; the CPU backend's tests check the same.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "gpu_harness.hpp"
#include "standard_emulation.hpp"

namespace {

using gpu_test::Case;
using gpu_test::DeviceSet;
using gpu_test::HostTensor;
using gpu_test::Layout;

constexpr double kInf = std::numeric_limits<double>::infinity();

// Causal, Nq > Nk: query i sees keys [0, i - 99]; rows 0..99 see none. Key 100 is first seen by
// row 200; rows 128..199 share query tiles with rows that see it in every kernel's tiling.
constexpr int64_t kNq = 300, kNk = 200, kNoKeyRows = 100, kKey = 100, kFirstRowSeeingKey = 200;

Case masked_case(flashattn_dtype_t dtype, int64_t head_dim) {
  return Case{"masked", dtype, 1, kNq, kNk, 2, 1, head_dim, true, 0.0f, Layout::Contiguous};
}

void poison_key(HostTensor* t) { t->set_nonfinite_row(kKey); }
void poison_keyless_rows(HostTensor* t) { t->set_nonfinite_rows(kNoKeyRows); }

// Rows [0, rows_end) but `skip` of a [1, N, H, D] result, as doubles.
std::vector<double> rows_of(const HostTensor& t, int64_t rows_end, int64_t skip = -1) {
  std::vector<double> r;
  for (int64_t i = 0; i < rows_end; ++i)
    for (int64_t h = 0; h < t.shape(2) && i != skip; ++h)
      for (int64_t x = 0; x < t.shape(3); ++x) r.push_back(t.get(0, i, h, x));
  return r;
}

void expect_close(const std::string& what, const std::vector<double>& got,
                  const std::vector<double>& want, flashattn_dtype_t dtype) {
  const flashattn_test::Comparison c =
      flashattn_test::check_close(what, got, want, gpu_test::emulation_tolerance(dtype, want));
  CHECK_MESSAGE(c.ok, c.message);
}

const char* name_of(flashattn_algorithm_t alg) {
  return alg == FLASHATTN_ALGORITHM_FLASH ? "flash" : "standard";
}

// Forward on the device; false when the algorithm declines the problem (flash not built).
// window_left >= 0: a sliding window of that many keys left of the diagonal (causal on the
// right).
bool forward(const Case& c, flashattn_algorithm_t alg, const gpu_test::Inputs& in,
             HostTensor* out, HostTensor* lse, int32_t window_left = -1) {
  flashattn_context_t ctx = gpu_test::shared_context();
  DeviceSet dev;
  const flashattn_tensor_t q = dev.upload(in.q), k = dev.upload(in.k), v = dev.upload(in.v);
  *out = gpu_test::output_like(c, c.nq, c.hq);
  *lse = HostTensor::lse(c.b, c.hq, c.nq);
  out->poison();
  lse->poison();
  const flashattn_tensor_t o = dev.upload(*out), l = dev.upload(*lse);
  flashattn_options_t opts = gpu_test::options_for(c, alg);
  if (window_left >= 0) {
    opts.window = 1;
    opts.window_left = window_left;
    opts.window_right = 0;
  }
  const flashattn_status_t st = flashattn_forward(ctx, &q, &k, &v, &o, &l, &opts, nullptr, 0);
  if (st == FLASHATTN_ERROR_UNSUPPORTED) return false;
  GPU_FA_OK(st);
  GPU_FA_OK(flashattn_context_synchronize(ctx));
  dev.download(*out);
  dev.download(*lse);
  return true;
}

bool backward(const Case& c, flashattn_algorithm_t alg, const gpu_test::Inputs& in,
              const HostTensor& out, const HostTensor& lse, const HostTensor& dout,
              HostTensor grads[3]) {
  flashattn_context_t ctx = gpu_test::shared_context();
  DeviceSet dev;
  const flashattn_tensor_t q = dev.upload(in.q), k = dev.upload(in.k), v = dev.upload(in.v);
  const flashattn_tensor_t o = dev.upload(out), l = dev.upload(lse), g = dev.upload(dout);
  gpu_test::poisoned_gradients(c, grads);
  const flashattn_tensor_t dq = dev.upload(grads[0]), dk = dev.upload(grads[1]),
                           dv = dev.upload(grads[2]);
  const flashattn_options_t opts = gpu_test::options_for(c, alg);
  const flashattn_status_t st =
      flashattn_backward(ctx, &q, &k, &v, &o, &g, &l, &dq, &dk, &dv, &opts, nullptr, 0);
  if (st == FLASHATTN_ERROR_UNSUPPORTED) return false;
  GPU_FA_OK(st);
  GPU_FA_OK(flashattn_context_synchronize(ctx));
  for (int i = 0; i < 3; ++i) dev.download(grads[i]);
  return true;
}

void check_forward_hidden_nonfinite(flashattn_algorithm_t alg) {
  for (flashattn_dtype_t dtype : {FLASHATTN_DTYPE_FLOAT16, FLASHATTN_DTYPE_BFLOAT16})
    for (int64_t d : {64, 128}) {
      const Case c = masked_case(dtype, d);
      CAPTURE(gpu_test::describe(c) + " " + name_of(alg));
      const gpu_test::Inputs clean = gpu_test::make_inputs(c, 3);
      HostTensor want_out, want_lse, out, lse;
      if (!forward(c, alg, clean, &want_out, &want_lse)) continue;
      for (int which = 0; which < 3; ++which) {
        CAPTURE(which);  // 0: v at the hidden key, 1: k there, 2: q in the rows without keys
        gpu_test::Inputs in = gpu_test::make_inputs(c, 3);
        if (which < 2) poison_key(which == 0 ? &in.v : &in.k);
        if (which == 2) poison_keyless_rows(&in.q);
        REQUIRE(forward(c, alg, in, &out, &lse));
        const int64_t unaffected = which < 2 ? kFirstRowSeeingKey : kNq;
        expect_close("out", rows_of(out, unaffected), rows_of(want_out, unaffected), dtype);
        for (int64_t h = 0; h < c.hq; ++h)
          for (int64_t i = 0; i < kNoKeyRows; ++i) {
            CHECK(lse.get(0, h, i) == -kInf);
            for (int64_t x = 0; x < d; ++x) CHECK(out.get(0, i, h, x) == 0.0);
          }
        for (int64_t h = 0; h < c.hq; ++h)
          for (int64_t i = kNoKeyRows; i < unaffected; ++i) {
            const double want_l = want_lse.get(0, h, i);
            CHECK(std::fabs(lse.get(0, h, i) - want_l) <= 1e-5 * (1.0 + std::fabs(want_l)));
          }
      }
    }
}

// One query token under a sliding window (the flash forward's decode kernel): keys left of the
// window hold NaN and infinities, one in a key block the window never reaches and one in the
// block where it starts; the result is the clean run's.
void check_decode_hidden_nonfinite(flashattn_algorithm_t alg) {
  constexpr int64_t kKeys = 500, kLeft = 200, kFarKey = 100, kNearKey = 298;  // sees 299..499
  for (flashattn_dtype_t dtype : {FLASHATTN_DTYPE_FLOAT16, FLASHATTN_DTYPE_BFLOAT16})
    for (int64_t d : {64, 128}) {
      const Case c{"decode", dtype, 1, 1, kKeys, 8, 2, d, true, 0.0f, Layout::Contiguous};
      CAPTURE(gpu_test::describe(c) + " " + name_of(alg));
      const gpu_test::Inputs clean = gpu_test::make_inputs(c, 7);
      HostTensor want_out, want_lse, out, lse;
      if (!forward(c, alg, clean, &want_out, &want_lse, kLeft)) continue;
      for (int which = 0; which < 2; ++which) {
        CAPTURE(which);  // 0: v, 1: k
        gpu_test::Inputs in = gpu_test::make_inputs(c, 7);
        HostTensor* t = which == 0 ? &in.v : &in.k;
        t->set_nonfinite_row(kFarKey);
        t->set_nonfinite_row(kNearKey);
        REQUIRE(forward(c, alg, in, &out, &lse, kLeft));
        expect_close("out", rows_of(out, 1), rows_of(want_out, 1), dtype);
        for (int64_t h = 0; h < c.hq; ++h) {
          const double want_l = want_lse.get(0, h, 0);
          CHECK(std::fabs(lse.get(0, h, 0) - want_l) <= 1e-5 * (1.0 + std::fabs(want_l)));
        }
      }
    }
}

// softmax_scale at +-FLASHATTN_MAX_SOFTMAX_SCALE: each query's largest score is ~1e26 above the
// next, the softmax one-hot. out is the v row of that key, LSE finite, dv sums the dout rows of
// the queries that picked each key, and no gradient is NaN (dq and dk carry the scale times
// rounding noise: the header lets them pass their dtype's range).
void check_scale_bound(flashattn_algorithm_t alg) {
  for (flashattn_dtype_t dtype : {FLASHATTN_DTYPE_FLOAT16, FLASHATTN_DTYPE_BFLOAT16})
    for (float scale : {FLASHATTN_MAX_SOFTMAX_SCALE, -FLASHATTN_MAX_SOFTMAX_SCALE})
      for (bool causal : {false, true}) {
        const Case c{"scale-bound", dtype, 1, 70, 90, 2, 1, 64, causal, scale, Layout::Contiguous};
        CAPTURE(gpu_test::describe(c) + " " + name_of(alg));
        const gpu_test::Inputs in = gpu_test::make_inputs(c, 11);
        HostTensor out, lse;
        if (!forward(c, alg, in, &out, &lse)) continue;
        HostTensor dout = gpu_test::output_like(c, c.nq, c.hq);
        dout.fill_normal(21);
        HostTensor grads[3];
        REQUIRE(backward(c, alg, in, out, lse, dout, grads));
        std::vector<double> want_dv(static_cast<size_t>(c.nk * c.d), 0.0);
        const int64_t off = c.nk - c.nq;
        for (int64_t h = 0; h < c.hq; ++h)
          for (int64_t i = 0; i < c.nq; ++i) {
            CHECK(std::isfinite(lse.get(0, h, i)));
            const int64_t visible = causal ? std::min(c.nk, i + off + 1) : c.nk;
            int64_t best = 0;
            double best_score = -kInf;
            for (int64_t j = 0; j < visible; ++j) {
              double s = 0;
              for (int64_t x = 0; x < c.d; ++x) s += in.q.get(0, i, h, x) * in.k.get(0, j, 0, x);
              s *= scale;
              if (s > best_score) best_score = s, best = j;
            }
            for (int64_t x = 0; x < c.d; ++x) {
              CHECK(out.get(0, i, h, x) == in.v.get(0, best, 0, x));
              want_dv[static_cast<size_t>(best * c.d + x)] += dout.get(0, i, h, x);
            }
          }
        for (int g = 0; g < 2; ++g)
          for (double x : grads[g].to_double()) REQUIRE(!std::isnan(x));
        std::vector<double> got_dv;
        for (int64_t j = 0; j < c.nk; ++j)
          for (int64_t x = 0; x < c.d; ++x) got_dv.push_back(grads[2].get(0, j, 0, x));
        expect_close("dv", got_dv, want_dv, dtype);
      }
}

void check_backward_hidden_nonfinite(flashattn_algorithm_t alg) {
  for (flashattn_dtype_t dtype : {FLASHATTN_DTYPE_FLOAT16, FLASHATTN_DTYPE_BFLOAT16})
    for (int64_t d : {64, 128}) {
      const Case c = masked_case(dtype, d);
      CAPTURE(gpu_test::describe(c) + " " + name_of(alg));
      const gpu_test::Inputs clean = gpu_test::make_inputs(c, 5);
      HostTensor out, lse;
      if (!forward(c, alg, clean, &out, &lse)) continue;
      HostTensor dout = gpu_test::output_like(c, c.nq, c.hq);
      dout.fill_normal(15);
      HostTensor want[3], got[3];
      if (!backward(c, alg, clean, out, lse, dout, want)) continue;
      // v, then k, at the hidden key. The rows that see it may get NaN in dq, and so may the
      // dk and dv of the keys those rows see (here: all): the other rows' dq must not, and
      // dV = P^T dO never reads v.
      gpu_test::Inputs in = gpu_test::make_inputs(c, 5);
      poison_key(&in.v);
      REQUIRE(backward(c, alg, in, out, lse, dout, got));
      expect_close("dq, v poisoned", rows_of(got[0], kFirstRowSeeingKey),
                   rows_of(want[0], kFirstRowSeeingKey), dtype);
      expect_close("dv, v poisoned", rows_of(got[2], kNk), rows_of(want[2], kNk), dtype);
      in = gpu_test::make_inputs(c, 5);
      poison_key(&in.k);
      REQUIRE(backward(c, alg, in, out, lse, dout, got));
      expect_close("dq, k poisoned", rows_of(got[0], kFirstRowSeeingKey),
                   rows_of(want[0], kFirstRowSeeingKey), dtype);
      // q, dout and out in the rows without keys: nothing changes.
      in = gpu_test::make_inputs(c, 5);
      poison_keyless_rows(&in.q);
      HostTensor poisoned_out = gpu_test::output_like(c, c.nq, c.hq);
      HostTensor poisoned_dout = gpu_test::output_like(c, c.nq, c.hq);
      poisoned_out.from_double(out.to_double());
      poisoned_dout.from_double(dout.to_double());
      poison_keyless_rows(&poisoned_out);
      poison_keyless_rows(&poisoned_dout);
      REQUIRE(backward(c, alg, in, poisoned_out, lse, poisoned_dout, got));
      expect_close("dq, keyless rows poisoned", rows_of(got[0], kNq), rows_of(want[0], kNq),
                   dtype);
      expect_close("dk, keyless rows poisoned", rows_of(got[1], kNk), rows_of(want[1], kNk),
                   dtype);
      expect_close("dv, keyless rows poisoned", rows_of(got[2], kNk), rows_of(want[2], kNk),
                   dtype);
    }
}

}  // namespace

// Both algorithms must pass. The flash kernels multiply what the mask hides by 0 inside their
// MMAs (0 * inf is NaN) and then compute the rows and keys so spoiled again, exactly, over the
// pairs the mask leaves visible (lib/cuda/common/repair.cuh, bwd_repair.cuh).
TEST_SUITE("gpu_forward") {
TEST_CASE("forward, standard: a NaN or infinity the mask hides never reaches out or lse") {
  check_forward_hidden_nonfinite(FLASHATTN_ALGORITHM_STANDARD);
}
TEST_CASE("forward, flash: a NaN or infinity the mask hides never reaches out or lse") {
  check_forward_hidden_nonfinite(FLASHATTN_ALGORITHM_FLASH);
}
TEST_CASE("decode, both algorithms: a NaN or infinity left of a sliding window stays out") {
  check_decode_hidden_nonfinite(FLASHATTN_ALGORITHM_STANDARD);
  check_decode_hidden_nonfinite(FLASHATTN_ALGORITHM_FLASH);
}
}  // TEST_SUITE

TEST_SUITE("gpu_backward") {
TEST_CASE("softmax_scale at FLASHATTN_MAX_SOFTMAX_SCALE, both algorithms: a finite one-hot softmax") {
  check_scale_bound(FLASHATTN_ALGORITHM_STANDARD);
  check_scale_bound(FLASHATTN_ALGORITHM_FLASH);
}
TEST_CASE("backward, standard: a NaN or infinity the mask hides never reaches dq, dk or dv") {
  check_backward_hidden_nonfinite(FLASHATTN_ALGORITHM_STANDARD);
}
TEST_CASE("backward, flash: a NaN or infinity the mask hides never reaches dq, dk or dv") {
  check_backward_hidden_nonfinite(FLASHATTN_ALGORITHM_FLASH);
}
}  // TEST_SUITE
