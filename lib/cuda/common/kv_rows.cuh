// Where key row n of one (batch entry, KV head) lies in k or v: one stride apart in a
// contiguous cache (or an ordinary k / v), or through the block table of a paged cache (row
// n % page_size of page block_table[b, n / page_size]; the batch stride steps from page to
// page). The one place that knows pages: the decode loader and the append kernel take rows
// through it.
#pragma once

#include <cstdint>

#include "cuda/flash/params.hpp"

namespace flashattn {
namespace common {

template <class T>
struct KvRows {
  const T* data;  // the tensor's first element, the head's offset included
  int64_t batch_stride, row_stride;
  const int* table;  // this batch entry's block table row; null: not paged
  int64_t table_stride;
  int page_size;
  int offset;  // a packed batch's first row of this sequence (0 in a cache)

  __device__ __forceinline__ KvRows(const cuda::CacheParams& p, const void* tensor,
                                    int64_t batch_stride_, int64_t row_stride_,
                                    int64_t head_stride, int batch, int head, int offset_)
      : data(static_cast<const T*>(tensor) + head * head_stride),
        batch_stride(batch_stride_),
        row_stride(row_stride_),
        table(p.block_table == nullptr ? nullptr
                                       : p.block_table + batch * p.block_table_batch_stride),
        table_stride(p.block_table_page_stride),
        page_size(p.page_size),
        offset(offset_) {
    if (table == nullptr) data += batch * batch_stride;
  }

  __device__ __forceinline__ bool paged() const { return table != nullptr; }

  // Row n (of the sequence).
  __device__ __forceinline__ const T* row(int n) const {
    if (table == nullptr) return data + int64_t(offset + n) * row_stride;
    return row_in(page_of(n), n);
  }
  // Paged: the page (block table entry) of row n, which must lie inside the sequence. Looked up
  // ahead of the copies that need it (row_in), its read need not hold them up.
  __device__ __forceinline__ int page_of(int n) const {
    return table[(n / page_size) * table_stride];
  }
  // Paged: row n of page `page` (= page_of(n)).
  __device__ __forceinline__ const T* row_in(int page, int n) const {
    return data + int64_t(page) * batch_stride + int64_t(n % page_size) * row_stride;
  }
  // Whether rows [n0, n0 + rows) lie one row stride apart from row(n0): always, unless paged
  // with a page boundary inside them.
  __device__ __forceinline__ bool strided(int n0, int rows) const {
    return table == nullptr || n0 / page_size == (n0 + rows - 1) / page_size;
  }
};

}  // namespace common
}  // namespace flashattn
