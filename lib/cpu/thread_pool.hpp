// A small fork-join thread pool for the CPU backend: parallel_for over independent work items.
// Which thread runs an item never changes what the item computes, so results do not depend on
// the thread count. Self-contained (std and POSIX only) so tests can compile it on its own.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace flashattn {
namespace cpu {

class ThreadPool {
 public:
  // `threads` counts the calling thread: a pool of 1 runs everything on the caller. Worker
  // threads are started on the first parallel_for that can use them, and started again in a
  // process forked after that (the child has none of the parent's threads).
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

  // The worker threads and what they share with the caller, in one object: in a process forked
  // after the workers started, the threads do not exist and their condition variables still
  // count them as waiting, so joining or destroying any of it would wait forever. Such a crew is
  // abandoned (kept, never touched again) and a new one started.
  struct Crew {
    long process = 0;  // the process that started the threads
    std::vector<std::thread> workers;

    std::mutex mutex;
    std::condition_variable wake;
    std::condition_variable done;
    uint64_t generation = 0;  // bumped for every job; workers run each generation once
    bool stop = false;
    int busy = 0;  // workers still inside the current job

    // The current job.
    ItemFn fn = nullptr;
    void* ctx = nullptr;
    int64_t count = 0;
    std::atomic<int64_t> next{0};
    std::atomic<bool> failed{false};
    std::exception_ptr error;

    Crew* next_abandoned = nullptr;
  };

  void run(int64_t count, ItemFn fn, void* ctx);
  Crew& crew();  // the workers of this process, started on first use
  static void abandon(std::unique_ptr<Crew> crew) noexcept;
  static void worker_loop(Crew* crew, int worker);
  static void run_items(Crew& crew, int worker) noexcept;

  const int size_;
  std::unique_ptr<Crew> crew_;
};

// The number of hardware threads this process may run on (its CPU affinity), at least 1.
int hardware_threads() noexcept;

}  // namespace cpu
}  // namespace flashattn
