// The CUDA merge of partial attention results (flashattn_merge): a plain launcher that enqueues
// on `stream` and returns the launch's cudaError_t. It knows nothing of contexts or flashattn
// errors; every pointer of the arguments is device memory.
#pragma once

#include <cuda_runtime.h>

#include "core/problem.hpp"

namespace flashattn {
namespace cuda {

// float16 and bfloat16 only (cudaErrorNotSupported for float32, which the backend refuses
// first). Any number of parts and rows: the grid walks the rows, so no grid limit applies.
cudaError_t merge_partials(const MergeArgs& args, cudaStream_t stream);

}  // namespace cuda
}  // namespace flashattn
