#include "common/merge_check.hpp"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "common/reference.hpp"
#include "common/tolerance.hpp"

namespace flashattn_test {
namespace {

// The view of rows [start, start + count) of dimension `dim`.
flashattn_tensor_t slice(flashattn_tensor_t t, int dim, int64_t start, int64_t count) {
  t.data = static_cast<char*>(t.data) +
           start * t.strides[dim] * static_cast<int64_t>(dtype_bytes(t.dtype));
  t.shape[dim] = count;
  return t;
}

void check(const Comparison& cmp, const MergeSplitCase& c) {
  INFO(c.name());
  CHECK_MESSAGE(cmp.ok, cmp.message);
}

}  // namespace

std::string MergeSplitCase::name() const {
  std::string s = std::string(dtype_label(dtype)) + " B" + std::to_string(batch) + " Nq" +
                  std::to_string(seqlen_q) + " Nk" + std::to_string(seqlen_k) + " Hq" +
                  std::to_string(heads_q) + " Hkv" + std::to_string(heads_kv) + " D" +
                  std::to_string(head_dim) + (causal ? " causal" : "") + " parts {";
  for (size_t i = 0; i < bounds.size(); ++i) s += (i ? "," : "") + std::to_string(bounds[i]);
  s += "}";
  if (pad > 0) s += " pad" + std::to_string(pad);
  if (in_place) s += " in place";
  if (!with_lse) s += " no lse";
  return s;
}

MergeSplitCase split(flashattn_dtype_t dtype, int64_t b, int64_t nq, int64_t nk, int64_t hq,
                     int64_t hkv, int64_t d, bool causal, std::vector<int64_t> bounds) {
  MergeSplitCase c;
  c.dtype = dtype;
  c.batch = b;
  c.seqlen_q = nq;
  c.seqlen_k = nk;
  c.heads_q = hq;
  c.heads_kv = hkv;
  c.head_dim = d;
  c.causal = causal;
  c.bounds = std::move(bounds);
  c.seed = static_cast<uint64_t>(nq * 31 + nk * 7 + d + static_cast<int>(dtype) * 100);
  return c;
}

flashattn_options_t part_options(const MergeSplitCase& c, int64_t end) {
  flashattn_options_t o;
  flashattn_options_init(&o);
  o.algorithm = c.algorithm;
  if (c.causal) {
    // The part's diagonal lies seqlen_k - end keys before the whole range's.
    o.window = 1;
    o.window_left = -1;
    o.window_right = static_cast<int32_t>(c.seqlen_k - end);
  }
  return o;
}

void check_merge_split(const MergeSplitCase& c, MergeMemory& memory) {
  INFO(c.name());
  REQUIRE(c.parts() >= 1);
  REQUIRE(c.bounds.front() == 0);
  REQUIRE(c.bounds.back() == c.seqlen_k);
  flashattn_context_t ctx = memory.context();
  const int64_t B = c.batch, Nq = c.seqlen_q, Nk = c.seqlen_k, Hq = c.heads_q, D = c.head_dim;
  const int64_t P = c.parts();
  HostTensor q = HostTensor::make(c.dtype, B, Nq, Hq, D);
  HostTensor k = HostTensor::make(c.dtype, B, Nk, c.heads_kv, D);
  HostTensor v = HostTensor::make(c.dtype, B, Nk, c.heads_kv, D);
  q.fill_normal(c.seed);
  k.fill_normal(c.seed + 1);
  v.fill_normal(c.seed + 2);
  // The parts as [P * (B + gap), ...]: part p is batch entries p * (B + gap) .. + B.
  const int64_t gap = c.pad > 0 ? 1 : 0;
  const int64_t entries = P * (B + gap);
  HostTensor parts = HostTensor::padded(c.dtype, entries, Nq, Hq, D, c.pad, c.pad, c.pad);
  HostTensor parts_lse = HostTensor::lse(entries, Hq, Nq);
  parts.poison();
  parts_lse.poison();
  const double neg_inf = -std::numeric_limits<double>::infinity();
  for (int64_t p = 0; p < P; ++p) {
    if (c.bounds[p] != c.bounds[p + 1]) continue;
    for (int64_t b = 0; b < B; ++b)  // an empty part: no key, LSE -inf; its output stays NaN
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t i = 0; i < Nq; ++i) parts_lse.set(p * (B + gap) + b, h, i, 0, neg_inf);
  }
  HostTensor whole_out = HostTensor::make(c.dtype, B, Nq, Hq, D);
  HostTensor whole_lse = HostTensor::lse(B, Hq, Nq);
  whole_out.poison();
  whole_lse.poison();
  HostTensor out = HostTensor::padded(c.dtype, B, Nq, Hq, D, c.pad, c.pad, c.pad);
  HostTensor lse = HostTensor::lse(B, Hq, Nq);
  out.poison();
  lse.poison();
  const std::vector<unsigned char> out_before = out.snapshot();

  const flashattn_tensor_t vq = memory.place(q), vk = memory.place(k), vv = memory.place(v);
  const flashattn_tensor_t vparts = memory.place(parts), vparts_lse = memory.place(parts_lse);
  const flashattn_tensor_t vwhole = memory.place(whole_out);
  const flashattn_tensor_t vwhole_lse = memory.place(whole_lse);
  const flashattn_tensor_t vout = memory.place(out), vlse = memory.place(lse);

  auto forward = [&](const flashattn_tensor_t& kp, const flashattn_tensor_t& vp,
                     const flashattn_tensor_t& o, const flashattn_tensor_t& l, int64_t end) {
    const flashattn_options_t options = part_options(c, end);
    const flashattn_status_t s = flashattn_forward(ctx, &vq, &kp, &vp, &o, &l, &options, nullptr, 0);
    REQUIRE_MESSAGE(s == FLASHATTN_SUCCESS, std::string(flashattn_last_error()));
  };
  forward(vk, vv, vwhole, vwhole_lse, Nk);
  for (int64_t p = 0; p < P; ++p) {
    const int64_t begin = c.bounds[p], end = c.bounds[p + 1];
    if (begin == end) continue;
    forward(slice(vk, 1, begin, end - begin), slice(vv, 1, begin, end - begin),
            slice(vparts, 0, p * (B + gap), B), slice(vparts_lse, 0, p * (B + gap), B), end);
  }

  flashattn_merge_args_t args;
  flashattn_merge_args_init(&args);
  const flashattn_tensor_t first = slice(vparts, 0, 0, B);
  const flashattn_tensor_t first_lse = slice(vparts_lse, 0, 0, B);
  args.num_parts = P;
  args.parts_out = &first;
  args.parts_out_stride = (B + gap) * vparts.strides[0];
  args.parts_lse = &first_lse;
  args.parts_lse_stride = (B + gap) * vparts_lse.strides[0];
  args.out = c.in_place ? &first : &vout;
  args.lse = !c.with_lse ? nullptr : c.in_place ? &first_lse : &vlse;
  const flashattn_status_t s = flashattn_merge(ctx, &args);
  REQUIRE_MESSAGE(s == FLASHATTN_SUCCESS, std::string(flashattn_last_error()));
  REQUIRE(flashattn_context_synchronize(ctx) == FLASHATTN_SUCCESS);
  memory.fetch(parts);
  memory.fetch(parts_lse);
  memory.fetch(whole_out);
  memory.fetch(whole_lse);
  memory.fetch(out);
  memory.fetch(lse);

  CHECK_MESSAGE(out.changed_outside(out_before) == -1, "the merge wrote outside out");
  // The merged result in the reference's order: out [B, Nq, Hq, D], lse [B, Hq, Nq].
  std::vector<double> got_out, got_lse;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < Nq; ++i)
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t x = 0; x < D; ++x)
          got_out.push_back(c.in_place ? parts.get(b, i, h, x) : out.get(b, i, h, x));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < Nq; ++i)
        got_lse.push_back(c.in_place ? parts_lse.get(b, h, i) : lse.get(b, h, i));

  RefProblem rp;
  rp.batch = B;
  rp.seqlen_q = Nq;
  rp.seqlen_k = Nk;
  rp.heads_q = Hq;
  rp.heads_kv = c.heads_kv;
  rp.head_dim = D;
  rp.scale = library_scale(D);
  rp.causal = c.causal;
  std::vector<double> ref_out, ref_lse;
  reference_forward(rp, q.to_double(), k.to_double(), v.to_double(), &ref_out, &ref_lse);
  const std::vector<double> base_out = whole_out.to_double(), base_lse = whole_lse.to_double();

  check(check_no_nan("merged out", got_out), c);
  check(check_rule("merged out", got_out, base_out, ref_out, dtype_atol(c.dtype)), c);
  if (c.with_lse) {
    check(check_no_nan("merged lse", got_lse), c);
    check(check_rule("merged lse", got_lse, base_lse, ref_lse,
                     dtype_atol(FLASHATTN_DTYPE_FLOAT32)), c);
  } else if (!c.in_place) {
    bool untouched = true;
    for (double x : lse.to_double()) untouched = untouched && std::isnan(x);
    CHECK_MESSAGE(untouched, "lse was written though not asked for");
  }
  // Rows that see no key of any part: exactly 0 and -inf.
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < Nq; ++i) {
        const size_t r = static_cast<size_t>((b * Hq + h) * Nq + i);
        if (!std::isinf(ref_lse[r])) continue;
        if (c.with_lse) CHECK_MESSAGE(got_lse[r] == neg_inf, "lse of a row that sees no key");
        for (int64_t x = 0; x < D; ++x) {
          CHECK(got_out[static_cast<size_t>(((b * Nq + i) * Hq + h) * D + x)] == 0.0);
        }
      }
}

}  // namespace flashattn_test
