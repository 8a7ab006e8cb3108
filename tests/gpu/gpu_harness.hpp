// What the GPU tests share: device copies of host tensors, the case description of the
// numerics sweep, the runners that check one case forward or backward, and the handling of the
// flash kernels being absent (a failure only when FLASHATTN_REQUIRE_FLASH=1).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <flashattn/flashattn.h>

#include "common/reference.hpp"
#include "common/tensors.hpp"
#include "common/tolerance.hpp"

#define GPU_CUDA_OK(expr)                                        \
  do {                                                           \
    const cudaError_t gpu_err_ = (expr);                         \
    INFO(#expr " -> " << cudaGetErrorString(gpu_err_));          \
    REQUIRE(gpu_err_ == cudaSuccess);                            \
  } while (0)

#define GPU_FA_OK(expr)                                          \
  do {                                                           \
    const flashattn_status_t gpu_st_ = (expr);                   \
    INFO(#expr " -> " << flashattn_status_string(gpu_st_) << ": " \
                      << flashattn_last_error());                \
    REQUIRE(gpu_st_ == FLASHATTN_SUCCESS);                       \
  } while (0)

namespace gpu_test {

using flashattn_test::HostTensor;

// "device 0: NVIDIA H200 (sm_90, 132 SMs), driver 13.0, runtime 13.0; flash required: no".
void print_device_banner();

// FLASHATTN_REQUIRE_FLASH=1: the flash algorithm being unsupported is a failure.
bool flash_required();

// One CUDA context on device 0 for the numerics cases (created on first use).
flashattn_context_t shared_context();
void release_shared_context();

// cudaMalloc'ed memory owned by a test.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  explicit DeviceMemory(size_t bytes);
  ~DeviceMemory();
  DeviceMemory(DeviceMemory&& other) noexcept;
  DeviceMemory& operator=(DeviceMemory&& other) noexcept;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  void* get() const { return ptr_; }
  size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Device mirrors of host tensors. Host tensors sharing storage (packed QKV) share one device
// allocation, so views keep their true relative layout.
class DeviceSet {
 public:
  // Copies t's whole storage to the device (allocating on first sight) and returns the view.
  flashattn_tensor_t upload(const HostTensor& t);
  // Copies the device storage back into t's host storage.
  void download(HostTensor& t);

 private:
  std::map<const void*, DeviceMemory> mem_;
};

// Bytes equal (for determinism and graph-replay checks).
bool same_bytes(const HostTensor& a, const HostTensor& b);

enum class Layout {
  Contiguous,
  Padded,          // gaps of 8/24/40 elements: strided, still 16-byte aligned
  PaddedOdd,       // gaps of 3/5/7 elements: rows off 16 bytes (flash copies them aligned)
  PackedQKV,       // q, k, v slices of one [b, n, hq + 2 hkv, d] tensor (needs nq == nk)
  BroadcastKV,     // k and v broadcast over the batch (batch stride 0)
};

struct Case {
  const char* name;
  flashattn_dtype_t dtype;
  int64_t b, nq, nk, hq, hkv, d;
  bool causal;
  float scale;  // softmax_scale; 0: 1/sqrt(d)
  Layout layout;
  bool emulate = true;  // also check the standard result against the host emulation
  // > 0: q shifted by +1 and the last `late_max_keys` keys by +1.5, so that every row's
  // maximum lies in the last key tile (an online softmax must rescale what it accumulated).
  int64_t late_max_keys = 0;
};

std::string describe(const Case& c);

// Counts flash availability over a test case and reports it once (MESSAGE), or fails when
// FLASHATTN_REQUIRE_FLASH=1.
class FlashTally {
 public:
  explicit FlashTally(const char* what) : what_(what) {}
  ~FlashTally();
  // flashattn_supported for the flash algorithm; false (and noted) when UNSUPPORTED.
  bool supported(flashattn_context_t ctx, const flashattn_tensor_t& q,
                 const flashattn_tensor_t& k, const flashattn_tensor_t& v,
                 const flashattn_options_t& opts, int backward, const Case& c);
  // A call-time UNSUPPORTED after the query said yes: a failure.
  void declined(const Case& c, const char* reason);
  void ran() { ++ran_; }

 private:
  void note(const Case& c, const std::string& reason);
  const char* what_;
  int ran_ = 0;
  int skipped_ = 0;
  std::string first_reason_;
};

flashattn_options_t options_for(const Case& c, flashattn_algorithm_t algorithm,
                                int deterministic = 0);
flashattn_test::RefProblem ref_of(const Case& c);

struct Inputs {
  HostTensor q, k, v;
};
Inputs make_inputs(const Case& c, uint64_t seed);
// An output laid out like the inputs of this case (padded cases get padded outputs).
HostTensor output_like(const Case& c, int64_t seqlen, int64_t heads);
// dq, dk and dv laid out like q, k and v (output_like), every element poisoned.
void poisoned_gradients(const Case& c, HostTensor grads[3]);

// The whole forward check of one case: standard against the emulation and float64, flash (if
// available) against float64 by the tolerance rule with the standard as base; outputs poisoned.
void check_forward_case(const Case& c, FlashTally& tally);
// The same for the backward (dq, dk, dv), given the float64 forward's out and lse.
void check_backward_case(const Case& c, FlashTally& tally);

}  // namespace gpu_test
