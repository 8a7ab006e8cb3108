// A small fork-join thread pool for the CPU backend: parallel_for over independent work items.
// Which thread runs an item never changes what the item computes, so results do not depend on
// the thread count. Self-contained (std only) so tests can compile it on its own.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace flashattn {
namespace cpu {

class ThreadPool {
 public:
  // `threads` counts the calling thread: a pool of 1 runs everything on the caller. Worker
  // threads are started on the first parallel_for that can use them.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return size_; }

  // Runs body(item, worker) for every item in [0, count), worker in [0, size()), and returns
  // when all are done. An exception thrown by an item stops the remaining items from starting
  // and is rethrown here, on the calling thread (the first one, when several throw). Not
  // reentrant: an item must not call parallel_for on the same pool.
  template <class Body>
  void parallel_for(int64_t count, Body&& body) {
    using B = typename std::remove_reference<Body>::type;
    run(
        count, [](void* ctx, int64_t item, int worker) { (*static_cast<B*>(ctx))(item, worker); },
        const_cast<void*>(static_cast<const void*>(&body)));
  }

 private:
  using ItemFn = void (*)(void*, int64_t, int);
  void run(int64_t count, ItemFn fn, void* ctx);
  void start_workers();
  void worker_loop(int worker);
  void run_items(int worker) noexcept;

  const int size_;
  std::vector<std::thread> workers_;
  bool started_ = false;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  uint64_t generation_ = 0;  // bumped for every job; workers run each generation once
  bool stop_ = false;
  int busy_ = 0;  // workers still inside the current job

  // The current job.
  ItemFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t count_ = 0;
  std::atomic<int64_t> next_{0};
  std::atomic<bool> failed_{false};
  std::exception_ptr error_;
};

// The number of hardware threads this process may run on (its CPU affinity), at least 1.
int hardware_threads() noexcept;

}  // namespace cpu
}  // namespace flashattn
