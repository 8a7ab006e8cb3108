// Context-parallel benchmark (a program, not a test): forward+backward of one long sequence on
// one GPU, then split across `--ranks` GPUs by flashattn_cp_forward / flashattn_cp_backward over
// NCCL (one process, a thread per GPU, ncclCommInitAll), in the same run. Prints the median time
// of --reps runs, TFLOP/s (forward+backward 3.5 * 4 * B * H * N^2 * D, halved for causal), TFLOP/s
// per GPU and its ratio to the one-GPU figure, and max |ring - one GPU| of out, dq, dk and dv
// (the sequence's results gathered onto GPU 0), beside max |one GPU| for scale.
//
//   cp_benchmark [--tokens N] [--heads H] [--heads-kv H] [--dim D] [--dtype bf16|fp16]
//                [--ranks P] [--layout zigzag|contiguous] [--causal yes|no]
//                [--reps N] [--warmup N]
//
// Defaults: 131072 tokens, 16 heads of 128 (hidden 2048), bf16, causal, zigzag, every visible
// GPU. NCCL: libnccl.so.2 on the loader's path (PyTorch's wheel ships one: put its lib folder on
// LD_LIBRARY_PATH). Keep NVLink multicast off: NCCL_NVLS_ENABLE=0.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <flashattn/flashattn.h>

#include "device_random.cuh"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

#define CUDA_OK(expr)                                                                   \
  do {                                                                                  \
    const cudaError_t e_ = (expr);                                                      \
    if (e_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #expr,                \
                   cudaGetErrorString(e_));                                             \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)
#define FA_OK(expr)                                                                     \
  do {                                                                                  \
    const flashattn_status_t s_ = (expr);                                               \
    if (s_ != FLASHATTN_SUCCESS) {                                                      \
      std::fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #expr,            \
                   flashattn_status_string(s_), flashattn_last_error());                \
      std::exit(1);                                                                     \
    }                                                                                   \
  } while (0)

struct Config {
  int64_t tokens = 131072, heads = 16, heads_kv = 0, dim = 128;
  flashattn_dtype_t dtype = FLASHATTN_DTYPE_BFLOAT16;
  int ranks = 0;
  int64_t layout = FLASHATTN_CP_LAYOUT_ZIGZAG;
  bool causal = true;
  int reps = 5, warmup = 2;
};

// max |a - b| and max |b| over n elements, into two floats (atomicMax on their bits: both >= 0).
template <class T>
__global__ void max_diff(const T* a, const T* b, size_t n, float* out) {
  float d = 0.0f, m = 0.0f;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float x = static_cast<float>(a[i]), y = static_cast<float>(b[i]);
    d = fmaxf(d, fabsf(x - y));
    m = fmaxf(m, fabsf(y));
  }
  atomicMax(reinterpret_cast<int*>(out), __float_as_int(d));
  atomicMax(reinterpret_cast<int*>(out + 1), __float_as_int(m));
}

// The rank threads meet here before and after each timed run.
class Barrier {
 public:
  explicit Barrier(int count) : count_(count) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    const int generation = generation_;
    if (++waiting_ == count_) {
      waiting_ = 0;
      ++generation_;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return generation != generation_; });
    }
  }

 private:
  int count_, waiting_ = 0, generation_ = 0;
  std::mutex mutex_;
  std::condition_variable cv_;
};

size_t elem(flashattn_dtype_t t) { return t == FLASHATTN_DTYPE_FLOAT32 ? 4 : 2; }

void fill(void* p, size_t n, flashattn_dtype_t t, uint64_t seed) {
  if (t == FLASHATTN_DTYPE_BFLOAT16) {
    fill_normal<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), n, seed);
  } else {
    fill_normal<<<1024, 256>>>(static_cast<__half*>(p), n, seed);
  }
  CUDA_OK(cudaGetLastError());
}

std::pair<float, float> compare(const void* a, const void* b, size_t n, flashattn_dtype_t t) {
  float* d = nullptr;
  CUDA_OK(cudaMalloc(&d, 2 * sizeof(float)));
  CUDA_OK(cudaMemset(d, 0, 2 * sizeof(float)));
  if (t == FLASHATTN_DTYPE_BFLOAT16) {
    max_diff<<<1024, 256>>>(static_cast<const __nv_bfloat16*>(a), static_cast<const __nv_bfloat16*>(b), n, d);
  } else {
    max_diff<<<1024, 256>>>(static_cast<const __half*>(a), static_cast<const __half*>(b), n, d);
  }
  float h[2];
  CUDA_OK(cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaFree(d));
  return {h[0], h[1]};
}

// The tensors of one attention call over `tokens` rows (batch 1), on the current device.
struct Tensors {
  int64_t tokens = 0;
  void *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr, *dout = nullptr, *dq = nullptr,
       *dk = nullptr, *dv = nullptr;
  float* lse = nullptr;
  flashattn_tensor_t tq, tk, tv, tout, tdout, tdq, tdk, tdv, tlse;
  flashattn_options_t options;
  flashattn_args_t args;

  Tensors(const Config& c, int64_t n) : tokens(n) {
    const int64_t hkv = c.heads_kv;
    const size_t e = elem(c.dtype);
    const size_t qn = size_t(n) * c.heads * c.dim, kn = size_t(n) * hkv * c.dim;
    for (void** p : {&q, &out, &dout, &dq}) CUDA_OK(cudaMalloc(p, qn * e));
    for (void** p : {&k, &v, &dk, &dv}) CUDA_OK(cudaMalloc(p, kn * e));
    CUDA_OK(cudaMalloc(&lse, size_t(n) * c.heads * sizeof(float)));
    FA_OK(flashattn_tensor_4d(&tq, q, c.dtype, 1, n, c.heads, c.dim));
    FA_OK(flashattn_tensor_4d(&tout, out, c.dtype, 1, n, c.heads, c.dim));
    FA_OK(flashattn_tensor_4d(&tdout, dout, c.dtype, 1, n, c.heads, c.dim));
    FA_OK(flashattn_tensor_4d(&tdq, dq, c.dtype, 1, n, c.heads, c.dim));
    FA_OK(flashattn_tensor_4d(&tk, k, c.dtype, 1, n, hkv, c.dim));
    FA_OK(flashattn_tensor_4d(&tv, v, c.dtype, 1, n, hkv, c.dim));
    FA_OK(flashattn_tensor_4d(&tdk, dk, c.dtype, 1, n, hkv, c.dim));
    FA_OK(flashattn_tensor_4d(&tdv, dv, c.dtype, 1, n, hkv, c.dim));
    FA_OK(flashattn_tensor_lse(&tlse, lse, 1, c.heads, n));
    flashattn_options_init(&options);
    options.causal = c.causal ? 1 : 0;
    flashattn_args_init(&args);
    args.options = &options;
    args.q = &tq;
    args.k = &tk;
    args.v = &tv;
    args.out = &tout;
    args.lse = &tlse;
    args.dout = &tdout;
    args.dq = &tdq;
    args.dk = &tdk;
    args.dv = &tdv;
  }
  ~Tensors() {
    for (void* p : {q, k, v, out, dout, dq, dk, dv, static_cast<void*>(lse)}) cudaFree(p);
  }
};

// Rank r's local rows as runs of global rows: (local row, global row, count).
struct Run {
  int64_t local, global, count;
};
std::vector<Run> runs_of(const Config& c, int ranks, int r) {
  const int64_t n = c.tokens / ranks;
  if (c.layout == FLASHATTN_CP_LAYOUT_CONTIGUOUS) return {{0, r * n, n}};
  const int64_t half = n / 2;
  return {{0, r * half, half}, {half, (2 * ranks - 1 - r) * half, half}};
}

// Copies rows between a global [tokens, heads, dim] tensor on device 0 and a shard on device r.
void copy_rows(void* shard, int r_device, const void* global, const std::vector<Run>& runs,
               size_t row_bytes, bool to_shard) {
  for (const Run& run : runs) {
    char* s = static_cast<char*>(shard) + run.local * row_bytes;
    char* g = static_cast<char*>(const_cast<void*>(global)) + run.global * row_bytes;
    if (to_shard) {
      CUDA_OK(cudaMemcpyPeer(s, r_device, g, 0, run.count * row_bytes));
    } else {
      CUDA_OK(cudaMemcpyPeer(g, 0, s, r_device, run.count * row_bytes));
    }
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int parse(int argc, char** argv, Config* c) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--tokens") c->tokens = std::atoll(next());
    else if (a == "--heads") c->heads = std::atoll(next());
    else if (a == "--heads-kv") c->heads_kv = std::atoll(next());
    else if (a == "--dim") c->dim = std::atoll(next());
    else if (a == "--dtype") c->dtype = std::string(next()) == "fp16" ? FLASHATTN_DTYPE_FLOAT16 : FLASHATTN_DTYPE_BFLOAT16;
    else if (a == "--ranks") c->ranks = std::atoi(next());
    else if (a == "--layout") c->layout = std::string(next()) == "contiguous" ? FLASHATTN_CP_LAYOUT_CONTIGUOUS : FLASHATTN_CP_LAYOUT_ZIGZAG;
    else if (a == "--causal") c->causal = std::string(next()) != "no";
    else if (a == "--reps") c->reps = std::atoi(next());
    else if (a == "--warmup") c->warmup = std::atoi(next());
    else {
      std::fprintf(stderr, "unknown argument %s (see the comment at the top of cp_benchmark.cu)\n", a.c_str());
      return 2;
    }
  }
  if (c->heads_kv == 0) c->heads_kv = c->heads;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  if (int rc = parse(argc, argv, &c)) return rc;
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: nothing measured\n");
    return 0;
  }
  const int ranks = c.ranks > 0 ? c.ranks : devices;
  const int64_t unit = c.layout == FLASHATTN_CP_LAYOUT_ZIGZAG ? 2 * ranks : ranks;
  if (ranks > devices || c.tokens % unit != 0) {
    std::fprintf(stderr, "%d ranks on %d GPUs, %lld tokens: need ranks <= GPUs and tokens a multiple of %lld\n",
                 ranks, devices, static_cast<long long>(c.tokens), static_cast<long long>(unit));
    return 2;
  }
  void* nccl = dlopen("libnccl.so.2", RTLD_NOW | RTLD_GLOBAL);
  if (nccl == nullptr) {
    std::fprintf(stderr, "libnccl.so.2 cannot be opened (%s): put NCCL's lib folder on LD_LIBRARY_PATH\n", dlerror());
    return 1;
  }
  auto comm_init_all = reinterpret_cast<int (*)(void**, int, const int*)>(dlsym(nccl, "ncclCommInitAll"));
  auto comm_destroy = reinterpret_cast<int (*)(void*)>(dlsym(nccl, "ncclCommDestroy"));
  if (comm_init_all == nullptr || comm_destroy == nullptr) {
    std::fprintf(stderr, "libnccl.so.2 lacks ncclCommInitAll\n");
    return 1;
  }

  const double flops = 3.5 * 4.0 * c.heads * double(c.tokens) * double(c.tokens) * c.dim / (c.causal ? 2.0 : 1.0);
  const size_t e = elem(c.dtype);
  const size_t q_row = size_t(c.heads) * c.dim * e, k_row = size_t(c.heads_kv) * c.dim * e;

  // One GPU.
  CUDA_OK(cudaSetDevice(0));
  Tensors whole(c, c.tokens);
  fill(whole.q, size_t(c.tokens) * c.heads * c.dim, c.dtype, 1);
  fill(whole.k, size_t(c.tokens) * c.heads_kv * c.dim, c.dtype, 2);
  fill(whole.v, size_t(c.tokens) * c.heads_kv * c.dim, c.dtype, 3);
  fill(whole.dout, size_t(c.tokens) * c.heads * c.dim, c.dtype, 4);
  CUDA_OK(cudaDeviceSynchronize());
  double single_ms = 0.0;
  {
    flashattn_context_t ctx;
    FA_OK(flashattn_context_create(&ctx, FLASHATTN_BACKEND_CUDA, 0));
    std::vector<double> times;
    for (int i = 0; i < c.warmup + c.reps; ++i) {
      FA_OK(flashattn_context_synchronize(ctx));
      const auto t0 = std::chrono::steady_clock::now();
      FA_OK(flashattn_forward_ex(ctx, &whole.args, nullptr, 0));
      FA_OK(flashattn_backward_ex(ctx, &whole.args, nullptr, 0));
      FA_OK(flashattn_context_synchronize(ctx));
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (i >= c.warmup) times.push_back(ms);
    }
    single_ms = median(times);
    FA_OK(flashattn_context_destroy(ctx));
  }

  // The ring; its results gathered onto GPU 0 for the comparison.
  void *gathered_out = nullptr, *gathered_dq = nullptr, *gathered_dk = nullptr, *gathered_dv = nullptr;
  CUDA_OK(cudaMalloc(&gathered_out, size_t(c.tokens) * q_row));
  CUDA_OK(cudaMalloc(&gathered_dq, size_t(c.tokens) * q_row));
  CUDA_OK(cudaMalloc(&gathered_dk, size_t(c.tokens) * k_row));
  CUDA_OK(cudaMalloc(&gathered_dv, size_t(c.tokens) * k_row));
  std::vector<void*> comms(static_cast<size_t>(ranks));
  if (comm_init_all(comms.data(), ranks, nullptr) != 0) {
    std::fprintf(stderr, "ncclCommInitAll failed\n");
    return 1;
  }
  Barrier sync(ranks);
  std::vector<double> ring_times;
  auto rank_main = [&](int r) {
    CUDA_OK(cudaSetDevice(r));
    const int64_t n = c.tokens / ranks;
    Tensors t(c, n);
    const std::vector<Run> runs = runs_of(c, ranks, r);
    copy_rows(t.q, r, whole.q, runs, q_row, true);
    copy_rows(t.k, r, whole.k, runs, k_row, true);
    copy_rows(t.v, r, whole.v, runs, k_row, true);
    copy_rows(t.dout, r, whole.dout, runs, q_row, true);
    flashattn_context_t ctx;
    FA_OK(flashattn_context_create(&ctx, FLASHATTN_BACKEND_CUDA, r));
    flashattn_cp_args_t cp;
    flashattn_cp_args_init(&cp);
    cp.ranks = ranks;
    cp.rank = r;
    cp.layout = c.layout;
    cp.nccl_comm = comms[static_cast<size_t>(r)];
    size_t fwd = 0, bwd = 0;
    FA_OK(flashattn_cp_workspace_size(&fwd, ctx, &cp, &t.args, 0));
    FA_OK(flashattn_cp_workspace_size(&bwd, ctx, &cp, &t.args, 1));
    void* ws = nullptr;
    const size_t ws_size = std::max(fwd, bwd);
    CUDA_OK(cudaMalloc(&ws, ws_size));
    for (int i = 0; i < c.warmup + c.reps; ++i) {
      sync.arrive_and_wait();
      const auto t0 = std::chrono::steady_clock::now();
      FA_OK(flashattn_cp_forward(ctx, &cp, &t.args, ws, ws_size));
      FA_OK(flashattn_cp_backward(ctx, &cp, &t.args, ws, ws_size));
      FA_OK(flashattn_context_synchronize(ctx));
      sync.arrive_and_wait();
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (r == 0 && i >= c.warmup) ring_times.push_back(ms);
    }
    copy_rows(gathered_out, r, t.out, runs, q_row, false);
    copy_rows(gathered_dq, r, t.dq, runs, q_row, false);
    copy_rows(gathered_dk, r, t.dk, runs, k_row, false);
    copy_rows(gathered_dv, r, t.dv, runs, k_row, false);
    FA_OK(flashattn_context_destroy(ctx));
    CUDA_OK(cudaFree(ws));
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) threads.emplace_back(rank_main, r);
  for (std::thread& t : threads) t.join();
  for (void* comm : comms) comm_destroy(comm);

  CUDA_OK(cudaSetDevice(0));
  const double ring_ms = median(ring_times);
  const size_t qn = size_t(c.tokens) * c.heads * c.dim, kn = size_t(c.tokens) * c.heads_kv * c.dim;
  const auto d_out = compare(gathered_out, whole.out, qn, c.dtype);
  const auto d_dq = compare(gathered_dq, whole.dq, qn, c.dtype);
  const auto d_dk = compare(gathered_dk, whole.dk, kn, c.dtype);
  const auto d_dv = compare(gathered_dv, whole.dv, kn, c.dtype);
  const double single_tf = flops / (single_ms * 1e9), ring_tf = flops / (ring_ms * 1e9);
  std::printf("forward+backward, %lld tokens, %lld/%lld heads, d%lld, %s, %s, %s layout\n",
              static_cast<long long>(c.tokens), static_cast<long long>(c.heads),
              static_cast<long long>(c.heads_kv), static_cast<long long>(c.dim),
              c.dtype == FLASHATTN_DTYPE_BFLOAT16 ? "bf16" : "fp16", c.causal ? "causal" : "not causal",
              c.layout == FLASHATTN_CP_LAYOUT_ZIGZAG ? "zigzag" : "contiguous");
  std::printf("| GPUs | ms | TFLOP/s | TFLOP/s per GPU | per GPU / one GPU |\n|---|---|---|---|---|\n");
  std::printf("| 1 | %.2f | %.1f | %.1f | 1.00 |\n", single_ms, single_tf, single_tf);
  std::printf("| %d | %.2f | %.1f | %.1f | %.3f |\n", ranks, ring_ms, ring_tf, ring_tf / ranks,
              ring_tf / ranks / single_tf);
  std::printf("max |ring - one GPU| (max |one GPU|): out %.3g (%.3g), dq %.3g (%.3g), dk %.3g (%.3g), dv %.3g (%.3g)\n",
              d_out.first, d_out.second, d_dq.first, d_dq.second, d_dk.first, d_dk.second,
              d_dv.first, d_dv.second);
  for (void* p : {gathered_out, gathered_dq, gathered_dk, gathered_dv}) cudaFree(p);
  return 0;
}
