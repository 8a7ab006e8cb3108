#include "gpu_harness.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "standard_emulation.hpp"

namespace gpu_test {

using flashattn_test::Comparison;
using flashattn_test::RefProblem;

namespace {

flashattn_context_t g_context = nullptr;

void expect(const Comparison& c) {
  INFO(c.message);
  CHECK(c.ok);
}

// Sanity bounds against float64 for the standard result itself (its precise check is the
// emulation): a few units of the dtype's floor at the result's scale.
double sane_bound(flashattn_dtype_t dtype, const std::vector<double>& ref, double units) {
  return units * flashattn_test::dtype_atol(dtype) * std::max(1.0, flashattn_test::max_abs(ref));
}

}  // namespace

void print_device_banner() {
  int device = 0, driver = 0, runtime = 0;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) return;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf("device 0: %s (sm_%d%d, %d SMs, %.1f GiB), driver %d.%d, runtime %d.%d; "
              "FLASHATTN_REQUIRE_FLASH=%s\n",
              prop.name, prop.major, prop.minor, prop.multiProcessorCount,
              static_cast<double>(prop.totalGlobalMem) / (1u << 30), driver / 1000,
              driver % 1000 / 10, runtime / 1000, runtime % 1000 / 10,
              flash_required() ? "1" : "0");
  std::fflush(stdout);
}

bool flash_required() {
  const char* v = std::getenv("FLASHATTN_REQUIRE_FLASH");
  return v != nullptr && std::strcmp(v, "1") == 0;
}

flashattn_context_t shared_context() {
  if (g_context == nullptr) {
    GPU_FA_OK(flashattn_context_create(&g_context, FLASHATTN_BACKEND_CUDA, 0));
  }
  return g_context;
}

void release_shared_context() {
  if (g_context != nullptr) flashattn_context_destroy(g_context);
  g_context = nullptr;
}

DeviceMemory::DeviceMemory(size_t bytes) : bytes_(bytes) {
  const cudaError_t e = cudaMalloc(&ptr_, bytes);
  INFO("cudaMalloc(" << bytes << "): " << cudaGetErrorString(e));
  REQUIRE(e == cudaSuccess);
}

DeviceMemory::~DeviceMemory() {
  if (ptr_ != nullptr) cudaFree(ptr_);
}

DeviceMemory::DeviceMemory(DeviceMemory&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceMemory& DeviceMemory::operator=(DeviceMemory&& other) noexcept {
  if (this != &other) {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

flashattn_tensor_t DeviceSet::upload(const HostTensor& t) {
  const void* key = t.storage_data();
  auto it = mem_.find(key);
  if (it == mem_.end()) {
    it = mem_.emplace(key, DeviceMemory(t.storage_bytes())).first;
  } else if (it->second.size() < t.storage_bytes()) {
    // The host allocator gave a freed tensor's address to a larger one: a new mirror.
    it->second = DeviceMemory(t.storage_bytes());
  }
  INFO("upload of " << t.storage_bytes() << " bytes into a mirror of " << it->second.size());
  GPU_CUDA_OK(cudaMemcpy(it->second.get(), t.storage_data(), t.storage_bytes(),
                         cudaMemcpyHostToDevice));
  // From pageable memory cudaMemcpy may return before the data has reached the device, and the
  // library's streams (non-blocking) do not wait for the legacy stream: wait here, or a
  // poisoned output can land after the call wrote it.
  GPU_CUDA_OK(cudaStreamSynchronize(nullptr));
  return t.view_at(it->second.get());
}

void DeviceSet::download(HostTensor& t) {
  auto it = mem_.find(t.storage_data());
  REQUIRE(it != mem_.end());
  GPU_CUDA_OK(cudaMemcpy(t.storage_data(), it->second.get(), t.storage_bytes(),
                         cudaMemcpyDeviceToHost));
}

bool same_bytes(const HostTensor& a, const HostTensor& b) {
  return a.storage_bytes() == b.storage_bytes() &&
         std::memcmp(a.storage_data(), b.storage_data(), a.storage_bytes()) == 0;
}

std::string describe(const Case& c) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s [%s b=%lld nq=%lld nk=%lld hq=%lld hkv=%lld d=%lld%s%s]",
                c.name, flashattn_test::dtype_label(c.dtype), static_cast<long long>(c.b),
                static_cast<long long>(c.nq), static_cast<long long>(c.nk),
                static_cast<long long>(c.hq), static_cast<long long>(c.hkv),
                static_cast<long long>(c.d), c.causal ? " causal" : "",
                c.scale != 0.0f ? " custom scale" : "");
  return buf;
}

FlashTally::~FlashTally() {
  if (skipped_ > 0) {
    std::printf("[%s] flash algorithm not available for %d case(s) (ran %d): %s\n", what_,
                skipped_, ran_, first_reason_.c_str());
  }
}

void FlashTally::note(const Case& c, const std::string& reason) {
  if (flash_required()) {
    FAIL_CHECK("flash algorithm unsupported with FLASHATTN_REQUIRE_FLASH=1: " << describe(c)
                                                                               << ": " << reason);
  }
  if (skipped_++ == 0) first_reason_ = reason;
}

bool FlashTally::supported(flashattn_context_t ctx, const flashattn_tensor_t& q,
                           const flashattn_tensor_t& k, const flashattn_tensor_t& v,
                           const flashattn_options_t& opts, int backward, const Case& c) {
  const flashattn_status_t st = flashattn_supported(ctx, &q, &k, &v, &opts, backward);
  if (st == FLASHATTN_SUCCESS) return true;
  INFO(describe(c) << ": " << flashattn_last_error());
  REQUIRE(st == FLASHATTN_ERROR_UNSUPPORTED);  // anything else is a bug in the query
  note(c, flashattn_last_error());
  return false;
}

void FlashTally::declined(const Case& c, const char* reason) {
  FAIL_CHECK("flash declined at call time (it takes every layout, unaligned rows through "
             "aligned copies): " << describe(c) << ": " << reason);
}

flashattn_options_t options_for(const Case& c, flashattn_algorithm_t algorithm,
                                int deterministic) {
  flashattn_options_t o = FLASHATTN_OPTIONS_INIT;
  o.softmax_scale = c.scale;
  o.causal = c.causal ? 1 : 0;
  o.algorithm = algorithm;
  o.deterministic = deterministic;
  return o;
}

RefProblem ref_of(const Case& c) {
  RefProblem r;
  r.batch = c.b;
  r.seqlen_q = c.nq;
  r.seqlen_k = c.nk;
  r.heads_q = c.hq;
  r.heads_kv = c.hkv;
  r.head_dim = c.d;
  r.scale = flashattn_test::library_scale(c.d, c.scale);
  r.causal = c.causal;
  return r;
}

HostTensor output_like(const Case& c, int64_t seqlen, int64_t heads) {
  switch (c.layout) {
    case Layout::Padded: return HostTensor::padded(c.dtype, c.b, seqlen, heads, c.d, 8, 24, 40);
    case Layout::PaddedOdd: return HostTensor::padded(c.dtype, c.b, seqlen, heads, c.d, 3, 5, 7);
    default: return HostTensor::make(c.dtype, c.b, seqlen, heads, c.d);
  }
}

void poisoned_gradients(const Case& c, HostTensor grads[3]) {
  grads[0] = output_like(c, c.nq, c.hq);
  grads[1] = output_like(c, c.nk, c.hkv);
  grads[2] = output_like(c, c.nk, c.hkv);
  for (int i = 0; i < 3; ++i) grads[i].poison();
}

Inputs make_inputs(const Case& c, uint64_t seed) {
  Inputs in;
  switch (c.layout) {
    case Layout::PackedQKV: {
      REQUIRE(c.nq == c.nk);
      auto qkv = HostTensor::packed_qkv(c.dtype, c.b, c.nq, c.hq, c.hkv, c.d);
      in.q = qkv[0];
      in.k = qkv[1];
      in.v = qkv[2];
      break;
    }
    case Layout::BroadcastKV:
      in.q = HostTensor::make(c.dtype, c.b, c.nq, c.hq, c.d);
      in.k = HostTensor::broadcast_batch(c.dtype, c.b, c.nk, c.hkv, c.d);
      in.v = HostTensor::broadcast_batch(c.dtype, c.b, c.nk, c.hkv, c.d);
      break;
    default:
      in.q = output_like(c, c.nq, c.hq);
      in.k = output_like(c, c.nk, c.hkv);
      in.v = output_like(c, c.nk, c.hkv);
  }
  in.q.fill_normal(seed * 4 + 1);
  in.k.fill_normal(seed * 4 + 2);
  in.v.fill_normal(seed * 4 + 3);
  if (c.late_max_keys > 0) {
    REQUIRE(c.layout != Layout::BroadcastKV);  // would add the shift once per batch
    for (int64_t b = 0; b < c.b; ++b)
      for (int64_t x = 0; x < c.d; ++x) {
        for (int64_t i = 0; i < c.nq; ++i)
          for (int64_t h = 0; h < c.hq; ++h) in.q.set(b, i, h, x, in.q.get(b, i, h, x) + 1.0);
        for (int64_t j = c.nk - c.late_max_keys; j < c.nk; ++j)
          for (int64_t h = 0; h < c.hkv; ++h) in.k.set(b, j, h, x, in.k.get(b, j, h, x) + 1.5);
      }
  }
  return in;
}

void check_forward_case(const Case& c, FlashTally& tally) {
  INFO(describe(c));
  flashattn_context_t ctx = shared_context();
  const RefProblem r = ref_of(c);
  Inputs in = make_inputs(c, 7);
  const std::vector<double> q = in.q.to_double(), k = in.k.to_double(), v = in.v.to_double();
  std::vector<double> o_ref, lse_ref;
  flashattn_test::reference_forward(r, q, k, v, &o_ref, &lse_ref);

  DeviceSet dev;
  const flashattn_tensor_t qd = dev.upload(in.q), kd = dev.upload(in.k), vd = dev.upload(in.v);
  HostTensor out = output_like(c, c.nq, c.hq);
  HostTensor lse = HostTensor::lse(c.b, c.hq, c.nq);

  // Poisoned outputs in, results out; the status of the call.
  auto run = [&](flashattn_algorithm_t algorithm) {
    out.poison();
    lse.poison();
    const flashattn_tensor_t od = dev.upload(out), ld = dev.upload(lse);
    const flashattn_options_t opts = options_for(c, algorithm);
    const flashattn_status_t st = flashattn_forward(ctx, &qd, &kd, &vd, &od, &ld, &opts, nullptr, 0);
    if (st == FLASHATTN_SUCCESS) {
      GPU_FA_OK(flashattn_context_synchronize(ctx));
      dev.download(out);
      dev.download(lse);
    }
    return st;
  };

  // STANDARD
  HostTensor poisoned = output_like(c, c.nq, c.hq);
  poisoned.poison();
  const auto before = poisoned.snapshot();
  GPU_FA_OK(run(FLASHATTN_ALGORITHM_STANDARD));
  CHECK_MESSAGE(out.changed_outside(before) == -1, "standard wrote outside out's view");
  const std::vector<double> o_std = out.to_double(), lse_std = lse.to_double();
  expect(flashattn_test::check_no_nan("standard out", o_std));
  expect(flashattn_test::check_no_nan("standard lse", lse_std));
  if (c.emulate) {
    std::vector<double> o_emu, lse_emu;
    emulate_standard_forward(r, c.dtype, q, k, v, &o_emu, &lse_emu);
    expect(flashattn_test::check_close("standard out vs emulation", o_std, o_emu,
                                       emulation_tolerance(c.dtype, o_emu)));
    expect(flashattn_test::check_close("standard lse vs emulation", lse_std, lse_emu,
                                       1e-5 * std::max(1.0, flashattn_test::max_abs(lse_emu))));
  }
  expect(flashattn_test::check_close("standard out vs float64", o_std, o_ref,
                                     sane_bound(c.dtype, o_ref, 4)));
  expect(flashattn_test::check_close("standard lse vs float64", lse_std, lse_ref,
                                     1e-4 * std::max(1.0, flashattn_test::max_abs(lse_ref))));

  // FLASH
  const flashattn_options_t fopts = options_for(c, FLASHATTN_ALGORITHM_FLASH);
  if (!tally.supported(ctx, qd, kd, vd, fopts, 0, c)) return;
  const flashattn_status_t st = run(FLASHATTN_ALGORITHM_FLASH);
  if (st == FLASHATTN_ERROR_UNSUPPORTED) {
    tally.declined(c, flashattn_last_error());
    return;
  }
  INFO("flash forward: " << flashattn_last_error());
  REQUIRE(st == FLASHATTN_SUCCESS);
  tally.ran();
  CHECK_MESSAGE(out.changed_outside(before) == -1, "flash wrote outside out's view");
  const std::vector<double> o_fl = out.to_double(), lse_fl = lse.to_double();
  expect(flashattn_test::check_no_nan("flash out", o_fl));
  expect(flashattn_test::check_rule("flash out", o_fl, o_std, o_ref,
                                    flashattn_test::dtype_atol(c.dtype)));
  expect(flashattn_test::check_rule("flash lse", lse_fl, lse_std, lse_ref,
                                    flashattn_test::dtype_atol(FLASHATTN_DTYPE_FLOAT32)));
}

void check_backward_case(const Case& c, FlashTally& tally) {
  INFO(describe(c));
  flashattn_context_t ctx = shared_context();
  const RefProblem r = ref_of(c);
  Inputs in = make_inputs(c, 11);
  HostTensor dout = output_like(c, c.nq, c.hq);
  dout.fill_normal(99);
  const std::vector<double> q = in.q.to_double(), k = in.k.to_double(), v = in.v.to_double();
  const std::vector<double> dO = dout.to_double();
  std::vector<double> o_ref, lse_ref, dq_ref, dk_ref, dv_ref;
  flashattn_test::reference_forward(r, q, k, v, &o_ref, &lse_ref);
  flashattn_test::reference_backward(r, q, k, v, dO, &dq_ref, &dk_ref, &dv_ref);

  // Both algorithms get the same forward results: the float64 ones, in the dtype.
  HostTensor out = output_like(c, c.nq, c.hq);
  out.from_double(o_ref);
  HostTensor lse = HostTensor::lse(c.b, c.hq, c.nq);
  lse.from_double(lse_ref);

  DeviceSet dev;
  const flashattn_tensor_t qd = dev.upload(in.q), kd = dev.upload(in.k), vd = dev.upload(in.v);
  const flashattn_tensor_t od = dev.upload(out), dod = dev.upload(dout), ld = dev.upload(lse);
  HostTensor dq = output_like(c, c.nq, c.hq), dk = output_like(c, c.nk, c.hkv),
             dv = output_like(c, c.nk, c.hkv);
  HostTensor* grads[3] = {&dq, &dk, &dv};
  std::vector<unsigned char> before[3];

  auto run = [&](flashattn_algorithm_t algorithm) {
    for (int i = 0; i < 3; ++i) {
      grads[i]->poison();
      before[i] = grads[i]->snapshot();
    }
    const flashattn_tensor_t dqd = dev.upload(dq), dkd = dev.upload(dk), dvd = dev.upload(dv);
    const flashattn_options_t opts = options_for(c, algorithm);
    const flashattn_status_t st = flashattn_backward(ctx, &qd, &kd, &vd, &od, &dod, &ld, &dqd,
                                                     &dkd, &dvd, &opts, nullptr, 0);
    if (st == FLASHATTN_SUCCESS) {
      GPU_FA_OK(flashattn_context_synchronize(ctx));
      for (HostTensor* g : grads) dev.download(*g);
    }
    return st;
  };
  const char* names[3] = {"dq", "dk", "dv"};
  const std::vector<double>* refs[3] = {&dq_ref, &dk_ref, &dv_ref};

  GPU_FA_OK(run(FLASHATTN_ALGORITHM_STANDARD));
  std::vector<double> std_res[3];
  for (int i = 0; i < 3; ++i) {
    CHECK_MESSAGE(grads[i]->changed_outside(before[i]) == -1, "standard wrote outside " << names[i]);
    std_res[i] = grads[i]->to_double();
    expect(flashattn_test::check_no_nan(std::string("standard ") + names[i], std_res[i]));
    expect(flashattn_test::check_close(std::string("standard ") + names[i] + " vs float64",
                                       std_res[i], *refs[i], sane_bound(c.dtype, *refs[i], 8)));
  }
  if (c.emulate) {
    std::vector<double> emu[3];
    emulate_standard_backward(r, c.dtype, q, k, v, dO, &emu[0], &emu[1], &emu[2]);
    for (int i = 0; i < 3; ++i) {
      expect(flashattn_test::check_close(std::string("standard ") + names[i] + " vs emulation",
                                         std_res[i], emu[i],
                                         emulation_tolerance(c.dtype, emu[i])));
    }
  }

  const flashattn_options_t fopts = options_for(c, FLASHATTN_ALGORITHM_FLASH);
  if (!tally.supported(ctx, qd, kd, vd, fopts, 1, c)) return;
  const flashattn_status_t st = run(FLASHATTN_ALGORITHM_FLASH);
  if (st == FLASHATTN_ERROR_UNSUPPORTED) {
    tally.declined(c, flashattn_last_error());
    return;
  }
  INFO("flash backward: " << flashattn_last_error());
  REQUIRE(st == FLASHATTN_SUCCESS);
  tally.ran();
  for (int i = 0; i < 3; ++i) {
    CHECK_MESSAGE(grads[i]->changed_outside(before[i]) == -1, "flash wrote outside " << names[i]);
    const std::vector<double> got = grads[i]->to_double();
    expect(flashattn_test::check_no_nan(std::string("flash ") + names[i], got));
    expect(flashattn_test::check_rule(std::string("flash ") + names[i], got, std_res[i],
                                      *refs[i], flashattn_test::dtype_atol(c.dtype)));
  }
}

}  // namespace gpu_test
