#include "cpu/thread_pool.hpp"

#include <system_error>

#if defined(__linux__)
#include <sched.h>
#endif

namespace flashattn {
namespace cpu {

int hardware_threads() noexcept {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
#endif
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? static_cast<int>(n) : 1;
}

ThreadPool::ThreadPool(int threads) : size_(threads < 1 ? 1 : threads) {}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::start_workers() {
  started_ = true;
  workers_.reserve(static_cast<size_t>(size_ - 1));
  for (int w = 1; w < size_; ++w) {
    try {
      workers_.emplace_back([this, w] { worker_loop(w); });
    } catch (const std::system_error&) {
      break;  // the process is out of threads: the ones started (and the caller) do the work
    }
  }
}

void ThreadPool::worker_loop(int worker) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    run_items(worker);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (--busy_ == 0) done_.notify_one();
    }
  }
}

void ThreadPool::run_items(int worker) noexcept {
  while (!failed_.load(std::memory_order_relaxed)) {
    const int64_t item = next_.fetch_add(1, std::memory_order_relaxed);
    if (item >= count_) return;
    try {
      fn_(ctx_, item, worker);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
      failed_.store(true, std::memory_order_relaxed);
    }
  }
}

void ThreadPool::run(int64_t count, ItemFn fn, void* ctx) {
  if (count <= 0) return;
  if (size_ == 1 || count == 1) {
    for (int64_t i = 0; i < count; ++i) fn(ctx, i, 0);
    return;
  }
  if (!started_) start_workers();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    fn_ = fn;
    ctx_ = ctx;
    count_ = count;
    next_.store(0, std::memory_order_relaxed);
    failed_.store(false, std::memory_order_relaxed);
    error_ = nullptr;
    busy_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  wake_.notify_all();
  run_items(0);
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return busy_ == 0; });
    error = error_;
    error_ = nullptr;
    fn_ = nullptr;
    ctx_ = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace cpu
}  // namespace flashattn
