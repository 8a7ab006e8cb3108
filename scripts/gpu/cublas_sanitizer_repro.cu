// What compute-sanitizer says of cuBLAS alone, without the library: the evidence behind the
// standard path's NVTX marks (lib/cuda/standard/standard.cpp) and docs/reliability.md. On the GPU
// machine:
//   nvcc -O2 -arch=sm_90a scripts/gpu/cublas_sanitizer_repro.cu -lcublas -o repro
//   compute-sanitizer --tool initcheck --nvtx yes ./repro 0    (every read of C reported)
//   compute-sanitizer --tool initcheck --nvtx yes ./repro 2    (0 errors)
//   compute-sanitizer --tool racecheck ./repro 3
// Modes: 0 = S = K^T Q (fp32 out) by cuBLAS, then a kernel reads S; 1 = the same with S memset
// first; 2 = no memset, S marked written through the NVTX memory API; 3 = the standard path's
// GEMM kinds over 640 small shapes in bf16 and fp16, inputs memset (for racecheck).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <nvtx3/nvToolsExtMemCudaRt.h>
#include <cstdio>
#include <cstdlib>
__global__ void sum_kernel(const float* c, long n, float* out) {
  float s = 0.f;
  for (long i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) s += c[i];
  atomicAdd(out, s);
}
static cudaDataType g_in = CUDA_R_16BF;
static void gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                 const void* A, int lda, long long sa, const void* B, int ldb, long long sb, void* C,
                 cudaDataType ct, int ldc, long long sc, int batch) {
  const float alpha = 1.f, beta = 0.f;
  cublasStatus_t st = cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, &alpha, A, g_in, lda, sa,
      B, g_in, ldb, sb, &beta, C, ct, ldc, sc, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS) printf("cublas error %d\n", (int)st);
}
int main(int argc, char** argv) {
  const int mode = argc > 1 ? atoi(argv[1]) : 0;
  cublasHandle_t h; cublasCreate(&h);
  const size_t big = 64 << 20;
  char *a, *b, *c; float* out;
  cudaMalloc(&a, big); cudaMemset(a, 0, big);
  cudaMalloc(&b, big); cudaMemset(b, 0, big);
  cudaMalloc(&c, big); cudaMalloc(&out, 4); cudaMemset(out, 0, 4);
  if (mode <= 2) {
    const int sk = 128, rows = 256, d = 64, batch = 4;
    if (mode == 1) cudaMemset(c, 0, sizeof(float) * sk * rows * batch);
    gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, sk, rows, d, a, d, (long long)sk * d, b, d, (long long)rows * d,
         c, CUDA_R_32F, sk, (long long)sk * rows, batch);
    if (mode == 2) {
      static nvtxDomainHandle_t dom = nvtxDomainCreateA("cs_cublas");
      nvtxMemVirtualRangeDesc_t r{}; r.ptr = c; r.size = sizeof(float) * sk * rows * batch;
      nvtxMemMarkInitializedBatch_t d{}; d.extCompatID = NVTX_EXT_COMPATID_MEM; d.structSize = sizeof(d);
      d.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS; d.regionDescCount = 1;
      d.regionDescElementSize = sizeof(r); d.regionDescElements = &r;
      nvtxMemCudaMarkInitialized(dom, 0, 0, &d);
    }
    sum_kernel<<<4, 256>>>(reinterpret_cast<float*>(c), (long)sk * rows * batch, out);
  } else {
    const int dims[] = {32, 64, 96, 128, 256};
    const int lens[] = {1, 17, 64, 100, 128, 200, 256, 300};
    for (cudaDataType in : {CUDA_R_16BF, CUDA_R_16F}) for (int d : dims) for (int sk : lens)
    for (int sq : lens) {
      g_in = in;
      const cudaDataType ot = in;
      const int ls = (sk + 7) / 8 * 8, batch = 3;
      // S = K^T Q (fp32), O = V P (bf16 out), dQ-like N,N with bf16 out, dV-like N,T.
      gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, sk, sq, d, a, d, (long long)sk * d, b, d, (long long)sq * d,
           c, CUDA_R_32F, ls, (long long)sq * ls, batch);
      gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, d, sq, sk, a, d, (long long)sk * d, b, ls, (long long)sq * ls,
           c, ot, d, (long long)sq * d, batch);
      gemm(h, CUBLAS_OP_N, CUBLAS_OP_T, d, sk, sq, a, d, (long long)sq * d, b, ls, (long long)sq * ls,
           c, ot, d, (long long)sk * d, batch);
    }
  }
  cudaError_t e = cudaDeviceSynchronize();
  printf("cs_cublas mode %d: %s\n", mode, cudaGetErrorString(e));
  cublasDestroy(h);
  return 0;
}
