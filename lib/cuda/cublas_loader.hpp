// cuBLAS, opened at run time. libflashattn.so does not link cuBLAS: the first CUDA context
// dlopen's libcublas.so.<CUDA major> and resolves only the functions the standard algorithm
// uses, so a machine without cuBLAS still loads the library (and gets BACKEND_UNAVAILABLE when
// it asks for a CUDA context).
#pragma once

#include <cublas_api.h>
#include <library_types.h>

namespace flashattn {
namespace cuda {

struct CublasApi {
  cublasStatus_t (*create)(cublasHandle_t* handle) = nullptr;
  cublasStatus_t (*destroy)(cublasHandle_t handle) = nullptr;
  cublasStatus_t (*set_stream)(cublasHandle_t handle, cudaStream_t stream) = nullptr;
  cublasStatus_t (*set_workspace)(cublasHandle_t handle, void* workspace, size_t bytes) = nullptr;
  cublasStatus_t (*set_math_mode)(cublasHandle_t handle, cublasMath_t mode) = nullptr;
  cublasStatus_t (*get_property)(libraryPropertyType type, int* value) = nullptr;
  const char* (*status_string)(cublasStatus_t status) = nullptr;
  const char* (*status_name)(cublasStatus_t status) = nullptr;
  cublasStatus_t (*gemm_strided_batched)(
      cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
      int k, const void* alpha, const void* A, cudaDataType Atype, int lda, long long strideA,
      const void* B, cudaDataType Btype, int ldb, long long strideB, const void* beta, void* C,
      cudaDataType Ctype, int ldc, long long strideC, int batch_count,
      cublasComputeType_t compute_type, cublasGemmAlgo_t algo) = nullptr;

  const char* path = "";  // the file that was opened, for messages
  int version_major = 0;
  int version_minor = 0;
};

// The loaded API (loaded on first call; thread-safe). Throws BACKEND_UNAVAILABLE naming the
// library and the places searched when cuBLAS cannot be opened or lacks a function.
const CublasApi& cublas();

// "CUBLAS_STATUS_NOT_SUPPORTED (the functionality requested is not supported)".
const char* cublas_status_text(cublasStatus_t status);

}  // namespace cuda
}  // namespace flashattn
