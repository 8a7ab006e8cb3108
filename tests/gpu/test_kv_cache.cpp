// The KV cache call on the CUDA backend, beside the CPU backend on the same tensors: contiguous
// and paged caches (page sizes 1, 7, 16, 64, 256 in shuffled block tables), rows appended,
// rotary embedding, one token and a few (the decode kernel) and many (the tiled kernels, which
// take contiguous caches); the output against the float64 reference by the tolerance rule (the
// CPU standard algorithm's distance as the base), the cache after the call against the CPU's;
// and a decode step captured in a CUDA graph, replayed with new lengths.
#include <doctest/doctest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "cpu/kv_cache_case.hpp"
#include "gpu_harness.hpp"

namespace {

namespace kv = flashattn_test::kv_cache;
using flashattn_test::HostTensor;
using kv::F16;
using kv::BF16;
using kv::kFlash;
using kv::kStandard;

// Device copies of the host storage a call places, keyed by the host address.
class DevicePlacement : public kv::Placement {
 public:
  void* place(const void* host, size_t bytes) override {
    auto it = mem_.find(host);
    if (it == mem_.end() || it->second.size() < bytes) {
      it = mem_.insert_or_assign(host, gpu_test::DeviceMemory(bytes)).first;
    }
    REQUIRE(cudaMemcpy(it->second.get(), host, bytes, cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);  // as DeviceSet::upload
    return it->second.get();
  }
  void fetch(void* host, size_t bytes) override {
    auto it = mem_.find(host);
    REQUIRE(it != mem_.end());
    REQUIRE(cudaMemcpy(host, it->second.get(), bytes, cudaMemcpyDeviceToHost) == cudaSuccess);
  }
  // The device address of a placed host storage.
  void* at(const void* host) const { return mem_.at(host).get(); }

 private:
  std::map<const void*, gpu_test::DeviceMemory> mem_;
};

// The LSE [B, Hq, Nq] of a cache call as the reference's order ([Hq, total_q]).
std::vector<double> lse_like_reference(const flashattn_test::Case& c, const HostTensor& lse) {
  std::vector<double> r(static_cast<size_t>(c.heads_q * c.total_q()));
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads_q; ++h)
      for (int64_t i = 0; i < c.seqlen_q; ++i) {
        r[static_cast<size_t>(h * c.total_q() + b * c.seqlen_q + i)] = lse.get(b, h, i);
      }
  return r;
}

// One case on the GPU: out and LSE by the rule against float64 (the CPU standard algorithm's
// result in the same dtype as the base), the cache after the call bit for bit the CPU's.
// Returns "" when the CUDA backend ran the case, its message when it answered UNSUPPORTED.
std::string check_on_gpu(const flashattn_test::Case& c, const kv::CacheLayout& layout) {
  flashattn_test::Inputs in = flashattn_test::make_inputs(c);
  if (layout.shared_pages > 0) kv::share_prefix(c, in, layout.shared_pages * layout.page_size);
  const std::string what = c.name() + " page " + std::to_string(layout.page_size) + " n_new " +
                           std::to_string(layout.n_new) + " rotary " +
                           std::to_string(layout.rotary_dim);
  flashattn_test::CpuContext cpu;
  kv::CacheCall base_call = kv::build(c, in, layout);
  const kv::CacheResult base = kv::run_cache(cpu.get(), base_call, in, kStandard);
  REQUIRE_MESSAGE(base.status == FLASHATTN_SUCCESS, what, ": CPU: ", base.message);

  kv::CacheCall gpu_call = kv::build(c, in, layout);
  DevicePlacement device;
  const kv::CacheResult got =
      kv::run_cache(gpu_test::shared_context(), gpu_call, in, kFlash, -1, &device);
  if (got.status == FLASHATTN_ERROR_UNSUPPORTED) return got.message;
  REQUIRE_MESSAGE(got.status == FLASHATTN_SUCCESS, what, ": CUDA: ", got.message);

  // The float64 reference over the tokens (without rotary: with it, the device's result is
  // held against the CPU's, whose rotation the CPU tests hold against float64).
  const std::vector<double> q = in.q.to_double(), k = in.k.to_double(), v = in.v.to_double();
  std::vector<double> ref_out, ref_lse;
  flashattn_test::reference_forward(in.ref(c), q, k, v, &ref_out, &ref_lse);
  const double atol = flashattn_test::dtype_atol(c.dtype);
  const double factor =
      c.softcap > 0 ? flashattn_test::kSoftcapRuleFactor : flashattn_test::kRuleFactor;
  if (layout.rotary_dim == 0) {
    const auto out_cmp = flashattn_test::check_rule(what + " out", got.out.to_double(),
                                                    base.out.to_double(), ref_out, atol, factor);
    CHECK_MESSAGE(out_cmp.ok, out_cmp.message);
    const auto lse_cmp = flashattn_test::check_rule(what + " lse", lse_like_reference(c, got.lse),
                                                    lse_like_reference(c, base.lse), ref_lse,
                                                    atol, factor);
    CHECK_MESSAGE(lse_cmp.ok, lse_cmp.message);
    CHECK_MESSAGE(gpu_call.k.snapshot() == base_call.k.snapshot(), what, ": k after the call");
  } else {
    // Rotated rows: the device and the host round the same fp32 rotation; allow one unit in
    // the last place where their fp32 arithmetic (fused or not) lands on either side of a tie.
    const std::vector<double> dev = gpu_call.k.to_double(), host = base_call.k.to_double();
    int far = 0;
    for (size_t i = 0; i < dev.size(); ++i) {
      const double ulp = (c.dtype == F16 ? 0x1p-10 : 0x1p-7) * std::fabs(host[i]) + 1e-30;
      if (!(std::fabs(dev[i] - host[i]) <= ulp) && !(std::isnan(dev[i]) && std::isnan(host[i]))) {
        ++far;
      }
    }
    CHECK_MESSAGE(far == 0, what, ": ", far, " cache elements differ from the CPU's by more "
                                             "than one unit in the last place");
    const double tol = 8 * atol * std::max(1.0, flashattn_test::max_abs(ref_out));
    const auto out_cmp = flashattn_test::check_close(what + " out vs CPU", got.out.to_double(),
                                                     base.out.to_double(), tol);
    CHECK_MESSAGE(out_cmp.ok, out_cmp.message);
  }
  CHECK_MESSAGE(gpu_call.v.snapshot() == base_call.v.snapshot(), what, ": v after the call");
  return "";
}

}  // namespace

TEST_SUITE("gpu_kv_cache") {
  TEST_CASE("decode against contiguous and paged caches, rows appended, beside the CPU") {
    gpu_test::print_device_banner();
    for (flashattn_dtype_t dt : {F16, BF16}) {
      // One token over 32 query heads in groups of 4 (the decode kernel, split keys), and four
      // tokens of a group of 4 (16 packed rows); lengths of 1, not block multiples, past a split.
      const flashattn_test::Case one = kv::cache_case(dt, 1, {1, 300, 1000, 4097}, 32, 8, 128, true);
      // Four tokens read pages on the decode kernel when every key is visible to all of them
      // (no causal mask); with one, only the contiguous cache (the tiled kernels) takes them.
      const flashattn_test::Case four = kv::cache_case(dt, 4, {4, 129, 2000}, 8, 2, 64, false);
      const flashattn_test::Case four_causal = kv::cache_case(dt, 4, {4, 129, 2000}, 8, 2, 64, true);
      for (const flashattn_test::Case& c : {one, four, four_causal}) {
        CHECK(check_on_gpu(c, kv::contiguous(0, 4200)).empty());
        CHECK(check_on_gpu(c, kv::contiguous(1, 4200)).empty());
      }
      for (const flashattn_test::Case& c : {one, four}) {
        for (int64_t page : {1, 7, 16, 64, 256}) CHECK(check_on_gpu(c, kv::paged(page, 1)).empty());
      }
      const std::string refused = check_on_gpu(four_causal, kv::paged(16, 1));
      CHECK_MESSAGE(refused.find("a paged KV cache is read by the decode path") != std::string::npos,
                    refused);
    }
  }

  TEST_CASE("pages shared for reading, variants, rotary") {
    // Two tokens that see every key (pages need the decode kernel: see above).
    flashattn_test::Case c = kv::cache_case(BF16, 2, {70, 90, 65}, 16, 4, 128, false);
    kv::CacheLayout shared = kv::paged(16, 1);
    shared.shared_pages = 4;  // 64 tokens every sequence holds before the call
    CHECK(check_on_gpu(c, shared).empty());
    CHECK(check_on_gpu(c, kv::paged(64, 2)).empty());
    flashattn_test::Case v = c;
    v.softcap = 20.0f;
    v.sinks = true;
    v.alibi = flashattn_test::Slopes::PerHead;
    CHECK(check_on_gpu(v, kv::paged(16, 1)).empty());
    for (bool interleaved : {false, true}) {
      kv::CacheLayout r = kv::paged(16, 2);
      r.rotary_dim = 64;
      r.interleaved = interleaved;
      CHECK(check_on_gpu(c, r).empty());
    }
  }

  TEST_CASE("one token with a left window over pages: the window moves each split's start") {
    // A left bound moves where each split of the decode kernel starts (4097 keys with a window
    // of 1000 start at block 48), and with it the first page it looks up; pages of 7 and 16
    // rows hold no whole 64-key block (each row's page looked up), pages of 64 do. Sequences of
    // 1 and 300 keys see every key; the table's entries past each sequence's pages are -1.
    for (flashattn_dtype_t dt : {F16, BF16}) {
      flashattn_test::Case c = kv::cache_case(dt, 1, {1, 300, 1000, 4097}, 32, 8, 128, true);
      c.window = true;
      c.window_left = 1000;
      for (int64_t page : {7, 16, 64}) CHECK(check_on_gpu(c, kv::paged(page, 1)).empty());
      c.num_splits = 3;  // splits of many blocks: the start moves inside the first page table row
      CHECK(check_on_gpu(c, kv::paged(64, 0)).empty());
    }
  }

  TEST_CASE("many query rows: a contiguous cache runs the tiled kernels, pages are refused") {
    const flashattn_test::Case c = kv::cache_case(BF16, 200, {300, 700}, 8, 2, 128, true);
    CHECK(check_on_gpu(c, kv::contiguous(8, 800)).empty());
    const std::string refused = check_on_gpu(c, kv::paged(64, 8));
    CHECK_MESSAGE(refused.find("a paged KV cache is read by the decode path") != std::string::npos,
                  refused);
  }

  TEST_CASE("a decode step captured in a CUDA graph, replayed with new lengths") {
    const flashattn_test::Case c = kv::cache_case(BF16, 1, {500, 3000}, 32, 8, 128, true);
    const flashattn_test::Inputs in = flashattn_test::make_inputs(c);
    kv::CacheCall call = kv::build(c, in, kv::paged(64, 0));
    DevicePlacement device;
    flashattn_context_t ctx = gpu_test::shared_context();
    cudaStream_t stream = nullptr;
    GPU_CUDA_OK(cudaStreamCreate(&stream));
    GPU_FA_OK(flashattn_context_set_stream(ctx, stream));
    // Every tensor placed once; the graph then reads the lengths from their device copy.
    kv::CacheResult first = kv::run_cache(ctx, call, in, kFlash, -1, &device);
    REQUIRE_MESSAGE(first.status == FLASHATTN_SUCCESS, first.message);
    flashattn_options_t options = flashattn_test::options_for(c, kFlash);
    flashattn_args_t args;
    flashattn_args_init(&args);
    args.options = &options;
    flashattn_tensor_t q = call.q.view_at(device.at(call.q.storage_data()));
    flashattn_tensor_t k = call.k.view_at(device.at(call.k.storage_data()));
    flashattn_tensor_t v = call.v.view_at(device.at(call.v.storage_data()));
    flashattn_tensor_t out = first.out.view_at(device.at(first.out.storage_data()));
    flashattn_tensor_t lens = kv::int_view(call.seqlens, c.batch, 0);
    lens.data = device.at(call.seqlens.data());
    flashattn_tensor_t table = kv::int_view(call.table, c.batch, call.pages_per_seq);
    table.data = device.at(call.table.data());
    args.q = &q;
    args.k = &k;
    args.v = &v;
    args.out = &out;
    args.cache_seqlens = &lens;
    args.block_table = &table;
    GPU_FA_OK(flashattn_forward_ex(ctx, &args, nullptr, 0));  // warm-up: scratch sized
    GPU_CUDA_OK(cudaStreamSynchronize(stream));
    cudaGraph_t graph = nullptr;
    GPU_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    GPU_FA_OK(flashattn_forward_ex(ctx, &args, nullptr, 0));
    GPU_CUDA_OK(cudaStreamEndCapture(stream, &graph));
    cudaGraphExec_t exec = nullptr;
    GPU_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (const std::vector<int32_t>& lengths : {std::vector<int32_t>{499, 2000},
                                                std::vector<int32_t>{1, 3000}}) {
      GPU_CUDA_OK(cudaMemcpy(lens.data, lengths.data(), lengths.size() * 4, cudaMemcpyHostToDevice));
      GPU_CUDA_OK(cudaStreamSynchronize(nullptr));  // the lengths on the device before the replay
      GPU_CUDA_OK(cudaGraphLaunch(exec, stream));
      GPU_CUDA_OK(cudaStreamSynchronize(stream));
      std::vector<unsigned char> bytes(first.out.storage_bytes());
      GPU_CUDA_OK(cudaMemcpy(bytes.data(), out.data, bytes.size(), cudaMemcpyDeviceToHost));
      GPU_FA_OK(flashattn_forward_ex(ctx, &args, nullptr, 0));  // the same step, eagerly
      GPU_CUDA_OK(cudaStreamSynchronize(stream));
      std::vector<unsigned char> eager(bytes.size());
      GPU_CUDA_OK(cudaMemcpy(eager.data(), out.data, eager.size(), cudaMemcpyDeviceToHost));
      CHECK_MESSAGE(bytes == eager, "lengths ", lengths[0], ", ", lengths[1]);
      // And the lengths took effect: a shorter sequence changes its rows.
      CHECK(std::memcmp(bytes.data(), first.out.storage_data(), bytes.size()) != 0);
    }
    GPU_CUDA_OK(cudaGraphExecDestroy(exec));
    GPU_CUDA_OK(cudaGraphDestroy(graph));
    GPU_FA_OK(flashattn_context_set_stream(ctx, nullptr));
    GPU_CUDA_OK(cudaStreamDestroy(stream));
  }

  TEST_CASE("the standard algorithm refuses the cache, saying so") {
    const flashattn_test::Case c = kv::cache_case(F16, 1, {10}, 4, 2, 64, true);
    const flashattn_test::Inputs in = flashattn_test::make_inputs(c);
    kv::CacheCall call = kv::build(c, in, kv::contiguous(0));
    DevicePlacement device;
    const kv::CacheResult r =
        kv::run_cache(gpu_test::shared_context(), call, in, kStandard, -1, &device);
    CHECK(r.status == FLASHATTN_ERROR_UNSUPPORTED);
    CHECK_MESSAGE(r.message.find("runs on the flash algorithm") != std::string::npos, r.message);
  }
}
