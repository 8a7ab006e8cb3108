// The CPU backend's options and resources: thread counts (results identical whatever the
// count), workspace sizes and caller-owned workspaces, every instruction-set copy, host buffers.
#include <doctest/doctest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "cpu/harness.hpp"

using namespace flashattn_test;

namespace {

Case make(flashattn_dtype_t dtype, int64_t b, int64_t nq, int64_t nk, int64_t hq, int64_t hkv,
          int64_t d, bool causal) {
  return shaped_case(dtype, b, nq, nk, hq, hkv, d, causal, 77);
}

bool same_bytes(const HostTensor& a, const HostTensor& b) {
  return a.storage_bytes() == b.storage_bytes() &&
         std::memcmp(a.storage_data(), b.storage_data(), a.storage_bytes()) == 0;
}

size_t workspace(flashattn_context_t ctx, flashattn_dtype_t dtype, int64_t nq, int64_t nk,
                 int64_t h, int64_t d, flashattn_algorithm_t alg, int backward) {
  flashattn_tensor_t q, k, v;
  REQUIRE(flashattn_tensor_4d(&q, nullptr, dtype, 1, nq, h, d) == FLASHATTN_SUCCESS);
  REQUIRE(flashattn_tensor_4d(&k, nullptr, dtype, 1, nk, h, d) == FLASHATTN_SUCCESS);
  REQUIRE(flashattn_tensor_4d(&v, nullptr, dtype, 1, nk, h, d) == FLASHATTN_SUCCESS);
  flashattn_options_t o;
  flashattn_options_init(&o);
  o.algorithm = alg;
  size_t bytes = 0;
  REQUIRE_MESSAGE(
      flashattn_workspace_size(&bytes, ctx, &q, &k, &v, &o, backward) == FLASHATTN_SUCCESS,
      flashattn_last_error());
  return bytes;
}

// The copy of the kernels a context created now takes.
flashattn_cpu_kernels_t kernels_of_new_context() {
  flashattn_context_t ctx = nullptr;
  REQUIRE(flashattn_context_create(&ctx, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_SUCCESS);
  flashattn_cpu_kernels_t kernels = FLASHATTN_CPU_KERNELS_NONE;
  CHECK(flashattn_context_get_cpu_kernels(&kernels, ctx) == FLASHATTN_SUCCESS);
  flashattn_context_destroy(ctx);
  return kernels;
}

// Sets FLASHATTN_CPU_ISA for the contexts created in its scope.
struct IsaLimit {
  explicit IsaLimit(const char* isa) { setenv("FLASHATTN_CPU_ISA", isa, 1); }
  ~IsaLimit() { unsetenv("FLASHATTN_CPU_ISA"); }
};

}  // namespace

TEST_SUITE("cpu_options") {
  TEST_CASE("results are bit-identical for 1, 2 and 3 threads") {
    const Case cases[] = {
        make(FLASHATTN_DTYPE_FLOAT32, 2, 150, 300, 4, 2, 40, true),
        make(FLASHATTN_DTYPE_BFLOAT16, 1, 130, 1100, 1, 1, 64, false),  // chunked backward
    };
    for (const Case& base : cases) {
      for (flashattn_algorithm_t alg : {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD}) {
        Case c = base;
        INFO(c.name(), " algorithm ", static_cast<int>(alg));
        const Inputs in = make_inputs(c);
        ForwardResult fwd[3];
        BackwardResult bwd[3];
        for (int t = 1; t <= 3; ++t) {
          CpuContext ctx(t);
          fwd[t - 1] = run_forward(ctx.get(), c, in, alg);
          // Every backward reads the same forward outputs, so only the thread count differs.
          bwd[t - 1] = run_backward(ctx.get(), c, in, fwd[0], alg);
        }
        for (int t = 1; t < 3; ++t) {
          CHECK(same_bytes(fwd[t].out, fwd[0].out));
          CHECK(same_bytes(fwd[t].lse, fwd[0].lse));
          CHECK(same_bytes(bwd[t].dq, bwd[0].dq));
          CHECK(same_bytes(bwd[t].dk, bwd[0].dk));
          CHECK(same_bytes(bwd[t].dv, bwd[0].dv));
        }
      }
    }
  }

  TEST_CASE("flash workspace does not grow with seqlen^2; standard holds the score matrix") {
    CpuContext ctx(2);
    const auto F32 = FLASHATTN_DTYPE_FLOAT32;
    const size_t flash_small =
        workspace(ctx.get(), F32, 8192, 8192, 1, 128, FLASHATTN_ALGORITHM_FLASH, 0);
    const size_t flash_large =
        workspace(ctx.get(), F32, 32768, 32768, 1, 128, FLASHATTN_ALGORITHM_FLASH, 0);
    CHECK(flash_small == flash_large);  // per-thread tiles only
    CHECK(flash_large < (size_t(4) << 20));
    CHECK(workspace(ctx.get(), F32, 1024, 1024, 1, 128, FLASHATTN_ALGORITHM_FLASH, 0) <=
          flash_large);
    const size_t standard =
        workspace(ctx.get(), F32, 32768, 32768, 1, 128, FLASHATTN_ALGORITHM_STANDARD, 0);
    CHECK(standard >= size_t(32768) * 32768 * 4);
    // The backward's extra memory is linear in seqlen.
    const size_t b1 = workspace(ctx.get(), F32, 4096, 4096, 1, 128, FLASHATTN_ALGORITHM_FLASH, 1);
    const size_t b2 = workspace(ctx.get(), F32, 8192, 8192, 1, 128, FLASHATTN_ALGORITHM_FLASH, 1);
    CHECK(b2 <= 2 * b1 + (size_t(1) << 20));
    CHECK(b2 < (size_t(128) << 20));
    const size_t sb =
        workspace(ctx.get(), F32, 8192, 8192, 1, 128, FLASHATTN_ALGORITHM_STANDARD, 1);
    CHECK(sb >= size_t(2) * 8192 * 8192 * 4);
    // Per-thread scratch: more threads, more workspace.
    REQUIRE(flashattn_context_set_num_threads(ctx.get(), 4) == FLASHATTN_SUCCESS);
    CHECK(workspace(ctx.get(), F32, 32768, 32768, 1, 128, FLASHATTN_ALGORITHM_FLASH, 0) >
          flash_large);
  }

  TEST_CASE("a workspace size that cannot be represented is an error, not a crash") {
    CpuContext ctx(2);
    const int64_t n = (int64_t(1) << 31) - 1;
    flashattn_tensor_t q, k, v;
    REQUIRE(flashattn_tensor_4d(&q, nullptr, FLASHATTN_DTYPE_FLOAT32, 1, n, 8, 1) ==
            FLASHATTN_SUCCESS);
    REQUIRE(flashattn_tensor_4d(&k, nullptr, FLASHATTN_DTYPE_FLOAT32, 1, n, 8, 1) ==
            FLASHATTN_SUCCESS);
    REQUIRE(flashattn_tensor_4d(&v, nullptr, FLASHATTN_DTYPE_FLOAT32, 1, n, 8, 1) ==
            FLASHATTN_SUCCESS);
    flashattn_options_t o;
    flashattn_options_init(&o);
    o.algorithm = FLASHATTN_ALGORITHM_STANDARD;  // S alone is 8 * 2^31 * 2^31 * 4 bytes = 2^67
    size_t bytes = 0;
    const flashattn_status_t s = flashattn_workspace_size(&bytes, ctx.get(), &q, &k, &v, &o, 1);
    CHECK(s == FLASHATTN_ERROR_OUT_OF_MEMORY);
    CHECK(std::strstr(flashattn_last_error(), "cannot be represented") != nullptr);
    // The flash path needs no score matrix: the same problem has a modest workspace.
    o.algorithm = FLASHATTN_ALGORITHM_FLASH;
    CHECK(flashattn_workspace_size(&bytes, ctx.get(), &q, &k, &v, &o, 0) == FLASHATTN_SUCCESS);
    CHECK(bytes < (size_t(16) << 20));
  }

  TEST_CASE("a caller-owned workspace gives the context-scratch result; too small is refused") {
    Case c = make(FLASHATTN_DTYPE_FLOAT16, 1, 100, 120, 2, 2, 32, true);
    CpuContext ctx(2);
    const Inputs in = make_inputs(c);
    for (flashattn_algorithm_t alg : {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD}) {
      const ForwardResult own = run_forward(ctx.get(), c, in, alg);
      const flashattn_tensor_t q = in.q.view(), k = in.k.view(), v = in.v.view();
      size_t bytes = 0;
      const flashattn_options_t o = options_for(c, alg);
      REQUIRE(flashattn_workspace_size(&bytes, ctx.get(), &q, &k, &v, &o, 0) == FLASHATTN_SUCCESS);
      std::vector<unsigned char> ws(bytes, 0xFF);  // NaN patterns: scratch must not be trusted
      HostTensor out = make_output(c, false, c.head_dim);
      HostTensor lse = HostTensor::lse(1, 2, 100);
      const flashattn_tensor_t ov = out.view(), lv = lse.view();
      REQUIRE(flashattn_forward(ctx.get(), &q, &k, &v, &ov, &lv, &o, ws.data(), ws.size()) ==
              FLASHATTN_SUCCESS);
      CHECK(same_bytes(out, own.out));
      CHECK(same_bytes(lse, own.lse));
      CHECK(flashattn_forward(ctx.get(), &q, &k, &v, &ov, &lv, &o, ws.data(), bytes - 1) ==
            FLASHATTN_ERROR_WORKSPACE_TOO_SMALL);
    }
  }

  TEST_CASE("a context says which copy it took: the best there is, at most FLASHATTN_CPU_ISA's") {
    // A limit inherited from the caller's environment would cap `best`; set aside meanwhile.
    const char* inherited = std::getenv("FLASHATTN_CPU_ISA");
    const std::string kept = inherited != nullptr ? inherited : "";
    unsetenv("FLASHATTN_CPU_ISA");
    const flashattn_cpu_kernels_t best = kernels_of_new_context();
    REQUIRE(best >= FLASHATTN_CPU_KERNELS_GENERIC);
    REQUIRE(best <= FLASHATTN_CPU_KERNELS_AMX);
    const std::string best_name = kCpuKernelsNames[best - FLASHATTN_CPU_KERNELS_GENERIC];
    MESSAGE("this machine's CPU kernels: ", best_name);
    // A CI step that knows what the build and machine must pick says so (25-amx-emulated).
    if (const char* expect = std::getenv("FLASHATTN_TEST_EXPECT_CPU_KERNELS")) {
      CHECK(best_name == expect);
    }
    for (int rank = 0; rank < static_cast<int>(std::size(kCpuKernelsNames)); ++rank) {
      IsaLimit limit(kCpuKernelsNames[rank]);
      INFO("FLASHATTN_CPU_ISA=", kCpuKernelsNames[rank]);
      const auto capped =
          static_cast<flashattn_cpu_kernels_t>(FLASHATTN_CPU_KERNELS_GENERIC + rank);
      // The limit where the machine has that copy, else the best the machine has.
      CHECK(kernels_of_new_context() == std::min(capped, best));
    }
    {
      IsaLimit limit("no-such-isa");  // an unknown name sets no limit
      CHECK(kernels_of_new_context() == best);
    }
    if (inherited != nullptr) setenv("FLASHATTN_CPU_ISA", kept.c_str(), 1);
  }

  TEST_CASE("every instruction-set copy of the kernels is right") {
    // avx512bf16 runs where the CPU issues bf16 pairs at the FMA's rate (else the limit leaves
    // the best copy there is): bf16 with odd head dims too, whose last pair is half padding.
    for (const char* isa : kCpuKernelsNames) {
      IsaLimit limit(isa);
      INFO("FLASHATTN_CPU_ISA=", isa);
      check_forward(make(FLASHATTN_DTYPE_FLOAT32, 1, 70, 150, 2, 1, 72, true));
      check_forward(make(FLASHATTN_DTYPE_FLOAT16, 1, 33, 65, 1, 1, 5, false));
      check_forward(make(FLASHATTN_DTYPE_BFLOAT16, 1, 33, 65, 2, 1, 5, true));
      check_backward(make(FLASHATTN_DTYPE_BFLOAT16, 1, 70, 130, 2, 2, 48, true));
      check_backward(make(FLASHATTN_DTYPE_BFLOAT16, 2, 37, 50, 4, 2, 7, false));
      check_backward(make(FLASHATTN_DTYPE_FLOAT32, 1, 20, 20, 1, 1, 130, false));
    }
  }

  TEST_CASE("thread counts: 0 means the hardware's, and contexts are independent") {
    flashattn_context_t a = nullptr, b = nullptr;
    REQUIRE(flashattn_context_create(&a, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_SUCCESS);
    REQUIRE(flashattn_context_create(&b, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_SUCCESS);
    CHECK(flashattn_context_set_num_threads(a, 0) == FLASHATTN_SUCCESS);
    CHECK(flashattn_context_set_num_threads(b, 5) == FLASHATTN_SUCCESS);
    CHECK(flashattn_context_set_num_threads(a, -1) == FLASHATTN_ERROR_INVALID_ARGUMENT);
    void* stream = reinterpret_cast<void*>(1);
    CHECK(flashattn_context_get_stream(&stream, a) == FLASHATTN_SUCCESS);
    CHECK(stream == nullptr);
    CHECK(flashattn_context_synchronize(a) == FLASHATTN_SUCCESS);
    Case c = make(FLASHATTN_DTYPE_FLOAT32, 1, 80, 80, 2, 2, 16, false);
    const Inputs in = make_inputs(c);
    const ForwardResult ra = run_forward(a, c, in, FLASHATTN_ALGORITHM_FLASH);
    const ForwardResult rb = run_forward(b, c, in, FLASHATTN_ALGORITHM_FLASH);
    CHECK(same_bytes(ra.out, rb.out));
    // Resizing between calls, then the same result again.
    CHECK(flashattn_context_set_num_threads(b, 1) == FLASHATTN_SUCCESS);
    CHECK(same_bytes(run_forward(b, c, in, FLASHATTN_ALGORITHM_FLASH).out, ra.out));
    flashattn_context_destroy(a);
    flashattn_context_destroy(b);
  }

  TEST_CASE("host buffers: 256-byte aligned; absurd sizes are OUT_OF_MEMORY") {
    CpuContext ctx(1);
    for (size_t bytes : {size_t(1), size_t(100), size_t(4096), size_t(1) << 20}) {
      flashattn_buffer_t buf = nullptr;
      REQUIRE(flashattn_buffer_create(&buf, ctx.get(), bytes) == FLASHATTN_SUCCESS);
      void* data = nullptr;
      REQUIRE(flashattn_buffer_data(&data, buf) == FLASHATTN_SUCCESS);
      CHECK(reinterpret_cast<uintptr_t>(data) % 256 == 0);
      std::vector<unsigned char> src(bytes, 0x5A), dst(bytes, 0);
      CHECK(flashattn_buffer_write(buf, 0, src.data(), bytes) == FLASHATTN_SUCCESS);
      CHECK(flashattn_buffer_read(buf, 0, dst.data(), bytes) == FLASHATTN_SUCCESS);
      CHECK(src == dst);
      flashattn_buffer_destroy(buf);
    }
    for (size_t bytes : {SIZE_MAX, SIZE_MAX / 2, size_t(1) << 50}) {
      flashattn_buffer_t buf = nullptr;
      CHECK(flashattn_buffer_create(&buf, ctx.get(), bytes) == FLASHATTN_ERROR_OUT_OF_MEMORY);
      CHECK(buf == nullptr);
    }
  }

  TEST_CASE("tensors in library buffers") {
    Case c = make(FLASHATTN_DTYPE_BFLOAT16, 1, 50, 60, 2, 2, 16, true);
    CpuContext ctx(2);
    const Inputs in = make_inputs(c);
    const ForwardResult plain = run_forward(ctx.get(), c, in, FLASHATTN_ALGORITHM_FLASH);
    // Copy q, k, v into buffers and rebase the views, as a GPU test would with device memory.
    const HostTensor* src[3] = {&in.q, &in.k, &in.v};
    flashattn_buffer_t bufs[3];
    flashattn_tensor_t views[3];
    for (int i = 0; i < 3; ++i) {
      REQUIRE(flashattn_buffer_create(&bufs[i], ctx.get(), src[i]->storage_bytes()) ==
              FLASHATTN_SUCCESS);
      REQUIRE(flashattn_buffer_write(bufs[i], 0, src[i]->storage_data(), src[i]->storage_bytes()) ==
              FLASHATTN_SUCCESS);
      void* base = nullptr;
      flashattn_buffer_data(&base, bufs[i]);
      views[i] = src[i]->view_at(base);
    }
    HostTensor out = make_output(c, false, c.head_dim);
    const flashattn_tensor_t ov = out.view();
    const flashattn_options_t o = options_for(c, FLASHATTN_ALGORITHM_FLASH);
    REQUIRE(flashattn_forward(ctx.get(), &views[0], &views[1], &views[2], &ov, nullptr, &o, nullptr,
                              0) == FLASHATTN_SUCCESS);
    CHECK(same_bytes(out, plain.out));
    for (flashattn_buffer_t b : bufs) flashattn_buffer_destroy(b);
  }

  TEST_CASE("softmax_scale past FLASHATTN_MAX_SOFTMAX_SCALE is refused by every operation") {
    CpuContext ctx(2);
    Case c = make(FLASHATTN_DTYPE_FLOAT32, 1, 8, 8, 1, 1, 16, false);
    const Inputs in = make_inputs(c);
    const float beyond[] = {std::nextafter(FLASHATTN_MAX_SOFTMAX_SCALE, INFINITY), 1e38f, FLT_MAX,
                            -FLT_MAX, -std::nextafter(FLASHATTN_MAX_SOFTMAX_SCALE, INFINITY)};
    for (float scale : beyond) {
      INFO("softmax_scale " << scale);
      c.scale = scale;
      const flashattn_options_t o = options_for(c, FLASHATTN_ALGORITHM_FLASH);
      const flashattn_tensor_t q = in.q.view(), k = in.k.view(), v = in.v.view();
      HostTensor out = make_output(c, false, c.head_dim);
      HostTensor lse = HostTensor::lse(1, 1, 8);
      lse.poison();
      const flashattn_tensor_t ov = out.view(), lv = lse.view();
      CHECK(flashattn_forward(ctx.get(), &q, &k, &v, &ov, &lv, &o, nullptr, 0) ==
            FLASHATTN_ERROR_INVALID_ARGUMENT);
      CHECK(std::strstr(flashattn_last_error(), "softmax_scale") != nullptr);
      CHECK(std::strstr(flashattn_last_error(), "FLASHATTN_MAX_SOFTMAX_SCALE") != nullptr);
      CHECK(check_no_nan("out", out.to_double()).ok == false);  // still poisoned: not written
      CHECK(flashattn_supported(ctx.get(), &q, &k, &v, &o, 1) == FLASHATTN_ERROR_INVALID_ARGUMENT);
      size_t bytes = 7;
      CHECK(flashattn_workspace_size(&bytes, ctx.get(), &q, &k, &v, &o, 0) ==
            FLASHATTN_ERROR_INVALID_ARGUMENT);
      CHECK(bytes == 7);
    }
  }

  TEST_CASE("at FLASHATTN_MAX_SOFTMAX_SCALE every result is finite: a one-hot softmax") {
    // Each query's largest score is then ~1e26 above the next: the softmax is one-hot, out is
    // the v row of that key, and dv sums the dout rows of the queries that picked each key.
    for (flashattn_dtype_t dtype :
         {FLASHATTN_DTYPE_FLOAT32, FLASHATTN_DTYPE_FLOAT16, FLASHATTN_DTYPE_BFLOAT16})
      for (float scale : {FLASHATTN_MAX_SOFTMAX_SCALE, -FLASHATTN_MAX_SOFTMAX_SCALE})
        for (bool causal : {false, true})
          for (flashattn_algorithm_t alg :
               {FLASHATTN_ALGORITHM_FLASH, FLASHATTN_ALGORITHM_STANDARD}) {
            Case c = make(dtype, 1, 70, 90, 2, 1, 24, causal);
            c.scale = scale;
            const char* algorithm = alg == FLASHATTN_ALGORITHM_FLASH ? " flash" : " standard";
            INFO(c.name() << std::string(algorithm));
            CpuContext ctx(2);
            const Inputs in = make_inputs(c);
            const ForwardResult f = run_forward(ctx.get(), c, in, alg);
            const BackwardResult g = run_backward(ctx.get(), c, in, f, alg);
            for (const HostTensor* t : {&f.out, &f.lse, &g.dq, &g.dk, &g.dv}) {
              for (double x : t->to_double()) REQUIRE(std::isfinite(x));
            }
            std::vector<double> want_dv(static_cast<size_t>(in.v.numel()), 0.0);
            const int64_t d = c.head_dim, off = c.seqlen_k - c.seqlen_q;
            for (int64_t h = 0; h < c.heads_q; ++h)
              for (int64_t i = 0; i < c.seqlen_q; ++i) {
                const int64_t visible = causal ? std::min(c.seqlen_k, i + off + 1) : c.seqlen_k;
                int64_t best = 0;
                double best_score = -INFINITY;
                for (int64_t j = 0; j < visible; ++j) {
                  double s = 0;
                  for (int64_t x = 0; x < d; ++x) s += in.q.get(0, i, h, x) * in.k.get(0, j, 0, x);
                  s *= scale;
                  if (s > best_score) best_score = s, best = j;
                }
                for (int64_t x = 0; x < d; ++x) {
                  CHECK(f.out.get(0, i, h, x) == in.v.get(0, best, 0, x));
                  want_dv[static_cast<size_t>(best * d + x)] += in.dout.get(0, i, h, x);
                }
              }
            const Comparison dv =
                check_close("dv", g.dv.to_double(), want_dv, standard_tolerance(dtype, want_dv));
            CHECK_MESSAGE(dv.ok, dv.message);
          }
  }

}  // TEST_SUITE
