#include "common/cp_check.hpp"

#include <doctest/doctest.h>

#include <thread>

#include "common/reference.hpp"
#include "common/tolerance.hpp"

namespace flashattn_test {

SharedRing::SharedRing(int ranks, Copy copy)
    : ranks_(ranks), copy_(std::move(copy)), posted_(static_cast<size_t>(ranks)) {}

int SharedRing::exchange(int rank, const void* send, void* recv, size_t bytes) {
  posted_[static_cast<size_t>(rank)] = {send, bytes};
  barrier();
  const Posted& from = posted_[static_cast<size_t>((rank + ranks_ - 1) % ranks_)];
  const int status = from.bytes == bytes ? 0 : 1;
  if (status == 0) copy_(recv, from.data, bytes);
  barrier();
  return status;
}

void SharedRing::barrier() {
  std::unique_lock<std::mutex> lock(mutex_);
  const int generation = generation_;
  if (++waiting_ == ranks_) {
    waiting_ = 0;
    ++generation_;
    cv_.notify_all();
  } else {
    cv_.wait(lock, [&] { return generation != generation_; });
  }
}

int ring_exchange(void* user, const void* send, void* recv, size_t bytes) {
  auto* link = static_cast<RankLink*>(user);
  ++link->calls;
  if (link->fail_with != 0) return link->fail_with;
  return link->ring->exchange(link->rank, send, recv, bytes);
}

std::string CpCase::label() const {
  return std::string(dtype_label(dtype)) + " ranks " + std::to_string(ranks) +
         (layout == FLASHATTN_CP_LAYOUT_ZIGZAG ? " zigzag" : " contiguous") + " n " +
         std::to_string(n) + " B " + std::to_string(batch) + " heads " + std::to_string(hq) +
         "/" + std::to_string(hkv) + " d " + std::to_string(d) + "/" + std::to_string(dv) +
         (causal ? " causal" : "") +
         (window ? " window " + std::to_string(window_left) + "," + std::to_string(window_right)
                 : "") +
         (softcap > 0 ? " softcap" : "") + (sinks ? " sinks" : "");
}

int64_t cp_global_row(const CpCase& c, int rank, int64_t i) {
  if (c.layout == FLASHATTN_CP_LAYOUT_CONTIGUOUS) return rank * c.n + i;
  const int64_t half = c.n / 2;
  return i < half ? rank * half + i : (2 * c.ranks - 1 - rank) * half + (i - half);
}

namespace {

HostTensor shard_of(const CpCase& c, const HostTensor& global, int rank) {
  HostTensor s = HostTensor::make(global.dtype(), c.batch, c.n, global.shape(2), global.shape(3));
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t i = 0; i < c.n; ++i)
      for (int64_t h = 0; h < global.shape(2); ++h)
        for (int64_t x = 0; x < global.shape(3); ++x)
          s.set(b, i, h, x, global.get(b, cp_global_row(c, rank, i), h, x));
  return s;
}

void unshard(const CpCase& c, const HostTensor& shard, int rank, HostTensor* global) {
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t i = 0; i < c.n; ++i)
      for (int64_t h = 0; h < shard.shape(2); ++h)
        for (int64_t x = 0; x < shard.shape(3); ++x)
          global->set(b, cp_global_row(c, rank, i), h, x, shard.get(b, i, h, x));
}

void unshard_lse(const CpCase& c, const HostTensor& shard, int rank, HostTensor* global) {
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t h = 0; h < c.hq; ++h)
      for (int64_t i = 0; i < c.n; ++i)
        global->set(b, h, cp_global_row(c, rank, i), 0, shard.get(b, h, i));
}

struct Tensors {
  HostTensor q, k, v, out, lse, dout, dq, dk, dv, sinks, dsinks;
};

Tensors make_tensors(const CpCase& c, int64_t tokens) {
  Tensors t;
  t.q = HostTensor::make(c.dtype, c.batch, tokens, c.hq, c.d);
  t.k = HostTensor::make(c.dtype, c.batch, tokens, c.hkv, c.d);
  t.v = HostTensor::make(c.dtype, c.batch, tokens, c.hkv, c.dv);
  t.out = HostTensor::make(c.dtype, c.batch, tokens, c.hq, c.dv);
  t.lse = HostTensor::lse(c.batch, c.hq, tokens);
  t.dout = HostTensor::make(c.dtype, c.batch, tokens, c.hq, c.dv);
  t.dq = HostTensor::make(c.dtype, c.batch, tokens, c.hq, c.d);
  t.dk = HostTensor::make(c.dtype, c.batch, tokens, c.hkv, c.d);
  t.dv = HostTensor::make(c.dtype, c.batch, tokens, c.hkv, c.dv);
  t.sinks = HostTensor::vector(c.hq);
  t.dsinks = HostTensor::vector(c.hq);
  for (HostTensor* o : {&t.out, &t.lse, &t.dq, &t.dk, &t.dv, &t.dsinks}) o->poison();
  return t;
}

// The tensors placed in a rank's memory and the args that name them.
struct Placed {
  flashattn_tensor_t q, k, v, out, lse, dout, dq, dk, dv, sinks, dsinks;
  flashattn_options_t options;
  flashattn_args_t args;

  Placed(const CpCase& c, CpRank& rank, const Tensors& t) {
    q = rank.place(t.q);
    k = rank.place(t.k);
    v = rank.place(t.v);
    out = rank.place(t.out);
    lse = rank.place(t.lse);
    dout = rank.place(t.dout);
    dq = rank.place(t.dq);
    dk = rank.place(t.dk);
    dv = rank.place(t.dv);
    sinks = rank.place(t.sinks);
    dsinks = rank.place(t.dsinks);
    flashattn_options_init(&options);
    options.causal = c.causal ? 1 : 0;
    options.window = c.window;
    options.window_left = c.window_left;
    options.window_right = c.window_right;
    options.softcap = c.softcap;
    flashattn_args_init(&args);
    args.options = &options;
    args.q = &q;
    args.k = &k;
    args.v = &v;
    args.out = &out;
    args.lse = &lse;
    args.dout = &dout;
    args.dq = &dq;
    args.dk = &dk;
    args.dv = &dv;
    if (c.sinks) {
      args.sinks = &sinks;
      args.dsinks = &dsinks;
    }
  }
};

void fetch_outputs(CpRank& rank, Tensors* t) {
  for (HostTensor* o : {&t->out, &t->lse, &t->dq, &t->dk, &t->dv, &t->dsinks}) rank.fetch(*o);
}

struct RankResult {
  flashattn_status_t status = FLASHATTN_ERROR_INTERNAL;
  std::string message;
  Tensors t;
};

void run_rank(const CpCase& c, const Tensors& global, const CpRankFactory& make_rank,
              SharedRing* ring, int r, RankResult* res) {
  std::unique_ptr<CpRank> rank = make_rank(r);
  res->t = make_tensors(c, c.n);
  res->t.q = shard_of(c, global.q, r);
  res->t.k = shard_of(c, global.k, r);
  res->t.v = shard_of(c, global.v, r);
  res->t.dout = shard_of(c, global.dout, r);
  res->t.sinks.from_double(global.sinks.to_double());
  Placed p(c, *rank, res->t);
  RankLink link;
  link.ring = ring;
  link.rank = r;
  flashattn_cp_args_t cp;
  flashattn_cp_args_init(&cp);
  cp.ranks = c.ranks;
  cp.rank = r;
  cp.layout = c.layout;
  if (c.ranks > 1) rank->set_transport(&cp, &link);
  for (int backward = 0; backward < 2; ++backward) {
    size_t size = 0;
    void* ws = nullptr;
    if (c.caller_workspace) {
      res->status = flashattn_cp_workspace_size(&size, rank->context(), &cp, &p.args, backward);
      if (res->status != FLASHATTN_SUCCESS) {
        res->message = flashattn_last_error();
        return;
      }
      ws = rank->workspace(size);
    }
    res->status = backward ? flashattn_cp_backward(rank->context(), &cp, &p.args, ws, size)
                           : flashattn_cp_forward(rank->context(), &cp, &p.args, ws, size);
    if (res->status != FLASHATTN_SUCCESS) {
      res->message = flashattn_last_error();
      return;
    }
  }
  if (flashattn_context_synchronize(rank->context()) != FLASHATTN_SUCCESS) {
    res->status = FLASHATTN_ERROR_DEVICE;
    res->message = flashattn_last_error();
    return;
  }
  fetch_outputs(*rank, &res->t);
}

void expect(const Comparison& cmp, const CpCase& c) {
  INFO(c.label());
  INFO(cmp.message);
  CHECK(cmp.ok);
}

}  // namespace

void check_cp(const CpCase& c, const CpRankFactory& make_rank, const SharedRing::Copy& copy) {
  const int64_t tokens = c.tokens();
  Tensors g = make_tensors(c, tokens);
  g.q.fill_normal(11);
  g.k.fill_normal(12);
  g.v.fill_normal(13);
  g.dout.fill_normal(14);
  g.sinks.fill_normal(15);

  {  // One call over the whole sequence: the base of the rule.
    std::unique_ptr<CpRank> whole = make_rank(-1);
    Placed p(c, *whole, g);
    INFO(c.label());
    REQUIRE(flashattn_forward_ex(whole->context(), &p.args, nullptr, 0) == FLASHATTN_SUCCESS);
    REQUIRE(flashattn_backward_ex(whole->context(), &p.args, nullptr, 0) == FLASHATTN_SUCCESS);
    REQUIRE(flashattn_context_synchronize(whole->context()) == FLASHATTN_SUCCESS);
    fetch_outputs(*whole, &g);
  }

  SharedRing ring(c.ranks, copy);
  std::vector<RankResult> results(static_cast<size_t>(c.ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < c.ranks; ++r) {
    threads.emplace_back(run_rank, std::cref(c), std::cref(g), std::cref(make_rank), &ring, r,
                         &results[static_cast<size_t>(r)]);
  }
  for (std::thread& t : threads) t.join();

  Tensors got = make_tensors(c, tokens);
  std::vector<double> dsinks(static_cast<size_t>(c.hq), 0.0);
  for (int r = 0; r < c.ranks; ++r) {
    const RankResult& res = results[static_cast<size_t>(r)];
    INFO(c.label() << ", rank " << r << ": " << res.message);
    REQUIRE(res.status == FLASHATTN_SUCCESS);
    unshard(c, res.t.out, r, &got.out);
    unshard_lse(c, res.t.lse, r, &got.lse);
    unshard(c, res.t.dq, r, &got.dq);
    unshard(c, res.t.dk, r, &got.dk);
    unshard(c, res.t.dv, r, &got.dv);
    const std::vector<double> part = res.t.dsinks.to_double();
    for (int64_t h = 0; h < c.hq; ++h) dsinks[static_cast<size_t>(h)] += part[static_cast<size_t>(h)];
  }

  RefProblem p;
  p.batch = c.batch;
  p.seqlen_q = p.seqlen_k = tokens;
  p.heads_q = c.hq;
  p.heads_kv = c.hkv;
  p.head_dim = c.d;
  p.head_dim_v = c.dv;
  p.scale = library_scale(c.d);
  p.causal = c.causal;
  if (c.window) {
    p.window_left = c.window_left;
    p.window_right = c.window_right;
  }
  p.softcap = c.softcap;
  if (c.sinks) p.sinks = g.sinks.to_double();
  std::vector<double> out, lse, dq, dk, dv, ds;
  reference_forward(p, g.q.to_double(), g.k.to_double(), g.v.to_double(), &out, &lse);
  reference_backward(p, g.q.to_double(), g.k.to_double(), g.v.to_double(), g.dout.to_double(),
                     &dq, &dk, &dv, c.sinks ? &ds : nullptr);
  const double atol = dtype_atol(c.dtype);
  const double factor = c.softcap > 0 ? kSoftcapRuleFactor : kRuleFactor;
  expect(check_rule("out", got.out.to_double(), g.out.to_double(), out, atol, factor), c);
  expect(check_rule("lse", got.lse.to_double(), g.lse.to_double(), lse,
                    dtype_atol(FLASHATTN_DTYPE_FLOAT32), factor),
         c);
  expect(check_rule("dq", got.dq.to_double(), g.dq.to_double(), dq, atol, factor), c);
  expect(check_rule("dk", got.dk.to_double(), g.dk.to_double(), dk, atol, factor), c);
  expect(check_rule("dv", got.dv.to_double(), g.dv.to_double(), dv, atol, factor), c);
  if (c.sinks) expect(check_rule("dsinks", dsinks, g.dsinks.to_double(), ds, atol, factor), c);
}

}  // namespace flashattn_test
