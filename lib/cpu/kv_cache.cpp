#include "cpu/kv_cache.hpp"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/error.hpp"
#include "cpu/storage.hpp"

namespace flashattn {
namespace cpu {
namespace {

constexpr size_t kWorkspaceAlign = 256;

template <class F>
void with_element(DType t, F&& f) {
  switch (t) {
    case DType::F32: f(Fp32Storage{}); return;
    case DType::F16: f(Fp16Storage{}); return;
    case DType::BF16: f(Bf16Storage{}); return;
  }
}

template <class E>
typename E::T* row_of(const Tensor4& t, int64_t b, int64_t n, int64_t h) {
  return static_cast<typename E::T*>(t.data) + b * t.stride_batch + n * t.stride_seq +
         h * t.stride_head;
}

// Token n of sequence b in the cache, head h: through the block table when paged.
template <class E>
typename E::T* cache_row(const Tensor4& t, const BlockTable& pages, int64_t b, int64_t n,
                         int64_t h) {
  if (pages.data == nullptr) return row_of<E>(t, b, n, h);
  return row_of<E>(t, pages.at(b, n / pages.page_size), n % pages.page_size, h);
}

// The rotary embedding of one row at position `pos`: features of a pair (x, y) become
// (x cos - y sin, x sin + y cos) in fp32, rounded once; the features past rotary_dim are copied.
template <class E, class R>
void rotate_row(typename E::T* dst, const typename E::T* src, const Problem& p,
                const CacheUpdate& c, int64_t pos) {
  const int64_t half = p.rotary_dim / 2;
  const typename R::T* cos = static_cast<const typename R::T*>(c.cos.data) + pos * c.cos.stride_pos;
  const typename R::T* sin = static_cast<const typename R::T*>(c.sin.data) + pos * c.sin.stride_pos;
  for (int64_t r = 0; r < half; ++r) {
    const int64_t i0 = p.rotary_interleaved ? 2 * r : r;
    const int64_t i1 = p.rotary_interleaved ? 2 * r + 1 : r + half;
    const float x = E::load(src[i0]), y = E::load(src[i1]);
    const float cs = R::load(cos[r * c.cos.stride_pair]), sn = R::load(sin[r * c.sin.stride_pair]);
    dst[i0] = E::store(x * cs - y * sn);
    dst[i1] = E::store(x * sn + y * cs);
  }
  std::copy(src + p.rotary_dim, src + p.head_dim, dst + p.rotary_dim);
}

// Calls f(E{}, R{}) with the storage types of the problem's elements and of its rotary tables
// (float32 or the elements' own).
template <class F>
void with_rotary_types(const Problem& p, F&& f) {
  with_element(p.dtype, [&](auto e) {
    using E = decltype(e);
    if (p.rotary_dtype == DType::F32) {
      f(e, Fp32Storage{});
    } else {
      f(e, E{});
    }
  });
}

// One row appended into the cache by a sequence: where it lands, for the check that no two
// rows land on one.
struct Landing {
  int64_t page, row, seq;
  bool operator<(const Landing& o) const {
    return page != o.page ? page < o.page : (row != o.row ? row < o.row : seq < o.seq);
  }
};

}  // namespace

void check_cache(const ForwardArgs& a) {
  const Problem& p = a.problem;
  const VariantViews& v = a.variants;
  const bool paged = p.kv_cache == KvCache::Paged;
  std::vector<Landing> landings;
  for (int64_t b = 0; b < p.batch; ++b) {
    const int64_t held = v.cache_seqlens.at(b);
    if (held < 0) {
      fail(FLASHATTN_ERROR_INVALID_SHAPE, "cache_seqlens[%lld] is %lld, must be >= 0",
           static_cast<long long>(b), static_cast<long long>(held));
    }
    const int64_t len_k = held + p.seqlen_new;
    if (len_k > p.seqlen_k) {
      fail(FLASHATTN_ERROR_INVALID_SHAPE,
           "sequence %lld: cache_seqlens[%lld] = %lld and %lld new rows make %lld tokens, past "
           "the cache's %lld", static_cast<long long>(b), static_cast<long long>(b),
           static_cast<long long>(held), static_cast<long long>(p.seqlen_new),
           static_cast<long long>(len_k), static_cast<long long>(p.seqlen_k));
    }
    if (paged) {
      const int64_t used = (len_k + p.page_size - 1) / p.page_size;
      for (int64_t j = 0; j < used; ++j) {
        const int64_t page = v.block_table.at(b, j);
        if (page < 0 || page >= p.num_pages) {
          fail(FLASHATTN_ERROR_INVALID_SHAPE,
               "block_table[%lld, %lld] is %lld, outside k's %lld pages (sequence %lld uses its "
               "first %lld entries)", static_cast<long long>(b), static_cast<long long>(j),
               static_cast<long long>(page), static_cast<long long>(p.num_pages),
               static_cast<long long>(b), static_cast<long long>(used));
        }
      }
      for (int64_t t = held; t < len_k; ++t) {
        landings.push_back({v.block_table.at(b, t / p.page_size), t % p.page_size, b});
      }
    }
    if (p.rotary_dim > 0) {
      if (len_k < p.seqlen_q) {
        fail(FLASHATTN_ERROR_INVALID_SHAPE,
             "sequence %lld: %lld keys for %lld queries; with a rotary embedding each query "
             "needs a position (len_k - N_q + i >= 0)", static_cast<long long>(b),
             static_cast<long long>(len_k), static_cast<long long>(p.seqlen_q));
      }
      if (len_k > p.rotary_positions) {
        fail(FLASHATTN_ERROR_INVALID_SHAPE,
             "sequence %lld: position %lld is past rotary_cos's %lld rows",
             static_cast<long long>(b), static_cast<long long>(len_k - 1),
             static_cast<long long>(p.rotary_positions));
      }
    }
  }
  std::sort(landings.begin(), landings.end());
  for (size_t i = 1; i < landings.size(); ++i) {
    const Landing &x = landings[i - 1], &y = landings[i];
    if (x.page != y.page || x.row != y.row) continue;
    if (x.seq == y.seq) {
      fail(FLASHATTN_ERROR_INVALID_SHAPE,
           "sequence %lld appends into row %lld of page %lld twice (its block table names the "
           "page twice)", static_cast<long long>(x.seq), static_cast<long long>(x.row),
           static_cast<long long>(x.page));
    }
    fail(FLASHATTN_ERROR_INVALID_SHAPE,
         "sequences %lld and %lld both append into row %lld of page %lld",
         static_cast<long long>(x.seq), static_cast<long long>(y.seq),
         static_cast<long long>(x.row), static_cast<long long>(x.page));
  }
}

size_t rotated_queries_bytes(const Problem& p) {
  if (p.rotary_dim == 0) return 0;
  const size_t bytes = static_cast<size_t>(p.batch * p.seqlen_q * p.heads_q * p.head_dim) *
                       dtype_size(p.dtype);
  return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
}

void append_to_cache(const ForwardArgs& a, ThreadPool& pool) {
  const Problem& p = a.problem;
  if (p.seqlen_new == 0) return;
  const VariantViews& v = a.variants;
  const CacheUpdate& c = a.cache;
  with_rotary_types(p, [&](auto e, auto r) {
    using E = decltype(e);
    using R = decltype(r);
    pool.parallel_for(p.batch * p.seqlen_new, [&](int64_t item, int) {
      const int64_t b = item / p.seqlen_new, i = item % p.seqlen_new;
      const int64_t pos = v.cache_seqlens.at(b) + i;
      for (int64_t h = 0; h < p.heads_kv; ++h) {
        typename E::T* k_dst = cache_row<E>(a.k, v.block_table, b, pos, h);
        const typename E::T* k_src = row_of<E>(c.k_new, b, i, h);
        if (p.rotary_dim > 0) {
          rotate_row<E, R>(k_dst, k_src, p, c, pos);
        } else {
          std::copy(k_src, k_src + p.head_dim, k_dst);
        }
        const typename E::T* v_src = row_of<E>(c.v_new, b, i, h);
        std::copy(v_src, v_src + p.head_dim_v, cache_row<E>(a.v, v.block_table, b, pos, h));
      }
    });
  });
}

Tensor4 rotate_queries(const ForwardArgs& a, void* dst, ThreadPool& pool) {
  const Problem& p = a.problem;
  Tensor4 out;
  out.data = dst;
  out.stride_head = p.head_dim;
  out.stride_seq = p.heads_q * p.head_dim;
  out.stride_batch = p.seqlen_q * out.stride_seq;
  with_rotary_types(p, [&](auto e, auto r) {
    using E = decltype(e);
    using R = decltype(r);
    pool.parallel_for(p.batch * p.seqlen_q, [&](int64_t item, int) {
      const int64_t b = item / p.seqlen_q, i = item % p.seqlen_q;
      const int64_t len_k = a.variants.cache_seqlens.at(b) + p.seqlen_new;
      const int64_t pos = len_k - p.seqlen_q + i;  // the query's diagonal
      for (int64_t h = 0; h < p.heads_q; ++h) {
        rotate_row<E, R>(row_of<E>(out, b, i, h), row_of<E>(a.q, b, i, h), p, a.cache, pos);
      }
    });
  });
  return out;
}

}  // namespace cpu
}  // namespace flashattn
