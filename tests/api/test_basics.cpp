// Versions, status names, the last-error state, contexts, tensor helpers and options.
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <dlfcn.h>

#include "api_helpers.hpp"

using namespace api_test;

TEST_SUITE("version") {
  TEST_CASE("the loaded library's version is the header's") {
    CHECK(flashattn_version_number() == FLASHATTN_VERSION_NUMBER);
    CHECK(flashattn_version_number() / 10000 == FLASHATTN_VERSION_MAJOR);
    CHECK(std::string(flashattn_version_string()) == FLASHATTN_VERSION_STRING);
    const std::string expected = std::to_string(FLASHATTN_VERSION_MAJOR) + "." +
                                 std::to_string(FLASHATTN_VERSION_MINOR) + "." +
                                 std::to_string(FLASHATTN_VERSION_PATCH);
    CHECK(std::string(flashattn_version_string()) == expected);
    CHECK(flashattn_has_cuda() == FLASHATTN_HAS_CUDA);
  }
}

TEST_SUITE("status") {
  TEST_CASE("every status has its own name") {
    const struct {
      flashattn_status_t status;
      const char* name;
    } all[] = {
        {FLASHATTN_SUCCESS, "FLASHATTN_SUCCESS"},
        {FLASHATTN_ERROR_INVALID_ARGUMENT, "FLASHATTN_ERROR_INVALID_ARGUMENT"},
        {FLASHATTN_ERROR_INVALID_SHAPE, "FLASHATTN_ERROR_INVALID_SHAPE"},
        {FLASHATTN_ERROR_INVALID_DTYPE, "FLASHATTN_ERROR_INVALID_DTYPE"},
        {FLASHATTN_ERROR_INVALID_STRIDE, "FLASHATTN_ERROR_INVALID_STRIDE"},
        {FLASHATTN_ERROR_INVALID_MEMORY, "FLASHATTN_ERROR_INVALID_MEMORY"},
        {FLASHATTN_ERROR_WORKSPACE_TOO_SMALL, "FLASHATTN_ERROR_WORKSPACE_TOO_SMALL"},
        {FLASHATTN_ERROR_CONTEXT_BUSY, "FLASHATTN_ERROR_CONTEXT_BUSY"},
        {FLASHATTN_ERROR_UNSUPPORTED, "FLASHATTN_ERROR_UNSUPPORTED"},
        {FLASHATTN_ERROR_BACKEND_UNAVAILABLE, "FLASHATTN_ERROR_BACKEND_UNAVAILABLE"},
        {FLASHATTN_ERROR_OUT_OF_MEMORY, "FLASHATTN_ERROR_OUT_OF_MEMORY"},
        {FLASHATTN_ERROR_DEVICE_OUT_OF_MEMORY, "FLASHATTN_ERROR_DEVICE_OUT_OF_MEMORY"},
        {FLASHATTN_ERROR_DEVICE, "FLASHATTN_ERROR_DEVICE"},
        {FLASHATTN_ERROR_INTERNAL, "FLASHATTN_ERROR_INTERNAL"},
    };
    for (const auto& e : all) {
      CAPTURE(static_cast<int>(e.status));
      CHECK(std::string(flashattn_status_string(e.status)) == e.name);
    }
  }

  TEST_CASE("values are the documented, fixed ones") {
    CHECK(FLASHATTN_SUCCESS == 0);
    CHECK(FLASHATTN_ERROR_INVALID_ARGUMENT == 100);
    CHECK(FLASHATTN_ERROR_CONTEXT_BUSY == 106);
    CHECK(FLASHATTN_ERROR_UNSUPPORTED == 200);
    CHECK(FLASHATTN_ERROR_BACKEND_UNAVAILABLE == 201);
    CHECK(FLASHATTN_ERROR_OUT_OF_MEMORY == 300);
    CHECK(FLASHATTN_ERROR_DEVICE == 400);
    CHECK(FLASHATTN_ERROR_INTERNAL == 500);
  }

  TEST_CASE("a value that is no status is named unknown, never NULL") {
    for (int v : {-1, 1, 99, 107, 199, 202, 302, 401, 501, 12345}) {
      CAPTURE(v);
      const char* s = flashattn_status_string(static_cast<flashattn_status_t>(v));
      REQUIRE(s != nullptr);
      CHECK(std::string(s) == "FLASHATTN_UNKNOWN_STATUS");
    }
  }
}

TEST_SUITE("last_error") {
  TEST_CASE("a failure names the function and the argument; success clears it") {
    flashattn_options_t o;
    EXPECT_STATUS(flashattn_options_init_sized(nullptr, sizeof(flashattn_options_t)),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, "flashattn_options_init_sized: out is NULL");
    // Reading does not clear it.
    CHECK(std::string(flashattn_last_error()) == "flashattn_options_init_sized: out is NULL");
    CHECK(std::string(flashattn_last_error()) == "flashattn_options_init_sized: out is NULL");
    EXPECT_OK(flashattn_options_init(&o));
    CHECK(std::string(flashattn_last_error()).empty());
    CHECK(flashattn_last_error() != nullptr);
  }

  TEST_CASE("a later failure replaces the message") {
    EXPECT_STATUS(flashattn_options_init_sized(nullptr, sizeof(flashattn_options_t)),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, "out is NULL");
    EXPECT_STATUS(flashattn_context_set_num_threads(nullptr, 1), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  "flashattn_context_set_num_threads: ctx is NULL");
    CHECK(!contains(flashattn_last_error(), "options_init"));
  }

  TEST_CASE("flashattn_last_error_r copies, truncates and sizes like snprintf") {
    flashattn_options_init_sized(nullptr, sizeof(flashattn_options_t));
    const std::string msg = flashattn_last_error();
    REQUIRE(msg == "flashattn_options_init_sized: out is NULL");
    const size_t n = msg.size();

    CHECK(flashattn_last_error_r(nullptr, 0) == n);

    std::vector<char> big(n + 10, 'x');
    CHECK(flashattn_last_error_r(big.data(), big.size()) == n);
    CHECK(std::string(big.data()) == msg);
    CHECK(big[n + 1] == 'x');  // nothing written past the terminator

    std::vector<char> exact(n + 1, 'x');
    CHECK(flashattn_last_error_r(exact.data(), exact.size()) == n);
    CHECK(std::string(exact.data()) == msg);

    char small[9];
    std::memset(small, 'x', sizeof small);
    CHECK(flashattn_last_error_r(small, 8) == n);
    CHECK(std::string(small) == msg.substr(0, 7));
    CHECK(small[8] == 'x');

    char one[2] = {'x', 'x'};
    CHECK(flashattn_last_error_r(one, 1) == n);
    CHECK(one[0] == '\0');
    CHECK(one[1] == 'x');

    char untouched = 'x';
    CHECK(flashattn_last_error_r(&untouched, 0) == n);
    CHECK(untouched == 'x');

    // Copying does not change the state.
    CHECK(std::string(flashattn_last_error()) == msg);
  }

  TEST_CASE("flashattn_last_error_r after a success gives the empty string") {
    flashattn_options_t o;
    REQUIRE_OK(flashattn_options_init(&o));
    char buf[4] = {'x', 'x', 'x', 'x'};
    CHECK(flashattn_last_error_r(buf, sizeof buf) == 0);
    CHECK(buf[0] == '\0');
  }

  TEST_CASE("the message is per thread") {
    flashattn_options_init_sized(nullptr, sizeof(flashattn_options_t));
    std::string seen_by_other;
    std::string other_after_failure;
    std::thread t([&] {
      seen_by_other = flashattn_last_error();
      flashattn_context_synchronize(nullptr);
      other_after_failure = flashattn_last_error();
    });
    t.join();
    CHECK(seen_by_other.empty());
    CHECK(contains(other_after_failure, "flashattn_context_synchronize: ctx is NULL"));
    CHECK(std::string(flashattn_last_error()) == "flashattn_options_init_sized: out is NULL");
  }
}

TEST_SUITE("context") {
  TEST_CASE("create rejects a NULL out, an unknown backend and a negative device") {
    EXPECT_STATUS(flashattn_context_create(nullptr, FLASHATTN_BACKEND_CPU, 0),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, "flashattn_context_create: out is NULL");
    flashattn_context_t sentinel = reinterpret_cast<flashattn_context_t>(0x1234);
    flashattn_context_t ctx = sentinel;
    EXPECT_STATUS(flashattn_context_create(&ctx, static_cast<flashattn_backend_t>(7), 0),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, "backend is 7");
    CHECK(ctx == sentinel);
    EXPECT_STATUS(flashattn_context_create(&ctx, static_cast<flashattn_backend_t>(-1), 0),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, "backend is -1");
    CHECK(ctx == sentinel);
    EXPECT_STATUS(flashattn_context_create(&ctx, FLASHATTN_BACKEND_CPU, -1),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, "device is -1");
    CHECK(ctx == sentinel);
  }

  TEST_CASE("a CPU context answers its queries") {
    flashattn_context_t ctx = nullptr;
    EXPECT_OK(flashattn_context_create(&ctx, FLASHATTN_BACKEND_CPU, 0));
    REQUIRE(ctx != nullptr);
    flashattn_backend_t backend = FLASHATTN_BACKEND_AUTO;
    EXPECT_OK(flashattn_context_get_backend(&backend, ctx));
    CHECK(backend == FLASHATTN_BACKEND_CPU);
    int device = 42;
    EXPECT_OK(flashattn_context_get_device(&device, ctx));
    CHECK(device == -1);
    flashattn_cpu_kernels_t kernels = FLASHATTN_CPU_KERNELS_NONE;
    EXPECT_OK(flashattn_context_get_cpu_kernels(&kernels, ctx));
    CHECK(kernels >= FLASHATTN_CPU_KERNELS_GENERIC);
    CHECK(kernels <= FLASHATTN_CPU_KERNELS_AMX);
    void* stream = &device;
    EXPECT_OK(flashattn_context_get_stream(&stream, ctx));
    CHECK(stream == nullptr);
    EXPECT_OK(flashattn_context_set_stream(ctx, nullptr));
    EXPECT_OK(flashattn_context_set_num_threads(ctx, 1));
    EXPECT_OK(flashattn_context_set_num_threads(ctx, 0));
    EXPECT_OK(flashattn_context_synchronize(ctx));
    EXPECT_OK(flashattn_context_destroy(ctx));
  }

  TEST_CASE("the device number is ignored for a CPU context") {
    flashattn_context_t ctx = nullptr;
    EXPECT_OK(flashattn_context_create(&ctx, FLASHATTN_BACKEND_CPU, 3));
    int device = 42;
    EXPECT_OK(flashattn_context_get_device(&device, ctx));
    CHECK(device == -1);
    flashattn_context_destroy(ctx);
  }

  TEST_CASE("context functions reject NULL handles and outputs, leaving outputs alone") {
    Context ctx;
    flashattn_backend_t backend = FLASHATTN_BACKEND_AUTO;  // never an answer: a resolved backend
    EXPECT_STATUS(flashattn_context_get_backend(nullptr, ctx), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  "flashattn_context_get_backend: out is NULL");
    EXPECT_STATUS(flashattn_context_get_backend(&backend, nullptr),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, "ctx is NULL");
    CHECK(backend == FLASHATTN_BACKEND_AUTO);
    int device = 42;
    EXPECT_STATUS(flashattn_context_get_device(nullptr, ctx), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  "out is NULL");
    EXPECT_STATUS(flashattn_context_get_device(&device, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  "ctx is NULL");
    CHECK(device == 42);
    flashattn_cpu_kernels_t kernels = FLASHATTN_CPU_KERNELS_AVX2;
    EXPECT_STATUS(flashattn_context_get_cpu_kernels(nullptr, ctx), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  "flashattn_context_get_cpu_kernels: out is NULL");
    EXPECT_STATUS(flashattn_context_get_cpu_kernels(&kernels, nullptr),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, "ctx is NULL");
    CHECK(kernels == FLASHATTN_CPU_KERNELS_AVX2);
    void* stream = &device;
    EXPECT_STATUS(flashattn_context_get_stream(nullptr, ctx), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  "out is NULL");
    EXPECT_STATUS(flashattn_context_get_stream(&stream, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  "ctx is NULL");
    CHECK(stream == &device);
    EXPECT_STATUS(flashattn_context_set_stream(nullptr, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  "flashattn_context_set_stream: ctx is NULL");
    EXPECT_STATUS(flashattn_context_set_num_threads(nullptr, 1), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  "ctx is NULL");
    EXPECT_STATUS(flashattn_context_synchronize(nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  "flashattn_context_synchronize: ctx is NULL");
  }

  TEST_CASE("a CPU context takes no stream and no negative thread count") {
    Context ctx;
    int not_a_stream = 0;
    EXPECT_STATUS(flashattn_context_set_stream(ctx, &not_a_stream),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, "stream: a CPU context takes no stream");
    void* stream = &not_a_stream;
    EXPECT_OK(flashattn_context_get_stream(&stream, ctx));
    CHECK(stream == nullptr);
    EXPECT_STATUS(flashattn_context_set_num_threads(ctx, -1), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  "num_threads is -1");
  }

  TEST_CASE("destroy(NULL) is a no-op that succeeds and clears the message") {
    flashattn_options_init_sized(nullptr, sizeof(flashattn_options_t));
    EXPECT_OK(flashattn_context_destroy(nullptr));
  }

  TEST_CASE("a destroyed context is refused by every function, never read") {
    flashattn_context_t ctx = nullptr;
    REQUIRE_OK(flashattn_context_create(&ctx, FLASHATTN_BACKEND_CPU, 0));
    REQUIRE_OK(flashattn_context_destroy(ctx));
    const char* const stale = "ctx is not a live context";
    flashattn_backend_t backend = FLASHATTN_BACKEND_AUTO;
    EXPECT_STATUS(flashattn_context_get_backend(&backend, ctx), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  stale);
    CHECK(backend == FLASHATTN_BACKEND_AUTO);
    int device = 42;
    EXPECT_STATUS(flashattn_context_get_device(&device, ctx), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  stale);
    CHECK(device == 42);
    void* stream = &device;
    EXPECT_STATUS(flashattn_context_get_stream(&stream, ctx), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  stale);
    CHECK(stream == &device);
    EXPECT_STATUS(flashattn_context_set_stream(ctx, nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  stale);
    EXPECT_STATUS(flashattn_context_set_num_threads(ctx, 1), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  stale);
    EXPECT_STATUS(flashattn_context_synchronize(ctx), FLASHATTN_ERROR_INVALID_ARGUMENT, stale);
    flashattn_buffer_t buf = nullptr;
    EXPECT_STATUS(flashattn_buffer_create(&buf, ctx, 64), FLASHATTN_ERROR_INVALID_ARGUMENT, stale);
    CHECK(buf == nullptr);
    Backward b;
    EXPECT_STATUS(flashattn_supported(ctx, &b.tq, &b.tk, &b.tv, nullptr, 1),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, stale);
    size_t bytes = 7;
    EXPECT_STATUS(flashattn_workspace_size(&bytes, ctx, &b.tq, &b.tk, &b.tv, nullptr, 0),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, stale);
    CHECK(bytes == 7);
    Forward f;
    EXPECT_STATUS(f.run(ctx), FLASHATTN_ERROR_INVALID_ARGUMENT, "flashattn_forward: ctx");
    CHECK(f.untouched());
    EXPECT_STATUS(b.run(ctx), FLASHATTN_ERROR_INVALID_ARGUMENT, "flashattn_backward: ctx");
    CHECK(b.grads_untouched());
    // Destroyed twice: refused, not freed again.
    EXPECT_STATUS(flashattn_context_destroy(ctx), FLASHATTN_ERROR_INVALID_ARGUMENT, stale);
  }

  TEST_CASE("an address that never was a context is refused") {
    struct {
      void* looks_like_a_state[4] = {};
    } not_a_context;
    flashattn_context_t fake = reinterpret_cast<flashattn_context_t>(&not_a_context);
    int device = 42;
    EXPECT_STATUS(flashattn_context_get_device(&device, fake), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  "ctx is not a live context");
    CHECK(device == 42);
    EXPECT_STATUS(flashattn_context_destroy(fake), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  "ctx is not a live context");
    // A buffer handle is no context either.
    Context ctx;
    flashattn_buffer_t buf = nullptr;
    REQUIRE_OK(flashattn_buffer_create(&buf, ctx, 64));
    EXPECT_STATUS(flashattn_context_synchronize(reinterpret_cast<flashattn_context_t>(buf)),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, "ctx is not a live context");
    EXPECT_OK(flashattn_buffer_destroy(buf));
  }
}

TEST_SUITE("cuda") {
  TEST_CASE("the device count needs an out and is never negative") {
    EXPECT_STATUS(flashattn_cuda_device_count(nullptr), FLASHATTN_ERROR_INVALID_ARGUMENT,
                  "flashattn_cuda_device_count: out is NULL");
    int n = -5;
    EXPECT_OK(flashattn_cuda_device_count(&n));
    CHECK(n >= 0);
    if (!flashattn_has_cuda()) CHECK(n == 0);
  }

  TEST_CASE("without a device a CUDA context is unavailable, with a clear message") {
    int n = 0;
    REQUIRE_OK(flashattn_cuda_device_count(&n));
    if (n > 0) {
      MESSAGE("a CUDA device is present: the no-device assertions do not apply here");
      return;
    }
    flashattn_context_t sentinel = reinterpret_cast<flashattn_context_t>(0x1234);
    flashattn_context_t ctx = sentinel;
    EXPECT_STATUS(flashattn_context_create(&ctx, FLASHATTN_BACKEND_CUDA, 0),
                  FLASHATTN_ERROR_BACKEND_UNAVAILABLE, "CUDA");
    CHECK(ctx == sentinel);
    const std::string msg = flashattn_last_error();
    CHECK(contains(msg, "flashattn_context_create: "));
    CHECK(msg.size() > std::strlen("flashattn_context_create: CUDA"));  // says why
  }

  TEST_CASE("on a machine without an NVIDIA driver, the message says so") {
    void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
    if (driver != nullptr) dlclose(driver);
    if (!flashattn_has_cuda() || driver != nullptr) {
      MESSAGE("CUDA not compiled in, or a driver is installed: nothing to check here");
      return;
    }
    flashattn_context_t ctx = nullptr;
    EXPECT_STATUS(flashattn_context_create(&ctx, FLASHATTN_BACKEND_CUDA, 0),
                  FLASHATTN_ERROR_BACKEND_UNAVAILABLE,
                  "no NVIDIA driver was found (libcuda.so.1 cannot be loaded)");
    CHECK(ctx == nullptr);
  }

  TEST_CASE("a CUDA device ordinal past the last device is unavailable") {
    int n = 0;
    REQUIRE_OK(flashattn_cuda_device_count(&n));
    flashattn_context_t ctx = nullptr;
    EXPECT_STATUS(flashattn_context_create(&ctx, FLASHATTN_BACKEND_CUDA, n),
                  FLASHATTN_ERROR_BACKEND_UNAVAILABLE, "");
    CHECK(ctx == nullptr);
    CHECK(!std::string(flashattn_last_error()).empty());
  }

  TEST_CASE("AUTO picks the CPU when there is no device") {
    int n = 0;
    REQUIRE_OK(flashattn_cuda_device_count(&n));
    flashattn_context_t ctx = nullptr;
    EXPECT_OK(flashattn_context_create(&ctx, FLASHATTN_BACKEND_AUTO, 0));
    flashattn_backend_t backend = FLASHATTN_BACKEND_AUTO;
    EXPECT_OK(flashattn_context_get_backend(&backend, ctx));
    CHECK(backend == (n > 0 ? FLASHATTN_BACKEND_CUDA : FLASHATTN_BACKEND_CPU));
    flashattn_context_destroy(ctx);
  }
}

TEST_SUITE("tensor") {
  TEST_CASE("tensor_4d fills a contiguous rank-4 view") {
    float x = 0;
    flashattn_tensor_t t;
    std::memset(&t, 0xAB, sizeof t);
    EXPECT_OK(flashattn_tensor_4d(&t, &x, FLASHATTN_DTYPE_BFLOAT16, 2, 3, 4, 5));
    CHECK(t.data == &x);
    CHECK(t.dtype == FLASHATTN_DTYPE_BFLOAT16);
    CHECK(t.rank == 4);
    const int64_t shape[4] = {2, 3, 4, 5};
    const int64_t strides[4] = {60, 20, 5, 1};
    for (int i = 0; i < 4; ++i) {
      CHECK(t.shape[i] == shape[i]);
      CHECK(t.strides[i] == strides[i]);
    }
  }

  TEST_CASE("tensor_lse fills a contiguous rank-3 float32 view") {
    float x = 0;
    flashattn_tensor_t t;
    std::memset(&t, 0xAB, sizeof t);
    EXPECT_OK(flashattn_tensor_lse(&t, &x, 2, 3, 4));
    CHECK(t.data == &x);
    CHECK(t.dtype == FLASHATTN_DTYPE_FLOAT32);
    CHECK(t.rank == 3);
    CHECK(t.shape[0] == 2);
    CHECK(t.shape[1] == 3);
    CHECK(t.shape[2] == 4);
    CHECK(t.strides[0] == 12);
    CHECK(t.strides[1] == 4);
    CHECK(t.strides[2] == 1);
  }

  TEST_CASE("the view helpers reject bad sizes and leave *out unchanged") {
    flashattn_tensor_t t;
    std::memset(&t, 0xAB, sizeof t);
    flashattn_tensor_t before = t;
    EXPECT_STATUS(flashattn_tensor_4d(nullptr, nullptr, FLASHATTN_DTYPE_FLOAT32, 1, 1, 1, 1),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, "flashattn_tensor_4d: out is NULL");
    EXPECT_STATUS(flashattn_tensor_4d(&t, nullptr, FLASHATTN_DTYPE_FLOAT32, 1, 1, 0, 1),
                  FLASHATTN_ERROR_INVALID_SHAPE, "shape[2] is 0");
    EXPECT_STATUS(flashattn_tensor_4d(&t, nullptr, FLASHATTN_DTYPE_FLOAT32, -3, 1, 1, 1),
                  FLASHATTN_ERROR_INVALID_SHAPE, "shape[0] is -3");
    EXPECT_STATUS(flashattn_tensor_4d(&t, nullptr, FLASHATTN_DTYPE_FLOAT32, int64_t(1) << 32,
                                      int64_t(1) << 32, 1, 1),
                  FLASHATTN_ERROR_INVALID_SHAPE, "overflows");
    EXPECT_STATUS(flashattn_tensor_lse(nullptr, nullptr, 1, 1, 1),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, "flashattn_tensor_lse: out is NULL");
    EXPECT_STATUS(flashattn_tensor_lse(&t, nullptr, 1, 0, 1), FLASHATTN_ERROR_INVALID_SHAPE,
                  "shape[1] is 0");
    EXPECT_STATUS(flashattn_tensor_lse(&t, nullptr, int64_t(1) << 32, int64_t(1) << 32, 1),
                  FLASHATTN_ERROR_INVALID_SHAPE, "overflows");
    CHECK(std::memcmp(&t, &before, sizeof t) == 0);
  }
}

TEST_SUITE("options") {
  TEST_CASE("init gives what FLASHATTN_OPTIONS_INIT gives") {
    const flashattn_options_t from_macro = FLASHATTN_OPTIONS_INIT;
    flashattn_options_t o;
    std::memset(&o, 0xAB, sizeof o);
    EXPECT_OK(flashattn_options_init(&o));
    CHECK(o.size == sizeof(flashattn_options_t));
    CHECK(o.size == from_macro.size);
    CHECK(o.softmax_scale == from_macro.softmax_scale);
    CHECK(o.causal == from_macro.causal);
    CHECK(o.algorithm == from_macro.algorithm);
    CHECK(o.deterministic == from_macro.deterministic);
    CHECK(o.algorithm == FLASHATTN_ALGORITHM_FLASH);
    EXPECT_STATUS(flashattn_options_init_sized(nullptr, sizeof(flashattn_options_t)),
                  FLASHATTN_ERROR_INVALID_ARGUMENT, "out is NULL");
  }

  // The options are read before any view, so the query answers for options alone.
  struct Case {
    const char* what;
    void (*edit)(flashattn_options_t*);
    flashattn_status_t status;
    const char* needle;
  };

  TEST_CASE("bad options are rejected with their field named") {
    const Case cases[] = {
        {"size 0", [](flashattn_options_t* o) { o->size = 0; }, FLASHATTN_ERROR_INVALID_ARGUMENT,
         "options: size is 0"},
        {"size smaller than the size field",
         [](flashattn_options_t* o) { o->size = 4; }, FLASHATTN_ERROR_INVALID_ARGUMENT,
         "options: size is 4"},
        {"implausible size", [](flashattn_options_t* o) { o->size = size_t(1) << 40; },
         FLASHATTN_ERROR_INVALID_ARGUMENT, "not a plausible struct size"},
        {"NaN scale",
         [](flashattn_options_t* o) { o->softmax_scale = std::numeric_limits<float>::quiet_NaN(); },
         FLASHATTN_ERROR_INVALID_ARGUMENT, "options: softmax_scale is nan"},
        {"infinite scale",
         [](flashattn_options_t* o) { o->softmax_scale = -std::numeric_limits<float>::infinity(); },
         FLASHATTN_ERROR_INVALID_ARGUMENT, "options: softmax_scale is -inf"},
        {"causal 2", [](flashattn_options_t* o) { o->causal = 2; },
         FLASHATTN_ERROR_INVALID_ARGUMENT, "options: causal is 2, must be 0 or 1"},
        {"causal -1", [](flashattn_options_t* o) { o->causal = -1; },
         FLASHATTN_ERROR_INVALID_ARGUMENT, "options: causal is -1"},
        {"algorithm 7",
         [](flashattn_options_t* o) { o->algorithm = static_cast<flashattn_algorithm_t>(7); },
         FLASHATTN_ERROR_INVALID_ARGUMENT, "options: algorithm is 7"},
        {"deterministic 3", [](flashattn_options_t* o) { o->deterministic = 3; },
         FLASHATTN_ERROR_INVALID_ARGUMENT, "options: deterministic is 3"},
    };
    Context ctx;
    for (const Case& c : cases) {
      CAPTURE(c.what);
      Forward f;
      flashattn_options_t o;
      REQUIRE_OK(flashattn_options_init(&o));
      c.edit(&o);
      EXPECT_STATUS(f.run(ctx, &o), c.status, c.needle);
      CHECK(f.untouched());
      size_t ws = 777;
      EXPECT_STATUS(flashattn_workspace_size(&ws, ctx, &f.tq, &f.tk, &f.tv, &o, 0), c.status,
                    c.needle);
      CHECK(ws == 777);
      EXPECT_STATUS(flashattn_supported(ctx, &f.tq, &f.tk, &f.tv, &o, 1), c.status, c.needle);
      Backward b;
      EXPECT_STATUS(b.run(ctx, &o), c.status, c.needle);
      CHECK(b.grads_untouched());
    }
  }

  // A newer header's struct: ours plus fields this library does not know.
  struct Bigger {
    flashattn_options_t known;
    int32_t future_a;
    int32_t future_b;
  };

  TEST_CASE("a larger struct is accepted when its unknown tail is zero") {
    Context ctx;
    Forward f;
    Bigger big;
    std::memset(&big, 0, sizeof big);
    REQUIRE_OK(flashattn_options_init(&big.known));
    big.known.size = sizeof big;
    const flashattn_options_t* o = &big.known;
    EXPECT_OK(flashattn_supported(ctx, &f.tq, &f.tk, &f.tv, o, 0));
    EXPECT_OK(f.run(ctx, o));
  }

  TEST_CASE("a larger struct with a nonzero unknown tail is unsupported") {
    Context ctx;
    Forward f;
    Bigger big;
    std::memset(&big, 0, sizeof big);
    REQUIRE_OK(flashattn_options_init(&big.known));
    big.known.size = sizeof big;
    big.future_b = 1;
    const flashattn_options_t* o = &big.known;
    EXPECT_STATUS(flashattn_supported(ctx, &f.tq, &f.tk, &f.tv, o, 0),
                  FLASHATTN_ERROR_UNSUPPORTED, "options: fields past the");
    EXPECT_STATUS(f.run(ctx, o), FLASHATTN_ERROR_UNSUPPORTED, "need a newer flashattn");
    CHECK(f.untouched());
  }

  TEST_CASE("an older, shorter struct defaults the fields it lacks") {
    // An old caller's struct ends after softmax_scale: causal and the rest must read as 0, even
    // when the bytes that follow in the caller's memory are not zero.
    Context ctx;
    Shape s;
    s.seqlen_q = s.seqlen_k = 6;
    Forward old_caller(s), plain(s);
    flashattn_options_t o;
    REQUIRE_OK(flashattn_options_init(&o));
    o.size = offsetof(flashattn_options_t, causal);
    o.softmax_scale = 0.5f;
    o.causal = 1;
    o.algorithm = static_cast<flashattn_algorithm_t>(9);  // would be rejected if it were read
    EXPECT_OK(old_caller.run(ctx, &o));
    flashattn_options_t full;
    REQUIRE_OK(flashattn_options_init(&full));
    full.softmax_scale = 0.5f;
    EXPECT_OK(plain.run(ctx, &full));
    CHECK(old_caller.out == plain.out);
    const Reference ref = reference_forward(plain.tq, plain.tk, plain.tv, 0.5, false);
    CHECK(max_error(old_caller.tout, ref.out) <= kFp32Tolerance);
  }

  TEST_CASE("NULL options are the defaults") {
    Context ctx;
    Forward a, b;
    flashattn_options_t o;
    REQUIRE_OK(flashattn_options_init(&o));
    EXPECT_OK(a.run(ctx, nullptr));
    EXPECT_OK(b.run(ctx, &o));
    CHECK(a.out == b.out);
  }
}
