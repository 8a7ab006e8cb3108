#include "cuda/sm90/tensor_map.hpp"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>

namespace flashattn {
namespace sm90 {

namespace {

// The driver's encoder through the runtime's entry-point query, so the library needs no
// -lcuda; looked up once.
PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();  // the failed query must not linger as the thread's last error
      return static_cast<PFN_cuTensorMapEncodeTiled_v12000>(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

constexpr int64_t kElemBytes = 2;
constexpr int kRank = 4;

}  // namespace

bool encode_tensor_map(CUtensorMap* map, const TensorMapView& v, int box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = encoder();
  if (encode == nullptr) return false;
  const int64_t extents[kRank] = {v.cols, v.rows, v.heads, v.batch};
  const int64_t strides[kRank - 1] = {v.row_stride, v.head_stride, v.batch_stride};
  cuuint64_t dims[kRank];
  cuuint64_t byte_strides[kRank - 1];
  for (int i = 0; i < kRank; ++i) {
    if (extents[i] < 1) return false;
    dims[i] = static_cast<cuuint64_t>(extents[i]);
  }
  for (int i = 0; i < kRank - 1; ++i) {
    if (strides[i] < 0) return false;
    // A dimension of extent 1 is never stepped: any valid stride will do.
    const int64_t s = extents[i + 1] == 1 ? v.row_stride : strides[i];
    byte_strides[i] = static_cast<cuuint64_t>(s * kElemBytes);
  }
  const cuuint32_t box[kRank] = {kTmaBoxCols, static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t element_strides[kRank] = {1, 1, 1, 1};
  const CUresult r =
      encode(map, v.bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
             kRank, const_cast<void*>(v.data), dims, byte_strides, box, element_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

}  // namespace sm90
}  // namespace flashattn
