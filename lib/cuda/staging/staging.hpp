// Rows the flash kernels cannot read or write in place — rows that do not start on 16-byte
// boundaries (a head dim that is not a multiple of 8 elements, a stride that is not, a data
// pointer off 16 bytes) — go through aligned copies in the workspace: inputs copied in before
// the kernels, outputs copied back after. A head dim that is not a multiple of 8 is rounded up
// in the copies to a multiple of 16, the columns added zero (they add nothing to q.k, and give
// output columns that are not copied back), so the kernels see whole 16-byte granules
// everywhere. For the Hopper forward (its TMA kernels, not the decode kernel), a head dim that
// is a multiple of 8 but not of 16 and spans more than one 64-column TMA box (72, 104, 120, ...)
// is copied the same way: aligned rows of 104 columns ran at 0.70x of the kernel's own dim,
// copied at 0.81x (kernel log, run 122: d72 +17 %, d104 +16 %, d120 +9 %). Not below one box
// (40: the copy cost 8 %), nor for the backward (within its noise, up to 5 % slower).
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "core/problem.hpp"

namespace flashattn {
namespace cuda {

// Elements of a 16-byte granule of the 16-bit dtypes the kernels take.
constexpr int64_t kGranuleElems = 8;
// What a copied head dim is rounded up to: the wgmma's k step (16 elements), so that a head dim
// such as 100 runs on the kernel of 112 with rows of 224 bytes, not rows of 208 (104 columns,
// which the kernel of 112 reads at ~0.73x of its own dim's speed: kernel log, run 79).
constexpr int64_t kStagedDimElems = 16;
// Columns of one TMA box of the Hopper kernels: a head dim off 16 past it is copied for their
// forward (above).
constexpr int64_t kTmaBoxElems = 64;

// The copies of one call: which views (RowView bits), the head dims the kernels then see, and
// where each copy lies in the staging area (the workspace's start; offsets 256-byte aligned).
struct Staging {
  uint32_t views = 0;
  int64_t head_dim = 0;    // q, k, dq, dk as the kernels see them
  int64_t head_dim_v = 0;  // v, out, dout, dv
  size_t offset[8] = {};   // by RowView bit index
  size_t bytes = 0;        // the area, a multiple of 256
  bool any() const { return views != 0; }
  bool has(RowView v) const { return (views & v) != 0; }
};

// What p's views need (p.unaligned_rows and the head dims); tma_kernels: the kernels that run
// read rows in TMA boxes (the Hopper flash forward, not the decode kernel: their head dims off
// 16 are copied too, above). A KV cache is never copied (it is
// read and appended in place); its views must be aligned (flash_unsupported_reason says so).
Staging plan_staging(const Problem& p, bool backward, bool tma_kernels);

// p as the kernels see it once the copies are made: the copies' head dims, every row aligned.
Problem staged_problem(const Problem& p, const Staging& s);

// The inputs copied into `area` (s.bytes of device memory) and every staged view of `a`
// pointed at its copy; the outputs copied back from the copies to the caller's views.
cudaError_t stage_inputs(const Staging& s, void* area, ForwardArgs& a, cudaStream_t stream);
cudaError_t unstage_outputs(const Staging& s, const ForwardArgs& staged, const ForwardArgs& user,
                            cudaStream_t stream);
cudaError_t stage_inputs(const Staging& s, void* area, BackwardArgs& a, cudaStream_t stream);
cudaError_t unstage_outputs(const Staging& s, const BackwardArgs& staged,
                            const BackwardArgs& user, cudaStream_t stream);

}  // namespace cuda
}  // namespace flashattn
