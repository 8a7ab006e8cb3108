// The CPU merge of partial attention results (flashattn_merge), compiled with kernels_impl.hpp
// once per instruction set: it uses that file's storage types and sits in its namespaces. Each
// row (batch entry, query, head) is one unit of work, done by one thread: its parts' LSEs give
// the weights, its head_dim is accumulated in fp32 a chunk at a time and rounded once.

// Rows per pool item: enough work to pay for handing an item out.
constexpr int64_t kMergeRowsPerItem = 64;
// Floats of head_dim accumulated per pass over the parts: a stack array that stays in L1.
constexpr int64_t kMergeChunk = 256;
static_assert(kMergeChunk % W == 0, "the chunk holds whole vectors");

template <class E>
void merge_row(const MergeArgs& a, int64_t b, int64_t n, int64_t h) {
  using T = typename E::T;
  const float* lse = a.parts_lse.data + b * a.parts_lse.stride_batch + h * a.parts_lse.stride_head +
                     n * a.parts_lse.stride_seq;
  const T* first = in_row<E>(a.parts_out, b, n, h);
  T* dst = static_cast<T*>(a.out.data) + b * a.out.stride_batch + n * a.out.stride_seq +
           h * a.out.stride_head;
  const int64_t d = a.head_dim;
  const float m = merge_row_max(lse, a.parts, a.parts_lse_stride);
  float merged_lse;
  if (m == kNegInf || !(m < std::numeric_limits<float>::infinity())) {
    // No part sees a key (output 0, LSE -inf); or a NaN / +inf LSE (output NaN, LSE as m).
    const float fill = m == kNegInf ? 0.0f : std::numeric_limits<float>::quiet_NaN();
    for (int64_t k = 0; k < d; ++k) dst[k] = E::store(fill);
    merged_lse = m;
  } else {
    float sum = 0.0f;
    for (int64_t p = 0; p < a.parts; ++p) sum += std::exp(lse[p * a.parts_lse_stride] - m);
    const float inv_sum = 1.0f / sum;  // sum >= 1: the largest part's weight is 1
    alignas(64) float acc[kMergeChunk];
    for (int64_t c0 = 0; c0 < d; c0 += kMergeChunk) {
      const int64_t c = std::min(kMergeChunk, d - c0);
      for (int64_t k = 0; k < c; ++k) acc[k] = 0.0f;
      for (int64_t p = 0; p < a.parts; ++p) {
        const float w = std::exp(lse[p * a.parts_lse_stride] - m);
        if (w == 0.0f) continue;  // -inf, or too far below the maximum to count: adds nothing
        const T* src = first + p * a.parts_out_stride + c0;
        for (int64_t k = 0; k < c; ++k) acc[k] += w * E::load(src[k]);
      }
      for (int64_t k = 0; k < c; ++k) dst[c0 + k] = E::store(acc[k] * inv_sum);
    }
    merged_lse = m + std::log(sum);
  }
  if (a.lse.data != nullptr) {
    // Written last: in place, this row's LSE may be one the loops above read.
    a.lse.data[b * a.lse.stride_batch + h * a.lse.stride_head + n * a.lse.stride_seq] = merged_lse;
  }
}

template <class E>
void merge_typed(const MergeArgs& a, ThreadPool& pool) {
  const int64_t rows = a.batch * a.seqlen * a.heads;
  const int64_t items = (rows + kMergeRowsPerItem - 1) / kMergeRowsPerItem;
  pool.parallel_for(items, [&](int64_t item, int) {
    const int64_t end = std::min(rows, (item + 1) * kMergeRowsPerItem);
    for (int64_t r = item * kMergeRowsPerItem; r < end; ++r) {
      // Heads fastest: consecutive rows are neighbours in a [batch, seqlen, heads, dim] layout.
      const int64_t h = r % a.heads;
      const int64_t n = (r / a.heads) % a.seqlen;
      const int64_t b = r / (a.heads * a.seqlen);
      merge_row<E>(a, b, n, h);
    }
  });
}

void merge(const MergeArgs& a, ThreadPool& pool) {
  switch (a.dtype) {
    case DType::F32:
      return merge_typed<F32>(a, pool);
    case DType::F16:
      return merge_typed<F16>(a, pool);
    case DType::BF16:
      return merge_typed<BF16>(a, pool);
  }
}
