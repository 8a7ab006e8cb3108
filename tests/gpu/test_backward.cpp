// Backward numerics on the GPU: dq, dk, dv of both algorithms, checked as the forward's
// outputs are (standard: emulation and float64; flash: the tolerance rule with the standard as
// base); GQA/MQA reductions of dk and dv; bit-identical results with deterministic = 1.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "gpu_harness.hpp"

namespace {

using gpu_test::Case;
using gpu_test::FlashTally;
using gpu_test::HostTensor;
using gpu_test::Layout;

constexpr flashattn_dtype_t F16 = FLASHATTN_DTYPE_FLOAT16;
constexpr flashattn_dtype_t BF16 = FLASHATTN_DTYPE_BFLOAT16;

const Case kSweep[] = {
    {"1x1", BF16, 1, 1, 1, 1, 1, 32, false, 0.0f, Layout::Contiguous},
    {"17x17 causal", F16, 2, 17, 17, 3, 3, 40, true, 0.0f, Layout::Contiguous},
    {"64x64 GQA", BF16, 2, 64, 64, 4, 2, 64, false, 0.0f, Layout::Contiguous},
    {"65x65 MQA causal", F16, 1, 65, 65, 4, 1, 80, true, 0.0f, Layout::Contiguous},
    {"113x203 causal padded", BF16, 1, 113, 203, 2, 2, 96, true, 0.0f, Layout::Padded},
    {"239x1 GQA", F16, 1, 239, 1, 4, 2, 128, false, 0.0f, Layout::Contiguous},
    {"1x239 causal", BF16, 2, 1, 239, 2, 2, 160, true, 0.0f, Layout::Contiguous},
    {"799x3 causal (rows with no key)", F16, 1, 799, 3, 2, 2, 192, true, 0.0f, Layout::Contiguous},
    {"1023x1024", BF16, 1, 1023, 1024, 1, 1, 200, false, 0.0f, Layout::Contiguous},
    {"128x128 causal", BF16, 1, 128, 128, 2, 2, 256, true, 0.0f, Layout::Contiguous},
    {"200x200 packed QKV GQA causal", F16, 1, 200, 200, 4, 2, 128, true, 0.0f, Layout::PackedQKV},
    {"203x113 causal GQA padded", F16, 1, 203, 113, 6, 2, 64, true, 0.0f, Layout::Padded},
    {"97x150 K/V broadcast over batch, scale 0.3", BF16, 2, 97, 150, 2, 2, 128, false, 0.3f,
     Layout::BroadcastKV},
    {"77x91 odd strides", F16, 1, 77, 91, 2, 1, 40, true, 0.0f, Layout::PaddedOdd},
    {"150x77 causal GQA padded", BF16, 2, 150, 77, 4, 2, 256, true, 0.0f, Layout::Padded},
    {"131x300 GQA, scale 0.2", F16, 1, 131, 300, 6, 3, 256, false, 0.2f, Layout::Contiguous},
    {"190x330 GQA, d100 (on head dim 112)", BF16, 1, 190, 330, 4, 2, 100, false, 0.0f,
     Layout::Contiguous},
    {"300x520 causal, d112", F16, 1, 300, 520, 2, 2, 112, true, 0.0f, Layout::Contiguous},
};

// Largest |a - b| over the largest |b|: how far apart two runs' gradients are.
double relative_gap(const HostTensor& a, const HostTensor& b) {
  const std::vector<double> x = a.to_double(), y = b.to_double();
  double gap = 0.0, scale = 1e-30;
  for (size_t i = 0; i < x.size(); ++i) {
    gap = std::max(gap, std::fabs(x[i] - y[i]));
    scale = std::max(scale, std::fabs(y[i]));
  }
  return gap / scale;
}

}  // namespace

TEST_SUITE("gpu_backward") {

TEST_CASE("backward sweep: head dims, seqlens, causal, GQA/MQA, strided views") {
  FlashTally tally("backward sweep");
  for (const Case& c : kSweep) {
    CAPTURE(gpu_test::describe(c));
    gpu_test::check_backward_case(c, tally);
  }
}

TEST_CASE("backward: both dtypes at the fast-path head dims") {
  FlashTally tally("backward dtypes");
  const int64_t dims[] = {64, 96, 112, 128, 256};
  bool causal = true;
  for (flashattn_dtype_t dtype : {F16, BF16}) {
    for (int64_t d : dims) {
      causal = !causal;
      const Case c{"130x257 dtype sweep", dtype, 1, 130, 257, 2, 1, d, causal, 0.0f,
                   Layout::Contiguous};
      CAPTURE(gpu_test::describe(c));
      gpu_test::check_backward_case(c, tally);
    }
  }
}

TEST_CASE("backward: GQA reductions of dk and dv over 8 query heads") {
  FlashTally tally("backward GQA reductions");
  const Case gqa{"8:2 GQA", BF16, 2, 96, 160, 8, 2, 64, true, 0.0f, Layout::Contiguous};
  gpu_test::check_backward_case(gqa, tally);
  const Case mqa{"8:1 MQA", F16, 1, 150, 150, 8, 1, 128, false, 0.0f, Layout::Contiguous};
  gpu_test::check_backward_case(mqa, tally);
  const Case gqa256{"8:2 GQA d256", F16, 1, 130, 190, 8, 2, 256, true, 0.0f, Layout::Contiguous};
  gpu_test::check_backward_case(gqa256, tally);
}

TEST_CASE("backward: more than 65535 heads (one grid dimension, no 65535 limit)") {
  FlashTally tally("backward many heads");
  const Case c{"3x5, 70000 heads", BF16, 1, 3, 5, 70000, 70000, 32, true, 0.0f,
               Layout::Contiguous, /*emulate=*/false};
  gpu_test::check_backward_case(c, tally);
}

TEST_CASE("backward: deterministic = 1 gives bit-identical dq, dk, dv run after run") {
  flashattn_context_t ctx = gpu_test::shared_context();
  FlashTally tally("backward determinism");
  // Each head dim with a kernel of its own on Hopper (and the sm80 one elsewhere); the long
  // cases have 8-16 key blocks adding into each query block, in turns that follow the launch.
  const Case cases[] = {
      {"GQA 4:1 causal", BF16, 2, 333, 517, 4, 1, 0, true, 0.0f, Layout::Contiguous},
      {"1040x2000 causal", BF16, 1, 1040, 2000, 2, 2, 0, true, 0.0f, Layout::Contiguous},
      {"1100x1100", F16, 1, 1100, 1100, 3, 3, 0, false, 0.0f, Layout::Contiguous},
  };
  for (const Case& shape : cases) {
    for (const int64_t d : {64, 96, 112, 128, 256}) {
      Case c = shape;
      c.d = d;
      CAPTURE(gpu_test::describe(c));
      gpu_test::Inputs in = gpu_test::make_inputs(c, 5);
      HostTensor out = gpu_test::output_like(c, c.nq, c.hq);
      HostTensor dout = gpu_test::output_like(c, c.nq, c.hq);
      out.fill_normal(6);
      dout.fill_normal(7);
      HostTensor lse = HostTensor::lse(c.b, c.hq, c.nq);
      lse.fill_normal(8, 5.0, 1.0);  // plausible log-sum-exps; the runs are compared only
      gpu_test::DeviceSet dev;
      const flashattn_tensor_t qd = dev.upload(in.q), kd = dev.upload(in.k),
                               vd = dev.upload(in.v);
      const flashattn_tensor_t od = dev.upload(out), dod = dev.upload(dout), ld = dev.upload(lse);

      for (flashattn_algorithm_t algorithm :
           {FLASHATTN_ALGORITHM_STANDARD, FLASHATTN_ALGORITHM_FLASH}) {
        const flashattn_options_t opts =
            gpu_test::options_for(c, algorithm, /*deterministic=*/1);
        if (algorithm == FLASHATTN_ALGORITHM_FLASH &&
            !tally.supported(ctx, qd, kd, vd, opts, 1, c)) {
          continue;
        }
        CAPTURE(algorithm);
        // Runs 0 and 1 deterministic, run 2 in the default mode.
        HostTensor runs[3][3];
        for (int r = 0; r < 3; ++r) {
          HostTensor* run = runs[r];
          gpu_test::poisoned_gradients(c, run);
          const flashattn_tensor_t dqd = dev.upload(run[0]), dkd = dev.upload(run[1]),
                                   dvd = dev.upload(run[2]);
          const flashattn_options_t o =
              r < 2 ? opts : gpu_test::options_for(c, algorithm, /*deterministic=*/0);
          GPU_FA_OK(flashattn_backward(ctx, &qd, &kd, &vd, &od, &dod, &ld, &dqd, &dkd, &dvd,
                                       &o, nullptr, 0));
          GPU_FA_OK(flashattn_context_synchronize(ctx));
          for (int i = 0; i < 3; ++i) dev.download(run[i]);
        }
        if (algorithm == FLASHATTN_ALGORITHM_FLASH) tally.ran();
        CHECK_MESSAGE(gpu_test::same_bytes(runs[0][0], runs[1][0]), "dq differs between runs");
        CHECK_MESSAGE(gpu_test::same_bytes(runs[0][1], runs[1][1]), "dk differs between runs");
        CHECK_MESSAGE(gpu_test::same_bytes(runs[0][2], runs[1][2]), "dv differs between runs");
        // The turns change only the order of dQ's fp32 sums: an add lost or taken twice would
        // be a gap of the gradient's own size, rounding a few units of the last place.
        constexpr double kOrderGap = 1.0 / 64;
        for (int i = 0; i < 3; ++i) {
          CAPTURE(i);
          CHECK(relative_gap(runs[0][i], runs[2][i]) <= kOrderGap);
        }
      }
    }
  }
}

TEST_CASE("backward large: 4224x4224, causal") {
  FlashTally tally("backward large");
  const Case c{"4224x4224 causal", BF16, 1, 4224, 4224, 2, 2, 64, true, 0.0f,
               Layout::Contiguous, /*emulate=*/false};
  gpu_test::check_backward_case(c, tally);
}

}  // TEST_SUITE
