#include "cpu/thread_pool.hpp"

#include <system_error>

#include <unistd.h>

#if defined(__linux__)
#include <sched.h>
#endif

namespace flashattn {
namespace cpu {

namespace {

// Crews left behind by fork(): reachable from here for the rest of the process, so that leak
// checkers do not count them, and never freed (their threads are gone; see Crew).
std::atomic<void*> g_abandoned{nullptr};

}  // namespace

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

void ThreadPool::abandon(std::unique_ptr<Crew> crew) noexcept {
  Crew* lost = crew.release();
  void* head = g_abandoned.load();
  do {
    lost->next_abandoned = static_cast<Crew*>(head);
  } while (!g_abandoned.compare_exchange_weak(head, lost));
}

ThreadPool::~ThreadPool() {
  if (!crew_) return;
  if (crew_->process != static_cast<long>(getpid())) {
    abandon(std::move(crew_));
    return;
  }
  {
    std::lock_guard<std::mutex> lock(crew_->mutex);
    crew_->stop = true;
  }
  crew_->wake.notify_all();
  for (std::thread& t : crew_->workers) t.join();
}

ThreadPool::Crew& ThreadPool::crew() {
  const long process = static_cast<long>(getpid());
  if (crew_ && crew_->process == process) return *crew_;
  if (crew_) abandon(std::move(crew_));  // forked: the workers stayed in the parent
  crew_ = std::make_unique<Crew>();
  crew_->process = process;
  crew_->workers.reserve(static_cast<size_t>(size_ - 1));
  for (int w = 1; w < size_; ++w) {
    try {
      crew_->workers.emplace_back(worker_loop, crew_.get(), w);
    } catch (const std::system_error&) {
      break;  // the process is out of threads: the ones started (and the caller) do the work
    }
  }
  return *crew_;
}

void ThreadPool::worker_loop(Crew* crew, int worker) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(crew->mutex);
      crew->wake.wait(lock, [&] { return crew->stop || crew->generation != seen; });
      if (crew->stop) return;
      seen = crew->generation;
    }
    run_items(*crew, worker);
    {
      std::lock_guard<std::mutex> lock(crew->mutex);
      if (--crew->busy == 0) crew->done.notify_one();
    }
  }
}

void ThreadPool::run_items(Crew& crew, int worker) noexcept {
  while (!crew.failed.load(std::memory_order_relaxed)) {
    const int64_t item = crew.next.fetch_add(1, std::memory_order_relaxed);
    if (item >= crew.count) return;
    try {
      crew.fn(crew.ctx, item, worker);
    } catch (...) {
      std::lock_guard<std::mutex> lock(crew.mutex);
      if (!crew.error) crew.error = std::current_exception();
      crew.failed.store(true, std::memory_order_relaxed);
    }
  }
}

void ThreadPool::run(int64_t count, ItemFn fn, void* ctx) {
  if (count <= 0) return;
  if (size_ == 1 || count == 1) {
    for (int64_t i = 0; i < count; ++i) fn(ctx, i, 0);
    return;
  }
  Crew& c = crew();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    c.fn = fn;
    c.ctx = ctx;
    c.count = count;
    c.next.store(0, std::memory_order_relaxed);
    c.failed.store(false, std::memory_order_relaxed);
    c.error = nullptr;
    c.busy = static_cast<int>(c.workers.size());
    ++c.generation;
  }
  c.wake.notify_all();
  run_items(c, 0);
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(c.mutex);
    c.done.wait(lock, [&] { return c.busy == 0; });
    error = c.error;
    c.error = nullptr;
    c.fn = nullptr;
    c.ctx = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace cpu
}  // namespace flashattn
