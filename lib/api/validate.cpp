#include "api/validate.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "api/registry.hpp"
#include "core/error.hpp"

namespace flashattn {

namespace {

constexpr int64_t kMaxDim = (int64_t(1) << 31) - 1;  // kernels index sizes with 32-bit ints
constexpr int64_t kMaxHeadDim = 256;
constexpr size_t kMaxStructSize = 4096;  // the largest size a caller's struct may claim

// What a view of one role looks like: its rank, the names of its dimensions, and whether its
// last stride must be 1 (the head_dim of q, k, v and the outputs).
struct ViewKind {
  int rank;
  const char* dims[FLASHATTN_MAX_RANK];
  const char* layout;
  bool unit_last;
};

const ViewKind kHeads4 = {4, {"batch", "seqlen", "heads", "head_dim"},
                          "[batch, seqlen, heads, head_dim]", true};
const ViewKind kHeads3 = {3, {"total_tokens", "heads", "head_dim"},
                          "[total_tokens, heads, head_dim] of a variable-length batch", true};
const ViewKind kLse3 = {3, {"batch", "heads", "seqlen"}, "[batch, heads, seqlen]", false};
const ViewKind kLse2 = {2, {"heads", "total_tokens"},
                        "[heads, total_tokens] of a variable-length batch", false};
const ViewKind kPerHead = {1, {"heads"}, "[heads_q]", false};
const ViewKind kPerBatchHead = {2, {"batch", "heads"}, "[batch, heads_q]", false};
const ViewKind kOffsets = {1, {"batch + 1"}, "[batch + 1]", false};
const ViewKind kPages = {4, {"num_pages", "page_size", "heads", "head_dim"},
                         "[num_pages, page_size, heads, head_dim] of a paged KV cache", true};
const ViewKind kCacheLengths = {1, {"batch"}, "[batch]", false};
const ViewKind kBlockTable = {2, {"batch", "pages per sequence"},
                              "[batch, pages per sequence]", false};
const ViewKind kRotaryTable = {2, {"positions", "rotary_dim / 2"},
                               "[positions, rotary_dim / 2]", false};

std::string shape_string(const flashattn_tensor_t* t) {
  std::string s = "[";
  for (int i = 0; i < t->rank; ++i) {
    if (i) s += ", ";
    s += std::to_string(t->shape[i]);
  }
  return s + "]";
}

std::string shape_string(std::initializer_list<int64_t> dims) {
  std::string s = "[";
  for (int64_t d : dims) {
    if (s.size() > 1) s += ", ";
    s += std::to_string(d);
  }
  return s + "]";
}

const char* dtype_string(flashattn_dtype_t t) {
  switch (t) {
    case FLASHATTN_DTYPE_FLOAT32: return "float32";
    case FLASHATTN_DTYPE_FLOAT16: return "float16";
    case FLASHATTN_DTYPE_BFLOAT16: return "bfloat16";
    case FLASHATTN_DTYPE_INT32: return "int32";
  }
  return "unknown";
}

size_t dtype_bytes(flashattn_dtype_t t) {
  return t == FLASHATTN_DTYPE_FLOAT16 || t == FLASHATTN_DTYPE_BFLOAT16 ? 2 : 4;
}

struct Dim {
  int64_t shape;
  int64_t stride;
};

// Dimensions of extent > 1, the ones that decide which elements a view touches.
int live_dims(const flashattn_tensor_t* t, Dim* dims) {
  int n = 0;
  for (int i = 0; i < t->rank; ++i) {
    if (t->shape[i] > 1) dims[n++] = Dim{t->shape[i], t->strides[i]};
  }
  return n;
}

// True when every stride exceeds the largest offset reachable through the smaller ones: each
// element then has exactly one index, and offsets decompose greedily.
bool nested_layout(Dim* dims, int n) {
  for (int i = 1; i < n; ++i) {  // insertion sort by stride: n <= 4
    for (int j = i; j > 0 && dims[j].stride < dims[j - 1].stride; --j) std::swap(dims[j], dims[j - 1]);
  }
  int64_t max_inner = 0;
  for (int i = 0; i < n; ++i) {
    if (dims[i].stride <= max_inner) return false;
    max_inner += (dims[i].shape - 1) * dims[i].stride;  // no overflow: the extent was checked
  }
  return true;
}

void check_rank(const char* name, const flashattn_tensor_t* t, const ViewKind& kind) {
  if (t->rank != kind.rank) {
    fail(FLASHATTN_ERROR_INVALID_SHAPE, "%s: rank is %d, expected %d (%s)", name, t->rank,
         kind.rank, kind.layout);
  }
}

// The element-level checks of one view: dtype, rank, sizes, strides, extent.
CheckedView check_view(const char* name, const flashattn_tensor_t* t, const ViewKind& kind,
                       bool output, bool need_data) {
  if (t == nullptr) fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s is NULL", name);
  const int32_t dtype = enum_bits(t->dtype);
  if (dtype != FLASHATTN_DTYPE_FLOAT32 && dtype != FLASHATTN_DTYPE_FLOAT16 &&
      dtype != FLASHATTN_DTYPE_BFLOAT16 && dtype != FLASHATTN_DTYPE_INT32) {
    fail(FLASHATTN_ERROR_INVALID_DTYPE, "%s: unknown dtype %d", name, static_cast<int>(dtype));
  }
  check_rank(name, t, kind);
  const int rank = kind.rank;
  for (int i = 0; i < rank; ++i) {
    if (t->shape[i] < 1) {
      fail(FLASHATTN_ERROR_INVALID_SHAPE, "%s: shape[%d] (%s) is %lld, must be >= 1", name, i,
           kind.dims[i], static_cast<long long>(t->shape[i]));
    }
    if (t->shape[i] > kMaxDim) {
      fail(FLASHATTN_ERROR_INVALID_SHAPE, "%s: shape[%d] (%s) is %lld, exceeds 2^31 - 1", name, i,
           kind.dims[i], static_cast<long long>(t->shape[i]));
    }
    if (t->strides[i] < 0) {
      fail(FLASHATTN_ERROR_INVALID_STRIDE, "%s: strides[%d] (%s) is %lld, must be >= 0", name, i,
           kind.dims[i], static_cast<long long>(t->strides[i]));
    }
  }
  if (kind.unit_last && t->strides[rank - 1] != 1) {
    fail(FLASHATTN_ERROR_INVALID_STRIDE, "%s: strides[%d] (head_dim) is %lld, must be 1", name,
         rank - 1, static_cast<long long>(t->strides[rank - 1]));
  }
  const size_t elem = dtype_bytes(t->dtype);
  // Largest element offset and the byte extent, every product and sum checked in 64 bits.
  int64_t max_offset = 0;
  for (int i = 0; i < rank; ++i) {
    int64_t term;
    if (__builtin_mul_overflow(t->shape[i] - 1, t->strides[i], &term) ||
        __builtin_add_overflow(max_offset, term, &max_offset)) {
      fail(FLASHATTN_ERROR_INVALID_STRIDE, "%s: shape %s with these strides overflows 64 bits",
           name, shape_string(t).c_str());
    }
  }
  int64_t extent;
  if (__builtin_add_overflow(max_offset, int64_t(1), &extent) ||
      __builtin_mul_overflow(extent, static_cast<int64_t>(elem), &extent) ||
      static_cast<uint64_t>(extent) > (uint64_t(1) << 56)) {
    fail(FLASHATTN_ERROR_INVALID_STRIDE, "%s: shape %s with these strides spans more than 2^56 bytes",
         name, shape_string(t).c_str());
  }
  if (output) {
    Dim dims[FLASHATTN_MAX_RANK];
    int n = live_dims(t, dims);
    if (!nested_layout(dims, n)) {
      fail(FLASHATTN_ERROR_INVALID_STRIDE,
           "%s: strides overlap (an output element would be written twice)", name);
    }
  }
  if (need_data && t->data == nullptr) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s: data is NULL", name);
  }
  if (need_data && reinterpret_cast<uintptr_t>(t->data) % elem != 0) {
    fail(FLASHATTN_ERROR_INVALID_MEMORY, "%s: data %p is not aligned to its %zu-byte elements",
         name, t->data, elem);
  }
  CheckedView c;
  c.name = name;
  c.view = t;
  c.elem_size = elem;
  c.extent_bytes = static_cast<size_t>(extent);
  c.output = output;
  return c;
}

void expect_dtype(const CheckedView& c, flashattn_dtype_t want) {
  if (c.view->dtype != want) {
    fail(FLASHATTN_ERROR_INVALID_DTYPE, "%s: dtype %s, must be %s", c.name,
         dtype_string(c.view->dtype), dtype_string(want));
  }
}

void expect_floating(const CheckedView& c) {
  if (c.view->dtype == FLASHATTN_DTYPE_INT32) {
    fail(FLASHATTN_ERROR_INVALID_DTYPE,
         "%s: dtype int32 is not an element type of attention (float32, float16 or bfloat16)",
         c.name);
  }
}

void expect_same_dtype(const CheckedView& a, const CheckedView& ref) {
  if (a.view->dtype != ref.view->dtype) {
    fail(FLASHATTN_ERROR_INVALID_DTYPE, "%s: dtype %s differs from %s's %s", a.name,
         dtype_string(a.view->dtype), ref.name, dtype_string(ref.view->dtype));
  }
}

// Dimension `dim` of a against dimension `ref_dim` of ref (q/k/v-like views of one kind).
void expect_dim(const CheckedView& a, int dim, const CheckedView& ref, int ref_dim,
                const ViewKind& kind) {
  if (a.view->shape[dim] != ref.view->shape[ref_dim]) {
    fail(FLASHATTN_ERROR_INVALID_SHAPE, "%s: %s %lld differs from %s's %lld", a.name,
         kind.dims[dim], static_cast<long long>(a.view->shape[dim]), ref.name,
         static_cast<long long>(ref.view->shape[ref_dim]));
  }
}

void expect_same_shape(const CheckedView& a, const CheckedView& ref) {
  for (int i = 0; i < a.view->rank; ++i) {
    if (a.view->shape[i] != ref.view->shape[i]) {
      fail(FLASHATTN_ERROR_INVALID_SHAPE, "%s: shape %s differs from %s's %s", a.name,
           shape_string(a.view).c_str(), ref.name, shape_string(ref.view).c_str());
    }
  }
}

Tensor4 tensor4(const flashattn_tensor_t* t) {
  Tensor4 r;
  r.data = t->data;
  if (t->rank == 3) {  // a variable-length batch: rows are addressed by their offsets
    r.stride_seq = t->strides[0];
    r.stride_head = t->strides[1];
    return r;
  }
  r.stride_batch = t->strides[0];
  r.stride_seq = t->strides[1];
  r.stride_head = t->strides[2];
  return r;
}

LseView lse_view(const flashattn_tensor_t* t) {
  LseView r;
  if (t == nullptr) return r;
  r.data = static_cast<float*>(t->data);
  if (t->rank == 2) {
    r.stride_head = t->strides[0];
    r.stride_seq = t->strides[1];
    return r;
  }
  r.stride_batch = t->strides[0];
  r.stride_head = t->strides[1];
  r.stride_seq = t->strides[2];
  return r;
}

template <class T>
Vector<T> vector_view(const flashattn_tensor_t* t) {
  Vector<T> r;
  if (t == nullptr) return r;
  r.data = static_cast<T*>(t->data);
  r.stride = t->strides[0];
  return r;
}

// Where v's data lies in a library buffer (its bytes or the guard after them), if it does.
bool offset_in_buffer(const CheckedView& v, size_t* offset, size_t* size) {
  RegisteredRange range;
  if (v.view->data == nullptr || !registry_find(v.view->data, &range)) return false;
  *offset = reinterpret_cast<uintptr_t>(v.view->data) - range.begin;
  *size = range.size;
  return true;
}

[[noreturn]] void fail_past_buffer(const CheckedView& v, size_t offset, size_t size) {
  fail(FLASHATTN_ERROR_INVALID_MEMORY,
       "%s: the view spans %zu bytes from offset %zu, past the end of its %zu-byte buffer",
       v.name, v.extent_bytes, offset, size);
}

// A view that starts at or past its buffer's end (in the guard) runs on into whatever the heap
// put after the buffer: that is its fault, reported before any overlap it causes, so that the
// report does not depend on where the next buffer lies.
void check_starts_in_buffer(const CheckedView& v) {
  size_t offset = 0, size = 0;
  if (offset_in_buffer(v, &offset, &size) && offset >= size && v.extent_bytes > 0) {
    fail_past_buffer(v, offset, size);
  }
}

}  // namespace

void check_within_buffer(const CheckedView& v) {
  size_t offset = 0, size = 0;
  if (offset_in_buffer(v, &offset, &size) &&
      (offset > size || v.extent_bytes > size - offset)) {
    fail_past_buffer(v, offset, size);
  }
}

namespace {

// Outputs may share no byte with any other view (a view starting past its buffer's end is
// refused as such first).
void check_aliasing(const std::vector<CheckedView>& views) {
  for (const CheckedView& v : views) check_starts_in_buffer(v);
  for (size_t i = 0; i < views.size(); ++i) {
    if (!views[i].output) continue;
    for (size_t j = 0; j < views.size(); ++j) {
      if (i == j || (views[j].output && j < i)) continue;
      if (views_may_overlap(views[i], views[j])) {
        fail(FLASHATTN_ERROR_INVALID_MEMORY, "%s: shares memory with %s", views[i].name,
             views[j].name);
      }
    }
  }
}

// ---- Size-prefixed structs -------------------------------------------------------------------
// A caller's struct is read as far as its size says and this library knows: the defaults first,
// then the bytes the caller has; a size that ends inside a field, or bytes this library does not
// know that are set, are refused (the first as a mistake, the second as a newer caller's).

struct StructInfo {
  const char* name;   // "options"
  const char* type;   // "flashattn_options_t"
  const char* init;   // "flashattn_options_init() or FLASHATTN_OPTIONS_INIT"
  size_t first;       // the size of the struct's first version (what its first header gave)
  size_t known;       // sizeof of this library's struct
  const size_t* field_ends;
  size_t fields;
};

std::string field_end_list(const StructInfo& info) {
  std::string s;
  for (size_t i = 0; i < info.fields; ++i) {
    if (i > 0) s += i + 1 == info.fields ? " and " : ", ";
    s += std::to_string(info.field_ends[i]);
  }
  return s;
}

// Sizes past the library's struct end wherever a newer header's fields end: not checked.
bool ends_at_field_end(const StructInfo& info, size_t size) {
  if (size >= info.known) return true;
  for (size_t i = 0; i < info.fields; ++i) {
    if (size == info.field_ends[i]) return true;
  }
  return false;
}

void read_sized(const StructInfo& info, const void* caller, void* defaults) {
  size_t size;
  std::memcpy(&size, caller, sizeof size);
  if (size < sizeof(size_t)) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s: size is %zu; fill the struct with %s", info.name,
         size, info.init);
  }
  if (size > kMaxStructSize) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s: size %zu is not a plausible struct size",
         info.name, size);
  }
  // A size that ends inside a field would hand the library half a value.
  if (size > sizeof(size_t) && !ends_at_field_end(info, size)) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s: size %zu ends inside a field (fields end at %s bytes)",
         info.name, size, field_end_list(info).c_str());
  }
  const auto* bytes = static_cast<const unsigned char*>(caller);
  for (size_t i = info.known; i < size; ++i) {
    if (bytes[i] != 0) {
      fail(FLASHATTN_ERROR_UNSUPPORTED,
           "%s: fields past the %zu bytes this library knows are set; they need a newer "
           "flashattn",
           info.name, info.known);
    }
  }
  std::memcpy(static_cast<unsigned char*>(defaults) + sizeof(size_t), bytes + sizeof(size_t),
              std::min(size, info.known) - sizeof(size_t));
}

// The _sized initializers: the defaults into the first `size` bytes of a caller's struct, with
// size = `size`, so that what read_sized later reads is exactly what was written. A caller from a
// newer header (size past what this library knows) gets zeros past the known fields: every
// appended field defaults to 0, and read_sized accepts unknown bytes that are 0. Nothing is
// written when the size is refused.
void write_sized(const StructInfo& info, const void* defaults, void* out, size_t size) {
  if (size < info.first) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
         "size %zu is smaller than the first %s (%zu bytes); pass sizeof(%s)", size, info.type,
         info.first, info.type);
  }
  if (size > kMaxStructSize) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "size %zu is not a plausible size of a %s", size,
         info.type);
  }
  if (!ends_at_field_end(info, size)) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
         "size %zu ends inside a field of %s (fields end at %s bytes)", size, info.type,
         field_end_list(info).c_str());
  }
  auto* bytes = static_cast<unsigned char*>(out);
  const size_t known = std::min(size, info.known);
  std::memcpy(bytes, defaults, known);
  std::memset(bytes + known, 0, size - known);
  std::memcpy(bytes, &size, sizeof size);
}

#define FLASHATTN_FIELD_END(type, field) (offsetof(type, field) + sizeof(type::field))

constexpr size_t kOptionsFieldEnds[] = {
    FLASHATTN_FIELD_END(flashattn_options_t, softmax_scale),
    FLASHATTN_FIELD_END(flashattn_options_t, causal),
    FLASHATTN_FIELD_END(flashattn_options_t, algorithm),
    FLASHATTN_FIELD_END(flashattn_options_t, deterministic),
    FLASHATTN_FIELD_END(flashattn_options_t, window),
    FLASHATTN_FIELD_END(flashattn_options_t, window_left),
    FLASHATTN_FIELD_END(flashattn_options_t, window_right),
    FLASHATTN_FIELD_END(flashattn_options_t, softcap),
    FLASHATTN_FIELD_END(flashattn_options_t, num_splits),
};

constexpr size_t kArgsFieldEnds[] = {
    FLASHATTN_FIELD_END(flashattn_args_t, options),
    FLASHATTN_FIELD_END(flashattn_args_t, q),
    FLASHATTN_FIELD_END(flashattn_args_t, k),
    FLASHATTN_FIELD_END(flashattn_args_t, v),
    FLASHATTN_FIELD_END(flashattn_args_t, out),
    FLASHATTN_FIELD_END(flashattn_args_t, lse),
    FLASHATTN_FIELD_END(flashattn_args_t, dout),
    FLASHATTN_FIELD_END(flashattn_args_t, dq),
    FLASHATTN_FIELD_END(flashattn_args_t, dk),
    FLASHATTN_FIELD_END(flashattn_args_t, dv),
    FLASHATTN_FIELD_END(flashattn_args_t, alibi_slopes),
    FLASHATTN_FIELD_END(flashattn_args_t, sinks),
    FLASHATTN_FIELD_END(flashattn_args_t, dsinks),
    FLASHATTN_FIELD_END(flashattn_args_t, cu_seqlens_q),
    FLASHATTN_FIELD_END(flashattn_args_t, cu_seqlens_k),
    FLASHATTN_FIELD_END(flashattn_args_t, max_seqlen_q),
    FLASHATTN_FIELD_END(flashattn_args_t, max_seqlen_k),
    FLASHATTN_FIELD_END(flashattn_args_t, cache_seqlens),
    FLASHATTN_FIELD_END(flashattn_args_t, block_table),
    FLASHATTN_FIELD_END(flashattn_args_t, k_new),
    FLASHATTN_FIELD_END(flashattn_args_t, v_new),
    FLASHATTN_FIELD_END(flashattn_args_t, rotary_cos),
    FLASHATTN_FIELD_END(flashattn_args_t, rotary_sin),
    FLASHATTN_FIELD_END(flashattn_args_t, rotary_interleaved),
};

constexpr size_t kMergeArgsFieldEnds[] = {
    FLASHATTN_FIELD_END(flashattn_merge_args_t, num_parts),
    FLASHATTN_FIELD_END(flashattn_merge_args_t, parts_out),
    FLASHATTN_FIELD_END(flashattn_merge_args_t, parts_out_stride),
    FLASHATTN_FIELD_END(flashattn_merge_args_t, parts_lse),
    FLASHATTN_FIELD_END(flashattn_merge_args_t, parts_lse_stride),
    FLASHATTN_FIELD_END(flashattn_merge_args_t, out),
    FLASHATTN_FIELD_END(flashattn_merge_args_t, lse),
};

constexpr size_t kCpArgsFieldEnds[] = {
    FLASHATTN_FIELD_END(flashattn_cp_args_t, ranks),
    FLASHATTN_FIELD_END(flashattn_cp_args_t, rank),
    FLASHATTN_FIELD_END(flashattn_cp_args_t, layout),
    FLASHATTN_FIELD_END(flashattn_cp_args_t, nccl_comm),
    FLASHATTN_FIELD_END(flashattn_cp_args_t, exchange),
    FLASHATTN_FIELD_END(flashattn_cp_args_t, exchange_user),
};

#undef FLASHATTN_FIELD_END

static_assert(kOptionsFieldEnds[sizeof(kOptionsFieldEnds) / sizeof(size_t) - 1] ==
                  sizeof(flashattn_options_t),
              "the last field of flashattn_options_t is listed");
static_assert(kArgsFieldEnds[sizeof(kArgsFieldEnds) / sizeof(size_t) - 1] == sizeof(flashattn_args_t),
              "the last field of flashattn_args_t is listed");

// flashattn_options_t as the first header laid it out. Programs built against that header pass
// this struct: its fields must stay where they were, and kOptionsFirstSize must be its size.
struct OptionsFirstVersion {
  size_t size;
  float softmax_scale;
  int32_t causal;
  flashattn_algorithm_t algorithm;
  int32_t deterministic;
};
static_assert(sizeof(OptionsFirstVersion) == kOptionsFirstSize,
              "kOptionsFirstSize is the size of the first flashattn_options_t");
static_assert(offsetof(OptionsFirstVersion, softmax_scale) ==
                      offsetof(flashattn_options_t, softmax_scale) &&
                  offsetof(OptionsFirstVersion, causal) == offsetof(flashattn_options_t, causal) &&
                  offsetof(OptionsFirstVersion, algorithm) ==
                      offsetof(flashattn_options_t, algorithm) &&
                  offsetof(OptionsFirstVersion, deterministic) ==
                      offsetof(flashattn_options_t, deterministic),
              "the first flashattn_options_t's fields have not moved");
static_assert(kArgsFirstSize <= sizeof(flashattn_args_t), "fields are only appended");

constexpr StructInfo kOptionsInfo{"options",
                                  "flashattn_options_t",
                                  "flashattn_options_init() or FLASHATTN_OPTIONS_INIT",
                                  kOptionsFirstSize,
                                  sizeof(flashattn_options_t),
                                  kOptionsFieldEnds,
                                  sizeof(kOptionsFieldEnds) / sizeof(size_t)};
// The first flashattn_merge_args_t: it has not grown yet; when it does, this stays the end of
// its `lse` field.
constexpr size_t kMergeArgsFirstSize = sizeof(flashattn_merge_args_t);
static_assert(kMergeArgsFieldEnds[sizeof(kMergeArgsFieldEnds) / sizeof(size_t) - 1] ==
                  sizeof(flashattn_merge_args_t),
              "the last field of flashattn_merge_args_t is listed");

constexpr StructInfo kMergeArgsInfo{"args",
                                    "flashattn_merge_args_t",
                                    "flashattn_merge_args_init() or FLASHATTN_MERGE_ARGS_INIT",
                                    kMergeArgsFirstSize,
                                    sizeof(flashattn_merge_args_t),
                                    kMergeArgsFieldEnds,
                                    sizeof(kMergeArgsFieldEnds) / sizeof(size_t)};
// The first flashattn_cp_args_t: it has not grown yet.
constexpr size_t kCpArgsFirstSize = sizeof(flashattn_cp_args_t);
static_assert(kCpArgsFieldEnds[sizeof(kCpArgsFieldEnds) / sizeof(size_t) - 1] ==
                  sizeof(flashattn_cp_args_t),
              "the last field of flashattn_cp_args_t is listed");

constexpr StructInfo kCpArgsInfo{"cp",
                                 "flashattn_cp_args_t",
                                 "flashattn_cp_args_init() or FLASHATTN_CP_ARGS_INIT",
                                 kCpArgsFirstSize,
                                 sizeof(flashattn_cp_args_t),
                                 kCpArgsFieldEnds,
                                 sizeof(kCpArgsFieldEnds) / sizeof(size_t)};
constexpr StructInfo kArgsInfo{"args",
                               "flashattn_args_t",
                               "flashattn_args_init() or FLASHATTN_ARGS_INIT",
                               kArgsFirstSize,
                               sizeof(flashattn_args_t),
                               kArgsFieldEnds,
                               sizeof(kArgsFieldEnds) / sizeof(size_t)};

// ---- Option values --------------------------------------------------------------------------

void check_option_values(const flashattn_options_t& o) {
  if (!std::isfinite(o.softmax_scale)) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
         "options: softmax_scale is %g, must be finite (0 selects 1/sqrt(head_dim))",
         static_cast<double>(o.softmax_scale));
  }
  if (std::fabs(o.softmax_scale) > FLASHATTN_MAX_SOFTMAX_SCALE) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
         "options: softmax_scale is %g; its magnitude must not exceed FLASHATTN_MAX_SOFTMAX_SCALE "
         "(%g), past which the scores of ordinary inputs overflow fp32",
         static_cast<double>(o.softmax_scale), static_cast<double>(FLASHATTN_MAX_SOFTMAX_SCALE));
  }
  if (o.causal != 0 && o.causal != 1) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "options: causal is %d, must be 0 or 1", o.causal);
  }
  const int32_t algorithm = enum_bits(o.algorithm);
  if (algorithm != FLASHATTN_ALGORITHM_FLASH && algorithm != FLASHATTN_ALGORITHM_STANDARD) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
         "options: algorithm is %d, must be FLASHATTN_ALGORITHM_FLASH (0) or _STANDARD (1)",
         static_cast<int>(algorithm));
  }
  if (o.deterministic != 0 && o.deterministic != 1) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "options: deterministic is %d, must be 0 or 1",
         o.deterministic);
  }
  if (o.window != 0 && o.window != 1) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "options: window is %d, must be 0 or 1", o.window);
  }
  const struct {
    const char* name;
    int32_t value;
  } bounds[] = {{"window_left", o.window_left}, {"window_right", o.window_right}};
  for (const auto& bound : bounds) {
    if (o.window == 0 && bound.value != 0) {
      fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
           "options: %s is %d but window is 0; set window = 1 to apply a sliding window", bound.name,
           bound.value);
    }
    if (bound.value < -1) {
      fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
           "options: %s is %d, must be >= 0, or -1 for no bound on that side", bound.name,
           bound.value);
    }
  }
  if (!std::isfinite(o.softcap) || o.softcap < 0.0f) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
         "options: softcap is %g, must be 0 (none) or a finite cap > 0",
         static_cast<double>(o.softcap));
  }
  if (o.num_splits < 0) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
         "options: num_splits is %lld, must be 0 (the library chooses) or a number of parts > 0",
         static_cast<long long>(o.num_splits));
  }
}

bool representable(int64_t r, const Dim* dims, int i, int n, const int64_t* inner_max) {
  if (i == n) return r == 0;
  const int64_t s = dims[i].stride;
  int64_t lo = r / s;  // truncates toward zero; try both neighbours below
  for (int64_t c : {lo - 1, lo, lo + 1}) {
    if (c <= -dims[i].shape || c >= dims[i].shape) continue;
    int64_t rest = r - c * s;
    if (rest < -inner_max[i] || rest > inner_max[i]) continue;
    if (representable(rest, dims, i + 1, n, inner_max)) return true;
  }
  return false;
}

}  // namespace

bool views_may_overlap(const CheckedView& a, const CheckedView& b) {
  const uintptr_t pa = reinterpret_cast<uintptr_t>(a.view->data);
  const uintptr_t pb = reinterpret_cast<uintptr_t>(b.view->data);
  // Disjoint spans, tested without forming pa + extent (no wrap-around near the top).
  if (pa <= pb ? pb - pa >= a.extent_bytes : pa - pb >= b.extent_bytes) return false;
  // Spans meet. Interleaved views of one layout (a packed QKV tensor) may still be disjoint.
  const flashattn_tensor_t* ta = a.view;
  const flashattn_tensor_t* tb = b.view;
  if (a.elem_size != b.elem_size || ta->rank != tb->rank) return true;
  for (int i = 0; i < ta->rank; ++i) {
    if (ta->shape[i] != tb->shape[i] || ta->strides[i] != tb->strides[i]) return true;
  }
  const int64_t diff_bytes = static_cast<int64_t>(pb - pa);
  if (diff_bytes % static_cast<int64_t>(a.elem_size) != 0) return true;
  Dim dims[FLASHATTN_MAX_RANK];
  int n = live_dims(ta, dims);
  if (!nested_layout(dims, n)) return true;
  std::reverse(dims, dims + n);  // largest stride first
  int64_t inner_max[FLASHATTN_MAX_RANK] = {0, 0, 0, 0};
  int64_t acc = 0;
  for (int i = n - 1; i >= 0; --i) {
    inner_max[i] = acc;
    acc += (dims[i].shape - 1) * dims[i].stride;
  }
  return representable(diff_bytes / static_cast<int64_t>(a.elem_size), dims, 0, n, inner_max);
}


flashattn_options_t read_options(const flashattn_options_t* options) {
  flashattn_options_t o;
  std::memset(&o, 0, sizeof o);  // every field past `size` defaults to 0
  o.size = sizeof(o);
  o.algorithm = FLASHATTN_ALGORITHM_FLASH;
  if (options == nullptr) return o;
  read_sized(kOptionsInfo, options, &o);
  o.size = sizeof(o);
  check_option_values(o);
  return o;
}

flashattn_args_t read_args(const flashattn_args_t* args) {
  if (args == nullptr) fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "args is NULL");
  flashattn_args_t a;
  std::memset(&a, 0, sizeof a);
  read_sized(kArgsInfo, args, &a);
  a.size = sizeof(a);
  return a;
}

flashattn_merge_args_t read_merge_args(const flashattn_merge_args_t* args) {
  if (args == nullptr) fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "args is NULL");
  flashattn_merge_args_t a;
  std::memset(&a, 0, sizeof a);
  read_sized(kMergeArgsInfo, args, &a);
  a.size = sizeof(a);
  return a;
}

flashattn_cp_args_t read_cp_args(const flashattn_cp_args_t* cp) {
  if (cp == nullptr) fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "cp is NULL");
  flashattn_cp_args_t a;
  std::memset(&a, 0, sizeof a);
  read_sized(kCpArgsInfo, cp, &a);
  a.size = sizeof(a);
  return a;
}

void init_cp_args_sized(flashattn_cp_args_t* out, size_t size) {
  const flashattn_cp_args_t defaults = FLASHATTN_CP_ARGS_INIT;
  write_sized(kCpArgsInfo, &defaults, out, size);
}

void init_merge_args_sized(flashattn_merge_args_t* out, size_t size) {
  const flashattn_merge_args_t defaults = FLASHATTN_MERGE_ARGS_INIT;
  write_sized(kMergeArgsInfo, &defaults, out, size);
}

void init_options_sized(flashattn_options_t* out, size_t size) {
  const flashattn_options_t defaults = read_options(nullptr);
  write_sized(kOptionsInfo, &defaults, out, size);
}

void init_args_sized(flashattn_args_t* out, size_t size) {
  const flashattn_args_t defaults = FLASHATTN_ARGS_INIT;
  write_sized(kArgsInfo, &defaults, out, size);
}

namespace {

// Which call the checks are for: a query (supported, workspace_size) looks at no data pointer.
struct CallKind {
  bool backward;
  bool need_data;
};

// The views of q, k, v and of the variants, with the problem they describe. Built in the order
// the checks run, so that the first wrong argument is the one reported.
struct Configuration {
  Problem problem;
  const ViewKind* heads = &kHeads4;  // q, k, v, out, dout, dq, dk, dv
  const ViewKind* lse = &kLse3;
  CheckedView q, k, v;
  std::vector<CheckedView> variant_views;  // alibi, sinks, offsets, cache lengths (inputs)
  std::vector<CheckedView> cache_inputs;   // k_new, v_new, rotary tables (inputs)
};

void check_lengths(const flashattn_args_t& a, const CheckedView& q, const CheckedView& k) {
  const struct {
    const char* name;
    int64_t value;
    const CheckedView& of;
  } maxima[] = {{"max_seqlen_q", a.max_seqlen_q, q}, {"max_seqlen_k", a.max_seqlen_k, k}};
  for (const auto& m : maxima) {
    if (m.value < 0) {
      fail(FLASHATTN_ERROR_INVALID_SHAPE, "args: %s is %lld, must be >= 0", m.name,
           static_cast<long long>(m.value));
    }
    if (m.value > m.of.view->shape[0]) {
      fail(FLASHATTN_ERROR_INVALID_SHAPE,
           "args: %s is %lld, more than %s's %lld tokens (no sequence can be longer)", m.name,
           static_cast<long long>(m.value), m.of.name, static_cast<long long>(m.of.view->shape[0]));
    }
  }
}

CheckedView check_offsets(const char* name, const flashattn_tensor_t* t, bool need_data) {
  CheckedView c = check_view(name, t, kOffsets, false, need_data);
  expect_dtype(c, FLASHATTN_DTYPE_INT32);
  if (t->shape[0] < 2) {
    fail(FLASHATTN_ERROR_INVALID_SHAPE,
         "%s: shape %s holds %lld offset; a batch of B sequences needs B + 1 >= 2", name,
         shape_string(t).c_str(), static_cast<long long>(t->shape[0]));
  }
  return c;
}

// A fp32 tensor of one value per query head, or per batch entry and query head.
CheckedView check_per_head(const char* name, const flashattn_tensor_t* t, const Problem& p,
                           bool allow_per_batch, bool output, bool need_data) {
  if (t == nullptr) fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s is NULL", name);
  const bool per_batch = allow_per_batch && t->rank == 2;
  if (allow_per_batch && t->rank != 1 && t->rank != 2) {
    fail(FLASHATTN_ERROR_INVALID_SHAPE, "%s: rank is %d, expected 1 (%s) or 2 (%s)", name,
         t->rank, kPerHead.layout, kPerBatchHead.layout);
  }
  CheckedView c = check_view(name, t, per_batch ? kPerBatchHead : kPerHead, output, need_data);
  expect_dtype(c, FLASHATTN_DTYPE_FLOAT32);
  const bool fits = per_batch ? t->shape[0] == p.batch && t->shape[1] == p.heads_q
                              : t->shape[0] == p.heads_q;
  if (!fits) {
    if (allow_per_batch) {
      fail(FLASHATTN_ERROR_INVALID_SHAPE, "%s: shape %s, expected [heads_q] = %s or "
           "[batch, heads_q] = %s", name, shape_string(t).c_str(),
           shape_string({p.heads_q}).c_str(), shape_string({p.batch, p.heads_q}).c_str());
    }
    fail(FLASHATTN_ERROR_INVALID_SHAPE, "%s: shape %s, expected [heads_q] = %s", name,
         shape_string(t).c_str(), shape_string({p.heads_q}).c_str());
  }
  return c;
}

// Two tensors that come together: both given or neither (INVALID_ARGUMENT naming the missing).
void expect_both(const char* a_name, const flashattn_tensor_t* a, const char* b_name,
                 const flashattn_tensor_t* b, const char* why) {
  if ((a == nullptr) != (b == nullptr)) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s is NULL but %s is given (%s)",
         a == nullptr ? a_name : b_name, a == nullptr ? b_name : a_name, why);
  }
}

// The fields that belong to a KV cache call, before anything else is looked at: none of them
// without cache_seqlens, none with a variable-length batch, none in a backward.
void check_cache_fields(const flashattn_args_t& a, CallKind call) {
  const bool varlen = a.cu_seqlens_q != nullptr || a.cu_seqlens_k != nullptr;
  if (a.cache_seqlens == nullptr) {
    const struct {
      const char* name;
      bool set;
    } fields[] = {{"block_table", a.block_table != nullptr}, {"k_new", a.k_new != nullptr},
                  {"v_new", a.v_new != nullptr}, {"rotary_cos", a.rotary_cos != nullptr},
                  {"rotary_sin", a.rotary_sin != nullptr},
                  {"rotary_interleaved", a.rotary_interleaved != 0}};
    for (const auto& f : fields) {
      if (f.set) {
        fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
             "args: %s is set but cache_seqlens is NULL (it belongs to a KV cache call)", f.name);
      }
    }
    return;
  }
  if (call.backward) {
    fail(FLASHATTN_ERROR_UNSUPPORTED,
         "args: cache_seqlens is set; the KV cache is forward only (a backward takes none)");
  }
  if (varlen) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
         "args: cache_seqlens and %s are both set; a KV cache call takes a fixed-length q and "
         "no offsets", a.cu_seqlens_q != nullptr ? "cu_seqlens_q" : "cu_seqlens_k");
  }
  if (a.max_seqlen_q != 0 || a.max_seqlen_k != 0) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
         "args: max_seqlen_%s is %lld in a KV cache call (the cache's lengths are cache_seqlens; "
         "max lengths belong to a variable-length batch)", a.max_seqlen_q != 0 ? "q" : "k",
         static_cast<long long>(a.max_seqlen_q != 0 ? a.max_seqlen_q : a.max_seqlen_k));
  }
}

// A KV cache call's own tensors, after q, k and v: the lengths, the block table, the appended
// rows and the rotary tables. Sets the problem's cache fields and seqlen_k (the capacity).
void check_cache(const flashattn_args_t& a, CallKind call, Configuration* cfg,
                 std::vector<CheckedView>* cache_inputs) {
  Problem& p = cfg->problem;
  const bool paged = a.block_table != nullptr;
  const CheckedView lengths =
      check_view("cache_seqlens", a.cache_seqlens, kCacheLengths, false, call.need_data);
  expect_dtype(lengths, FLASHATTN_DTYPE_INT32);
  if (a.cache_seqlens->shape[0] != p.batch) {
    fail(FLASHATTN_ERROR_INVALID_SHAPE, "cache_seqlens: shape %s, expected [batch] = %s",
         shape_string(a.cache_seqlens).c_str(), shape_string({p.batch}).c_str());
  }
  cfg->variant_views.push_back(lengths);
  p.kv_cache = paged ? KvCache::Paged : KvCache::Contiguous;
  if (paged) {
    const CheckedView table =
        check_view("block_table", a.block_table, kBlockTable, false, call.need_data);
    expect_dtype(table, FLASHATTN_DTYPE_INT32);
    if (a.block_table->shape[0] != p.batch) {
      fail(FLASHATTN_ERROR_INVALID_SHAPE,
           "block_table: shape %s, its batch %lld differs from q's %lld",
           shape_string(a.block_table).c_str(), static_cast<long long>(a.block_table->shape[0]),
           static_cast<long long>(p.batch));
    }
    cfg->variant_views.push_back(table);
    p.num_pages = a.k->shape[0];
    p.page_size = a.k->shape[1];
    p.pages_per_seq = a.block_table->shape[1];
    int64_t capacity;
    if (__builtin_mul_overflow(p.page_size, p.pages_per_seq, &capacity) || capacity > kMaxDim) {
      fail(FLASHATTN_ERROR_INVALID_SHAPE,
           "block_table: %lld pages of %lld rows per sequence exceed 2^31 - 1 tokens",
           static_cast<long long>(p.pages_per_seq), static_cast<long long>(p.page_size));
    }
    p.seqlen_k = capacity;
  }
  expect_both("k_new", a.k_new, "v_new", a.v_new, "rows appended to the cache need both");
  if (a.k_new != nullptr) {
    const CheckedView k_new = check_view("k_new", a.k_new, kHeads4, false, call.need_data);
    const CheckedView v_new = check_view("v_new", a.v_new, kHeads4, false, call.need_data);
    expect_same_dtype(k_new, cfg->q);
    expect_same_dtype(v_new, cfg->q);
    const int64_t n_new = a.k_new->shape[1];
    const int64_t want_k[] = {p.batch, n_new, p.heads_kv, p.head_dim};
    const int64_t want_v[] = {p.batch, n_new, p.heads_kv, p.head_dim_v};
    for (const auto& side : {std::make_pair(&k_new, want_k), std::make_pair(&v_new, want_v)}) {
      const flashattn_tensor_t* t = side.first->view;
      const int64_t* w = side.second;
      if (t->shape[0] != w[0] || t->shape[1] != w[1] || t->shape[2] != w[2] ||
          t->shape[3] != w[3]) {
        fail(FLASHATTN_ERROR_INVALID_SHAPE,
             "%s: shape %s, expected [batch, N_new, heads_kv, %s] = %s", side.first->name,
             shape_string(t).c_str(), t == a.k_new ? "head_dim" : "head_dim_v",
             shape_string({w[0], w[1], w[2], w[3]}).c_str());
      }
    }
    if (n_new > p.seqlen_k) {
      fail(FLASHATTN_ERROR_INVALID_SHAPE,
           "k_new: %lld rows do not fit a cache of %lld tokens per sequence",
           static_cast<long long>(n_new), static_cast<long long>(p.seqlen_k));
    }
    cache_inputs->push_back(k_new);
    cache_inputs->push_back(v_new);
    p.seqlen_new = n_new;
  }
  expect_both("rotary_cos", a.rotary_cos, "rotary_sin", a.rotary_sin,
              "a rotary embedding needs both tables");
  if (a.rotary_interleaved != 0 && a.rotary_interleaved != 1) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "args: rotary_interleaved is %lld, must be 0 or 1",
         static_cast<long long>(a.rotary_interleaved));
  }
  if (a.rotary_cos != nullptr) {
    const CheckedView cos = check_view("rotary_cos", a.rotary_cos, kRotaryTable, false,
                                       call.need_data);
    const CheckedView sin = check_view("rotary_sin", a.rotary_sin, kRotaryTable, false,
                                       call.need_data);
    if (a.rotary_cos->dtype != FLASHATTN_DTYPE_FLOAT32 && a.rotary_cos->dtype != a.q->dtype) {
      fail(FLASHATTN_ERROR_INVALID_DTYPE, "rotary_cos: dtype %s, must be float32 or q's %s",
           dtype_string(a.rotary_cos->dtype), dtype_string(a.q->dtype));
    }
    expect_same_dtype(sin, cos);
    expect_same_shape(sin, cos);
    if (2 * a.rotary_cos->shape[1] > p.head_dim) {
      fail(FLASHATTN_ERROR_INVALID_SHAPE,
           "rotary_cos: shape %s rotates %lld features, more than head_dim %lld",
           shape_string(a.rotary_cos).c_str(), static_cast<long long>(2 * a.rotary_cos->shape[1]),
           static_cast<long long>(p.head_dim));
    }
    cache_inputs->push_back(cos);
    cache_inputs->push_back(sin);
    p.rotary_dim = 2 * a.rotary_cos->shape[1];
    p.rotary_positions = a.rotary_cos->shape[0];
    p.rotary_dtype = static_cast<DType>(a.rotary_cos->dtype);
    p.rotary_interleaved = a.rotary_interleaved == 1;
  } else if (a.rotary_interleaved != 0) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
         "args: rotary_interleaved is set but rotary_cos is NULL (there is no rotary embedding)");
  }
}

Configuration configuration_of(const flashattn_args_t& a, CallKind call) {
  Configuration cfg;
  const flashattn_options_t o = read_options(a.options);
  check_cache_fields(a, call);
  const bool varlen = a.cu_seqlens_q != nullptr || a.cu_seqlens_k != nullptr;
  const bool cache = a.cache_seqlens != nullptr;
  const bool paged = cache && a.block_table != nullptr;
  if (varlen) {
    cfg.heads = &kHeads3;
    cfg.lse = &kLse2;
  }
  const ViewKind& kind = *cfg.heads;
  const ViewKind& kv_kind = paged ? kPages : kind;
  const int hd = kind.rank - 1, heads = kind.rank - 2, rows = kind.rank - 3;  // dimension indices
  cfg.q = check_view("q", a.q, kind, false, call.need_data);
  expect_floating(cfg.q);
  // Rows appended make the cache an output: it must not overlap itself or any other view.
  const bool cache_written = cache && a.k_new != nullptr;
  cfg.k = check_view("k", a.k, kv_kind, cache_written, call.need_data);
  cfg.v = check_view("v", a.v, kv_kind, cache_written, call.need_data);
  const CheckedView &cq = cfg.q, &ck = cfg.k, &cv = cfg.v;
  expect_same_dtype(ck, cq);
  expect_same_dtype(cv, cq);
  if (paged) {
    expect_dim(cv, 0, ck, 0, kv_kind);
  } else if (!varlen) {
    expect_dim(ck, 0, cq, 0, kind);
    expect_dim(cv, 0, cq, 0, kind);
  }
  expect_dim(ck, hd, cq, hd, kind);
  expect_dim(cv, rows, ck, rows, kv_kind);
  expect_dim(cv, heads, ck, heads, kv_kind);
  for (const CheckedView* c : {&cq, &cv}) {
    if (c->view->shape[hd] > kMaxHeadDim) {
      fail(FLASHATTN_ERROR_INVALID_SHAPE, "%s: head_dim %lld exceeds the maximum %lld", c->name,
           static_cast<long long>(c->view->shape[hd]), static_cast<long long>(kMaxHeadDim));
    }
  }
  if (a.q->shape[heads] % a.k->shape[heads] != 0) {
    fail(FLASHATTN_ERROR_INVALID_SHAPE,
         "q: heads %lld is not a multiple of k's heads %lld (GQA/MQA needs heads_q = g * heads_kv)",
         static_cast<long long>(a.q->shape[heads]), static_cast<long long>(a.k->shape[heads]));
  }
  Problem& p = cfg.problem;
  p.dtype = static_cast<DType>(a.q->dtype);
  p.heads_q = a.q->shape[heads];
  p.heads_kv = a.k->shape[heads];
  p.head_dim = a.q->shape[hd];
  p.head_dim_v = a.v->shape[hd];
  {
    const Tensor4 tq = tensor4(a.q), tk = tensor4(a.k), tv = tensor4(a.v);
    p.unaligned_rows = unaligned_rows_of(p.dtype, {{kRowsQ, &tq}, {kRowsK, &tk}, {kRowsV, &tv}});
  }
  if (varlen) {
    expect_both("cu_seqlens_q", a.cu_seqlens_q, "cu_seqlens_k", a.cu_seqlens_k,
                "a variable-length batch needs the offsets of both");
    const CheckedView cu_q = check_offsets("cu_seqlens_q", a.cu_seqlens_q, call.need_data);
    const CheckedView cu_k = check_offsets("cu_seqlens_k", a.cu_seqlens_k, call.need_data);
    if (a.cu_seqlens_k->shape[0] != a.cu_seqlens_q->shape[0]) {
      fail(FLASHATTN_ERROR_INVALID_SHAPE,
           "cu_seqlens_k: %lld offsets differ from cu_seqlens_q's %lld (one per sequence, and one "
           "more)", static_cast<long long>(a.cu_seqlens_k->shape[0]),
           static_cast<long long>(a.cu_seqlens_q->shape[0]));
    }
    check_lengths(a, cq, ck);
    cfg.variant_views.push_back(cu_q);
    cfg.variant_views.push_back(cu_k);
    p.varlen = true;
    p.batch = a.cu_seqlens_q->shape[0] - 1;
    p.seqlen_q = a.max_seqlen_q;
    p.seqlen_k = a.max_seqlen_k;
    p.total_q = a.q->shape[0];
    p.total_k = a.k->shape[0];
  } else {
    if (a.max_seqlen_q != 0 || a.max_seqlen_k != 0) {
      fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
           "args: max_seqlen_%s is %lld but there are no offsets (max lengths belong to a "
           "variable-length batch, with cu_seqlens_q and cu_seqlens_k)",
           a.max_seqlen_q != 0 ? "q" : "k",
           static_cast<long long>(a.max_seqlen_q != 0 ? a.max_seqlen_q : a.max_seqlen_k));
    }
    p.batch = a.q->shape[0];
    p.seqlen_q = a.q->shape[1];
    p.seqlen_k = a.k->shape[1];
    if (cache) check_cache(a, call, &cfg, &cfg.cache_inputs);
    p.total_q = p.batch * p.seqlen_q;
    p.total_k = p.batch * p.seqlen_k;
  }
  if (a.alibi_slopes != nullptr) {
    cfg.variant_views.push_back(
        check_per_head("alibi_slopes", a.alibi_slopes, p, true, false, call.need_data));
    p.alibi = a.alibi_slopes->rank == 2 ? Alibi::PerBatchHead : Alibi::PerHead;
  }
  if (a.sinks != nullptr) {
    cfg.variant_views.push_back(check_per_head("sinks", a.sinks, p, false, false, call.need_data));
    p.sinks = true;
  }
  if (call.backward && a.dsinks != nullptr && a.sinks == nullptr) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
         "dsinks is given but sinks is NULL (there is no sink to take the gradient of)");
  }
  p.scale = o.softmax_scale != 0.0f ? o.softmax_scale
                                    : static_cast<float>(1.0 / std::sqrt(double(p.head_dim)));
  p.algorithm = static_cast<Algorithm>(o.algorithm);
  p.deterministic = o.deterministic != 0;
  p.softcap = o.softcap;
  p.num_splits = o.num_splits;  // >= 0; the backends cut it to what they can use
  p.window_left = o.window != 0 ? o.window_left : -1;
  p.window_right = o.window != 0 ? o.window_right : -1;
  if (o.causal != 0) p.window_right = p.window_right < 0 ? 0 : std::min<int64_t>(p.window_right, 0);
  p.causal = p.window_right == 0;  // a window (-1, 0) is the causal mask, whoever asked for it
  return cfg;
}

// out and dout: q's rows and heads, v's head_dim.
CheckedView check_output_like(const char* name, const flashattn_tensor_t* t,
                              const Configuration& cfg, bool output) {
  CheckedView c = check_view(name, t, *cfg.heads, output, true);
  expect_same_dtype(c, cfg.q);
  const int rank = cfg.heads->rank;
  bool same = true;
  for (int i = 0; i + 1 < rank; ++i) same = same && t->shape[i] == cfg.q.view->shape[i];
  same = same && t->shape[rank - 1] == cfg.v.view->shape[rank - 1];
  if (!same) {
    if (cfg.problem.head_dim == cfg.problem.head_dim_v) expect_same_shape(c, cfg.q);
    std::string want = "[";
    for (int i = 0; i < rank; ++i) {
      if (i) want += ", ";
      want += std::to_string(i + 1 < rank ? cfg.q.view->shape[i] : cfg.v.view->shape[i]);
    }
    want += "]";
    fail(FLASHATTN_ERROR_INVALID_SHAPE,
         "%s: shape %s, expected %s (q's sizes with v's head_dim)", name, shape_string(t).c_str(),
         want.c_str());
  }
  return c;
}

CheckedView check_like(const char* name, const flashattn_tensor_t* t, const CheckedView& ref,
                       const Configuration& cfg, bool output) {
  CheckedView c = check_view(name, t, *cfg.heads, output, true);
  expect_same_dtype(c, ref);
  expect_same_shape(c, ref);
  return c;
}

CheckedView check_lse(const flashattn_tensor_t* lse, const Configuration& cfg, bool output) {
  CheckedView c = check_view("lse", lse, *cfg.lse, output, true);
  expect_dtype(c, FLASHATTN_DTYPE_FLOAT32);
  const Problem& p = cfg.problem;
  if (p.varlen) {
    if (lse->shape[0] != p.heads_q || lse->shape[1] != p.total_q) {
      fail(FLASHATTN_ERROR_INVALID_SHAPE,
           "lse: shape %s, expected [heads_q, total_q] = %s", shape_string(lse).c_str(),
           shape_string({p.heads_q, p.total_q}).c_str());
    }
    return c;
  }
  if (lse->shape[0] != p.batch || lse->shape[1] != p.heads_q || lse->shape[2] != p.seqlen_q) {
    fail(FLASHATTN_ERROR_INVALID_SHAPE,
         "lse: shape %s, expected [batch, heads_q, seqlen_q] = %s", shape_string(lse).c_str(),
         shape_string({p.batch, p.heads_q, p.seqlen_q}).c_str());
  }
  return c;
}

VariantViews variant_views(const flashattn_args_t& a) {
  VariantViews r;
  if (a.alibi_slopes != nullptr) {
    r.alibi.data = static_cast<const float*>(a.alibi_slopes->data);
    r.alibi.stride_batch = a.alibi_slopes->rank == 2 ? a.alibi_slopes->strides[0] : 0;
    r.alibi.stride_head = a.alibi_slopes->strides[a.alibi_slopes->rank - 1];
  }
  r.sinks = vector_view<const float>(a.sinks);
  r.cu_seqlens_q = vector_view<const int32_t>(a.cu_seqlens_q);
  r.cu_seqlens_k = vector_view<const int32_t>(a.cu_seqlens_k);
  r.cache_seqlens = vector_view<const int32_t>(a.cache_seqlens);
  if (a.block_table != nullptr) {
    r.block_table.data = static_cast<const int32_t*>(a.block_table->data);
    r.block_table.stride_batch = a.block_table->strides[0];
    r.block_table.stride_page = a.block_table->strides[1];
    r.block_table.page_size = a.k->shape[1];
  }
  return r;
}

RotaryTable rotary_table(const flashattn_tensor_t* t) {
  RotaryTable r;
  if (t == nullptr) return r;
  r.data = t->data;
  r.stride_pos = t->strides[0];
  r.stride_pair = t->strides[1];
  return r;
}

CacheUpdate cache_update(const flashattn_args_t& a) {
  CacheUpdate c;
  if (a.cache_seqlens == nullptr) return c;
  if (a.k_new != nullptr) {
    c.k_new = tensor4(a.k_new);
    c.v_new = tensor4(a.v_new);
  }
  c.cos = rotary_table(a.rotary_cos);
  c.sin = rotary_table(a.rotary_sin);
  return c;
}

void keep_views(const Configuration& cfg, std::vector<CheckedView>* views) {
  views->push_back(cfg.q);
  views->push_back(cfg.k);
  views->push_back(cfg.v);
  views->insert(views->end(), cfg.variant_views.begin(), cfg.variant_views.end());
  views->insert(views->end(), cfg.cache_inputs.begin(), cfg.cache_inputs.end());
}

}  // namespace

Problem validate_problem(const flashattn_args_t& args, bool backward) {
  Configuration cfg = configuration_of(args, CallKind{backward, false});
  if (backward && args.dsinks != nullptr) {
    check_per_head("dsinks", args.dsinks, cfg.problem, false, true, false);
  }
  return cfg.problem;
}

ForwardArgs validate_forward(const flashattn_args_t& args, std::vector<CheckedView>* views) {
  const Configuration cfg = configuration_of(args, CallKind{false, true});
  keep_views(cfg, views);
  views->push_back(check_output_like("out", args.out, cfg, true));
  if (args.lse != nullptr) views->push_back(check_lse(args.lse, cfg, /*output=*/true));
  check_aliasing(*views);
  ForwardArgs a;
  a.problem = cfg.problem;
  a.q = tensor4(args.q);
  a.k = tensor4(args.k);
  a.v = tensor4(args.v);
  a.out = tensor4(args.out);
  a.lse = lse_view(args.lse);
  a.variants = variant_views(args);
  a.cache = cache_update(args);
  a.problem.unaligned_rows = unaligned_rows_of(a);
  return a;
}

BackwardArgs validate_backward(const flashattn_args_t& args, std::vector<CheckedView>* views) {
  const Configuration cfg = configuration_of(args, CallKind{true, true});
  keep_views(cfg, views);
  views->push_back(check_output_like("out", args.out, cfg, false));
  views->push_back(check_output_like("dout", args.dout, cfg, false));
  if (args.lse == nullptr) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "lse is NULL; the backward needs the forward's lse");
  }
  views->push_back(check_lse(args.lse, cfg, /*output=*/false));
  views->push_back(check_like("dq", args.dq, cfg.q, cfg, true));
  views->push_back(check_like("dk", args.dk, cfg.k, cfg, true));
  views->push_back(check_like("dv", args.dv, cfg.v, cfg, true));
  if (args.dsinks != nullptr) {
    views->push_back(check_per_head("dsinks", args.dsinks, cfg.problem, false, true, true));
  }
  check_aliasing(*views);
  BackwardArgs a;
  a.problem = cfg.problem;
  a.q = tensor4(args.q);
  a.k = tensor4(args.k);
  a.v = tensor4(args.v);
  a.out = tensor4(args.out);
  a.dout = tensor4(args.dout);
  a.lse = lse_view(args.lse);
  a.dq = tensor4(args.dq);
  a.dk = tensor4(args.dk);
  a.dv = tensor4(args.dv);
  a.variants = variant_views(args);
  a.dsinks = vector_view<float>(args.dsinks);
  a.problem.unaligned_rows = unaligned_rows_of(a);
  return a;
}

// ---- Merge ----------------------------------------------------------------------------------

namespace {

// The most bytes a parts view may span, as any one view (check_view).
constexpr uint64_t kMaxSpanBytes = uint64_t(1) << 56;

// One part of a parts view: the first part's view moved by `part` part strides.
flashattn_tensor_t part_view(const flashattn_tensor_t* first, int64_t part, int64_t stride,
                             size_t elem) {
  flashattn_tensor_t t = *first;
  t.data = static_cast<char*>(first->data) + part * stride * static_cast<int64_t>(elem);
  return t;
}

// The view of every part, its extent covering the last part: what the memory checks look at.
CheckedView all_parts(CheckedView first, const char* name, int64_t parts, int64_t stride) {
  int64_t last_offset, extent;
  if (__builtin_mul_overflow(parts - 1, stride, &last_offset) ||
      __builtin_mul_overflow(last_offset, static_cast<int64_t>(first.elem_size), &last_offset) ||
      __builtin_add_overflow(last_offset, static_cast<int64_t>(first.extent_bytes), &extent) ||
      static_cast<uint64_t>(extent) > kMaxSpanBytes) {
    fail(FLASHATTN_ERROR_INVALID_STRIDE,
         "%s: %lld parts %lld elements apart span more than 2^56 bytes", name,
         static_cast<long long>(parts), static_cast<long long>(stride));
  }
  first.name = name;
  first.extent_bytes = static_cast<size_t>(extent);
  return first;
}

bool same_view(const flashattn_tensor_t& a, const flashattn_tensor_t& b) {
  if (a.data != b.data || a.dtype != b.dtype || a.rank != b.rank) return false;
  for (int i = 0; i < a.rank; ++i) {
    if (a.shape[i] != b.shape[i] || a.strides[i] != b.strides[i]) return false;
  }
  return true;
}

// An output against every part of a parts view: it may be one part exactly (in place: each
// element is read before it is written, by the same thread), or share no byte with it.
void check_output_against_parts(const CheckedView& output, const CheckedView& parts,
                                const CheckedView& first, int64_t count, int64_t stride,
                                bool may_coincide) {
  const uintptr_t po = reinterpret_cast<uintptr_t>(output.view->data);
  const uintptr_t pp = reinterpret_cast<uintptr_t>(parts.view->data);
  // Spans apart (tested without forming an end address): nothing to look at part by part.
  if (po <= pp ? pp - po >= output.extent_bytes : po - pp >= parts.extent_bytes) return;
  for (int64_t p = 0; p < count; ++p) {
    const flashattn_tensor_t t = part_view(first.view, p, stride, first.elem_size);
    if (may_coincide && same_view(*output.view, t)) continue;
    CheckedView c = first;
    c.view = &t;
    if (views_may_overlap(output, c)) {
      fail(FLASHATTN_ERROR_INVALID_MEMORY,
           "%s: shares memory with part %lld of %s (only that very view, in place, may)",
           output.name, static_cast<long long>(p), parts.name);
    }
  }
}

}  // namespace

MergeArgs validate_merge(const flashattn_merge_args_t& a, std::vector<CheckedView>* views) {
  if (a.parts_out == nullptr) fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "parts_out is NULL");
  if (a.parts_lse == nullptr) fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "parts_lse is NULL");
  if (a.out == nullptr) fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "out is NULL");
  if (a.num_parts < 1) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "args: num_parts is %lld, must be >= 1",
         static_cast<long long>(a.num_parts));
  }
  if (a.num_parts > kMaxDim) {
    fail(FLASHATTN_ERROR_INVALID_SHAPE, "args: num_parts is %lld, exceeds 2^31 - 1",
         static_cast<long long>(a.num_parts));
  }
  const struct {
    const char* name;
    int64_t value;
  } part_strides[] = {{"parts_out_stride", a.parts_out_stride},
                      {"parts_lse_stride", a.parts_lse_stride}};
  for (const auto& ps : part_strides) {
    if (ps.value < 0) {
      fail(FLASHATTN_ERROR_INVALID_STRIDE, "args: %s is %lld, must be >= 0", ps.name,
           static_cast<long long>(ps.value));
    }
  }
  // A packed variable-length batch when parts_out has rank 3; rank 4 otherwise (and the
  // message for any other rank names the fixed-length layout).
  const bool packed = a.parts_out->rank == 3;
  const ViewKind& heads_kind = packed ? kHeads3 : kHeads4;
  const ViewKind& lse_kind = packed ? kLse2 : kLse3;
  const CheckedView parts_out = check_view("parts_out", a.parts_out, heads_kind, false, true);
  expect_floating(parts_out);
  const CheckedView parts_lse = check_view("parts_lse", a.parts_lse, lse_kind, false, true);
  expect_dtype(parts_lse, FLASHATTN_DTYPE_FLOAT32);
  const flashattn_tensor_t* po = a.parts_out;
  const flashattn_tensor_t* pl = a.parts_lse;
  const int64_t batch = packed ? 1 : po->shape[0];
  const int64_t seqlen = packed ? po->shape[0] : po->shape[1];
  const int64_t heads = po->shape[heads_kind.rank - 2];
  const int64_t head_dim = po->shape[heads_kind.rank - 1];
  const bool lse_fits = packed ? pl->shape[0] == heads && pl->shape[1] == seqlen
                               : pl->shape[0] == batch && pl->shape[1] == heads &&
                                     pl->shape[2] == seqlen;
  if (!lse_fits) {
    fail(FLASHATTN_ERROR_INVALID_SHAPE, "parts_lse: shape %s, expected %s = %s (parts_out's)",
         shape_string(pl).c_str(), lse_kind.layout,
         packed ? shape_string({heads, seqlen}).c_str()
                : shape_string({batch, heads, seqlen}).c_str());
  }
  const CheckedView out = check_view("out", a.out, heads_kind, true, true);
  expect_same_dtype(out, parts_out);
  expect_same_shape(out, parts_out);
  CheckedView lse;
  if (a.lse != nullptr) {
    lse = check_view("lse", a.lse, lse_kind, true, true);
    expect_dtype(lse, FLASHATTN_DTYPE_FLOAT32);
    expect_same_shape(lse, parts_lse);
  }
  const CheckedView all_out = all_parts(parts_out, "parts_out", a.num_parts, a.parts_out_stride);
  const CheckedView all_lse = all_parts(parts_lse, "parts_lse", a.num_parts, a.parts_lse_stride);
  // Aliasing: out and lse each against both parts views; and against each other. out against
  // the LSEs first: an out laid over the (small) LSEs runs on past them into whatever memory
  // follows, the outputs' buffer too if the heap put it there; the report should not depend on
  // where the heap put it.
  for (const CheckedView* v : {&all_out, &all_lse, &out}) check_starts_in_buffer(*v);
  if (a.lse != nullptr) check_starts_in_buffer(lse);
  check_output_against_parts(out, all_lse, parts_lse, a.num_parts, a.parts_lse_stride, false);
  check_output_against_parts(out, all_out, parts_out, a.num_parts, a.parts_out_stride, true);
  if (a.lse != nullptr) {
    check_output_against_parts(lse, all_lse, parts_lse, a.num_parts, a.parts_lse_stride, true);
    check_output_against_parts(lse, all_out, parts_out, a.num_parts, a.parts_out_stride, false);
    if (views_may_overlap(lse, out)) {
      fail(FLASHATTN_ERROR_INVALID_MEMORY, "lse: shares memory with out");
    }
  }
  views->push_back(all_out);
  views->push_back(all_lse);
  views->push_back(out);
  if (a.lse != nullptr) views->push_back(lse);

  MergeArgs m;
  m.dtype = static_cast<DType>(po->dtype);
  m.parts = a.num_parts;
  m.batch = batch;
  m.seqlen = seqlen;
  m.heads = heads;
  m.head_dim = head_dim;
  m.parts_out = tensor4(po);
  m.parts_out_stride = a.parts_out_stride;
  m.parts_lse = lse_view(pl);
  m.parts_lse_stride = a.parts_lse_stride;
  m.out = tensor4(a.out);
  m.lse = lse_view(a.lse);
  return m;
}

}  // namespace flashattn
