// The persistent grid's tile orders (lib/cuda/common/scheduler.cuh), on the host, no GPU: every
// order deals every tile exactly once, the busiest CTA's work is counted as nth_tile deals, and
// a causal forward takes its heads' tiles side by side only where that keeps the grid even
// (the shapes of the kernel log's run 82); the keys a row sees on average, by which the Hopper
// forward takes a head dim's long-row tile (lib/cuda/common/mask.cuh).
#include <doctest/doctest.h>

#include <set>
#include <tuple>
#include <vector>

#include "cuda/common/mask.cuh"
#include "cuda/common/scheduler.cuh"

namespace fc = flashattn::common;

namespace {

constexpr fc::TileOrder kOrders[] = {fc::TileOrder::kHeadMajor,
                                     fc::TileOrder::kHeadMajorReversed,
                                     fc::TileOrder::kLongestFirst,
                                     fc::TileOrder::kInterleavedReversed};

// The key blocks of each query block under a causal mask, for tiles of block_m x block_n.
struct CausalBlocks {
  fc::WindowMask mask;
  int block_m, block_n;
  int operator()(int m) const {
    int begin, end;
    mask.n_block_range(m * block_m, block_m, block_n, begin, end);
    return end - begin;
  }
};

fc::TileOrder causal_order(int seqlen, int heads, int block_m, int block_n, int sm_count) {
  const fc::TileScheduler s{(seqlen + block_m - 1) / block_m, heads, 1};
  const int grid = s.num_tiles() < sm_count ? static_cast<int>(s.num_tiles()) : sm_count;
  const CausalBlocks blocks{fc::WindowMask(seqlen, seqlen, -1, 0), block_m, block_n};
  return fc::side_by_side_if_balanced(s, grid, blocks);
}

}  // namespace

TEST_SUITE("cuda_tile_order") {

TEST_CASE("every order deals every tile to exactly one CTA") {
  for (fc::TileOrder order : kOrders)
    for (int m_blocks = 1; m_blocks <= 7; ++m_blocks)
      for (int heads = 1; heads <= 4; ++heads)
        for (int batch = 1; batch <= 3; ++batch)
          for (int grid = 1; grid <= 11; ++grid) {
            const fc::TileScheduler s{m_blocks, heads, batch, order};
            std::set<std::tuple<int, int, int>> seen;
            int dealt = 0;
            for (int round = 0; int64_t(round) * grid < s.num_tiles(); ++round)
              for (int cta = 0; cta < grid; ++cta) {
                const int tile = s.nth_tile(cta, round, grid);
                if (tile >= s.num_tiles()) continue;
                const fc::TileCoord c = s.at(tile);
                REQUIRE(c.m_block >= 0);
                REQUIRE(c.m_block < m_blocks);
                REQUIRE(c.head >= 0);
                REQUIRE(c.head < heads);
                REQUIRE(c.batch >= 0);
                REQUIRE(c.batch < batch);
                seen.insert({c.m_block, c.head, c.batch});
                ++dealt;
              }
            CHECK(dealt == s.num_tiles());
            CHECK(static_cast<int64_t>(seen.size()) == s.num_tiles());
          }
}

TEST_CASE("interleaved groups: every tile once, each pair's blocks last first, groups in turn") {
  // The deterministic backward's launch order (common::key_blocks): a CTA may wait only for a
  // block of its own (batch, head) pair that was launched before it, a later key block.
  for (int group_heads = 1; group_heads <= 5; ++group_heads)
    for (int n_blocks = 1; n_blocks <= 6; ++n_blocks)
      for (int heads = 1; heads <= 4; ++heads)
        for (int batch = 1; batch <= 3; ++batch) {
          const fc::TileScheduler s{n_blocks, heads, batch, fc::TileOrder::kInterleavedReversed,
                                    group_heads};
          std::set<std::tuple<int, int, int>> seen;
          std::vector<int> last_block(static_cast<size_t>(heads * batch), n_blocks);
          for (int tile = 0; tile < s.num_tiles(); ++tile) {
            const fc::TileCoord c = s.at(tile);
            REQUIRE(c.m_block >= 0);
            REQUIRE(c.head >= 0);
            REQUIRE(c.head < heads);
            REQUIRE(c.batch >= 0);
            REQUIRE(c.batch < batch);
            seen.insert({c.m_block, c.head, c.batch});
            const int pair = c.batch * heads + c.head;
            CHECK(pair / group_heads == tile / (group_heads * n_blocks));  // its own group
            CHECK(c.m_block == last_block[static_cast<size_t>(pair)] - 1);  // last first, no gap
            last_block[static_cast<size_t>(pair)] = c.m_block;
          }
          CHECK(static_cast<int64_t>(seen.size()) == s.num_tiles());
        }
  // 3 pairs in groups of 2, 2 blocks: (block 1 of pairs 0, 1), (block 0 of 0, 1), then pair 2.
  const fc::TileScheduler s{2, 3, 1, fc::TileOrder::kInterleavedReversed, 2};
  const int want[][2] = {{1, 0}, {1, 1}, {0, 0}, {0, 1}, {1, 2}, {0, 2}};
  for (int tile = 0; tile < 6; ++tile) {
    CHECK(s.at(tile).m_block == want[tile][0]);
    CHECK(s.at(tile).head == want[tile][1]);
  }
}

TEST_CASE("the busiest CTA's blocks, counted as the rounds deal them") {
  // Two query blocks of 1 and 2 key blocks, two heads, two CTAs. Longest first: round 0 gives
  // both CTAs a 2, the snake's round 1 both a 1. Side by side: 2 + 1 each as well. Three CTAs,
  // side by side: round 0 deals 2, 1, 2; round 1 (backwards) gives the last CTA the 1.
  const std::vector<int> blocks = {1, 2};  // key blocks of query blocks 0 and 1
  fc::TileScheduler s{2, 2, 1, fc::TileOrder::kLongestFirst};
  CHECK(fc::busiest_cta_blocks(s, 2, blocks) == 3);
  s.order = fc::TileOrder::kHeadMajorReversed;
  CHECK(fc::busiest_cta_blocks(s, 2, blocks) == 3);
  CHECK(fc::busiest_cta_blocks(s, 3, blocks) == 3);
  CHECK(fc::busiest_cta_blocks(s, 4, blocks) == 2);
}

TEST_CASE("a causal forward's order: side by side where the grid stays even") {
  constexpr int kSms = 132;  // the H100's and H200's
  // d128 tiles (128 x 128) of the papers' sweep: 16k tokens, 16 heads per sequence.
  CHECK(causal_order(1024, 16 * 16, 128, 128, kSms) == fc::TileOrder::kHeadMajorReversed);
  CHECK(causal_order(2048, 8 * 16, 128, 128, kSms) == fc::TileOrder::kHeadMajorReversed);
  CHECK(causal_order(8192, 2 * 16, 128, 128, kSms) == fc::TileOrder::kHeadMajorReversed);
  // One head's blocks fill most of a round: side by side would leave CTAs 1.5x busier.
  CHECK(causal_order(16384, 16, 128, 128, kSms) == fc::TileOrder::kLongestFirst);
  // 48 heads of 6 blocks on 132 CTAs: side by side deals some CTAs 1.7x the mean.
  CHECK(causal_order(700, 48, 128, 128, kSms) == fc::TileOrder::kLongestFirst);
  // More tiles than the host deals for a comparison: longest first.
  CHECK(causal_order(1024, 3000, 128, 128, kSms) == fc::TileOrder::kLongestFirst);
}

TEST_CASE("a shape asked again gets its own answer, whatever was asked between") {
  // The last answer is kept per thread; shapes that differ only in heads, grid or mask must
  // not take another's.
  for (int round = 0; round < 2; ++round) {
    CHECK(causal_order(16384, 16, 128, 128, 132) == fc::TileOrder::kLongestFirst);
    CHECK(causal_order(8192, 32, 128, 128, 132) == fc::TileOrder::kHeadMajorReversed);
    CHECK(causal_order(700, 48, 128, 128, 132) == fc::TileOrder::kLongestFirst);
    CHECK(causal_order(1024, 256, 128, 128, 132) == fc::TileOrder::kHeadMajorReversed);
  }
  // The same heads, query blocks and grid under another mask: equal tiles deal alike in both
  // orders (side by side), the causal ones do not (longest first).
  const fc::TileScheduler s{6, 48, 1};
  const CausalBlocks causal{fc::WindowMask(700, 700, -1, 0), 128, 128};
  const CausalBlocks full{fc::WindowMask(700, 700, -1, -1), 128, 128};
  CHECK(fc::side_by_side_if_balanced(s, 132, causal) == fc::TileOrder::kLongestFirst);
  CHECK(fc::side_by_side_if_balanced(s, 132, full) == fc::TileOrder::kHeadMajorReversed);
  CHECK(fc::side_by_side_if_balanced(s, 132, causal) == fc::TileOrder::kLongestFirst);
}

TEST_CASE("the keys a query row sees on average") {
  // No mask: every key. Causal, square: about half (rows sampled every 16th: 2041). Causal with
  // fewer queries than keys (bottom-right aligned): the last rows, nearly every key.
  CHECK(fc::WindowMask(4096, 4096, -1, -1).mean_visible_keys() == 4096);
  CHECK(fc::WindowMask(4096, 4096, -1, 0).mean_visible_keys() == 2041);
  CHECK(fc::WindowMask(1, 5000, -1, 0).mean_visible_keys() == 5000);
  CHECK(fc::WindowMask(200, 3400, -1, 0).mean_visible_keys() == 3300);
  // A window of 1024 keys left of the diagonal over 16k: the window, bar the first rows (990).
  const int64_t window = fc::WindowMask(16384, 16384, 1023, 0).mean_visible_keys();
  CHECK(window > 950);
  CHECK(window <= 1024);
  // Rows that see no key (more queries than keys, causal) count as none; no rows, none.
  CHECK(fc::WindowMask(300, 100, -1, 0).mean_visible_keys() == 16);
  CHECK(fc::WindowMask(0, 100, -1, -1).mean_visible_keys() == 0);
}

}  // TEST_SUITE
