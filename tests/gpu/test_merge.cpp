// flashattn_merge on the GPU: any split of the keys, run through the CUDA forward part by part
// into slices of one parts buffer and merged, is the unsplit CUDA forward by the tolerance rule
// (tests/common/merge_check.hpp, as the CPU tests); the 16-byte and the element-wise paths; in
// place; the exact cases of -inf, NaN and +inf LSEs; rows past what a 65535-block grid holds,
// against the CPU backend's merge of the same parts; float32 refused.
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/merge_check.hpp"
#include "gpu_harness.hpp"

namespace {

using flashattn_test::HostTensor;
using flashattn_test::MergeSplitCase;
using flashattn_test::split;

constexpr flashattn_dtype_t F16 = FLASHATTN_DTYPE_FLOAT16;
constexpr flashattn_dtype_t BF16 = FLASHATTN_DTYPE_BFLOAT16;
constexpr float kInf = std::numeric_limits<float>::infinity();

class DeviceMergeMemory : public flashattn_test::MergeMemory {
 public:
  flashattn_context_t context() override { return gpu_test::shared_context(); }
  flashattn_tensor_t place(const HostTensor& t) override { return set_.upload(t); }
  void fetch(HostTensor& t) override { set_.download(t); }

 private:
  gpu_test::DeviceSet set_;
};

// The flash forward where it takes the whole problem's shape (the parts' are alike), else the
// standard one (a failure with FLASHATTN_REQUIRE_FLASH=1).
void run(MergeSplitCase c) {
  flashattn_tensor_t q{}, k{}, v{};
  REQUIRE(flashattn_tensor_4d(&q, nullptr, c.dtype, c.batch, c.seqlen_q, c.heads_q, c.head_dim) ==
          FLASHATTN_SUCCESS);
  REQUIRE(flashattn_tensor_4d(&k, nullptr, c.dtype, c.batch, c.seqlen_k, c.heads_kv,
                              c.head_dim) == FLASHATTN_SUCCESS);
  v = k;
  flashattn_options_t o = flashattn_test::part_options(c, 1);
  const flashattn_status_t s = flashattn_supported(gpu_test::shared_context(), &q, &k, &v, &o, 0);
  if (s == FLASHATTN_ERROR_UNSUPPORTED) {
    if (gpu_test::flash_required()) FAIL("flash forward unsupported: " << flashattn_last_error());
    MESSAGE("flash forward unsupported (" << flashattn_last_error() << "): standard instead");
    c.algorithm = FLASHATTN_ALGORITHM_STANDARD;
  }
  DeviceMergeMemory memory;
  flashattn_test::check_merge_split(c, memory);
}

// Parts [parts, rows, d] of uniform values in (-2, 2) and LSEs [parts, rows] in (-6, 6), with
// some rows' parts at -inf, as host tensors laid out [parts * rows, 1, 1, d] / [parts * rows,
// 1, 1].
struct RandomParts {
  HostTensor out, lse;
  RandomParts(flashattn_dtype_t dtype, int64_t parts, int64_t rows, int64_t d, int64_t pad)
      : out(HostTensor::padded(dtype, parts * rows, 1, 1, d, pad, 0, 0)),
        lse(HostTensor::lse(parts * rows, 1, 1)) {
    out.fill_normal(7);
    lse.fill_normal(8, 0.0, 3.0);
    for (int64_t r = 0; r < parts * rows; r += 5) lse.set(r, 0, 0, 0, -kInf);
  }
};

flashattn_merge_args_t row_args(const flashattn_tensor_t& parts, const flashattn_tensor_t& lse,
                                const flashattn_tensor_t& out, const flashattn_tensor_t* merged_lse,
                                int64_t num_parts, int64_t rows,
                                flashattn_tensor_t* first, flashattn_tensor_t* first_lse) {
  // Rows as the seqlen of one batch entry: parts [rows, 1, d] each.
  *first = parts;
  first->shape[0] = 1;
  first->shape[1] = rows;
  first->strides[1] = parts.strides[0];
  *first_lse = lse;
  first_lse->shape[0] = 1;
  first_lse->shape[2] = rows;
  first_lse->strides[2] = lse.strides[0];
  flashattn_merge_args_t a;
  flashattn_merge_args_init(&a);
  a.num_parts = num_parts;
  a.parts_out = first;
  a.parts_out_stride = rows * parts.strides[0];
  a.parts_lse = first_lse;
  a.parts_lse_stride = rows * lse.strides[0];
  a.out = &out;
  a.lse = merged_lse;
  return a;
}

// The CUDA merge of these parts against the CPU backend's: the same arithmetic in fp32, so at
// most one unit in the last place of the dtype apart (exp and log may round differently).
void check_against_cpu(flashattn_dtype_t dtype, int64_t parts, int64_t rows, int64_t d,
                       int64_t pad) {
  INFO("parts " << parts << " rows " << rows << " d " << d << " pad " << pad);
  RandomParts in(dtype, parts, rows, d, pad);
  // out and lse as [1, rows, 1, d] and [1, 1, rows].
  HostTensor gpu_out = HostTensor::padded(dtype, 1, rows, 1, d, pad, 0, 0);
  HostTensor cpu_out = HostTensor::padded(dtype, 1, rows, 1, d, pad, 0, 0);
  HostTensor gpu_lse = HostTensor::lse(1, 1, rows), cpu_lse = HostTensor::lse(1, 1, rows);
  gpu_out.poison();
  gpu_lse.poison();
  gpu_test::DeviceSet dev;
  const flashattn_tensor_t dparts = dev.upload(in.out), dlse = dev.upload(in.lse);
  const flashattn_tensor_t dout = dev.upload(gpu_out), dmlse = dev.upload(gpu_lse);
  flashattn_tensor_t first, first_lse;
  flashattn_merge_args_t a = row_args(dparts, dlse, dout, &dmlse, parts, rows, &first, &first_lse);
  GPU_FA_OK(flashattn_merge(gpu_test::shared_context(), &a));
  GPU_FA_OK(flashattn_context_synchronize(gpu_test::shared_context()));
  dev.download(gpu_out);
  dev.download(gpu_lse);

  flashattn_context_t cpu = nullptr;
  GPU_FA_OK(flashattn_context_create(&cpu, FLASHATTN_BACKEND_CPU, 0));
  const flashattn_tensor_t hparts = in.out.view(), hlse = in.lse.view();
  const flashattn_tensor_t hout = cpu_out.view(), hmlse = cpu_lse.view();
  a = row_args(hparts, hlse, hout, &hmlse, parts, rows, &first, &first_lse);
  GPU_FA_OK(flashattn_merge(cpu, &a));
  flashattn_context_destroy(cpu);

  const double ulp = dtype == F16 ? 0x1p-10 : 0x1p-7;
  const std::vector<double> g = gpu_out.to_double(), c = cpu_out.to_double();
  double worst = 0.0;
  bool finite = true;
  for (size_t i = 0; i < g.size(); ++i) {
    finite = finite && std::isfinite(g[i]);
    worst = std::max(worst, std::fabs(g[i] - c[i]) / std::max(1.0, std::fabs(c[i])));
  }
  CHECK_MESSAGE(finite, "a NaN or infinity in the merged output");
  CHECK_MESSAGE(worst <= ulp, "GPU and CPU merges differ by " << worst);
  const std::vector<double> gl = gpu_lse.to_double(), cl = cpu_lse.to_double();
  double worst_lse = 0.0;
  for (size_t i = 0; i < gl.size(); ++i) {
    if (std::isinf(cl[i])) {
      CHECK(gl[i] == cl[i]);
      continue;
    }
    worst_lse = std::max(worst_lse, std::fabs(gl[i] - cl[i]) / std::max(1.0, std::fabs(cl[i])));
  }
  CHECK_MESSAGE(worst_lse <= 1e-6, "GPU and CPU merged LSEs differ by " << worst_lse);
}

}  // namespace

TEST_SUITE("gpu_merge") {

TEST_CASE("a merge of split keys is the unsplit CUDA forward") {
  for (flashattn_dtype_t dtype : {F16, BF16}) {
    run(split(dtype, 2, 13, 200, 4, 2, 64, false, {0, 77, 200}));
    run(split(dtype, 2, 128, 128, 2, 2, 128, true, {0, 40, 64, 128}));  // parts hidden from rows
    run(split(dtype, 1, 150, 90, 2, 1, 64, true, {0, 30, 90}));  // rows with no key at all
    run(split(dtype, 1, 1, 700, 8, 1, 128, false,
              {0, 100, 200, 300, 400, 500, 600, 700}));  // decode: seven splits
    run(split(dtype, 1, 40, 96, 2, 2, 64, false, {0, 0, 50, 50, 96}));  // empty parts
    run(split(dtype, 2, 9, 33, 2, 2, 256, true, {0, 33}));  // one part
    run(split(dtype, 1, 31, 64, 2, 1, 96, false, {0, 20, 64}));
  }
}

TEST_CASE("strided views: 16-byte and element-wise accesses; in place; no LSE") {
  for (flashattn_dtype_t dtype : {F16, BF16}) {
    MergeSplitCase aligned = split(dtype, 2, 33, 70, 2, 2, 64, true, {0, 30, 70});
    aligned.pad = 8;  // rows stay on 16 bytes: the vector path
    run(aligned);
    MergeSplitCase odd = aligned;
    odd.pad = 3;  // rows off 16 bytes: the element-wise path
    odd.algorithm = FLASHATTN_ALGORITHM_STANDARD;  // the flash forward needs 16-byte rows
    run(odd);
    MergeSplitCase odd_dim = split(dtype, 1, 17, 45, 3, 1, 40, false, {0, 9, 45});
    run(odd_dim);
    MergeSplitCase in_place = split(dtype, 2, 64, 64, 4, 2, 128, true, {0, 16, 48, 64});
    in_place.in_place = true;
    run(in_place);
    MergeSplitCase no_lse = split(dtype, 1, 8, 80, 2, 2, 64, false, {0, 41, 80});
    no_lse.with_lse = false;
    run(no_lse);
  }
}

TEST_CASE("more rows than a 65535-block grid holds, many parts, against the CPU merge") {
  // head_dim 128 in 16-byte vectors: 16 lanes a row, 16 rows a block; 1.2M rows need 75000
  // blocks.
  check_against_cpu(F16, 2, 1200000, 128, 0);
  check_against_cpu(BF16, 33, 5000, 64, 0);     // more parts than lanes in a group
  check_against_cpu(F16, 3, 70001, 200, 3);     // element-wise: 32 lanes a row
  check_against_cpu(BF16, 1, 100000, 8, 0);     // one part, one lane a row
}

TEST_CASE("-inf, NaN and +inf LSEs") {
  // Rows: 0 one finite part; 1 every part -inf; 2 a NaN; 3 +inf; 4 LSEs 2000 apart.
  const int64_t parts = 3, rows = 5, d = 16;
  HostTensor out = HostTensor::make(F16, parts * rows, 1, 1, d);
  HostTensor lse = HostTensor::lse(parts * rows, 1, 1);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (int64_t p = 0; p < parts; ++p)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t x = 0; x < d; ++x) out.set(p * rows + r, 0, 0, x, p == 1 ? 2.0 : nan);
  const double lses[rows][parts] = {{-kInf, 0.5, -kInf},
                                    {-kInf, -kInf, -kInf},
                                    {0.0, nan, 1.0},
                                    {0.0, kInf, 1.0},
                                    {-1000.0, 1000.0, -kInf}};
  for (int64_t p = 0; p < parts; ++p)
    for (int64_t r = 0; r < rows; ++r) lse.set(p * rows + r, 0, 0, 0, lses[r][p]);
  for (int64_t x = 0; x < d; ++x) out.set(0 * rows + 4, 0, 0, x, 9.0);  // part 0 of row 4
  HostTensor merged = HostTensor::make(F16, 1, rows, 1, d);
  HostTensor merged_lse = HostTensor::lse(1, 1, rows);
  merged.poison();
  merged_lse.poison();
  gpu_test::DeviceSet dev;
  const flashattn_tensor_t dparts = dev.upload(out), dlse = dev.upload(lse);
  const flashattn_tensor_t dout = dev.upload(merged), dmlse = dev.upload(merged_lse);
  flashattn_tensor_t first, first_lse;
  const flashattn_merge_args_t a =
      row_args(dparts, dlse, dout, &dmlse, parts, rows, &first, &first_lse);
  GPU_FA_OK(flashattn_merge(gpu_test::shared_context(), &a));
  GPU_FA_OK(flashattn_context_synchronize(gpu_test::shared_context()));
  dev.download(merged);
  dev.download(merged_lse);
  for (int64_t x = 0; x < d; ++x) {
    CHECK(merged.get(0, 0, 0, x) == 2.0);  // the NaN outputs of -inf parts stay out
    CHECK(merged.get(0, 1, 0, x) == 0.0);
    CHECK(std::isnan(merged.get(0, 2, 0, x)));
    CHECK(std::isnan(merged.get(0, 3, 0, x)));
    CHECK(merged.get(0, 4, 0, x) == 2.0);  // part 1 outweighs part 0 by e^2000
  }
  CHECK(merged_lse.get(0, 0, 0) == doctest::Approx(0.5).epsilon(1e-7));
  CHECK(merged_lse.get(0, 0, 1) == -kInf);
  CHECK(std::isnan(merged_lse.get(0, 0, 2)));
  CHECK(merged_lse.get(0, 0, 3) == kInf);
  CHECK(merged_lse.get(0, 0, 4) == 1000.0);
}

TEST_CASE("float32 merges on the CPU only") {
  gpu_test::DeviceMemory mem(4096);
  flashattn_tensor_t parts{}, lse{}, out{};
  REQUIRE(flashattn_tensor_4d(&parts, mem.get(), FLASHATTN_DTYPE_FLOAT32, 1, 2, 2, 8) ==
          FLASHATTN_SUCCESS);
  REQUIRE(flashattn_tensor_lse(&lse, static_cast<char*>(mem.get()) + 1024, 1, 2, 2) ==
          FLASHATTN_SUCCESS);
  REQUIRE(flashattn_tensor_4d(&out, static_cast<char*>(mem.get()) + 2048, FLASHATTN_DTYPE_FLOAT32,
                              1, 2, 2, 8) == FLASHATTN_SUCCESS);
  flashattn_merge_args_t a;
  flashattn_merge_args_init(&a);
  a.num_parts = 1;
  a.parts_out = &parts;
  a.parts_lse = &lse;
  a.out = &out;
  CHECK(flashattn_merge(gpu_test::shared_context(), &a) == FLASHATTN_ERROR_UNSUPPORTED);
  CHECK(std::string(flashattn_last_error()).find("float32 runs on the CPU backend") !=
        std::string::npos);
}

}  // TEST_SUITE
