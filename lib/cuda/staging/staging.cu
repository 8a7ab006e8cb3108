#include "cuda/staging/staging.hpp"

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <utility>

namespace flashattn {
namespace cuda {

namespace {

constexpr size_t kAlign = 256;
constexpr int kCopyThreads = 256;
constexpr int kCopyWarps = kCopyThreads / 32;
constexpr int64_t kMaxCopyBlocks = 8192;  // a grid-stride loop covers the rest

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
int64_t round_staged_dim(int64_t d) { return (d + kStagedDimElems - 1) / kStagedDimElems * kStagedDimElems; }

constexpr RowView kAllViews[] = {kRowsQ,    kRowsK,  kRowsV,  kRowsOut,
                                 kRowsDout, kRowsDq, kRowsDk, kRowsDv};

int bit_index(RowView v) { return __builtin_ctz(static_cast<unsigned>(v)); }

// Views with q's rows and heads (the others have k's), and views with v's head dim.
bool query_rows(RowView v) { return v == kRowsQ || v == kRowsOut || v == kRowsDout || v == kRowsDq; }
bool value_dim(RowView v) { return v == kRowsV || v == kRowsOut || v == kRowsDout || v == kRowsDv; }

// [entries, rows, heads] of a view: a packed variable-length batch is one entry of all rows.
struct RowsOf {
  int64_t entries, rows, heads;
  int64_t count() const { return entries * rows * heads; }
};
RowsOf rows_of(const Problem& p, RowView v) {
  const int64_t entries = p.varlen ? 1 : p.batch;
  if (query_rows(v)) return {entries, p.varlen ? p.total_q : p.seqlen_q, p.heads_q};
  return {entries, p.varlen ? p.total_k : p.seqlen_k, p.heads_kv};
}

// Rows [entries, rows, heads] x cols of 16-bit elements from one strided view to another;
// columns [cols, dst_cols) of the destination are zero.
struct RowCopy {
  const uint16_t* src;
  uint16_t* dst;
  int64_t src_batch, src_row, src_head;
  int64_t dst_batch, dst_row, dst_head;
  int64_t rows, heads, count;
  int cols, dst_cols;
};

// An access of W 16-bit elements.
template <int W> struct Access;
template <> struct Access<8> { using type = uint4; };
template <> struct Access<4> { using type = uint2; };
template <> struct Access<2> { using type = uint32_t; };
template <> struct Access<1> { using type = uint16_t; };

// Rows a warp copies at once: their loads are all in flight before the first store, so that a
// warp keeps several rows' latency overlapped.
constexpr int kRowsInFlight = 8;

// One warp per kRowsInFlight rows, heads fastest (consecutive warps touch adjacent rows of a
// contiguous view), W elements a lane and access.
template <int W>
__global__ void __launch_bounds__(kCopyThreads) copy_rows_kernel(const RowCopy c) {
  using V = typename Access<W>::type;
  const int lane = threadIdx.x % 32;
  const int chunks = c.dst_cols / W, src_chunks = c.cols / W;
  const int64_t step = int64_t(gridDim.x) * kCopyWarps * kRowsInFlight;
  for (int64_t r0 = (int64_t(blockIdx.x) * kCopyWarps + threadIdx.x / 32) * kRowsInFlight;
       r0 < c.count; r0 += step) {
    const V* src[kRowsInFlight];
    V* dst[kRowsInFlight];
    // (b, n, h) of the first row by division, of the next ones by stepping the head.
    int64_t h = r0 % c.heads, n = (r0 / c.heads) % c.rows, b = r0 / (c.heads * c.rows);
#pragma unroll
    for (int i = 0; i < kRowsInFlight; ++i) {
      // Rows past the end read the first row again and store nothing.
      const bool past = r0 + i >= c.count;
      const int64_t bb = past ? 0 : b, nn = past ? 0 : n, hh = past ? 0 : h;
      src[i] = reinterpret_cast<const V*>(c.src + bb * c.src_batch + nn * c.src_row + hh * c.src_head);
      dst[i] = reinterpret_cast<V*>(c.dst + bb * c.dst_batch + nn * c.dst_row + hh * c.dst_head);
      if (++h == c.heads) {
        h = 0;
        if (++n == c.rows) {
          n = 0;
          ++b;
        }
      }
    }
    for (int ch = lane; ch < chunks; ch += 32) {
      V v[kRowsInFlight];
#pragma unroll
      for (int i = 0; i < kRowsInFlight; ++i) v[i] = ch < src_chunks ? src[i][ch] : V{};
#pragma unroll
      for (int i = 0; i < kRowsInFlight; ++i) {
        if (r0 + i < c.count) dst[i][ch] = v[i];
      }
    }
  }
}

// The widest access (elements) every row start and both column counts allow.
int access_width(const Tensor4& src, const Tensor4& dst, int64_t cols, int64_t dst_cols) {
  uint64_t bits = reinterpret_cast<uintptr_t>(src.data) | reinterpret_cast<uintptr_t>(dst.data);
  for (int64_t s : {src.stride_batch, src.stride_seq, src.stride_head, dst.stride_batch,
                    dst.stride_seq, dst.stride_head, cols, dst_cols}) {
    bits |= static_cast<uint64_t>(s) * 2;  // bytes
  }
  for (int w : {8, 4, 2}) {
    if (bits % (2 * w) == 0) return w;
  }
  return 1;
}

template <int W>
void launch_copy(const RowCopy& c, cudaStream_t stream) {
  const int64_t warps = (c.count + kRowsInFlight - 1) / kRowsInFlight;
  const int64_t blocks = std::min<int64_t>((warps + kCopyWarps - 1) / kCopyWarps, kMaxCopyBlocks);
  copy_rows_kernel<W><<<static_cast<unsigned>(blocks), kCopyThreads, 0, stream>>>(c);
}

cudaError_t copy_rows(const Tensor4& src, const Tensor4& dst, const RowsOf& g, int64_t cols,
                      int64_t dst_cols, cudaStream_t stream) {
  if (g.count() == 0) return cudaSuccess;
  RowCopy c;
  c.src = static_cast<const uint16_t*>(src.data);
  c.dst = static_cast<uint16_t*>(dst.data);
  c.src_batch = src.stride_batch;
  c.src_row = src.stride_seq;
  c.src_head = src.stride_head;
  c.dst_batch = dst.stride_batch;
  c.dst_row = dst.stride_seq;
  c.dst_head = dst.stride_head;
  c.rows = g.rows;
  c.heads = g.heads;
  c.count = g.count();
  c.cols = static_cast<int>(cols);
  c.dst_cols = static_cast<int>(dst_cols);
  switch (access_width(src, dst, cols, dst_cols)) {
    case 8: launch_copy<8>(c, stream); break;
    case 4: launch_copy<4>(c, stream); break;
    case 2: launch_copy<2>(c, stream); break;
    default: launch_copy<1>(c, stream); break;
  }
  return cudaGetLastError();
}

// The copy of view v in the area: [entries, rows, heads, dim] with tight rows (a packed batch's
// batch stride 0, as the caller's).
Tensor4 copy_view(const Staging& s, void* area, const Problem& p, RowView v) {
  const RowsOf g = rows_of(p, v);
  const int64_t dim = value_dim(v) ? s.head_dim_v : s.head_dim;
  Tensor4 t;
  t.data = static_cast<char*>(area) + s.offset[bit_index(v)];
  t.stride_head = dim;
  t.stride_seq = g.heads * dim;
  t.stride_batch = p.varlen ? 0 : g.rows * g.heads * dim;
  return t;
}

// An input: copied with its columns padded by zeros to the kernels' head dim.
cudaError_t stage_in(const Staging& s, void* area, const Problem& p, RowView v, Tensor4& view,
                     cudaStream_t stream) {
  if (!s.has(v)) return cudaSuccess;
  const Tensor4 copy = copy_view(s, area, p, v);
  const int64_t cols = value_dim(v) ? p.head_dim_v : p.head_dim;
  const int64_t padded = value_dim(v) ? s.head_dim_v : s.head_dim;
  const cudaError_t e = copy_rows(view, copy, rows_of(p, v), cols, padded, stream);
  view = copy;
  return e;
}

// An output: the kernels write the copy (nothing to copy in).
void stage_out(const Staging& s, void* area, const Problem& p, RowView v, Tensor4& view) {
  if (s.has(v)) view = copy_view(s, area, p, v);
}

// An output's copy back into the caller's view, its own columns only.
cudaError_t unstage(const Staging& s, const Problem& p, RowView v, const Tensor4& copy,
                    const Tensor4& user, cudaStream_t stream) {
  if (!s.has(v)) return cudaSuccess;
  const int64_t cols = value_dim(v) ? p.head_dim_v : p.head_dim;
  return copy_rows(copy, user, rows_of(p, v), cols, cols, stream);
}

}  // namespace

Staging plan_staging(const Problem& p, bool backward, bool tma_kernels) {
  Staging s;
  s.head_dim = p.head_dim;
  s.head_dim_v = p.head_dim_v;
  if (p.kv_cache != KvCache::None) return s;
  const uint32_t qk_side = kRowsQ | kRowsK | (backward ? kRowsDq | kRowsDk : 0u);
  const uint32_t v_side = kRowsV | kRowsOut | (backward ? kRowsDout | kRowsDv : 0u);
  s.views = p.unaligned_rows & (qk_side | v_side);
  // A head dim off the granule leaves every row of its views off 16 bytes, or ending inside a
  // granule: all of them are copied, so that the kernels see the rounded head dim throughout.
  // For the Hopper forward, likewise a head dim off 16 past one TMA box (staging.hpp).
  const bool hopper_forward = tma_kernels && !backward;
  const auto copied = [&](int64_t dim) {
    return dim % kGranuleElems != 0 ||
           (hopper_forward && dim > kTmaBoxElems && dim % kStagedDimElems != 0);
  };
  if (copied(p.head_dim)) {
    s.views |= qk_side;
    s.head_dim = round_staged_dim(p.head_dim);
  }
  if (copied(p.head_dim_v)) {
    s.views |= v_side;
    s.head_dim_v = round_staged_dim(p.head_dim_v);
  }
  for (RowView v : kAllViews) {
    if (!s.has(v)) continue;
    const RowsOf g = rows_of(p, v);
    const int64_t dim = value_dim(v) ? s.head_dim_v : s.head_dim;
    s.offset[bit_index(v)] = s.bytes;
    // Saturating: a size past size_t makes the workspace query answer OUT_OF_MEMORY.
    size_t bytes = dtype_size(p.dtype);
    for (int64_t f : {g.entries, g.rows, g.heads, dim}) {
      if (__builtin_mul_overflow(bytes, static_cast<size_t>(f), &bytes)) bytes = SIZE_MAX;
    }
    if (bytes > SIZE_MAX - kAlign || __builtin_add_overflow(s.bytes, align_up(bytes), &s.bytes)) {
      s.bytes = SIZE_MAX;
      return s;
    }
  }
  return s;
}

Problem staged_problem(const Problem& p, const Staging& s) {
  Problem k = p;
  k.head_dim = s.head_dim;
  k.head_dim_v = s.head_dim_v;
  k.unaligned_rows &= ~s.views;
  return k;
}

cudaError_t stage_inputs(const Staging& s, void* area, ForwardArgs& a, cudaStream_t stream) {
  const Problem p = a.problem;
  for (auto [v, view] : {std::pair<RowView, Tensor4*>{kRowsQ, &a.q}, {kRowsK, &a.k}, {kRowsV, &a.v}}) {
    const cudaError_t e = stage_in(s, area, p, v, *view, stream);
    if (e != cudaSuccess) return e;
  }
  stage_out(s, area, p, kRowsOut, a.out);
  a.problem = staged_problem(p, s);
  return cudaSuccess;
}

cudaError_t unstage_outputs(const Staging& s, const ForwardArgs& staged, const ForwardArgs& user,
                            cudaStream_t stream) {
  return unstage(s, user.problem, kRowsOut, staged.out, user.out, stream);
}

cudaError_t stage_inputs(const Staging& s, void* area, BackwardArgs& a, cudaStream_t stream) {
  const Problem p = a.problem;
  for (auto [v, view] : {std::pair<RowView, Tensor4*>{kRowsQ, &a.q},
                         {kRowsK, &a.k},
                         {kRowsV, &a.v},
                         {kRowsOut, &a.out},
                         {kRowsDout, &a.dout}}) {
    const cudaError_t e = stage_in(s, area, p, v, *view, stream);
    if (e != cudaSuccess) return e;
  }
  stage_out(s, area, p, kRowsDq, a.dq);
  stage_out(s, area, p, kRowsDk, a.dk);
  stage_out(s, area, p, kRowsDv, a.dv);
  a.problem = staged_problem(p, s);
  return cudaSuccess;
}

cudaError_t unstage_outputs(const Staging& s, const BackwardArgs& staged,
                            const BackwardArgs& user, cudaStream_t stream) {
  for (auto [v, copy, view] : {std::tuple<RowView, const Tensor4*, const Tensor4*>{
                                   kRowsDq, &staged.dq, &user.dq},
                               {kRowsDk, &staged.dk, &user.dk},
                               {kRowsDv, &staged.dv, &user.dv}}) {
    const cudaError_t e = unstage(s, user.problem, v, *copy, *view, stream);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace flashattn
