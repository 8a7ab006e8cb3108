// Context parallelism (flashattn_cp_forward / flashattn_cp_backward) on CPU contexts: `ranks`
// threads, each with its own context and its shard of the sequence, passing shards through an
// exchange function over shared memory. Each rank's out, lse, dq, dk, dv (and the ranks' summed
// dsinks) against one call over the whole sequence, by the tolerance rule against the float64
// reference; both layouts, causal and not, windows, softcap, sinks, GQA, d_v != d, every dtype;
// then the arguments the calls refuse.
#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/cp_check.hpp"
#include "cpu/harness.hpp"

using namespace flashattn_test;

namespace {

constexpr flashattn_dtype_t F32 = FLASHATTN_DTYPE_FLOAT32;
constexpr flashattn_dtype_t F16 = FLASHATTN_DTYPE_FLOAT16;
constexpr flashattn_dtype_t BF16 = FLASHATTN_DTYPE_BFLOAT16;

// A CPU rank: its own context (one thread: the ranks run side by side), the host tensors
// themselves, and an exchange over the ranks' shared memory.
class CpuRank final : public CpRank {
 public:
  CpuRank() : ctx_(1) {}
  flashattn_context_t context() override { return ctx_.get(); }
  flashattn_tensor_t place(const HostTensor& t) override { return t.view(); }
  void fetch(HostTensor&) override {}
  void* workspace(size_t bytes) override {
    ws_.resize(bytes);
    return ws_.data();
  }
  void set_transport(flashattn_cp_args_t* cp, RankLink* link) override {
    cp->exchange = ring_exchange;
    cp->exchange_user = link;
  }

 private:
  CpuContext ctx_;
  std::vector<unsigned char> ws_;
};

void check_cp(const CpCase& c) {
  flashattn_test::check_cp(
      c, [](int) { return std::unique_ptr<CpRank>(new CpuRank()); },
      [](void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); });
}

struct Shard {
  HostTensor q, k, v, out, lse, dout, dq, dk, dv;
  flashattn_tensor_t vq, vk, vv, vout, vlse, vdout, vdq, vdk, vdv;
  flashattn_options_t options;
  flashattn_args_t args;
  explicit Shard(const CpCase& c)
      : q(HostTensor::make(c.dtype, c.batch, c.n, c.hq, c.d)),
        k(HostTensor::make(c.dtype, c.batch, c.n, c.hkv, c.d)),
        v(HostTensor::make(c.dtype, c.batch, c.n, c.hkv, c.dv)),
        out(HostTensor::make(c.dtype, c.batch, c.n, c.hq, c.dv)),
        lse(HostTensor::lse(c.batch, c.hq, c.n)),
        dout(HostTensor::make(c.dtype, c.batch, c.n, c.hq, c.dv)),
        dq(HostTensor::make(c.dtype, c.batch, c.n, c.hq, c.d)),
        dk(HostTensor::make(c.dtype, c.batch, c.n, c.hkv, c.d)),
        dv(HostTensor::make(c.dtype, c.batch, c.n, c.hkv, c.dv)) {
    q.fill_normal(1);
    k.fill_normal(2);
    v.fill_normal(3);
    dout.fill_normal(4);
    vq = q.view();
    vk = k.view();
    vv = v.view();
    vout = out.view();
    vlse = lse.view();
    vdout = dout.view();
    vdq = dq.view();
    vdk = dk.view();
    vdv = dv.view();
    flashattn_options_init(&options);
    flashattn_args_init(&args);
    args.options = &options;
    args.q = &vq;
    args.k = &vk;
    args.v = &vv;
    args.out = &vout;
    args.lse = &vlse;
    args.dout = &vdout;
    args.dq = &vdq;
    args.dk = &vdk;
    args.dv = &vdv;
  }
};

CpCase make_case(flashattn_dtype_t dtype, int ranks, int64_t layout, int64_t n, bool causal) {
  CpCase c;
  c.dtype = dtype;
  c.ranks = ranks;
  c.layout = layout;
  c.n = n;
  c.causal = causal;
  return c;
}

}  // namespace

TEST_SUITE("cpu_cp") {
  TEST_CASE("ring attention equals one call over the sequence: layouts, causal or not") {
    for (int64_t layout : {FLASHATTN_CP_LAYOUT_CONTIGUOUS, FLASHATTN_CP_LAYOUT_ZIGZAG}) {
      for (int ranks : {1, 2, 3, 4}) {
        for (bool causal : {false, true}) check_cp(make_case(F32, ranks, layout, 6, causal));
      }
    }
  }

  TEST_CASE("shards across several tiles, GQA 4:1, the caller's workspace") {
    CpCase c = make_case(F32, 3, FLASHATTN_CP_LAYOUT_ZIGZAG, 90, true);
    c.batch = 1;
    c.hq = 4;
    c.hkv = 1;
    c.d = 32;
    c.dv = 32;
    c.caller_workspace = true;
    check_cp(c);
    c.layout = FLASHATTN_CP_LAYOUT_CONTIGUOUS;
    c.causal = false;
    check_cp(c);
  }

  TEST_CASE("16-bit dtypes, sinks and softcap") {
    for (flashattn_dtype_t dtype : {F16, BF16}) {
      CpCase c = make_case(dtype, 4, FLASHATTN_CP_LAYOUT_ZIGZAG, 10, true);
      c.sinks = true;
      check_cp(c);
      c.softcap = 2.0f;
      c.causal = false;
      c.layout = FLASHATTN_CP_LAYOUT_CONTIGUOUS;
      check_cp(c);
    }
  }

  TEST_CASE("sliding windows in global positions, with and without causal") {
    struct W {
      int32_t left, right;
      bool causal;
    };
    for (const W w : {W{4, 0, false}, W{3, 2, false}, W{7, -1, true}, W{-1, 5, false}, W{0, 0, false}}) {
      for (int64_t layout : {FLASHATTN_CP_LAYOUT_CONTIGUOUS, FLASHATTN_CP_LAYOUT_ZIGZAG}) {
        CpCase c = make_case(F32, 3, layout, 8, w.causal);
        c.window = 1;
        c.window_left = w.left;
        c.window_right = w.right;
        check_cp(c);
      }
    }
    CpCase c = make_case(BF16, 2, FLASHATTN_CP_LAYOUT_ZIGZAG, 12, true);
    c.window = 1;
    c.window_left = 5;
    c.sinks = true;
    check_cp(c);
  }

  TEST_CASE("the exchange's failure is the call's, with its value") {
    const int ranks = 2;
    SharedRing ring(ranks, nullptr);
    CpCase c = make_case(F32, ranks, FLASHATTN_CP_LAYOUT_CONTIGUOUS, 4, false);
    CpuContext ctx(1);
    Shard a(c);
    RankLink link;
    link.ring = &ring;
    link.fail_with = 7;
    flashattn_cp_args_t cp;
    flashattn_cp_args_init(&cp);
    cp.ranks = ranks;
    cp.exchange = ring_exchange;
    cp.exchange_user = &link;
    CHECK(flashattn_cp_forward(ctx.get(), &cp, &a.args, nullptr, 0) == FLASHATTN_ERROR_DEVICE);
    CHECK(std::string(flashattn_last_error()).find("returned 7") != std::string::npos);
    CHECK(link.calls == 1);
  }

  TEST_CASE("arguments the calls refuse, each with its status, before any transfer") {
    SharedRing ring(2, nullptr);
    CpCase c = make_case(F32, 2, FLASHATTN_CP_LAYOUT_ZIGZAG, 4, false);
    CpuContext ctx(1);
    Shard a(c);
    RankLink link;
    link.ring = &ring;
    auto base = [&] {
      flashattn_cp_args_t cp;
      flashattn_cp_args_init(&cp);
      cp.ranks = 2;
      cp.layout = FLASHATTN_CP_LAYOUT_ZIGZAG;
      cp.exchange = ring_exchange;
      cp.exchange_user = &link;
      return cp;
    };
    auto status = [&](const flashattn_cp_args_t& cp, const flashattn_args_t& args) {
      size_t size = 0;
      const flashattn_status_t q = flashattn_cp_workspace_size(&size, ctx.get(), &cp, &args, 0);
      const flashattn_status_t f = flashattn_cp_forward(ctx.get(), &cp, &args, nullptr, 0);
      CHECK(q == f);
      return f;
    };
    flashattn_cp_args_t cp = base();
    CHECK(flashattn_cp_forward(ctx.get(), nullptr, &a.args, nullptr, 0) ==
          FLASHATTN_ERROR_INVALID_ARGUMENT);
    cp.ranks = 0;
    CHECK(status(cp, a.args) == FLASHATTN_ERROR_INVALID_ARGUMENT);
    cp = base();
    cp.rank = 2;
    CHECK(status(cp, a.args) == FLASHATTN_ERROR_INVALID_ARGUMENT);
    cp = base();
    cp.layout = 2;
    CHECK(status(cp, a.args) == FLASHATTN_ERROR_INVALID_ARGUMENT);
    cp = base();
    cp.exchange = nullptr;
    CHECK(status(cp, a.args) == FLASHATTN_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(flashattn_last_error()).find("exchange is NULL") != std::string::npos);
    cp = base();
    int fake_comm = 0;
    cp.nccl_comm = &fake_comm;
    CHECK(status(cp, a.args) == FLASHATTN_ERROR_INVALID_ARGUMENT);
    cp = base();
    cp.size = sizeof(size_t);  // ranks defaults to 0 past the size: refused
    CHECK(status(cp, a.args) == FLASHATTN_ERROR_INVALID_ARGUMENT);

    cp = base();
    // An odd shard in the zigzag layout; q and k of different token counts.
    Shard odd(make_case(F32, 2, FLASHATTN_CP_LAYOUT_ZIGZAG, 5, false));
    CHECK(status(cp, odd.args) == FLASHATTN_ERROR_INVALID_SHAPE);
    Shard mixed(c);
    HostTensor longer_k = HostTensor::make(F32, c.batch, 2 * c.n, c.hkv, c.d);
    HostTensor longer_v = HostTensor::make(F32, c.batch, 2 * c.n, c.hkv, c.dv);
    mixed.vk = longer_k.view();
    mixed.vv = longer_v.view();
    CHECK(status(cp, mixed.args) == FLASHATTN_ERROR_INVALID_SHAPE);
    // ALiBi: not sharded in this version.
    HostTensor slopes = HostTensor::vector(c.hq);
    flashattn_tensor_t sv = slopes.view();
    Shard al(c);
    al.args.alibi_slopes = &sv;
    CHECK(status(cp, al.args) == FLASHATTN_ERROR_UNSUPPORTED);
    // A workspace below the query's answer.
    size_t need = 0;
    REQUIRE(flashattn_cp_workspace_size(&need, ctx.get(), &cp, &a.args, 1) == FLASHATTN_SUCCESS);
    std::vector<unsigned char> small(need - 1);
    CHECK(flashattn_cp_backward(ctx.get(), &cp, &a.args, small.data(), small.size()) ==
          FLASHATTN_ERROR_WORKSPACE_TOO_SMALL);
    CHECK(link.calls == 0);
  }

  TEST_CASE("cp args: init and sizes as the other size-prefixed structs") {
    flashattn_cp_args_t cp;
    std::memset(&cp, 0xab, sizeof cp);
    REQUIRE(flashattn_cp_args_init(&cp) == FLASHATTN_SUCCESS);
    CHECK(cp.size == sizeof cp);
    CHECK(cp.ranks == 1);
    CHECK(cp.rank == 0);
    CHECK(cp.layout == FLASHATTN_CP_LAYOUT_CONTIGUOUS);
    CHECK(cp.nccl_comm == nullptr);
    CHECK((cp.exchange == nullptr));
    CHECK(flashattn_cp_args_init_sized(&cp, sizeof(cp) - 4) == FLASHATTN_ERROR_INVALID_ARGUMENT);
    CHECK(flashattn_cp_args_init_sized(nullptr, sizeof(cp)) == FLASHATTN_ERROR_INVALID_ARGUMENT);
  }
}
