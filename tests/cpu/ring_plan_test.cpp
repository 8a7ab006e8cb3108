// Ring attention's plan on its own: every (query, key) pair the global mask shows is in exactly
// one call of exactly one step, and no call shows a pair the mask hides.
#include <doctest/doctest.h>

#include <cstddef>
#include <vector>

#include "parallel/ring_plan.hpp"

using namespace flashattn::parallel;

namespace {

int64_t global_position(const std::vector<Chunk>& chunks, int64_t local) {
  for (const Chunk& c : chunks) {
    if (local >= c.local_begin && local < c.local_begin + c.length) {
      return c.global_begin + local - c.local_begin;
    }
  }
  FAIL("row outside the shard");
  return -1;
}

bool call_shows(const RingCall& c, int64_t i, int64_t j) {
  if (i < c.q_begin || i >= c.q_end || j < c.k_begin || j >= c.k_end) return false;
  const int64_t ci = i - c.q_begin, cj = j - c.k_begin;
  const int64_t diag = (c.k_end - c.k_begin) - (c.q_end - c.q_begin);
  if (c.window_left >= 0 && cj < ci + diag - c.window_left) return false;
  if (c.window_right >= 0 && cj > ci + diag + c.window_right) return false;
  return true;
}

bool mask_shows(GlobalMask m, int64_t i, int64_t j) {
  if (m.left >= 0 && j < i - m.left) return false;
  if (m.right >= 0 && j > i + m.right) return false;
  return true;
}

void check_plan(Layout layout, int64_t ranks, int64_t n, GlobalMask m) {
  const int64_t total = ranks * n;
  // covered[qi][kj] over global positions: how many calls show the pair.
  std::vector<int> covered(static_cast<size_t>(total * total), 0);
  for (int64_t rank = 0; rank < ranks; ++rank) {
    const std::vector<Chunk> qc = shard_chunks(layout, ranks, rank, n);
    for (int64_t step = 0; step < ranks; ++step) {
      const int64_t source = shard_at_step(ranks, rank, step);
      const std::vector<Chunk> kc = shard_chunks(layout, ranks, source, n);
      for (const RingCall& c : ring_calls(layout, ranks, rank, source, n, m)) {
        REQUIRE(c.q_begin < c.q_end);
        REQUIRE(c.k_begin < c.k_end);
        REQUIRE(c.q_end <= n);
        REQUIRE(c.k_end <= n);
        REQUIRE(c.window_left >= -1);
        REQUIRE(c.window_right >= -1);
        for (int64_t i = c.q_begin; i < c.q_end; ++i) {
          for (int64_t j = c.k_begin; j < c.k_end; ++j) {
            if (!call_shows(c, i, j)) continue;
            const int64_t gi = global_position(qc, i), gj = global_position(kc, j);
            ++covered[static_cast<size_t>(gi * total + gj)];
          }
        }
      }
    }
  }
  int wrong = 0;
  for (int64_t i = 0; i < total; ++i) {
    for (int64_t j = 0; j < total; ++j) {
      const int want = mask_shows(m, i, j) ? 1 : 0;
      if (covered[static_cast<size_t>(i * total + j)] != want) ++wrong;
    }
  }
  INFO("layout " << static_cast<int>(layout) << " ranks " << ranks << " n " << n << " left "
                 << m.left << " right " << m.right);
  CHECK(wrong == 0);
}

}  // namespace

TEST_SUITE("cpu_ring_plan") {
  TEST_CASE("zigzag shards: chunk r and chunk 2 ranks - 1 - r") {
    const std::vector<Chunk> c = shard_chunks(Layout::Zigzag, 4, 1, 6);
    REQUIRE(c.size() == 2);
    CHECK(c[0].global_begin == 3);
    CHECK(c[1].global_begin == 18);
    CHECK(c[1].local_begin == 3);
    CHECK(shard_at_step(4, 1, 0) == 1);
    CHECK(shard_at_step(4, 1, 2) == 3);
  }

  TEST_CASE("every pair the mask shows in exactly one call, none it hides") {
    const int64_t windows[] = {-1, 0, 1, 2, 3, 5, 8, 13};
    for (int64_t ranks = 1; ranks <= 5; ++ranks) {
      for (int64_t n : {2, 4, 6}) {
        for (Layout layout : {Layout::Contiguous, Layout::Zigzag}) {
          for (int64_t left : windows) {
            for (int64_t right : windows) check_plan(layout, ranks, n, GlobalMask{left, right});
          }
        }
      }
    }
    check_plan(Layout::Contiguous, 3, 5, GlobalMask{2, 0});
    check_plan(Layout::Contiguous, 2, 1, GlobalMask{-1, 0});
  }

  TEST_CASE("causal zigzag: one call a step, the same work on every rank") {
    const int64_t ranks = 4, n = 8;
    for (int64_t rank = 0; rank < ranks; ++rank) {
      int64_t work = 0;
      for (int64_t step = 0; step < ranks; ++step) {
        const auto calls = ring_calls(Layout::Zigzag, ranks, rank, shard_at_step(ranks, rank, step),
                                      n, GlobalMask{-1, 0});
        CHECK(calls.size() == 1);
        for (const RingCall& c : calls) {
          work += (c.q_end - c.q_begin) * (c.k_end - c.k_begin) / (c.window_right == 0 ? 2 : 1);
        }
      }
      CHECK(work == n * n / 2 + (ranks - 1) * n * n / 2);
    }
  }

  TEST_CASE("no mask: one unmasked call over both shards at every step") {
    for (Layout layout : {Layout::Contiguous, Layout::Zigzag}) {
      for (int64_t step = 0; step < 3; ++step) {
        const auto calls = ring_calls(layout, 3, 1, shard_at_step(3, 1, step), 6, GlobalMask{});
        REQUIRE(calls.size() == 1);
        CHECK(calls[0].unmasked());
        CHECK(calls[0].q_end - calls[0].q_begin == 6);
        CHECK(calls[0].k_end - calls[0].k_begin == 6);
      }
    }
  }
}
