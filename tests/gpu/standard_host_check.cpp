// The CUDA standard algorithm's host-side orchestration (lib/cuda/standard/standard.cpp: the
// workspace layout, the packing, every cuBLAS call's transposes, sizes, leading dimensions and
// batch strides) run on the host, with no GPU: cuBLAS is replaced by a reference column-major
// strided-batched GEMM that checks its arguments the way cuBLAS documents them, and the
// standard kernels by host loops doing the same fp32 arithmetic. The results must match the
// host emulation of the algorithm (standard_emulation.hpp) to an ulp or two, and the float64
// reference within a sane bound. What only a GPU can check (the CUDA kernels themselves,
// cuBLAS itself) is in the gpu_tests executable.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/reference.hpp"
#include "common/tensors.hpp"
#include "common/tolerance.hpp"
#include "core/error.hpp"
#include "core/half.hpp"
#include "cuda/cublas_loader.hpp"
#include "cuda/cuda_util.hpp"
#include "cuda/standard/standard.hpp"
#include "cuda/standard/standard_kernels.hpp"
#include "cuda/standard/row_policies.cuh"
#include "standard_emulation.hpp"

using flashattn::DType;
using flashattn::LseView;
using flashattn::Problem;
using flashattn::Tensor4;
using flashattn::cuda::standard::MatrixView;
using flashattn::cuda::standard::Strides4;

// ---- host stand-ins for what standard.cpp calls -------------------------------------------

namespace {

float load16(DType t, const void* base, int64_t i) {
  uint16_t h;
  std::memcpy(&h, static_cast<const unsigned char*>(base) + 2 * i, 2);
  return t == DType::F16 ? flashattn::fp16_to_float(h) : flashattn::bf16_to_float(h);
}

void store16(DType t, void* base, int64_t i, float f) {
  const uint16_t h = t == DType::F16 ? flashattn::float_to_fp16(f) : flashattn::float_to_bf16(f);
  std::memcpy(static_cast<unsigned char*>(base) + 2 * i, &h, 2);
}

float load_any(cudaDataType t, const void* base, int64_t i) {
  if (t == CUDA_R_32F) return static_cast<const float*>(base)[i];
  return load16(t == CUDA_R_16F ? DType::F16 : DType::BF16, base, i);
}

void store_any(cudaDataType t, void* base, int64_t i, float f) {
  if (t == CUDA_R_32F) {
    static_cast<float*>(base)[i] = f;
    return;
  }
  store16(t == CUDA_R_16F ? DType::F16 : DType::BF16, base, i, f);
}

int g_gemm_calls = 0;
int g_redo_calls = 0;
std::string g_gemm_error;

// cublasGemmStridedBatchedEx's contract, on the host: column-major, C = alpha op(A) op(B) +
// beta C, with cuBLAS's argument checks.
cublasStatus_t host_gemm(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                         int k, const void* alpha, const void* A, cudaDataType at, int lda,
                         long long sa, const void* B, cudaDataType bt, int ldb, long long sb,
                         const void* beta, void* C, cudaDataType ct, int ldc, long long sc,
                         int batch, cublasComputeType_t compute, cublasGemmAlgo_t) {
  ++g_gemm_calls;
  auto bad = [](const std::string& why) {
    g_gemm_error = why;
    return CUBLAS_STATUS_INVALID_VALUE;
  };
  if (m < 0 || n < 0 || k < 0 || batch < 0) return bad("negative size");
  if (lda < std::max(1, ta == CUBLAS_OP_N ? m : k)) return bad("lda too small");
  if (ldb < std::max(1, tb == CUBLAS_OP_N ? k : n)) return bad("ldb too small");
  if (ldc < std::max(1, m)) return bad("ldc too small");
  if (at != bt || (at != CUDA_R_16F && at != CUDA_R_16BF)) return bad("A/B types");
  if (ct != at && ct != CUDA_R_32F) return bad("C type");
  if (compute != CUBLAS_COMPUTE_32F) return bad("compute type");
  const float al = *static_cast<const float*>(alpha);
  const float be = *static_cast<const float*>(beta);
  for (int b = 0; b < batch; ++b) {
    for (int j = 0; j < n; ++j) {
      for (int i = 0; i < m; ++i) {
        float acc = 0.0f;
        for (int l = 0; l < k; ++l) {
          const int64_t ia = ta == CUBLAS_OP_N ? i + int64_t(l) * lda : l + int64_t(i) * lda;
          const int64_t ib = tb == CUBLAS_OP_N ? l + int64_t(j) * ldb : j + int64_t(l) * ldb;
          acc += load_any(at, A, b * sa + ia) * load_any(bt, B, b * sb + ib);
        }
        const int64_t ic = b * sc + i + int64_t(j) * ldc;
        float r = al * acc;
        if (be != 0.0f) r += be * load_any(ct, C, ic);
        store_any(ct, C, ic, r);
      }
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

namespace flashattn {
namespace cuda {

void fail_cuda(cudaError_t error, const char* what) {
  fail(FLASHATTN_ERROR_DEVICE, "%s failed: CUDA error %d", what, static_cast<int>(error));
}

const char* cublas_status_text(cublasStatus_t) { return g_gemm_error.c_str(); }

namespace standard {

// The padded layout's copies: a sequence's rows past its length are zeros in the packed
// layout and untouched in the caller's.
template <bool kToCaller>
cudaError_t copy_rows(DType dtype, const void* src, Strides4 ss, void* dst, Strides4 ds,
                      SeqOffsets caller_rows, int64_t batch, int64_t seqlen, int64_t heads,
                      int64_t dim) {
  for (int64_t b = 0; b < batch; ++b) {
    const SeqSpan span = seq_span(caller_rows, b, seqlen);
    for (int64_t n = 0; n < seqlen; ++n) {
      const bool inside = n < span.len;
      if (kToCaller && !inside) continue;
      const int64_t src_n = kToCaller ? n : span.begin + n;
      const int64_t dst_n = kToCaller ? span.begin + n : n;
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t d = 0; d < dim; ++d) {
          store16(dtype, dst, b * ds.batch + dst_n * ds.seq + h * ds.head + d,
                  inside ? load16(dtype, src, b * ss.batch + src_n * ss.seq + h * ss.head + d)
                         : 0.0f);
        }
    }
  }
  return cudaSuccess;
}

cudaError_t pack_rows(DType dtype, const void* src, Strides4 ss, SeqOffsets src_rows, void* dst,
                      Strides4 ds, int64_t batch, int64_t seqlen, int64_t heads, int64_t dim,
                      cudaStream_t) {
  return copy_rows<false>(dtype, src, ss, dst, ds, src_rows, batch, seqlen, heads, dim);
}

cudaError_t unpack_rows(DType dtype, const void* src, Strides4 ss, void* dst, Strides4 ds,
                        SeqOffsets dst_rows, int64_t batch, int64_t seqlen, int64_t heads,
                        int64_t dim, cudaStream_t) {
  return copy_rows<true>(dtype, src, ss, dst, ds, dst_rows, batch, seqlen, heads, dim);
}

// The row softmax through the kernels' own row policies (row_policies.cuh).
cudaError_t softmax_rows(DType dtype, const float* s, void* p, const ScoreRows& shape,
                         const RowVariants& variants, const SoftmaxExtras& extras,
                         cudaStream_t) {
  const int64_t rows = shape.batch * shape.heads_q * shape.seqlen_q;
  std::vector<float> x(shape.seqlen_k), grad(shape.seqlen_k);
  for (int64_t r = 0; r < rows; ++r) {
    const ScoreRow row = score_row(r, shape, variants);
    const float* srow = s + r * shape.ld;
    float mx = -INFINITY;
    for (int64_t j = 0; j < shape.seqlen_k; ++j) {
      const Logit l = row.keys.contains(j) ? row.logits.at(srow[j], j) : Logit{-INFINITY, 0.0f};
      x[j] = l.value;
      grad[j] = l.softcap_grad;
      mx = std::max(mx, x[j]);
    }
    const float shift = row.sink.shift(mx);
    float sum = 0.0f;
    for (int64_t j = 0; j < shape.seqlen_k; ++j) {
      x[j] = row.keys.contains(j) ? std::exp(x[j] - shift) : 0.0f;
      sum += x[j];
    }
    sum += row.sink.term(shift);
    const bool sees_keys = !row.keys.empty();
    const float inv = sees_keys ? 1.0f / sum : 0.0f;
    for (int64_t j = 0; j < shape.seqlen_k; ++j) {
      store16(dtype, p, r * shape.ld + j, x[j] * inv);
      if (extras.softcap_grad != nullptr) extras.softcap_grad[r * shape.ld + j] = grad[j];
    }
    const LseView& lse = extras.lse;
    if (lse.data != nullptr && row.real) {
      lse.data[row.b * lse.stride_batch + row.h * lse.stride_head +
               row.caller_row * lse.stride_seq] = sees_keys ? shift + std::log(sum) : -INFINITY;
    }
    if (extras.sink_share != nullptr) {
      extras.sink_share[r] = sees_keys ? row.sink.term(shift) / sum : 0.0f;
    }
  }
  return cudaSuccess;
}

cudaError_t softmax_grad(DType dtype, void* p, const float* dp, const float* softcap_grad,
                         int64_t ld, int64_t rows, int64_t cols, float* delta, cudaStream_t) {
  for (int64_t r = 0; r < rows; ++r) {
    float dot = 0.0f;
    for (int64_t j = 0; j < cols; ++j) {
      const float pv = load16(dtype, p, r * ld + j);
      if (pv != 0.0f) dot += pv * dp[r * ld + j];
    }
    for (int64_t j = 0; j < cols; ++j) {
      const float pv = load16(dtype, p, r * ld + j);
      float ds = 0.0f;
      if (pv != 0.0f) {
        ds = pv * (dp[r * ld + j] - dot);
        if (softcap_grad != nullptr) ds *= softcap_grad[r * ld + j];
      }
      store16(dtype, p, r * ld + j, ds);
    }
    if (delta != nullptr) delta[r] = dot;
  }
  return cudaSuccess;
}

cudaError_t sink_gradient(const float* sink_share, const float* delta, const ScoreRows& shape,
                          flashattn::Vector<float> dsinks, cudaStream_t) {
  for (int64_t h = 0; h < shape.heads_q; ++h) {
    double acc = 0.0;
    for (int64_t b = 0; b < shape.batch; ++b)
      for (int64_t i = 0; i < shape.seqlen_q; ++i) {
        const int64_t r = (b * shape.heads_q + h) * shape.seqlen_q + i;
        acc += static_cast<double>(sink_share[r]) * static_cast<double>(delta[r]);
      }
    dsinks.data[h * dsinks.stride] = static_cast<float>(-acc);
  }
  return cudaSuccess;
}

cudaError_t redo_nonfinite(DType dtype, const void* a, MatrixView av, const void* b,
                           MatrixView bv, void* c, MatrixView cv, int64_t m, int64_t n, int64_t k,
                           int64_t batch, float alpha, cudaStream_t) {
  ++g_redo_calls;
  for (int64_t g = 0; g < batch; ++g)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const int64_t at = g * cv.batch + i * cv.row + j;
        if (std::isfinite(load16(dtype, c, at))) continue;
        float acc = 0.0f;
        for (int64_t x = 0; x < k; ++x) {
          const float ax = load16(dtype, a, g * av.batch + i * av.row + x * av.col);
          if (ax != 0.0f) acc += ax * load16(dtype, b, g * bv.batch + x * bv.row + j);
        }
        store16(dtype, c, at, alpha * acc);
      }
  return cudaSuccess;
}

cudaError_t kernels_loadable() { return cudaSuccess; }

}  // namespace standard
}  // namespace cuda
}  // namespace flashattn

// ---- the checks -----------------------------------------------------------------------------

namespace {

using flashattn_test::HostTensor;
using flashattn_test::RefProblem;

enum class Layout { Contiguous, Padded, PackedQKV, BroadcastBatch };

struct Case {
  const char* name;
  flashattn_dtype_t dtype;
  int64_t b, nq, nk, hq, hkv, d;
  bool causal;
  float scale;  // 0: 1/sqrt(d)
  Layout layout;
};

Tensor4 tensor4(const HostTensor& t) {
  flashattn_tensor_t v = t.view();
  return Tensor4{v.data, v.strides[0], v.strides[1], v.strides[2]};
}

LseView lse_view(const HostTensor& t) {
  flashattn_tensor_t v = t.view();
  return LseView{static_cast<float*>(v.data), v.strides[0], v.strides[1], v.strides[2]};
}

HostTensor like(const Case& c, int64_t n, int64_t h) {
  return c.layout == Layout::Padded ? HostTensor::padded(c.dtype, c.b, n, h, c.d, 3, 5, 7)
                                    : HostTensor::make(c.dtype, c.b, n, h, c.d);
}

struct Inputs {
  HostTensor q, k, v;
};

Inputs make_inputs(const Case& c) {
  Inputs in;
  switch (c.layout) {
    case Layout::PackedQKV: {
      auto qkv = HostTensor::packed_qkv(c.dtype, c.b, c.nq, c.hq, c.hkv, c.d);
      in.q = qkv[0];
      in.k = qkv[1];
      in.v = qkv[2];
      break;
    }
    case Layout::BroadcastBatch:
      in.q = HostTensor::make(c.dtype, c.b, c.nq, c.hq, c.d);
      in.k = HostTensor::broadcast_batch(c.dtype, c.b, c.nk, c.hkv, c.d);
      in.v = HostTensor::broadcast_batch(c.dtype, c.b, c.nk, c.hkv, c.d);
      break;
    default:
      in.q = like(c, c.nq, c.hq);
      in.k = like(c, c.nk, c.hkv);
      in.v = like(c, c.nk, c.hkv);
  }
  in.q.fill_normal(11);
  in.k.fill_normal(12);
  in.v.fill_normal(13);
  return in;
}

Problem problem_of(const Case& c) {
  Problem p;
  p.dtype = static_cast<DType>(c.dtype);
  p.batch = c.b;
  p.seqlen_q = c.nq;
  p.seqlen_k = c.nk;
  p.heads_q = c.hq;
  p.heads_kv = c.hkv;
  p.head_dim = c.d;
  p.head_dim_v = c.d;
  p.scale = static_cast<float>(flashattn_test::library_scale(c.d, c.scale));
  p.causal = c.causal;
  p.algorithm = flashattn::Algorithm::Standard;
  return p;
}

RefProblem ref_of(const Case& c) {
  RefProblem r;
  r.batch = c.b;
  r.seqlen_q = c.nq;
  r.seqlen_k = c.nk;
  r.heads_q = c.hq;
  r.heads_kv = c.hkv;
  r.head_dim = c.d;
  r.scale = flashattn_test::library_scale(c.d, c.scale);
  r.causal = c.causal;
  return r;
}

flashattn::ForwardArgs forward_args(const Case& c, const Inputs& in, const HostTensor& out,
                                    const HostTensor& lse) {
  flashattn::ForwardArgs a;
  a.problem = problem_of(c);
  a.q = tensor4(in.q);
  a.k = tensor4(in.k);
  a.v = tensor4(in.v);
  a.out = tensor4(out);
  a.lse = lse_view(lse);
  return a;
}

flashattn::BackwardArgs backward_args(const Case& c, const Inputs& in, const HostTensor& out,
                                      const HostTensor& dout, const HostTensor& lse,
                                      const HostTensor& dq, const HostTensor& dk,
                                      const HostTensor& dv) {
  flashattn::BackwardArgs a;
  a.problem = problem_of(c);
  a.q = tensor4(in.q);
  a.k = tensor4(in.k);
  a.v = tensor4(in.v);
  a.out = tensor4(out);
  a.dout = tensor4(dout);
  a.lse = lse_view(lse);
  a.dq = tensor4(dq);
  a.dk = tensor4(dk);
  a.dv = tensor4(dv);
  return a;
}

flashattn::cuda::standard::Context host_context() {
  static flashattn::cuda::CublasApi api = [] {
    flashattn::cuda::CublasApi a;
    a.gemm_strided_batched = host_gemm;
    return a;
  }();
  return flashattn::cuda::standard::Context{&api, nullptr, nullptr};
}

struct Workspace {
  explicit Workspace(size_t bytes) : bytes_(bytes) {
    data_ = static_cast<unsigned char*>(std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256));
    std::memset(data_, 0xFF, bytes + 256);  // NaN everywhere: reads of unwritten scratch show
  }
  ~Workspace() { std::free(data_); }
  void* data() const { return data_; }
  size_t size() const { return bytes_; }

 private:
  unsigned char* data_ = nullptr;
  size_t bytes_ = 0;
};

void expect(const flashattn_test::Comparison& c) {
  INFO(c.message);
  CHECK(c.ok);
}

const Case kCases[] = {
    {"single element", FLASHATTN_DTYPE_BFLOAT16, 1, 1, 1, 1, 1, 32, false, 0.0f, Layout::Contiguous},
    {"17x17 causal d=40", FLASHATTN_DTYPE_FLOAT16, 2, 17, 17, 3, 3, 40, true, 0.0f, Layout::Contiguous},
    {"GQA 4/2 d=64", FLASHATTN_DTYPE_BFLOAT16, 2, 33, 47, 4, 2, 64, false, 0.0f, Layout::Contiguous},
    {"MQA 4/1 causal d=80", FLASHATTN_DTYPE_FLOAT16, 1, 65, 65, 4, 1, 80, true, 0.0f, Layout::Contiguous},
    {"Nq<Nk causal padded d=24", FLASHATTN_DTYPE_BFLOAT16, 2, 13, 29, 2, 2, 24, true, 0.0f, Layout::Padded},
    {"Nq>Nk causal: masked rows, GQA", FLASHATTN_DTYPE_FLOAT16, 1, 29, 7, 6, 2, 16, true, 0.0f, Layout::Contiguous},
    {"Nk=1", FLASHATTN_DTYPE_BFLOAT16, 1, 39, 1, 2, 1, 8, false, 0.0f, Layout::Contiguous},
    {"Nq=1 causal", FLASHATTN_DTYPE_FLOAT16, 2, 1, 39, 2, 2, 12, true, 0.0f, Layout::Contiguous},
    {"packed QKV, odd d=3", FLASHATTN_DTYPE_BFLOAT16, 2, 21, 21, 4, 2, 3, false, 0.0f, Layout::PackedQKV},
    {"K/V broadcast over batch, scale 0.3", FLASHATTN_DTYPE_FLOAT16, 3, 10, 19, 2, 1, 32, false, 0.3f, Layout::BroadcastBatch},
};

}  // namespace

TEST_SUITE("cuda_standard_host") {

TEST_CASE("forward: the orchestration matches the emulated algorithm") {
  for (const Case& c : kCases) {
    CAPTURE(c.name);
    const Problem p = problem_of(c);
    REQUIRE(flashattn::cuda::standard::unsupported_reason(p) == nullptr);
    Inputs in = make_inputs(c);
    HostTensor out = like(c, c.nq, c.hq);
    HostTensor lse = HostTensor::lse(c.b, c.hq, c.nq);
    out.poison();
    lse.poison();
    const auto before = out.snapshot();

    const flashattn::ForwardArgs a = forward_args(c, in, out, lse);
    Workspace ws(flashattn::cuda::standard::workspace_size(p, false));
    g_gemm_calls = 0;
    g_gemm_error.clear();
    flashattn::cuda::standard::forward(a, ws.data(), ws.size(), host_context());
    CHECK(g_gemm_calls == 2);  // one S GEMM and one O GEMM for the whole problem
    CHECK(out.changed_outside(before) == -1);

    const RefProblem r = ref_of(c);
    std::vector<double> o_ref, lse_ref, o_emu, lse_emu;
    flashattn_test::reference_forward(r, in.q.to_double(), in.k.to_double(), in.v.to_double(),
                                      &o_ref, &lse_ref);
    gpu_test::emulate_standard_forward(r, c.dtype, in.q.to_double(), in.k.to_double(),
                                       in.v.to_double(), &o_emu, &lse_emu);
    const std::vector<double> o = out.to_double(), l = lse.to_double();
    expect(flashattn_test::check_no_nan("out", o));
    expect(flashattn_test::check_close("out vs emulation", o, o_emu,
                                       gpu_test::emulation_tolerance(c.dtype, o_emu)));
    expect(flashattn_test::check_close("lse vs emulation", l, lse_emu,
                                       1e-5 * std::max(1.0, flashattn_test::max_abs(lse_emu))));
    expect(flashattn_test::check_close(
        "out vs float64", o, o_ref,
        4 * flashattn_test::dtype_atol(c.dtype) * std::max(1.0, flashattn_test::max_abs(o_ref))));
  }
}

TEST_CASE("backward: the orchestration matches the emulated algorithm") {
  for (const Case& c : kCases) {
    CAPTURE(c.name);
    const Problem p = problem_of(c);
    Inputs in = make_inputs(c);
    const RefProblem r = ref_of(c);
    std::vector<double> o_ref, lse_ref;
    flashattn_test::reference_forward(r, in.q.to_double(), in.k.to_double(), in.v.to_double(),
                                      &o_ref, &lse_ref);
    HostTensor out = HostTensor::make(c.dtype, c.b, c.nq, c.hq, c.d);
    out.from_double(o_ref);
    HostTensor lse = HostTensor::lse(c.b, c.hq, c.nq);
    lse.from_double(lse_ref);
    HostTensor dout = like(c, c.nq, c.hq);
    dout.fill_normal(14);
    HostTensor dq = like(c, c.nq, c.hq), dk = like(c, c.nk, c.hkv), dv = like(c, c.nk, c.hkv);
    dq.poison();
    dk.poison();
    dv.poison();
    const auto dq_before = dq.snapshot(), dk_before = dk.snapshot(), dv_before = dv.snapshot();

    const flashattn::BackwardArgs a = backward_args(c, in, out, dout, lse, dq, dk, dv);
    Workspace ws(flashattn::cuda::standard::workspace_size(p, true));
    g_gemm_calls = 0;
    g_gemm_error.clear();
    flashattn::cuda::standard::backward(a, ws.data(), ws.size(), host_context());
    CHECK(g_gemm_calls == 5);  // S, dV, dP, dQ, dK: one GEMM each for the whole problem
    CHECK(dq.changed_outside(dq_before) == -1);
    CHECK(dk.changed_outside(dk_before) == -1);
    CHECK(dv.changed_outside(dv_before) == -1);

    std::vector<double> dq_ref, dk_ref, dv_ref, dq_emu, dk_emu, dv_emu;
    flashattn_test::reference_backward(r, in.q.to_double(), in.k.to_double(), in.v.to_double(),
                                       dout.to_double(), &dq_ref, &dk_ref, &dv_ref);
    gpu_test::emulate_standard_backward(r, c.dtype, in.q.to_double(), in.k.to_double(),
                                        in.v.to_double(), dout.to_double(), &dq_emu, &dk_emu,
                                        &dv_emu);
    const struct {
      const char* name;
      const HostTensor& got;
      const std::vector<double>& emu;
      const std::vector<double>& ref;
    } grads[] = {{"dq", dq, dq_emu, dq_ref}, {"dk", dk, dk_emu, dk_ref}, {"dv", dv, dv_emu, dv_ref}};
    for (const auto& g : grads) {
      const std::vector<double> got = g.got.to_double();
      expect(flashattn_test::check_no_nan(g.name, got));
      expect(flashattn_test::check_close(std::string(g.name) + " vs emulation", got, g.emu,
                                         gpu_test::emulation_tolerance(c.dtype, g.emu)));
      expect(flashattn_test::check_close(
          std::string(g.name) + " vs float64", got, g.ref,
          8 * flashattn_test::dtype_atol(c.dtype) * std::max(1.0, flashattn_test::max_abs(g.ref))));
    }
  }
}

// A causal problem with rows that see no key (0..29) and a key (50) that rows 64..79, in the
// same query tile as rows that see it, do not see. Runs the orchestration forward or backward.
struct MaskedProblem {
  static constexpr int64_t kNq = 100, kNk = 70, kNoKeyRows = 30, kKey = 50, kFirstRowSeeingKey = 80;
  const Case c{"masked", FLASHATTN_DTYPE_FLOAT16, 1, kNq, kNk, 2, 1, 16, true, 0.0f,
               Layout::Contiguous};

  Inputs inputs() const { return make_inputs(c); }
  static void poison_key(HostTensor* t) { t->set_nonfinite_row(kKey); }
  static void poison_keyless_rows(HostTensor* t) { t->set_nonfinite_rows(kNoKeyRows); }
  void forward(const Inputs& in, HostTensor* out, HostTensor* lse) const {
    *out = like(c, c.nq, c.hq);
    *lse = HostTensor::lse(c.b, c.hq, c.nq);
    const flashattn::ForwardArgs a = forward_args(c, in, *out, *lse);
    Workspace ws(flashattn::cuda::standard::workspace_size(a.problem, false));
    flashattn::cuda::standard::forward(a, ws.data(), ws.size(), host_context());
  }
  void backward(const Inputs& in, const HostTensor& out, const HostTensor& lse,
                const HostTensor& dout, HostTensor grads[3]) const {
    grads[0] = like(c, c.nq, c.hq);
    grads[1] = like(c, c.nk, c.hkv);
    grads[2] = like(c, c.nk, c.hkv);
    const flashattn::BackwardArgs a =
        backward_args(c, in, out, dout, lse, grads[0], grads[1], grads[2]);
    Workspace ws(flashattn::cuda::standard::workspace_size(a.problem, true));
    flashattn::cuda::standard::backward(a, ws.data(), ws.size(), host_context());
  }
};

// Rows [0, rows_end) but `skip` of two [1, N, H, D] results are equal (a NaN never is).
int64_t rows_differing(const HostTensor& got, const HostTensor& want, int64_t rows_end,
                       int64_t skip = -1) {
  int64_t n = 0;
  for (int64_t i = 0; i < rows_end; ++i)
    for (int64_t h = 0; h < got.shape(2) && i != skip; ++h)
      for (int64_t x = 0; x < got.shape(3); ++x) {
        n += !(got.get(0, i, h, x) == want.get(0, i, h, x));
      }
  return n;
}

TEST_CASE("forward: a NaN or infinity the mask hides never reaches out or lse") {
  using M = MaskedProblem;
  const M m;
  HostTensor want_out, want_lse, out, lse;
  m.forward(m.inputs(), &want_out, &want_lse);
  for (int which = 0; which < 3; ++which) {
    CAPTURE(which);  // 0: v at the hidden key, 1: k there, 2: q in the rows without keys
    Inputs in = m.inputs();
    if (which < 2) M::poison_key(which == 0 ? &in.v : &in.k);
    if (which == 2) M::poison_keyless_rows(&in.q);
    g_redo_calls = 0;
    m.forward(in, &out, &lse);
    CHECK(g_redo_calls == 1);
    const int64_t unaffected = which < 2 ? M::kFirstRowSeeingKey : M::kNq;
    CHECK(rows_differing(out, want_out, unaffected) == 0);
    for (int64_t h = 0; h < m.c.hq; ++h)
      for (int64_t i = 0; i < unaffected; ++i) CHECK(lse.get(0, h, i) == want_lse.get(0, h, i));
    for (int64_t h = 0; h < m.c.hq; ++h)
      for (int64_t i = 0; i < M::kNoKeyRows; ++i) {
        CHECK(lse.get(0, h, i) == -INFINITY);
        for (int64_t x = 0; x < m.c.d; ++x) CHECK(out.get(0, i, h, x) == 0.0);
      }
  }
}

TEST_CASE("backward: a NaN or infinity the mask hides never reaches dq, dk or dv") {
  using M = MaskedProblem;
  const M m;
  const Inputs clean = m.inputs();
  HostTensor out, lse;
  m.forward(clean, &out, &lse);
  HostTensor dout = like(m.c, m.c.nq, m.c.hq);
  dout.fill_normal(14);
  HostTensor want[3], got[3];
  m.backward(clean, out, lse, dout, want);
  // v, then k, at the hidden key. The rows that see it may get NaN in dq, and so may the dk and
  // dv of every key those rows see (here: all; D = rowsum(P dP) takes in the key's dP): the
  // other rows' dq must not. dV = P^T dO never reads v.
  Inputs in = m.inputs();
  M::poison_key(&in.v);
  g_redo_calls = 0;
  m.backward(in, out, lse, dout, got);
  CHECK(g_redo_calls == 3);  // after the dV, dQ and dK GEMMs
  CHECK(rows_differing(got[0], want[0], M::kFirstRowSeeingKey) == 0);
  CHECK(rows_differing(got[2], want[2], M::kNk) == 0);
  in = m.inputs();
  M::poison_key(&in.k);
  m.backward(in, out, lse, dout, got);
  CHECK(rows_differing(got[0], want[0], M::kFirstRowSeeingKey) == 0);
  // q, dout and out in the rows without keys: nothing changes.
  in = m.inputs();
  M::poison_keyless_rows(&in.q);
  HostTensor poisoned_dout = like(m.c, m.c.nq, m.c.hq), poisoned_out = like(m.c, m.c.nq, m.c.hq);
  poisoned_dout.from_double(dout.to_double());
  poisoned_out.from_double(out.to_double());
  M::poison_keyless_rows(&poisoned_dout);
  M::poison_keyless_rows(&poisoned_out);
  m.backward(in, poisoned_out, lse, poisoned_dout, got);
  CHECK(rows_differing(got[0], want[0], M::kNq) == 0);
  CHECK(rows_differing(got[1], want[1], M::kNk) == 0);
  CHECK(rows_differing(got[2], want[2], M::kNk) == 0);
}

TEST_CASE("workspace sizes: overflow is UNSUPPORTED, and limits are stated") {
  Problem p;
  p.dtype = DType::BF16;
  p.batch = (int64_t(1) << 31) - 1;
  p.seqlen_q = (int64_t(1) << 31) - 1;
  p.seqlen_k = (int64_t(1) << 31) - 1;
  p.heads_q = (int64_t(1) << 31) - 1;
  p.heads_kv = 1;
  p.head_dim = 256;
  p.head_dim_v = 256;
  p.algorithm = flashattn::Algorithm::Standard;
  try {
    (void)flashattn::cuda::standard::workspace_size(p, true);
    FAIL("workspace_size did not throw");
  } catch (const flashattn::Error& e) {
    CHECK(e.status() == FLASHATTN_ERROR_UNSUPPORTED);
  }
  // Stacked GQA rows beyond cuBLAS's int: unsupported, with a reason.
  p.batch = 1;
  p.seqlen_q = int64_t(1) << 30;
  p.seqlen_k = 16;
  p.heads_q = 8;
  p.heads_kv = 1;
  CHECK(flashattn::cuda::standard::unsupported_reason(p) != nullptr);
  p.dtype = DType::F32;
  p.heads_q = 1;
  p.seqlen_q = 16;
  CHECK(flashattn::cuda::standard::unsupported_reason(p) != nullptr);
  p.dtype = DType::F16;
  CHECK(flashattn::cuda::standard::unsupported_reason(p) == nullptr);
  // Forward: S (fp32) and P (fp16) of 1 x 1 x 16 x 16, and four packed 16 x 256 arrays.
  const size_t fwd = flashattn::cuda::standard::workspace_size(p, false);
  CHECK(fwd == 16 * 16 * 4 + 16 * 16 * 2 + 4 * 16 * 256 * 2);
}

}  // TEST_SUITE
