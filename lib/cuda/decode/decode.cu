// The decode path's plan and its instances (one per head dim and dtype this build has).
#include "cuda/decode/decode.hpp"

#include <algorithm>
#include <cmath>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/decode/decode_kernel.cuh"

namespace flashattn {
namespace cuda {
namespace {

// The padded head dims the build has (decode_dims.inc, written from the kernel table by
// lib/cuda/generate.py), smallest first.
constexpr int kHeadDims[] = {
#define FLASHATTN_DECODE_DIM(D) D,
#include "cuda/decode/decode_dims.inc"
#undef FLASHATTN_DECODE_DIM
    0};

int padded_dim(int64_t head_dim) {
  for (int d : kHeadDims) {
    if (d != 0 && d >= head_dim) return d;
  }
  return 0;
}

int smem_bytes(int head_dim) {
  switch (head_dim) {
#define FLASHATTN_DECODE_DIM(D) \
  case D:                       \
    return decode::DecodeConfig<D>::kSmemBytes;
#include "cuda/decode/decode_dims.inc"
#undef FLASHATTN_DECODE_DIM
    default: return 0;
  }
}

bool have_dtype(DType dtype) {
#ifdef FLASHATTN_DTYPE_FP16
  if (dtype == DType::F16) return true;
#endif
#ifdef FLASHATTN_DTYPE_BF16
  if (dtype == DType::BF16) return true;
#endif
  return false;
}

// Shared memory an SM gives its CTAs (the H100/H200's 228 KB; 1 KB of it reserved per CTA).
constexpr size_t kSmemPerSm = 228 * 1024;
constexpr size_t kSmemReservedPerCta = 1024;
// A split reads at least this many key blocks: fewer make the merge cost more than it saves.
constexpr int kMinBlocksPerSplit = 4;
// Programmatic dependent launch (the merge's launch under the decode grid) from sm_90 on.
constexpr int kOverlapLaunchMajor = 9;
// The fewest splits whose last wave is at least this full, relative to the best split count's.
constexpr double kWaveEfficiency = 0.95;

// How full the grid's waves are: ctas over resident slots, divided by the waves rounded up.
double wave_efficiency(int64_t ctas, int64_t slots) {
  const double waves = static_cast<double>(ctas) / static_cast<double>(slots);
  return waves / std::ceil(waves);
}

}  // namespace

DecodePlan plan_decode(const Problem& p, const DeviceInfo& dev) {
  DecodePlan plan;
  const int64_t group = p.group_size();
  // Every key visible to all rows or hidden from all (decode_kernel.cuh): one query token, or
  // no key hidden below a sequence's end (no left bound, a right bound of at least
  // seqlen_q - 1, where diag + right reaches the last key from the first token).
  const bool left_bound = p.window_left >= 0 && p.window_left < p.seqlen_q + p.seqlen_k;
  const bool one_range = p.seqlen_q == 1 || (!left_bound && (p.window_right < 0 ||
                                                             p.window_right >= p.seqlen_q - 1));
  if (p.dtype == DType::F32 || !have_dtype(p.dtype) ||
      p.seqlen_q * group > decode::kRows || p.seqlen_q < 1 || !one_range) {
    return plan;
  }
  plan.head_dim = padded_dim(std::max(p.head_dim, p.head_dim_v));  // the larger decides
  const int smem = smem_bytes(plan.head_dim);
  if (smem == 0 || static_cast<size_t>(smem) > dev.smem_per_block_optin) return plan;
  plan.applies = true;
  // Splits: enough CTAs for every SM's share of resident CTAs, no split under
  // kMinBlocksPerSplit key blocks.
  const int64_t ctas = p.batch * p.heads_kv;
  const int64_t per_sm =
      std::max<int64_t>(1, static_cast<int64_t>(kSmemPerSm / (smem + kSmemReservedPerCta)));
  const int64_t target = std::max<int64_t>(1, dev.sm_count) * per_sm;
  // The fewest splits within kWaveEfficiency of the best wave fill, among split counts that
  // change the blocks per split (others only add empty CTAs).
  int64_t blocks = (p.seqlen_k + decode::kBlockN - 1) / decode::kBlockN;
  if (left_bound) {  // at most window_left + 1 keys, over one more block than they fill
    blocks = std::min<int64_t>(blocks, (p.window_left + 1 + decode::kBlockN - 1) / decode::kBlockN + 1);
  }
  const int64_t most = std::max<int64_t>(
      1, std::min<int64_t>(blocks / kMinBlocksPerSplit, decode::kMaxSplits));
  auto per_split_of = [blocks](int64_t s) { return std::max<int64_t>(1, (blocks + s - 1) / s); };
  double best = 0.0;
  for (int64_t s = 1; s <= most; ++s) {
    if (s > 1 && per_split_of(s) == per_split_of(s - 1)) continue;
    best = std::max(best, wave_efficiency(ctas * s, target));
  }
  int64_t splits = 1;
  for (int64_t s = 1; s <= most; ++s) {
    if (s > 1 && per_split_of(s) == per_split_of(s - 1)) continue;
    if (wave_efficiency(ctas * s, target) >= kWaveEfficiency * best) {
      splits = s;
      break;
    }
  }
  if (p.num_splits > 0) {  // the caller's count, within the blocks and the merge's limit
    splits = std::min<int64_t>({p.num_splits, std::max<int64_t>(blocks, 1), decode::kMaxSplits});
  }
  const int64_t per_split = per_split_of(splits);
  splits = (blocks + per_split - 1) / per_split;
  splits = std::max<int64_t>(1, splits);
  plan.split.splits = static_cast<int>(splits);
  plan.split.blocks_per_split = static_cast<int>(per_split);
  plan.split.overlap_launch = dev.sm_major >= kOverlapLaunchMajor;
  if (splits > 1) {
    const size_t rows = static_cast<size_t>(splits * p.batch * p.heads_q * p.seqlen_q);
    plan.workspace_bytes = rows * static_cast<size_t>(plan.head_dim) * 4 + rows * 4;
  }
  return plan;
}

cudaError_t launch_decode(const FwdParams& p, DType dtype, const DecodePlan& plan,
                          void* workspace, cudaStream_t stream) {
#define FLASHATTN_DECODE_CASE(T, D) \
  if (plan.head_dim == D) return decode::launch_decode<T, D>(p, plan.split, workspace, stream);
#ifdef FLASHATTN_DTYPE_FP16
  if (dtype == DType::F16) {
#define FLASHATTN_DECODE_DIM(D) FLASHATTN_DECODE_CASE(__half, D)
#include "cuda/decode/decode_dims.inc"
#undef FLASHATTN_DECODE_DIM
  }
#endif
#ifdef FLASHATTN_DTYPE_BF16
  if (dtype == DType::BF16) {
#define FLASHATTN_DECODE_DIM(D) FLASHATTN_DECODE_CASE(__nv_bfloat16, D)
#include "cuda/decode/decode_dims.inc"
#undef FLASHATTN_DECODE_DIM
  }
#endif
#undef FLASHATTN_DECODE_CASE
  return cudaErrorNotSupported;
}

}  // namespace cuda
}  // namespace flashattn
