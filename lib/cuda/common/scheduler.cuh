// Which output tile (query block, head, batch) a CTA computes next. Tiles are numbered
// 0 .. num_tiles() - 1 and a CTA takes tile blockIdx.x, then every gridDim.x-th after it, so one
// kernel serves a plain grid (one tile per CTA) and a persistent one (grid = SMs) alike, and
// the grid has no 65535 limit: only x is used.
#pragma once

#include <cstdint>

namespace flashattn {
namespace common {

struct TileCoord {
  int m_block, head, batch;
};

enum class TileOrder : int {
  // Query blocks of one (batch, head) side by side, last block first: neighbours share K/V in
  // L2, and with a causal mask each head's heavy blocks start first.
  kHeadMajorReversed,
  // Query blocks of one (batch, head) side by side, in order (no mask: all tiles cost alike).
  kHeadMajor,
  // Every head's last query block, then every head's second-to-last, ...: the longest tiles
  // first over the whole grid, so that a persistent grid ends balanced under a causal mask.
  kLongestFirst,
};

struct TileScheduler {
  int num_m_blocks = 0, heads = 0, batch = 0;
  TileOrder order = TileOrder::kHeadMajor;

  __host__ __device__ int64_t num_tiles() const {
    return int64_t(num_m_blocks) * heads * batch;
  }

  __device__ __forceinline__ TileCoord at(int tile) const {
    int m, bh;
    if (order == TileOrder::kLongestFirst) {
      const int heads_total = heads * batch;
      m = num_m_blocks - 1 - tile / heads_total;
      bh = tile % heads_total;
    } else {
      m = tile % num_m_blocks;
      bh = tile / num_m_blocks;
      if (order == TileOrder::kHeadMajorReversed) m = num_m_blocks - 1 - m;
    }
    return TileCoord{m, bh % heads, bh / heads};
  }
};

}  // namespace common
}  // namespace flashattn
