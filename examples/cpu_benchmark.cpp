// CPU benchmark: the flash algorithm beside the standard one (S and P materialized), forward
// and backward, on the public API only. Prints time, GFLOP/s (4 * B * H * Nq * Nk * D for the
// forward, halved for causal; 2.5x that for the backward) and the workspace each needs.
//
//   cpu_benchmark                      the sweep: seqlen 512..4096, D 64 and 128, causal and
//                                      not, float32 and bfloat16, batch 1, 8 heads
//   cpu_benchmark --memory 32768       forward at one head and that seqlen, flash and standard
//                                      each in a child process; reports each child's peak RSS
//   options: --threads N (0: all hardware threads; default 2), --seqlens 512,1024,...,
//            --heads H, --dims 64,128, --iters N, --no-backward, --dtypes f32,bf16
//
// Also checks that flash and standard agree, and exits 1 when they do not.
#include <flashattn/flashattn.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Config {
  int threads = 2;
  int heads = 8;
  int iters = 3;
  bool backward = true;
  std::vector<int64_t> seqlens = {512, 1024, 2048, 4096};
  std::vector<int64_t> dims = {64, 128};
  std::vector<flashattn_dtype_t> dtypes = {FLASHATTN_DTYPE_FLOAT32, FLASHATTN_DTYPE_BFLOAT16};
  int64_t memory_seqlen = 0;
};

[[noreturn]] void die(const char* what, flashattn_status_t s) {
  std::fprintf(stderr, "cpu_benchmark: %s: %s: %s\n", what, flashattn_status_string(s),
               flashattn_last_error());
  std::exit(2);
}

void check(flashattn_status_t s, const char* what) {
  if (s != FLASHATTN_SUCCESS) die(what, s);
}

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> v;
  while (*s) {
    char* end = nullptr;
    v.push_back(std::strtoll(s, &end, 10));
    s = *end == ',' ? end + 1 : end;
    if (end == s && *s) break;
  }
  return v;
}

size_t elem_size(flashattn_dtype_t t) { return t == FLASHATTN_DTYPE_FLOAT32 ? 4 : 2; }
const char* dtype_name(flashattn_dtype_t t) {
  return t == FLASHATTN_DTYPE_FLOAT32 ? "f32" : t == FLASHATTN_DTYPE_FLOAT16 ? "f16" : "bf16";
}

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE half, round to nearest even; enough for the benchmark's finite values.
uint16_t to_fp16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const float a = std::fabs(f);
  if (a >= 65520.0f) return static_cast<uint16_t>(sign | 0x7c00u);
  if (a < 0x1p-14f) {  // subnormal: multiples of 2^-24
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(a * 0x1p24f)));
  }
  uint32_t abs = u & 0x7fffffffu;
  abs += 0xfffu + ((abs >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((abs - (112u << 23)) >> 13));
}
float from_fp16(uint16_t h) {
  const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  const float mag = exp == 0    ? std::ldexp(static_cast<float>(mant), -24)
                    : exp == 31 ? (mant ? NAN : INFINITY)
                                : std::ldexp(static_cast<float>(mant | 0x400), exp - 25);
  return (h & 0x8000u) ? -mag : mag;
}

// A host tensor [1, n, h, d] of random values in [-1, 1).
struct Tensor {
  std::vector<unsigned char> bytes;
  flashattn_tensor_t view{};
  Tensor(flashattn_dtype_t dtype, int64_t n, int64_t h, int64_t d, uint64_t seed) {
    const size_t count = static_cast<size_t>(n * h * d);
    bytes.resize(count * elem_size(dtype));
    uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < count; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      const float x = static_cast<float>(static_cast<int32_t>(state >> 40) - (1 << 23)) / (1 << 23);
      if (dtype == FLASHATTN_DTYPE_FLOAT32) {
        std::memcpy(&bytes[i * 4], &x, 4);
      } else {
        const uint16_t b = dtype == FLASHATTN_DTYPE_FLOAT16 ? to_fp16(x) : to_bf16(x);
        std::memcpy(&bytes[i * 2], &b, 2);
      }
    }
    check(flashattn_tensor_4d(&view, bytes.data(), dtype, 1, n, h, d), "tensor");
  }
  double at(size_t i) const {
    if (view.dtype == FLASHATTN_DTYPE_FLOAT32) {
      float f;
      std::memcpy(&f, &bytes[i * 4], 4);
      return f;
    }
    uint16_t b;
    std::memcpy(&b, &bytes[i * 2], 2);
    return view.dtype == FLASHATTN_DTYPE_FLOAT16 ? from_fp16(b) : from_bf16(b);
  }
  size_t count() const { return bytes.size() / elem_size(view.dtype); }
};

double max_diff(const Tensor& a, const Tensor& b) {
  double m = 0.0;
  for (size_t i = 0; i < a.count(); ++i) {
    const double d = std::fabs(a.at(i) - b.at(i));
    if (!(d <= m)) m = d;  // NaN wins
  }
  return m;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string mib(size_t bytes) {
  char buf[32];
  if (bytes >= (size_t(1) << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / 1073741824.0);
  } else {
    std::snprintf(buf, sizeof buf, "%.2f MiB", bytes / 1048576.0);
  }
  return buf;
}

struct Problem {
  flashattn_dtype_t dtype;
  int64_t n, h, d;
  bool causal;
};

struct Timing {
  double fwd_s = 1e30, bwd_s = 1e30;
  size_t fwd_ws = 0, bwd_ws = 0;
};

// One algorithm's context, options and outputs for one problem.
struct Runner {
  flashattn_context_t ctx = nullptr;
  flashattn_options_t o{};
  Tensor out, dq, dk, dv;
  std::vector<float> lse;
  flashattn_tensor_t lv{};
  Timing t;

  Runner(const Config& cfg, const Problem& p, flashattn_algorithm_t alg)
      : out(p.dtype, p.n, p.h, p.d, 5),
        dq(p.dtype, p.n, p.h, p.d, 6),
        dk(p.dtype, p.n, p.h, p.d, 6),
        dv(p.dtype, p.n, p.h, p.d, 6),
        lse(static_cast<size_t>(p.h * p.n)) {
    check(flashattn_context_create(&ctx, FLASHATTN_BACKEND_CPU, 0), "context");
    check(flashattn_context_set_num_threads(ctx, cfg.threads), "threads");
    flashattn_options_init(&o);
    o.causal = p.causal ? 1 : 0;
    o.algorithm = alg;
    check(flashattn_tensor_lse(&lv, lse.data(), 1, p.h, p.n), "lse view");
  }
  ~Runner() { flashattn_context_destroy(ctx); }

  void sizes(const Tensor& q, const Tensor& k, const Tensor& v, bool backward) {
    check(flashattn_workspace_size(&t.fwd_ws, ctx, &q.view, &k.view, &v.view, &o, 0), "workspace");
    if (backward) {
      check(flashattn_workspace_size(&t.bwd_ws, ctx, &q.view, &k.view, &v.view, &o, 1),
            "workspace");
    }
  }
  double forward(const Tensor& q, const Tensor& k, const Tensor& v) {
    const auto t0 = std::chrono::steady_clock::now();
    check(flashattn_forward(ctx, &q.view, &k.view, &v.view, &out.view, &lv, &o, nullptr, 0),
          "forward");
    return seconds_since(t0);
  }
  double backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout) {
    const auto t0 = std::chrono::steady_clock::now();
    check(flashattn_backward(ctx, &q.view, &k.view, &v.view, &out.view, &dout.view, &lv, &dq.view,
                             &dk.view, &dv.view, &o, nullptr, 0),
          "backward");
    return seconds_since(t0);
  }
};

// Flash and standard calls alternate, so both meet the same conditions (other processes on
// the machine); each keeps its best time over `iters` calls after one warm-up call (which also
// sizes the context's scratch).
void time_both(const Config& cfg, Runner& f, Runner& s, const Tensor& q, const Tensor& k,
               const Tensor& v, const Tensor& dout) {
  f.sizes(q, k, v, cfg.backward);
  s.sizes(q, k, v, cfg.backward);
  for (int it = 0; it <= cfg.iters; ++it) {
    const double tf = f.forward(q, k, v);
    const double ts = s.forward(q, k, v);
    if (it > 0) {
      f.t.fwd_s = std::min(f.t.fwd_s, tf);
      s.t.fwd_s = std::min(s.t.fwd_s, ts);
    }
  }
  if (!cfg.backward) return;
  for (int it = 0; it <= cfg.iters; ++it) {
    const double tf = f.backward(q, k, v, dout);
    const double ts = s.backward(q, k, v, dout);
    if (it > 0) {
      f.t.bwd_s = std::min(f.t.bwd_s, tf);
      s.t.bwd_s = std::min(s.t.bwd_s, ts);
    }
  }
}

// Other processes competing for the cores inflate wall-clock times: say how busy it was.
void print_load() {
  double load[3];
  if (getloadavg(load, 3) == 3) {
    std::printf("load average at start: %.2f %.2f %.2f\n", load[0], load[1], load[2]);
  }
}

int sweep(const Config& cfg) {
  print_load();
  std::printf(
      "threads %d, batch 1, heads %d; GFLOP/s = 4*B*H*N*N*D (causal /2) per forward, "
      "2.5x for backward; best of %d\n\n",
      cfg.threads, cfg.heads, cfg.iters);
  std::printf(
      "| dtype | D | causal | seqlen | fwd flash ms | fwd std ms | fwd flash GFLOP/s | "
      "fwd std GFLOP/s | bwd flash ms | bwd std ms | bwd flash GFLOP/s | bwd std GFLOP/s | "
      "flash ws fwd/bwd | std ws fwd/bwd | max abs diff |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  bool agree = true;
  for (flashattn_dtype_t dtype : cfg.dtypes)
    for (int64_t d : cfg.dims)
      for (int causal = 0; causal <= 1; ++causal)
        for (int64_t n : cfg.seqlens) {
          const Problem p{dtype, n, cfg.heads, d, causal != 0};
          Tensor q(dtype, n, p.h, d, 1), k(dtype, n, p.h, d, 2), v(dtype, n, p.h, d, 3);
          Tensor dout(dtype, n, p.h, d, 4);
          Runner fr(cfg, p, FLASHATTN_ALGORITHM_FLASH);
          Runner sr(cfg, p, FLASHATTN_ALGORITHM_STANDARD);
          time_both(cfg, fr, sr, q, k, v, dout);
          const Timing& f = fr.t;
          const Timing& s = sr.t;
          double diff = max_diff(fr.out, sr.out);
          if (cfg.backward) {
            diff = std::max(
                {diff, max_diff(fr.dq, sr.dq), max_diff(fr.dk, sr.dk), max_diff(fr.dv, sr.dv)});
          }
          // Loose on purpose: a sanity check that both ran, not the numerics tests.
          const double tol = dtype == FLASHATTN_DTYPE_FLOAT32 ? 1e-3 : 0.1;
          if (!(diff <= tol)) agree = false;
          const double flops = 4.0 * p.h * double(n) * double(n) * double(d) * (causal ? 0.5 : 1.0);
          const double g = 1e-9;
          if (cfg.backward) {
            std::printf(
                "| %s | %lld | %s | %lld | %.1f | %.1f | %.0f | %.0f | %.1f | %.1f | %.0f | "
                "%.0f | %s / %s | %s / %s | %.2g |\n",
                dtype_name(dtype), static_cast<long long>(d), causal ? "yes" : "no",
                static_cast<long long>(n), f.fwd_s * 1e3, s.fwd_s * 1e3, flops / f.fwd_s * g,
                flops / s.fwd_s * g, f.bwd_s * 1e3, s.bwd_s * 1e3, 2.5 * flops / f.bwd_s * g,
                2.5 * flops / s.bwd_s * g, mib(f.fwd_ws).c_str(), mib(f.bwd_ws).c_str(),
                mib(s.fwd_ws).c_str(), mib(s.bwd_ws).c_str(), diff);
          } else {
            std::printf(
                "| %s | %lld | %s | %lld | %.1f | %.1f | %.0f | %.0f | - | - | - | - | %s | "
                "%s | %.2g |\n",
                dtype_name(dtype), static_cast<long long>(d), causal ? "yes" : "no",
                static_cast<long long>(n), f.fwd_s * 1e3, s.fwd_s * 1e3, flops / f.fwd_s * g,
                flops / s.fwd_s * g, mib(f.fwd_ws).c_str(), mib(s.fwd_ws).c_str(), diff);
          }
          std::fflush(stdout);
        }
  if (!agree) {
    std::printf("\nflash and standard results DISAGREE beyond tolerance\n");
    return 1;
  }
  return 0;
}

struct ChildReport {
  size_t workspace = 0;
  double seconds = 0.0;
};

// One forward in a child process; returns its peak RSS in bytes (0 on failure).
size_t child_peak_rss(const Config& cfg, int64_t n, int mode, ChildReport* report) {
  int fds[2];
  if (pipe(fds) != 0) return 0;
  const pid_t pid = fork();
  if (pid < 0) return 0;
  if (pid == 0) {
    close(fds[0]);
    const flashattn_dtype_t dtype = FLASHATTN_DTYPE_BFLOAT16;
    const int64_t d = 128;
    Tensor q(dtype, n, 1, d, 1), k(dtype, n, 1, d, 2), v(dtype, n, 1, d, 3), out(dtype, n, 1, d, 4);
    std::vector<float> lse(static_cast<size_t>(n), 0.0f);
    ChildReport r;
    if (mode > 0) {
      flashattn_context_t ctx = nullptr;
      check(flashattn_context_create(&ctx, FLASHATTN_BACKEND_CPU, 0), "context");
      check(flashattn_context_set_num_threads(ctx, cfg.threads), "threads");
      flashattn_options_t o;
      flashattn_options_init(&o);
      o.algorithm = mode == 1 ? FLASHATTN_ALGORITHM_FLASH : FLASHATTN_ALGORITHM_STANDARD;
      flashattn_tensor_t lv;
      check(flashattn_tensor_lse(&lv, lse.data(), 1, 1, n), "lse");
      check(flashattn_workspace_size(&r.workspace, ctx, &q.view, &k.view, &v.view, &o, 0),
            "workspace");
      const auto t0 = std::chrono::steady_clock::now();
      check(flashattn_forward(ctx, &q.view, &k.view, &v.view, &out.view, &lv, &o, nullptr, 0),
            "forward");
      r.seconds = seconds_since(t0);  // includes the first touch of the workspace
      flashattn_context_destroy(ctx);
    }
    if (write(fds[1], &r, sizeof r) != static_cast<ssize_t>(sizeof r)) _exit(3);
    _exit(0);
  }
  close(fds[1]);
  *report = ChildReport{};
  if (read(fds[0], report, sizeof *report) != static_cast<ssize_t>(sizeof *report)) {
    *report = ChildReport{};
  }
  close(fds[0]);
  int status = 0;
  struct rusage ru {};
  if (wait4(pid, &status, 0, &ru) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return 0;
  return static_cast<size_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

int memory(const Config& cfg) {
  const int64_t n = cfg.memory_seqlen;
  std::printf(
      "forward, batch 1, 1 head, head_dim 128, bfloat16, seqlen %lld, threads %d; each "
      "in its own child process (peak RSS from wait4)\n\n",
      static_cast<long long>(n), cfg.threads);
  std::printf("| run | peak RSS | workspace | forward time |\n|---|---|---|---|\n");
  const char* names[3] = {"tensors only (q, k, v, out, lse)", "flash", "standard"};
  bool ok = true;
  for (int mode = 0; mode < 3; ++mode) {
    ChildReport r;
    const size_t rss = child_peak_rss(cfg, n, mode, &r);
    if (rss == 0) ok = false;
    char time[32] = "-";
    if (mode > 0) std::snprintf(time, sizeof time, "%.2f s", r.seconds);
    std::printf("| %s | %s | %s | %s |\n", names[mode], rss ? mib(rss).c_str() : "failed",
                mode ? mib(r.workspace).c_str() : "-", time);
    std::fflush(stdout);
  }
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  Config cfg;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const char* next = i + 1 < argc ? argv[i + 1] : nullptr;
    if (a == "--threads" && next) {
      cfg.threads = std::atoi(argv[++i]);
    } else if (a == "--heads" && next) {
      cfg.heads = std::atoi(argv[++i]);
    } else if (a == "--iters" && next) {
      cfg.iters = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--seqlens" && next) {
      cfg.seqlens = parse_list(argv[++i]);
    } else if (a == "--dims" && next) {
      cfg.dims = parse_list(argv[++i]);
    } else if (a == "--dtypes" && next) {
      cfg.dtypes.clear();
      std::string list = std::string(argv[++i]) + ",";
      for (size_t at = list.find(','); at != std::string::npos; at = list.find(',')) {
        const std::string t = list.substr(0, at);
        list.erase(0, at + 1);
        if (t == "f32") cfg.dtypes.push_back(FLASHATTN_DTYPE_FLOAT32);
        if (t == "f16") cfg.dtypes.push_back(FLASHATTN_DTYPE_FLOAT16);
        if (t == "bf16") cfg.dtypes.push_back(FLASHATTN_DTYPE_BFLOAT16);
      }
    } else if (a == "--no-backward") {
      cfg.backward = false;
    } else if (a == "--memory" && next) {
      cfg.memory_seqlen = std::atoll(argv[++i]);
    } else {
      std::fprintf(stderr,
                   "usage: %s [--threads N] [--heads H] [--seqlens a,b,...] [--dims a,b] "
                   "[--dtypes f32,bf16,f16] [--iters N] [--no-backward] | --memory SEQLEN\n",
                   argv[0]);
      return 2;
    }
  }
  if (cfg.memory_seqlen > 0) return memory(cfg);
  return sweep(cfg);
}
