/* How many multiply-adds per second one core sustains with each instruction a CPU kernel could
 * use for its GEMMs: AVX-512 FMA (vfmadd231ps, 16 fp32 lanes) and AVX-512 BF16's pair dot product
 * (vdpbf16ps, 16 lanes of two bf16 products each), with enough independent accumulators to hide
 * their latency. Which one a bf16 path should use depends on the machine: on one Xeon (model 207)
 * vdpbf16ps ran at a quarter of the FMA's instruction rate, so at half its multiply-adds.
 *
 *   cc -O3 -o cpu_throughput bench/cpu_throughput.c && ./cpu_throughput
 */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

enum { kAccumulators = 24 };       /* independent chains: latency times the issue rate */
static const long kIterations = 50000000;

static double seconds(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

__attribute__((target("avx512f,fma"))) static float run_fma(long n) {
  __m512 c[kAccumulators];
  for (int i = 0; i < kAccumulators; i++) c[i] = _mm512_setzero_ps();
  __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(1e-9f);
  for (long k = 0; k < n; k++) {
#pragma GCC unroll 24
    for (int i = 0; i < kAccumulators; i++) c[i] = _mm512_fmadd_ps(a, b, c[i]);
    __asm__ volatile("" : "+v"(a));  /* keeps the loop from being folded */
  }
  __m512 s = c[0];
  for (int i = 1; i < kAccumulators; i++) s = _mm512_add_ps(s, c[i]);
  return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx512f,avx512bf16"))) static float run_dpbf16(long n) {
  __m512 c[kAccumulators];
  for (int i = 0; i < kAccumulators; i++) c[i] = _mm512_setzero_ps();
  __m512i a = _mm512_set1_epi32(0x3f803f80), b = _mm512_set1_epi32(0x3f803f80); /* bf16 1.0 */
  for (long k = 0; k < n; k++) {
#pragma GCC unroll 24
    for (int i = 0; i < kAccumulators; i++) {
      c[i] = _mm512_dpbf16_ps(c[i], (__m512bh)a, (__m512bh)b);
    }
    __asm__ volatile("" : "+v"(a));
  }
  __m512 s = c[0];
  for (int i = 1; i < kAccumulators; i++) s = _mm512_add_ps(s, c[i]);
  return _mm512_reduce_add_ps(s);
}

static void report(const char* name, double t, int macs_per_instruction, float sink) {
  const double instructions = (double)kAccumulators * (double)kIterations;
  printf("%-10s %6.2f G instructions/s  %7.1f GFLOP/s  (%g)\n", name, instructions / t / 1e9,
         2.0 * macs_per_instruction * instructions / t / 1e9, sink);
}

int main(void) {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f")) {
    puts("cpu_throughput: no AVX-512 on this CPU");
    return 0;
  }
  double t = seconds();
  float s = run_fma(kIterations);
  report("fma", seconds() - t, 16, s);
  if (__builtin_cpu_supports("avx512bf16")) {
    t = seconds();
    s = run_dpbf16(kIterations);
    report("dpbf16", seconds() - t, 32, s);
  } else {
    puts("dpbf16     (no AVX-512 BF16 on this CPU)");
  }
  return 0;
}
