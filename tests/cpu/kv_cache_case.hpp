// A KV cache call built from a variable-length case of the CPU harness: sequence b holds its
// first len_k[b] - n_new keys in a cache (contiguous, or paged with a shuffled block table) and
// appends the last n_new; the call's tensors, the cache as the call must leave it, and the call
// itself on a CPU context or (through a Placement) on device copies. Used by the CPU tests
// (tests/cpu/kv_cache_test.cpp) and the GPU tests, which compare the two backends.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "cpu/harness.hpp"

namespace flashattn_test {
namespace kv_cache {

inline constexpr flashattn_dtype_t F32 = FLASHATTN_DTYPE_FLOAT32;
inline constexpr flashattn_dtype_t F16 = FLASHATTN_DTYPE_FLOAT16;
inline constexpr flashattn_dtype_t BF16 = FLASHATTN_DTYPE_BFLOAT16;
inline constexpr flashattn_algorithm_t kFlash = FLASHATTN_ALGORITHM_FLASH;
inline constexpr flashattn_algorithm_t kStandard = FLASHATTN_ALGORITHM_STANDARD;

// A variable-length case of `lengths_k.size()` sequences of nq queries each.
inline Case cache_case(flashattn_dtype_t dtype, int64_t nq, std::vector<int64_t> lengths_k,
                int64_t hq, int64_t hkv, int64_t d, bool causal) {
  Case c = shaped_case(dtype, 1, nq, 1, hq, hkv, d, causal,
                       static_cast<uint64_t>(nq * 131 + d * 17 + lengths_k.size() * 7 +
                                             static_cast<int>(dtype) * 1000 + (causal ? 5 : 0)));
  c.batch = static_cast<int64_t>(lengths_k.size());
  c.seqlens_q.assign(lengths_k.size(), nq);
  c.seqlens_k = lengths_k;
  c.seqlen_q = nq;
  c.seqlen_k = std::max<int64_t>(1, *std::max_element(lengths_k.begin(), lengths_k.end()));
  return c;
}

// How the case's keys sit in the cache.
struct CacheLayout {
  int64_t n_new = 0;       // the last n_new keys of each sequence are appended by the call
  int64_t page_size = 0;   // 0: a contiguous cache
  int64_t capacity = 0;    // tokens per sequence (paged: rounded up to whole pages); 0: longest
  int64_t shared_pages = 0;  // sequences 1.. read sequence 0's first pages (tokens made equal)
  int64_t rotary_dim = 0;  // 0: no rotary embedding
  bool interleaved = false;
  flashattn_dtype_t rotary_dtype = F32;
  uint64_t seed = 7;
};

// The tensors of a KV cache call, alive as long as this object, built from a case's inputs.
struct CacheCall {
  Case c;
  CacheLayout layout;
  int64_t capacity = 0, pages_per_seq = 0, num_pages = 0;
  std::vector<int32_t> seqlens;  // cache_seqlens: the tokens held before the call
  std::vector<int32_t> table;    // [B, pages_per_seq], -1 where a sequence uses no page
  HostTensor q, k, v, k_new, v_new, cos, sin;
  HostTensor k_after, v_after;   // the cache as the call must leave it (without rotary)
  flashattn_tensor_t views[11];

  int64_t len_k(int64_t b) const { return c.seqlens_k[b]; }
  // Where token t of sequence b lies in k / v: (batch or page, row).
  std::pair<int64_t, int64_t> slot(int64_t b, int64_t t) const {
    if (layout.page_size == 0) return {b, t};
    return {table[b * pages_per_seq + t / layout.page_size], t % layout.page_size};
  }
};

inline void copy_row(HostTensor& dst, int64_t i0, int64_t i1, const HostTensor& src, int64_t j0,
              int64_t j1, int64_t heads, int64_t d) {
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t x = 0; x < d; ++x) dst.set(i0, i1, h, x, src.get(j0, j1, h, x));
}

// Sequences 1.. take sequence 0's first `tokens` keys and values (the pages they share).
inline void share_prefix(const Case& c, Inputs& in, int64_t tokens) {
  int64_t k0 = c.seqlens_k[0];
  for (size_t b = 1; b < c.seqlens_k.size(); ++b) {
    REQUIRE(c.seqlens_k[b] >= tokens);
    for (int64_t t = 0; t < tokens; ++t) {
      copy_row(in.k, 0, k0 + t, in.k, 0, t, c.heads_kv, c.head_dim);
      copy_row(in.v, 0, k0 + t, in.v, 0, t, c.heads_kv, c.dv());
    }
    k0 += c.seqlens_k[b];
  }
}

// The table of a rotary embedding: angle pos * 10000^(-2r / R).
inline HostTensor rotary_table(int64_t positions, int64_t rotary_dim, flashattn_dtype_t dtype,
                        bool sine) {
  HostTensor t = HostTensor::make(dtype, 1, 1, positions, rotary_dim / 2);
  std::vector<double> values;
  for (int64_t p = 0; p < positions; ++p)
    for (int64_t r = 0; r < rotary_dim / 2; ++r) {
      const double angle = static_cast<double>(p) *
                           std::pow(10000.0, -2.0 * static_cast<double>(r) / rotary_dim);
      values.push_back(sine ? std::sin(angle) : std::cos(angle));
    }
  t.from_double(values);
  return t;
}

inline flashattn_tensor_t int_view(const std::vector<int32_t>& v, int64_t rows, int64_t cols) {
  flashattn_tensor_t t{};
  t.data = const_cast<int32_t*>(v.data());
  t.dtype = FLASHATTN_DTYPE_INT32;
  t.rank = cols == 0 ? 1 : 2;
  t.shape[0] = rows;
  t.strides[0] = cols == 0 ? 1 : cols;
  if (cols != 0) {
    t.shape[1] = cols;
    t.strides[1] = 1;
  }
  return t;
}

// Where a call's tensors live: host memory as they are (a CPU context), or copies a GPU test
// makes (place: copy in, the address to use; fetch: copy back what place gave for `host`).
struct Placement {
  virtual ~Placement() = default;
  virtual void* place(const void* host, size_t bytes) = 0;
  virtual void fetch(void* host, size_t bytes) = 0;
};

// A [1, 1, P, R/2] table seen as the call's [P, R/2] (in `where`'s memory when given).
inline flashattn_tensor_t table_view(HostTensor& t, Placement* where = nullptr) {
  flashattn_tensor_t v =
      where == nullptr ? t.view() : t.view_at(where->place(t.storage_data(), t.storage_bytes()));
  v.rank = 2;
  v.shape[0] = v.shape[2];
  v.shape[1] = v.shape[3];
  v.strides[0] = v.strides[2];
  v.strides[1] = v.strides[3];
  v.shape[2] = v.shape[3] = v.strides[2] = v.strides[3] = 0;
  return v;
}

inline CacheCall build(const Case& c, const Inputs& in, const CacheLayout& layout) {
  CacheCall call;
  call.c = c;
  call.layout = layout;
  const int64_t B = c.batch, nq = c.seqlen_q, hq = c.heads_q, hkv = c.heads_kv;
  const int64_t d = c.head_dim, dv = c.dv();
  const int64_t longest = *std::max_element(c.seqlens_k.begin(), c.seqlens_k.end());
  int64_t capacity = std::max<int64_t>({layout.capacity, longest, 1});
  if (layout.page_size > 0) {
    call.pages_per_seq = (capacity + layout.page_size - 1) / layout.page_size;
    capacity = call.pages_per_seq * layout.page_size;
    call.num_pages = B * call.pages_per_seq + 2;  // two pages no sequence uses
  }
  call.capacity = capacity;

  call.q = HostTensor::make(c.dtype, B, nq, hq, d);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < nq; ++i) copy_row(call.q, b, i, in.q, 0, b * nq + i, hq, d);

  // The block table: pages in a shuffled order, -1 past the pages a sequence uses, and the
  // first shared_pages of every sequence those of sequence 0.
  if (layout.page_size > 0) {
    std::vector<int32_t> order(static_cast<size_t>(call.num_pages));
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937_64(layout.seed));
    call.table.assign(static_cast<size_t>(B * call.pages_per_seq), -1);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t used = (call.len_k(b) + layout.page_size - 1) / layout.page_size;
      for (int64_t j = 0; j < used; ++j) {
        call.table[b * call.pages_per_seq + j] =
            j < layout.shared_pages ? order[j] : order[b * call.pages_per_seq + j];
      }
    }
  }
  const int64_t slots = layout.page_size > 0 ? call.num_pages : B;
  const int64_t rows = layout.page_size > 0 ? layout.page_size : capacity;
  call.k = HostTensor::make(c.dtype, slots, rows, hkv, d);
  call.v = HostTensor::make(c.dtype, slots, rows, hkv, dv);
  call.k.poison();
  call.v.poison();
  call.k_after = HostTensor::make(c.dtype, slots, rows, hkv, d);
  call.v_after = HostTensor::make(c.dtype, slots, rows, hkv, dv);
  call.k_after.poison();
  call.v_after.poison();
  if (layout.n_new > 0) {
    call.k_new = HostTensor::make(c.dtype, B, layout.n_new, hkv, d);
    call.v_new = HostTensor::make(c.dtype, B, layout.n_new, hkv, dv);
  }
  int64_t k0 = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t held = call.len_k(b) - layout.n_new;
    REQUIRE(held >= 0);
    call.seqlens.push_back(static_cast<int32_t>(held));
    for (int64_t t = 0; t < call.len_k(b); ++t) {
      const auto at = call.slot(b, t);
      copy_row(call.k_after, at.first, at.second, in.k, 0, k0 + t, hkv, d);
      copy_row(call.v_after, at.first, at.second, in.v, 0, k0 + t, hkv, dv);
      if (t < held) {
        copy_row(call.k, at.first, at.second, in.k, 0, k0 + t, hkv, d);
        copy_row(call.v, at.first, at.second, in.v, 0, k0 + t, hkv, dv);
      } else {
        copy_row(call.k_new, b, t - held, in.k, 0, k0 + t, hkv, d);
        copy_row(call.v_new, b, t - held, in.v, 0, k0 + t, hkv, dv);
      }
    }
    k0 += call.len_k(b);
  }
  if (layout.rotary_dim > 0) {
    call.cos = rotary_table(capacity, layout.rotary_dim, layout.rotary_dtype, false);
    call.sin = rotary_table(capacity, layout.rotary_dim, layout.rotary_dtype, true);
  }
  return call;
}

struct CacheResult {
  flashattn_status_t status;
  std::string message;
  HostTensor out, lse;
};

// The cache call into poisoned outputs (optionally with a workspace of `workspace` bytes; on
// a Placement other than the host's, its workspace is the context's own). The outputs, k and
// v are fetched back into the host tensors after the call.
inline CacheResult run_cache(flashattn_context_t ctx, CacheCall& call, const Inputs& in,
                             flashattn_algorithm_t algorithm, int64_t workspace = -1,
                             Placement* where = nullptr) {
  const Case& c = call.c;
  CacheResult r;
  r.out = HostTensor::make(c.dtype, c.batch, c.seqlen_q, c.heads_q, c.dv());
  r.lse = HostTensor::lse(c.batch, c.heads_q, c.seqlen_q);
  r.out.poison();
  r.lse.poison();
  flashattn_options_t options = options_for(c, algorithm);
  flashattn_args_t args;
  flashattn_args_init(&args);
  args.options = &options;
  flashattn_tensor_t* v = call.views;
  // A host tensor's view in the memory the call runs in.
  const auto at = [&](HostTensor& t) {
    return where == nullptr ? t.view() : t.view_at(where->place(t.storage_data(), t.storage_bytes()));
  };
  const auto ints_at = [&](std::vector<int32_t>& ints, int64_t rows, int64_t cols) {
    flashattn_tensor_t t = int_view(ints, rows, cols);
    if (where != nullptr) t.data = where->place(ints.data(), ints.size() * sizeof(int32_t));
    return t;
  };
  v[0] = at(call.q);
  v[1] = at(call.k);
  v[2] = at(call.v);
  v[3] = at(r.out);
  v[4] = at(r.lse);
  v[5] = ints_at(call.seqlens, c.batch, 0);
  args.q = &v[0];
  args.k = &v[1];
  args.v = &v[2];
  args.out = &v[3];
  args.lse = &v[4];
  args.cache_seqlens = &v[5];
  if (call.layout.page_size > 0) {
    v[6] = ints_at(call.table, c.batch, call.pages_per_seq);
    args.block_table = &v[6];
  }
  if (call.layout.n_new > 0) {
    v[7] = at(call.k_new);
    v[8] = at(call.v_new);
    args.k_new = &v[7];
    args.v_new = &v[8];
  }
  if (call.layout.rotary_dim > 0) {
    v[9] = table_view(call.cos, where);
    v[10] = table_view(call.sin, where);
    args.rotary_cos = &v[9];
    args.rotary_sin = &v[10];
    args.rotary_interleaved = call.layout.interleaved ? 1 : 0;
  }
  flashattn_tensor_t alibi, sinks;
  Inputs& variant_inputs = const_cast<Inputs&>(in);
  if (c.alibi != Slopes::None) {
    alibi = at(variant_inputs.alibi);
    args.alibi_slopes = &alibi;
  }
  if (c.sinks) {
    sinks = at(variant_inputs.sinks);
    args.sinks = &sinks;
  }
  std::vector<unsigned char> ws;
  size_t ws_size = 0;
  if (workspace >= 0) {
    ws.resize(static_cast<size_t>(workspace) + 256);
    ws_size = static_cast<size_t>(workspace);
  }
  // Aligned as the workspace must be (256 bytes).
  void* ws_ptr = workspace > 0 ? reinterpret_cast<void*>(
                                     (reinterpret_cast<uintptr_t>(ws.data()) + 255) / 256 * 256)
                               : nullptr;
  if (where != nullptr) {  // the context's own workspace, in its memory
    ws_ptr = nullptr;
    ws_size = 0;
  }
  r.status = flashattn_forward_ex(ctx, &args, ws_ptr, ws_size);
  r.message = flashattn_last_error();
  if (where != nullptr) {
    // The call is enqueued on the context's stream: done before its results are copied back.
    if (r.status == FLASHATTN_SUCCESS) r.status = flashattn_context_synchronize(ctx);
    for (HostTensor* t : {&r.out, &r.lse, &call.k, &call.v}) {
      where->fetch(t->storage_data(), t->storage_bytes());
    }
  }
  return r;
}

// out [B, Nq, Hq, dv] and lse [B, Hq, Nq] of a cache call against the packed rows of the
// variable-length forward: the number of elements whose bits differ.
inline int mismatches(const Case& c, const CacheResult& got, const ForwardResult& want) {
  int n = 0;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t i = 0; i < c.seqlen_q; ++i)
      for (int64_t h = 0; h < c.heads_q; ++h) {
        const int64_t row = b * c.seqlen_q + i;
        for (int64_t x = 0; x < c.dv(); ++x) {
          const double a = got.out.get(b, i, h, x), e = want.out.get(0, row, h, x);
          n += !(a == e || (std::isnan(a) && std::isnan(e)));
        }
        const double a = got.lse.get(b, h, i), e = want.lse.get(0, h, row);
        n += !(a == e || (std::isnan(a) && std::isnan(e)));
      }
  return n;
}

inline CacheLayout paged(int64_t page_size, int64_t n_new = 0) {
  CacheLayout l;
  l.page_size = page_size;
  l.n_new = n_new;
  l.seed = static_cast<uint64_t>(page_size * 13 + n_new);
  return l;
}

inline CacheLayout contiguous(int64_t n_new = 0, int64_t capacity = 0) {
  CacheLayout l;
  l.n_new = n_new;
  l.capacity = capacity;
  return l;
}

}  // namespace kv_cache
}  // namespace flashattn_test
