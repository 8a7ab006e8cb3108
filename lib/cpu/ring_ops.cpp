#include "cpu/ring_ops.hpp"

#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu/storage.hpp"

namespace flashattn {
namespace cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

template <class T>
T* row_at(const Tensor4& t, int64_t b, int64_t i, int64_t h) {
  return static_cast<T*>(t.data) + b * t.stride_batch + i * t.stride_seq + h * t.stride_head;
}

float* lse_at(const LseView& l, int64_t b, int64_t h, int64_t i) {
  return l.data + b * l.stride_batch + h * l.stride_head + i * l.stride_seq;
}

// Runs f(b, i, h) over every row of the op, a (batch, row) per pool item.
template <class F>
void for_rows(const RingOp& op, ThreadPool& pool, F f) {
  pool.parallel_for(op.batch * op.rows, [&](int64_t item, int) {
    const int64_t b = item / op.rows, i = item % op.rows;
    for (int64_t h = 0; h < op.heads; ++h) f(b, i, h);
  });
}

// One part (o, lse) folded into a running sum (acc, acc_lse): flashattn_merge's arithmetic.
template <class E>
void fold_row(float* acc, float* acc_lse, const typename E::T* o, float lse, int64_t dim) {
  const float a = *acc_lse;
  if (std::isnan(a) || std::isnan(lse)) {
    *acc_lse = kNaN;
    for (int64_t d = 0; d < dim; ++d) acc[d] = kNaN;
    return;
  }
  if (lse == kNegInf) return;  // the part's keys are all hidden from the row: it adds nothing
  if (a == kNegInf) {
    *acc_lse = lse;
    for (int64_t d = 0; d < dim; ++d) acc[d] = E::load(o[d]);
    return;
  }
  const float m = std::fmax(a, lse);
  if (m == std::numeric_limits<float>::infinity()) {  // weights undefined: as merge, NaN
    *acc_lse = m;
    for (int64_t d = 0; d < dim; ++d) acc[d] = kNaN;
    return;
  }
  const float wa = std::exp(a - m), wb = std::exp(lse - m);
  const float sum = wa + wb;
  const float ca = wa / sum, cb = wb / sum;
  for (int64_t d = 0; d < dim; ++d) acc[d] = ca * acc[d] + cb * E::load(o[d]);
  *acc_lse = m + std::log(sum);
}

template <class E>
void run(const RingOp& op, ThreadPool& pool) {
  using T = typename E::T;
  const int64_t dim = op.dim;
  switch (op.kind) {
    case RingOpKind::Copy:
      for_rows(op, pool, [&](int64_t b, int64_t i, int64_t h) {
        const T* s = row_at<const T>(op.src, b, i, h);
        T* d = row_at<T>(op.dst, b, i, h);
        for (int64_t x = 0; x < dim; ++x) d[x] = s[x];
      });
      return;
    case RingOpKind::Zero:
      for_rows(op, pool, [&](int64_t b, int64_t i, int64_t h) {
        float* d = row_at<float>(op.dst, b, i, h);
        for (int64_t x = 0; x < dim; ++x) d[x] = 0.0f;
      });
      return;
    case RingOpKind::Add:
      for_rows(op, pool, [&](int64_t b, int64_t i, int64_t h) {
        const T* s = row_at<const T>(op.src, b, i, h);
        float* d = row_at<float>(op.dst, b, i, h);
        for (int64_t x = 0; x < dim; ++x) d[x] += E::load(s[x]);
      });
      return;
    case RingOpKind::Store:
      for_rows(op, pool, [&](int64_t b, int64_t i, int64_t h) {
        const float* s = row_at<const float>(op.src, b, i, h);
        T* d = row_at<T>(op.dst, b, i, h);
        for (int64_t x = 0; x < dim; ++x) d[x] = E::store(s[x]);
      });
      return;
    case RingOpKind::FoldInit:
      for_rows(op, pool, [&](int64_t b, int64_t i, int64_t h) {
        float* d = row_at<float>(op.dst, b, i, h);
        for (int64_t x = 0; x < dim; ++x) d[x] = 0.0f;
        *lse_at(op.dst_lse, b, h, i) = kNegInf;
      });
      return;
    case RingOpKind::Fold:
      for_rows(op, pool, [&](int64_t b, int64_t i, int64_t h) {
        fold_row<E>(row_at<float>(op.dst, b, i, h), lse_at(op.dst_lse, b, h, i),
                    row_at<const T>(op.src, b, i, h), *lse_at(op.src_lse, b, h, i), dim);
      });
      return;
    case RingOpKind::FoldFinish:
      for_rows(op, pool, [&](int64_t b, int64_t i, int64_t h) {
        const float* s = row_at<const float>(op.src, b, i, h);
        T* d = row_at<T>(op.dst, b, i, h);
        float lse = *lse_at(op.src_lse, b, h, i);
        float scale = 1.0f;
        // The sinks join each row's sum as one more part of output 0; a row that sees no key
        // keeps output 0 and LSE -inf.
        if (op.sinks.data != nullptr && lse != kNegInf && !std::isnan(lse)) {
          const float sink = op.sinks.at(h);
          const float m = std::fmax(lse, sink);
          if (m != std::numeric_limits<float>::infinity()) {
            const float total = m + std::log(std::exp(lse - m) + std::exp(sink - m));
            scale = std::exp(lse - total);
            lse = total;
          }
        }
        for (int64_t x = 0; x < dim; ++x) d[x] = E::store(s[x] * scale);
        if (op.dst_lse.data != nullptr) *lse_at(op.dst_lse, b, h, i) = lse;
      });
      return;
    case RingOpKind::SinkGrad:
      // In double and in (batch, row) order, one head at a time: the result depends on nothing
      // but the inputs.
      for (int64_t h = 0; h < op.heads; ++h) {
        const double sink = op.sinks.at(h);
        double sum = 0.0;
        for (int64_t b = 0; b < op.batch; ++b) {
          for (int64_t i = 0; i < op.rows; ++i) {
            const float lse = *lse_at(op.src_lse, b, h, i);
            if (lse == kNegInf) continue;
            const T* o = row_at<const T>(op.src, b, i, h);
            const T* g = row_at<const T>(op.dst, b, i, h);
            float delta = 0.0f;
            for (int64_t x = 0; x < dim; ++x) delta += E::load(g[x]) * E::load(o[x]);
            sum += std::exp(sink - static_cast<double>(lse)) * static_cast<double>(delta);
          }
        }
        op.dsinks.data[h * op.dsinks.stride] = static_cast<float>(-sum);
      }
      return;
  }
}

}  // namespace

void ring_op(const RingOp& op, ThreadPool& pool) {
  switch (op.dtype) {
    case DType::F32: return run<Fp32Storage>(op, pool);
    case DType::F16: return run<Fp16Storage>(op, pool);
    case DType::BF16: return run<Bf16Storage>(op, pool);
  }
}

}  // namespace cpu
}  // namespace flashattn
