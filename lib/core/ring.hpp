// What context parallelism (lib/parallel, ring attention) asks of a backend: the elementwise
// steps between its attention calls, and a transport that moves a shard to the next rank.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/problem.hpp"

namespace flashattn {

// One elementwise step over [batch, rows, heads, dim] views (rows already offset to the first
// one concerned). "f32" names a float32 view; the other side is in `dtype`.
enum class RingOpKind : int {
  Copy,        // dst (dtype) = src (dtype): a shard of k or v packed for sending
  Zero,        // dst (f32) = 0
  Add,         // dst (f32) += src (dtype): a part's dq, dk or dv into its sum
  Store,       // dst (dtype) = src (f32), rounded once
  FoldInit,    // dst (f32 out) = 0, dst_lse = -inf: an empty sum of parts
  Fold,        // (dst, dst_lse) = merge of (dst, dst_lse) (f32) and (src (dtype), src_lse): the
               // arithmetic of flashattn_merge (a part with LSE -inf adds nothing; NaN spreads)
  FoldFinish,  // dst (dtype) = src (f32), dst_lse = src_lse (when dst_lse.data), with the sinks'
               // term joined to each row's sum when sinks.data (a row with LSE -inf stays so)
  SinkGrad,    // dsinks[h] = -sum over (b, i) of e^{sink_h - lse} * rowsum(dout * out), rows of
               // LSE -inf skipped: src = out, dst = dout (both dtype, read), src_lse = lse
};

struct RingOp {
  RingOpKind kind = RingOpKind::Copy;
  DType dtype = DType::F32;
  int64_t batch = 0;
  int64_t rows = 0;
  int64_t heads = 0;
  int64_t dim = 0;
  Tensor4 src, dst;
  LseView src_lse, dst_lse;
  Vector<const float> sinks;
  Vector<float> dsinks;
};

// Moves a shard around the ring: start() sends `bytes` at send to the next rank and receives as
// many from the previous rank into recv, after the work enqueued so far has produced send (and
// stopped reading recv); wait(ticket) makes later work wait for that exchange. A transport that
// cannot overlap (a caller's synchronous exchange) does the whole exchange in start().
class RingTransport {
 public:
  virtual ~RingTransport() = default;
  virtual int start(const void* send, void* recv, size_t bytes) = 0;
  virtual void wait(int ticket) = 0;
};

}  // namespace flashattn
