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

std::string Case::name() const {
  static const char* const layouts[] = {"contiguous", "padded", "packed-qkv", "broadcast-kv"};
  char buf[256];
  std::snprintf(
      buf, sizeof buf, "%s B=%lld Nq=%lld Nk=%lld Hq=%lld Hkv=%lld D=%lld%s scale=%g %s threads=%d",
      dtype_label(dtype), static_cast<long long>(batch), static_cast<long long>(seqlen_q),
      static_cast<long long>(seqlen_k), static_cast<long long>(heads_q),
      static_cast<long long>(heads_kv), static_cast<long long>(head_dim), causal ? " causal" : "",
      static_cast<double>(scale), layouts[static_cast<int>(layout)], threads);
  return buf;
}

RefProblem Case::ref() const {
  RefProblem p;
  p.batch = batch;
  p.seqlen_q = seqlen_q;
  p.seqlen_k = seqlen_k;
  p.heads_q = heads_q;
  p.heads_kv = heads_kv;
  p.head_dim = head_dim;
  p.scale = library_scale(head_dim, scale);
  p.causal = causal;
  return p;
}

namespace {

HostTensor shaped(const Case& c, int64_t n, int64_t h) {
  if (c.layout == Layout::Padded)
    return HostTensor::padded(c.dtype, c.batch, n, h, c.head_dim, 3, 5, 7);
  return HostTensor::make(c.dtype, c.batch, n, h, c.head_dim);
}

}  // namespace

Inputs make_inputs(const Case& c) {
  Inputs in;
  switch (c.layout) {
    case Layout::PackedQKV: {
      REQUIRE(c.seqlen_q == c.seqlen_k);
      auto qkv =
          HostTensor::packed_qkv(c.dtype, c.batch, c.seqlen_q, c.heads_q, c.heads_kv, c.head_dim);
      in.q = qkv[0];
      in.k = qkv[1];
      in.v = qkv[2];
      break;
    }
    case Layout::BroadcastKV:
      in.q = shaped(c, c.seqlen_q, c.heads_q);
      in.k = HostTensor::broadcast_batch(c.dtype, c.batch, c.seqlen_k, c.heads_kv, c.head_dim);
      in.v = HostTensor::broadcast_batch(c.dtype, c.batch, c.seqlen_k, c.heads_kv, c.head_dim);
      break;
    default:
      in.q = shaped(c, c.seqlen_q, c.heads_q);
      in.k = shaped(c, c.seqlen_k, c.heads_kv);
      in.v = shaped(c, c.seqlen_k, c.heads_kv);
  }
  in.dout = shaped(c, c.seqlen_q, c.heads_q);
  in.q.fill_normal(c.seed * 4 + 0);
  in.k.fill_normal(c.seed * 4 + 1);
  in.v.fill_normal(c.seed * 4 + 2);
  in.dout.fill_normal(c.seed * 4 + 3);
  return in;
}

HostTensor make_output(const Case& c, bool like_k) {
  HostTensor t = like_k ? shaped(c, c.seqlen_k, c.heads_kv) : shaped(c, c.seqlen_q, c.heads_q);
  t.poison();
  return t;
}

flashattn_options_t options_for(const Case& c, flashattn_algorithm_t algorithm) {
  flashattn_options_t o;
  flashattn_options_init(&o);
  o.softmax_scale = c.scale;
  o.causal = c.causal ? 1 : 0;
  o.algorithm = algorithm;
  return o;
}

ForwardResult run_forward(flashattn_context_t ctx, const Case& c, const Inputs& in,
                          flashattn_algorithm_t algorithm, bool with_lse) {
  ForwardResult r;
  r.out = make_output(c, false);
  r.lse = HostTensor::lse(c.batch, c.heads_q, c.seqlen_q);
  r.lse.poison();
  const auto before = r.out.snapshot();
  const flashattn_options_t o = options_for(c, algorithm);
  const flashattn_tensor_t q = in.q.view(), k = in.k.view(), v = in.v.view();
  const flashattn_tensor_t out = r.out.view(), lse = r.lse.view();
  const flashattn_status_t s =
      flashattn_forward(ctx, &q, &k, &v, &out, with_lse ? &lse : nullptr, &o, nullptr, 0);
  REQUIRE_MESSAGE(s == FLASHATTN_SUCCESS, c.name(), ": ", flashattn_last_error());
  CHECK_MESSAGE(r.out.changed_outside(before) == -1, c.name(), ": forward wrote outside out");
  return r;
}

BackwardResult run_backward(flashattn_context_t ctx, const Case& c, const Inputs& in,
                            const ForwardResult& fwd, flashattn_algorithm_t algorithm) {
  BackwardResult r;
  r.dq = make_output(c, false);
  r.dk = make_output(c, true);
  r.dv = make_output(c, true);
  const auto before_dq = r.dq.snapshot();
  const auto before_dk = r.dk.snapshot();
  const auto before_dv = r.dv.snapshot();
  const flashattn_options_t o = options_for(c, algorithm);
  const flashattn_tensor_t q = in.q.view(), k = in.k.view(), v = in.v.view();
  const flashattn_tensor_t out = fwd.out.view(), lse = fwd.lse.view(), dout = in.dout.view();
  const flashattn_tensor_t dq = r.dq.view(), dk = r.dk.view(), dv = r.dv.view();
  const flashattn_status_t s =
      flashattn_backward(ctx, &q, &k, &v, &out, &dout, &lse, &dq, &dk, &dv, &o, nullptr, 0);
  REQUIRE_MESSAGE(s == FLASHATTN_SUCCESS, c.name(), ": ", flashattn_last_error());
  CHECK_MESSAGE(r.dq.changed_outside(before_dq) == -1, c.name(), ": backward wrote outside dq");
  CHECK_MESSAGE(r.dk.changed_outside(before_dk) == -1, c.name(), ": backward wrote outside dk");
  CHECK_MESSAGE(r.dv.changed_outside(before_dv) == -1, c.name(), ": backward wrote outside dv");
  return r;
}

namespace {

// FLASHATTN_TEST_VERBOSE=1 prints every comparison, to see how close results come to bounds.
void expect(const Comparison& cmp, const Case& c) {
  static const bool verbose = std::getenv("FLASHATTN_TEST_VERBOSE") != nullptr;
  if (verbose) std::printf("%s | %s\n", c.name().c_str(), cmp.message.c_str());
  CHECK_MESSAGE(cmp.ok, c.name(), ": ", cmp.message);
}

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
  reference_forward(c.ref(), in.q.to_double(), in.k.to_double(), in.v.to_double(), &ref_out,
                    &ref_lse);
  const ForwardResult flash = run_forward(ctx.get(), c, in, FLASHATTN_ALGORITHM_FLASH);
  const ForwardResult standard = run_forward(ctx.get(), c, in, FLASHATTN_ALGORITHM_STANDARD);
  const auto f_out = flash.out.to_double(), s_out = standard.out.to_double();
  const auto f_lse = flash.lse.to_double(), s_lse = standard.lse.to_double();
  expect(check_no_nan("flash out", f_out), c);
  expect(check_no_nan("flash lse", f_lse), c);
  expect(check_no_nan("standard out", s_out), c);
  expect(check_no_nan("standard lse", s_lse), c);
  expect(check_rule("flash out", f_out, s_out, ref_out, dtype_atol(c.dtype)), c);
  expect(check_rule("flash lse", f_lse, s_lse, ref_lse, dtype_atol(FLASHATTN_DTYPE_FLOAT32)), c);
  expect(check_close("standard out", s_out, ref_out, standard_tolerance(c.dtype, ref_out)), c);
  expect(check_close("standard lse", s_lse, ref_lse,
                     standard_tolerance(FLASHATTN_DTYPE_FLOAT32, ref_lse)),
         c);
  // Rows that see no key: exactly 0 and -inf, in both algorithms.
  const int64_t D = c.head_dim;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.heads_q; ++h)
      for (int64_t i = 0; i < c.seqlen_q; ++i) {
        const size_t row = static_cast<size_t>((b * c.heads_q + h) * c.seqlen_q + i);
        if (!std::isinf(ref_lse[row])) continue;
        CHECK_MESSAGE(f_lse[row] == -INFINITY, "flash lse of a masked row: ", f_lse[row]);
        CHECK_MESSAGE(s_lse[row] == -INFINITY, "standard lse of a masked row: ", s_lse[row]);
        for (int64_t x = 0; x < D; ++x) {
          CHECK(flash.out.get(b, i, h, x) == 0.0);
          CHECK(standard.out.get(b, i, h, x) == 0.0);
        }
      }
}

void check_backward(const Case& c) {
  INFO(c.name());
  CpuContext ctx(c.threads);
  const Inputs in = make_inputs(c);
  std::vector<double> ref_dq, ref_dk, ref_dv;
  reference_backward(c.ref(), in.q.to_double(), in.k.to_double(), in.v.to_double(),
                     in.dout.to_double(), &ref_dq, &ref_dk, &ref_dv);
  const ForwardResult f_fwd = run_forward(ctx.get(), c, in, FLASHATTN_ALGORITHM_FLASH);
  const BackwardResult flash = run_backward(ctx.get(), c, in, f_fwd, FLASHATTN_ALGORITHM_FLASH);
  const ForwardResult s_fwd = run_forward(ctx.get(), c, in, FLASHATTN_ALGORITHM_STANDARD);
  const BackwardResult standard =
      run_backward(ctx.get(), c, in, s_fwd, FLASHATTN_ALGORITHM_STANDARD);
  const double atol = dtype_atol(c.dtype);
  const struct {
    const char* name;
    const HostTensor& got;
    const HostTensor& base;
    const std::vector<double>& ref;
  } grads[] = {{"dq", flash.dq, standard.dq, ref_dq},
               {"dk", flash.dk, standard.dk, ref_dk},
               {"dv", flash.dv, standard.dv, ref_dv}};
  for (const auto& g : grads) {
    const auto got = g.got.to_double(), base = g.base.to_double();
    expect(check_no_nan(std::string("flash ") + g.name, got), c);
    expect(check_no_nan(std::string("standard ") + g.name, base), c);
    expect(check_rule(std::string("flash ") + g.name, got, base, g.ref, atol), c);
    expect(check_close(std::string("standard ") + g.name, base, g.ref,
                       standard_tolerance(c.dtype, g.ref)),
           c);
  }
}

}  // namespace flashattn_test
