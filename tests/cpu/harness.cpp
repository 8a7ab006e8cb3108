#include "cpu/harness.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <doctest/doctest.h>

namespace flashattn_test {

CpuContext::CpuContext(int threads) {
  REQUIRE(flashattn_context_create(&ctx_, FLASHATTN_BACKEND_CPU, 0) == FLASHATTN_SUCCESS);
  REQUIRE(flashattn_context_set_num_threads(ctx_, threads) == FLASHATTN_SUCCESS);
}

CpuContext::~CpuContext() { flashattn_context_destroy(ctx_); }

namespace {

int64_t sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

std::string lengths(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

}  // namespace

int64_t Case::total_q() const { return varlen() ? sum(seqlens_q) : batch * seqlen_q; }
int64_t Case::total_k() const { return varlen() ? sum(seqlens_k) : batch * seqlen_k; }

std::string Case::name() const {
  static const char* const layouts[] = {"contiguous", "padded", "packed-qkv", "broadcast-kv"};
  static const char* const slopes[] = {"", " alibi", " alibi[b,h]"};
  char buf[512];
  std::snprintf(
      buf, sizeof buf,
      "%s B=%lld Nq=%lld Nk=%lld Hq=%lld Hkv=%lld D=%lld Dv=%lld%s scale=%g %s threads=%d",
      dtype_label(dtype), static_cast<long long>(batch), static_cast<long long>(seqlen_q),
      static_cast<long long>(seqlen_k), static_cast<long long>(heads_q),
      static_cast<long long>(heads_kv), static_cast<long long>(head_dim),
      static_cast<long long>(dv()), causal ? " causal" : "", static_cast<double>(scale),
      layouts[static_cast<int>(layout)], threads);
  std::string s = buf;
  if (window) s += " window(" + std::to_string(window_left) + "," + std::to_string(window_right) + ")";
  if (softcap > 0) s += " softcap=" + std::to_string(softcap);
  s += slopes[static_cast<int>(alibi)];
  if (sinks) s += " sinks";
  if (num_splits > 0) s += " splits=" + std::to_string(num_splits);
  if (varlen()) s += " varlen q[" + lengths(seqlens_q) + "] k[" + lengths(seqlens_k) + "]";
  return s;
}

RefProblem Case::ref() const {
  RefProblem p;
  p.batch = batch;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.head_dim = head_dim;
  p.head_dim_v = dv();
  p.scale = library_scale(head_dim, scale);
  p.causal = causal;
  if (window) {
    p.window_left = window_left;
    p.window_right = window_right;
  }
  p.softcap = softcap;
  p.alibi_per_batch = alibi == Slopes::PerBatchHead;
  p.seqlens_q = seqlens_q;
  p.seqlens_k = seqlens_k;
  return p;
}

RefProblem Inputs::ref(const Case& c) const {
  RefProblem p = c.ref();
  if (c.alibi != Slopes::None) p.alibi = alibi.to_double();
  if (c.sinks) p.sinks = sinks.to_double();
  return p;
}

namespace {

// The storage of a [rows, heads, d] tensor of the case: [B, N, H, D], or [1, total, H, D] for a
// variable-length batch.
HostTensor shaped(const Case& c, int64_t n, int64_t total, int64_t h, int64_t d) {
  const int64_t b = c.varlen() ? 1 : c.batch;
  const int64_t rows = c.varlen() ? total : n;
  if (c.layout == Layout::Padded) return HostTensor::padded(c.dtype, b, rows, h, d, 3, 5, 7);
  return HostTensor::make(c.dtype, b, rows, h, d);
}

std::vector<int32_t> offsets(const std::vector<int64_t>& lengths) {
  std::vector<int32_t> cu(1, 0);
  for (int64_t n : lengths) cu.push_back(static_cast<int32_t>(cu.back() + n));
  return cu;
}

// A view with its leading dimension (of extent 1) dropped: [1, n, h, d] -> [n, h, d].
flashattn_tensor_t drop_batch(flashattn_tensor_t t) {
  for (int i = 1; i < t.rank; ++i) {
    t.shape[i - 1] = t.shape[i];
    t.strides[i - 1] = t.strides[i];
  }
  t.shape[t.rank - 1] = 0;
  t.strides[t.rank - 1] = 0;
  --t.rank;
  return t;
}

flashattn_tensor_t call_view(const Case& c, const HostTensor& t) {
  return c.varlen() ? drop_batch(t.view()) : t.view();
}

flashattn_tensor_t offsets_view(const std::vector<int32_t>& cu) {
  flashattn_tensor_t t{};
  t.data = const_cast<int32_t*>(cu.data());
  t.dtype = FLASHATTN_DTYPE_INT32;
  t.rank = 1;
  t.shape[0] = static_cast<int64_t>(cu.size());
  t.strides[0] = 1;
  return t;
}

// The views of a call, alive as long as this object.
struct CallViews {
  flashattn_tensor_t q, k, v, out, lse, dout, dq, dk, dv, alibi, sinks, dsinks, cu_q, cu_k;
  flashattn_options_t options;
  flashattn_args_t args;

  CallViews(const Case& c, const Inputs& in, flashattn_algorithm_t algorithm)
      : q(call_view(c, in.q)), k(call_view(c, in.k)), v(call_view(c, in.v)),
        dout(call_view(c, in.dout)), options(options_for(c, algorithm)) {
    flashattn_args_init(&args);
    args.options = &options;
    args.q = &q;
    args.k = &k;
    args.v = &v;
    if (c.alibi != Slopes::None) {
      alibi = in.alibi.view();
      args.alibi_slopes = &alibi;
    }
    if (c.sinks) {
      sinks = in.sinks.view();
      args.sinks = &sinks;
    }
    if (c.varlen()) {
      cu_q = offsets_view(in.cu_seqlens_q);
      cu_k = offsets_view(in.cu_seqlens_k);
      args.cu_seqlens_q = &cu_q;
      args.cu_seqlens_k = &cu_k;
      args.max_seqlen_q = c.seqlen_q;
      args.max_seqlen_k = c.seqlen_k;
    }
  }
};

}  // namespace

Inputs make_inputs(const Case& c) {
  Inputs in;
  const int64_t tq = c.total_q(), tk = c.total_k();
  switch (c.layout) {
    case Layout::PackedQKV: {
      REQUIRE(c.seqlen_q == c.seqlen_k);
      REQUIRE(c.total_q() == c.total_k());
      REQUIRE(c.dv() == c.head_dim);
      auto qkv = HostTensor::packed_qkv(c.dtype, c.varlen() ? 1 : c.batch,
                                        c.varlen() ? tq : c.seqlen_q, c.heads_q, c.heads_kv,
                                        c.head_dim);
      in.q = qkv[0];
      in.k = qkv[1];
      in.v = qkv[2];
      break;
    }
    case Layout::BroadcastKV:
      REQUIRE(!c.varlen());
      in.q = shaped(c, c.seqlen_q, tq, c.heads_q, c.head_dim);
      in.k = HostTensor::broadcast_batch(c.dtype, c.batch, c.seqlen_k, c.heads_kv, c.head_dim);
      in.v = HostTensor::broadcast_batch(c.dtype, c.batch, c.seqlen_k, c.heads_kv, c.dv());
      break;
    default:
      in.q = shaped(c, c.seqlen_q, tq, c.heads_q, c.head_dim);
      in.k = shaped(c, c.seqlen_k, tk, c.heads_kv, c.head_dim);
      in.v = shaped(c, c.seqlen_k, tk, c.heads_kv, c.dv());
  }
  in.dout = shaped(c, c.seqlen_q, tq, c.heads_q, c.dv());
  in.q.fill_normal(c.seed * 4 + 0);
  in.k.fill_normal(c.seed * 4 + 1);
  in.v.fill_normal(c.seed * 4 + 2);
  in.dout.fill_normal(c.seed * 4 + 3);
  if (c.alibi != Slopes::None) {
    // The slopes of the ALiBi paper, 2^(-8 h / H), and per batch entry a different multiple.
    const int64_t rows = c.alibi == Slopes::PerBatchHead ? c.batch : 1;
    in.alibi = rows == 1 && c.alibi == Slopes::PerHead ? HostTensor::vector(c.heads_q)
                                                       : HostTensor::matrix(rows, c.heads_q);
    std::vector<double> slopes;
    for (int64_t b = 0; b < rows; ++b)
      for (int64_t h = 0; h < c.heads_q; ++h)
        slopes.push_back((1.0 + 0.5 * static_cast<double>(b)) *
                         std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(c.heads_q)));
    in.alibi.from_double(slopes);
  }
  if (c.sinks) {
    // Logits around those of the scores, so that the sink takes a visible share of each row.
    in.sinks = HostTensor::vector(c.heads_q);
    in.sinks.fill_normal(c.seed * 4 + 5, 0.5, 1.0);
  }
  if (c.varlen()) {
    in.cu_seqlens_q = offsets(c.seqlens_q);
    in.cu_seqlens_k = offsets(c.seqlens_k);
  }
  return in;
}

HostTensor make_output(const Case& c, bool like_k, int64_t head_dim) {
  HostTensor t = like_k ? shaped(c, c.seqlen_k, c.total_k(), c.heads_kv, head_dim)
                        : shaped(c, c.seqlen_q, c.total_q(), c.heads_q, head_dim);
  t.poison();
  return t;
}

flashattn_options_t options_for(const Case& c, flashattn_algorithm_t algorithm) {
  flashattn_options_t o;
  flashattn_options_init(&o);
  o.softmax_scale = c.scale;
  o.causal = c.causal ? 1 : 0;
  o.algorithm = algorithm;
  if (c.window) {
    o.window = 1;
    o.window_left = c.window_left;
    o.window_right = c.window_right;
  }
  o.softcap = c.softcap;
  o.num_splits = c.num_splits;
  return o;
}

ForwardResult run_forward(flashattn_context_t ctx, const Case& c, const Inputs& in,
                          flashattn_algorithm_t algorithm, bool with_lse) {
  ForwardResult r;
  r.out = make_output(c, false, c.dv());
  r.lse = c.varlen() ? HostTensor::lse(1, c.heads_q, c.total_q())
                     : HostTensor::lse(c.batch, c.heads_q, c.seqlen_q);
  r.lse.poison();
  const auto before = r.out.snapshot();
  CallViews views(c, in, algorithm);
  views.out = call_view(c, r.out);
  views.lse = call_view(c, r.lse);
  flashattn_status_t s;
  if (c.needs_args()) {
    views.args.out = &views.out;
    views.args.lse = with_lse ? &views.lse : nullptr;
    s = flashattn_forward_ex(ctx, &views.args, nullptr, 0);
  } else {
    s = flashattn_forward(ctx, &views.q, &views.k, &views.v, &views.out,
                          with_lse ? &views.lse : nullptr, &views.options, nullptr, 0);
  }
  REQUIRE_MESSAGE(s == FLASHATTN_SUCCESS, c.name(), ": ", std::string(flashattn_last_error()));
  CHECK_MESSAGE(r.out.changed_outside(before) == -1, c.name(), ": forward wrote outside out");
  return r;
}

BackwardResult run_backward(flashattn_context_t ctx, const Case& c, const Inputs& in,
                            const ForwardResult& fwd, flashattn_algorithm_t algorithm) {
  BackwardResult r;
  r.dq = make_output(c, false, c.head_dim);
  r.dk = make_output(c, true, c.head_dim);
  r.dv = make_output(c, true, c.dv());
  const auto before_dq = r.dq.snapshot();
  const auto before_dk = r.dk.snapshot();
  const auto before_dv = r.dv.snapshot();
  CallViews views(c, in, algorithm);
  views.out = call_view(c, fwd.out);
  views.lse = call_view(c, fwd.lse);
  views.dq = call_view(c, r.dq);
  views.dk = call_view(c, r.dk);
  views.dv = call_view(c, r.dv);
  flashattn_status_t s;
  if (c.needs_args()) {
    views.args.out = &views.out;
    views.args.lse = &views.lse;
    views.args.dout = &views.dout;
    views.args.dq = &views.dq;
    views.args.dk = &views.dk;
    views.args.dv = &views.dv;
    if (c.sinks) {
      r.dsinks = HostTensor::vector(c.heads_q);
      r.dsinks.poison();
      views.dsinks = r.dsinks.view();
      views.args.dsinks = &views.dsinks;
    }
    s = flashattn_backward_ex(ctx, &views.args, nullptr, 0);
  } else {
    s = flashattn_backward(ctx, &views.q, &views.k, &views.v, &views.out, &views.dout,
                           &views.lse, &views.dq, &views.dk, &views.dv, &views.options, nullptr, 0);
  }
  REQUIRE_MESSAGE(s == FLASHATTN_SUCCESS, c.name(), ": ", std::string(flashattn_last_error()));
  CHECK_MESSAGE(r.dq.changed_outside(before_dq) == -1, c.name(), ": backward wrote outside dq");
  CHECK_MESSAGE(r.dk.changed_outside(before_dk) == -1, c.name(), ": backward wrote outside dk");
  CHECK_MESSAGE(r.dv.changed_outside(before_dv) == -1, c.name(), ": backward wrote outside dv");
  return r;
}

std::vector<QueryRow> query_rows(const Case& c) {
  std::vector<QueryRow> rows;
  if (!c.varlen()) {
    for (int64_t b = 0; b < c.batch; ++b)
      for (int64_t h = 0; h < c.heads_q; ++h)
        for (int64_t i = 0; i < c.seqlen_q; ++i)
          rows.push_back({static_cast<size_t>((b * c.heads_q + h) * c.seqlen_q + i), b, i, h});
    return rows;
  }
  for (int64_t h = 0; h < c.heads_q; ++h)
    for (int64_t t = 0; t < c.total_q(); ++t)
      rows.push_back({static_cast<size_t>(h * c.total_q() + t), 0, t, h});
  return rows;
}

namespace {

// FLASHATTN_TEST_VERBOSE=1 prints every comparison, to see how close results come to bounds.
void expect(const Comparison& cmp, const Case& c) {
  static const bool verbose = std::getenv("FLASHATTN_TEST_VERBOSE") != nullptr;
  if (verbose) std::printf("%s | %s\n", c.name().c_str(), cmp.message.c_str());
  CHECK_MESSAGE(cmp.ok, c.name(), ": ", cmp.message);
}

double rule_factor(const Case& c) { return c.softcap > 0 ? kSoftcapRuleFactor : kRuleFactor; }

}  // namespace

double standard_tolerance(flashattn_dtype_t dtype, const std::vector<double>& ref) {
  const double unit = dtype == FLASHATTN_DTYPE_FLOAT32   ? 2e-5
                      : dtype == FLASHATTN_DTYPE_FLOAT16 ? 2e-3
                                                         : 1.6e-2;
  return unit * std::max(1.0, max_abs(ref));
}

void check_forward(const Case& c) {
  INFO(c.name());
  CpuContext ctx(c.threads);
  const Inputs in = make_inputs(c);
  std::vector<double> ref_out, ref_lse;
  reference_forward(in.ref(c), in.q.to_double(), in.k.to_double(), in.v.to_double(), &ref_out,
                    &ref_lse);
  const ForwardResult flash = run_forward(ctx.get(), c, in, FLASHATTN_ALGORITHM_FLASH);
  const ForwardResult standard = run_forward(ctx.get(), c, in, FLASHATTN_ALGORITHM_STANDARD);
  const auto f_out = flash.out.to_double(), s_out = standard.out.to_double();
  const auto f_lse = flash.lse.to_double(), s_lse = standard.lse.to_double();
  const double factor = rule_factor(c);
  expect(check_no_nan("flash out", f_out), c);
  expect(check_no_nan("flash lse", f_lse), c);
  expect(check_no_nan("standard out", s_out), c);
  expect(check_no_nan("standard lse", s_lse), c);
  expect(check_rule("flash out", f_out, s_out, ref_out, dtype_atol(c.dtype), factor), c);
  expect(check_rule("flash lse", f_lse, s_lse, ref_lse, dtype_atol(FLASHATTN_DTYPE_FLOAT32), factor),
         c);
  expect(check_close("standard out", s_out, ref_out, standard_tolerance(c.dtype, ref_out)), c);
  expect(check_close("standard lse", s_lse, ref_lse,
                     standard_tolerance(FLASHATTN_DTYPE_FLOAT32, ref_lse)),
         c);
  // Rows that see no key: exactly 0 and -inf, in both algorithms.
  const int64_t D = c.dv();
  for (const QueryRow& row : query_rows(c)) {
    if (!std::isinf(ref_lse[row.lse])) continue;
    CHECK_MESSAGE(f_lse[row.lse] == -INFINITY, "flash lse of a masked row: ", f_lse[row.lse]);
    CHECK_MESSAGE(s_lse[row.lse] == -INFINITY, "standard lse of a masked row: ", s_lse[row.lse]);
    for (int64_t x = 0; x < D; ++x) {
      CHECK(flash.out.get(row.b, row.i, row.h, x) == 0.0);
      CHECK(standard.out.get(row.b, row.i, row.h, x) == 0.0);
    }
  }
}

void check_backward(const Case& c) {
  INFO(c.name());
  CpuContext ctx(c.threads);
  const Inputs in = make_inputs(c);
  std::vector<double> ref_dq, ref_dk, ref_dv, ref_dsinks;
  reference_backward(in.ref(c), in.q.to_double(), in.k.to_double(), in.v.to_double(),
                     in.dout.to_double(), &ref_dq, &ref_dk, &ref_dv,
                     c.sinks ? &ref_dsinks : nullptr);
  const ForwardResult f_fwd = run_forward(ctx.get(), c, in, FLASHATTN_ALGORITHM_FLASH);
  const BackwardResult flash = run_backward(ctx.get(), c, in, f_fwd, FLASHATTN_ALGORITHM_FLASH);
  const ForwardResult s_fwd = run_forward(ctx.get(), c, in, FLASHATTN_ALGORITHM_STANDARD);
  const BackwardResult standard =
      run_backward(ctx.get(), c, in, s_fwd, FLASHATTN_ALGORITHM_STANDARD);
  const double atol = dtype_atol(c.dtype);
  struct Grad {
    const char* name;
    const HostTensor& got;
    const HostTensor& base;
    const std::vector<double>& ref;
    double atol;
  };
  std::vector<Grad> grads = {{"dq", flash.dq, standard.dq, ref_dq, atol},
                             {"dk", flash.dk, standard.dk, ref_dk, atol},
                             {"dv", flash.dv, standard.dv, ref_dv, atol}};
  // The sinks' gradient is fp32 whatever the dtype (a sum over every row of the batch): its
  // floor is fp32's; its error comes from the dtype's outputs it is computed from, so its base
  // is the standard backward over the same forward outputs (a forward that rounds P to the
  // dtype, as the bf16 pair copies' do, moves every row's O, and a sum over rows shows it more than
  // any one output, which the forward's own rule checks).
  BackwardResult standard_on_flash;
  if (c.sinks) {
    standard_on_flash = run_backward(ctx.get(), c, in, f_fwd, FLASHATTN_ALGORITHM_STANDARD);
    grads.push_back({"dsinks", flash.dsinks, standard_on_flash.dsinks, ref_dsinks,
                     dtype_atol(FLASHATTN_DTYPE_FLOAT32)});
  }
  for (const Grad& g : grads) {
    const auto got = g.got.to_double(), base = g.base.to_double();
    expect(check_no_nan(std::string("flash ") + g.name, got), c);
    expect(check_no_nan(std::string("standard ") + g.name, base), c);
    expect(check_rule(std::string("flash ") + g.name, got, base, g.ref, g.atol, rule_factor(c)), c);
    expect(check_close(std::string("standard ") + g.name, base, g.ref,
                       standard_tolerance(c.dtype, g.ref)),
           c);
  }
}

Case shaped_case(flashattn_dtype_t dtype, int64_t batch, int64_t seqlen_q, int64_t seqlen_k,
                 int64_t heads_q, int64_t heads_kv, int64_t head_dim, bool causal, uint64_t seed) {
  Case c;
  c.dtype = dtype;
  c.batch = batch;
  c.seqlen_q = seqlen_q;
  c.seqlen_k = seqlen_k;
  c.heads_q = heads_q;
  c.heads_kv = heads_kv;
  c.head_dim = head_dim;
  c.causal = causal;
  c.seed = seed;
  return c;
}

}  // namespace flashattn_test
