// Conversions of stored elements to fp32, written without branches or lookups so that loops over
// them vectorize. Exact: they agree bit for bit with core/half.hpp (tests check every value),
// and they do not rely on denormal arithmetic, so a caller's flush-to-zero mode cannot change
// them.
#pragma once

#include <cstdint>
#include <cstring>

namespace flashattn {
namespace cpu {

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_load(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

inline float fp16_load(uint16_t h) {
  const uint32_t x = h;
  const uint32_t sign = (x & 0x8000u) << 16;
  const uint32_t exp = x & 0x7c00u;
  const uint32_t em = (x & 0x7fffu) << 13;
  const uint32_t normal = em + (112u << 23);  // rebias 15 -> 127
  const uint32_t special = em | 0x7f800000u;  // inf and NaN (payload kept)
  // Subnormal: mantissa * 2^-24, exact in fp32 and computed from an integer.
  const uint32_t subnormal =
      float_to_bits(static_cast<float>(static_cast<int32_t>(x & 0x3ffu)) * 0x1p-24f);
  // Selections by masks rather than branches, which vectorizers take more readily.
  const uint32_t is_sub = 0u - static_cast<uint32_t>(exp == 0);
  const uint32_t is_special = 0u - static_cast<uint32_t>(exp == 0x7c00u);
  const uint32_t r =
      (normal & ~(is_sub | is_special)) | (special & is_special) | (subnormal & is_sub);
  return bits_to_float(r | sign);
}

}  // namespace cpu
}  // namespace flashattn
