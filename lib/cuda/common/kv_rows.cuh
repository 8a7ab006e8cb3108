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

  // Paged: the page (block table entry) of row n, which must lie inside the sequence.
  __device__ __forceinline__ int page_of(int n) const {
    return table[(n / page_size) * table_stride];
  }
  // Paged: row `in_page` of page `page`.
  __device__ __forceinline__ const T* row_at(int page, int in_page) const {
    return data + int64_t(page) * batch_stride + int64_t(in_page) * row_stride;
  }
  // Row n (of the sequence).
  __device__ __forceinline__ const T* row(int n) const {
    if (table == nullptr) return data + int64_t(offset + n) * row_stride;
    return row_at(page_of(n), n % page_size);
  }
  // Whether every tile of block_rows rows starting at a multiple of block_rows lies one row
  // stride apart from its first row: always, unless paged with pages that do not hold whole
  // tiles.
  __device__ __forceinline__ bool holds_tiles(int block_rows) const {
    return table == nullptr || page_size % block_rows == 0;
  }
  // Paged: the pages and in-page rows of rows n, n + kStep, ..., (kCount of them) with two
  // divisions rather than two per row: what one thread's copies of a tile read (a division by
  // a value known only at run time costs about twenty instructions). Rows from `end` on are
  // past the sequence: their page is not read (0).
  template <int kCount, int kStep>
  __device__ __forceinline__ void pages_of_rows(int n, int end, int* page, int* in_page) const {
    int pg = n / page_size;
    int off = n - pg * page_size;
    const int step_pages = kStep / page_size, step_off = kStep - step_pages * page_size;
#pragma unroll
    for (int i = 0; i < kCount; ++i) {
      page[i] = n + i * kStep < end ? table[pg * table_stride] : 0;
      in_page[i] = off;
      off += step_off;
      pg += step_pages;
      if (off >= page_size) {
        off -= page_size;
        ++pg;
      }
    }
  }
};

}  // namespace common
}  // namespace flashattn
