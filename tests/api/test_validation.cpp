// Every validation error of the attention entry points: the exact status, a message naming the
// argument, and outputs left as they were. Views are checked before the backend is asked, so
// these hold whatever the backend supports.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "api_helpers.hpp"

using namespace api_test;

namespace {

// D = 128 so that the messages read like the documentation's ("k: head_dim 96 differs from q's
// 128").
Shape base_shape() {
  Shape s;
  s.head_dim = 128;
  return s;
}

struct Case {
  const char* what;
  std::function<void(Forward&)> edit;
  flashattn_status_t status;
  std::string needle;
  bool query_too;  // also rejected by flashattn_supported / flashattn_workspace_size (no data)
};

void set_shape(flashattn_tensor_t& t, int i, int64_t v) { t.shape[i] = v; }

std::vector<Case> forward_cases() {
  const auto F16 = FLASHATTN_DTYPE_FLOAT16;
  return {
      // NULL handles, views and data.
      {"q NULL", [](Forward&) {}, FLASHATTN_ERROR_INVALID_ARGUMENT, "q is NULL", true},
      {"k NULL", [](Forward&) {}, FLASHATTN_ERROR_INVALID_ARGUMENT, "k is NULL", true},
      {"v NULL", [](Forward&) {}, FLASHATTN_ERROR_INVALID_ARGUMENT, "v is NULL", true},
      {"out NULL", [](Forward&) {}, FLASHATTN_ERROR_INVALID_ARGUMENT, "out is NULL", false},
      {"q data NULL", [](Forward& f) { f.tq.data = nullptr; }, FLASHATTN_ERROR_INVALID_ARGUMENT,
       "q: data is NULL", false},
      {"k data NULL", [](Forward& f) { f.tk.data = nullptr; }, FLASHATTN_ERROR_INVALID_ARGUMENT,
       "k: data is NULL", false},
      {"v data NULL", [](Forward& f) { f.tv.data = nullptr; }, FLASHATTN_ERROR_INVALID_ARGUMENT,
       "v: data is NULL", false},
      {"out data NULL", [](Forward& f) { f.tout.data = nullptr; },
       FLASHATTN_ERROR_INVALID_ARGUMENT, "out: data is NULL", false},
      {"lse data NULL", [](Forward& f) { f.tlse.data = nullptr; },
       FLASHATTN_ERROR_INVALID_ARGUMENT, "lse: data is NULL", false},
      // Dtypes.
      {"zero-filled q", [](Forward& f) { std::memset(&f.tq, 0, sizeof f.tq); },
       FLASHATTN_ERROR_INVALID_DTYPE, "q: unknown dtype 0", true},
      {"unknown dtype", [](Forward& f) { f.tv.dtype = static_cast<flashattn_dtype_t>(9); },
       FLASHATTN_ERROR_INVALID_DTYPE, "v: unknown dtype 9", true},
      {"k dtype differs", [F16](Forward& f) { f.tk.dtype = F16; }, FLASHATTN_ERROR_INVALID_DTYPE,
       "k: dtype float16 differs from q's float32", true},
      {"v dtype differs", [](Forward& f) { f.tv.dtype = FLASHATTN_DTYPE_BFLOAT16; },
       FLASHATTN_ERROR_INVALID_DTYPE, "v: dtype bfloat16 differs from q's float32", true},
      {"out dtype differs", [F16](Forward& f) { f.tout.dtype = F16; },
       FLASHATTN_ERROR_INVALID_DTYPE, "out: dtype float16 differs from q's float32", false},
      {"lse not float32", [F16](Forward& f) { f.tlse.dtype = F16; },
       FLASHATTN_ERROR_INVALID_DTYPE, "lse: dtype float16, must be float32", false},
      // Ranks.
      {"q rank 3", [](Forward& f) { f.tq.rank = 3; }, FLASHATTN_ERROR_INVALID_SHAPE,
       "q: rank is 3, expected 4", true},
      {"k rank 5", [](Forward& f) { f.tk.rank = 5; }, FLASHATTN_ERROR_INVALID_SHAPE,
       "k: rank is 5, expected 4", true},
      {"v rank -1", [](Forward& f) { f.tv.rank = -1; }, FLASHATTN_ERROR_INVALID_SHAPE,
       "v: rank is -1, expected 4", true},
      {"out rank 0", [](Forward& f) { f.tout.rank = 0; }, FLASHATTN_ERROR_INVALID_SHAPE,
       "out: rank is 0, expected 4", false},
      {"lse rank 4", [](Forward& f) { f.tlse.rank = 4; }, FLASHATTN_ERROR_INVALID_SHAPE,
       "lse: rank is 4, expected 3", false},
      // Sizes.
      {"q seqlen 0", [](Forward& f) { set_shape(f.tq, 1, 0); }, FLASHATTN_ERROR_INVALID_SHAPE,
       "q: shape[1] (seqlen) is 0, must be >= 1", true},
      {"k batch -2", [](Forward& f) { set_shape(f.tk, 0, -2); }, FLASHATTN_ERROR_INVALID_SHAPE,
       "k: shape[0] (batch) is -2, must be >= 1", true},
      {"q seqlen 2^31", [](Forward& f) { set_shape(f.tq, 1, int64_t(1) << 31); },
       FLASHATTN_ERROR_INVALID_SHAPE, "q: shape[1] (seqlen) is 2147483648, exceeds 2^31 - 1",
       true},
      {"k head_dim differs",
       [](Forward& f) { set_shape(f.tk, 3, 96); }, FLASHATTN_ERROR_INVALID_SHAPE,
       "k: head_dim 96 differs from q's 128", true},
      {"v head_dim above 256", [](Forward& f) { set_shape(f.tv, 3, 300); },
       FLASHATTN_ERROR_INVALID_SHAPE, "v: head_dim 300 exceeds the maximum 256", true},
      {"out without v's head_dim (v's may differ from q's)",
       [](Forward& f) { set_shape(f.tv, 3, 64); }, FLASHATTN_ERROR_INVALID_SHAPE,
       "out: shape [2, 5, 4, 128], expected [2, 5, 4, 64] (q's sizes with v's head_dim)", false},
      {"k batch differs", [](Forward& f) { set_shape(f.tk, 0, 1); },
       FLASHATTN_ERROR_INVALID_SHAPE, "k: batch 1 differs from q's 2", true},
      {"v batch differs", [](Forward& f) { set_shape(f.tv, 0, 1); },
       FLASHATTN_ERROR_INVALID_SHAPE, "v: batch 1 differs from q's 2", true},
      {"v seqlen differs from k's", [](Forward& f) { set_shape(f.tv, 1, 6); },
       FLASHATTN_ERROR_INVALID_SHAPE, "v: seqlen 6 differs from k's 7", true},
      {"v heads differ from k's", [](Forward& f) { set_shape(f.tv, 2, 1); },
       FLASHATTN_ERROR_INVALID_SHAPE, "v: heads 1 differs from k's 2", true},
      {"head_dim 264 > 256",
       [](Forward& f) {
         for (flashattn_tensor_t* t : {&f.tq, &f.tk, &f.tv, &f.tout}) set_shape(*t, 3, 264);
       },
       FLASHATTN_ERROR_INVALID_SHAPE, "q: head_dim 264 exceeds the maximum 256", true},
      {"heads_q not a multiple of heads_kv",
       [](Forward& f) {
         set_shape(f.tq, 2, 3);
         set_shape(f.tout, 2, 3);
       },
       FLASHATTN_ERROR_INVALID_SHAPE, "q: heads 3 is not a multiple of k's heads 2", true},
      {"out shape differs", [](Forward& f) { set_shape(f.tout, 1, 4); },
       FLASHATTN_ERROR_INVALID_SHAPE, "out: shape [2, 4, 4, 128] differs from q's [2, 5, 4, 128]",
       false},
      {"lse shape differs", [](Forward& f) { set_shape(f.tlse, 2, 4); },
       FLASHATTN_ERROR_INVALID_SHAPE,
       "lse: shape [2, 4, 4], expected [batch, heads_q, seqlen_q] = [2, 4, 5]", false},
      // Strides.
      {"negative stride", [](Forward& f) { f.tq.strides[1] = -512; },
       FLASHATTN_ERROR_INVALID_STRIDE, "q: strides[1] (seqlen) is -512, must be >= 0", true},
      {"negative lse stride", [](Forward& f) { f.tlse.strides[0] = -1; },
       FLASHATTN_ERROR_INVALID_STRIDE, "lse: strides[0] (batch) is -1, must be >= 0", false},
      {"non-unit last stride", [](Forward& f) { f.tk.strides[3] = 2; },
       FLASHATTN_ERROR_INVALID_STRIDE, "k: strides[3] (head_dim) is 2, must be 1", true},
      {"strides overflow 64 bits",
       [](Forward& f) { f.tv.strides[1] = std::numeric_limits<int64_t>::max() / 4; },
       FLASHATTN_ERROR_INVALID_STRIDE, "v: shape [2, 7, 2, 128] with these strides overflows 64 bits",
       true},
      {"sum of offsets overflows",
       [](Forward& f) {
         f.tq.strides[0] = std::numeric_limits<int64_t>::max() - 10;
         f.tq.strides[1] = 1000;
       },
       FLASHATTN_ERROR_INVALID_STRIDE, "q: shape [2, 5, 4, 128] with these strides overflows", true},
      {"extent past 2^56 bytes", [](Forward& f) { f.tq.strides[0] = int64_t(1) << 60; },
       FLASHATTN_ERROR_INVALID_STRIDE, "q: shape [2, 5, 4, 128] with these strides spans more than",
       true},
      {"out writes an element twice", [](Forward& f) { f.tout.strides[1] = 0; },
       FLASHATTN_ERROR_INVALID_STRIDE, "out: strides overlap", false},
      {"out rows overlap", [](Forward& f) { f.tout.strides[2] = 64; },
       FLASHATTN_ERROR_INVALID_STRIDE, "out: strides overlap", false},
      {"lse written twice", [](Forward& f) { f.tlse.strides[1] = 0; },
       FLASHATTN_ERROR_INVALID_STRIDE, "lse: strides overlap", false},
      // Memory.
      {"misaligned out",
       [](Forward& f) { f.tout.data = static_cast<char*>(f.tout.data) + 2; },
       FLASHATTN_ERROR_INVALID_MEMORY, "out: data", false},
      {"out is q", [](Forward& f) { f.tout.data = f.tq.data; }, FLASHATTN_ERROR_INVALID_MEMORY,
       "out: shares memory with q", false},
  };
}

flashattn_status_t run_case(Forward& f, flashattn_context_t ctx, const std::string& what) {
  const flashattn_tensor_t* q = what == "q NULL" ? nullptr : &f.tq;
  const flashattn_tensor_t* k = what == "k NULL" ? nullptr : &f.tk;
  const flashattn_tensor_t* v = what == "v NULL" ? nullptr : &f.tv;
  const flashattn_tensor_t* out = what == "out NULL" ? nullptr : &f.tout;
  return flashattn_forward(ctx, q, k, v, out, &f.tlse, nullptr, nullptr, 0);
}

}  // namespace

TEST_SUITE("validation") {
  TEST_CASE("forward: every bad view is named, and out and lse stay untouched") {
    Context ctx;
    for (const Case& c : forward_cases()) {
      CAPTURE(c.what);
      Forward f(base_shape());
      c.edit(f);
      EXPECT_STATUS(run_case(f, ctx, c.what), c.status, c.needle);
      CHECK(contains(flashattn_last_error(), "flashattn_forward: "));
      CHECK(f.untouched());
    }
  }

  TEST_CASE("supported and workspace_size reject the same views, data not needed") {
    Context ctx;
    for (const Case& c : forward_cases()) {
      if (!c.query_too) continue;
      CAPTURE(c.what);
      Forward f(base_shape());
      c.edit(f);
      const flashattn_tensor_t* q = std::string(c.what) == "q NULL" ? nullptr : &f.tq;
      const flashattn_tensor_t* k = std::string(c.what) == "k NULL" ? nullptr : &f.tk;
      const flashattn_tensor_t* v = std::string(c.what) == "v NULL" ? nullptr : &f.tv;
      for (int backward = 0; backward < 2; ++backward) {
        EXPECT_STATUS(flashattn_supported(ctx, q, k, v, nullptr, backward), c.status, c.needle);
        size_t ws = 777;
        EXPECT_STATUS(flashattn_workspace_size(&ws, ctx, q, k, v, nullptr, backward), c.status,
                      c.needle);
        CHECK(ws == 777);
      }
    }
  }

  TEST_CASE("the queries take NULL data") {
    Context ctx;
    Forward f(base_shape());
    f.tq.data = f.tk.data = f.tv.data = nullptr;
    EXPECT_OK(flashattn_supported(ctx, &f.tq, &f.tk, &f.tv, nullptr, 0));
    EXPECT_OK(flashattn_supported(ctx, &f.tq, &f.tk, &f.tv, nullptr, 1));
    size_t ws = 777;
    EXPECT_OK(flashattn_workspace_size(&ws, ctx, &f.tq, &f.tk, &f.tv, nullptr, 0));
    CHECK(ws != 777);
  }

  TEST_CASE("NULL context and NULL out of the entry points") {
    Forward f(base_shape());
    EXPECT_STATUS(f.run(nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  "flashattn_forward: ctx is NULL");
    CHECK(f.untouched());
    EXPECT_STATUS(flashattn_supported(nullptr, &f.tq, &f.tk, &f.tv, nullptr, 0),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, "flashattn_supported: ctx is NULL");
    size_t ws = 777;
    EXPECT_STATUS(flashattn_workspace_size(&ws, nullptr, &f.tq, &f.tk, &f.tv, nullptr, 0),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, "flashattn_workspace_size: ctx is NULL");
    Context ctx;
    EXPECT_STATUS(flashattn_workspace_size(nullptr, ctx, &f.tq, &f.tk, &f.tv, nullptr, 0),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, "flashattn_workspace_size: out is NULL");
    CHECK(ws == 777);
    Backward b(base_shape());
    EXPECT_STATUS(b.run(nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  "flashattn_backward: ctx is NULL");
    CHECK(b.grads_untouched());
  }

  TEST_CASE("a NULL lse is allowed in the forward") {
    Context ctx;
    Forward f(base_shape());
    EXPECT_OK(flashattn_forward(ctx, &f.tq, &f.tk, &f.tv, &f.tout, nullptr, nullptr, nullptr, 0));
    CHECK(all_poison(f.lse));
    CHECK(!all_poison(f.out));
  }

  TEST_CASE("workspace arguments") {
    Context ctx;
    Forward f(base_shape());
    EXPECT_STATUS(flashattn_forward(ctx, &f.tq, &f.tk, &f.tv, &f.tout, &f.tlse, nullptr, nullptr, 64),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, "workspace is NULL but workspace_size is 64");
    CHECK(f.untouched());
    size_t need = 0;
    REQUIRE_OK(flashattn_workspace_size(&need, ctx, &f.tq, &f.tk, &f.tv, nullptr, 0));
    // A workspace that overlaps an input would be scribbled over.
    std::vector<float> k_and_more(f.k.size() + need / sizeof(float) + 64);
    std::copy(f.k.begin(), f.k.end(), k_and_more.begin());
    f.tk.data = k_and_more.data();
    EXPECT_STATUS(flashattn_forward(ctx, &f.tq, &f.tk, &f.tv, &f.tout, &f.tlse, nullptr,
                                    k_and_more.data() + 16, need + 64),
                  FLASHATTN_ERROR_INVALID_MEMORY, "workspace: shares memory with k");
    CHECK(f.untouched());
    f.tk.data = f.k.data();
    if (need > 0) {
      std::vector<unsigned char> ws(need);
      EXPECT_STATUS(flashattn_forward(ctx, &f.tq, &f.tk, &f.tv, &f.tout, &f.tlse, nullptr,
                                      ws.data(), need - 1),
                    FLASHATTN_ERROR_WORKSPACE_TOO_SMALL, "workspace_size is");
      CHECK(f.untouched());
      EXPECT_OK(flashattn_forward(ctx, &f.tq, &f.tk, &f.tv, &f.tout, &f.tlse, nullptr, ws.data(),
                                  need));
    } else {
      MESSAGE("this backend needs no forward workspace for the shape; too-small not exercised");
    }
  }
}

TEST_SUITE("backward_validation") {
  struct BCase {
    const char* what;
    std::function<void(Backward&)> edit;
    flashattn_status_t status;
    std::string needle;
  };

  TEST_CASE("backward: every bad view is named, and dq, dk, dv stay untouched") {
    const std::vector<BCase> cases = {
        {"lse NULL", [](Backward&) {}, FLASHATTN_ERROR_INVALID_ARGUMENT,
         "lse is NULL; the backward needs the forward's lse"},
        {"dq NULL", [](Backward&) {}, FLASHATTN_ERROR_INVALID_ARGUMENT, "dq is NULL"},
        {"dout NULL", [](Backward&) {}, FLASHATTN_ERROR_INVALID_ARGUMENT, "dout is NULL"},
        {"dout data NULL", [](Backward& b) { b.tdout.data = nullptr; },
         FLASHATTN_ERROR_INVALID_ARGUMENT, "dout: data is NULL"},
        {"dv data NULL", [](Backward& b) { b.tdv.data = nullptr; },
         FLASHATTN_ERROR_INVALID_ARGUMENT, "dv: data is NULL"},
        {"dout shape", [](Backward& b) { b.tdout.shape[3] = 64; }, FLASHATTN_ERROR_INVALID_SHAPE,
         "dout: shape [2, 5, 4, 64] differs from q's [2, 5, 4, 128]"},
        {"dk shape is q's", [](Backward& b) { b.tdk = b.tdq; }, FLASHATTN_ERROR_INVALID_SHAPE,
         "dk: shape [2, 5, 4, 128] differs from k's [2, 7, 2, 128]"},
        {"dv dtype", [](Backward& b) { b.tdv.dtype = FLASHATTN_DTYPE_BFLOAT16; },
         FLASHATTN_ERROR_INVALID_DTYPE, "dv: dtype bfloat16 differs from v's float32"},
        {"out dtype", [](Backward& b) { b.tout.dtype = FLASHATTN_DTYPE_FLOAT16; },
         FLASHATTN_ERROR_INVALID_DTYPE, "out: dtype float16 differs from q's float32"},
        {"lse shape", [](Backward& b) { b.tlse.shape[0] = 1; }, FLASHATTN_ERROR_INVALID_SHAPE,
         "lse: shape [1, 4, 5], expected"},
        {"dq rank", [](Backward& b) { b.tdq.rank = 2; }, FLASHATTN_ERROR_INVALID_SHAPE,
         "dq: rank is 2, expected 4"},
        {"dk negative stride", [](Backward& b) { b.tdk.strides[2] = -128; },
         FLASHATTN_ERROR_INVALID_STRIDE, "dk: strides[2] (heads) is -128, must be >= 0"},
        {"dv writes twice", [](Backward& b) { b.tdv.strides[0] = 0; },
         FLASHATTN_ERROR_INVALID_STRIDE, "dv: strides overlap"},
        {"k head_dim", [](Backward& b) { b.tk.shape[3] = 96; }, FLASHATTN_ERROR_INVALID_SHAPE,
         "k: head_dim 96 differs from q's 128"},
        {"dq is dout", [](Backward& b) { b.tdq.data = b.tdout.data; },
         FLASHATTN_ERROR_INVALID_MEMORY, "dq: shares memory with dout"},
        {"dv is v", [](Backward& b) { b.tdv.data = b.tv.data; }, FLASHATTN_ERROR_INVALID_MEMORY,
         "dv: shares memory with v"},
        {"dk is dv", [](Backward& b) { b.tdk.data = b.tdv.data; },
         FLASHATTN_ERROR_INVALID_MEMORY, "dk: shares memory with dv"},
        {"lse inside dq", [](Backward& b) { b.tlse.data = b.dq.data() + 4; },
         FLASHATTN_ERROR_INVALID_MEMORY, "dq: shares memory with lse"},
    };
    Context ctx;
    for (const BCase& c : cases) {
      CAPTURE(c.what);
      Backward b(base_shape());
      c.edit(b);
      const std::string w = c.what;
      EXPECT_STATUS(flashattn_backward(ctx, &b.tq, &b.tk, &b.tv, &b.tout,
                                       w == "dout NULL" ? nullptr : &b.tdout,
                                       w == "lse NULL" ? nullptr : &b.tlse,
                                       w == "dq NULL" ? nullptr : &b.tdq, &b.tdk, &b.tdv, nullptr,
                                       nullptr, 0),
                    c.status, c.needle);
      CHECK(contains(flashattn_last_error(), "flashattn_backward: "));
      CHECK(b.grads_untouched());
    }
  }

  TEST_CASE("inputs may share memory: dout may be out") {
    Context ctx;
    Backward b(base_shape());
    b.tdout = b.tout;
    EXPECT_OK(b.run(ctx));
  }
}
