#include "variant_harness.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace gpu_variants {

using flashattn_test::Comparison;

namespace {

int64_t sum(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

int64_t longest(const std::vector<int64_t>& v) {
  int64_t m = 0;
  for (int64_t x : v) m = std::max(m, x);
  return m;
}

std::string lengths(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

int64_t round_up8(int64_t n) { return (n + 7) / 8 * 8; }

}  // namespace

int64_t Case::total_q() const { return varlen() ? sum(lq) : b * nq; }
int64_t Case::total_k() const { return varlen() ? sum(lk) : b * nk; }
int64_t Case::max_q() const { return varlen() ? longest(lq) + slack : nq; }
int64_t Case::max_k() const { return varlen() ? longest(lk) + slack : nk; }

std::string Case::name() const {
  static const char* const layouts[] = {"contiguous", "aligned-strided", "unaligned-strided",
                                        "packed-qkv"};
  char buf[400];
  std::snprintf(buf, sizeof buf, "%s%s%s B=%lld Nq=%lld Nk=%lld Hq=%lld Hkv=%lld D=%lld Dv=%lld%s",
                label.c_str(), label.empty() ? "" : ": ", flashattn_test::dtype_label(dtype),
                static_cast<long long>(batch()), static_cast<long long>(max_q()),
                static_cast<long long>(max_k()), static_cast<long long>(hq),
                static_cast<long long>(hkv), static_cast<long long>(d),
                static_cast<long long>(head_dim_v()), causal ? " causal" : "");
  std::string s = buf;
  if (scale != 0.0f) s += " scale=" + std::to_string(scale);
  if (window) s += " window(" + std::to_string(left) + "," + std::to_string(right) + ")";
  if (softcap > 0) s += " softcap=" + std::to_string(softcap);
  if (num_splits > 0) s += " num_splits=" + std::to_string(num_splits);
  if (alibi == Slopes::PerHead) s += " alibi[h]";
  if (alibi == Slopes::PerBatchHead) s += " alibi[b,h]";
  if (sinks) s += want_dsinks ? " sinks" : " sinks(no dsinks)";
  if (varlen()) {
    s += " varlen q[" + lengths(lq) + "] k[" + lengths(lk) + "]";
    if (slack > 0) s += " slack=" + std::to_string(slack);
  }
  s += std::string(" ") + layouts[static_cast<int>(layout)];
  return s;
}

Case make(flashattn_dtype_t dtype, int64_t b, int64_t nq, int64_t nk, int64_t hq, int64_t hkv,
          int64_t d, bool causal) {
  Case c;
  c.dtype = dtype;
  c.b = b;
  c.nq = nq;
  c.nk = nk;
  c.hq = hq;
  c.hkv = hkv;
  c.d = d;
  c.causal = causal;
  c.seed = static_cast<uint64_t>(nq * 37 + nk * 11 + d * 7 + (causal ? 3 : 0) +
                                 static_cast<int>(dtype) * 1000);
  return c;
}

Case windowed(Case c, int32_t left, int32_t right) {
  c.window = true;
  c.left = left;
  c.right = right;
  return c;
}

Case softcapped(Case c, float cap) {
  c.softcap = cap;
  return c;
}

Case with_alibi(Case c, Slopes slopes) {
  c.alibi = slopes;
  return c;
}

Case with_sinks(Case c) {
  c.sinks = true;
  return c;
}

Case with_dv(Case c, int64_t dv) {
  c.dv = dv;
  return c;
}

Case laid_out(Case c, Layout layout) {
  c.layout = layout;
  return c;
}

Case varlen(Case c, std::vector<int64_t> lq, std::vector<int64_t> lk, int64_t slack) {
  c.lq = std::move(lq);
  c.lk = std::move(lk);
  c.slack = slack;
  c.seed = c.seed * 31 + static_cast<uint64_t>(sum(c.lq) * 13 + sum(c.lk));
  return c;
}

// ---- Expectations -----------------------------------------------------------------------------

std::string variant_name(Variant v) {
  switch (v) {
    case kWindow: return "sliding window";
    case kSoftcap: return "softcap";
    case kAlibiPerHead: return "ALiBi [Hq]";
    case kAlibiPerBatch: return "ALiBi [B, Hq]";
    case kSinks: return "sinks";
    case kHeadDimV: return "head_dim of v != head_dim";
    case kOddHeadDim: return "head_dim not a multiple of 8";
    case kVarlen: return "variable-length batch";
    case kVariantCount: break;
  }
  return "?";
}

std::vector<Variant> variants_of(const Case& c) {
  std::vector<Variant> v;
  // The window as the library reads it: causal caps the right bound at the diagonal, and a
  // window of (-1, 0) is the causal mask itself, (-1, -1) no mask at all.
  int64_t left = c.window ? c.left : -1, right = c.window ? c.right : -1;
  if (c.causal) right = right < 0 ? 0 : std::min<int64_t>(right, 0);
  if (left >= 0 || right > 0) v.push_back(kWindow);
  if (c.softcap > 0) v.push_back(kSoftcap);
  if (c.alibi == Slopes::PerHead) v.push_back(kAlibiPerHead);
  if (c.alibi == Slopes::PerBatchHead) v.push_back(kAlibiPerBatch);
  if (c.sinks) v.push_back(kSinks);
  if (c.head_dim_v() != c.d) v.push_back(kHeadDimV);
  if (c.d % 8 != 0 || c.head_dim_v() % 8 != 0) v.push_back(kOddHeadDim);
  if (c.varlen()) v.push_back(kVarlen);
  return v;
}

std::string family_name(Family f) {
  switch (f) {
    case Family::Standard: return "standard";
    case Family::FlashSm90: return "flash sm90";
    case Family::FlashSm80: return "flash sm80";
  }
  return "?";
}

std::string pass_name(Pass p) { return p == Pass::Forward ? "forward" : "backward"; }

bool expected_for(Family f, Pass p, const Case& c) {
  for (Variant v : variants_of(c))
    if (!expected(f, p, v)) return false;
  return true;
}

namespace {

struct DeviceKind {
  bool hopper = false;
  bool env_forced = false;  // FLASHATTN_TEST_FORCE_SM80=1 in the environment
  bool hooks = false;       // the library was built with FLASHATTN_TEST_HOOKS (so it obeys it)
};

const DeviceKind& device_kind() {
  static const DeviceKind k = [] {
    DeviceKind d;
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
      d.hopper = prop.major == 9 && prop.minor == 0;
    }
    const char* v = std::getenv("FLASHATTN_TEST_FORCE_SM80");
    d.env_forced = v != nullptr && std::strcmp(v, "1") == 0;
#ifdef FLASHATTN_TEST_HOOKS_BUILT
    d.hooks = true;
#endif
    return d;
  }();
  return k;
}

}  // namespace

Family family_of(flashattn_algorithm_t algorithm, Pass pass, const Case& c) {
  if (algorithm == FLASHATTN_ALGORITHM_STANDARD) return Family::Standard;
  const DeviceKind& k = device_kind();
  if (!k.hopper || (k.env_forced && k.hooks)) return Family::FlashSm80;
  (void)pass;
  (void)c;
  return Family::FlashSm90;
}

void print_family_banner() {
  const DeviceKind& k = device_kind();
  const char* flash = !k.hopper ? "sm80 kernels (not a Hopper device)"
                      : k.env_forced && k.hooks
                          ? "sm80 kernels (FLASHATTN_TEST_FORCE_SM80=1)"
                          : "Hopper kernels";
  std::printf("variants: flash passes judged as the %s", flash);
  if (k.env_forced && !k.hooks) {
    std::printf(
        "; FLASHATTN_TEST_FORCE_SM80=1 has no effect: the library was built without "
        "FLASHATTN_TEST_HOOKS");
  }
  std::printf("\n");
  std::fflush(stdout);
}

Tally::~Tally() {
  std::printf("[%s] %d pass(es) ran", what_, ran_);
  if (skipped_ > 0)
    std::printf(", %d skipped (not in the expectation table, UNSUPPORTED)", skipped_);
  if (beyond_ > 0) std::printf(", %d ran beyond the table", beyond_);
  std::printf("\n");
  std::fflush(stdout);
}

void Tally::once(const std::string& key, const std::string& text) {
  if (seen_[key]++ == 0) MESSAGE(text);
}

void Tally::skipped(Family f, Pass p, const Case& c, const std::string& reason) {
  ++skipped_;
  const std::string where = family_name(f) + " " + pass_name(p);
  once("skip " + where + reason,
       "skipped (" + where + ", not expected yet): " + reason + " [first case: " + c.name() + "]");
}


void Tally::beyond_table(Family f, Pass p, const Case& c) {
  ++beyond_;
  std::string vs;
  for (Variant v : variants_of(c))
    if (!expected(f, p, v)) vs += (vs.empty() ? "" : ", ") + variant_name(v);
  const std::string where = family_name(f) + " " + pass_name(p);
  once("beyond " + where + vs, "ran although the table does not expect it (" + where + ": " + vs +
                                   "); checked all the same [first case: " + c.name() + "]");
}

// ---- Inputs -----------------------------------------------------------------------------------

namespace {

// The storage of a [rows, heads, dim] tensor of the case: [B, N, H, dim], or [1, total, H, dim]
// for a variable-length batch.
HostTensor shaped(const Case& c, int64_t n, int64_t total, int64_t h, int64_t dim) {
  const int64_t b = c.varlen() ? 1 : c.b;
  const int64_t rows = c.varlen() ? total : n;
  switch (c.layout) {
    case Layout::Aligned:
      return HostTensor::padded(c.dtype, b, rows, h, dim, round_up8(dim) - dim + 8, 16, 24);
    case Layout::Unaligned: return HostTensor::padded(c.dtype, b, rows, h, dim, 3, 5, 7);
    default: return HostTensor::make(c.dtype, b, rows, h, dim);
  }
}

std::vector<int32_t> offsets(const std::vector<int64_t>& lengths) {
  std::vector<int32_t> cu(1, 0);
  for (int64_t n : lengths) cu.push_back(static_cast<int32_t>(cu.back() + n));
  return cu;
}

flashattn_test::RefProblem problem_of(const Case& c) {
  flashattn_test::RefProblem p;
  p.batch = c.batch();
  p.seqlen_q = c.nq;
  p.seqlen_k = c.nk;
  p.heads_q = c.hq;
  p.heads_kv = c.hkv;
  p.head_dim = c.d;
  p.head_dim_v = c.head_dim_v();
  p.scale = flashattn_test::library_scale(c.d, c.scale);
  p.causal = c.causal;
  if (c.window) {
    p.window_left = c.left;
    p.window_right = c.right;
  }
  p.softcap = c.softcap;
  p.alibi_per_batch = c.alibi == Slopes::PerBatchHead;
  p.seqlens_q = c.lq;
  p.seqlens_k = c.lk;
  return p;
}

}  // namespace

Inputs make_inputs(const Case& c) {
  Inputs in;
  const int64_t tq = c.total_q(), tk = c.total_k();
  if (c.layout == Layout::PackedQKV) {
    REQUIRE(c.max_q() == c.max_k());
    REQUIRE(tq == tk);
    REQUIRE(c.head_dim_v() == c.d);
    auto qkv = HostTensor::packed_qkv(c.dtype, c.varlen() ? 1 : c.b, c.varlen() ? tq : c.nq, c.hq,
                                      c.hkv, c.d);
    in.q = qkv[0];
    in.k = qkv[1];
    in.v = qkv[2];
  } else {
    in.q = shaped(c, c.nq, tq, c.hq, c.d);
    in.k = shaped(c, c.nk, tk, c.hkv, c.d);
    in.v = shaped(c, c.nk, tk, c.hkv, c.head_dim_v());
  }
  in.dout = make_output(c, false, c.head_dim_v());
  in.q.fill_normal(c.seed * 4 + 0);
  in.k.fill_normal(c.seed * 4 + 1);
  in.v.fill_normal(c.seed * 4 + 2);
  in.dout.fill_normal(c.seed * 4 + 3);
  in.ref = problem_of(c);
  if (c.alibi != Slopes::None) {
    // The ALiBi paper's slopes 2^(-8 h / H), and per batch entry a different multiple of them.
    const bool per_batch = c.alibi == Slopes::PerBatchHead;
    const int64_t rows = per_batch ? c.batch() : 1;
    in.alibi = per_batch ? HostTensor::matrix(rows, c.hq) : HostTensor::vector(c.hq);
    std::vector<double> slopes;
    for (int64_t b = 0; b < rows; ++b)
      for (int64_t h = 0; h < c.hq; ++h)
        slopes.push_back((1.0 + 0.5 * static_cast<double>(b)) *
                         std::exp2(-8.0 * static_cast<double>(h + 1) / static_cast<double>(c.hq)));
    in.alibi.from_double(slopes);
    in.ref.alibi = in.alibi.to_double();
  }
  if (c.sinks) {
    // Logits like the scores', so that the sink takes a visible share of each row.
    in.sinks = HostTensor::vector(c.hq);
    in.sinks.fill_normal(c.seed * 4 + 5, 0.5, 1.0);
    in.ref.sinks = in.sinks.to_double();
  }
  if (c.varlen()) {
    in.cu_q = offsets(c.lq);
    in.cu_k = offsets(c.lk);
  }
  return in;
}

HostTensor make_output(const Case& c, bool like_k, int64_t head_dim) {
  Case layout_of = c;
  if (c.layout == Layout::PackedQKV) layout_of.layout = Layout::Contiguous;
  HostTensor t = like_k ? shaped(layout_of, c.nk, c.total_k(), c.hkv, head_dim)
                        : shaped(layout_of, c.nq, c.total_q(), c.hq, head_dim);
  t.poison();
  return t;
}

HostTensor make_lse(const Case& c) {
  HostTensor t =
      c.varlen() ? HostTensor::lse(1, c.hq, c.total_q()) : HostTensor::lse(c.b, c.hq, c.nq);
  t.poison();
  return t;
}

// ---- Calls ------------------------------------------------------------------------------------

namespace {

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

// Where the tensors of one call live: the CUDA context's device memory (uploaded through a
// DeviceSet, offsets copied with cudaMemcpy) or the host (a CPU context).
class Placement {
 public:
  Placement(const Case& c, bool device) : c_(c), device_(device) {}

  flashattn_tensor_t view(const HostTensor& t, bool heads_view) {
    flashattn_tensor_t v = device_ ? dev_.upload(t) : t.view();
    return heads_view && c_.varlen() ? drop_batch(v) : v;
  }
  flashattn_tensor_t lse_view(const HostTensor& t) {
    flashattn_tensor_t v = device_ ? dev_.upload(t) : t.view();
    return c_.varlen() ? drop_batch(v) : v;
  }
  flashattn_tensor_t small(const HostTensor& t) { return device_ ? dev_.upload(t) : t.view(); }
  flashattn_tensor_t offsets(const std::vector<int32_t>& cu, gpu_test::DeviceMemory* mem) {
    flashattn_tensor_t t{};
    const size_t bytes = cu.size() * sizeof(int32_t);
    if (device_) {
      *mem = gpu_test::DeviceMemory(bytes);
      GPU_CUDA_OK(cudaMemcpy(mem->get(), cu.data(), bytes, cudaMemcpyHostToDevice));
      GPU_CUDA_OK(cudaStreamSynchronize(nullptr));  // as DeviceSet::upload
      t.data = mem->get();
    } else {
      t.data = const_cast<int32_t*>(cu.data());
    }
    t.dtype = FLASHATTN_DTYPE_INT32;
    t.rank = 1;
    t.shape[0] = static_cast<int64_t>(cu.size());
    t.strides[0] = 1;
    return t;
  }
  void fetch(HostTensor& t) {
    if (device_) dev_.download(t);
  }

 private:
  const Case& c_;
  bool device_;
  gpu_test::DeviceSet dev_;
};

}  // namespace

CallStatus run_pass(flashattn_context_t ctx, bool device, Pass pass, const Case& c,
                    const Inputs& in, flashattn_algorithm_t algorithm, int deterministic,
                    const Results* fwd, Results* r) {
  Placement place(c, device);
  gpu_test::DeviceMemory cu_q_mem, cu_k_mem;
  flashattn_options_t o = FLASHATTN_OPTIONS_INIT;
  o.softmax_scale = c.scale;
  o.causal = c.causal ? 1 : 0;
  o.algorithm = algorithm;
  o.deterministic = deterministic;
  if (c.window) {
    o.window = 1;
    o.window_left = c.left;
    o.window_right = c.right;
  }
  o.softcap = c.softcap;
  o.num_splits = c.num_splits;

  flashattn_tensor_t q = place.view(in.q, true), k = place.view(in.k, true),
                     v = place.view(in.v, true);
  flashattn_tensor_t alibi{}, sinks{}, cu_q{}, cu_k{};
  flashattn_args_t a = FLASHATTN_ARGS_INIT;
  a.options = &o;
  a.q = &q;
  a.k = &k;
  a.v = &v;
  if (c.alibi != Slopes::None) {
    alibi = place.small(in.alibi);
    a.alibi_slopes = &alibi;
  }
  if (c.sinks) {
    sinks = place.small(in.sinks);
    a.sinks = &sinks;
  }
  if (c.varlen()) {
    cu_q = place.offsets(in.cu_q, &cu_q_mem);
    cu_k = place.offsets(in.cu_k, &cu_k_mem);
    a.cu_seqlens_q = &cu_q;
    a.cu_seqlens_k = &cu_k;
    a.max_seqlen_q = c.max_q();
    a.max_seqlen_k = c.max_k();
  }

  CallStatus st;
  flashattn_tensor_t out{}, lse{}, dout{}, dq{}, dk{}, dv{}, dsinks{};
  std::vector<HostTensor*> outputs;
  if (pass == Pass::Forward) {
    r->out = make_output(c, false, c.head_dim_v());
    r->lse = make_lse(c);
    out = place.view(r->out, true);
    lse = place.lse_view(r->lse);
    a.out = &out;
    a.lse = &lse;
    outputs = {&r->out, &r->lse};
  } else {
    REQUIRE(fwd != nullptr);
    out = place.view(fwd->out, true);
    lse = place.lse_view(fwd->lse);
    dout = place.view(in.dout, true);
    r->dq = make_output(c, false, c.d);
    r->dk = make_output(c, true, c.d);
    r->dv = make_output(c, true, c.head_dim_v());
    dq = place.view(r->dq, true);
    dk = place.view(r->dk, true);
    dv = place.view(r->dv, true);
    a.out = &out;
    a.lse = &lse;
    a.dout = &dout;
    a.dq = &dq;
    a.dk = &dk;
    a.dv = &dv;
    outputs = {&r->dq, &r->dk, &r->dv};
    if (c.sinks && c.want_dsinks) {
      r->dsinks = HostTensor::vector(c.hq);
      r->dsinks.poison();
      dsinks = place.small(r->dsinks);
      a.dsinks = &dsinks;
      outputs.push_back(&r->dsinks);
    }
  }
  std::vector<std::vector<unsigned char>> before;
  for (HostTensor* t : outputs) before.push_back(t->snapshot());

  const int backward = pass == Pass::Backward ? 1 : 0;
  st.query = flashattn_supported_ex(ctx, &a, backward);
  if (st.query != FLASHATTN_SUCCESS) {
    st.message = flashattn_last_error();
    return st;
  }
  st.call = backward ? flashattn_backward_ex(ctx, &a, nullptr, 0)
                     : flashattn_forward_ex(ctx, &a, nullptr, 0);
  if (st.call != FLASHATTN_SUCCESS) {
    st.message = flashattn_last_error();
    return st;
  }
  GPU_FA_OK(flashattn_context_synchronize(ctx));
  for (size_t i = 0; i < outputs.size(); ++i) {
    place.fetch(*outputs[i]);
    CHECK_MESSAGE(outputs[i]->changed_outside(before[i]) == -1,
                  family_name(family_of(algorithm, pass, c))
                      << " " << pass_name(pass) << " wrote outside an output's view");
  }
  return st;
}

bool attempt(Tally& tally, Pass pass, const Case& c, const Inputs& in,
             flashattn_algorithm_t algorithm, int deterministic, const Results* fwd, Results* r) {
  const Family f = family_of(algorithm, pass, c);
  const bool want = expected_for(f, pass, c);
  const CallStatus st =
      run_pass(gpu_test::shared_context(), true, pass, c, in, algorithm, deterministic, fwd, r);
  INFO(family_name(f) << " " << pass_name(pass) << ": " << c.name());
  if (st.query != FLASHATTN_SUCCESS) {
    // Any other status is a wrong answer of the query to a valid request.
    INFO("flashattn_supported_ex: " << std::string(flashattn_status_string(st.query)) << ": "
                                    << st.message);
    REQUIRE(st.query == FLASHATTN_ERROR_UNSUPPORTED);
    if (!want) {
      tally.skipped(f, pass, c, st.message);
    } else {
      FAIL_CHECK(
          "expected to be supported (see the expectation table), but UNSUPPORTED: " << st.message);
    }
    return false;
  }
  if (st.call != FLASHATTN_SUCCESS) {
    // The query said yes: the call must run (unaligned views included, through copies).
    FAIL_CHECK("flashattn_supported_ex said supported, the "
               << pass_name(pass) << " returned " << std::string(flashattn_status_string(st.call))
               << ": " << st.message);
    return false;
  }
  tally.ran();
  if (!want) tally.beyond_table(f, pass, c);
  return true;
}

Results reference_forward_results(const Case& c, const Inputs& in, std::vector<double>* out,
                                  std::vector<double>* lse) {
  flashattn_test::reference_forward(in.ref, in.q.to_double(), in.k.to_double(), in.v.to_double(),
                                    out, lse);
  Results r;
  r.out = make_output(c, false, c.head_dim_v());
  r.out.from_double(*out);
  r.lse = make_lse(c);
  r.lse.from_double(*lse);
  return r;
}

// ---- Checks -----------------------------------------------------------------------------------

// FlashAttention's own tests allow a softcap three times the base error instead of two: the
// fused kernels evaluate tanh in fp32 with a fast approximation (and scale by 1/c and c around
// it), a rounding step the unfused standard computation does not share, and the backward
// multiplies by its derivative 1 - tanh^2, which amplifies that rounding where scores saturate.
double rule_factor(const Case& c) {
  return c.softcap > 0 ? flashattn_test::kSoftcapRuleFactor : flashattn_test::kRuleFactor;
}

namespace {

void expect(const Comparison& cmp) {
  INFO(cmp.message);
  CHECK(cmp.ok);
}

// A few units of the dtype's floor at the result's scale: how far the standard result may be
// from float64 (as in the other GPU tests; the precise check of the standard algorithm is its
// host emulation there, which does not model the variants).
double sane_bound(flashattn_dtype_t dtype, const std::vector<double>& ref, double units) {
  return units * flashattn_test::dtype_atol(dtype) * std::max(1.0, flashattn_test::max_abs(ref));
}

// The query rows that see no key (LSE -inf in the reference): their LSE index and the index of
// their first element in a row-major [.., Hq, dim] tensor of q's rows, per unit of dim.
struct MaskedRow {
  size_t lse, row;
};

std::vector<MaskedRow> masked_rows(const Case& c, const std::vector<double>& lse_ref) {
  std::vector<MaskedRow> rows;
  if (c.varlen()) {
    const int64_t t = c.total_q();
    for (int64_t h = 0; h < c.hq; ++h)
      for (int64_t i = 0; i < t; ++i) {
        const size_t l = static_cast<size_t>(h * t + i);
        if (std::isinf(lse_ref[l])) rows.push_back({l, static_cast<size_t>(i * c.hq + h)});
      }
    return rows;
  }
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t h = 0; h < c.hq; ++h)
      for (int64_t i = 0; i < c.nq; ++i) {
        const size_t l = static_cast<size_t>((b * c.hq + h) * c.nq + i);
        if (std::isinf(lse_ref[l]))
          rows.push_back({l, static_cast<size_t>((b * c.nq + i) * c.hq + h)});
      }
  return rows;
}

// Rows that see no key: out 0 and lse -inf (forward), dq 0 (backward), exactly.
void expect_masked(const std::string& who, const std::vector<MaskedRow>& rows,
                   const std::vector<double>* out, int64_t dim, const std::vector<double>* lse) {
  int wrong_lse = 0, wrong_rows = 0;
  for (const MaskedRow& m : rows) {
    if (lse != nullptr && (*lse)[m.lse] != -INFINITY) ++wrong_lse;
    bool zero = true;
    for (int64_t x = 0; x < dim; ++x)
      zero = zero && (*out)[m.row * static_cast<size_t>(dim) + x] == 0.0;
    wrong_rows += !zero;
  }
  CHECK_MESSAGE(wrong_lse == 0, who << ": " << wrong_lse << " of " << rows.size()
                                    << " rows that see no key have an LSE other than -inf");
  CHECK_MESSAGE(wrong_rows == 0, who << ": " << wrong_rows << " of " << rows.size()
                                     << " rows that see no key are not exactly 0");
}

// The CPU backend's standard algorithm in the case's dtype: the base of the rule when the CUDA
// standard algorithm does not run the case (every variant runs on the CPU).
Results cpu_standard(Pass pass, const Case& c, const Inputs& in, const Results* fwd) {
  flashattn_context_t cpu = nullptr;
  GPU_FA_OK(flashattn_context_create(&cpu, FLASHATTN_BACKEND_CPU, 0));
  Results r;
  const CallStatus st = run_pass(cpu, false, pass, c, in, FLASHATTN_ALGORITHM_STANDARD, 0, fwd, &r);
  flashattn_context_destroy(cpu);
  INFO("CPU standard " << pass_name(pass) << ": " << st.message);
  REQUIRE(st.query == FLASHATTN_SUCCESS);
  REQUIRE(st.call == FLASHATTN_SUCCESS);
  return r;
}

}  // namespace

void check_case(const Case& c, Tally& tally) {
  INFO(c.name());
  const Inputs in = make_inputs(c);
  std::vector<double> o_ref, lse_ref;
  const Results ref_fwd = reference_forward_results(c, in, &o_ref, &lse_ref);
  const std::vector<MaskedRow> masked = masked_rows(c, lse_ref);
  const double factor = rule_factor(c);
  const int64_t D = c.d, Dv = c.head_dim_v();

  // ---- forward ----
  Results sf, ff;
  const bool std_fwd =
      attempt(tally, Pass::Forward, c, in, FLASHATTN_ALGORITHM_STANDARD, 0, nullptr, &sf);
  const bool fl_fwd =
      attempt(tally, Pass::Forward, c, in, FLASHATTN_ALGORITHM_FLASH, 0, nullptr, &ff);
  std::vector<double> o_std, lse_std;
  if (std_fwd) {
    o_std = sf.out.to_double();
    lse_std = sf.lse.to_double();
    expect(flashattn_test::check_no_nan("standard out", o_std));
    expect(flashattn_test::check_no_nan("standard lse", lse_std));
    expect(flashattn_test::check_close("standard out vs float64", o_std, o_ref,
                                       sane_bound(c.dtype, o_ref, 4)));
    expect(flashattn_test::check_close("standard lse vs float64", lse_std, lse_ref,
                                       1e-4 * std::max(1.0, flashattn_test::max_abs(lse_ref))));
    expect_masked("standard forward", masked, &o_std, Dv, &lse_std);
  }
  if (fl_fwd) {
    std::string base_name = "standard";
    if (!std_fwd) {
      const Results cpu = cpu_standard(Pass::Forward, c, in, nullptr);
      o_std = cpu.out.to_double();
      lse_std = cpu.lse.to_double();
      base_name = "CPU standard";
    }
    INFO("base of the rule: the " << base_name << " result");
    const std::vector<double> o_fl = ff.out.to_double(), lse_fl = ff.lse.to_double();
    expect(flashattn_test::check_no_nan("flash out", o_fl));
    expect(flashattn_test::check_no_nan("flash lse", lse_fl));
    expect(flashattn_test::check_rule("flash out", o_fl, o_std, o_ref,
                                      flashattn_test::dtype_atol(c.dtype), factor));
    expect(flashattn_test::check_rule("flash lse", lse_fl, lse_std, lse_ref,
                                      flashattn_test::lse_atol(c.softcap, lse_ref), factor));
    expect_masked("flash forward", masked, &o_fl, Dv, &lse_fl);
  }

  // ---- backward, from the float64 forward's out and lse ----
  Results sb, fb;
  const bool std_bwd =
      attempt(tally, Pass::Backward, c, in, FLASHATTN_ALGORITHM_STANDARD, 0, &ref_fwd, &sb);
  const bool fl_bwd =
      attempt(tally, Pass::Backward, c, in, FLASHATTN_ALGORITHM_FLASH, 0, &ref_fwd, &fb);
  if (!std_bwd && !fl_bwd) return;
  std::vector<double> ref[4];
  flashattn_test::reference_backward(in.ref, in.q.to_double(), in.k.to_double(), in.v.to_double(),
                                     in.dout.to_double(), &ref[0], &ref[1], &ref[2],
                                     c.sinks ? &ref[3] : nullptr);
  const bool dsinks = c.sinks && c.want_dsinks;
  const int grads = dsinks ? 4 : 3;
  const char* names[4] = {"dq", "dk", "dv", "dsinks"};
  const auto of = [](const Results& r, int i) {
    const HostTensor* t[4] = {&r.dq, &r.dk, &r.dv, &r.dsinks};
    return t[i]->to_double();
  };
  std::vector<double> base[4];
  if (std_bwd) {
    for (int i = 0; i < grads; ++i) {
      base[i] = of(sb, i);
      expect(flashattn_test::check_no_nan(std::string("standard ") + names[i], base[i]));
      expect(flashattn_test::check_close(std::string("standard ") + names[i] + " vs float64",
                                         base[i], ref[i], sane_bound(c.dtype, ref[i], 8)));
    }
    expect_masked("standard dq", masked, &base[0], D, nullptr);
  }
  if (fl_bwd) {
    std::string base_name = "standard";
    if (!std_bwd) {
      const Results cpu = cpu_standard(Pass::Backward, c, in, &ref_fwd);
      for (int i = 0; i < grads; ++i) base[i] = of(cpu, i);
      base_name = "CPU standard";
    }
    INFO("base of the rule: the " << base_name << " result");
    for (int i = 0; i < grads; ++i) {
      const std::vector<double> got = of(fb, i);
      // dsinks is fp32 whatever the dtype (a sum over every row): fp32's floor; its error comes
      // from the dtype's values it is computed from, which the base shares.
      const double atol = flashattn_test::dtype_atol(i == 3 ? FLASHATTN_DTYPE_FLOAT32 : c.dtype);
      expect(flashattn_test::check_no_nan(std::string("flash ") + names[i], got));
      expect(flashattn_test::check_rule(std::string("flash ") + names[i], got, base[i], ref[i],
                                        atol, factor));
      if (i == 0) expect_masked("flash dq", masked, &got, D, nullptr);
    }
  }
}

}  // namespace gpu_variants
