// The element types the CPU backend stores, each with its conversions to and from the fp32 it
// computes in (loads exact, stores rounded to nearest even): what the kernels and the KV cache
// steps read and write tensors through.
#pragma once

#include <cstdint>

#include "core/half.hpp"
#include "cpu/convert.hpp"

namespace flashattn {
namespace cpu {

struct Fp32Storage {
  using T = float;
  static float load(float x) { return x; }
  static float store(float x) { return x; }
};
struct Fp16Storage {
  using T = uint16_t;
  static float load(uint16_t x) { return fp16_load(x); }
  static uint16_t store(float x) { return float_to_fp16(x); }
};
struct Bf16Storage {
  using T = uint16_t;
  static float load(uint16_t x) { return bf16_load(x); }
  static uint16_t store(float x) { return float_to_bf16(x); }
};

}  // namespace cpu
}  // namespace flashattn
