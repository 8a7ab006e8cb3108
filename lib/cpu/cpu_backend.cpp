// The CPU backend: host memory, a thread pool, and the flash and standard algorithms of
// kernels_impl.hpp, compiled per instruction set and picked once when the backend is created.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "core/backend.hpp"
#include "core/error.hpp"
#include "cpu/kernels.hpp"
#include "cpu/kv_cache.hpp"
#include "cpu/plan.hpp"
#include "cpu/ring_ops.hpp"
#include "cpu/sequences.hpp"
#include "cpu/thread_pool.hpp"

namespace flashattn {
namespace {

using cpu::KernelSet;

constexpr int kMaxThreads = 1024;
constexpr size_t kMaxAllocation = size_t(1) << 47;  // the x86-64 user address space

int isa_rank(const char* name) {
  if (std::strcmp(name, "generic") == 0) return 0;
  if (std::strcmp(name, "avx2") == 0) return 1;
  if (std::strcmp(name, "avx512") == 0) return 2;
  if (std::strcmp(name, "avx512bf16") == 0) return 3;
  if (std::strcmp(name, "amx") == 0) return 4;
  return 99;  // unknown: no limit
}

// The API's value for a kernel copy: GENERIC up to AMX in isa_rank's order.
flashattn_cpu_kernels_t kernels_kind(const char* isa) {
  static_assert(FLASHATTN_CPU_KERNELS_AMX - FLASHATTN_CPU_KERNELS_GENERIC == 4, "isa_rank's order");
  return static_cast<flashattn_cpu_kernels_t>(FLASHATTN_CPU_KERNELS_GENERIC + isa_rank(isa));
}

// Whether this CPU issues vdpbf16ps at the rate of its fp32 FMA, so that bf16 pairs do twice
// the multiply-adds (AMD Zen 4 and 5, docs/perf/cpu-2026-12-02-zen4.md and -zen5.md); an
// Emerald Rapids Xeon issued it at a quarter of that rate (cpu-2026-12-02.md), where the fp32
// path is faster. Decided by the vendor, not by timing, so that a machine always computes the
// same bits.
bool bf16_pairs_at_fma_rate() {
#if defined(__x86_64__)
  return __builtin_cpu_is("amd") && __builtin_cpu_supports("avx512bf16");
#else
  return false;
#endif
}

// Whether this CPU has AMX-BF16 tiles and the OS lets this process use them: CPUID says the CPU
// has them, XCR0 that the OS saves their state, and Linux grants the process the tile data on
// request (arch_prctl ARCH_REQ_XCOMP_PERM: once per process, kept by its forks). The amx copy
// also runs AVX-512 BF16 (the ranged products' remainders). A build with
// FLASHATTN_CPU_AMX_EMULATED emulates the tiles, so there AVX-512 BF16 is enough.
bool amx_granted() {
#if defined(__x86_64__)
  if (!__builtin_cpu_supports("avx512bf16")) return false;
#if defined(FLASHATTN_CPU_AMX_EMULATED)
  return true;
#elif defined(__linux__)
  constexpr unsigned kAmxBf16 = 1u << 22, kAmxTile = 1u << 24;  // CPUID.(7, 0):EDX
  constexpr unsigned kOsXsave = 1u << 27;                        // CPUID.1:ECX
  constexpr uint64_t kXcr0TileState = (1u << 17) | (1u << 18);   // XTILECFG, XTILEDATA
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtileData = 18;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d) || (c & kOsXsave) == 0) return false;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || (d & kAmxBf16) == 0 || (d & kAmxTile) == 0) {
    return false;
  }
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  const uint64_t xcr0 = (static_cast<uint64_t>(hi) << 32) | lo;
  if ((xcr0 & kXcr0TileState) != kXcr0TileState) return false;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtileData) == 0;
#else
  return false;
#endif
#else
  return false;
#endif
}

// The best instruction set this CPU (and OS) supports, lowered by FLASHATTN_CPU_ISA
// ("generic", "avx2", "avx512", "avx512bf16" or "amx") when set, so every copy can be tested on one
// machine.
const KernelSet& select_kernels() {
  int best = 0;
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    best = 1;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq")) {
      best = 2;
      if (bf16_pairs_at_fma_rate()) best = 3;
      if (amx_granted()) best = 4;
    }
  }
#endif
  if (const char* limit = std::getenv("FLASHATTN_CPU_ISA")) best = std::min(best, isa_rank(limit));
#if defined(__x86_64__)
  if (best == 4) return cpu::kernels_amx();
  if (best == 3) return cpu::kernels_avx512bf16();
  if (best == 2) return cpu::kernels_avx512();
  if (best == 1) return cpu::kernels_avx2();
#endif
  return cpu::kernels_generic();
}

// A variable-length batch's offsets and lengths against the header's rules (host memory, so
// they can be read before any work starts; every message names the first offending entry).
void check_offsets(const Problem& p, const VariantViews& v) {
  if (!p.varlen) return;
  const struct {
    const char* name;
    Vector<const int32_t> offsets;
    int64_t total;
    const char* tensor;
    int64_t max;
    const char* max_name;
  } sides[] = {{"cu_seqlens_q", v.cu_seqlens_q, p.total_q, "q", p.seqlen_q, "max_seqlen_q"},
               {"cu_seqlens_k", v.cu_seqlens_k, p.total_k, "k", p.seqlen_k, "max_seqlen_k"}};
  for (const auto& side : sides) {
    const int64_t first = side.offsets.at(0);
    if (first != 0) {
      fail(FLASHATTN_ERROR_INVALID_SHAPE, "%s[0] is %lld; the offsets must start at 0",
           side.name, static_cast<long long>(first));
    }
    for (int64_t b = 0; b < p.batch; ++b) {
      const int64_t begin = side.offsets.at(b), end = side.offsets.at(b + 1);
      if (end < begin) {
        fail(FLASHATTN_ERROR_INVALID_SHAPE,
             "%s[%lld] is %lld, below %s[%lld] = %lld; the offsets must not decrease", side.name,
             static_cast<long long>(b + 1), static_cast<long long>(end), side.name,
             static_cast<long long>(b), static_cast<long long>(begin));
      }
      if (end > side.total) {
        fail(FLASHATTN_ERROR_INVALID_SHAPE,
             "%s[%lld] is %lld, past the end of %s's %lld tokens", side.name,
             static_cast<long long>(b + 1), static_cast<long long>(end), side.tensor,
             static_cast<long long>(side.total));
      }
      if (end - begin > side.max) {
        fail(FLASHATTN_ERROR_INVALID_SHAPE,
             "sequence %lld has %lld %s, more than %s = %lld", static_cast<long long>(b),
             static_cast<long long>(end - begin), side.tensor[0] == 'q' ? "queries" : "keys",
             side.max_name, static_cast<long long>(side.max));
      }
    }
  }
}

class CpuBackend final : public Backend {
 public:
  CpuBackend() : kernels_(select_kernels()), threads_(clamp_threads(cpu::hardware_threads())) {}

  flashattn_backend_t kind() const override { return FLASHATTN_BACKEND_CPU; }
  int device() const override { return -1; }
  flashattn_cpu_kernels_t cpu_kernels() const override { return kernels_kind(kernels_.isa); }

  void check_supported(const Problem& p, bool) const override {
    if (p.dtype != DType::F32 && p.dtype != DType::F16 && p.dtype != DType::BF16) {
      fail(FLASHATTN_ERROR_UNSUPPORTED, "the CPU backend has no dtype %d",
           static_cast<int>(p.dtype));
    }
    if (p.head_dim < 1 || p.head_dim > cpu::kMaxHeadDim) {
      fail(FLASHATTN_ERROR_UNSUPPORTED, "the CPU backend supports head_dim 1 to %d, not %lld",
           cpu::kMaxHeadDim, static_cast<long long>(p.head_dim));
    }
  }

  // A KV cache call's rotated copy of q first, then the plan's scratch.
  size_t workspace_size(const Problem& p, bool backward) const override {
    return cpu::rotated_queries_bytes(p) + cpu::make_plan(p, backward, threads_.load()).total;
  }

  void forward(const ForwardArgs& args, Workspace ws) override {
    check_offsets(args.problem, args.variants);
    if (args.problem.kv_cache != KvCache::None) cpu::check_cache(args);
    cpu::ThreadPool& threads = pool();
    const size_t rotated = cpu::rotated_queries_bytes(args.problem);
    const Workspace scratch{static_cast<char*>(ws.data) + rotated, ws.size - std::min(ws.size, rotated)};
    const cpu::Plan plan = planned(args.problem, false, scratch, threads);
    ForwardArgs a = args;
    if (a.problem.kv_cache != KvCache::None) {
      // Appended first: the attention reads the new rows from the cache like any other.
      cpu::append_to_cache(a, threads);
      if (a.problem.rotary_dim > 0) a.q = cpu::rotate_queries(a, ws.data, threads);
    }
    kernels_.forward(a, plan, static_cast<char*>(scratch.data), threads);
  }

  void backward(const BackwardArgs& args, Workspace ws) override {
    check_offsets(args.problem, args.variants);
    cpu::ThreadPool& threads = pool();
    const cpu::Plan plan = planned(args.problem, true, ws, threads);
    kernels_.backward(args, plan, static_cast<char*>(ws.data), threads);
  }

  void check_merge_supported(DType) const override {}  // every dtype, float32 included

  void merge(const MergeArgs& args) override { kernels_.merge(args, pool()); }

  void ring_op(const RingOp& op) override { cpu::ring_op(op, pool()); }
  std::unique_ptr<RingTransport> make_nccl_transport(void*, int64_t, int64_t) override {
    fail(FLASHATTN_ERROR_UNSUPPORTED,
         "cp: NCCL moves device memory; a CPU context takes an exchange function instead");
  }

  void* allocate(size_t bytes) override {
    if (bytes > kMaxAllocation) {
      fail(FLASHATTN_ERROR_OUT_OF_MEMORY,
           "cannot allocate %zu bytes of host memory (more than the address space holds)", bytes);
    }
    const size_t rounded = std::max<size_t>(256, (bytes + 255) / 256 * 256);
    void* p = std::aligned_alloc(256, rounded);
    if (p == nullptr)
      fail(FLASHATTN_ERROR_OUT_OF_MEMORY, "could not allocate %zu bytes of host memory", bytes);
    return p;
  }
  void deallocate(void* ptr) noexcept override { std::free(ptr); }
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  // Every tensor of a CPU context is host memory; there is nothing the CPU can verify about a
  // host pointer short of touching it.
  void check_memory(const void*, size_t, const char*) const override {}

  void set_stream(void*) override {}
  void* stream() const override { return nullptr; }
  void synchronize() override {}

  void set_num_threads(int n) override {
    const int threads = clamp_threads(n == 0 ? cpu::hardware_threads() : n);
    std::lock_guard<std::mutex> lock(pool_mutex_);
    if (threads == threads_.load()) return;
    pool_.reset();  // joins the old workers; the next call starts the new ones
    threads_.store(threads);
  }

 private:
  static int clamp_threads(int n) { return std::max(1, std::min(n, kMaxThreads)); }

  // The plan workspace_size answered for, checked against the workspace and the pool (each
  // pool thread owns one per-thread area).
  cpu::Plan planned(const Problem& p, bool backward, const Workspace& ws,
                    const cpu::ThreadPool& threads) const {
    cpu::Plan plan = cpu::make_plan(p, backward, threads_.load());
    if (plan.threads < threads.size()) {
      fail(FLASHATTN_ERROR_INTERNAL, "the CPU plan has %d thread areas for a pool of %d",
           plan.threads, threads.size());
    }
    if (ws.size < plan.total || (plan.total > 0 && ws.data == nullptr)) {
      fail(FLASHATTN_ERROR_INTERNAL, "the workspace holds %zu bytes; the CPU plan needs %zu",
           ws.size, plan.total);
    }
    return plan;
  }

  cpu::ThreadPool& pool() {
    std::lock_guard<std::mutex> lock(pool_mutex_);
    if (!pool_) pool_ = std::make_unique<cpu::ThreadPool>(threads_.load());
    return *pool_;
  }

  const KernelSet& kernels_;
  std::atomic<int> threads_;  // read by workspace_size, which may run beside set_num_threads
  std::mutex pool_mutex_;
  std::unique_ptr<cpu::ThreadPool> pool_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace flashattn
