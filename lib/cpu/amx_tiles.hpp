// AMX tiles for the bf16 pair GEMMs of the amx copy of the kernels (kernels_amx.cpp): the tile
// instructions as statements on literal tile numbers, and the one configuration that copy uses
// (every tile 16 rows of 64 bytes). Built with FLASHATTN_CPU_AMX_EMULATED, the same statements
// run in software on a per-thread register file, so that the copy's layouts, tails and masks
// can be tested on a CPU without AMX (a development build: the shipped library has the
// instructions, and picks the copy only where the CPU and the OS grant AMX).
#pragma once

#include <cstdint>
#include <cstring>

namespace flashattn {
namespace cpu {
namespace amx {

constexpr int kTileRows = 16;                   // rows of every tile
constexpr int kTileRowBytes = 64;               // bytes of a tile row
constexpr int kTileCols = kTileRowBytes / 4;    // 32-bit elements of a row: fp32, or bf16 pairs
constexpr int kTiles = 8;

// ldtilecfg's operand, palette 1.
struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
static_assert(sizeof(TileConfig) == 64, "ldtilecfg reads 64 bytes");

inline TileConfig all_tiles_full() {
  TileConfig c;
  std::memset(&c, 0, sizeof c);
  c.palette = 1;
  for (int t = 0; t < kTiles; ++t) {
    c.colsb[t] = kTileRowBytes;
    c.rows[t] = kTileRows;
  }
  return c;
}

#if defined(FLASHATTN_CPU_AMX_EMULATED)
// Software tiles: loads and stores touch exactly the bytes the instructions would, so a
// sanitizer sees what the hardware would read and write.
struct Registers {
  alignas(64) unsigned char tile[kTiles][kTileRows * kTileRowBytes];
};
inline Registers& registers() {
  thread_local Registers r;
  return r;
}
inline void emulated_load(int t, const void* base, long stride) {
  for (int r = 0; r < kTileRows; ++r) {
    std::memcpy(registers().tile[t] + r * kTileRowBytes, static_cast<const char*>(base) + r * stride,
                kTileRowBytes);
  }
}
inline void emulated_store(int t, void* base, long stride) {
  for (int r = 0; r < kTileRows; ++r) {
    std::memcpy(static_cast<char*>(base) + r * stride, registers().tile[t] + r * kTileRowBytes,
                kTileRowBytes);
  }
}
inline void emulated_zero(int t) { std::memset(registers().tile[t], 0, sizeof registers().tile[t]); }
inline float bf16_value(uint16_t x) {
  const uint32_t bits = static_cast<uint32_t>(x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
// C(m, n) += A(m, p).lo * B(p, n).lo + A(m, p).hi * B(p, n).hi over the pairs p, in order.
inline void emulated_dpbf16ps(int c, int a, int b) {
  float C[kTileRows][kTileCols];
  uint32_t A[kTileRows][kTileCols], B[kTileRows][kTileCols];
  std::memcpy(C, registers().tile[c], sizeof C);
  std::memcpy(A, registers().tile[a], sizeof A);
  std::memcpy(B, registers().tile[b], sizeof B);
  for (int m = 0; m < kTileRows; ++m)
    for (int n = 0; n < kTileCols; ++n) {
      float acc = C[m][n];
      for (int p = 0; p < kTileCols; ++p) {
        const float lo = bf16_value(static_cast<uint16_t>(A[m][p])) *
                         bf16_value(static_cast<uint16_t>(B[p][n]));
        const float hi = bf16_value(static_cast<uint16_t>(A[m][p] >> 16)) *
                         bf16_value(static_cast<uint16_t>(B[p][n] >> 16));
        acc = acc + lo;
        acc = acc + hi;
      }
      C[m][n] = acc;
    }
  std::memcpy(registers().tile[c], C, sizeof C);
}
inline void configure() {}
#define FA_TILE_LOAD(t, base, stride) ::flashattn::cpu::amx::emulated_load(t, base, stride)
#define FA_TILE_STORE(t, base, stride) ::flashattn::cpu::amx::emulated_store(t, base, stride)
#define FA_TILE_ZERO(t) ::flashattn::cpu::amx::emulated_zero(t)
#define FA_TILE_DPBF16PS(c, a, b) ::flashattn::cpu::amx::emulated_dpbf16ps(c, a, b)
#else
inline void configure() {
  static const TileConfig config = all_tiles_full();
  __asm__ volatile("ldtilecfg %0" ::"m"(config));
}
// The memory clobbers order the tiles' loads and stores with the code that fills and reads
// the memory they name (the compiler cannot see through the instructions).
#define FA_TILE_LOAD(t, base, stride)                                        \
  __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(base),              \
                   "r"(static_cast<long>(stride))                            \
                   : "memory")
#define FA_TILE_STORE(t, base, stride)                                       \
  __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(base),          \
                   "r"(static_cast<long>(stride))                            \
                   : "memory")
#define FA_TILE_ZERO(t) __asm__ volatile("tilezero %%tmm" #t ::)
// tmm c += tmm a (rows of pairs) times tmm b (pairs of rows), fp32 sums.
#define FA_TILE_DPBF16PS(c, a, b) __asm__ volatile("tdpbf16ps %%tmm" #b ", %%tmm" #a ", %%tmm" #c ::)
#endif

// A thread's tiles hold the configuration from its first GEMM on; forget() makes the next GEMM
// load it again. Every call of the copy's forward and backward calls forget() on its caller's
// thread, where other code may have configured tiles of its own since the last call (the
// pool's worker threads run nothing else).
inline bool& configured() {
  thread_local bool done = false;
  return done;
}
inline void ready() {
  if (!configured()) {
    configure();
    configured() = true;
  }
}
inline void forget() { configured() = false; }

}  // namespace amx
}  // namespace cpu
}  // namespace flashattn
