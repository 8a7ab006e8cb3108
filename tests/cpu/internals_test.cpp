// Pieces of the CPU backend tested on their own: the thread pool and the element conversions.
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "core/half.hpp"
#include "cpu/convert.hpp"
#include "cpu/thread_pool.hpp"

using flashattn::cpu::ThreadPool;

TEST_SUITE("cpu_internals") {
  TEST_CASE("thread pool: every item runs exactly once, on a worker index below size()") {
    for (int threads : {1, 2, 3, 8}) {
      ThreadPool pool(threads);
      CHECK(pool.size() == threads);
      for (int64_t count : {0, 1, 2, 7, 1000}) {
        std::vector<std::atomic<int>> runs(static_cast<size_t>(count));
        std::atomic<bool> bad_worker{false};
        pool.parallel_for(count, [&](int64_t item, int worker) {
          if (worker < 0 || worker >= threads) bad_worker = true;
          runs[static_cast<size_t>(item)].fetch_add(1);
        });
        CHECK_FALSE(bad_worker.load());
        for (auto& r : runs) CHECK(r.load() == 1);
      }
    }
  }

  TEST_CASE("thread pool: an item's exception reaches the caller, and the pool stays usable") {
    for (int threads : {1, 3}) {
      ThreadPool pool(threads);
      std::atomic<int> ran{0};
      CHECK_THROWS_AS(pool.parallel_for(100,
                                        [&](int64_t item, int) {
                                          ran.fetch_add(1);
                                          if (item == 5) throw std::runtime_error("item 5 failed");
                                        }),
                      std::runtime_error);
      CHECK(ran.load() >= 6);
      std::atomic<int64_t> sum{0};
      pool.parallel_for(100, [&](int64_t item, int) { sum.fetch_add(item); });
      CHECK(sum.load() == 4950);
    }
  }

  TEST_CASE("thread pool: threads really run side by side") {
    // Two items that wait for each other finish only if two threads run them at once.
    ThreadPool pool(2);
    std::atomic<int> arrived{0};
    pool.parallel_for(2, [&](int64_t, int) {
      arrived.fetch_add(1);
      while (arrived.load() < 2) {
      }
    });
    CHECK(arrived.load() == 2);
  }

  TEST_CASE("fp16 and bf16 loads agree with core/half.hpp for every bit pattern") {
    int fp16_mismatch = 0, bf16_mismatch = 0;
    for (uint32_t h = 0; h <= 0xffff; ++h) {
      const float a = flashattn::cpu::fp16_load(static_cast<uint16_t>(h));
      const float b = flashattn::fp16_to_float(static_cast<uint16_t>(h));
      if (std::memcmp(&a, &b, 4) != 0) ++fp16_mismatch;
      const float c = flashattn::cpu::bf16_load(static_cast<uint16_t>(h));
      const float d = flashattn::bf16_to_float(static_cast<uint16_t>(h));
      if (std::memcmp(&c, &d, 4) != 0) ++bf16_mismatch;
    }
    CHECK(fp16_mismatch == 0);
    CHECK(bf16_mismatch == 0);
  }

}  // TEST_SUITE
