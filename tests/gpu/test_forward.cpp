// Forward numerics on the GPU: the standard algorithm against its host emulation and the
// float64 reference; the flash algorithm against the float64 reference by the tolerance rule
// (base: the standard result); outputs poisoned with NaN, gaps of strided outputs checked.
#include "gpu_harness.hpp"

namespace {

using gpu_test::Case;
using gpu_test::FlashTally;
using gpu_test::Layout;

constexpr flashattn_dtype_t F16 = FLASHATTN_DTYPE_FLOAT16;
constexpr flashattn_dtype_t BF16 = FLASHATTN_DTYPE_BFLOAT16;

// The sweep: every listed head dim, seqlens that are not tile multiples, Nq != Nk both ways
// with causal (Nq > Nk leaves rows with no key), GQA and MQA, strided views, a custom scale.
const Case kSweep[] = {
    {"1x1", BF16, 1, 1, 1, 1, 1, 32, false, 0.0f, Layout::Contiguous},
    {"17x17 causal", F16, 2, 17, 17, 3, 3, 40, true, 0.0f, Layout::Contiguous},
    {"64x64 GQA", BF16, 2, 64, 64, 4, 2, 64, false, 0.0f, Layout::Contiguous},
    {"65x65 MQA causal", F16, 1, 65, 65, 4, 1, 80, true, 0.0f, Layout::Contiguous},
    {"113x203 causal padded", BF16, 2, 113, 203, 2, 2, 96, true, 0.0f, Layout::Padded},
    {"239x1 GQA", F16, 1, 239, 1, 4, 2, 128, false, 0.0f, Layout::Contiguous},
    {"1x239 causal MQA", BF16, 2, 1, 239, 2, 1, 160, true, 0.0f, Layout::Contiguous},
    {"799x3 causal (rows with no key)", F16, 1, 799, 3, 2, 2, 192, true, 0.0f, Layout::Contiguous},
    {"1023x1024", BF16, 1, 1023, 1024, 2, 1, 200, false, 0.0f, Layout::Contiguous},
    {"128x128 causal", BF16, 1, 128, 128, 2, 2, 256, true, 0.0f, Layout::Contiguous},
    {"300x300 packed QKV GQA causal", F16, 2, 300, 300, 4, 2, 128, true, 0.0f, Layout::PackedQKV},
    {"203x113 causal GQA padded", F16, 1, 203, 113, 6, 2, 64, true, 0.0f, Layout::Padded},
    {"97x150 K/V broadcast over batch, scale 0.3", BF16, 2, 97, 150, 2, 2, 128, false, 0.3f,
     Layout::BroadcastKV},
    {"77x91 odd strides", F16, 2, 77, 91, 2, 1, 40, true, 0.0f, Layout::PaddedOdd},
};

}  // namespace

TEST_SUITE("gpu_forward") {

TEST_CASE("forward sweep: head dims, seqlens, causal, GQA/MQA, strided views") {
  FlashTally tally("forward sweep");
  for (const Case& c : kSweep) {
    CAPTURE(gpu_test::describe(c));
    gpu_test::check_forward_case(c, tally);
  }
}

TEST_CASE("forward: both dtypes at the fast-path head dims") {
  FlashTally tally("forward dtypes");
  // 100, 104 and 112 run on the Hopper forward's kernel of 112 (100 and 104 through copies of
  // 112 columns).
  const int64_t dims[] = {32, 64, 96, 100, 104, 112, 128, 192, 256};
  bool causal = false;
  for (flashattn_dtype_t dtype : {F16, BF16}) {
    for (int64_t d : dims) {
      causal = !causal;
      const Case c{"130x257 dtype sweep", dtype, 1, 130, 257, 2, 1, d, causal, 0.0f,
                   Layout::Contiguous};
      CAPTURE(gpu_test::describe(c));
      gpu_test::check_forward_case(c, tally);
    }
  }
}

TEST_CASE("forward: a later key tile holds the row maximum") {
  // Keys near the end score highest: an online softmax must rescale what it accumulated.
  FlashTally tally("forward late maximum");
  Case c{"45x600, maximum in the last keys", BF16, 1, 45, 600, 2, 2, 64, false, 0.0f,
         Layout::Contiguous};
  c.late_max_keys = 16;
  gpu_test::check_forward_case(c, tally);
}

TEST_CASE("forward: more tiles than SMs (a persistent grid walks several per CTA)") {
  // 132 SMs on an H200: each case has more query-block tiles than that, so CTAs carry their
  // pipeline state from tile to tile; the causal Nq > Nk case mixes in tiles with no key.
  FlashTally tally("forward many tiles");
  const Case cases[] = {
      {"520x600 GQA, 160 tiles", BF16, 1, 520, 600, 32, 8, 64, false, 0.0f, Layout::Contiguous,
       /*emulate=*/false},
      {"600x600 causal GQA, 160 tiles", F16, 2, 600, 600, 16, 4, 128, true, 0.0f,
       Layout::Contiguous, /*emulate=*/false},
      {"900x200 causal, empty tiles among 320", BF16, 2, 900, 200, 20, 20, 128, true, 0.0f,
       Layout::Contiguous, /*emulate=*/false},
      {"300x310 causal GQA, 144 tiles", BF16, 2, 300, 310, 24, 6, 256, true, 0.0f,
       Layout::Contiguous, /*emulate=*/false},
      {"400x400, 192 head dim, 160 tiles", F16, 2, 400, 400, 40, 40, 192, false, 0.0f,
       Layout::Contiguous, /*emulate=*/false},
  };
  for (const Case& c : cases) {
    CAPTURE(gpu_test::describe(c));
    gpu_test::check_forward_case(c, tally);
  }
}

TEST_CASE("forward: rows that see many keys (the Hopper forward's long-row tiles)") {
  // At least sm90::kLongRowKeys keys a row on average: head dims 65-112 run on three consumer
  // warpgroups of 192-row tiles there, partial tiles, GQA, a causal bottom-right mask and the
  // copies of head dim 100 included.
  FlashTally tally("forward long rows");
  const Case cases[] = {
      {"200x3500, d96", BF16, 1, 200, 3500, 3, 3, 96, false, 0.0f, Layout::Contiguous,
       /*emulate=*/false},
      {"330x3400 causal GQA, d112", F16, 1, 330, 3400, 2, 1, 112, true, 0.0f,
       Layout::Contiguous, /*emulate=*/false},
      {"150x3300, d100 (copies of 112)", BF16, 1, 150, 3300, 2, 1, 100, false, 0.0f,
       Layout::Contiguous, /*emulate=*/false},
      {"100x3200 causal, d80", F16, 2, 100, 3200, 1, 1, 80, true, 0.0f, Layout::Contiguous,
       /*emulate=*/false},
  };
  for (const Case& c : cases) {
    CAPTURE(gpu_test::describe(c));
    gpu_test::check_forward_case(c, tally);
  }
}

TEST_CASE("forward: more than 65535 heads (one grid dimension, no 65535 limit)") {
  FlashTally tally("forward many heads");
  const Case c{"3x5, 70000 heads", BF16, 1, 3, 5, 70000, 70000, 32, true, 0.0f,
               Layout::Contiguous, /*emulate=*/false};
  gpu_test::check_forward_case(c, tally);
}

TEST_CASE("forward large: 4224x4224, causal") {
  FlashTally tally("forward large");
  const Case c{"4224x4224 causal", BF16, 1, 4224, 4224, 2, 2, 64, true, 0.0f,
               Layout::Contiguous, /*emulate=*/false};
  gpu_test::check_forward_case(c, tally);
}

}  // TEST_SUITE
