#include "api/validate.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.hpp"

namespace flashattn {

namespace {

constexpr int64_t kMaxDim = (int64_t(1) << 31) - 1;  // kernels index sizes with 32-bit ints
constexpr int64_t kMaxHeadDim = 256;
constexpr size_t kMaxOptionsSize = 4096;

const char* const kDimNames4[4] = {"batch", "seqlen", "heads", "head_dim"};
const char* const kDimNamesLse[3] = {"batch", "heads", "seqlen"};

std::string shape_string(const flashattn_tensor_t* t) {
  std::string s = "[";
  for (int i = 0; i < t->rank; ++i) {
    if (i) s += ", ";
    s += std::to_string(t->shape[i]);
  }
  return s + "]";
}

const char* dtype_string(flashattn_dtype_t t) {
  switch (t) {
    case FLASHATTN_DTYPE_FLOAT32: return "float32";
    case FLASHATTN_DTYPE_FLOAT16: return "float16";
    case FLASHATTN_DTYPE_BFLOAT16: return "bfloat16";
  }
  return "unknown";
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

// The element-level checks of one view: dtype, rank, sizes, strides, extent.
CheckedView check_view(const char* name, const flashattn_tensor_t* t, int rank, bool output,
                       bool need_data) {
  if (t == nullptr) fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "%s is NULL", name);
  const int32_t dtype = enum_bits(t->dtype);
  if (dtype != FLASHATTN_DTYPE_FLOAT32 && dtype != FLASHATTN_DTYPE_FLOAT16 &&
      dtype != FLASHATTN_DTYPE_BFLOAT16) {
    fail(FLASHATTN_ERROR_INVALID_DTYPE, "%s: unknown dtype %d", name, static_cast<int>(dtype));
  }
  const char* const* dim_names = rank == 4 ? kDimNames4 : kDimNamesLse;
  if (t->rank != rank) {
    fail(FLASHATTN_ERROR_INVALID_SHAPE, "%s: rank is %d, expected %d (%s)", name, t->rank, rank,
         rank == 4 ? "[batch, seqlen, heads, head_dim]" : "[batch, heads, seqlen]");
  }
  for (int i = 0; i < rank; ++i) {
    if (t->shape[i] < 1) {
      fail(FLASHATTN_ERROR_INVALID_SHAPE, "%s: shape[%d] (%s) is %lld, must be >= 1", name, i,
           dim_names[i], static_cast<long long>(t->shape[i]));
    }
    if (t->shape[i] > kMaxDim) {
      fail(FLASHATTN_ERROR_INVALID_SHAPE, "%s: shape[%d] (%s) is %lld, exceeds 2^31 - 1", name, i,
           dim_names[i], static_cast<long long>(t->shape[i]));
    }
    if (t->strides[i] < 0) {
      fail(FLASHATTN_ERROR_INVALID_STRIDE, "%s: strides[%d] (%s) is %lld, must be >= 0", name, i,
           dim_names[i], static_cast<long long>(t->strides[i]));
    }
  }
  if (rank == 4 && t->strides[3] != 1) {
    fail(FLASHATTN_ERROR_INVALID_STRIDE, "%s: strides[3] (head_dim) is %lld, must be 1", name,
         static_cast<long long>(t->strides[3]));
  }
  const size_t elem = t->dtype == FLASHATTN_DTYPE_FLOAT32 ? 4 : 2;
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

void expect_same_dtype(const CheckedView& a, const CheckedView& ref) {
  if (a.view->dtype != ref.view->dtype) {
    fail(FLASHATTN_ERROR_INVALID_DTYPE, "%s: dtype %s differs from %s's %s", a.name,
         dtype_string(a.view->dtype), ref.name, dtype_string(ref.view->dtype));
  }
}

void expect_dim(const CheckedView& a, int dim, const CheckedView& ref, int ref_dim) {
  if (a.view->shape[dim] != ref.view->shape[ref_dim]) {
    fail(FLASHATTN_ERROR_INVALID_SHAPE, "%s: %s %lld differs from %s's %lld", a.name,
         kDimNames4[dim], static_cast<long long>(a.view->shape[dim]), ref.name,
         static_cast<long long>(ref.view->shape[ref_dim]));
  }
}

void expect_same_shape(const CheckedView& a, const CheckedView& ref) {
  for (int i = 0; i < 4; ++i) {
    if (a.view->shape[i] != ref.view->shape[i]) {
      fail(FLASHATTN_ERROR_INVALID_SHAPE, "%s: shape %s differs from %s's %s", a.name,
           shape_string(a.view).c_str(), ref.name, shape_string(ref.view).c_str());
    }
  }
}

CheckedView check_lse(const flashattn_tensor_t* lse, const Problem& p, bool output) {
  CheckedView c = check_view("lse", lse, 3, output, true);
  if (lse->dtype != FLASHATTN_DTYPE_FLOAT32) {
    fail(FLASHATTN_ERROR_INVALID_DTYPE, "lse: dtype %s, must be float32", dtype_string(lse->dtype));
  }
  const int64_t want[3] = {p.batch, p.heads_q, p.seqlen_q};
  if (lse->shape[0] != want[0] || lse->shape[1] != want[1] || lse->shape[2] != want[2]) {
    fail(FLASHATTN_ERROR_INVALID_SHAPE,
         "lse: shape %s, expected [batch, heads_q, seqlen_q] = [%lld, %lld, %lld]",
         shape_string(lse).c_str(), static_cast<long long>(want[0]),
         static_cast<long long>(want[1]), static_cast<long long>(want[2]));
  }
  return c;
}

Tensor4 tensor4(const flashattn_tensor_t* t) {
  Tensor4 r;
  r.data = t->data;
  r.stride_batch = t->strides[0];
  r.stride_seq = t->strides[1];
  r.stride_head = t->strides[2];
  return r;
}

LseView lse_view(const flashattn_tensor_t* t) {
  LseView r;
  if (t == nullptr) return r;
  r.data = static_cast<float*>(t->data);
  r.stride_batch = t->strides[0];
  r.stride_head = t->strides[1];
  r.stride_seq = t->strides[2];
  return r;
}

// Outputs may share no byte with any other view.
void check_aliasing(const std::vector<CheckedView>& views) {
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
  o.size = sizeof(o);
  o.softmax_scale = 0.0f;
  o.causal = 0;
  o.algorithm = FLASHATTN_ALGORITHM_FLASH;
  o.deterministic = 0;
  if (options == nullptr) return o;
  const size_t size = options->size;
  if (size < sizeof(size_t)) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
         "options: size is %zu; fill the struct with flashattn_options_init() or "
         "FLASHATTN_OPTIONS_INIT",
         size);
  }
  if (size > kMaxOptionsSize) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "options: size %zu is not a plausible struct size",
         size);
  }
  // A size that ends inside a field would hand the library half a value.
  const size_t field_ends[] = {offsetof(flashattn_options_t, softmax_scale) + sizeof(float),
                               offsetof(flashattn_options_t, causal) + sizeof(int32_t),
                               offsetof(flashattn_options_t, algorithm) + sizeof(int32_t),
                               offsetof(flashattn_options_t, deterministic) + sizeof(int32_t)};
  if (size > sizeof(size_t) && size < sizeof(o)) {
    bool at_field_end = false;
    for (size_t end : field_ends) at_field_end = at_field_end || size == end;
    if (!at_field_end) {
      fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
           "options: size %zu ends inside a field (fields end at 12, 16, 20 and %zu bytes)", size,
           sizeof(o));
    }
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(options);
  for (size_t i = sizeof(o); i < size; ++i) {
    if (bytes[i] != 0) {
      fail(FLASHATTN_ERROR_UNSUPPORTED,
           "options: fields past the %zu bytes this library knows are set; they need a newer "
           "flashattn",
           sizeof(o));
    }
  }
  std::memcpy(reinterpret_cast<unsigned char*>(&o) + sizeof(size_t), bytes + sizeof(size_t),
              std::min(size, sizeof(o)) - sizeof(size_t));
  o.size = sizeof(o);
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
  return o;
}

namespace {

Problem problem_of(const flashattn_tensor_t* q, const flashattn_tensor_t* k,
                   const flashattn_tensor_t* v, const flashattn_options_t* options,
                   bool need_data, std::vector<CheckedView>* views) {
  const flashattn_options_t o = read_options(options);
  CheckedView cq = check_view("q", q, 4, false, need_data);
  CheckedView ck = check_view("k", k, 4, false, need_data);
  CheckedView cv = check_view("v", v, 4, false, need_data);
  expect_same_dtype(ck, cq);
  expect_same_dtype(cv, cq);
  expect_dim(ck, 0, cq, 0);
  expect_dim(cv, 0, cq, 0);
  expect_dim(ck, 3, cq, 3);
  expect_dim(cv, 3, cq, 3);
  expect_dim(cv, 1, ck, 1);
  expect_dim(cv, 2, ck, 2);
  if (q->shape[3] > kMaxHeadDim) {
    fail(FLASHATTN_ERROR_INVALID_SHAPE, "q: head_dim %lld exceeds the maximum %lld",
         static_cast<long long>(q->shape[3]), static_cast<long long>(kMaxHeadDim));
  }
  if (q->shape[2] % k->shape[2] != 0) {
    fail(FLASHATTN_ERROR_INVALID_SHAPE,
         "q: heads %lld is not a multiple of k's heads %lld (GQA/MQA needs heads_q = g * heads_kv)",
         static_cast<long long>(q->shape[2]), static_cast<long long>(k->shape[2]));
  }
  Problem p;
  p.dtype = static_cast<DType>(q->dtype);
  p.batch = q->shape[0];
  p.seqlen_q = q->shape[1];
  p.seqlen_k = k->shape[1];
  p.heads_q = q->shape[2];
  p.heads_kv = k->shape[2];
  p.head_dim = q->shape[3];
  p.scale = o.softmax_scale != 0.0f ? o.softmax_scale
                                    : static_cast<float>(1.0 / std::sqrt(double(p.head_dim)));
  p.causal = o.causal != 0;
  p.algorithm = static_cast<Algorithm>(o.algorithm);
  p.deterministic = o.deterministic != 0;
  if (views != nullptr) {
    views->push_back(cq);
    views->push_back(ck);
    views->push_back(cv);
  }
  return p;
}

CheckedView check_like(const char* name, const flashattn_tensor_t* t, const CheckedView& ref,
                       bool output) {
  CheckedView c = check_view(name, t, 4, output, true);
  expect_same_dtype(c, ref);
  expect_same_shape(c, ref);
  return c;
}

}  // namespace

Problem validate_problem(const flashattn_tensor_t* q, const flashattn_tensor_t* k,
                         const flashattn_tensor_t* v, const flashattn_options_t* options,
                         std::vector<CheckedView>* views) {
  return problem_of(q, k, v, options, false, views);
}

ForwardArgs validate_forward(const flashattn_tensor_t* q, const flashattn_tensor_t* k,
                             const flashattn_tensor_t* v, const flashattn_tensor_t* out,
                             const flashattn_tensor_t* lse, const flashattn_options_t* options,
                             std::vector<CheckedView>* views) {
  ForwardArgs a;
  a.problem = problem_of(q, k, v, options, true, views);
  const CheckedView& cq = (*views)[0];
  views->push_back(check_like("out", out, cq, true));
  if (lse != nullptr) views->push_back(check_lse(lse, a.problem, /*output=*/true));
  check_aliasing(*views);
  a.q = tensor4(q);
  a.k = tensor4(k);
  a.v = tensor4(v);
  a.out = tensor4(out);
  a.lse = lse_view(lse);
  return a;
}

BackwardArgs validate_backward(const flashattn_tensor_t* q, const flashattn_tensor_t* k,
                               const flashattn_tensor_t* v, const flashattn_tensor_t* out,
                               const flashattn_tensor_t* dout, const flashattn_tensor_t* lse,
                               const flashattn_tensor_t* dq, const flashattn_tensor_t* dk,
                               const flashattn_tensor_t* dv, const flashattn_options_t* options,
                               std::vector<CheckedView>* views) {
  BackwardArgs a;
  a.problem = problem_of(q, k, v, options, true, views);
  const CheckedView cq = (*views)[0];
  const CheckedView ck = (*views)[1];
  const CheckedView cv = (*views)[2];
  views->push_back(check_like("out", out, cq, false));
  views->push_back(check_like("dout", dout, cq, false));
  if (lse == nullptr) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "lse is NULL; the backward needs the forward's lse");
  }
  views->push_back(check_lse(lse, a.problem, /*output=*/false));
  views->push_back(check_like("dq", dq, cq, true));
  views->push_back(check_like("dk", dk, ck, true));
  views->push_back(check_like("dv", dv, cv, true));
  check_aliasing(*views);
  a.q = tensor4(q);
  a.k = tensor4(k);
  a.v = tensor4(v);
  a.out = tensor4(out);
  a.dout = tensor4(dout);
  a.lse = lse_view(lse);
  a.dq = tensor4(dq);
  a.dk = tensor4(dk);
  a.dv = tensor4(dv);
  return a;
}

}  // namespace flashattn
