// libFuzzer harness over the whole C ABI on the CPU backend.
//
// Each input is decoded into a sequence of API calls (see the Op enum; tests/fuzz/make_corpus.py
// writes seeds in the same encoding). The harness owns a few slots of contexts, buffers, tensor
// views and an options block, and checks the contract after every call: the status is a defined
// code and never INTERNAL; the last-error message is empty exactly on success; a rejected call
// (1xx, 2xx) left every buffer and every `*out` untouched; buffer copies move the right bytes;
// absurd allocations fail with OUT_OF_MEMORY. On an untouched consistent problem (op_problem)
// valid calls must succeed, finite inputs give no NaN, and a deterministic backward repeats bit
// for bit. A violated invariant aborts, which libFuzzer
// reports like a crash. Every context and buffer is destroyed at the end of an input, so
// LeakSanitizer reports any leak of the library's.
//
// Pointers: on a CPU context the library cannot check a host pointer that lies outside its own
// buffers, so the harness only hands it NULL, odd garbage addresses (every dtype needs at least
// 2-byte alignment, so validation rejects them before use), or addresses inside live flashattn
// buffers or in the guard the header gives each buffer after its end (the library checks both
// against the end). Host workspaces are the harness's own allocations of exactly the size passed.
// A destroyed context or buffer is passed once more, and must be refused.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include <flashattn/flashattn.h>

// fuzz_shim.c: enum arguments passed by value, from C.
extern "C" {
flashattn_status_t fuzz_context_create(flashattn_context_t* out, int backend, int device);
const char* fuzz_status_string(int status);
flashattn_status_t fuzz_tensor_4d(flashattn_tensor_t* out, void* data, int dtype, int64_t batch,
                                  int64_t seqlen, int64_t heads, int64_t head_dim);
}

// Huge allocation requests must come back as NULL (and then OUT_OF_MEMORY), not abort.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }

namespace {

// ---------------------------------------------------------------------------------------------
// Limits that keep one execution small and fast.

constexpr int kCtxSlots = 4;
constexpr int kBufSlots = 12;
constexpr int kViewSlots = 12;
constexpr int kMaxOps = 64;
constexpr size_t kMaxBufferBytes = size_t(64) << 20;   // one buffer
constexpr size_t kMaxLiveBytes = size_t(160) << 20;    // all buffers of one input
constexpr size_t kMaxSnapshotBytes = size_t(1) << 20;  // outputs-untouched check above this: off
constexpr int64_t kMaxCompute = int64_t(1) << 15;      // B * Hq * Nq * Nk * D of a forward/backward
constexpr int kMaxComputeThreads = 8;                  // more threads: only validation is fuzzed
constexpr size_t kOptionsBlock = 4096 + 64;            // options storage: sizes up to this are real
constexpr size_t kMaxFillBytes = size_t(1) << 16;      // of a new buffer; bigger copies are cut too
constexpr size_t kBufferGuard = 256;  // bytes after a buffer's end checked against it (the header)

// ---------------------------------------------------------------------------------------------
// Failure reporting.

[[noreturn]] void violated(const char* what, int line, const char* detail) {
  std::fprintf(stderr, "fuzz_api: invariant violated at line %d: %s\n  %s\n  last error: %s\n", line,
               what, detail != nullptr ? detail : "", flashattn_last_error());
  std::abort();
}
#define EXPECT(cond, detail)                          \
  do {                                                \
    if (!(cond)) violated(#cond, __LINE__, (detail)); \
  } while (0)

int bits(flashattn_status_t s) {
  int v;
  std::memcpy(&v, &s, sizeof v);
  return v;
}

template <class Enum>
void store_enum(Enum* field, int32_t v) {
  static_assert(sizeof(Enum) == sizeof(int32_t), "C enums are int-sized");
  std::memcpy(field, &v, sizeof v);
}

bool known_status(int v) {
  switch (v) {
    case 0: case 100: case 101: case 102: case 103: case 104: case 105: case 106:
    case 200: case 201: case 300: case 301: case 400: case 500:
      return true;
  }
  return false;
}

// FLASHATTN_FUZZ_TRACE=1 prints every checked call: to see what a seed or a finding does.
bool tracing() {
  static const bool on = std::getenv("FLASHATTN_FUZZ_TRACE") != nullptr;
  return on;
}

// The contract every status-returning call keeps; returns the status as an int.
int check_status(flashattn_status_t st, const char* call) {
  const int v = bits(st);
  if (tracing()) std::fprintf(stderr, "  %-22s -> %3d %s\n", call, v, flashattn_last_error());
  EXPECT(known_status(v), call);
  EXPECT(v != FLASHATTN_ERROR_INTERNAL, call);  // 5xx is a bug in the library by definition
  const char* msg = flashattn_last_error();
  EXPECT(msg != nullptr, call);
  if (v == FLASHATTN_SUCCESS) {
    EXPECT(msg[0] == '\0', call);
  } else {
    EXPECT(msg[0] != '\0', call);
  }
  return v;
}

// ---------------------------------------------------------------------------------------------
// Input decoding. Reads past the end return zeros, so any prefix of an input is an input.

class Input {
 public:
  Input(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool empty() const { return n_ == 0; }
  uint8_t u8() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  // Little endian. Each read is its own statement: operands of | are unsequenced.
  uint16_t u16() {
    const uint16_t lo = u8();
    return static_cast<uint16_t>(lo | (u8() << 8));
  }
  uint32_t u32() {
    const uint32_t lo = u16();
    return lo | (static_cast<uint32_t>(u16()) << 16);
  }
  uint64_t u64() {
    const uint64_t lo = u32();
    return lo | (static_cast<uint64_t>(u32()) << 32);
  }
  int32_t i32() {
    uint32_t v = u32();
    int32_t r;
    std::memcpy(&r, &v, sizeof r);
    return r;
  }

 private:
  const uint8_t* p_;
  size_t n_;
};

constexpr int64_t kI64Max = std::numeric_limits<int64_t>::max();
constexpr int64_t kI64Min = std::numeric_limits<int64_t>::min();
const int64_t kInteresting[] = {0,
                                1,
                                2,
                                3,
                                7,
                                16,
                                31,
                                32,
                                33,
                                64,
                                65,
                                128,
                                255,
                                256,
                                257,
                                4096,
                                65536,
                                (int64_t(1) << 31) - 1,
                                int64_t(1) << 31,
                                (int64_t(1) << 32) - 1,
                                int64_t(1) << 32,
                                int64_t(1) << 40,
                                int64_t(1) << 56,
                                int64_t(1) << 62,
                                kI64Max,
                                kI64Max - 1,
                                -1,
                                -2,
                                -(int64_t(1) << 31),
                                kI64Min,
                                kI64Min + 1};
constexpr int kNumInteresting = sizeof(kInteresting) / sizeof(kInteresting[0]);

// A shape or stride: mostly small, sometimes an edge value or raw 64 bits.
int64_t fuzz_i64(Input& in) {
  const uint8_t mode = in.u8() % 8;
  switch (mode) {
    case 0: case 1: case 2: case 3: return 1 + in.u8() % 16;
    case 4: return kInteresting[in.u8() % kNumInteresting];
    case 5: {
      const int64_t base = kInteresting[in.u8() % kNumInteresting];
      const int64_t delta = static_cast<int8_t>(in.u8());
      int64_t r;
      return __builtin_add_overflow(base, delta, &r) ? base : r;
    }
    case 6: return static_cast<int64_t>(in.u64());
    default: return -static_cast<int64_t>(in.u8() % 17);
  }
}

int32_t fuzz_i32(Input& in, const int32_t* table, int n) {
  const uint8_t sel = in.u8();
  if (sel < 200) return table[sel % n];
  return in.i32();
}

// ---------------------------------------------------------------------------------------------
// fp16 / bf16 encodings of small finite values (round to nearest is not needed: any value is
// fine as long as it is finite).

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>(u >> 16);
}

uint16_t to_f16(float f) {  // |f| < 65504, normal or zero
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const int32_t exp = static_cast<int32_t>((u >> 23) & 0xff) - 127 + 15;
  if (exp <= 0) return static_cast<uint16_t>(sign);
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7bffu);
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(exp) << 10) | ((u >> 13) & 0x3ffu));
}

size_t elem_size(int dtype) { return dtype == FLASHATTN_DTYPE_FLOAT32 ? 4 : 2; }

bool is_nan(const unsigned char* p, int dtype) {
  if (dtype == FLASHATTN_DTYPE_FLOAT32) {
    float f;
    std::memcpy(&f, p, 4);
    return std::isnan(f);
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  if (dtype == FLASHATTN_DTYPE_FLOAT16) return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
  return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0;
}

// ---------------------------------------------------------------------------------------------
// The harness state for one input.

struct Buffer {
  flashattn_buffer_t handle = nullptr;
  unsigned char* data = nullptr;
  size_t size = 0;
};

struct View {
  flashattn_tensor_t t{};
  int buf = -1;  // the buffer slot data points into, or -1 (NULL or garbage)
};

struct HostBlock {  // an exact-size host allocation, so ASan sees any overrun
  std::unique_ptr<unsigned char[]> p;
  size_t n = 0;
  void reset(size_t bytes) {
    n = bytes;
    p.reset(new unsigned char[bytes == 0 ? 1 : bytes]);
  }
};

// A contiguous view of an exact host block.
flashattn_tensor_t block_tensor(HostBlock& h, int dtype, std::initializer_list<int64_t> shape) {
  flashattn_tensor_t t{};
  t.data = h.p.get();
  t.dtype = static_cast<flashattn_dtype_t>(dtype);
  t.rank = static_cast<int32_t>(shape.size());
  int i = 0;
  for (int64_t x : shape) t.shape[i++] = x;
  int64_t stride = 1;
  for (int j = t.rank - 1; j >= 0; --j) {
    t.strides[j] = stride;
    stride *= t.shape[j];
  }
  return t;
}

// Small finite values, base + 0.01 (i mod 97), as float32 or bfloat16 elements.
void fill_pattern(HostBlock& h, bool bf16, float base) {
  const size_t es = bf16 ? 2 : 4;
  for (size_t i = 0; i * es < h.n; ++i) {
    const float f = base + 0.01f * static_cast<float>(i % 97);
    if (bf16) {
      const uint16_t v = to_bf16(f);
      std::memcpy(h.p.get() + i * 2, &v, 2);
    } else {
      std::memcpy(h.p.get() + i * 4, &f, 4);
    }
  }
}

class Harness {
 public:
  explicit Harness(Input& in) : in_(in) {
    reset_options(sizeof(flashattn_options_t));
    classify_options();
  }

  ~Harness() {
    for (int b = 0; b < kBufSlots; ++b) destroy_buffer(b);
    for (int c = 0; c < kCtxSlots; ++c) destroy_context(c);
    if (kv_ctx_ != nullptr) flashattn_context_destroy(kv_ctx_);
  }

  void run() {
    for (int i = 0; i < kMaxOps && !in_.empty(); ++i) step();
  }

 private:
  enum Op {
    kCtxCreate,
    kCtxDestroy,
    kCtxMisc,
    kBufCreate,
    kBufDestroy,
    kBufWrite,
    kBufRead,
    kBufInfo,
    kViewMake,
    kViewTweak,
    kProblem,
    kOptions,
    kCall,
    kMisc,
    kNumOps
  };

  // An op byte of kKvCacheOpByte runs op_kv_cache; any other byte picks op byte % kNumOps, as
  // before that op existed (so earlier inputs keep their meaning, but for that one byte).
  static constexpr uint8_t kKvCacheOpByte = 0xFF;
  // And kCpOpByte op_cp (the byte before it), likewise.
  static constexpr uint8_t kCpOpByte = 0xFE;

  void step() {
    const uint8_t op_byte = in_.u8();
    if (op_byte == kKvCacheOpByte) {
      op_kv_cache();
      return;
    }
    if (op_byte == kCpOpByte) {
      op_cp();
      return;
    }
    const int op = op_byte % kNumOps;
    // What may change a view, a buffer's bytes or which buffers exist ends the consistent problem.
    if (op == kBufCreate || op == kBufDestroy || op == kBufWrite || op == kViewMake || op == kViewTweak) {
      pristine_ = false;
    }
    switch (op) {
      case kCtxCreate: op_ctx_create(); break;
      case kCtxDestroy: destroy_context(in_.u8() % (kCtxSlots + 1)); break;
      case kCtxMisc: op_ctx_misc(); break;
      case kBufCreate: op_buf_create(); break;
      case kBufDestroy: destroy_buffer(in_.u8() % (kBufSlots + 1)); break;
      case kBufWrite: op_buf_copy(true); break;
      case kBufRead: op_buf_copy(false); break;
      case kBufInfo: op_buf_info(); break;
      case kViewMake: op_view_make(); break;
      case kViewTweak: op_view_tweak(); break;
      case kProblem: op_problem(); break;
      case kOptions: op_options(); break;
      case kCall: op_call(); break;
      case kMisc: op_misc(); break;
    }
  }

  // ----- the KV cache call (self-contained: its own CPU context and exact host blocks) -----

  // A small KV cache forward with fuzzed lengths, block table entries, appended rows and rotary
  // tables. The harness works out from the values whether the call must succeed (every rule
  // of the header's "KV cache" paragraph holds) or be refused with INVALID_SHAPE; a refused
  // call must leave the cache and out as they were; a successful one must hold the appended
  // rows in the cache and no NaN in out. Every tensor is an exact host block: ASan sees any
  // read or write past what the library may touch.
  void op_kv_cache() {
    const bool bf16 = (in_.u8() & 1) != 0;
    const int dtype = bf16 ? FLASHATTN_DTYPE_BFLOAT16 : FLASHATTN_DTYPE_FLOAT32;
    const size_t es = elem_size(dtype);
    const int64_t B = 1 + in_.u8() % 3, nq = 1 + in_.u8() % 4, hkv = 1 + in_.u8() % 2;
    const int64_t hq = hkv * (1 + in_.u8() % 3), d = 8 * (1 + in_.u8() % 2);
    const bool paged = (in_.u8() & 1) != 0;
    const int64_t page = 1 + in_.u8() % 9, per_seq = 1 + in_.u8() % 4;
    const int64_t num_pages = 1 + in_.u8() % 10;
    const int64_t capacity = paged ? page * per_seq : 1 + in_.u8() % 40;
    const int64_t n_new = in_.u8() % 4;
    const uint8_t rotary_mode = in_.u8() % 3;  // none, float32 tables, the elements' dtype
    const int64_t rotary_dim = 2 * (1 + in_.u8() % (d / 2));
    const int64_t positions = 1 + in_.u8() % 50;
    const bool interleaved = (in_.u8() & 1) != 0;
    const bool causal = (in_.u8() & 1) != 0;

    // Lengths: mostly in range, sometimes anything.
    std::vector<int32_t> lens(static_cast<size_t>(B));
    for (auto& l : lens) {
      const uint8_t mode = in_.u8();
      l = mode < 200 ? static_cast<int32_t>(mode % (capacity + 1)) : in_.i32();
    }
    std::vector<int32_t> table(static_cast<size_t>(B * per_seq));
    for (auto& e : table) {
      const uint8_t mode = in_.u8();
      e = mode < 220 ? static_cast<int32_t>(mode % num_pages) : in_.i32();
    }

    // What the library must answer.
    bool valid = true;
    std::vector<std::pair<int64_t, int64_t>> landings;  // (page, row) of every appended row
    for (int64_t b = 0; b < B; ++b) {
      const int64_t held = lens[b], len_k = held + n_new;
      if (held < 0 || len_k > capacity) {
        valid = false;
        continue;
      }
      if (paged) {
        for (int64_t j = 0; j < (len_k + page - 1) / page; ++j) {
          const int64_t e = table[b * per_seq + j];
          valid = valid && e >= 0 && e < num_pages;
        }
        for (int64_t t = held; t < len_k && valid; ++t) {
          landings.emplace_back(table[b * per_seq + t / page], t % page);
        }
      }
      if (rotary_mode != 0) valid = valid && len_k >= nq && len_k <= positions;
    }
    std::sort(landings.begin(), landings.end());
    for (size_t i = 1; i < landings.size(); ++i) valid = valid && landings[i] != landings[i - 1];

    // The tensors, each an exact block; inputs small finite values, the cache's rows NaN.
    const auto block = [&](HostBlock& h, int64_t elems) { h.reset(static_cast<size_t>(elems) * es); };
    const auto fill = [&](HostBlock& h, float base) { fill_pattern(h, bf16, base); };
    const int64_t slots = paged ? num_pages : B, rows = paged ? page : capacity;
    HostBlock q, k, v, out, lse, k_new, v_new, cos, sin;
    block(q, B * nq * hq * d);
    block(k, slots * rows * hkv * d);
    block(v, slots * rows * hkv * d);
    block(out, B * nq * hq * d);
    lse.reset(static_cast<size_t>(B * hq * nq) * 4);
    fill(q, -0.5f);
    std::memset(k.p.get(), 0xff, k.n);  // NaN in every dtype: rows attended must be written
    std::memset(v.p.get(), 0xff, v.n);
    // The held rows: finite values (token rows of each sequence through its table).
    const auto row_of = [&](HostBlock& t, int64_t b, int64_t tok, int64_t h) -> unsigned char* {
      const int64_t slot = paged ? table[b * per_seq + tok / page] : b;
      const int64_t r = paged ? tok % page : tok;
      return t.p.get() + static_cast<size_t>(((slot * rows + r) * hkv + h) * d) * es;
    };
    if (valid) {
      HostBlock pattern;
      block(pattern, d);
      fill(pattern, 0.25f);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < lens[b]; ++t)
          for (int64_t h = 0; h < hkv; ++h) {
            std::memcpy(row_of(k, b, t, h), pattern.p.get(), pattern.n);
            std::memcpy(row_of(v, b, t, h), pattern.p.get(), pattern.n);
          }
    }
    std::memset(out.p.get(), 0xa5, out.n);
    std::memset(lse.p.get(), 0xa5, lse.n);
    const auto tensor = block_tensor;
    const flashattn_tensor_t tq = tensor(q, dtype, {B, nq, hq, d});
    const flashattn_tensor_t tk = tensor(k, dtype, {slots, rows, hkv, d});
    const flashattn_tensor_t tv = tensor(v, dtype, {slots, rows, hkv, d});
    const flashattn_tensor_t tout = tensor(out, dtype, {B, nq, hq, d});
    const flashattn_tensor_t tlse = tensor(lse, FLASHATTN_DTYPE_FLOAT32, {B, hq, nq});
    HostBlock lens_block, table_block;
    lens_block.reset(lens.size() * 4);
    std::memcpy(lens_block.p.get(), lens.data(), lens_block.n);
    table_block.reset(table.size() * 4);
    std::memcpy(table_block.p.get(), table.data(), table_block.n);
    const flashattn_tensor_t tlens = tensor(lens_block, FLASHATTN_DTYPE_INT32, {B});
    const flashattn_tensor_t ttable = tensor(table_block, FLASHATTN_DTYPE_INT32, {B, per_seq});
    flashattn_tensor_t tkn{}, tvn{}, tcos{}, tsin{};
    if (n_new > 0) {
      block(k_new, B * n_new * hkv * d);
      block(v_new, B * n_new * hkv * d);
      fill(k_new, 0.125f);
      fill(v_new, -0.125f);
      tkn = tensor(k_new, dtype, {B, n_new, hkv, d});
      tvn = tensor(v_new, dtype, {B, n_new, hkv, d});
    }
    const int table_dtype = rotary_mode == 1 ? FLASHATTN_DTYPE_FLOAT32 : dtype;
    if (rotary_mode != 0) {
      const size_t tes = elem_size(table_dtype);
      cos.reset(static_cast<size_t>(positions * rotary_dim / 2) * tes);
      sin.reset(cos.n);
      for (size_t i = 0; i * tes < cos.n; ++i) {
        const float c = std::cos(0.1f * static_cast<float>(i)), sn = std::sin(0.1f * static_cast<float>(i));
        if (tes == 2) {
          const uint16_t cb = to_bf16(c), sb = to_bf16(sn);
          std::memcpy(cos.p.get() + i * 2, &cb, 2);
          std::memcpy(sin.p.get() + i * 2, &sb, 2);
        } else {
          std::memcpy(cos.p.get() + i * 4, &c, 4);
          std::memcpy(sin.p.get() + i * 4, &sn, 4);
        }
      }
      tcos = tensor(cos, table_dtype, {positions, rotary_dim / 2});
      tsin = tensor(sin, table_dtype, {positions, rotary_dim / 2});
    }
    flashattn_options_t o = FLASHATTN_OPTIONS_INIT;
    o.causal = causal ? 1 : 0;
    flashattn_args_t a = FLASHATTN_ARGS_INIT;
    a.options = &o;
    a.q = &tq;
    a.k = &tk;
    a.v = &tv;
    a.out = &tout;
    a.lse = &tlse;
    a.cache_seqlens = &tlens;
    a.block_table = paged ? &ttable : nullptr;
    a.k_new = n_new > 0 ? &tkn : nullptr;
    a.v_new = n_new > 0 ? &tvn : nullptr;
    a.rotary_cos = rotary_mode != 0 ? &tcos : nullptr;
    a.rotary_sin = rotary_mode != 0 ? &tsin : nullptr;
    a.rotary_interleaved = rotary_mode != 0 && interleaved ? 1 : 0;

    if (kv_ctx_ == nullptr) {
      EXPECT(check_status(flashattn_context_create(&kv_ctx_, FLASHATTN_BACKEND_CPU, 0),
                          "context_create (kv cache)") == 0, "a CPU context");
    }
    const std::vector<unsigned char> k_before(k.p.get(), k.p.get() + k.n);
    const std::vector<unsigned char> v_before(v.p.get(), v.p.get() + v.n);
    const int st = check_status(flashattn_forward_ex(kv_ctx_, &a, nullptr, 0), "forward_ex (kv cache)");
    if (valid) {
      EXPECT(st == 0, "a KV cache call that keeps every rule must succeed");
    } else {
      EXPECT(st == FLASHATTN_ERROR_INVALID_SHAPE, "bad lengths, pages or positions: INVALID_SHAPE");
    }
    if (st != 0) {
      EXPECT(std::memcmp(k.p.get(), k_before.data(), k.n) == 0, "a refused call wrote k");
      EXPECT(std::memcmp(v.p.get(), v_before.data(), v.n) == 0, "a refused call wrote v");
      for (size_t i = 0; i < out.n; ++i) EXPECT(out.p[i] == 0xa5, "a refused call wrote out");
      return;
    }
    for (size_t i = 0; i < out.n; i += es) EXPECT(!is_nan(out.p.get() + i, dtype), "NaN in out");
    if (n_new > 0 && rotary_mode == 0) {
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < n_new; ++i)
          for (int64_t h = 0; h < hkv; ++h) {
            const unsigned char* want =
                k_new.p.get() + static_cast<size_t>(((b * n_new + i) * hkv + h) * d) * es;
            EXPECT(std::memcmp(row_of(k, b, lens[b] + i, h), want, static_cast<size_t>(d) * es) == 0,
                   "an appended row of k_new is in the cache");
          }
    }
  }

  // ----- context parallelism (self-contained: op_kv_cache's CPU context, exact host blocks) -----

  // A context-parallel forward (and backward) of one rank with fuzzed sizes, ranks, layout and
  // masks, over an exchange that hands the rank its own shard back: as if every rank held the
  // same shard. The sequence is then known (the shard repeated as the layout places it), so the
  // rank's out and lse must be those rows of one forward over that sequence; without a mask the
  // rank's dq, dk, dv are likewise those rows of one backward (each key seen by the ranks' equal
  // queries), with one: finite. ASan sees any access past the exact blocks.
  void op_cp() {
    const bool bf16 = (in_.u8() & 1) != 0;
    const int dtype = bf16 ? FLASHATTN_DTYPE_BFLOAT16 : FLASHATTN_DTYPE_FLOAT32;
    const size_t es = elem_size(dtype);
    const int64_t B = 1 + in_.u8() % 2, hkv = 1 + in_.u8() % 2, hq = hkv * (1 + in_.u8() % 2);
    const int64_t d = 8 * (1 + in_.u8() % 2), dv = 8 * (1 + in_.u8() % 2);
    const int64_t ranks = 1 + in_.u8() % 4;
    const int64_t rank = in_.u8() % ranks;
    const bool zigzag = (in_.u8() & 1) != 0;
    const int64_t n = zigzag ? 2 * (1 + in_.u8() % 12) : 1 + in_.u8() % 24;
    const bool causal = (in_.u8() & 1) != 0;
    const bool window = (in_.u8() & 1) != 0;
    const int32_t left = static_cast<int32_t>(in_.u8() % 11) - 1;  // -1 .. 9
    const int32_t right = static_cast<int32_t>(in_.u8() % 11) - 1;
    const bool softcap = (in_.u8() & 1) != 0, sinks = (in_.u8() & 1) != 0;
    const bool backward = (in_.u8() & 1) != 0;
    const bool masked = causal || (window && (left >= 0 || right >= 0));

    const auto fill = [&](HostBlock& h, float base) { fill_pattern(h, bf16, base); };
    const auto value = [&](const HostBlock& h, size_t i) {
      if (!bf16) {
        float f;
        std::memcpy(&f, h.p.get() + i * 4, 4);
        return f;
      }
      uint16_t v;
      std::memcpy(&v, h.p.get() + i * 2, 2);
      const uint32_t u = static_cast<uint32_t>(v) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    };
    const auto tensor = block_tensor;
    // The global token of local row i of any rank (every rank holds the same shard).
    const auto global_row = [&](int64_t r, int64_t i) {
      if (!zigzag) return r * n + i;
      const int64_t half = n / 2;
      return i < half ? r * half + i : (2 * ranks - 1 - r) * half + (i - half);
    };
    // One rank's tensors (its shard) and the sequence's (N = ranks * n tokens).
    struct Set {
      HostBlock q, k, v, out, lse, dout, dq, dk, dv, sinks, dsinks;
      flashattn_tensor_t tq, tk, tv, tout, tlse, tdout, tdq, tdk, tdv, tsinks, tdsinks;
    };
    const auto make = [&](Set& t, int64_t tokens) {
      t.q.reset(static_cast<size_t>(B * tokens * hq * d) * es);
      t.k.reset(static_cast<size_t>(B * tokens * hkv * d) * es);
      t.v.reset(static_cast<size_t>(B * tokens * hkv * dv) * es);
      t.out.reset(static_cast<size_t>(B * tokens * hq * dv) * es);
      t.dout.reset(t.out.n);
      t.dq.reset(t.q.n);
      t.dk.reset(t.k.n);
      t.dv.reset(t.v.n);
      t.lse.reset(static_cast<size_t>(B * hq * tokens) * 4);
      t.sinks.reset(static_cast<size_t>(hq) * 4);
      t.dsinks.reset(t.sinks.n);
      for (HostBlock* o : {&t.out, &t.lse, &t.dq, &t.dk, &t.dv, &t.dsinks}) std::memset(o->p.get(), 0xa5, o->n);
      for (int64_t h = 0; h < hq; ++h) {
        const float sink = 0.3f * static_cast<float>(h) - 0.2f;
        std::memcpy(t.sinks.p.get() + h * 4, &sink, 4);
      }
      t.tq = tensor(t.q, dtype, {B, tokens, hq, d});
      t.tk = tensor(t.k, dtype, {B, tokens, hkv, d});
      t.tv = tensor(t.v, dtype, {B, tokens, hkv, dv});
      t.tout = tensor(t.out, dtype, {B, tokens, hq, dv});
      t.tdout = tensor(t.dout, dtype, {B, tokens, hq, dv});
      t.tdq = tensor(t.dq, dtype, {B, tokens, hq, d});
      t.tdk = tensor(t.dk, dtype, {B, tokens, hkv, d});
      t.tdv = tensor(t.dv, dtype, {B, tokens, hkv, dv});
      t.tlse = tensor(t.lse, FLASHATTN_DTYPE_FLOAT32, {B, hq, tokens});
      t.tsinks = tensor(t.sinks, FLASHATTN_DTYPE_FLOAT32, {hq});
      t.tdsinks = tensor(t.dsinks, FLASHATTN_DTYPE_FLOAT32, {hq});
    };
    Set shard, whole;
    const int64_t N = ranks * n;
    make(shard, n);
    make(whole, N);
    fill(shard.q, -0.4f);
    fill(shard.k, -0.3f);
    fill(shard.v, 0.1f);
    fill(shard.dout, -0.2f);
    // The sequence: each global row a copy of the shard row the layout puts there.
    const auto spread = [&](const HostBlock& from, HostBlock& to, int64_t row_elems) {
      const size_t row = static_cast<size_t>(row_elems) * es;
      for (int64_t r = 0; r < ranks; ++r)
        for (int64_t b = 0; b < B; ++b)
          for (int64_t i = 0; i < n; ++i) {
            std::memcpy(to.p.get() + static_cast<size_t>(b * N + global_row(r, i)) * row,
                        from.p.get() + static_cast<size_t>(b * n + i) * row, row);
          }
    };
    spread(shard.q, whole.q, hq * d);
    spread(shard.k, whole.k, hkv * d);
    spread(shard.v, whole.v, hkv * dv);
    spread(shard.dout, whole.dout, hq * dv);

    flashattn_options_t o = FLASHATTN_OPTIONS_INIT;
    o.causal = causal ? 1 : 0;
    o.window = window ? 1 : 0;
    o.window_left = window ? left : 0;
    o.window_right = window ? right : 0;
    o.softcap = softcap ? 1.5f : 0.0f;
    const auto args_of = [&](Set& t) {
      flashattn_args_t a = FLASHATTN_ARGS_INIT;
      a.options = &o;
      a.q = &t.tq;
      a.k = &t.tk;
      a.v = &t.tv;
      a.out = &t.tout;
      a.lse = &t.tlse;
      a.dout = &t.tdout;
      a.dq = &t.tdq;
      a.dk = &t.tdk;
      a.dv = &t.tdv;
      if (sinks) {
        a.sinks = &t.tsinks;
        a.dsinks = &t.tdsinks;
      }
      return a;
    };
    const flashattn_args_t a_shard = args_of(shard), a_whole = args_of(whole);
    flashattn_cp_args_t cp = FLASHATTN_CP_ARGS_INIT;
    cp.ranks = ranks;
    cp.rank = rank;
    cp.layout = zigzag ? FLASHATTN_CP_LAYOUT_ZIGZAG : FLASHATTN_CP_LAYOUT_CONTIGUOUS;
    cp.exchange = [](void*, const void* send, void* recv, size_t bytes) {
      std::memcpy(recv, send, bytes);
      return 0;
    };

    if (kv_ctx_ == nullptr) {
      EXPECT(check_status(flashattn_context_create(&kv_ctx_, FLASHATTN_BACKEND_CPU, 0),
                          "context_create (cp)") == 0, "a CPU context");
    }
    EXPECT(check_status(flashattn_cp_forward(kv_ctx_, &cp, &a_shard, nullptr, 0), "cp_forward") == 0,
           "a valid context-parallel forward succeeds");
    EXPECT(check_status(flashattn_forward_ex(kv_ctx_, &a_whole, nullptr, 0), "forward_ex (cp)") == 0,
           "the forward over the sequence succeeds");
    const float tol = bf16 ? 4e-2f : 2e-4f;
    const auto rows_match = [&](const HostBlock& got, const HostBlock& want, int64_t row_elems,
                                const char* what) {
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < n; ++i)
          for (int64_t x = 0; x < row_elems; ++x) {
            const float g = value(got, static_cast<size_t>((b * n + i) * row_elems + x));
            const float w = value(want, static_cast<size_t>((b * N + global_row(rank, i)) * row_elems + x));
            EXPECT(std::fabs(g - w) <= tol * (1.0f + std::fabs(w)), what);
          }
    };
    rows_match(shard.out, whole.out, hq * dv, "cp out: the rows of one forward over the sequence");
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < hq; ++h)
        for (int64_t i = 0; i < n; ++i) {
          float g, w;
          std::memcpy(&g, shard.lse.p.get() + static_cast<size_t>((b * hq + h) * n + i) * 4, 4);
          std::memcpy(&w, whole.lse.p.get() + static_cast<size_t>((b * hq + h) * N + global_row(rank, i)) * 4, 4);
          EXPECT(g == w || std::fabs(g - w) <= 2e-4f * (1.0f + std::fabs(w)), "cp lse");
        }
    if (!backward) return;
    EXPECT(check_status(flashattn_cp_backward(kv_ctx_, &cp, &a_shard, nullptr, 0), "cp_backward") == 0,
           "a valid context-parallel backward succeeds");
    for (const HostBlock* g : {&shard.dq, &shard.dk, &shard.dv}) {
      for (size_t i = 0; i < g->n; i += es) EXPECT(!is_nan(g->p.get() + i, dtype), "NaN in a cp gradient");
    }
    if (masked) return;
    EXPECT(check_status(flashattn_backward_ex(kv_ctx_, &a_whole, nullptr, 0), "backward_ex (cp)") == 0,
           "the backward over the sequence succeeds");
    rows_match(shard.dq, whole.dq, hq * d, "cp dq: the rows of one backward over the sequence");
    rows_match(shard.dk, whole.dk, hkv * d, "cp dk: the rows of one backward over the sequence");
    rows_match(shard.dv, whole.dv, hkv * dv, "cp dv: the rows of one backward over the sequence");
  }

  // ----- contexts -----

  flashattn_context_t ctx_arg(int slot) const { return slot < kCtxSlots ? ctx_[slot] : nullptr; }

  void destroy_context(int slot) {
    if (slot >= kCtxSlots) {
      EXPECT(check_status(flashattn_context_destroy(nullptr), "context_destroy(NULL)") == 0, "");
      return;
    }
    if (ctx_[slot] == nullptr) return;
    EXPECT(check_status(flashattn_context_destroy(ctx_[slot]), "context_destroy") == 0, "");
    // The handle is stale now: refused, never read (no handle was made since, so no new
    // context can have its address).
    int device = 77;
    EXPECT(check_status(flashattn_context_get_device(&device, ctx_[slot]), "get_device(stale)") ==
                   FLASHATTN_ERROR_INVALID_ARGUMENT && device == 77,
           "a destroyed context must be refused");
    EXPECT(check_status(flashattn_context_destroy(ctx_[slot]), "context_destroy(stale)") ==
               FLASHATTN_ERROR_INVALID_ARGUMENT,
           "a context destroyed twice must be refused");
    ctx_[slot] = nullptr;
    threads_[slot] = 0;
  }

  void op_ctx_create() {
    const int slot = in_.u8() % kCtxSlots;
    const uint8_t mode = in_.u8();
    int32_t backend;
    switch (mode & 3) {
      case 0: backend = FLASHATTN_BACKEND_CPU; break;
      case 1: backend = FLASHATTN_BACKEND_AUTO; break;
      case 2: backend = FLASHATTN_BACKEND_CUDA; break;
      default: backend = in_.i32(); break;
    }
    int device;
    switch ((mode >> 2) & 3) {
      case 0: device = 0; break;
      case 1: device = 1; break;
      case 2: device = -1; break;
      default: device = in_.i32(); break;
    }
    const bool null_out = (mode & 16) != 0;
    destroy_context(slot);
    flashattn_context_t sentinel = reinterpret_cast<flashattn_context_t>(uintptr_t(0x5eed));
    flashattn_context_t ctx = sentinel;
    const int st = check_status(fuzz_context_create(null_out ? nullptr : &ctx, backend, device),
                                "context_create");
    const bool valid_backend = backend == FLASHATTN_BACKEND_AUTO || backend == FLASHATTN_BACKEND_CPU ||
                               backend == FLASHATTN_BACKEND_CUDA;
    if (null_out || !valid_backend || device < 0) {
      EXPECT(st == FLASHATTN_ERROR_INVALID_ARGUMENT, "bad out/backend/device must be rejected");
    } else if (backend == FLASHATTN_BACKEND_CUDA && !flashattn_has_cuda()) {
      EXPECT(st == FLASHATTN_ERROR_BACKEND_UNAVAILABLE, "CUDA without CUDA compiled in");
    } else if (backend != FLASHATTN_BACKEND_CUDA) {
      EXPECT(st == FLASHATTN_SUCCESS, "CPU/AUTO context creation");
    }
    if (st != FLASHATTN_SUCCESS) {
      EXPECT(ctx == sentinel, "*out changed by a failed context_create");
      return;
    }
    ctx_[slot] = ctx;
    flashattn_backend_t got;
    EXPECT(check_status(flashattn_context_get_backend(&got, ctx), "get_backend") == 0, "");
    const int got_bits = static_cast<int>(got);
    if (!flashattn_has_cuda()) EXPECT(got_bits == FLASHATTN_BACKEND_CPU, "backend without CUDA");
    if (got_bits != FLASHATTN_BACKEND_CPU) {  // a CUDA context: this harness fuzzes the CPU only
      destroy_context(slot);
    }
  }

  void op_ctx_misc() {
    const int slot = in_.u8() % (kCtxSlots + 1);
    const uint8_t what = in_.u8();
    flashattn_context_t ctx = ctx_arg(slot);
    const bool null_out = (what & 0x80) != 0;
    int st;
    switch (what % 8) {
      case 0: {
        flashattn_backend_t out;
        store_enum(&out, 77);
        st = check_status(flashattn_context_get_backend(null_out ? nullptr : &out, ctx), "get_backend");
        if (st == 0) {
          EXPECT(out == FLASHATTN_BACKEND_CPU, "get_backend");
        } else {
          int v;
          std::memcpy(&v, &out, sizeof v);
          EXPECT(v == 77, "*out changed by failed get_backend");
        }
        break;
      }
      case 1: {
        int out = 77;
        st = check_status(flashattn_context_get_device(null_out ? nullptr : &out, ctx), "get_device");
        EXPECT(st == 0 ? out == -1 : out == 77, "get_device");
        break;
      }
      case 2: {
        void* out = &out;
        void* const before = out;
        st = check_status(flashattn_context_get_stream(null_out ? nullptr : &out, ctx), "get_stream");
        EXPECT(st == 0 ? out == nullptr : out == before, "get_stream");
        break;
      }
      case 3:
        st = check_status(flashattn_context_set_stream(ctx, nullptr), "set_stream(NULL)");
        break;
      case 4: {
        // A non-NULL stream on a CPU context is refused before it is ever used.
        void* garbage = reinterpret_cast<void*>(uintptr_t(0xdead0001) + in_.u8());
        st = check_status(flashattn_context_set_stream(ctx, garbage), "set_stream(garbage)");
        EXPECT(st == FLASHATTN_ERROR_INVALID_ARGUMENT, "a CPU context takes no stream");
        return;
      }
      case 5:
        st = check_status(flashattn_context_synchronize(ctx), "synchronize");
        break;
      case 6: {
        flashattn_cpu_kernels_t out;
        store_enum(&out, 77);
        st = check_status(flashattn_context_get_cpu_kernels(null_out ? nullptr : &out, ctx),
                          "get_cpu_kernels");
        int v;
        std::memcpy(&v, &out, sizeof v);
        EXPECT(st == 0 ? v >= FLASHATTN_CPU_KERNELS_GENERIC && v <= FLASHATTN_CPU_KERNELS_AMX
                       : v == 77,
               "get_cpu_kernels");
        break;
      }
      default: {
        static const int32_t kThreads[] = {0, 1, 2, 3, 4, -1, 1024, 4096,
                                           std::numeric_limits<int32_t>::max(),
                                           std::numeric_limits<int32_t>::min()};
        const int32_t n = fuzz_i32(in_, kThreads, sizeof(kThreads) / sizeof(kThreads[0]));
        st = check_status(flashattn_context_set_num_threads(ctx, n), "set_num_threads");
        if (ctx != nullptr) {
          EXPECT((st == 0) == (n >= 0), "set_num_threads accepts exactly n >= 0");
          if (st == 0) threads_[slot] = n;
        }
        break;
      }
    }
    if (ctx == nullptr) EXPECT(st == FLASHATTN_ERROR_INVALID_ARGUMENT, "NULL context");
  }

  // ----- buffers -----

  size_t live_bytes() const {
    size_t total = 0;
    for (const Buffer& b : bufs_) total += b.size;
    return total;
  }

  void forget_views_of(int slot) {
    for (View& v : views_) {
      if (v.buf == slot) {
        v.t.data = nullptr;
        v.buf = -1;
      }
    }
  }

  void destroy_buffer(int slot) {
    if (slot >= kBufSlots) {
      EXPECT(check_status(flashattn_buffer_destroy(nullptr), "buffer_destroy(NULL)") == 0, "");
      return;
    }
    Buffer& b = bufs_[slot];
    if (b.handle == nullptr) return;
    EXPECT(check_status(flashattn_buffer_destroy(b.handle), "buffer_destroy") == 0, "");
    size_t size = 77;
    EXPECT(check_status(flashattn_buffer_size(&size, b.handle), "buffer_size(stale)") ==
                   FLASHATTN_ERROR_INVALID_ARGUMENT && size == 77,
           "a destroyed buffer must be refused");
    EXPECT(check_status(flashattn_buffer_destroy(b.handle), "buffer_destroy(stale)") ==
               FLASHATTN_ERROR_INVALID_ARGUMENT,
           "a buffer destroyed twice must be refused");
    b = Buffer{};
    forget_views_of(slot);
  }

  // Creates a buffer in `slot` on context slot `c`; returns whether it exists afterwards.
  bool create_buffer(int slot, int c, size_t bytes, bool null_out) {
    destroy_buffer(slot);
    flashattn_context_t ctx = ctx_arg(c);
    flashattn_buffer_t sentinel = reinterpret_cast<flashattn_buffer_t>(uintptr_t(0x5eed));
    flashattn_buffer_t h = sentinel;
    const int st = check_status(flashattn_buffer_create(null_out ? nullptr : &h, ctx, bytes),
                                "buffer_create");
    if (null_out || ctx == nullptr || bytes == 0) {
      EXPECT(st == FLASHATTN_ERROR_INVALID_ARGUMENT, "buffer_create bad argument");
    } else if (bytes > kMaxBufferBytes) {
      EXPECT(st == FLASHATTN_ERROR_OUT_OF_MEMORY, "an absurd allocation must fail cleanly");
    } else {
      EXPECT(st == FLASHATTN_SUCCESS, "buffer_create of a modest size");
    }
    if (st != FLASHATTN_SUCCESS) {
      EXPECT(h == sentinel, "*out changed by a failed buffer_create");
      return false;
    }
    void* data = nullptr;
    size_t size = 0;
    EXPECT(check_status(flashattn_buffer_data(&data, h), "buffer_data") == 0, "");
    EXPECT(check_status(flashattn_buffer_size(&size, h), "buffer_size") == 0, "");
    EXPECT(size == bytes, "buffer_size");
    EXPECT(data != nullptr && reinterpret_cast<uintptr_t>(data) % 256 == 0, "256-byte alignment");
    // Defined contents where computations read them (a problem's buffers are written in full).
    std::memset(data, 0x3c, bytes < kMaxFillBytes ? bytes : kMaxFillBytes);
    bufs_[slot] = Buffer{h, static_cast<unsigned char*>(data), bytes};
    return true;
  }

  void op_buf_create() {
    const int slot = in_.u8() % kBufSlots;
    const int c = in_.u8() % (kCtxSlots + 1);
    const uint8_t mode = in_.u8();
    size_t bytes;
    switch (mode % 16) {
      case 0: case 1: case 2: case 3: case 4: case 5: case 6: case 7:
        bytes = 1 + in_.u16();
        break;
      case 8: case 9: case 10: bytes = 1 + in_.u32() % (size_t(1) << 20); break;
      case 11: bytes = 1 + in_.u32() % kMaxBufferBytes; break;
      case 12: bytes = 0; break;
      default: {
        static const size_t kAbsurd[] = {SIZE_MAX,
                                         SIZE_MAX - 255,
                                         SIZE_MAX - 254,
                                         size_t(1) << 63,
                                         (size_t(1) << 47) + 1,
                                         size_t(1) << 48,
                                         size_t(1) << 56,
                                         (SIZE_MAX >> 1) + 1 + 255};
        bytes = kAbsurd[in_.u8() % (sizeof(kAbsurd) / sizeof(kAbsurd[0]))];
        break;
      }
    }
    if (bytes <= kMaxBufferBytes && live_bytes() + bytes > kMaxLiveBytes) bytes = 1 + bytes % 4096;
    create_buffer(slot, c, bytes, (mode & 0x80) != 0 && (mode & 0x40) != 0);
  }

  // An offset or byte count relative to a buffer of `size` bytes.
  size_t fuzz_extent(size_t size) {
    const uint8_t mode = in_.u8();
    switch (mode % 12) {
      case 0: return 0;
      case 1: return 1;
      case 2: return size;
      case 3: return size == 0 ? 0 : size - 1;
      case 4: return size + 1;
      case 5: return size / 2;
      case 6: return SIZE_MAX;
      case 7: return SIZE_MAX - size + 1;
      case 8: return in_.u32();
      default: return size == 0 ? in_.u16() : in_.u32() % (size + 1);
    }
  }

  void op_buf_copy(bool write) {
    const int slot = in_.u8() % (kBufSlots + 1);
    const uint8_t mode = in_.u8();
    const bool null_host = mode % 16 == 0;
    Buffer* b = slot < kBufSlots && bufs_[slot].handle != nullptr ? &bufs_[slot] : nullptr;
    const size_t size = b != nullptr ? b->size : 64;
    const size_t offset = fuzz_extent(size);
    size_t bytes = fuzz_extent(size);
    size_t end = 0;
    const bool fits = !__builtin_add_overflow(offset, bytes, &end) && end <= size;
    if (fits && bytes > kMaxFillBytes) bytes = kMaxFillBytes;  // still in range, and cheap
    const bool valid = b != nullptr && !null_host && fits;
    // Valid: host memory of exactly `bytes`. Invalid: a small block the library must not touch.
    HostBlock host;
    host.reset(valid ? bytes : 16);
    const unsigned char fill = static_cast<unsigned char>(in_.u8() | 1);
    std::memset(host.p.get(), fill, host.n == 0 ? 1 : host.n);
    flashattn_buffer_t h = b != nullptr ? b->handle : nullptr;
    std::vector<unsigned char> before;
    if (b != nullptr && b->size <= kMaxSnapshotBytes) before.assign(b->data, b->data + b->size);
    const int st =
        write ? check_status(flashattn_buffer_write(h, offset, null_host ? nullptr : host.p.get(), bytes),
                             "buffer_write")
              : check_status(flashattn_buffer_read(h, offset, null_host ? nullptr : host.p.get(), bytes),
                             "buffer_read");
    if (!valid) {
      EXPECT(st == FLASHATTN_ERROR_INVALID_ARGUMENT, "an invalid copy must be refused");
      for (size_t i = 0; i < 16; ++i) EXPECT(host.p[i] == fill, "host memory touched by a refused copy");
      if (!before.empty()) EXPECT(std::memcmp(before.data(), b->data, b->size) == 0, "buffer touched");
      return;
    }
    EXPECT(st == FLASHATTN_SUCCESS, "a valid copy must succeed");
    if (bytes > 0) {
      EXPECT(std::memcmp(b->data + offset, host.p.get(), bytes) == 0, "copied bytes differ");
    }
  }

  void op_buf_info() {
    const int slot = in_.u8() % (kBufSlots + 1);
    const uint8_t mode = in_.u8();
    const bool null_out = (mode & 2) != 0;
    flashattn_buffer_t h = slot < kBufSlots ? bufs_[slot].handle : nullptr;
    int st;
    if (mode & 1) {
      size_t out = 12345;
      st = check_status(flashattn_buffer_size(null_out ? nullptr : &out, h), "buffer_size");
      EXPECT(st == 0 ? out == bufs_[slot].size : out == 12345, "buffer_size");
    } else {
      void* out = &out;
      void* const before = out;
      st = check_status(flashattn_buffer_data(null_out ? nullptr : &out, h), "buffer_data");
      EXPECT(st == 0 ? out == bufs_[slot].data : out == before, "buffer_data");
    }
    EXPECT((st == 0) == (h != nullptr && !null_out), "buffer info");
  }

  // ----- tensor views -----

  // A data pointer: NULL, odd garbage, or inside a live buffer. Sets *buf accordingly.
  void* fuzz_data(int* buf) {
    *buf = -1;
    const uint8_t mode = in_.u8() % 8;
    if (mode == 0) return nullptr;
    if (mode == 1) {
      static const uintptr_t kGarbage[] = {1, 3, 0x1001, 0xdeadbeef, 0x7fffffffffffffffull,
                                           UINTPTR_MAX};
      return reinterpret_cast<void*>(kGarbage[in_.u8() % (sizeof(kGarbage) / sizeof(kGarbage[0]))]);
    }
    const int slot = in_.u8() % kBufSlots;
    const Buffer& b = bufs_[slot];
    if (b.handle == nullptr) return nullptr;
    size_t offset;
    switch (in_.u8() % 6) {
      case 0: case 1: offset = 0; break;
      case 2: offset = (size_t(in_.u16()) * 2) % b.size; break;
      case 3: offset = (size_t(in_.u16()) * 4) % b.size; break;
      case 4: offset = b.size - 1 - in_.u16() % b.size; break;
      default: offset = in_.u32() % b.size; break;
    }
    *buf = slot;
    return b.data + offset;
  }

  int32_t fuzz_dtype() {
    const uint8_t sel = in_.u8() % 8;
    if (sel < 3) return FLASHATTN_DTYPE_FLOAT32;
    if (sel < 5) return FLASHATTN_DTYPE_FLOAT16;
    if (sel == 5) return FLASHATTN_DTYPE_BFLOAT16;
    static const int32_t kBad[] = {0, 4, -1, 255, std::numeric_limits<int32_t>::max(),
                                   std::numeric_limits<int32_t>::min()};
    if (sel == 6) return kBad[in_.u8() % 6];
    return in_.i32();
  }

  int32_t fuzz_rank() {
    const uint8_t sel = in_.u8() % 8;
    if (sel < 5) return 4;
    if (sel == 5) return 3;
    static const int32_t kBad[] = {0, 1, 2, 5, -1, std::numeric_limits<int32_t>::max(),
                                   std::numeric_limits<int32_t>::min()};
    if (sel == 6) return kBad[in_.u8() % 7];
    return in_.i32();
  }

  static void contiguous_strides(flashattn_tensor_t& t, int rank) {
    int64_t acc = 1;
    for (int i = rank - 1; i >= 0; --i) {
      t.strides[i] = acc;
      int64_t next;
      const int64_t extent = t.shape[i] > 0 ? t.shape[i] : 1;
      acc = __builtin_mul_overflow(acc, extent, &next) ? kI64Max : next;
    }
  }

  void op_view_make() {
    View& v = views_[in_.u8() % kViewSlots];
    v = View{};
    store_enum(&v.t.dtype, fuzz_dtype());
    v.t.rank = fuzz_rank();
    for (int i = 0; i < FLASHATTN_MAX_RANK; ++i) v.t.shape[i] = fuzz_i64(in_);
    const int layout_rank = v.t.rank == 3 ? 3 : 4;
    switch (in_.u8() % 4) {
      case 0: contiguous_strides(v.t, layout_rank); break;
      case 1: {
        contiguous_strides(v.t, layout_rank);
        const int i = in_.u8() % FLASHATTN_MAX_RANK;
        v.t.strides[i] = fuzz_i64(in_);
        break;
      }
      case 2:
        for (int i = 0; i < FLASHATTN_MAX_RANK; ++i) v.t.strides[i] = fuzz_i64(in_);
        if (layout_rank == 4 && (in_.u8() & 3) != 0) v.t.strides[3] = 1;
        break;
      default:  // padded rows
        contiguous_strides(v.t, layout_rank);
        for (int i = 0; i + 1 < layout_rank; ++i) {
          int64_t padded;
          if (!__builtin_add_overflow(v.t.strides[i], int64_t(in_.u8() % 8), &padded)) {
            v.t.strides[i] = padded;
          }
        }
        break;
    }
    v.t.data = fuzz_data(&v.buf);
  }

  void op_view_tweak() {
    View& v = views_[in_.u8() % kViewSlots];
    switch (in_.u8() % 7) {
      case 0: {  // the index is read first: the two sides of = are sequenced right to left
        const int i = in_.u8() % FLASHATTN_MAX_RANK;
        v.t.shape[i] = fuzz_i64(in_);
        break;
      }
      case 1: {
        const int i = in_.u8() % FLASHATTN_MAX_RANK;
        v.t.strides[i] = fuzz_i64(in_);
        break;
      }
      case 2: store_enum(&v.t.dtype, fuzz_dtype()); break;
      case 3: v.t.rank = fuzz_rank(); break;
      case 4: {  // share another view's memory (aliasing)
        const View& other = views_[in_.u8() % kViewSlots];
        v.t.data = other.t.data;
        v.buf = other.buf;
        break;
      }
      case 5: {  // move the pointer inside its buffer, or to its end and into the guard after it
        if (v.buf < 0) break;
        const Buffer& b = bufs_[v.buf];
        const int64_t step = static_cast<int8_t>(in_.u8());
        const int64_t delta = step * (in_.u8() % 4 == 0 ? 1 : 2);
        const int64_t pos = (static_cast<unsigned char*>(v.t.data) - b.data) + delta;
        if (pos >= 0 && static_cast<size_t>(pos) < b.size + kBufferGuard) v.t.data = b.data + pos;
        break;
      }
      default: v.t.data = fuzz_data(&v.buf); break;
    }
  }

  // A consistent problem in view slots 0..8 (q k v out lse dout dq dk dv): small sizes, one of a
  // few layouts, inputs filled with finite values, outputs poisoned.
  void op_problem() {
    pristine_ = false;
    lse_from_forward_ = false;
    const int c = in_.u8() % kCtxSlots;
    if (ctx_[c] == nullptr) {
      EXPECT(check_status(flashattn_context_create(&ctx_[c], FLASHATTN_BACKEND_CPU, 0),
                          "context_create") == 0, "");
      // One thread unless an input asks for more (kCtxMisc): thread start-up dominates tiny calls.
      EXPECT(check_status(flashattn_context_set_num_threads(ctx_[c], 1), "set_num_threads") == 0, "");
      threads_[c] = 1;
    }
    int64_t batch = 1 + in_.u8() % 3;
    int64_t nq = 1 + in_.u8() % 80;
    int64_t nk = 1 + in_.u8() % 80;
    const int64_t hkv = 1 + in_.u8() % 3;
    const int64_t hq = hkv * (1 + in_.u8() % 3);
    static const int64_t kDims[] = {16, 31, 32, 33, 64, 80, 96, 128, 160, 192, 255, 256};
    const uint8_t dsel = in_.u8();
    const int64_t d = dsel < 128 ? 1 + dsel % 64 : kDims[dsel % 12];
    int32_t dtype = 1 + in_.u8() % 3;
    const uint8_t layout = in_.u8() % 6;
    const uint32_t seed = in_.u32();
    while (batch * hq * nq * nk * d > kMaxCompute) {
      if (nq >= nk && nq > 1) {
        nq = (nq + 1) / 2;
      } else if (nk > 1) {
        nk = (nk + 1) / 2;
      } else {
        batch = 1;
        break;
      }
    }
    const size_t es = elem_size(dtype);
    flashattn_dtype_t dt;
    store_enum(&dt, dtype);

    struct Spec {
      int64_t n, h;
    };
    const Spec spec[9] = {{nq, hq}, {nk, hkv}, {nk, hkv}, {nq, hq}, {0, 0},
                          {nq, hq}, {nq, hq}, {nk, hkv}, {nk, hkv}};
    for (int t = 0; t < 9; ++t) views_[t] = View{};
    for (int b = 0; b < 10; ++b) destroy_buffer(b);

    auto lse_view = [&](View& v, unsigned char* base, int slot) {
      EXPECT(check_status(flashattn_tensor_lse(&v.t, base, batch, hq, nq), "tensor_lse") == 0, "");
      v.buf = slot;
    };
    // Layout 5 pads every head row of the 4-d tensors: pitch > head_dim.
    const int64_t pitch = layout == 5 ? d + 1 + seed % 8 : d;
    auto view4 = [&](View& v, unsigned char* base, int slot, int64_t n, int64_t h) {
      EXPECT(check_status(flashattn_tensor_4d(&v.t, base, dt, batch, n, h, d), "tensor_4d") == 0, "");
      v.t.strides[2] = pitch;
      v.t.strides[1] = h * pitch;
      v.t.strides[0] = n * h * pitch;
      v.buf = slot;
    };
    auto bytes4 = [&](int64_t n, int64_t h) { return static_cast<size_t>(batch * n * h * pitch) * es; };
    const size_t lse_bytes = static_cast<size_t>(batch * hq * nq) * 4;

    if (layout == 1) {  // everything in one buffer, 256-byte aligned pieces
      size_t offsets[9];
      size_t total = 0;
      for (int t = 0; t < 9; ++t) {
        offsets[t] = total;
        const size_t n = t == 4 ? lse_bytes : bytes4(spec[t].n, spec[t].h);
        total += (n + 255) / 256 * 256;
      }
      if (!create_buffer(9, c, total, false)) return;
      for (int t = 0; t < 9; ++t) {
        unsigned char* base = bufs_[9].data + offsets[t];
        if (t == 4) {
          lse_view(views_[t], base, 9);
        } else {
          view4(views_[t], base, 9, spec[t].n, spec[t].h);
        }
      }
    } else {
      for (int t = 0; t < 9; ++t) {
        const size_t n = t == 4 ? lse_bytes : bytes4(spec[t].n, spec[t].h);
        if (!create_buffer(t, c, n, false)) return;
        if (t == 4) {
          lse_view(views_[t], bufs_[t].data, t);
        } else {
          view4(views_[t], bufs_[t].data, t, spec[t].n, spec[t].h);
        }
      }
      if (layout == 2 && hq == hkv && nq == nk) {  // packed QKV: [B, N, 3, H, D] in one buffer
        if (create_buffer(9, c, 3 * bytes4(nq, hq), false)) {
          for (int t = 0; t < 3; ++t) {
            View& v = views_[t];
            v.t.data = bufs_[9].data + t * hq * d * es;
            v.buf = 9;
            v.t.strides[0] = nq * 3 * hq * d;
            v.t.strides[1] = 3 * hq * d;
            v.t.strides[2] = d;
          }
        }
      } else if (layout == 3) {  // [B, H, N, D] memory order for every 4-d tensor
        for (int t = 0; t < 9; ++t) {
          if (t == 4) continue;
          flashattn_tensor_t& v = views_[t].t;
          v.strides[2] = spec[t].n * d;
          v.strides[1] = d;
        }
      } else if (layout == 4) {  // k and v broadcast over the batch (stride 0, inputs only)
        views_[1].t.strides[0] = 0;
        views_[2].t.strides[0] = 0;
      }
    }
    // Inputs finite, outputs poisoned.
    uint32_t x = seed | 1;
    auto next = [&]() {
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      return (static_cast<float>(x % 4001) - 2000.0f) / 1000.0f;  // [-2, 2]
    };
    for (int t = 0; t < 9; ++t) {
      const View& v = views_[t];
      if (v.buf < 0) continue;
      const bool output = t == 3 || t == 4 || t >= 6;
      const size_t n = t == 4 ? lse_bytes : bytes4(spec[t].n, spec[t].h);
      unsigned char* base = static_cast<unsigned char*>(v.t.data);
      const size_t avail = bufs_[v.buf].size - static_cast<size_t>(base - bufs_[v.buf].data);
      const size_t len = n < avail ? n : avail;
      if (output) {
        std::memset(base, 0xA5, len);
        continue;
      }
      const size_t e = t == 4 ? 4 : es;
      for (size_t i = 0; i + e <= len; i += e) {
        const float f = next();
        if (e == 4) {
          std::memcpy(base + i, &f, 4);
        } else {
          const uint16_t h = dtype == FLASHATTN_DTYPE_FLOAT16 ? to_f16(f) : to_bf16(f);
          std::memcpy(base + i, &h, 2);
        }
      }
    }
    pristine_ = true;
  }

  // ----- options -----

  void reset_options(size_t size) {
    options_size_ = size;
    const size_t block = size < sizeof(size_t) ? sizeof(size_t) : (size < kOptionsBlock ? size : kOptionsBlock);
    options_.reset(block);
    std::memset(options_.p.get(), 0, block);
    flashattn_options_t defaults = FLASHATTN_OPTIONS_INIT;
    std::memcpy(options_.p.get(), &defaults, block < sizeof defaults ? block : sizeof defaults);
    std::memcpy(options_.p.get(), &size, sizeof size);
  }

  template <class T>
  void put_option(size_t offset, T value) {
    if (offset + sizeof(T) <= options_.n) std::memcpy(options_.p.get() + offset, &value, sizeof(T));
  }

  static bool ends_at_field(size_t size) {
#define FUZZ_FIELD_END(field) (offsetof(flashattn_options_t, field) + sizeof(flashattn_options_t::field))
    static const size_t kEnds[] = {
        FUZZ_FIELD_END(softmax_scale), FUZZ_FIELD_END(causal),      FUZZ_FIELD_END(algorithm),
        FUZZ_FIELD_END(deterministic), FUZZ_FIELD_END(window),      FUZZ_FIELD_END(window_left),
        FUZZ_FIELD_END(window_right),  FUZZ_FIELD_END(softcap),     FUZZ_FIELD_END(num_splits)};
#undef FUZZ_FIELD_END
    for (const size_t end : kEnds) {
      if (size == end) return true;
    }
    return false;
  }

  // What the library must make of the options block, where the harness can tell: sizes that cut
  // a field in two are left unjudged.
  void classify_options() {
    ++options_gen_;
    const size_t size = options_size_;
    // A size the library can judge ends at a field's end, or covers the whole struct.
    options_known_ = size >= 8 && size <= 4096 &&
                     (size >= sizeof(flashattn_options_t) || ends_at_field(size));
    if (!options_known_) return;
    bool valid = true;
    for (size_t i = sizeof(flashattn_options_t); i < options_.n; ++i) valid = valid && options_.p[i] == 0;
    float scale = 0.0f, softcap = 0.0f;
    int32_t causal = 0, algorithm = 0, deterministic = 0, window = 0, left = 0, right = 0;
    int64_t num_splits = 0;
    const unsigned char* o = options_.p.get();
    const auto read = [&](size_t offset, auto* value) {
      if (size >= offset + sizeof(*value)) std::memcpy(value, o + offset, sizeof(*value));
    };
    read(offsetof(flashattn_options_t, softmax_scale), &scale);
    read(offsetof(flashattn_options_t, causal), &causal);
    read(offsetof(flashattn_options_t, algorithm), &algorithm);
    read(offsetof(flashattn_options_t, deterministic), &deterministic);
    read(offsetof(flashattn_options_t, window), &window);
    read(offsetof(flashattn_options_t, window_left), &left);
    read(offsetof(flashattn_options_t, window_right), &right);
    read(offsetof(flashattn_options_t, softcap), &softcap);
    read(offsetof(flashattn_options_t, num_splits), &num_splits);
    const bool window_ok = (window == 0 && left == 0 && right == 0) ||
                           (window == 1 && left >= -1 && right >= -1);
    valid = valid && std::isfinite(scale) && std::fabs(scale) <= FLASHATTN_MAX_SOFTMAX_SCALE &&
            (causal == 0 || causal == 1) &&
            (algorithm == 0 || algorithm == 1) && (deterministic == 0 || deterministic == 1) &&
            window_ok && std::isfinite(softcap) && softcap >= 0.0f && num_splits >= 0;
    options_valid_ = valid;
    options_deterministic_ = deterministic == 1;
  }

  void op_options() {
    const uint8_t mode = in_.u8();
    size_t size;
    switch (mode % 8) {
      case 0: case 1: case 2: size = sizeof(flashattn_options_t); break;
      case 3: case 4: size = in_.u8() % (sizeof(flashattn_options_t) + 65); break;
      case 5: {
        static const size_t kSizes[] = {0, 1, 7, 8, 9, 12, 16, 20, 23, 24, 25, 28, 32, 64, 88,
                                        4095, 4096, 4097, 8192, SIZE_MAX, SIZE_MAX / 2,
                                        size_t(1) << 32};
        size = kSizes[in_.u8() % (sizeof(kSizes) / sizeof(kSizes[0]))];
        break;
      }
      case 6: size = in_.u64(); break;
      default: size = sizeof(flashattn_options_t); break;
    }
    reset_options(size);
    if (mode % 8 == 7) {  // the split count: the library's choice, a few parts, refused, huge
      static const int64_t kSplits[] = {0, 1, 2, 7, 128, 129, -1, int64_t(1) << 40,
                                        std::numeric_limits<int64_t>::min()};
      const uint8_t sel = in_.u8();
      put_option(offsetof(flashattn_options_t, num_splits),
                 sel < 200 ? kSplits[sel % (sizeof(kSplits) / sizeof(kSplits[0]))]
                           : static_cast<int64_t>(in_.u64()));
    }
    const uint8_t fields = in_.u8();
    if (fields & 1) {
      // Ordinary, tiny, the largest accepted (both signs), refused and non-finite scales.
      static const float kScales[] = {0.0f, 1.0f, 0.125f, -1.0f, 1e-30f,
                                      FLASHATTN_MAX_SOFTMAX_SCALE, 1e-45f,
                                      std::numeric_limits<float>::max(),
                                      -FLASHATTN_MAX_SOFTMAX_SCALE,
                                      std::numeric_limits<float>::quiet_NaN(),
                                      std::numeric_limits<float>::infinity(),
                                      -std::numeric_limits<float>::infinity()};
      const uint8_t sel = in_.u8();
      float s;
      if (sel < 240) {
        s = kScales[sel % 12];
      } else {
        const uint32_t u = in_.u32();
        std::memcpy(&s, &u, sizeof s);
      }
      put_option(offsetof(flashattn_options_t, softmax_scale), s);
    }
    static const int32_t kFlags[] = {0, 1, 0, 1, 2, -1, 5, 7, std::numeric_limits<int32_t>::min()};
    constexpr int kNumFlags = sizeof(kFlags) / sizeof(kFlags[0]);
    if (fields & 2) put_option(offsetof(flashattn_options_t, causal), fuzz_i32(in_, kFlags, kNumFlags));
    if (fields & 4) {
      put_option(offsetof(flashattn_options_t, algorithm), fuzz_i32(in_, kFlags, kNumFlags));
    }
    if (fields & 8) {
      put_option(offsetof(flashattn_options_t, deterministic), fuzz_i32(in_, kFlags, kNumFlags));
    }
    if (fields & 0x40) {  // a sliding window: bounds in range, unbounded, refused
      static const int32_t kBounds[] = {-1, 0, 1, 3, 17, 64, -2, std::numeric_limits<int32_t>::max(),
                                        std::numeric_limits<int32_t>::min()};
      constexpr int kNumBounds = sizeof(kBounds) / sizeof(kBounds[0]);
      put_option(offsetof(flashattn_options_t, window), fuzz_i32(in_, kFlags, kNumFlags));
      put_option(offsetof(flashattn_options_t, window_left), fuzz_i32(in_, kBounds, kNumBounds));
      put_option(offsetof(flashattn_options_t, window_right), fuzz_i32(in_, kBounds, kNumBounds));
    }
    if (fields & 0x80) {
      static const float kCaps[] = {0.0f, 30.0f, 1.0f, 1e-30f, -1.0f,
                                    std::numeric_limits<float>::quiet_NaN(),
                                    std::numeric_limits<float>::infinity()};
      put_option(offsetof(flashattn_options_t, softcap), kCaps[in_.u8() % 7]);
    }
    if ((fields & 0x30) != 0 && options_.n > sizeof(flashattn_options_t)) {
      const size_t tail = options_.n - sizeof(flashattn_options_t);
      if ((fields & 0x30) == 0x30) {
        std::memset(options_.p.get() + sizeof(flashattn_options_t), 0xff, tail);
      } else {
        const size_t at = sizeof(flashattn_options_t) + in_.u16() % tail;
        options_.p[at] = static_cast<unsigned char>(in_.u8() | 1);
      }
    }
    classify_options();
  }

  // ----- the attention calls -----

  const flashattn_tensor_t* view_arg(int slot) const {
    return slot < kViewSlots ? &views_[slot].t : nullptr;
  }

  static int64_t clamp_dim(int64_t v) { return v < 1 ? 1 : v; }

  // Any NaN among a validated view's elements (rank 4, or the rank-3 LSE).
  static bool view_has_nan(const View& v, bool lse) {
    const flashattn_tensor_t& t = v.t;
    int32_t dtype;
    std::memcpy(&dtype, &t.dtype, sizeof dtype);
    const size_t es = elem_size(dtype);
    const int64_t n3 = lse ? 1 : t.shape[3];
    const unsigned char* base = static_cast<const unsigned char*>(t.data);
    for (int64_t i0 = 0; i0 < t.shape[0]; ++i0) {
      for (int64_t i1 = 0; i1 < t.shape[1]; ++i1) {
        for (int64_t i2 = 0; i2 < t.shape[2]; ++i2) {
          for (int64_t i3 = 0; i3 < n3; ++i3) {
            const int64_t off = i0 * t.strides[0] + i1 * t.strides[1] + i2 * t.strides[2] +
                                (lse ? 0 : i3 * t.strides[3]);
            if (is_nan(base + off * static_cast<int64_t>(es), dtype)) return true;
          }
        }
      }
    }
    return false;
  }

  // B * Hq * Nq * D * Nk, saturating; the work a forward or backward would do if it were valid.
  static int64_t compute_cost(const flashattn_tensor_t* q, const flashattn_tensor_t* k) {
    if (q == nullptr || k == nullptr) return 0;
    const int64_t f[5] = {clamp_dim(q->shape[0]), clamp_dim(q->shape[1]), clamp_dim(q->shape[2]),
                          clamp_dim(q->shape[3]), clamp_dim(k->shape[1])};
    int64_t acc = 1;
    for (int64_t v : f) {
      if (__builtin_mul_overflow(acc, v, &acc)) return kI64Max;
    }
    return acc;
  }

  void op_call() {
    const uint8_t fn = in_.u8() % 4;
    const int c = in_.u8() % (kCtxSlots + 1);
    flashattn_context_t ctx = ctx_arg(c);
    int slots[9] = {0, 1, 2, 3, 4, 5, 6, 7, 8};
    const bool canonical = in_.u8() % 4 != 3;
    if (!canonical) {
      for (int& s : slots) s = in_.u8() % (kViewSlots + 1);  // kViewSlots: NULL
    }
    const flashattn_tensor_t* a[9];
    for (int i = 0; i < 9; ++i) a[i] = view_arg(slots[i]);
    const uint8_t opt_mode = in_.u8() % 4;
    const flashattn_options_t* opts =
        opt_mode == 0 ? nullptr : reinterpret_cast<const flashattn_options_t*>(options_.p.get());
    static const int kBackwardFlags[] = {0, 1, 1, 0, 2, -1};
    const int backward_flag = kBackwardFlags[in_.u8() % 6];

    // Workspace: (NULL, 0), (NULL, n), an exact host block, or a range inside a buffer.
    const uint8_t ws_mode = in_.u8() % 8;
    HostBlock host_ws;
    void* ws = nullptr;
    size_t ws_size = 0;
    if (ws_mode == 5) {
      ws_size = 1 + in_.u16();
    } else if (ws_mode == 6) {  // the last query's answer (or near it), at any alignment
      const uint8_t mode = in_.u8();
      const uint8_t sel = mode % 4;
      const size_t misalign = (mode >> 2) % 8;  // bytes past a 16-byte aligned allocation
      const size_t need = last_workspace_;
      ws_size = sel == 0 ? need : sel == 1 ? (need > 0 ? need - 1 : 0) : sel == 2 ? need + 64 : in_.u16();
      if (ws_size > kMaxBufferBytes) ws_size = kMaxBufferBytes;
      host_ws.reset(ws_size + misalign);  // ends exactly where the workspace does
      ws = host_ws.p.get() + misalign;
    } else if (ws_mode == 7) {
      int buf;
      ws = fuzz_data(&buf);
      if (ws == nullptr || buf < 0) {
        ws = nullptr;
      } else {
        const size_t avail = bufs_[buf].size - static_cast<size_t>(static_cast<unsigned char*>(ws) - bufs_[buf].data);
        const uint8_t sel = in_.u8() % 3;
        ws_size = sel == 0 ? avail : sel == 1 ? avail + 1 + in_.u8() : in_.u16() % (avail + 1);
      }
    }

    const bool compute = fn < 2;
    // The untouched consistent problem, valid options, a context, the default workspace (and an
    // out pointer for workspace_size): the call is valid and must succeed.
    const bool null_opts = opts == nullptr;
    const bool expect_success = pristine_ && canonical && ctx != nullptr &&
                                (null_opts || (options_known_ && options_valid_)) &&
                                (compute ? ws_mode <= 4 : !(fn == 3 && ws_mode == 4));
    // Inputs lie in [-2, 2]: every accepted scale must give results without NaN.
    const bool check_nan = expect_success;
    const bool too_big = compute && (compute_cost(a[0], a[1]) > kMaxCompute ||
                                     (c < kCtxSlots && threads_[c] > kMaxComputeThreads) ||
                                     (c < kCtxSlots && threads_[c] < 0));
    if (too_big) {  // still fuzz the validation of these views, without the work
      const int st = check_status(flashattn_supported(ctx, a[0], a[1], a[2], opts, fn), "supported (capped)");
      if (expect_success) EXPECT(st == 0, "supported() of a valid problem");
      return;
    }

    // Snapshot of every buffer: a rejected call must leave all of them as they were.
    std::vector<std::vector<unsigned char>> before;
    const bool snapshot = compute && live_bytes() <= kMaxSnapshotBytes;
    if (snapshot) {
      before.resize(kBufSlots);
      for (int b = 0; b < kBufSlots; ++b) {
        if (bufs_[b].handle != nullptr) before[b].assign(bufs_[b].data, bufs_[b].data + bufs_[b].size);
      }
    }

    int st;
    switch (fn) {
      case 0:
        st = check_status(flashattn_forward(ctx, a[0], a[1], a[2], a[3], a[4], opts, ws, ws_size),
                          "forward");
        break;
      case 1:
        st = check_status(flashattn_backward(ctx, a[0], a[1], a[2], a[3], a[5], a[4], a[6], a[7], a[8],
                                             opts, ws, ws_size),
                          "backward");
        break;
      case 2:
        st = check_status(flashattn_supported(ctx, a[0], a[1], a[2], opts, backward_flag), "supported");
        break;
      default: {
        const size_t sentinel = 0x5eed5eed;
        size_t out = sentinel;
        const bool null_out = ws_mode == 4;
        st = check_status(flashattn_workspace_size(null_out ? nullptr : &out, ctx, a[0], a[1], a[2],
                                                   opts, backward_flag),
                          "workspace_size");
        if (null_out) EXPECT(st == FLASHATTN_ERROR_INVALID_ARGUMENT, "workspace_size(NULL out)");
        if (st == 0) {
          last_workspace_ = out;
        } else {
          EXPECT(out == sentinel, "*out changed by a failed workspace_size");
        }
        break;
      }
    }
    if (ctx == nullptr) EXPECT(st == FLASHATTN_ERROR_INVALID_ARGUMENT, "NULL context");
    if (expect_success) EXPECT(st == 0, "a valid call on a consistent problem must succeed");
    if (st == 0 && fn == 0 && expect_success) {
      if (check_nan) {
        EXPECT(!view_has_nan(views_[3], false), "forward: NaN in out from finite inputs");
        EXPECT(!view_has_nan(views_[4], true), "forward: NaN in lse from finite inputs");
      }
      lse_from_forward_ = true;
      forward_options_gen_ = options_gen_;
      forward_null_opts_ = null_opts;
    }
    if (st == 0 && fn == 1 && expect_success) {
      if (check_nan && lse_from_forward_ && forward_options_gen_ == options_gen_ &&
          forward_null_opts_ == null_opts) {
        for (int t : {6, 7, 8}) EXPECT(!view_has_nan(views_[t], false), "backward: NaN in a gradient");
      }
      if (!null_opts && options_deterministic_) {  // bit-identical run after run
        std::vector<std::vector<unsigned char>> first(kBufSlots);
        for (int b = 0; b < kBufSlots; ++b) {
          if (bufs_[b].handle != nullptr) first[b].assign(bufs_[b].data, bufs_[b].data + bufs_[b].size);
        }
        const int again = check_status(flashattn_backward(ctx, a[0], a[1], a[2], a[3], a[5], a[4], a[6],
                                                          a[7], a[8], opts, ws, ws_size),
                                       "backward (again)");
        EXPECT(again == 0, "a repeated valid backward");
        for (int b = 0; b < kBufSlots; ++b) {
          if (bufs_[b].handle == nullptr) continue;
          EXPECT(std::memcmp(first[b].data(), bufs_[b].data, bufs_[b].size) == 0,
                 "deterministic backward differs between two runs");
        }
      }
    }
    if (snapshot && st >= 100 && st < 300) {
      for (int b = 0; b < kBufSlots; ++b) {
        if (bufs_[b].handle == nullptr) continue;
        EXPECT(std::memcmp(before[b].data(), bufs_[b].data, bufs_[b].size) == 0,
               "a rejected call (1xx/2xx) changed a buffer");
      }
    }
  }

  // ----- everything that needs no context -----

  void op_misc() {
    switch (in_.u8() % 8) {
      case 0: {
        static const int32_t kCodes[] = {0, 100, 101, 102, 103, 104, 105, 106, 107, 200, 201, 202,
                                         300, 301, 400, 500, -1, 1, 99,
                                         std::numeric_limits<int32_t>::min(),
                                         std::numeric_limits<int32_t>::max()};
        const int32_t code = fuzz_i32(in_, kCodes, sizeof(kCodes) / sizeof(kCodes[0]));
        const char* name = fuzz_status_string(code);
        EXPECT(name != nullptr, "status_string");
        if (known_status(code)) {
          EXPECT(std::strncmp(name, "FLASHATTN_", 10) == 0 &&
                     std::strcmp(name, "FLASHATTN_UNKNOWN_STATUS") != 0,
                 "status_string of a status");
        } else {
          EXPECT(std::strcmp(name, "FLASHATTN_UNKNOWN_STATUS") == 0, "status_string of a non-status");
        }
        break;
      }
      case 1: {
        const char* msg = flashattn_last_error();
        const size_t n = std::strlen(msg);
        const uint8_t sel = in_.u8() % 6;
        const size_t len = sel == 0 ? 0 : sel == 1 ? 1 : sel == 2 ? n : sel == 3 ? n + 1 : in_.u8();
        const bool null_buf = len == 0 && (in_.u8() & 1) != 0;
        HostBlock buf;
        buf.reset(len);
        std::memset(buf.p.get(), 'x', len == 0 ? 1 : len);
        char* dst = reinterpret_cast<char*>(buf.p.get());
        const size_t got = flashattn_last_error_r(null_buf ? nullptr : dst, len);
        EXPECT(got == n, "last_error_r returns the full length");
        if (len > 0) {
          const size_t copied = n < len - 1 ? n : len - 1;
          EXPECT(buf.p[copied] == '\0', "last_error_r NUL-terminates");
          EXPECT(std::memcmp(buf.p.get(), msg, copied) == 0, "last_error_r copies the message");
        } else {
          EXPECT(buf.p[0] == 'x', "last_error_r(len 0) writes nothing");
        }
        EXPECT(std::strlen(flashattn_last_error()) == n, "last_error_r changed the error state");
        break;
      }
      case 2:
        EXPECT(flashattn_last_error_r(nullptr, in_.u8()) == std::strlen(flashattn_last_error()),
               "last_error_r(NULL, n)");
        break;
      case 3:
        EXPECT(flashattn_version_number() / 10000 == FLASHATTN_VERSION_MAJOR, "version");
        EXPECT(flashattn_version_string() != nullptr, "version string");
        EXPECT(flashattn_has_cuda() == 0 || flashattn_has_cuda() == 1, "has_cuda");
        break;
      case 4: {
        int n = -7;
        const bool null_out = in_.u8() & 1;
        const int st = check_status(flashattn_cuda_device_count(null_out ? nullptr : &n), "cuda_device_count");
        EXPECT(null_out ? st == FLASHATTN_ERROR_INVALID_ARGUMENT && n == -7 : st == 0 && n >= 0,
               "cuda_device_count");
        if (!flashattn_has_cuda() && !null_out) EXPECT(n == 0, "no CUDA, no devices");
        break;
      }
      case 5: {
        flashattn_options_t o;
        std::memset(&o, 0x5a, sizeof o);
        const bool null_out = in_.u8() & 1;
        const int st = check_status(flashattn_options_init(null_out ? nullptr : &o), "options_init");
        if (null_out) {
          EXPECT(st == FLASHATTN_ERROR_INVALID_ARGUMENT, "options_init(NULL)");
        } else {
          const flashattn_options_t init = FLASHATTN_OPTIONS_INIT;
          EXPECT(st == 0 && o.size == init.size && o.softmax_scale == init.softmax_scale &&
                     o.causal == init.causal && o.algorithm == init.algorithm &&
                     o.deterministic == init.deterministic,
                 "options_init gives the INIT values");
        }
        break;
      }
      default: {  // tensor_4d / tensor_lse with any sizes into a view slot
        pristine_ = false;
        const bool lse = in_.u8() & 1;
        View& v = views_[in_.u8() % kViewSlots];
        const bool null_out = in_.u8() % 16 == 0;
        int64_t s[4];
        for (int64_t& x : s) x = fuzz_i64(in_);
        const int32_t dtype = fuzz_dtype();
        int buf;
        void* data = fuzz_data(&buf);
        View next = v;
        const int st =
            lse ? check_status(flashattn_tensor_lse(null_out ? nullptr : &next.t, data, s[0], s[1], s[2]),
                               "tensor_lse")
                : check_status(fuzz_tensor_4d(null_out ? nullptr : &next.t, data, dtype, s[0], s[1],
                                              s[2], s[3]),
                               "tensor_4d");
        // Valid exactly when every size is >= 1 and the element count fits int64.
        bool ok = !null_out;
        __int128 count = 1;
        for (int i = 0; i < (lse ? 3 : 4); ++i) {
          if (s[i] < 1) ok = false;
          count *= s[i] < 1 ? 1 : s[i];
          if (count > static_cast<__int128>(kI64Max)) {
            ok = false;
            count = 1;
          }
        }
        EXPECT((st == 0) == ok, "tensor_4d/tensor_lse accept exactly positive sizes with a 64-bit count");
        if (st == 0) {
          EXPECT(next.t.data == data && next.t.rank == (lse ? 3 : 4), "view fields");
          next.buf = buf;
          v = next;
        } else {
          EXPECT(std::memcmp(&next.t, &v.t, sizeof v.t) == 0, "*out changed by a failed tensor_*");
        }
        break;
      }
    }
  }

  Input& in_;
  flashattn_context_t ctx_[kCtxSlots] = {};
  int threads_[kCtxSlots] = {};
  Buffer bufs_[kBufSlots];
  View views_[kViewSlots];
  HostBlock options_;
  size_t options_size_ = 0;
  flashattn_context_t kv_ctx_ = nullptr;  // op_kv_cache's own CPU context
  size_t last_workspace_ = 0;
  // Oracle state: the consistent problem of op_problem untouched since; what the options are.
  bool pristine_ = false;
  bool lse_from_forward_ = false;
  unsigned forward_options_gen_ = 0;
  bool forward_null_opts_ = false;
  unsigned options_gen_ = 0;
  bool options_known_ = false;
  bool options_valid_ = false;
  bool options_deterministic_ = false;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  Harness h(in);
  h.run();
  return 0;
}
