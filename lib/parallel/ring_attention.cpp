#include "parallel/ring_attention.hpp"

#include <algorithm>
#include <vector>

#include "core/error.hpp"

namespace flashattn {
namespace parallel {

namespace {

constexpr size_t kAlign = 256;  // every array of the workspace starts aligned, as allocate()'s

size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// A contiguous [batch, rows, heads, dim] array and its [batch, heads, rows] LSE.
Tensor4 contiguous(void* data, int64_t rows, int64_t heads, int64_t dim) {
  Tensor4 t;
  t.data = data;
  t.stride_head = dim;
  t.stride_seq = heads * dim;
  t.stride_batch = rows * heads * dim;
  return t;
}

LseView contiguous_lse(float* data, int64_t heads, int64_t rows) {
  LseView l;
  l.data = data;
  l.stride_seq = 1;
  l.stride_head = rows;
  l.stride_batch = heads * rows;
  return l;
}

// The view from row `row` on.
Tensor4 from_row(Tensor4 t, int64_t row, DType dtype) {
  t.data = static_cast<char*>(t.data) + row * t.stride_seq * static_cast<int64_t>(dtype_size(dtype));
  return t;
}
LseView from_row(LseView l, int64_t row) {
  if (l.data != nullptr) l.data += row * l.stride_seq;
  return l;
}

// The shard's sizes, and the workspace's arrays in order (offsets in bytes).
struct RingBuffers {
  int64_t batch, n, hq, hkv, d, dv;
  DType dtype;
  size_t kv_bytes = 0;    // one shard of k then v, in dtype
  size_t grad_bytes = 0;  // one shard's fp32 dk then dv
  size_t kv[2] = {0, 0};
  size_t grad[2] = {0, 0};
  size_t part_out = 0, part_lse = 0, sum_out = 0, sum_lse = 0;  // forward
  size_t dq_sum = 0, part_dq = 0, part_dk = 0, part_dv = 0;     // backward
  size_t inner = 0;  // the attention calls' own workspace
  size_t total = 0;
};

RingBuffers layout_of(const Problem& p, bool backward) {
  RingBuffers w;
  w.batch = p.batch;
  w.n = p.seqlen_q;
  w.hq = p.heads_q;
  w.hkv = p.heads_kv;
  w.d = p.head_dim;
  w.dv = p.head_dim_v;
  w.dtype = p.dtype;
  const size_t e = dtype_size(p.dtype);
  const size_t rows = static_cast<size_t>(w.batch * w.n);
  const size_t k_elems = rows * static_cast<size_t>(w.hkv * w.d);
  const size_t v_elems = rows * static_cast<size_t>(w.hkv * w.dv);
  w.kv_bytes = (k_elems + v_elems) * e;
  w.grad_bytes = (k_elems + v_elems) * sizeof(float);
  const size_t o_elems = rows * static_cast<size_t>(w.hq * w.dv);
  const size_t q_elems = rows * static_cast<size_t>(w.hq * w.d);
  const size_t lse_bytes = rows * static_cast<size_t>(w.hq) * sizeof(float);
  size_t at = 0;
  auto take = [&](size_t bytes) {
    const size_t here = at;
    at += aligned(bytes);
    return here;
  };
  w.kv[0] = take(w.kv_bytes);
  w.kv[1] = take(w.kv_bytes);
  if (!backward) {
    w.part_out = take(o_elems * e);
    w.part_lse = take(lse_bytes);
    w.sum_out = take(o_elems * sizeof(float));
    w.sum_lse = take(lse_bytes);
  } else {
    w.grad[0] = take(w.grad_bytes);
    w.grad[1] = take(w.grad_bytes);
    w.dq_sum = take(q_elems * sizeof(float));
    w.part_dq = take(q_elems * e);
    w.part_dk = take(k_elems * e);
    w.part_dv = take(v_elems * e);
  }
  w.inner = at;
  w.total = at;
  return w;
}

// The shard of k and v packed in one array (k's rows, then v's), as it travels.
struct KvViews {
  Tensor4 k, v;
};
KvViews kv_views(const RingBuffers& w, void* base) {
  KvViews r;
  r.k = contiguous(base, w.n, w.hkv, w.d);
  const size_t k_bytes = static_cast<size_t>(w.batch * w.n * w.hkv * w.d) * dtype_size(w.dtype);
  r.v = contiguous(static_cast<char*>(base) + k_bytes, w.n, w.hkv, w.dv);
  return r;
}
KvViews grad_views(const RingBuffers& w, void* base) {
  KvViews r;
  r.k = contiguous(base, w.n, w.hkv, w.d);
  const size_t k_bytes = static_cast<size_t>(w.batch * w.n * w.hkv * w.d) * sizeof(float);
  r.v = contiguous(static_cast<char*>(base) + k_bytes, w.n, w.hkv, w.dv);
  return r;
}

GlobalMask global_mask(const Problem& p) { return GlobalMask{p.window_left, p.window_right}; }

// The problem of one call: its rows and keys, its window, none of the per-row terms that the
// ring applies once (sinks) rather than per part.
Problem call_problem(const Problem& local, const RingCall& c) {
  Problem p = local;
  p.seqlen_q = c.q_end - c.q_begin;
  p.seqlen_k = c.k_end - c.k_begin;
  p.total_q = p.batch * p.seqlen_q;
  p.total_k = p.batch * p.seqlen_k;
  p.window_left = c.window_left;
  p.window_right = c.window_right;
  p.causal = c.window_right == 0;
  p.sinks = false;
  return p;
}

std::vector<std::vector<RingCall>> plan_of(const RingSetup& s, const Problem& p) {
  std::vector<std::vector<RingCall>> steps;
  for (int64_t step = 0; step < s.ranks; ++step) {
    steps.push_back(ring_calls(s.layout, s.ranks, s.rank, shard_at_step(s.ranks, s.rank, step),
                               p.seqlen_q, global_mask(p)));
  }
  return steps;
}

RingOp op_of(RingOpKind kind, const RingBuffers& w, int64_t rows, int64_t heads, int64_t dim) {
  RingOp op;
  op.kind = kind;
  op.dtype = w.dtype;
  op.batch = w.batch;
  op.rows = rows;
  op.heads = heads;
  op.dim = dim;
  return op;
}

void pack_shard(Backend& backend, const RingBuffers& w, const Tensor4& k, const Tensor4& v,
                const KvViews& dst) {
  RingOp op = op_of(RingOpKind::Copy, w, w.n, w.hkv, w.d);
  op.src = k;
  op.dst = dst.k;
  backend.ring_op(op);
  op.dim = w.dv;
  op.src = v;
  op.dst = dst.v;
  backend.ring_op(op);
}

}  // namespace

size_t ring_workspace_size(const Backend& backend, const RingSetup& setup, const Problem& local,
                           bool backward) {
  const RingBuffers w = layout_of(local, backward);
  size_t inner = 0;
  for (const auto& step : plan_of(setup, local)) {
    for (const RingCall& c : step) {
      const Problem p = call_problem(local, c);
      backend.check_supported(p, backward);
      inner = std::max(inner, backend.workspace_size(p, backward));
    }
  }
  size_t total;
  if (__builtin_add_overflow(w.total, inner, &total)) {
    fail(FLASHATTN_ERROR_OUT_OF_MEMORY, "context parallelism: the workspace overflows a size_t");
  }
  return total;
}

void ring_forward(Backend& backend, RingTransport& transport, const RingSetup& setup,
                  const ForwardArgs& local, Workspace ws) {
  const Problem& lp = local.problem;
  const RingBuffers w = layout_of(lp, false);
  char* base = static_cast<char*>(ws.data);
  const Workspace inner{base + w.inner, ws.size - w.inner};
  KvViews kv[2] = {kv_views(w, base + w.kv[0]), kv_views(w, base + w.kv[1])};
  const Tensor4 part_out = contiguous(base + w.part_out, w.n, w.hq, w.dv);
  const LseView part_lse = contiguous_lse(reinterpret_cast<float*>(base + w.part_lse), w.hq, w.n);
  const Tensor4 sum_out = contiguous(base + w.sum_out, w.n, w.hq, w.dv);
  const LseView sum_lse = contiguous_lse(reinterpret_cast<float*>(base + w.sum_lse), w.hq, w.n);

  pack_shard(backend, w, local.k, local.v, kv[0]);
  RingOp init = op_of(RingOpKind::FoldInit, w, w.n, w.hq, w.dv);
  init.dst = sum_out;
  init.dst_lse = sum_lse;
  backend.ring_op(init);

  const auto steps = plan_of(setup, lp);
  for (int64_t step = 0; step < setup.ranks; ++step) {
    const int cur = static_cast<int>(step % 2);
    int ticket = -1;
    if (step + 1 < setup.ranks) {
      ticket = transport.start(base + w.kv[cur], base + w.kv[1 - cur], w.kv_bytes);
    }
    for (const RingCall& c : steps[static_cast<size_t>(step)]) {
      ForwardArgs a;
      a.problem = call_problem(lp, c);
      a.q = from_row(local.q, c.q_begin, w.dtype);
      a.k = from_row(kv[cur].k, c.k_begin, w.dtype);
      a.v = from_row(kv[cur].v, c.k_begin, w.dtype);
      a.out = from_row(part_out, c.q_begin, w.dtype);
      a.lse = from_row(part_lse, c.q_begin);
      backend.forward(a, inner);
      RingOp fold = op_of(RingOpKind::Fold, w, c.q_end - c.q_begin, w.hq, w.dv);
      fold.src = a.out;
      fold.src_lse = a.lse;
      fold.dst = from_row(sum_out, c.q_begin, DType::F32);
      fold.dst_lse = from_row(sum_lse, c.q_begin);
      backend.ring_op(fold);
    }
    if (ticket >= 0) transport.wait(ticket);
  }

  RingOp finish = op_of(RingOpKind::FoldFinish, w, w.n, w.hq, w.dv);
  finish.src = sum_out;
  finish.src_lse = sum_lse;
  finish.dst = local.out;
  finish.dst_lse = local.lse;
  if (lp.sinks) finish.sinks = local.variants.sinks;
  backend.ring_op(finish);
}

void ring_backward(Backend& backend, RingTransport& transport, const RingSetup& setup,
                   const BackwardArgs& local, Workspace ws) {
  const Problem& lp = local.problem;
  const RingBuffers w = layout_of(lp, true);
  char* base = static_cast<char*>(ws.data);
  const Workspace inner{base + w.inner, ws.size - w.inner};
  KvViews kv[2] = {kv_views(w, base + w.kv[0]), kv_views(w, base + w.kv[1])};
  KvViews grad[2] = {grad_views(w, base + w.grad[0]), grad_views(w, base + w.grad[1])};
  const Tensor4 dq_sum = contiguous(base + w.dq_sum, w.n, w.hq, w.d);
  const Tensor4 part_dq = contiguous(base + w.part_dq, w.n, w.hq, w.d);
  const Tensor4 part_dk = contiguous(base + w.part_dk, w.n, w.hkv, w.d);
  const Tensor4 part_dv = contiguous(base + w.part_dv, w.n, w.hkv, w.dv);

  pack_shard(backend, w, local.k, local.v, kv[0]);
  RingOp zero = op_of(RingOpKind::Zero, w, w.n, w.hq, w.d);
  zero.dst = dq_sum;
  backend.ring_op(zero);
  zero.heads = w.hkv;
  zero.dst = grad[0].k;
  backend.ring_op(zero);
  zero.dim = w.dv;
  zero.dst = grad[0].v;
  backend.ring_op(zero);

  auto add = [&](const Tensor4& src, const Tensor4& dst, int64_t rows, int64_t heads,
                 int64_t dim) {
    RingOp op = op_of(RingOpKind::Add, w, rows, heads, dim);
    op.src = src;
    op.dst = dst;
    backend.ring_op(op);
  };

  const auto steps = plan_of(setup, lp);
  int grad_ticket = -1;  // the gradients arriving for this step's shard
  for (int64_t step = 0; step < setup.ranks; ++step) {
    const int cur = static_cast<int>(step % 2);
    int kv_ticket = -1;
    if (step + 1 < setup.ranks) {
      kv_ticket = transport.start(base + w.kv[cur], base + w.kv[1 - cur], w.kv_bytes);
    }
    for (const RingCall& c : steps[static_cast<size_t>(step)]) {
      BackwardArgs a;
      a.problem = call_problem(lp, c);
      a.q = from_row(local.q, c.q_begin, w.dtype);
      a.out = from_row(local.out, c.q_begin, w.dtype);
      a.dout = from_row(local.dout, c.q_begin, w.dtype);
      a.lse = from_row(local.lse, c.q_begin);
      a.k = from_row(kv[cur].k, c.k_begin, w.dtype);
      a.v = from_row(kv[cur].v, c.k_begin, w.dtype);
      a.dq = from_row(part_dq, c.q_begin, w.dtype);
      a.dk = from_row(part_dk, c.k_begin, w.dtype);
      a.dv = from_row(part_dv, c.k_begin, w.dtype);
      backend.backward(a, inner);
      if (grad_ticket >= 0) {  // the shard's gradients from the ranks before: here by now
        transport.wait(grad_ticket);
        grad_ticket = -1;
      }
      const int64_t rows = c.q_end - c.q_begin, keys = c.k_end - c.k_begin;
      add(a.dq, from_row(dq_sum, c.q_begin, DType::F32), rows, w.hq, w.d);
      add(a.dk, from_row(grad[cur].k, c.k_begin, DType::F32), keys, w.hkv, w.d);
      add(a.dv, from_row(grad[cur].v, c.k_begin, DType::F32), keys, w.hkv, w.dv);
    }
    if (grad_ticket >= 0) {
      transport.wait(grad_ticket);
      grad_ticket = -1;
    }
    // This shard's gradients go on to the next rank; the last step's return to their owner.
    grad_ticket = transport.start(base + w.grad[cur], base + w.grad[1 - cur], w.grad_bytes);
    if (kv_ticket >= 0) transport.wait(kv_ticket);
  }
  transport.wait(grad_ticket);

  const KvViews& own = grad[setup.ranks % 2];
  RingOp store = op_of(RingOpKind::Store, w, w.n, w.hq, w.d);
  store.src = dq_sum;
  store.dst = local.dq;
  backend.ring_op(store);
  store.heads = w.hkv;
  store.src = own.k;
  store.dst = local.dk;
  backend.ring_op(store);
  store.dim = w.dv;
  store.src = own.v;
  store.dst = local.dv;
  backend.ring_op(store);
  if (local.dsinks.data != nullptr) {
    RingOp sg = op_of(RingOpKind::SinkGrad, w, w.n, w.hq, w.dv);
    sg.src = local.out;
    sg.dst = local.dout;
    sg.src_lse = local.lse;
    sg.sinks = local.variants.sinks;
    sg.dsinks = local.dsinks;
    backend.ring_op(sg);
  }
}

}  // namespace parallel
}  // namespace flashattn
