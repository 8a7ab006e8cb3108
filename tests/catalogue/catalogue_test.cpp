// Runs every case of tests/catalogue/bad_inputs.tsv (format: FORMAT.md) through the public C API:
// builds the valid baseline call, applies the case's mutations, makes the call and checks the
// status, the last-error fragment, that no buffer (outputs poisoned beforehand) changed, and that
// workspace_size left its sentinel output alone. Uses flashattn.h only, as a C caller would.
#include <doctest/doctest.h>

#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <flashattn/flashattn.h>

#ifndef FLASHATTN_CATALOGUE_FILE
#error "FLASHATTN_CATALOGUE_FILE must name bad_inputs.tsv"
#endif
#ifndef FLASHATTN_HEADER_FILE
#error "FLASHATTN_HEADER_FILE must name include/flashattn/flashattn.h"
#endif

namespace {

struct Case {
  int line = 0;
  std::string id, op, mutations, status_name, fragment;
};

std::string catalogue_path() {
  const char* env = std::getenv("FLASHATTN_CATALOGUE");
  return env != nullptr && env[0] != '\0' ? env : FLASHATTN_CATALOGUE_FILE;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

// Throws std::runtime_error for a malformed file: a broken catalogue must fail loudly.
std::vector<Case> load_catalogue(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::vector<Case> cases;
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f = split(line, '\t');
    if (f.size() != 5) {
      throw std::runtime_error(path + ":" + std::to_string(n) + ": expected 5 tab-separated fields, got " +
                               std::to_string(f.size()));
    }
    Case c;
    c.line = n;
    c.id = f[0];
    c.op = f[1];
    c.mutations = f[2];
    c.status_name = f[3];
    c.fragment = f[4];
    cases.push_back(c);
  }
  return cases;
}

// Every status the header defines; names come from the library itself.
const int kStatuses[] = {0, 100, 101, 102, 103, 104, 105, 106, 200, 201, 300, 301, 400, 500};

flashattn_status_t status_of(int code) {
  flashattn_status_t s;
  static_assert(sizeof(s) == sizeof(int), "flashattn_status_t is int-sized");
  std::memcpy(&s, &code, sizeof s);
  return s;
}

bool status_by_name(const std::string& name, int* code) {
  for (int c : kStatuses) {
    if (name == flashattn_status_string(status_of(c))) {
      *code = c;
      return true;
    }
  }
  return false;
}

// Stores v in a 32-bit field (an enum or int32_t) without loading it as the enum type: C allows
// any int there, C++ would not.
template <class Field>
void store32(Field* field, int64_t v) {
  static_assert(sizeof(Field) == sizeof(int32_t), "32-bit field");
  if (v < INT32_MIN || v > INT32_MAX) throw std::runtime_error("value does not fit 32 bits");
  const int32_t x = static_cast<int32_t>(v);
  std::memcpy(field, &x, sizeof x);
}

int64_t parse_int(const std::string& s) {
  if (s.empty()) throw std::runtime_error("empty integer");
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end == nullptr || *end != '\0') throw std::runtime_error("bad integer '" + s + "'");
  return static_cast<int64_t>(v);
}

float parse_float(const std::string& s) {
  if (s == "nan") return std::numeric_limits<float>::quiet_NaN();
  if (s == "inf") return std::numeric_limits<float>::infinity();
  if (s == "-inf") return -std::numeric_limits<float>::infinity();
  errno = 0;
  char* end = nullptr;
  float v = std::strtof(s.c_str(), &end);
  if (errno != 0 || end == nullptr || *end != '\0' || s.empty()) {
    throw std::runtime_error("bad float '" + s + "'");
  }
  return v;
}

const char* const kTensorNames[] = {"q",     "k",     "v",      "out",          "lse",
                                    "dout",  "dq",    "dk",     "dv",           "alibi_slopes",
                                    "sinks", "dsinks", "cu_seqlens_q", "cu_seqlens_k",
                                    "parts_out", "parts_lse", "cache_seqlens", "block_table",
                                    "k_new", "v_new", "rotary_cos", "rotary_sin"};
constexpr int kNumTensors = 22;
enum {
  Q, K, V, OUT, LSE, DOUT, DQ, DK, DV, ALIBI, SINKS, DSINKS, CU_Q, CU_K, PARTS_OUT, PARTS_LSE,
  CACHE_SEQLENS, BLOCK_TABLE, K_NEW, V_NEW, ROTARY_COS, ROTARY_SIN
};

// The _ex ops take the plain op's views and the variant tensors through a flashattn_args_t.
bool is_ex(const std::string& op) { return op.size() > 3 && op.compare(op.size() - 3, 3, "_ex") == 0; }
// The context-parallel ops take what the _ex ops take, and a flashattn_cp_args_t.
bool is_cp(const std::string& op) { return op.compare(0, 3, "cp_") == 0; }
bool takes_args(const std::string& op) { return is_ex(op) || is_cp(op); }
std::string plain_op(const std::string& op) {
  if (is_cp(op)) return op.substr(3);
  return is_ex(op) ? op.substr(0, op.size() - 3) : op;
}

bool is_output(const std::string& op, int t) {
  if (op == "merge") return t == OUT || t == LSE;
  const std::string plain = plain_op(op);
  if (plain == "forward") return t == OUT || t == LSE;
  if (plain == "backward") return t == DQ || t == DK || t == DV || t == DSINKS;
  return false;
}

int tensor_index(const std::string& name) {
  for (int i = 0; i < kNumTensors; ++i) {
    if (name == kTensorNames[i]) return i;
  }
  throw std::runtime_error("unknown tensor '" + name + "'");
}

// Options live at the start of a zero-filled block at least as large as any size the library
// reads through (FORMAT.md, clarifications).
constexpr size_t kOptionsStorage = 4096 + 64;

// The baseline call of FORMAT.md, ready to be mutated.
struct Fixture {
  static constexpr int64_t B = 2, NQ = 64, NK = 48, HQ = 4, HKV = 2, D = 32;
  // The offsets of the variable-length form of the baseline: two full sequences each.
  static constexpr int32_t kOffsetsQ[3] = {0, 64, 128};
  static constexpr int32_t kOffsetsK[3] = {0, 48, 96};
  // The merge's parts: three parts of out's and lse's shapes, one after another.
  static constexpr int64_t kParts = 3;
  // The KV cache form (FORMAT.md): four query tokens, 40 and 44 tokens held, four appended,
  // six pages of 16 rows, rotary tables of 48 positions over all 32 features.
  static constexpr int64_t kCacheQueries = 4, kNew = 4, kPageRows = 16, kPages = 6;
  static constexpr int64_t kPagesPerSeq = 3, kPositions = 48;
  static constexpr int32_t kCacheSeqlens[2] = {40, 44};
  static constexpr int32_t kBlockTable[6] = {0, 1, 2, 3, 4, 5};
  static constexpr float kInputValue = 0.5f, kNewRowsValue = 0.25f;

  flashattn_context_t ctx = nullptr;
  flashattn_context_t ctx_arg = nullptr;
  void* base[kNumTensors] = {};
  flashattn_buffer_t bufs[kNumTensors] = {};
  size_t sizes[kNumTensors] = {};
  flashattn_tensor_t views[kNumTensors] = {};
  bool present[kNumTensors] = {};
  alignas(16) unsigned char options_storage[kOptionsStorage] = {};
  bool options_present = true;
  std::vector<unsigned char> workspace_block;
  void* workspace = nullptr;
  size_t workspace_size = 0;
  int backward_flag = 0;
  flashattn_args_t args = FLASHATTN_ARGS_INIT;
  flashattn_merge_args_t merge_args = FLASHATTN_MERGE_ARGS_INIT;
  bool args_present = true;
  bool merge = false;  // the op is merge: `args` mutations go to merge_args
  flashattn_cp_args_t cp_args = FLASHATTN_CP_ARGS_INIT;
  bool cp_present = true;
  int cp_comm_stand_in = 0;  // what cp.nccl_comm=set points at: no communicator

  // The variant tensors' buffers exist for the _ex ops only: the heap then places the other
  // buffers of a plain op's call as it did before there were variants (some lines depend on
  // what lies past a buffer's end).
  explicit Fixture(const std::string& op) {
    if (flashattn_context_create(&ctx, FLASHATTN_BACKEND_CPU, 0) != FLASHATTN_SUCCESS) {
      throw std::runtime_error(std::string("context_create: ") + flashattn_last_error());
    }
    ctx_arg = ctx;
    merge = op == "merge";
    // The merge's parts come after the nine plain buffers, and only for merge.
    std::vector<int> tensors;
    for (int t = 0; t < ALIBI; ++t) tensors.push_back(t);
    for (int t = ALIBI; takes_args(op) && t <= CU_K; ++t) tensors.push_back(t);
    for (int t = CACHE_SEQLENS; takes_args(op) && t <= ROTARY_SIN; ++t) tensors.push_back(t);
    if (merge) tensors.insert(tensors.end(), {PARTS_OUT, PARTS_LSE});
    for (int t : tensors) {
      const bool like_k = t == K || t == V || t == DK || t == DV;
      void* data = nullptr;
      size_t bytes = t == LSE ? size_t(B * HQ * NQ) * 4
                              : size_t(B * (like_k ? NK : NQ) * (like_k ? HKV : HQ) * D) * 4;
      if (t == ALIBI) bytes = size_t(B * HQ) * 4;  // room for [batch, heads_q]
      if (t == SINKS || t == DSINKS) bytes = size_t(HQ) * 4;
      if (t == CU_Q || t == CU_K) bytes = size_t(B + 1) * 4;
      if (t == PARTS_OUT) bytes = size_t(kParts * B * NQ * HQ * D) * 4;
      if (t == PARTS_LSE) bytes = size_t(kParts * B * HQ * NQ) * 4;
      if (t == CACHE_SEQLENS) bytes = size_t(B) * 4;
      if (t == BLOCK_TABLE) bytes = size_t(B * kPagesPerSeq) * 4;
      if (t == K_NEW || t == V_NEW) bytes = size_t(B * kNew * HKV * D) * 4;
      if (t == ROTARY_COS || t == ROTARY_SIN) bytes = size_t(kPositions * D / 2) * 4;
      sizes[t] = bytes;
      if (flashattn_buffer_create(&bufs[t], ctx, bytes) != FLASHATTN_SUCCESS ||
          flashattn_buffer_data(&data, bufs[t]) != FLASHATTN_SUCCESS) {
        throw std::runtime_error(std::string("buffer: ") + flashattn_last_error());
      }
      base[t] = data;
      flashattn_status_t st = FLASHATTN_SUCCESS;
      if (t == LSE || t == PARTS_LSE) {
        st = flashattn_tensor_lse(&views[t], data, B, HQ, NQ);
      } else if (t == PARTS_OUT) {
        st = flashattn_tensor_4d(&views[t], data, FLASHATTN_DTYPE_FLOAT32, B, NQ, HQ, D);
      } else if (t == K_NEW || t == V_NEW) {
        st = flashattn_tensor_4d(&views[t], data, FLASHATTN_DTYPE_FLOAT32, B, kNew, HKV, D);
      } else if (t == CACHE_SEQLENS) {
        views[t] = matrix_view(data, FLASHATTN_DTYPE_INT32, B, 0);
      } else if (t == BLOCK_TABLE) {
        views[t] = matrix_view(data, FLASHATTN_DTYPE_INT32, B, kPagesPerSeq);
      } else if (t == ROTARY_COS || t == ROTARY_SIN) {
        views[t] = matrix_view(data, FLASHATTN_DTYPE_FLOAT32, kPositions, D / 2);
      } else if (t >= ALIBI) {
        flashattn_tensor_t& v = views[t];
        v = flashattn_tensor_t{};
        v.data = data;
        v.dtype = t >= CU_Q ? FLASHATTN_DTYPE_INT32 : FLASHATTN_DTYPE_FLOAT32;
        v.rank = 1;
        v.shape[0] = t >= CU_Q ? B + 1 : HQ;
        v.strides[0] = 1;
      } else {
        st = flashattn_tensor_4d(&views[t], data, FLASHATTN_DTYPE_FLOAT32, B, like_k ? NK : NQ,
                                 like_k ? HKV : HQ, D);
      }
      if (st != FLASHATTN_SUCCESS) throw std::runtime_error(flashattn_last_error());
      // The variant and cache tensors are given by a mutation.
      present[t] = t < ALIBI || t == PARTS_OUT || t == PARTS_LSE;
    }
    if (flashattn_args_init(&args) != FLASHATTN_SUCCESS) throw std::runtime_error("args_init");
    if (flashattn_merge_args_init(&merge_args) != FLASHATTN_SUCCESS) {
      throw std::runtime_error("merge_args_init");
    }
    merge_args.num_parts = kParts;
    merge_args.parts_out_stride = B * NQ * HQ * D;
    merge_args.parts_lse_stride = B * HQ * NQ;
    flashattn_options_t o;
    if (flashattn_options_init(&o) != FLASHATTN_SUCCESS) throw std::runtime_error("options_init");
    std::memcpy(options_storage, &o, sizeof o);
    if (flashattn_cp_args_init(&cp_args) != FLASHATTN_SUCCESS) throw std::runtime_error("cp_args_init");
    if (is_cp(op)) make_self_attention();
  }

  ~Fixture() {
    for (flashattn_buffer_t b : bufs) flashattn_buffer_destroy(b);
    flashattn_context_destroy(ctx);
  }

  Fixture(const Fixture&) = delete;
  Fixture& operator=(const Fixture&) = delete;

  // Finite inputs, the offsets of the variable-length form; outputs of `op` poisoned with a
  // byte pattern.
  void fill(const std::string& op) {
    for (int t = 0; t < kNumTensors; ++t) {
      if (bufs[t] == nullptr) continue;
      const bool output = is_output(op, t);
      std::vector<unsigned char> bytes(sizes[t]);
      if (output) {
        std::memset(bytes.data(), 0xA5, bytes.size());
      } else if (t == CU_Q || t == CU_K) {
        std::memcpy(bytes.data(), t == CU_Q ? kOffsetsQ : kOffsetsK, bytes.size());
      } else if (t == CACHE_SEQLENS || t == BLOCK_TABLE) {
        std::memcpy(bytes.data(), t == CACHE_SEQLENS ? kCacheSeqlens : kBlockTable, bytes.size());
      } else {
        // The rows to append differ from what k and v hold, so a refused call's append shows.
        const float value = t == K_NEW || t == V_NEW ? kNewRowsValue : kInputValue;
        for (size_t i = 0; i + 4 <= bytes.size(); i += 4) std::memcpy(&bytes[i], &value, 4);
      }
      REQUIRE(flashattn_buffer_write(bufs[t], 0, bytes.data(), bytes.size()) == FLASHATTN_SUCCESS);
    }
  }

  std::vector<std::vector<unsigned char>> snapshot() {
    std::vector<std::vector<unsigned char>> s(kNumTensors);
    for (int t = 0; t < kNumTensors; ++t) {
      if (bufs[t] == nullptr) continue;
      s[t].resize(sizes[t]);
      REQUIRE(flashattn_buffer_read(bufs[t], 0, s[t].data(), sizes[t]) == FLASHATTN_SUCCESS);
    }
    return s;
  }

  flashattn_options_t* options_ptr() {
    return options_present ? reinterpret_cast<flashattn_options_t*>(options_storage) : nullptr;
  }

  const flashattn_tensor_t* view(int t) const { return present[t] ? &views[t] : nullptr; }

  void apply(const std::string& m) {
    const size_t eq = m.find('=');
    if (eq == std::string::npos) throw std::runtime_error("mutation without '='");
    const std::string lhs = m.substr(0, eq);
    const std::string rhs = m.substr(eq + 1);
    if (lhs == "ctx") {
      if (rhs == "null") {
        ctx_arg = nullptr;
      } else if (rhs == "destroyed") {
        flashattn_context_t stale = nullptr;
        if (flashattn_context_create(&stale, FLASHATTN_BACKEND_CPU, 0) != FLASHATTN_SUCCESS ||
            flashattn_context_destroy(stale) != FLASHATTN_SUCCESS) {
          throw std::runtime_error(std::string("a context to destroy: ") + flashattn_last_error());
        }
        ctx_arg = stale;
      } else {
        throw std::runtime_error("ctx takes null or destroyed");
      }
      return;
    }
    if (lhs == "options") {
      if (rhs != "null") throw std::runtime_error("options takes only null");
      options_present = false;
      return;
    }
    if (lhs == "args") {
      if (rhs != "null") throw std::runtime_error("args takes only null");
      args_present = false;
      return;
    }
    if (lhs == "varlen") {
      if (rhs != "1") throw std::runtime_error("varlen takes only 1");
      make_varlen();
      return;
    }
    if (lhs == "cache" || lhs == "paged") {
      if (rhs != "1") throw std::runtime_error(lhs + " takes only 1");
      if (bufs[CACHE_SEQLENS] == nullptr) throw std::runtime_error(lhs + " needs an _ex op");
      lhs == "cache" ? make_cache() : make_paged();
      return;
    }
    if (lhs == "cp") {
      if (rhs != "null") throw std::runtime_error("cp takes only null");
      cp_present = false;
      return;
    }
    if (lhs.compare(0, 3, "cp.") == 0) {
      const std::string field = lhs.substr(3);
      if (field == "size") {
        cp_args.size = static_cast<size_t>(parse_int(rhs));  // two's complement: -1 = SIZE_MAX
      } else if (field == "ranks") {
        cp_args.ranks = parse_int(rhs);
      } else if (field == "rank") {
        cp_args.rank = parse_int(rhs);
      } else if (field == "layout") {
        cp_args.layout = parse_int(rhs);
      } else if (field == "nccl_comm" && rhs == "set") {
        cp_args.nccl_comm = &cp_comm_stand_in;
      } else {
        throw std::runtime_error("unknown cp mutation '" + lhs + "=" + rhs + "'");
      }
      return;
    }
    if (lhs == "args.rotary_interleaved") {
      args.rotary_interleaved = parse_int(rhs);
      return;
    }
    if (lhs == "args.size") {
      // two's complement: -1 = SIZE_MAX
      (merge ? merge_args.size : args.size) = static_cast<size_t>(parse_int(rhs));
      return;
    }
    if (lhs == "args.num_parts" || lhs == "args.parts_out_stride" ||
        lhs == "args.parts_lse_stride") {
      if (!merge) throw std::runtime_error(lhs + " belongs to the merge op");
      (lhs == "args.num_parts"          ? merge_args.num_parts
       : lhs == "args.parts_out_stride" ? merge_args.parts_out_stride
                                        : merge_args.parts_lse_stride) = parse_int(rhs);
      return;
    }
    if (lhs == "args.max_seqlen_q" || lhs == "args.max_seqlen_k") {
      (lhs.back() == 'q' ? args.max_seqlen_q : args.max_seqlen_k) = parse_int(rhs);
      return;
    }
    if (lhs == "workspace") {
      const int64_t n = parse_int(rhs);
      if (n < 0) throw std::runtime_error("negative workspace");
      workspace_block.assign(static_cast<size_t>(n) + 1, 0);  // +1: a real pointer even for 0
      workspace = workspace_block.data();
      workspace_size = static_cast<size_t>(n);
      return;
    }
    if (lhs == "workspace_size") {
      workspace_size = static_cast<size_t>(parse_int(rhs));
      return;
    }
    if (lhs == "backward") {
      backward_flag = static_cast<int>(parse_int(rhs));
      return;
    }
    if (lhs.compare(0, 8, "options.") == 0) {
      apply_option(lhs.substr(8), rhs);
      return;
    }
    const size_t dot = lhs.find('.');
    if (dot == std::string::npos) {  // <t>=null, <t>=given
      if (rhs != "null" && rhs != "given") throw std::runtime_error("<t>= takes null or given");
      const int t = tensor_index(lhs);
      if (rhs == "given" && bufs[t] == nullptr) throw std::runtime_error("a variant tensor needs an _ex op");
      present[t] = rhs == "given";
      return;
    }
    const int index = tensor_index(lhs.substr(0, dot));
    if (bufs[index] == nullptr) throw std::runtime_error("a variant tensor needs an _ex op");
    flashattn_tensor_t& t = views[index];
    const std::string field = lhs.substr(dot + 1);
    if (field == "dtype") {
      store32(&t.dtype, parse_int(rhs));
    } else if (field == "rank") {
      store32(&t.rank, parse_int(rhs));
    } else if (field.compare(0, 6, "shape[") == 0 || field.compare(0, 8, "strides[") == 0) {
      const bool shape = field[1] == 'h';
      const size_t open = field.find('[');
      if (field.back() != ']') throw std::runtime_error("bad index");
      const int64_t i = parse_int(field.substr(open + 1, field.size() - open - 2));
      if (i < 0 || i >= FLASHATTN_MAX_RANK) throw std::runtime_error("index out of range");
      (shape ? t.shape : t.strides)[i] = parse_int(rhs);
    } else if (field.compare(0, 7, "values[") == 0) {
      if (field.back() != ']') throw std::runtime_error("bad index");
      const int64_t i = parse_int(field.substr(7, field.size() - 8));
      if (i < 0 || size_t(i + 1) * 4 > sizes[index]) throw std::runtime_error("values index out of range");
      const int64_t v = parse_int(rhs);
      if (v < INT32_MIN || v > INT32_MAX) throw std::runtime_error("value does not fit int32");
      const int32_t x = static_cast<int32_t>(v);
      REQUIRE(flashattn_buffer_write(bufs[index], size_t(i) * 4, &x, sizeof x) == FLASHATTN_SUCCESS);
    } else if (field == "data") {
      if (rhs == "null") {
        t.data = nullptr;
      } else if (rhs == "misalign") {
        t.data = static_cast<char*>(t.data) + 1;
      } else if (rhs.compare(0, 6, "alias:") == 0) {
        t.data = views[tensor_index(rhs.substr(6))].data;
      } else if (rhs.compare(0, 4, "end+") == 0) {
        const int64_t past = parse_int(rhs.substr(4));
        if (past < 0 || past > 255) throw std::runtime_error("end+ takes 0..255");
        t.data = static_cast<char*>(base[index]) + sizes[index] + past;
      } else {
        throw std::runtime_error("bad data mutation");
      }
    } else {
      throw std::runtime_error("unknown view field '" + field + "'");
    }
  }

  void apply_option(const std::string& field, const std::string& rhs) {
    unsigned char* o = options_storage;
    if (field == "size") {
      const size_t size = static_cast<size_t>(parse_int(rhs));  // two's complement: -1 = SIZE_MAX
      std::memcpy(o + offsetof(flashattn_options_t, size), &size, sizeof size);
    } else if (field == "softmax_scale") {
      const float f = parse_float(rhs);
      std::memcpy(o + offsetof(flashattn_options_t, softmax_scale), &f, sizeof f);
    } else if (field == "causal") {
      store32(reinterpret_cast<int32_t*>(o + offsetof(flashattn_options_t, causal)), parse_int(rhs));
    } else if (field == "algorithm") {
      store32(reinterpret_cast<int32_t*>(o + offsetof(flashattn_options_t, algorithm)),
              parse_int(rhs));
    } else if (field == "deterministic") {
      store32(reinterpret_cast<int32_t*>(o + offsetof(flashattn_options_t, deterministic)),
              parse_int(rhs));
    } else if (field == "num_splits") {
      const int64_t n = parse_int(rhs);
      std::memcpy(o + offsetof(flashattn_options_t, num_splits), &n, sizeof n);
    } else if (field == "window" || field == "window_left" || field == "window_right") {
      const size_t at = field == "window"        ? offsetof(flashattn_options_t, window)
                        : field == "window_left" ? offsetof(flashattn_options_t, window_left)
                                                 : offsetof(flashattn_options_t, window_right);
      store32(reinterpret_cast<int32_t*>(o + at), parse_int(rhs));
    } else if (field == "softcap") {
      const float f = parse_float(rhs);
      std::memcpy(o + offsetof(flashattn_options_t, softcap), &f, sizeof f);
    } else if (field == "tail") {
      const int64_t b = parse_int(rhs);
      if (b < 0 || b > 255) throw std::runtime_error("tail byte out of range");
      size_t size;
      std::memcpy(&size, o + offsetof(flashattn_options_t, size), sizeof size);
      const size_t end = size < kOptionsStorage ? size : kOptionsStorage;
      for (size_t i = sizeof(flashattn_options_t); i < end; ++i) o[i] = static_cast<unsigned char>(b);
    } else {
      throw std::runtime_error("unknown option field '" + field + "'");
    }
  }

  // The variable-length form of the baseline (FORMAT.md): rank-3 views over the same buffers,
  // both offsets given, the max lengths of its sequences.
  void make_varlen() {
    for (int t : {Q, OUT, DOUT, DQ, K, V, DK, DV}) {
      const bool like_k = t == K || t == V || t == DK || t == DV;
      flashattn_tensor_t& v = views[t];
      v.rank = 3;
      v.shape[0] = B * (like_k ? NK : NQ);
      v.shape[1] = like_k ? HKV : HQ;
      v.shape[2] = D;
      v.shape[3] = 0;
      v.strides[0] = v.shape[1] * D;
      v.strides[1] = D;
      v.strides[2] = 1;
      v.strides[3] = 0;
    }
    flashattn_tensor_t& l = views[LSE];
    l.rank = 2;
    l.shape[0] = HQ;
    l.shape[1] = B * NQ;
    l.shape[2] = 0;
    l.strides[0] = B * NQ;
    l.strides[1] = 1;
    l.strides[2] = 0;
    present[CU_Q] = present[CU_K] = bufs[CU_Q] != nullptr;
    args.max_seqlen_q = NQ;
    args.max_seqlen_k = NK;
  }

  // The context-parallel ops' baseline: q, out, dout and dq hold as many tokens as k (a shard
  // of self-attention), over the start of their buffers.
  void make_self_attention() {
    for (int t : {Q, OUT, DOUT, DQ}) {
      views[t].shape[1] = NK;
      views[t].strides[0] = NK * HQ * D;
    }
    flashattn_tensor_t& l = views[LSE];
    l.shape[2] = NK;
    l.strides[0] = HQ * NK;
    l.strides[1] = NK;
  }

  // The KV cache form: four query tokens against the contiguous cache that k and v are.
  void make_cache() {
    views[Q].shape[1] = views[OUT].shape[1] = kCacheQueries;
    for (int t : {Q, OUT}) views[t].strides[0] = kCacheQueries * HQ * D;
    flashattn_tensor_t& l = views[LSE];
    l.shape[2] = kCacheQueries;
    l.strides[0] = HQ * kCacheQueries;
    l.strides[1] = kCacheQueries;
    present[CACHE_SEQLENS] = true;
  }

  // The paged form of the cache: k and v as six pages of 16 rows over the same buffers.
  void make_paged() {
    for (int t : {K, V}) {
      views[t].shape[0] = kPages;
      views[t].shape[1] = kPageRows;
      views[t].strides[0] = kPageRows * HKV * D;
    }
    present[BLOCK_TABLE] = true;
  }

  // A rank-1 ([rows], cols 0) or rank-2 ([rows, cols]) contiguous view.
  static flashattn_tensor_t matrix_view(void* data, flashattn_dtype_t dtype, int64_t rows,
                                        int64_t cols) {
    flashattn_tensor_t v{};
    v.data = data;
    v.dtype = dtype;
    v.rank = cols == 0 ? 1 : 2;
    v.shape[0] = rows;
    v.strides[0] = cols == 0 ? 1 : cols;
    v.shape[1] = cols;
    v.strides[1] = cols == 0 ? 0 : 1;
    return v;
  }

  const flashattn_args_t* args_ptr() {
    if (!args_present) return nullptr;
    args.options = options_ptr();
    const flashattn_tensor_t** fields[CU_K + 1] = {
        &args.q,  &args.k,  &args.v,  &args.out,          &args.lse,
        &args.dout, &args.dq, &args.dk, &args.dv,        &args.alibi_slopes,
        &args.sinks, &args.dsinks, &args.cu_seqlens_q,  &args.cu_seqlens_k};
    for (int t = 0; t <= CU_K; ++t) *fields[t] = view(t);  // the merge's parts are not args
    const flashattn_tensor_t** cache_fields[] = {&args.cache_seqlens, &args.block_table,
                                                 &args.k_new,         &args.v_new,
                                                 &args.rotary_cos,    &args.rotary_sin};
    for (int t = CACHE_SEQLENS; t <= ROTARY_SIN; ++t) *cache_fields[t - CACHE_SEQLENS] = view(t);
    return &args;
  }

  const flashattn_merge_args_t* merge_args_ptr() {
    if (!args_present) return nullptr;
    merge_args.parts_out = view(PARTS_OUT);
    merge_args.parts_lse = view(PARTS_LSE);
    merge_args.out = view(OUT);
    merge_args.lse = view(LSE);
    return &merge_args;
  }

  // Makes the call; for workspace_size also reports whether *out kept its sentinel.
  flashattn_status_t call(const std::string& op, bool* out_untouched) {
    flashattn_options_t* opt = options_ptr();
    *out_untouched = true;
    if (op == "merge") return flashattn_merge(ctx_arg, merge_args_ptr());
    const flashattn_cp_args_t* cp = cp_present ? &cp_args : nullptr;
    if (op == "cp_forward") return flashattn_cp_forward(ctx_arg, cp, args_ptr(), workspace, workspace_size);
    if (op == "cp_backward") return flashattn_cp_backward(ctx_arg, cp, args_ptr(), workspace, workspace_size);
    if (op == "cp_workspace_size") {
      const size_t sentinel = 0x5eed5eed;
      size_t out = sentinel;
      flashattn_status_t st = flashattn_cp_workspace_size(&out, ctx_arg, cp, args_ptr(), backward_flag);
      *out_untouched = out == sentinel;
      return st;
    }
    if (op == "forward_ex") return flashattn_forward_ex(ctx_arg, args_ptr(), workspace, workspace_size);
    if (op == "backward_ex") return flashattn_backward_ex(ctx_arg, args_ptr(), workspace, workspace_size);
    if (op == "supported_ex") return flashattn_supported_ex(ctx_arg, args_ptr(), backward_flag);
    if (op == "workspace_size_ex") {
      const size_t sentinel = 0x5eed5eed;
      size_t out = sentinel;
      flashattn_status_t st = flashattn_workspace_size_ex(&out, ctx_arg, args_ptr(), backward_flag);
      *out_untouched = out == sentinel;
      return st;
    }
    if (op == "forward") {
      return flashattn_forward(ctx_arg, view(Q), view(K), view(V), view(OUT), view(LSE), opt,
                               workspace, workspace_size);
    }
    if (op == "backward") {
      return flashattn_backward(ctx_arg, view(Q), view(K), view(V), view(OUT), view(DOUT),
                                view(LSE), view(DQ), view(DK), view(DV), opt, workspace,
                                workspace_size);
    }
    if (op == "supported") {
      return flashattn_supported(ctx_arg, view(Q), view(K), view(V), opt, backward_flag);
    }
    if (op == "workspace_size") {
      const size_t sentinel = 0x5eed5eed;
      size_t out = sentinel;
      flashattn_status_t st =
          flashattn_workspace_size(&out, ctx_arg, view(Q), view(K), view(V), opt, backward_flag);
      *out_untouched = out == sentinel;
      return st;
    }
    throw std::runtime_error("unknown op '" + op + "'");
  }
};

const std::vector<Case>& catalogue() {
  static const std::vector<Case> cases = load_catalogue(catalogue_path());
  return cases;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The statuses the header's doc comment of `function` lists on its \retval lines: exact names,
// the pattern FLASHATTN_ERROR_INVALID_* (every status with that prefix), and "as <function>"
// (that function's list).
std::set<std::string> documented_statuses(const std::string& header, const std::string& function) {
  const std::string declaration = "FLASHATTN_API flashattn_status_t " + function + "(";
  const size_t at = header.find(declaration);
  if (at == std::string::npos) throw std::runtime_error("no declaration of " + function);
  const size_t open = header.rfind("/*", at);
  const std::string comment = header.substr(open, at - open);
  std::set<std::string> names;
  size_t pos = 0;
  while ((pos = comment.find("\\retval", pos)) != std::string::npos) {
    const size_t end = comment.find('\n', pos);
    std::istringstream line(comment.substr(pos, end - pos));
    std::string word;
    line >> word;  // \retval
    while (line >> word) {
      if (word.back() == ',') word.pop_back();
      if (word == "as") {
        line >> word;
        for (const std::string& n : documented_statuses(header, word)) names.insert(n);
        break;
      }
      if (word.compare(0, 10, "FLASHATTN_") != 0) break;  // the explanation begins
      if (word.back() == '*') {
        for (int code : kStatuses) {
          const std::string name = flashattn_status_string(status_of(code));
          if (name.compare(0, word.size() - 1, word, 0, word.size() - 1) == 0) names.insert(name);
        }
      } else {
        names.insert(word);
      }
    }
    pos = end;
  }
  return names;
}

}  // namespace

TEST_CASE("catalogue: well-formed, unique ids, every reachable 1xx/2xx status covered") {
  const std::vector<Case>& cases = catalogue();
  CHECK(cases.size() >= 40);
  std::set<std::string> ids;
  std::set<int> statuses;
  for (const Case& c : cases) {
    INFO(catalogue_path() << ":" << c.line << " " << c.id);
    CHECK(ids.insert(c.id).second);
    CHECK(c.id.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") ==
          std::string::npos);
    CHECK((c.op == "forward" || c.op == "backward" || c.op == "supported" ||
           c.op == "workspace_size" || c.op == "forward_ex" || c.op == "backward_ex" ||
           c.op == "supported_ex" || c.op == "workspace_size_ex" || c.op == "merge" ||
           c.op == "cp_forward" || c.op == "cp_backward" || c.op == "cp_workspace_size"));
    int code = -1;
    CHECK(status_by_name(c.status_name, &code));
    CHECK(code != 0);  // a catalogue of bad inputs
    CHECK(!c.fragment.empty());
    statuses.insert(code);
  }
  // Every status of the 1xx and 2xx groups that a CPU context produces for these four calls,
  // and OUT_OF_MEMORY of a size that cannot be represented. CONTEXT_BUSY needs a second thread
  // and BACKEND_UNAVAILABLE comes from context creation: neither can be expressed as a mutation
  // of one call.
  for (int code : {100, 101, 102, 103, 104, 105, 200, 300}) {
    INFO("status " << std::string(flashattn_status_string(status_of(code))));
    CHECK(statuses.count(code) == 1);
  }
}

TEST_CASE("catalogue: the header documents every status the catalogue expects of a function") {
  const std::string header = read_file(FLASHATTN_HEADER_FILE);
  std::map<std::string, std::set<std::string>> documented;
  for (const char* op : {"forward", "backward", "supported", "workspace_size", "forward_ex",
                         "backward_ex", "supported_ex", "workspace_size_ex", "merge",
                         "cp_forward", "cp_backward", "cp_workspace_size"}) {
    documented[op] = documented_statuses(header, std::string("flashattn_") + op);
    INFO("flashattn_" << op);
    CHECK(documented[op].count("FLASHATTN_SUCCESS") == 1);
  }
  for (const Case& c : catalogue()) {
    INFO(catalogue_path() << ":" << c.line << " [" << c.id << "] flashattn_" << c.op << " returns "
                          << c.status_name << ", which its \\retval lines do not list");
    CHECK(documented[c.op].count(c.status_name) == 1);
  }
}

TEST_CASE("catalogue: the unmutated baseline of each op succeeds") {
  // Without this, a case could pass for a reason other than its mutation. The _ex ops also with
  // every variant tensor given, and in the variable-length form.
  const char* const variants[] = {"", "alibi_slopes=given;sinks=given;dsinks=given",
                                  "varlen=1", "cache=1", "cache=1;paged=1",
                                  "cache=1;paged=1;k_new=given;v_new=given;rotary_cos=given;"
                                  "rotary_sin=given;args.rotary_interleaved=1;sinks=given",
                                  "varlen=1;alibi_slopes=given;sinks=given;dsinks=given;"
                                  "alibi_slopes.rank=2;alibi_slopes.shape[0]=2;"
                                  "alibi_slopes.shape[1]=4;alibi_slopes.strides[0]=4"};
  // The merge: as given, without the LSE, in place into part 0, and with parts 0 elements apart.
  const char* const kMergeVariants[] = {"", "lse=null",
                                        "out.data=alias:parts_out;lse.data=alias:parts_lse",
                                        "args.parts_out_stride=0;args.parts_lse_stride=0"};
  // The context-parallel ops: one rank as given, zigzag, with sinks.
  const char* const kCpVariants[] = {"", "cp.layout=1", "sinks=given;dsinks=given"};
  for (const char* op : {"forward", "backward", "supported", "workspace_size", "forward_ex",
                         "backward_ex", "supported_ex", "workspace_size_ex", "merge",
                         "cp_forward", "cp_backward", "cp_workspace_size"}) {
    const bool merging = std::string(op) == "merge";
    const std::vector<const char*> lines =
        merging    ? std::vector<const char*>(std::begin(kMergeVariants), std::end(kMergeVariants))
        : is_cp(op) ? std::vector<const char*>(std::begin(kCpVariants), std::end(kCpVariants))
                    : std::vector<const char*>(std::begin(variants), std::end(variants));
    for (const char* mutations : lines) {
      if (!takes_args(op) && std::string(op) != "merge" && mutations[0] != '\0') continue;
      for (int backward : {0, 1}) {
        // The KV cache is forward only: its backward forms are catalogue lines.
        const bool cache_form = std::strstr(mutations, "cache=1") != nullptr;
        if (cache_form && (backward == 1 || std::string(op) == "backward_ex")) continue;
        INFO("op " << std::string(op) << " backward=" << backward << " " << mutations);
        Fixture f(op);
        f.fill(op);
        if (mutations[0] != '\0') {
          for (const std::string& m : split(mutations, ';')) f.apply(m);
        }
        f.backward_flag = backward;
        bool untouched = true;
        flashattn_status_t st = f.call(op, &untouched);
        INFO("last error: " << flashattn_last_error());
        CHECK(st == FLASHATTN_SUCCESS);
        CHECK(std::string(flashattn_last_error()).empty());
      }
    }
  }
}

TEST_CASE("catalogue: every case yields its status, message, and leaves memory untouched") {
  int checked = 0;
  for (const Case& c : catalogue()) {
    INFO(catalogue_path() << ":" << c.line << " [" << c.id << "] " << c.op << " " << c.mutations);
    int expected = -1;
    REQUIRE(status_by_name(c.status_name, &expected));
    Fixture f(c.op);
    f.fill(c.op);
    if (c.mutations != "-") {
      for (const std::string& m : split(c.mutations, ';')) {
        try {
          f.apply(m);
        } catch (const std::exception& e) {
          FAIL("mutation '" << m << "': " << e.what());
        }
      }
    }
    const auto before = f.snapshot();
    bool out_untouched = true;
    const flashattn_status_t st = f.call(c.op, &out_untouched);
    const std::string message = flashattn_last_error();
    INFO("got " << std::string(flashattn_status_string(st)) << ": " << message);
    CHECK(static_cast<int>(st) == expected);
    CHECK(message.find(c.fragment) != std::string::npos);
    CHECK(out_untouched);
    // The copy-out variant agrees with the message.
    std::vector<char> copy(message.size() + 1, 'x');
    CHECK(flashattn_last_error_r(copy.data(), copy.size()) == message.size());
    CHECK(std::string(copy.data()) == message);
    const auto after = f.snapshot();
    for (int t = 0; t < kNumTensors; ++t) {
      INFO("buffer of " << kTensorNames[t]);
      CHECK(before[t] == after[t]);
    }
    ++checked;
  }
  MESSAGE(checked << " catalogue cases checked");
}
