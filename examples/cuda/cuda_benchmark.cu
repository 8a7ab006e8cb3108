// CUDA benchmark: the flash algorithm beside the standard one (S and P materialized through
// cuBLAS), forward, backward and forward+backward, through the public API only.
//
// Shapes: the FlashAttention papers' sweep (16k tokens in total: batch = 16384 / seqlen;
// hidden 2048: heads = 2048 / head_dim, rounded down; head dims 64, 128, 256; seqlen 512 .. 16k;
// causal and not), then the FlashAttention paper's GPT-2 medium shape (batch 64, 16 heads, seqlen 1024,
// head dim 64, fp16), causal and not.
//
// Per shape and algorithm it prints the median time of --reps runs (CUDA events on the
// context's stream, after --warmup runs; a 0.5 ms spin kernel ahead of each run keeps the
// host's launch overhead out of the measurement), TFLOP/s (forward 4*B*H*Nq*Nk*D, halved for causal;
// backward 2.5x; forward+backward 3.5x), the workspace the library asked for, the device memory
// the step needs (tensors + workspace), the scratch the context was measured to allocate
// (cudaMemGetInfo before and after; allocation granularity applies), and max |flash - standard|
// of the forward output. Inputs are random normal, generated on the device.
//
//   cuda_benchmark [--fwd] [--bwd] [--fwdbwd]     modes (default: all three)
//                  [--algo flash|standard|both]   (default both)
//                  [--dtype bf16|fp16]            the sweep's dtype (default bf16)
//                  [--dims 64,128,256] [--seqlens 512,1024,...] [--causal no|yes|both]
//                  [--quick]                      seqlens 1k, 4k, 16k; dims 64, 128
//                  [--no-sweep] [--no-gpt2] [--reps N] [--warmup N] [--device N]
//                  [--csv PATH]                   also write one CSV row per measurement
//                  [--window L,R] [--softcap C]   the sweep with a sliding window (-1: a side
//                                                 unbounded) or a softcap; TFLOP/s count only
//                                                 the visible (query, key) pairs
//                  [--deterministic]              every backward in deterministic mode (dQ added
//                                                 in a fixed order; said above the tables)
//                  [--alibi] [--sinks]            the sweep with ALiBi (a slope per head,
//                                                 FlashAttention-2's 2^(-8 (h + 1) / H)) or
//                                                 attention sinks (a logit per head; the
//                                                 backward returns their gradient)
//                  [--merge]                      the merge of partial results (flashattn_merge):
//                                                 GB/s of the bytes it must move, for decode
//                                                 (split-KV) and long-sequence shapes; alone, it
//                                                 skips the attention tables
//                  [--layouts]                    head dim 100 (rows off 16 bytes, copied
//                                                 aligned), d 192 / dv 128, d 128 / dv 64,
//                                                 packed QKV, d 96, 192, 104 and 112 beside
//                                                 plain d128; with --no-sweep
//                                                 --no-gpt2, only these
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <flashattn/flashattn.h>

#include "device_random.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace {

constexpr double kGB = 1e9;

struct Config {
  bool fwd = false, bwd = false, fwdbwd = false;
  bool flash = true, standard = true;
  flashattn_dtype_t dtype = FLASHATTN_DTYPE_BFLOAT16;
  std::vector<int64_t> dims = {64, 128, 256};
  std::vector<int64_t> seqlens = {512, 1024, 2048, 4096, 8192, 16384};
  std::vector<int> causal = {0, 1};
  bool sweep = true, gpt2 = true, merge = false, layouts = false;
  int reps = 10, warmup = 3, device = 0;
  std::string csv;
  bool window = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.0f;
  bool alibi = false, sinks = false;
  bool deterministic = false;
};

struct Shape {
  std::string label;
  int64_t b, n, h, d;
  bool causal;
  flashattn_dtype_t dtype;
  bool window = false;  // the sweep's variants (Config)
  int window_left = -1, window_right = -1;
  float softcap = 0.0f;
  bool alibi = false, sinks = false;
  int64_t dv = 0;       // head dim of v and out; 0: d
  bool packed = false;  // q, k, v as views of one [b, n, 3, h, d] tensor (packed QKV)
};

int64_t dv_of(const Shape& s) { return s.dv > 0 ? s.dv : s.d; }

// One measurement: a median time, or why there is none.
struct Measure {
  bool ok = false;
  double ms = 0.0;
  std::string why;
};

struct Result {
  Measure fwd, bwd, fwdbwd;
  size_t ws_fwd = 0, ws_bwd = 0;
  double measured_scratch = -1.0;  // bytes; < 0: not measured
  std::string unavailable;         // the algorithm cannot run this shape at all
};

[[noreturn]] void die(const char* what, const char* detail) {
  std::fprintf(stderr, "cuda_benchmark: %s: %s\n", what, detail);
  std::exit(2);
}

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(what, cudaGetErrorString(e));
}

const char* dtype_name(flashattn_dtype_t t) {
  return t == FLASHATTN_DTYPE_FLOAT16 ? "fp16" : t == FLASHATTN_DTYPE_BFLOAT16 ? "bf16" : "fp32";
}

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> v;
  const char* p = s;
  while (*p != '\0') {
    char* end = nullptr;
    const long long x = std::strtoll(p, &end, 10);
    if (end == p) die("bad list", s);
    v.push_back(x);
    p = *end == ',' ? end + 1 : end;
  }
  return v;
}

Config parse(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) die("missing value after", argv[i]);
      return argv[++i];
    };
    if (a == "--fwd") c.fwd = true;
    else if (a == "--bwd") c.bwd = true;
    else if (a == "--fwdbwd") c.fwdbwd = true;
    else if (a == "--algo") {
      const std::string v = next();
      c.flash = v == "flash" || v == "both";
      c.standard = v == "standard" || v == "both";
      if (!c.flash && !c.standard) die("--algo takes flash, standard or both", v.c_str());
    } else if (a == "--dtype") {
      const std::string v = next();
      if (v == "bf16") c.dtype = FLASHATTN_DTYPE_BFLOAT16;
      else if (v == "fp16") c.dtype = FLASHATTN_DTYPE_FLOAT16;
      else die("--dtype takes bf16 or fp16", v.c_str());
    } else if (a == "--dims") c.dims = parse_list(next());
    else if (a == "--seqlens") c.seqlens = parse_list(next());
    else if (a == "--causal") {
      const std::string v = next();
      c.causal = v == "yes" ? std::vector<int>{1} : v == "no" ? std::vector<int>{0} : std::vector<int>{0, 1};
    } else if (a == "--quick") {
      c.seqlens = {1024, 4096, 16384};
      c.dims = {64, 128};
    } else if (a == "--no-sweep") c.sweep = false;
    else if (a == "--no-gpt2") c.gpt2 = false;
    else if (a == "--merge") c.merge = true;
    else if (a == "--layouts") c.layouts = true;
    else if (a == "--reps") c.reps = std::max(1, std::atoi(next()));
    else if (a == "--warmup") c.warmup = std::max(0, std::atoi(next()));
    else if (a == "--device") c.device = std::atoi(next());
    else if (a == "--csv") c.csv = next();
    else if (a == "--window") {
      const std::vector<int64_t> lr = parse_list(next());
      if (lr.size() != 2) die("--window takes L,R", argv[i]);
      c.window = true;
      c.window_left = static_cast<int>(lr[0]);
      c.window_right = static_cast<int>(lr[1]);
    } else if (a == "--softcap") c.softcap = static_cast<float>(std::atof(next()));
    else if (a == "--alibi") c.alibi = true;
    else if (a == "--sinks") c.sinks = true;
    else if (a == "--deterministic") c.deterministic = true;
    else if (a == "--help" || a == "-h") {
      std::puts("see the comment at the top of examples/cuda/cuda_benchmark.cu");
      std::exit(0);
    } else {
      die("unknown argument", a.c_str());
    }
  }
  if (c.merge && !c.fwd && !c.bwd && !c.fwdbwd) c.sweep = c.gpt2 = false;
  if (!c.fwd && !c.bwd && !c.fwdbwd) c.fwd = c.bwd = c.fwdbwd = true;
  return c;
}

// Keeps the GPU busy for `ns` nanoseconds: enqueued before each timed run, it lets the host
// enqueue the start event and the call while the GPU is still spinning, so the host's time to
// validate arguments and launch is not counted as GPU time.
__global__ void spin(long long ns) {
  long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

template <class T>
__global__ void max_abs_diff(const T* a, const T* b, size_t n, unsigned int* out) {
  float m = 0.0f;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const float d = fabsf(static_cast<float>(a[i]) - static_cast<float>(b[i]));
    m = d != d ? INFINITY : fmaxf(m, d);  // NaN counts as infinitely wrong
  }
  atomicMax(out, __float_as_uint(m));  // non-negative floats order like their bits
}

void fill(void* p, size_t n, flashattn_dtype_t t, uint64_t seed) {
  if (t == FLASHATTN_DTYPE_FLOAT16) fill_normal<<<1024, 256>>>(static_cast<__half*>(p), n, seed);
  else fill_normal<<<1024, 256>>>(static_cast<__nv_bfloat16*>(p), n, seed);
  cuda_check(cudaGetLastError(), "fill_normal");
}

double diff(const void* a, const void* b, size_t n, flashattn_dtype_t t, unsigned int* scratch) {
  cuda_check(cudaMemset(scratch, 0, sizeof(unsigned int)), "cudaMemset");
  if (t == FLASHATTN_DTYPE_FLOAT16) {
    max_abs_diff<<<1024, 256>>>(static_cast<const __half*>(a), static_cast<const __half*>(b), n, scratch);
  } else {
    max_abs_diff<<<1024, 256>>>(static_cast<const __nv_bfloat16*>(a),
                                static_cast<const __nv_bfloat16*>(b), n, scratch);
  }
  unsigned int bits = 0;
  cuda_check(cudaMemcpy(&bits, scratch, sizeof bits, cudaMemcpyDeviceToHost), "cudaMemcpy");
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// 2 B H N^2 (d + dv): the two GEMMs (4 B H N^2 D when dv = d).
double flops_fwd(const Shape& s) {
  const double dims = 0.5 * double(s.d + dv_of(s));
  if (!s.window) {
    const double f = 4.0 * s.b * s.h * double(s.n) * double(s.n) * dims;
    return s.causal ? f / 2 : f;
  }
  // The (query, key) pairs the window leaves visible, row by row (square, so diag = 0).
  const int64_t right = s.causal ? (s.window_right < 0 ? 0 : std::min(s.window_right, 0))
                                 : s.window_right;
  double pairs = 0.0;
  for (int64_t i = 0; i < s.n; ++i) {
    const int64_t lo = s.window_left < 0 ? 0 : std::max<int64_t>(0, i - s.window_left);
    const int64_t hi = right < 0 ? s.n - 1 : std::min<int64_t>(s.n - 1, i + right);
    if (hi >= lo) pairs += double(hi - lo + 1);
  }
  return 4.0 * s.b * s.h * pairs * dims;
}

size_t free_bytes() {
  size_t f = 0, t = 0;
  cuda_check(cudaMemGetInfo(&f, &t), "cudaMemGetInfo");
  return f;
}

// Device tensors for every shape: the shapes share B*N*H*D elements, so one set serves all.
struct Buffers {
  size_t elems = 0, lse_elems = 0;
  void *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *o_std = nullptr, *dout = nullptr,
       *dq = nullptr, *dk = nullptr, *dv = nullptr;
  float* lse = nullptr;
  float *slopes = nullptr, *sinks = nullptr, *dsinks = nullptr;  // [heads] each
  int64_t heads = 0;
  unsigned int* scratch = nullptr;

  // ALiBi slopes 2^(-8 (h + 1) / H) and sink logits (a spread of values around 0) per head.
  void ensure_per_head(int64_t h) {
    if (h == heads) return;
    cudaFree(slopes);
    cudaFree(sinks);
    cudaFree(dsinks);
    heads = h;
    std::vector<float> s(h), k(h);
    for (int64_t i = 0; i < h; ++i) {
      s[i] = std::exp2(-8.0f * static_cast<float>(i + 1) / static_cast<float>(h));
      k[i] = 0.25f * static_cast<float>(i % 8) - 1.0f;
    }
    for (float** p : {&slopes, &sinks, &dsinks}) {
      cuda_check(cudaMalloc(p, h * sizeof(float)), "cudaMalloc (per-head tensors)");
    }
    cuda_check(cudaMemcpy(slopes, s.data(), h * sizeof(float), cudaMemcpyHostToDevice), "slopes");
    cuda_check(cudaMemcpy(sinks, k.data(), h * sizeof(float), cudaMemcpyHostToDevice), "sinks");
  }

  void ensure(size_t n, size_t n_lse, flashattn_dtype_t t) {
    if (n <= elems && n_lse <= lse_elems) {
      refill(t);
      return;
    }
    release();
    elems = n;
    lse_elems = n_lse;
    for (void** p : {&q, &k, &v, &o, &o_std, &dout, &dq, &dk, &dv}) {
      cuda_check(cudaMalloc(p, n * 2), "cudaMalloc (tensors)");
    }
    cuda_check(cudaMalloc(&lse, n_lse * sizeof(float)), "cudaMalloc (lse)");
    cuda_check(cudaMalloc(&scratch, sizeof(unsigned int)), "cudaMalloc");
    refill(t);
  }
  void refill(flashattn_dtype_t t) {
    fill(q, elems, t, 1);
    fill(k, elems, t, 2);
    fill(v, elems, t, 3);
    fill(dout, elems, t, 4);
    cuda_check(cudaDeviceSynchronize(), "fill");
  }
  void release() {
    for (void* p : {q, k, v, o, o_std, dout, dq, dk, dv}) cudaFree(p);
    cudaFree(lse);
    cudaFree(scratch);
    for (float* p : {slopes, sinks, dsinks}) cudaFree(p);
    slopes = sinks = dsinks = nullptr;
    heads = 0;
    elems = lse_elems = 0;
  }
};

struct Views {
  flashattn_tensor_t q, k, v, o, dout, dq, dk, dv, lse;
  flashattn_tensor_t slopes, sinks, dsinks;  // [heads] FLOAT32, when the shape has them
};

Views views_of(const Shape& s, const Buffers& m, void* out) {
  Views w{};
  auto t4 = [&](flashattn_tensor_t* t, void* p, int64_t d) {
    if (flashattn_tensor_4d(t, p, s.dtype, s.b, s.n, s.h, d) != FLASHATTN_SUCCESS) {
      die("flashattn_tensor_4d", flashattn_last_error());
    }
  };
  const int64_t dv = dv_of(s);
  t4(&w.q, m.q, s.d);
  t4(&w.k, m.k, s.d);
  t4(&w.v, m.v, dv);
  t4(&w.o, out, dv);
  t4(&w.dout, m.dout, dv);
  t4(&w.dq, m.dq, s.d);
  t4(&w.dk, m.dk, s.d);
  t4(&w.dv, m.dv, dv);
  if (s.packed) {  // [b, n, 3, h, d]: q, k and v one h * d apart within a row
    for (int i = 0; i < 3; ++i) {
      flashattn_tensor_t* t = i == 0 ? &w.q : i == 1 ? &w.k : &w.v;
      t->data = static_cast<char*>(m.q) + size_t(i) * s.h * s.d * 2;
      t->strides[0] = s.n * 3 * s.h * s.d;
      t->strides[1] = 3 * s.h * s.d;
    }
  }
  if (flashattn_tensor_lse(&w.lse, m.lse, s.b, s.h, s.n) != FLASHATTN_SUCCESS) {
    die("flashattn_tensor_lse", flashattn_last_error());
  }
  auto per_head = [&](flashattn_tensor_t* t, float* p) {
    *t = flashattn_tensor_t{};
    t->data = p;
    t->dtype = FLASHATTN_DTYPE_FLOAT32;
    t->rank = 1;
    t->shape[0] = s.h;
    t->strides[0] = 1;
  };
  per_head(&w.slopes, m.slopes);
  per_head(&w.sinks, m.sinks);
  per_head(&w.dsinks, m.dsinks);
  return w;
}

template <class F>
Measure time_it(const Config& cfg, cudaStream_t stream, F&& call) {
  Measure m;
  for (int i = 0; i < cfg.warmup; ++i) {
    if (flashattn_status_t st = call(); st != FLASHATTN_SUCCESS) {
      m.why = std::string(flashattn_status_string(st)) + ": " + flashattn_last_error();
      return m;
    }
  }
  cudaEvent_t start, stop;
  cuda_check(cudaEventCreate(&start), "cudaEventCreate");
  cuda_check(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<float> ms;
  for (int i = 0; i < cfg.reps; ++i) {
    spin<<<1, 1, 0, stream>>>(500000);  // 0.5 ms
    cuda_check(cudaGetLastError(), "spin");
    cuda_check(cudaEventRecord(start, stream), "cudaEventRecord");
    const flashattn_status_t st = call();
    cuda_check(cudaEventRecord(stop, stream), "cudaEventRecord");
    cuda_check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    if (st != FLASHATTN_SUCCESS) {
      m.why = std::string(flashattn_status_string(st)) + ": " + flashattn_last_error();
      break;
    }
    float t = 0.0f;
    cuda_check(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!m.why.empty()) return m;
  std::sort(ms.begin(), ms.end());
  m.ok = true;
  m.ms = ms[ms.size() / 2];
  return m;
}

Result run_algo(const Config& cfg, const Shape& s, Buffers& mem, flashattn_algorithm_t algo) {
  Result r;
  void* out = algo == FLASHATTN_ALGORITHM_STANDARD ? mem.o_std : mem.o;
  const Views w = views_of(s, mem, out);
  flashattn_options_t opts = FLASHATTN_OPTIONS_INIT;
  opts.causal = s.causal ? 1 : 0;
  opts.algorithm = algo;
  opts.window = s.window ? 1 : 0;
  opts.window_left = s.window ? s.window_left : 0;
  opts.window_right = s.window ? s.window_right : 0;
  opts.softcap = s.softcap;
  opts.deterministic = cfg.deterministic ? 1 : 0;

  flashattn_context_t ctx = nullptr;
  if (flashattn_context_create(&ctx, FLASHATTN_BACKEND_CUDA, cfg.device) != FLASHATTN_SUCCESS) {
    die("flashattn_context_create", flashattn_last_error());
  }
  void* stream_ptr = nullptr;
  flashattn_context_get_stream(&stream_ptr, ctx);
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const size_t free_created = free_bytes();

  const bool need_bwd = cfg.bwd || cfg.fwdbwd;
  // One argument struct for both directions (the forward reads none of the gradients).
  flashattn_args_t args = FLASHATTN_ARGS_INIT;
  args.options = &opts;
  args.q = &w.q;
  args.k = &w.k;
  args.v = &w.v;
  args.out = &w.o;
  args.lse = &w.lse;
  args.dout = &w.dout;
  args.dq = &w.dq;
  args.dk = &w.dk;
  args.dv = &w.dv;
  if (s.alibi) args.alibi_slopes = &w.slopes;
  if (s.sinks) {
    args.sinks = &w.sinks;
    args.dsinks = &w.dsinks;
  }
  if (flashattn_supported_ex(ctx, &args, 0) != FLASHATTN_SUCCESS) {
    r.unavailable = std::string("unsupported: ") + flashattn_last_error();
  } else if (need_bwd && flashattn_supported_ex(ctx, &args, 1) != FLASHATTN_SUCCESS) {
    r.bwd.why = r.fwdbwd.why = std::string("unsupported: ") + flashattn_last_error();
  }
  if (r.unavailable.empty()) {
    flashattn_workspace_size_ex(&r.ws_fwd, ctx, &args, 0);
    if (need_bwd && r.bwd.why.empty()) flashattn_workspace_size_ex(&r.ws_bwd, ctx, &args, 1);
    const size_t ws = std::max(r.ws_fwd, r.ws_bwd);
    if (ws > free_created / 100 * 95) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "n/a (needs %.1f GB, %.1f GB free)", ws / kGB, free_created / kGB);
      r.unavailable = buf;
    }
  }
  if (r.unavailable.empty()) {
    auto fwd = [&] { return flashattn_forward_ex(ctx, &args, nullptr, 0); };
    auto bwd = [&] { return flashattn_backward_ex(ctx, &args, nullptr, 0); };
    if (cfg.fwd) r.fwd = time_it(cfg, stream, fwd);
    if (r.bwd.why.empty() && need_bwd) {
      const flashattn_status_t st = fwd();  // the backward's out and lse
      if (st != FLASHATTN_SUCCESS) {
        r.bwd.why = r.fwdbwd.why = std::string(flashattn_status_string(st)) + ": " + flashattn_last_error();
      } else {
        if (cfg.bwd) r.bwd = time_it(cfg, stream, bwd);
        if (cfg.fwdbwd) {
          r.fwdbwd = time_it(cfg, stream, [&] {
            const flashattn_status_t f = fwd();
            return f != FLASHATTN_SUCCESS ? f : bwd();
          });
        }
      }
    }
    // The output the comparison reads: one plain forward last.
    if (fwd() == FLASHATTN_SUCCESS) flashattn_context_synchronize(ctx);
    r.measured_scratch = static_cast<double>(free_created) - static_cast<double>(free_bytes());
  }
  flashattn_context_destroy(ctx);
  return r;
}

std::string cell(const Measure& m, double flops) {
  char buf[64];
  if (!m.ok) return m.why.empty() ? "-" : "n/a";
  std::snprintf(buf, sizeof buf, "%8.3f %6.1f", m.ms, flops / (m.ms * 1e-3) / 1e12);
  return buf;
}

void print_header() {
  std::printf("%-34s %-8s %17s %17s %17s %9s %9s %9s %9s\n", "shape", "algo",
              "fwd ms  TFLOP/s", "bwd ms  TFLOP/s", "f+b ms  TFLOP/s", "ws f GB", "ws b GB",
              "mem GB", "meas GB");
}

size_t tensor_bytes(const Shape& s, bool bwd) {
  const size_t e = size_t(s.b) * s.n * s.h * s.d * 2;
  const size_t lse = size_t(s.b) * s.h * s.n * 4;
  return (bwd ? 8 : 4) * e + lse;
}

void csv_rows(FILE* f, const Shape& s, const char* algo, const Result& r) {
  if (f == nullptr) return;
  const struct {
    const char* mode;
    const Measure& m;
    double mult;
    size_t ws;
    bool bwd;
  } rows[] = {{"fwd", r.fwd, 1.0, r.ws_fwd, false},
              {"bwd", r.bwd, 2.5, r.ws_bwd, true},
              {"fwdbwd", r.fwdbwd, 3.5, std::max(r.ws_fwd, r.ws_bwd), true}};
  for (const auto& row : rows) {
    const bool ok = r.unavailable.empty() && row.m.ok;
    std::string why = !r.unavailable.empty() ? r.unavailable : row.m.why;
    for (char& ch : why)
      if (ch == ',' || ch == '\n' || ch == '"') ch = ';';
    std::fprintf(f, "%s,%s,%lld,%lld,%lld,%lld,%d,%s,%s,%.4f,%.2f,%zu,%zu,%.0f,%s\n",
                 s.label.c_str(), dtype_name(s.dtype), static_cast<long long>(s.b),
                 static_cast<long long>(s.n), static_cast<long long>(s.h),
                 static_cast<long long>(s.d), s.causal ? 1 : 0, algo, row.mode,
                 ok ? row.m.ms : -1.0,
                 ok ? flops_fwd(s) * row.mult / (row.m.ms * 1e-3) / 1e12 : -1.0, row.ws,
                 tensor_bytes(s, row.bwd), r.measured_scratch, ok ? "ok" : why.c_str());
  }
}

void print_row(const Shape& s, const char* algo, const Result& r, double maxdiff) {
  char variants[48] = "";
  if (s.window) {
    std::snprintf(variants, sizeof variants, " w%d,%d", s.window_left, s.window_right);
  }
  if (s.softcap > 0.0f) {
    const size_t used = std::strlen(variants);
    std::snprintf(variants + used, sizeof variants - used, " cap%g", s.softcap);
  }
  for (const auto& [on, name] : {std::pair{s.alibi, " alibi"}, std::pair{s.sinks, " sinks"}}) {
    if (on) std::strncat(variants, name, sizeof variants - std::strlen(variants) - 1);
  }
  char shape[96];
  char dims[40];
  std::snprintf(dims, sizeof dims, s.dv > 0 ? "d%lld/%lld" : "d%lld", static_cast<long long>(s.d),
                static_cast<long long>(s.dv));
  std::snprintf(shape, sizeof shape, "b%lld h%lld n%lld %s%s%s%s %s",
                static_cast<long long>(s.b), static_cast<long long>(s.h),
                static_cast<long long>(s.n), dims, s.packed ? " qkv" : "",
                s.causal ? " causal" : "", variants, dtype_name(s.dtype));
  if (!r.unavailable.empty()) {
    std::printf("%-34s %-8s %s\n", shape, algo, r.unavailable.c_str());
    return;
  }
  const double f = flops_fwd(s);
  const size_t mem = tensor_bytes(s, r.bwd.ok || r.fwdbwd.ok) + std::max(r.ws_fwd, r.ws_bwd);
  std::printf("%-34s %-8s %17s %17s %17s %9.3f %9.3f %9.3f %9.3f", shape, algo,
              cell(r.fwd, f).c_str(), cell(r.bwd, 2.5 * f).c_str(),
              cell(r.fwdbwd, 3.5 * f).c_str(), r.ws_fwd / kGB, r.ws_bwd / kGB, mem / kGB,
              r.measured_scratch / kGB);
  if (maxdiff >= 0) std::printf("  max|flash-std| %.3g", maxdiff);
  std::printf("\n");
  for (const Measure* m : {&r.fwd, &r.bwd, &r.fwdbwd}) {
    if (!m->ok && !m->why.empty()) {
      std::printf("%-34s %-8s   (%s)\n", "", "", m->why.c_str());
      break;
    }
  }
  std::fflush(stdout);
}

struct Pair {
  Result flash, standard;
  bool has_flash = false, has_standard = false;
};

Pair run_shape(const Config& cfg, const Shape& s, Buffers& mem, FILE* csv) {
  Pair p;
  const size_t widest = size_t(s.b) * s.n * s.h * std::max(s.d, dv_of(s));
  mem.ensure(s.packed ? 3 * widest : widest, size_t(s.b) * s.h * s.n, s.dtype);
  mem.ensure_per_head(s.h);
  if (cfg.standard) {
    p.standard = run_algo(cfg, s, mem, FLASHATTN_ALGORITHM_STANDARD);
    p.has_standard = true;
  }
  if (cfg.flash) {
    p.flash = run_algo(cfg, s, mem, FLASHATTN_ALGORITHM_FLASH);
    p.has_flash = true;
  }
  double maxdiff = -1.0;
  if (p.has_flash && p.has_standard && p.flash.unavailable.empty() &&
      p.standard.unavailable.empty()) {
    maxdiff = diff(mem.o, mem.o_std, size_t(s.b) * s.n * s.h * dv_of(s), s.dtype, mem.scratch);
  }
  if (p.has_flash) {
    print_row(s, "flash", p.flash, maxdiff);
    csv_rows(csv, s, "flash", p.flash);
  }
  if (p.has_standard) {
    print_row(s, "standard", p.standard, -1.0);
    csv_rows(csv, s, "standard", p.standard);
  }
  return p;
}

}  // namespace

// The merge of `parts` partial results [parts, b, n, h, d] (and their LSEs) into one, timed as
// the attention calls are; GB/s counts the bytes it must move: every part's output and LSE read
// once, the merged output and LSE written once.
void run_merge(const Config& cfg, FILE* csv) {
  struct MergeShape {
    const char* label;
    int64_t parts, b, n, h, d;
  };
  const MergeShape shapes[] = {
      {"decode", 2, 64, 1, 32, 128},    {"decode", 8, 64, 1, 32, 128},
      {"decode", 16, 8, 1, 32, 128},    {"decode", 32, 1, 1, 32, 128},
      {"decode", 4, 128, 1, 8, 64},     {"long", 2, 1, 16384, 16, 128},
      {"long", 4, 1, 16384, 16, 128},   {"long", 2, 4, 4096, 16, 64},
      {"long", 2, 1, 8192, 8, 256},     {"long", 3, 2, 4097, 12, 80},
  };
  flashattn_context_t ctx = nullptr;
  if (flashattn_context_create(&ctx, FLASHATTN_BACKEND_CUDA, cfg.device) != FLASHATTN_SUCCESS) {
    die("flashattn_context_create", flashattn_last_error());
  }
  void* stream = nullptr;
  flashattn_context_get_stream(&stream, ctx);
  std::printf("merge of partial results (%s): median ms and GB/s of the bytes moved\n",
              dtype_name(cfg.dtype));
  std::printf("%-7s %5s %5s %6s %4s %4s %10s %9s\n", "shape", "parts", "batch", "seqlen",
              "heads", "dim", "ms", "GB/s");
  for (const MergeShape& m : shapes) {
    const size_t elems = size_t(m.b * m.n * m.h * m.d), rows = size_t(m.b * m.n * m.h);
    void *parts = nullptr, *out = nullptr;
    float *parts_lse = nullptr, *lse = nullptr;
    cuda_check(cudaMalloc(&parts, elems * m.parts * 2), "cudaMalloc (parts)");
    cuda_check(cudaMalloc(&out, elems * 2), "cudaMalloc (out)");
    cuda_check(cudaMalloc(&parts_lse, rows * m.parts * sizeof(float)), "cudaMalloc (lse)");
    cuda_check(cudaMalloc(&lse, rows * sizeof(float)), "cudaMalloc (lse)");
    fill(parts, elems * m.parts, cfg.dtype, 5);
    // LSEs of a few units: the weights differ from part to part, none underflows.
    fill_normal<<<1024, 256>>>(parts_lse, rows * m.parts, 6);
    cuda_check(cudaDeviceSynchronize(), "fill");
    flashattn_tensor_t first{}, first_lse{}, o{}, l{};
    flashattn_tensor_4d(&first, parts, cfg.dtype, m.b, m.n, m.h, m.d);
    flashattn_tensor_4d(&o, out, cfg.dtype, m.b, m.n, m.h, m.d);
    flashattn_tensor_lse(&first_lse, parts_lse, m.b, m.h, m.n);
    flashattn_tensor_lse(&l, lse, m.b, m.h, m.n);
    flashattn_merge_args_t args;
    flashattn_merge_args_init(&args);
    args.num_parts = m.parts;
    args.parts_out = &first;
    args.parts_out_stride = static_cast<int64_t>(elems);
    args.parts_lse = &first_lse;
    args.parts_lse_stride = static_cast<int64_t>(rows);
    args.out = &o;
    args.lse = &l;
    const Measure t = time_it(cfg, static_cast<cudaStream_t>(stream),
                              [&] { return flashattn_merge(ctx, &args); });
    const double bytes = double(elems) * 2 * (m.parts + 1) + double(rows) * 4 * (m.parts + 1);
    if (t.ok) {
      std::printf("%-7s %5lld %5lld %6lld %4lld %4lld %10.4f %9.0f\n", m.label,
                  static_cast<long long>(m.parts), static_cast<long long>(m.b),
                  static_cast<long long>(m.n), static_cast<long long>(m.h),
                  static_cast<long long>(m.d), t.ms, bytes / (t.ms * 1e-3) / kGB);
    } else {
      std::printf("%-7s %5lld: %s\n", m.label, static_cast<long long>(m.parts), t.why.c_str());
    }
    if (csv != nullptr) {
      std::fprintf(csv, "merge-%s-%lldparts,%s,%lld,%lld,%lld,%lld,0,merge,merge,%.6f,0,0,%.0f,0,%s\n",
                   m.label, static_cast<long long>(m.parts), dtype_name(cfg.dtype),
                   static_cast<long long>(m.b), static_cast<long long>(m.n),
                   static_cast<long long>(m.h), static_cast<long long>(m.d), t.ok ? t.ms : 0.0,
                   bytes, t.ok ? "ok" : t.why.c_str());
    }
    cudaFree(parts);
    cudaFree(out);
    cudaFree(parts_lse);
    cudaFree(lse);
  }
  flashattn_context_destroy(ctx);
  std::printf("\n");
}

int main(int argc, char** argv) {
  const Config cfg = parse(argc, argv);
  int devices = 0;
  if (flashattn_cuda_device_count(&devices) != FLASHATTN_SUCCESS || devices <= cfg.device) {
    std::fprintf(stderr, "cuda_benchmark: no CUDA device %d (%d found)\n", cfg.device, devices);
    return 77;
  }
  cuda_check(cudaSetDevice(cfg.device), "cudaSetDevice");
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, cfg.device), "cudaGetDeviceProperties");
  std::printf("cuda_benchmark: %s (sm_%d%d, %d SMs, %.0f GB), libflashattn %s; median of %d "
              "runs after %d warm-up\n",
              prop.name, prop.major, prop.minor, prop.multiProcessorCount,
              prop.totalGlobalMem / kGB, flashattn_version_string(), cfg.reps, cfg.warmup);
  std::printf("TFLOP/s: forward 4*B*H*N^2*D (causal: half), backward 2.5x, fwd+bwd 3.5x. "
              "ws: workspace asked for; mem: tensors + workspace; meas: scratch the context "
              "allocated (cudaMemGetInfo)\n\n");
  if (cfg.deterministic) {
    std::printf("Every backward (and fwd+bwd) below runs in deterministic mode.\n\n");
  }

  FILE* csv = nullptr;
  if (!cfg.csv.empty()) {
    csv = std::fopen(cfg.csv.c_str(), "w");
    if (csv == nullptr) die("cannot write", cfg.csv.c_str());
    std::fprintf(csv, "label,dtype,batch,seqlen,heads,head_dim,causal,algo,mode,ms,tflops,"
                      "workspace_bytes,tensor_bytes,measured_scratch_bytes,status\n");
  }

  Buffers mem;
  if (cfg.sweep) {
    print_header();
    for (int64_t d : cfg.dims) {
      for (int causal : cfg.causal) {
        for (int64_t n : cfg.seqlens) {
          if (16384 % n != 0 || d > 2048) {
            std::printf("skipping seqlen %lld / head dim %lld: not a divisor of 16384 / over 2048\n",
                        static_cast<long long>(n), static_cast<long long>(d));
            continue;
          }
          // A head dim that does not divide 2048 (40, 104, ...) gets the heads that fit.
          Shape s{"sweep", 16384 / n, n, 2048 / d, d, causal != 0, cfg.dtype};
          s.window = cfg.window;
          s.window_left = cfg.window_left;
          s.window_right = cfg.window_right;
          s.softcap = cfg.softcap;
          s.alibi = cfg.alibi;
          s.sinks = cfg.sinks;
          run_shape(cfg, s, mem, csv);
        }
      }
    }
    std::printf("\n");
  }

  if (cfg.gpt2) {
    std::printf("FlashAttention paper, GPT-2 medium (batch 64, 16 heads, seqlen 1024, head dim 64, "
                "fp16), forward + backward.\nPaper (A100): standard 41.7 ms, flash 7.3 ms "
                "(and HBM traffic 40.3 GB vs 4.4 GB, which this program does not measure).\n");
    print_header();
    for (int causal : {0, 1}) {
      const Shape s{"gpt2-medium", 64, 1024, 16, 64, causal != 0, FLASHATTN_DTYPE_FLOAT16};
      const Pair p = run_shape(cfg, s, mem, csv);
      if (p.has_flash && p.has_standard && p.flash.fwdbwd.ok && p.standard.fwdbwd.ok) {
        const double mf = std::max(p.flash.ws_fwd, p.flash.ws_bwd) / kGB;
        const double ms = std::max(p.standard.ws_fwd, p.standard.ws_bwd) / kGB;
        std::printf("  -> %s: standard %.2f ms, flash %.2f ms: %.1fx faster; workspace "
                    "standard %.2f GB, flash %.3f GB\n",
                    causal ? "causal" : "not causal", p.standard.fwdbwd.ms, p.flash.fwdbwd.ms,
                    p.standard.fwdbwd.ms / p.flash.fwdbwd.ms, ms, mf);
      }
    }
  }
  if (cfg.layouts) {
    // Head dims and layouts beside the plain d128 (bf16 or --dtype, 16k tokens): a head dim off
    // the 8-element granule (its rows are copied aligned), a v of its own head dim, packed QKV.
    std::printf("Layouts: head dim 100 (hidden 2000), d 192 with dv 128, d 128 with dv 64, packed "
                "QKV, d 96, d 192 (16 heads), d 104 and d 112 (20 heads: aligned rows, no copies); "
                "TFLOP/s count 2*B*H*N^2*(d + dv)\n");
    print_header();
    for (int causal : cfg.causal) {
      for (int64_t n : {4096, 16384}) {
        Shape base{"layouts", 16384 / n, n, 16, 128, causal != 0, cfg.dtype};
        Shape d100 = base;
        d100.h = 20;
        d100.d = 100;
        Shape d192 = base;
        d192.d = 192;
        d192.dv = 128;
        Shape d128v64 = base;
        d128v64.dv = 64;
        Shape qkv = base;
        qkv.packed = true;
        Shape d96 = base;
        d96.d = 96;
        Shape d192p = base;
        d192p.d = 192;
        Shape d104 = d100;
        d104.d = 104;
        Shape d112 = d100;
        d112.d = 112;
        for (const Shape& s : {base, d100, d192, d128v64, qkv, d96, d192p, d104, d112}) {
          run_shape(cfg, s, mem, csv);
        }
      }
    }
    std::printf("\n");
  }
  if (cfg.merge) run_merge(cfg, csv);
  mem.release();
  if (csv != nullptr) std::fclose(csv);
  return 0;
}
