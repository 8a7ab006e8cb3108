// flashattn_merge on the CPU backend: a merge of any split of the keys is the unsplit attention
// (common/merge_check.hpp: the library's forward on the whole range and on the parts, compared
// by the tolerance rule), with causal masks that hide whole parts from some rows, empty parts,
// one part, many parts, every dtype, strided views, in place; then the exact cases (-inf, NaN and
// +inf LSEs, LSEs far apart), independence from the thread count, and the aliasing rules.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "common/merge_check.hpp"
#include "cpu/harness.hpp"

using namespace flashattn_test;

namespace {

constexpr flashattn_dtype_t F32 = FLASHATTN_DTYPE_FLOAT32;
constexpr flashattn_dtype_t F16 = FLASHATTN_DTYPE_FLOAT16;
constexpr flashattn_dtype_t BF16 = FLASHATTN_DTYPE_BFLOAT16;
const flashattn_dtype_t kDtypes[] = {F32, F16, BF16};
constexpr float kInf = std::numeric_limits<float>::infinity();

void run(const MergeSplitCase& c, int threads = 2) {
  CpuContext ctx(threads);
  HostMergeMemory memory(ctx.get());
  check_merge_split(c, memory);
}

// Hand-made parts for the exact cases: `parts` parts of [1, 1, heads, d] fp32 outputs (rows
// `d` floats apart, parts heads * d apart) and LSEs [1, heads, 1].
struct HandParts {
  int64_t parts, heads, d;
  std::vector<float> out, lse, merged, merged_lse;
  flashattn_tensor_t out_view{}, lse_view{}, merged_view{}, merged_lse_view{};

  HandParts(int64_t parts_, int64_t heads_, int64_t d_)
      : parts(parts_), heads(heads_), d(d_), out(parts_ * heads_ * d_), lse(parts_ * heads_),
        merged(heads_ * d_, -1.0f), merged_lse(heads_, -1.0f) {
    REQUIRE(flashattn_tensor_4d(&out_view, out.data(), F32, 1, 1, heads, d) == FLASHATTN_SUCCESS);
    REQUIRE(flashattn_tensor_lse(&lse_view, lse.data(), 1, heads, 1) == FLASHATTN_SUCCESS);
    REQUIRE(flashattn_tensor_4d(&merged_view, merged.data(), F32, 1, 1, heads, d) ==
            FLASHATTN_SUCCESS);
    REQUIRE(flashattn_tensor_lse(&merged_lse_view, merged_lse.data(), 1, heads, 1) ==
            FLASHATTN_SUCCESS);
  }
  float& o(int64_t p, int64_t h, int64_t x) { return out[(p * heads + h) * d + x]; }
  float& l(int64_t p, int64_t h) { return lse[p * heads + h]; }
  flashattn_merge_args_t args() {
    flashattn_merge_args_t a;
    flashattn_merge_args_init(&a);
    a.num_parts = parts;
    a.parts_out = &out_view;
    a.parts_out_stride = heads * d;
    a.parts_lse = &lse_view;
    a.parts_lse_stride = heads;
    a.out = &merged_view;
    a.lse = &merged_lse_view;
    return a;
  }
  flashattn_status_t merge(flashattn_context_t ctx) {
    const flashattn_merge_args_t a = args();
    return flashattn_merge(ctx, &a);
  }
};

}  // namespace

TEST_SUITE("cpu_merge") {
  TEST_CASE("a merge of split keys is the unsplit attention, every dtype") {
    for (flashattn_dtype_t dtype : kDtypes) {
      // Two parts, then three uneven ones; GQA, Nq != Nk, head dims off the tile sizes.
      run(split(dtype, 2, 13, 37, 4, 2, 24, false, {0, 20, 37}));
      run(split(dtype, 1, 9, 29, 2, 1, 40, false, {0, 1, 11, 29}));
    }
  }

  TEST_CASE("causal: whole parts hidden from the first rows") {
    for (flashattn_dtype_t dtype : kDtypes) {
      // Nq == Nk: row i sees keys 0..i, so the later parts are -inf for the early rows.
      run(split(dtype, 2, 33, 33, 2, 2, 16, true, {0, 8, 17, 33}));
      // Nq > Nk: the first Nq - Nk rows see no key at all (0 and -inf after the merge).
      run(split(dtype, 1, 21, 12, 3, 1, 8, true, {0, 5, 12}));
    }
  }

  TEST_CASE("empty parts add nothing, whatever their output holds") {
    for (flashattn_dtype_t dtype : kDtypes) {
      run(split(dtype, 2, 10, 30, 2, 1, 32, false, {0, 0, 15, 15, 30, 30}));
      run(split(dtype, 1, 12, 12, 2, 2, 16, true, {0, 6, 6, 12}));
    }
  }

  TEST_CASE("one part is the identity") {
    for (flashattn_dtype_t dtype : kDtypes) run(split(dtype, 2, 7, 19, 2, 2, 20, true, {0, 19}));
  }

  TEST_CASE("many parts") {
    for (flashattn_dtype_t dtype : kDtypes) {
      run(split(dtype, 1, 17, 70, 4, 2, 64, false, {0, 10, 20, 30, 40, 50, 60, 70}));
      run(split(dtype, 2, 70, 70, 2, 1, 32, true, {0, 3, 9, 20, 33, 34, 52, 70}));
    }
  }

  TEST_CASE("strided views, in place, without the LSE, head_dim past one chunk") {
    for (flashattn_dtype_t dtype : kDtypes) {
      MergeSplitCase padded = split(dtype, 2, 11, 26, 2, 1, 24, true, {0, 9, 26});
      padded.pad = 3;
      run(padded);
      MergeSplitCase in_place = split(dtype, 2, 11, 26, 4, 2, 16, true, {0, 4, 13, 26});
      in_place.in_place = true;
      run(in_place);
      in_place.pad = 8;
      run(in_place);
      MergeSplitCase no_lse = split(dtype, 1, 5, 18, 2, 2, 8, false, {0, 6, 18});
      no_lse.with_lse = false;
      run(no_lse);
    }
    // head_dim 256 is one chunk of the accumulator exactly.
    run(split(F32, 1, 6, 20, 1, 1, 256, false, {0, 7, 20}));
  }

  TEST_CASE("every instruction set's copy of the merge") {
    // FLASHATTN_CPU_ISA lowers the instruction set a context created after it picks.
    for (const char* isa : kCpuKernelsNames) {
      INFO("FLASHATTN_CPU_ISA=", isa);
      setenv("FLASHATTN_CPU_ISA", isa, 1);
      for (flashattn_dtype_t dtype : kDtypes) {
        run(split(dtype, 1, 9, 40, 2, 1, 48, true, {0, 13, 13, 40}));
      }
      unsetenv("FLASHATTN_CPU_ISA");
    }
  }

  TEST_CASE("the result does not depend on the thread count") {
    HandParts one(5, 300, 24), many(5, 300, 24);
    for (int64_t p = 0; p < 5; ++p)
      for (int64_t h = 0; h < 300; ++h) {
        one.l(p, h) = many.l(p, h) = std::sin(static_cast<float>(p * 300 + h)) * 4.0f;
        for (int64_t x = 0; x < 24; ++x)
          one.o(p, h, x) = many.o(p, h, x) = std::cos(static_cast<float>((p * 300 + h) * 24 + x));
      }
    CpuContext serial(1), parallel(3);
    REQUIRE(one.merge(serial.get()) == FLASHATTN_SUCCESS);
    REQUIRE(many.merge(parallel.get()) == FLASHATTN_SUCCESS);
    CHECK(std::memcmp(one.merged.data(), many.merged.data(), one.merged.size() * 4) == 0);
    CHECK(std::memcmp(one.merged_lse.data(), many.merged_lse.data(), one.merged_lse.size() * 4) ==
          0);
  }
}

TEST_SUITE("cpu_merge_exact") {
  TEST_CASE("-inf LSEs: no contribution; every part -inf: output 0 and LSE -inf") {
    CpuContext ctx;
    HandParts hp(3, 2, 4);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int64_t x = 0; x < 4; ++x) {
      hp.o(0, 0, x) = nan;  // hidden behind -inf
      hp.o(1, 0, x) = 2.0f + x;
      hp.o(2, 0, x) = kInf;  // hidden behind -inf
      for (int64_t p = 0; p < 3; ++p) hp.o(p, 1, x) = nan;
    }
    hp.l(0, 0) = -kInf;
    hp.l(1, 0) = 0.75f;
    hp.l(2, 0) = -kInf;
    for (int64_t p = 0; p < 3; ++p) hp.l(p, 1) = -kInf;
    REQUIRE(hp.merge(ctx.get()) == FLASHATTN_SUCCESS);
    for (int64_t x = 0; x < 4; ++x) {
      CHECK(hp.merged[x] == 2.0f + x);  // one part of weight 1: exact
      CHECK(hp.merged[4 + x] == 0.0f);
      CHECK_FALSE(std::signbit(hp.merged[4 + x]));
    }
    CHECK(hp.merged_lse[0] == 0.75f);
    CHECK(hp.merged_lse[1] == -kInf);
  }

  TEST_CASE("LSEs far apart do not overflow; equal LSEs average") {
    CpuContext ctx;
    HandParts hp(2, 2, 3);
    for (int64_t x = 0; x < 3; ++x) {
      hp.o(0, 0, x) = 1.0f;
      hp.o(1, 0, x) = 3.0f;
      hp.o(0, 1, x) = 1.0f;
      hp.o(1, 1, x) = 5.0f;
    }
    hp.l(0, 0) = 1000.0f;  // e^1000 overflows fp32: only differences may be exponentiated
    hp.l(1, 0) = -1000.0f;
    hp.l(0, 1) = 80.0f;
    hp.l(1, 1) = 80.0f;
    REQUIRE(hp.merge(ctx.get()) == FLASHATTN_SUCCESS);
    for (int64_t x = 0; x < 3; ++x) {
      CHECK(hp.merged[x] == 1.0f);
      CHECK(hp.merged[3 + x] == 3.0f);
    }
    CHECK(hp.merged_lse[0] == 1000.0f);
    CHECK(hp.merged_lse[1] == doctest::Approx(80.0 + std::log(2.0)).epsilon(1e-6));
  }

  TEST_CASE("a NaN LSE makes the row NaN; +inf gives LSE +inf and a NaN output") {
    CpuContext ctx;
    HandParts hp(2, 3, 2);
    for (int64_t p = 0; p < 2; ++p)
      for (int64_t h = 0; h < 3; ++h)
        for (int64_t x = 0; x < 2; ++x) hp.o(p, h, x) = 1.0f;
    hp.l(0, 0) = std::numeric_limits<float>::quiet_NaN();
    hp.l(1, 0) = 2.0f;
    hp.l(0, 1) = 2.0f;
    hp.l(1, 1) = kInf;
    hp.l(0, 2) = -kInf;  // NaN after -inf still counts
    hp.l(1, 2) = std::numeric_limits<float>::quiet_NaN();
    REQUIRE(hp.merge(ctx.get()) == FLASHATTN_SUCCESS);
    CHECK(std::isnan(hp.merged_lse[0]));
    CHECK(hp.merged_lse[1] == kInf);
    CHECK(std::isnan(hp.merged_lse[2]));
    for (int64_t i = 0; i < 6; ++i) CHECK(std::isnan(hp.merged[i]));
  }

  TEST_CASE("in place: out may be exactly one part, any other overlap is refused") {
    CpuContext ctx;
    HandParts hp(3, 2, 4);
    for (int64_t p = 0; p < 3; ++p)
      for (int64_t h = 0; h < 2; ++h) {
        hp.l(p, h) = static_cast<float>(p);
        for (int64_t x = 0; x < 4; ++x) hp.o(p, h, x) = static_cast<float>(p + 1);
      }
    // Part 1 as out, part 2's LSE as lse.
    flashattn_tensor_t part1 = hp.out_view, lse2 = hp.lse_view;
    part1.data = hp.out.data() + 1 * 8;
    lse2.data = hp.lse.data() + 2 * 2;
    flashattn_merge_args_t a = hp.args();
    a.out = &part1;
    a.lse = &lse2;
    REQUIRE(flashattn_merge(ctx.get(), &a) == FLASHATTN_SUCCESS);
    const double e0 = 1.0, e1 = std::exp(1.0), e2 = std::exp(2.0);
    const double want = (1 * e0 + 2 * e1 + 3 * e2) / (e0 + e1 + e2);
    CHECK(hp.o(1, 0, 0) == doctest::Approx(want).epsilon(1e-6));
    CHECK(hp.l(2, 1) == doctest::Approx(std::log(e0 + e1 + e2)).epsilon(1e-6));
    CHECK(hp.o(0, 0, 0) == 1.0f);  // the other parts untouched
    CHECK(hp.o(2, 1, 3) == 3.0f);

    // Shifted by one element: overlaps part 1 without being it.
    flashattn_tensor_t shifted = hp.out_view;
    shifted.data = hp.out.data() + 9;
    a = hp.args();
    a.out = &shifted;
    CHECK(flashattn_merge(ctx.get(), &a) == FLASHATTN_ERROR_INVALID_MEMORY);
    CHECK(std::string(flashattn_last_error()).find("shares memory with part 1 of parts_out") !=
          std::string::npos);
    // The same address with other strides is not the same view.
    flashattn_tensor_t restrided = hp.out_view;
    restrided.data = hp.out.data() + 8;
    restrided.strides[2] = 5;
    restrided.strides[1] = 10;
    restrided.strides[0] = 10;
    a = hp.args();
    a.out = &restrided;
    CHECK(flashattn_merge(ctx.get(), &a) == FLASHATTN_ERROR_INVALID_MEMORY);
    // lse in the outputs' memory, out in the LSEs'.
    a = hp.args();
    flashattn_tensor_t lse_in_out = hp.lse_view;
    lse_in_out.data = hp.out.data();
    a.lse = &lse_in_out;
    CHECK(flashattn_merge(ctx.get(), &a) == FLASHATTN_ERROR_INVALID_MEMORY);
    a = hp.args();
    a.lse = &hp.merged_lse_view;
    flashattn_tensor_t lse_as_merged = hp.merged_lse_view;
    lse_as_merged.data = hp.merged.data();
    a.lse = &lse_as_merged;
    CHECK(flashattn_merge(ctx.get(), &a) == FLASHATTN_ERROR_INVALID_MEMORY);
    CHECK(std::string(flashattn_last_error()).find("lse: shares memory with out") !=
          std::string::npos);
  }

  TEST_CASE("a part stride of 0 merges a part with itself") {
    CpuContext ctx;
    HandParts hp(4, 1, 2);
    hp.l(0, 0) = 0.5f;
    hp.o(0, 0, 0) = 7.0f;
    hp.o(0, 0, 1) = -3.0f;
    flashattn_merge_args_t a = hp.args();
    a.parts_out_stride = 0;
    a.parts_lse_stride = 0;
    REQUIRE(flashattn_merge(ctx.get(), &a) == FLASHATTN_SUCCESS);
    CHECK(hp.merged[0] == 7.0f);
    CHECK(hp.merged[1] == -3.0f);
    CHECK(hp.merged_lse[0] == doctest::Approx(0.5 + std::log(4.0)).epsilon(1e-6));
  }

  TEST_CASE("variable-length outputs merge as packed rows") {
    CpuContext ctx;
    HandParts hp(2, 2, 3);
    for (int64_t p = 0; p < 2; ++p)
      for (int64_t h = 0; h < 2; ++h) {
        hp.l(p, h) = 0.0f;
        for (int64_t x = 0; x < 3; ++x) hp.o(p, h, x) = static_cast<float>(2 * p + h);
      }
    // [total_tokens 1, heads 2, head_dim 3] and [heads 2, total_tokens 1].
    auto packed = [](flashattn_tensor_t t) {
      flashattn_tensor_t r = t;
      r.rank = 3;
      for (int i = 0; i < 3; ++i) {
        r.shape[i] = t.shape[i + 1];
        r.strides[i] = t.strides[i + 1];
      }
      return r;
    };
    auto packed_lse = [](flashattn_tensor_t t) {
      flashattn_tensor_t r = t;
      r.rank = 2;
      r.shape[0] = t.shape[1];
      r.shape[1] = t.shape[2];
      r.strides[0] = t.strides[1];
      r.strides[1] = t.strides[2];
      return r;
    };
    const flashattn_tensor_t po = packed(hp.out_view), pl = packed_lse(hp.lse_view);
    const flashattn_tensor_t mo = packed(hp.merged_view), ml = packed_lse(hp.merged_lse_view);
    flashattn_merge_args_t a = hp.args();
    a.parts_out = &po;
    a.parts_lse = &pl;
    a.out = &mo;
    a.lse = &ml;
    REQUIRE_MESSAGE(flashattn_merge(ctx.get(), &a) == FLASHATTN_SUCCESS, std::string(flashattn_last_error()));
    CHECK(hp.merged[0] == 1.0f);  // head 0: (0 + 2) / 2
    CHECK(hp.merged[3] == 2.0f);  // head 1: (1 + 3) / 2
    CHECK(hp.merged_lse[0] == doctest::Approx(std::log(2.0)).epsilon(1e-6));
  }

  TEST_CASE("merge args init: sizes as the other size-prefixed structs") {
    flashattn_merge_args_t a;
    std::memset(&a, 0x5a, sizeof a);
    REQUIRE(flashattn_merge_args_init(&a) == FLASHATTN_SUCCESS);
    CHECK(a.size == sizeof a);
    CHECK(a.num_parts == 0);
    CHECK(a.parts_out == nullptr);
    CHECK(a.lse == nullptr);
    const flashattn_merge_args_t m = FLASHATTN_MERGE_ARGS_INIT;
    CHECK(std::memcmp(&a, &m, sizeof a) == 0);
    CHECK(flashattn_merge_args_init_sized(&a, 8) == FLASHATTN_ERROR_INVALID_ARGUMENT);
    // The initializer writes only the caller's struct: guard bytes after it stay as they were.
    constexpr unsigned char kGuard = 0xC3;
    alignas(flashattn_merge_args_t) unsigned char storage[sizeof(flashattn_merge_args_t) + 64];
    std::memset(storage, kGuard, sizeof storage);
    REQUIRE(flashattn_merge_args_init_sized(reinterpret_cast<flashattn_merge_args_t*>(storage),
                                            sizeof(flashattn_merge_args_t)) == FLASHATTN_SUCCESS);
    for (size_t i = sizeof(flashattn_merge_args_t); i < sizeof storage; ++i) {
      CHECK(storage[i] == kGuard);
    }
    // A newer caller's larger struct: zeros past the fields this library knows, accepted back.
    REQUIRE(flashattn_merge_args_init_sized(reinterpret_cast<flashattn_merge_args_t*>(storage),
                                            sizeof(flashattn_merge_args_t) + 16) ==
            FLASHATTN_SUCCESS);
    for (size_t i = sizeof(flashattn_merge_args_t); i < sizeof(flashattn_merge_args_t) + 16; ++i) {
      CHECK(storage[i] == 0);
    }
    CHECK(storage[sizeof(flashattn_merge_args_t) + 16] == kGuard);
    {
      // That larger struct merges while its unknown bytes are 0, and is refused once one is set.
      CpuContext larger;
      HandParts hp(2, 1, 4);
      const flashattn_merge_args_t known = hp.args();
      std::memcpy(storage + sizeof(size_t), reinterpret_cast<const unsigned char*>(&known) +
                  sizeof(size_t), sizeof known - sizeof(size_t));
      const auto* newer = reinterpret_cast<const flashattn_merge_args_t*>(storage);
      CHECK(flashattn_merge(larger.get(), newer) == FLASHATTN_SUCCESS);
      storage[sizeof(flashattn_merge_args_t) + 3] = 1;
      CHECK(flashattn_merge(larger.get(), newer) == FLASHATTN_ERROR_UNSUPPORTED);
      CHECK(std::string(flashattn_last_error()).find("need a newer flashattn") != std::string::npos);
    }
    CHECK(flashattn_merge_args_init_sized(nullptr, sizeof a) == FLASHATTN_ERROR_INVALID_ARGUMENT);
    CHECK(flashattn_merge(nullptr, &a) == FLASHATTN_ERROR_INVALID_ARGUMENT);
    CpuContext ctx;
    CHECK(flashattn_merge(ctx.get(), nullptr) == FLASHATTN_ERROR_INVALID_ARGUMENT);
  }
}
