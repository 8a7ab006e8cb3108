// Which output tile (query block, head, batch) a CTA computes next. Tiles are numbered
// 0 .. num_tiles() - 1 and handed out in rounds of gridDim.x, one per CTA, so one kernel serves a
// plain grid (one tile per CTA, tile blockIdx.x) and a persistent one (grid = SMs) alike, and the
// grid has no 65535 limit: only x is used.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

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
  // Groups of group_heads (batch, head) pairs; in each, every pair's last block, then every
  // pair's second-to-last, ...: each pair's blocks still start last first, and a grid of one
  // wave per group runs a pair's blocks side by side in time without launching them together
  // (the deterministic backward's key blocks: common::key_blocks).
  kInterleavedReversed,
};

struct TileScheduler {
  int num_m_blocks = 0, heads = 0, batch = 0;
  TileOrder order = TileOrder::kHeadMajor;
  int group_heads = 1;  // kInterleavedReversed: (batch, head) pairs per group

  __host__ __device__ int64_t num_tiles() const {
    return int64_t(num_m_blocks) * heads * batch;
  }

  // The tile of CTA `cta` in round `round` of a grid of `grid` CTAs. Every other round is
  // walked backwards (a snake): with tiles numbered longest first, the CTA that took the longest
  // tile of one round takes the shortest of the next, so each CTA's total comes out even.
  // Rounds only grow, so a CTA is done at its first tile >= num_tiles().
  __host__ __device__ __forceinline__ int nth_tile(int cta, int round, int grid) const {
    return round * grid + ((round & 1) ? grid - 1 - cta : cta);
  }

  __host__ __device__ __forceinline__ TileCoord at(int tile) const {
    int m, bh;
    if (order == TileOrder::kLongestFirst) {
      const int heads_total = heads * batch;
      m = num_m_blocks - 1 - tile / heads_total;
      bh = tile % heads_total;
    } else if (order == TileOrder::kInterleavedReversed) {
      const int group_tiles = group_heads * num_m_blocks;
      const int group = tile / group_tiles;
      const int first = group * group_heads;  // the group's first pair
      const int left = heads * batch - first;
      const int in_group = left < group_heads ? left : group_heads;  // the last may be short
      const int r = tile - group * group_tiles;
      m = num_m_blocks - 1 - r / in_group;
      bh = first + r % in_group;
    } else {
      m = tile % num_m_blocks;
      bh = tile / num_m_blocks;
      if (order == TileOrder::kHeadMajorReversed) m = num_m_blocks - 1 - m;
    }
    return TileCoord{m, bh % heads, bh / heads};
  }
};

// The most key blocks one CTA of a grid of `grid` computes when the tiles are dealt as
// nth_tile deals them; blocks[m]: the key blocks of query block m. A launcher weighs tile
// orders with it (host only: a loop over every tile).
__host__ inline int64_t busiest_cta_blocks(const TileScheduler& s, int grid,
                                           const std::vector<int>& blocks) {
  std::vector<int64_t> work(static_cast<size_t>(grid), 0);
  const int64_t tiles = s.num_tiles();
  for (int round = 0; int64_t(round) * grid < tiles; ++round) {
    for (int cta = 0; cta < grid; ++cta) {
      const int tile = s.nth_tile(cta, round, grid);
      if (tile < tiles) work[static_cast<size_t>(cta)] += blocks[s.at(tile).m_block];
    }
  }
  return *std::max_element(work.begin(), work.end());
}

// Tiles up to which side_by_side_if_balanced deals both orders on the host to compare them (a
// loop over every tile: ~3.5 ns a tile, 57 us at this count, against a kernel of ~4 ms; the
// answer is kept for the next call of the same shape).
constexpr int64_t kOrderCheckTiles = 16384;
// Side by side is taken while its busiest CTA has at most 1/kOrderSlack more work than longest
// first's: its L2 reuse is worth more than that (kernel log, run 82: causal d256 1k at 8 %
// more, +15 %).
constexpr int64_t kOrderSlack = 8;

// For tiles whose cost grows with the query block (a causal mask): longest first over all heads
// keeps a persistent grid even, but each round then reads nearly every head's K/V from memory
// again (causal 1k d128: DRAM 76 % busy, L2 hits 33 %, against 23 % and 65 % without the mask;
// run 81). A head's blocks side by side, last first, share K/V in L2; taken where dealing them
// so to `grid` CTAs leaves the busiest at most 1/kOrderSlack busier. blocks_of(m): the key
// blocks of query block m.
template <class BlocksOf>
__host__ TileOrder side_by_side_if_balanced(const TileScheduler& s, int grid,
                                            BlocksOf blocks_of) {
  if (s.num_tiles() > kOrderCheckTiles) return TileOrder::kLongestFirst;
  std::vector<int> blocks(static_cast<size_t>(s.num_m_blocks));
  for (int m = 0; m < s.num_m_blocks; ++m) blocks[static_cast<size_t>(m)] = blocks_of(m);
  // The last answer of this thread: a model's layers ask again and again for one shape.
  struct Answer {
    int heads = 0, batch = 0, grid = 0;
    std::vector<int> blocks;
    TileOrder order = TileOrder::kLongestFirst;
  };
  thread_local Answer last;
  if (last.heads == s.heads && last.batch == s.batch && last.grid == grid &&
      last.blocks == blocks) {
    return last.order;
  }
  TileScheduler side_by_side = s, longest_first = s;
  side_by_side.order = TileOrder::kHeadMajorReversed;
  longest_first.order = TileOrder::kLongestFirst;
  const int64_t a = busiest_cta_blocks(side_by_side, grid, blocks);
  const int64_t b = busiest_cta_blocks(longest_first, grid, blocks);
  last = Answer{s.heads, s.batch, grid, std::move(blocks),
                a <= b + b / kOrderSlack ? TileOrder::kHeadMajorReversed : TileOrder::kLongestFirst};
  return last.order;
}

}  // namespace common
}  // namespace flashattn
