// The compute routines of the CPU backend, compiled once per instruction set (kernels_*.cpp)
// and picked at run time. Each entry runs a whole forward or backward on the pool, with scratch
// from `ws` laid out by `plan`, or a whole merge of partial results.
#pragma once

#include "core/problem.hpp"
#include "cpu/plan.hpp"
#include "cpu/thread_pool.hpp"

namespace flashattn {
namespace cpu {

struct KernelSet {
  const char* isa;
  void (*forward)(const ForwardArgs& args, const Plan& plan, char* ws, ThreadPool& pool);
  void (*backward)(const BackwardArgs& args, const Plan& plan, char* ws, ThreadPool& pool);
  void (*merge)(const MergeArgs& args, ThreadPool& pool);  // needs no scratch
};

// Baseline x86-64 (SSE2) or the target's default instruction set: always available.
const KernelSet& kernels_generic();
#if defined(__x86_64__)
const KernelSet& kernels_avx2();    // AVX2 + FMA
const KernelSet& kernels_avx512();  // AVX-512 F/VL/BW/DQ + FMA
// AVX-512 + BF16: bf16 GEMMs on pairs, where vdpbf16ps issues at the FMA's rate
const KernelSet& kernels_avx512bf16();
// AVX-512 BF16 + AMX-BF16: bf16 GEMMs on AMX tiles (the caller has been granted the tile data)
const KernelSet& kernels_amx();
#endif

}  // namespace cpu
}  // namespace flashattn
