// The extern "C" entry points: argument checks, dispatch to the context's backend, and the
// firewall (api/last_error.hpp) that turns every failure into a status and a message.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <new>
#include <vector>

#include <flashattn/flashattn.h>

#include "api/handles.hpp"
#include "api/last_error.hpp"
#include "api/registry.hpp"
#include "api/validate.hpp"
#include "parallel/exchange_transport.hpp"
#include "parallel/ring_attention.hpp"

namespace flashattn {

Workspace ContextState::scratch_of_size(size_t bytes) {
  std::lock_guard<std::mutex> lock(scratch_mutex);
  if (bytes > scratch_size) {
    if (scratch != nullptr) backend->deallocate(scratch);
    scratch = nullptr;
    scratch_size = 0;
    scratch = backend->allocate(bytes);  // throws (DEVICE_)OUT_OF_MEMORY; state stays consistent
    scratch_size = bytes;
  }
  return Workspace{scratch, scratch_size};
}

void ContextState::release_scratch() noexcept {
  std::lock_guard<std::mutex> lock(scratch_mutex);
  if (scratch != nullptr) backend->deallocate(scratch);
  scratch = nullptr;
  scratch_size = 0;
}

ContextState::~ContextState() { release_scratch(); }

ContextUse::ContextUse(ContextState& state) : state_(state) {
  bool expected = false;
  if (!state_.busy.compare_exchange_strong(expected, true, std::memory_order_acquire)) {
    fail(FLASHATTN_ERROR_CONTEXT_BUSY,
         "the context is in use by another thread (a context serves one thread at a time)");
  }
}

ContextUse::~ContextUse() { state_.busy.store(false, std::memory_order_release); }

namespace {

// A handle that is not live (destroyed, or never made by this library) is refused before its
// memory is read: INVALID_ARGUMENT rather than a use after free.
[[noreturn]] void fail_not_live(flashattn_context_t) {
  fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
       "ctx is not a live context (destroyed already, or not made by flashattn_context_create)");
}
[[noreturn]] void fail_not_live(flashattn_buffer_t) {
  fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
       "buf is not a live buffer (destroyed already, or not made by flashattn_buffer_create)");
}

ContextState& state_of(flashattn_context_t ctx) {
  if (ctx == nullptr) fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "ctx is NULL");
  if (!registry_contains(ctx)) fail_not_live(ctx);
  return *ctx->state;
}

template <class T>
void require_out(T* out) {
  if (out == nullptr) fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "out is NULL");
}

void require_buffer(flashattn_buffer_t buf) {
  if (buf == nullptr) fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "buf is NULL");
  if (!registry_contains(buf)) fail_not_live(buf);
}

// Bytes allocated, and owned by the library, after each buffer's end. A view whose data lies
// there (data + size, a few bytes on) is then recognised as the buffer's and refused, instead of
// being taken for memory the caller owns: an allocator may place another block right at the end.
constexpr size_t kBufferGuard = 256;

void check_range(flashattn_buffer_t buf, size_t offset, size_t bytes) {
  size_t end;
  if (__builtin_add_overflow(offset, bytes, &end) || end > buf->size) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
         "offset %zu + bytes %zu exceeds the buffer's %zu bytes", offset, bytes, buf->size);
  }
}

// Where each view's memory lives: inside a flashattn buffer it must fit and belong to this
// context's backend; elsewhere the backend judges the memory space (CUDA can tell device from
// host memory and find an allocation's end; the CPU takes host pointers on trust).
void check_memory(const ContextState& state, const std::vector<CheckedView>& views) {
  for (const CheckedView& v : views) {
    RegisteredRange range;
    if (registry_find(v.view->data, &range)) {
      if (range.owner->backend->kind() != state.backend->kind() ||
          range.owner->backend->device() != state.backend->device()) {
        fail(FLASHATTN_ERROR_INVALID_MEMORY,
             "%s: points into a buffer of another context's %s memory", v.name,
             range.owner->backend->kind() == FLASHATTN_BACKEND_CUDA ? "device" : "host");
      }
      if (range.owner != &state && state.backend->kind() == FLASHATTN_BACKEND_CUDA) {
        // Work on this context's stream would not be ordered against the other context's
        // stream, which frees the buffer. (CPU work is finished on return: no such hazard.)
        fail(FLASHATTN_ERROR_INVALID_MEMORY,
             "%s: points into a buffer of another context (use a buffer with the context that "
             "created it)",
             v.name);
      }
      check_within_buffer(v);
      continue;
    }
    state.backend->check_memory(v.view->data, v.extent_bytes, v.name);
  }
}

// Whether [a, a + na) and [b, b + nb) share a byte, without forming a + na (sizes come from the
// caller and may be anything).
bool ranges_overlap(uintptr_t a, size_t na, uintptr_t b, size_t nb) {
  return a <= b ? b - a < na : a - b < nb;
}

// A caller's workspace may have any alignment; backends lay out their scratch as aligned arrays
// (as allocate() returns them). The query answers kWorkspaceAlign - 1 bytes more than the backend
// needs, and the call starts the backend's workspace at the first aligned byte of the caller's.
constexpr size_t kWorkspaceAlign = 256;

size_t workspace_query(size_t needed) {
  if (needed == 0) return 0;
  size_t with_slack;
  if (__builtin_add_overflow(needed, kWorkspaceAlign - 1, &with_slack)) {
    fail(FLASHATTN_ERROR_OUT_OF_MEMORY, "a workspace of %zu bytes cannot be represented", needed);
  }
  return with_slack;
}

Workspace workspace_for(ContextState& state, size_t backend_needed, void* workspace,
                        size_t workspace_size, const std::vector<CheckedView>& views) {
  if (workspace == nullptr && workspace_size == 0) {
    return backend_needed == 0 ? Workspace{} : state.scratch_of_size(backend_needed);
  }
  const size_t needed = workspace_query(backend_needed);
  if (workspace == nullptr) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "workspace is NULL but workspace_size is %zu",
         workspace_size);
  }
  if (workspace_size < needed) {
    fail(FLASHATTN_ERROR_WORKSPACE_TOO_SMALL,
         "workspace_size is %zu bytes; this call needs %zu (see flashattn_workspace_size)",
         workspace_size, needed);
  }
  // The workspace is scribbled on: it must not share memory with any tensor.
  flashattn_tensor_t wsv{};
  wsv.data = workspace;
  wsv.dtype = FLASHATTN_DTYPE_FLOAT32;
  CheckedView cw;
  cw.name = "workspace";
  cw.view = &wsv;
  cw.elem_size = 1;
  cw.extent_bytes = workspace_size;
  for (const CheckedView& v : views) {
    const uintptr_t a = reinterpret_cast<uintptr_t>(workspace);
    const uintptr_t b = reinterpret_cast<uintptr_t>(v.view->data);
    if (ranges_overlap(a, workspace_size, b, v.extent_bytes)) {
      fail(FLASHATTN_ERROR_INVALID_MEMORY, "workspace: shares memory with %s", v.name);
    }
  }
  std::vector<CheckedView> ws_only{cw};
  wsv.rank = 0;
  check_memory(state, ws_only);
  if (backend_needed == 0) return Workspace{workspace, workspace_size};
  const uintptr_t base = reinterpret_cast<uintptr_t>(workspace);
  const size_t pad = (kWorkspaceAlign - base % kWorkspaceAlign) % kWorkspaceAlign;  // < the slack
  return Workspace{static_cast<char*>(workspace) + pad, workspace_size - pad};
}

// The arguments struct the plain entry points fill from their parameters.
flashattn_args_t plain_args(const flashattn_tensor_t* q, const flashattn_tensor_t* k,
                            const flashattn_tensor_t* v, const flashattn_options_t* options) {
  flashattn_args_t a = FLASHATTN_ARGS_INIT;
  a.options = options;
  a.q = q;
  a.k = k;
  a.v = v;
  return a;
}

// The bodies every pair of entry points (plain and _ex) shares.
void supported(ContextState& state, const flashattn_args_t& args, bool backward) {
  const Problem p = validate_problem(args, backward);
  state.backend->check_supported(p, backward);
}

size_t workspace_size(ContextState& state, const flashattn_args_t& args, bool backward) {
  const Problem p = validate_problem(args, backward);
  state.backend->check_supported(p, backward);
  return workspace_query(state.backend->workspace_size(p, backward));
}

void forward(ContextState& state, const flashattn_args_t& args, void* workspace,
             size_t workspace_size) {
  std::vector<CheckedView> views;
  const ForwardArgs a = validate_forward(args, &views);
  state.backend->check_supported(a.problem, false);
  ContextUse use(state);
  check_memory(state, views);
  const size_t needed = state.backend->workspace_size(a.problem, false);
  Workspace ws = workspace_for(state, needed, workspace, workspace_size, views);
  state.backend->forward(a, ws);
}

void backward(ContextState& state, const flashattn_args_t& args, void* workspace,
              size_t workspace_size) {
  std::vector<CheckedView> views;
  const BackwardArgs a = validate_backward(args, &views);
  state.backend->check_supported(a.problem, true);
  ContextUse use(state);
  check_memory(state, views);
  const size_t needed = state.backend->workspace_size(a.problem, true);
  Workspace ws = workspace_for(state, needed, workspace, workspace_size, views);
  state.backend->backward(a, ws);
}

void merge(ContextState& state, const flashattn_merge_args_t& args) {
  std::vector<CheckedView> views;
  const MergeArgs a = validate_merge(args, &views);
  state.backend->check_merge_supported(a.dtype);
  ContextUse use(state);
  check_memory(state, views);
  state.backend->merge(a);
}

// ---- Context parallelism ---------------------------------------------------------------------

// cp's fields, against the context's kind and this rank's shard problem.
parallel::RingSetup cp_setup(const ContextState& state, const flashattn_cp_args_t& cp,
                             const Problem& p) {
  if (cp.ranks < 1) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "cp: ranks is %lld; at least 1",
         static_cast<long long>(cp.ranks));
  }
  if (cp.rank < 0 || cp.rank >= cp.ranks) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "cp: rank is %lld; ranks %lld are 0 to %lld",
         static_cast<long long>(cp.rank), static_cast<long long>(cp.ranks),
         static_cast<long long>(cp.ranks - 1));
  }
  if (cp.layout != FLASHATTN_CP_LAYOUT_CONTIGUOUS && cp.layout != FLASHATTN_CP_LAYOUT_ZIGZAG) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
         "cp: layout is %lld; FLASHATTN_CP_LAYOUT_CONTIGUOUS (0) or FLASHATTN_CP_LAYOUT_ZIGZAG (1)",
         static_cast<long long>(cp.layout));
  }
  const bool cuda = state.backend->kind() == FLASHATTN_BACKEND_CUDA;
  if (!cuda && cp.nccl_comm != nullptr) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
         "cp: nccl_comm is set on a CPU context; its transport is an exchange function");
  }
  if (cp.nccl_comm != nullptr && cp.exchange != nullptr) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT,
         "cp: both nccl_comm and exchange are set; give one transport");
  }
  if (cp.ranks > 1 && cp.nccl_comm == nullptr && cp.exchange == nullptr) {
    fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "cp: %s is NULL with %lld ranks",
         cuda ? "the transport (nccl_comm or exchange)" : "exchange",
         static_cast<long long>(cp.ranks));
  }
  if (p.varlen) {
    fail(FLASHATTN_ERROR_UNSUPPORTED,
         "cp: variable-length batches are not sharded in this version (cu_seqlens_q is set)");
  }
  if (p.kv_cache != KvCache::None) {
    fail(FLASHATTN_ERROR_UNSUPPORTED, "cp: a KV cache is not sharded (cache_seqlens is set)");
  }
  if (p.alibi != Alibi::None) {
    fail(FLASHATTN_ERROR_UNSUPPORTED,
         "cp: ALiBi is not supported with context parallelism in this version");
  }
  if (p.seqlen_q != p.seqlen_k) {
    fail(FLASHATTN_ERROR_INVALID_SHAPE,
         "cp: q holds %lld tokens and k %lld; a rank's shards of q, k and v hold the same tokens",
         static_cast<long long>(p.seqlen_q), static_cast<long long>(p.seqlen_k));
  }
  if (cp.layout == FLASHATTN_CP_LAYOUT_ZIGZAG && p.seqlen_q % 2 != 0) {
    fail(FLASHATTN_ERROR_INVALID_SHAPE,
         "cp: the zigzag layout holds two chunks of equal length; the shard's %lld tokens are odd",
         static_cast<long long>(p.seqlen_q));
  }
  parallel::RingSetup s;
  s.ranks = cp.ranks;
  s.rank = cp.rank;
  s.layout = cp.layout == FLASHATTN_CP_LAYOUT_ZIGZAG ? parallel::Layout::Zigzag
                                                     : parallel::Layout::Contiguous;
  return s;
}

std::unique_ptr<RingTransport> cp_transport(ContextState& state, const flashattn_cp_args_t& cp) {
  if (cp.nccl_comm != nullptr) {
    return state.backend->make_nccl_transport(cp.nccl_comm, cp.ranks, cp.rank);
  }
  return std::make_unique<parallel::ExchangeTransport>(*state.backend, cp.exchange,
                                                       cp.exchange_user);
}

size_t cp_workspace_size(ContextState& state, const flashattn_cp_args_t& cp,
                         const flashattn_args_t& args, bool backward) {
  const Problem p = validate_problem(args, backward);
  const parallel::RingSetup setup = cp_setup(state, cp, p);
  state.backend->check_supported(p, backward);
  if (setup.ranks == 1) return workspace_query(state.backend->workspace_size(p, backward));
  return workspace_query(parallel::ring_workspace_size(*state.backend, setup, p, backward));
}

// The forward's and the backward's shared body: validation, one rank as the plain call, else
// the workspace and transport of the ring, then `run` (parallel::ring_forward or _backward).
template <class Args, class Validate, class Plain, class Run>
void cp_call(ContextState& state, const flashattn_cp_args_t& cp, const flashattn_args_t& args,
             void* workspace, size_t workspace_size, bool backward, Validate validate,
             Plain plain, Run run) {
  std::vector<CheckedView> views;
  const Args a = validate(args, &views);
  const parallel::RingSetup setup = cp_setup(state, cp, a.problem);
  if (setup.ranks == 1) {
    if (cp.nccl_comm != nullptr) (void)cp_transport(state, cp);  // NCCL and the comm checked
    return plain(state, args, workspace, workspace_size);
  }
  state.backend->check_supported(a.problem, backward);
  const size_t needed = parallel::ring_workspace_size(*state.backend, setup, a.problem, backward);
  ContextUse use(state);
  check_memory(state, views);
  Workspace ws = workspace_for(state, needed, workspace, workspace_size, views);
  std::unique_ptr<RingTransport> transport = cp_transport(state, cp);
  run(*state.backend, *transport, setup, a, ws);
}

void cp_forward(ContextState& state, const flashattn_cp_args_t& cp, const flashattn_args_t& args,
                void* workspace, size_t workspace_size) {
  cp_call<ForwardArgs>(state, cp, args, workspace, workspace_size, false, validate_forward,
                       forward, parallel::ring_forward);
}

void cp_backward(ContextState& state, const flashattn_cp_args_t& cp,
                 const flashattn_args_t& args, void* workspace, size_t workspace_size) {
  cp_call<BackwardArgs>(state, cp, args, workspace, workspace_size, true, validate_backward,
                        backward, parallel::ring_backward);
}

}  // namespace
}  // namespace flashattn

using namespace flashattn;

extern "C" {

FLASHATTN_API unsigned flashattn_version_number(void) { return FLASHATTN_VERSION_NUMBER; }

FLASHATTN_API const char* flashattn_version_string(void) { return FLASHATTN_VERSION_STRING; }

FLASHATTN_API int flashattn_has_cuda(void) { return FLASHATTN_HAS_CUDA; }

FLASHATTN_API const char* flashattn_status_string(flashattn_status_t status) {
  switch (enum_bits(status)) {
    case FLASHATTN_SUCCESS: return "FLASHATTN_SUCCESS";
    case FLASHATTN_ERROR_INVALID_ARGUMENT: return "FLASHATTN_ERROR_INVALID_ARGUMENT";
    case FLASHATTN_ERROR_INVALID_SHAPE: return "FLASHATTN_ERROR_INVALID_SHAPE";
    case FLASHATTN_ERROR_INVALID_DTYPE: return "FLASHATTN_ERROR_INVALID_DTYPE";
    case FLASHATTN_ERROR_INVALID_STRIDE: return "FLASHATTN_ERROR_INVALID_STRIDE";
    case FLASHATTN_ERROR_INVALID_MEMORY: return "FLASHATTN_ERROR_INVALID_MEMORY";
    case FLASHATTN_ERROR_WORKSPACE_TOO_SMALL: return "FLASHATTN_ERROR_WORKSPACE_TOO_SMALL";
    case FLASHATTN_ERROR_CONTEXT_BUSY: return "FLASHATTN_ERROR_CONTEXT_BUSY";
    case FLASHATTN_ERROR_UNSUPPORTED: return "FLASHATTN_ERROR_UNSUPPORTED";
    case FLASHATTN_ERROR_BACKEND_UNAVAILABLE: return "FLASHATTN_ERROR_BACKEND_UNAVAILABLE";
    case FLASHATTN_ERROR_OUT_OF_MEMORY: return "FLASHATTN_ERROR_OUT_OF_MEMORY";
    case FLASHATTN_ERROR_DEVICE_OUT_OF_MEMORY: return "FLASHATTN_ERROR_DEVICE_OUT_OF_MEMORY";
    case FLASHATTN_ERROR_DEVICE: return "FLASHATTN_ERROR_DEVICE";
    case FLASHATTN_ERROR_INTERNAL: return "FLASHATTN_ERROR_INTERNAL";
  }
  return "FLASHATTN_UNKNOWN_STATUS";
}

FLASHATTN_API flashattn_status_t flashattn_cuda_device_count(int* out) {
  return guarded(__func__, [&] {
    require_out(out);
    *out = cuda_device_count();
  });
}

FLASHATTN_API flashattn_status_t flashattn_context_create(flashattn_context_t* out,
                                                          flashattn_backend_t backend,
                                                          int device) {
  return guarded(__func__, [&] {
    require_out(out);
    const int32_t backend_bits = enum_bits(backend);
    if (backend_bits != FLASHATTN_BACKEND_AUTO && backend_bits != FLASHATTN_BACKEND_CPU &&
        backend_bits != FLASHATTN_BACKEND_CUDA) {
      fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "backend is %d, not a flashattn_backend_t",
           static_cast<int>(backend_bits));
    }
    if (device < 0) fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "device is %d, must be >= 0", device);
    auto state = std::make_shared<ContextState>();
    if (backend == FLASHATTN_BACKEND_CPU ||
        (backend == FLASHATTN_BACKEND_AUTO && cuda_device_count() <= device)) {
      state->backend = make_cpu_backend();
    } else {
      state->backend = make_cuda_backend(device);
    }
    auto* ctx = new flashattn_context;
    ctx->state = std::move(state);
    try {
      registry_add(ctx);
    } catch (...) {
      delete ctx;
      throw;
    }
    *out = ctx;
  });
}

FLASHATTN_API flashattn_status_t flashattn_context_destroy(flashattn_context_t ctx) {
  return guarded(__func__, [&] {
    if (ctx == nullptr) return;
    if (!registry_remove(ctx)) fail_not_live(ctx);
    std::shared_ptr<ContextState> state = std::move(ctx->state);
    delete ctx;
    state->release_scratch();
    state->backend->synchronize();  // reports an earlier asynchronous error, if any
  });
}

FLASHATTN_API flashattn_status_t flashattn_context_get_backend(flashattn_backend_t* out,
                                                               flashattn_context_t ctx) {
  return guarded(__func__, [&] {
    require_out(out);
    *out = state_of(ctx).backend->kind();
  });
}

FLASHATTN_API flashattn_status_t flashattn_context_get_device(int* out, flashattn_context_t ctx) {
  return guarded(__func__, [&] {
    require_out(out);
    *out = state_of(ctx).backend->device();
  });
}

FLASHATTN_API flashattn_status_t flashattn_context_get_cpu_kernels(flashattn_cpu_kernels_t* out,
                                                                   flashattn_context_t ctx) {
  return guarded(__func__, [&] {
    require_out(out);
    *out = state_of(ctx).backend->cpu_kernels();
  });
}

FLASHATTN_API flashattn_status_t flashattn_context_set_stream(flashattn_context_t ctx,
                                                              void* stream) {
  return guarded(__func__, [&] {
    ContextState& state = state_of(ctx);
    ContextUse use(state);
    if (stream != nullptr && state.backend->kind() == FLASHATTN_BACKEND_CPU) {
      fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "stream: a CPU context takes no stream (pass NULL)");
    }
    state.backend->set_stream(stream);
  });
}

FLASHATTN_API flashattn_status_t flashattn_context_get_stream(void** out,
                                                              flashattn_context_t ctx) {
  return guarded(__func__, [&] {
    require_out(out);
    *out = state_of(ctx).backend->stream();
  });
}

FLASHATTN_API flashattn_status_t flashattn_context_set_num_threads(flashattn_context_t ctx,
                                                                   int num_threads) {
  return guarded(__func__, [&] {
    ContextState& state = state_of(ctx);
    if (num_threads < 0) {
      fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "num_threads is %d, must be >= 0", num_threads);
    }
    ContextUse use(state);
    state.backend->set_num_threads(num_threads);
  });
}

FLASHATTN_API flashattn_status_t flashattn_context_synchronize(flashattn_context_t ctx) {
  return guarded(__func__, [&] {
    ContextState& state = state_of(ctx);
    ContextUse use(state);
    state.backend->synchronize();
  });
}

FLASHATTN_API flashattn_status_t flashattn_buffer_create(flashattn_buffer_t* out,
                                                         flashattn_context_t ctx, size_t bytes) {
  return guarded(__func__, [&] {
    require_out(out);
    ContextState& state = state_of(ctx);
    if (bytes == 0) fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "bytes is 0");
    size_t reserved;
    if (__builtin_add_overflow(bytes, kBufferGuard, &reserved)) {
      fail(FLASHATTN_ERROR_OUT_OF_MEMORY, "a buffer of %zu bytes cannot be represented", bytes);
    }
    ContextUse use(state);
    auto* buf = new flashattn_buffer;
    try {
      buf->data = state.backend->allocate(reserved);
    } catch (const Error& e) {
      delete buf;
      // The caller asked for `bytes`; the guard is ours to mention.
      fail(e.status(), "a buffer of %zu bytes (with its %zu-byte guard): %s", bytes, kBufferGuard,
           e.what());
    } catch (...) {
      delete buf;
      throw;
    }
    buf->state = ctx->state;
    buf->size = bytes;
    try {
      registry_add(buf, RegisteredRange{reinterpret_cast<uintptr_t>(buf->data), bytes, reserved,
                                        buf->state.get()});
    } catch (...) {
      state.backend->deallocate(buf->data);
      delete buf;
      throw;
    }
    *out = buf;
  });
}

FLASHATTN_API flashattn_status_t flashattn_buffer_destroy(flashattn_buffer_t buf) {
  return guarded(__func__, [&] {
    if (buf == nullptr) return;
    if (!registry_remove(buf)) fail_not_live(buf);
    buf->state->backend->deallocate(buf->data);
    delete buf;
  });
}

FLASHATTN_API flashattn_status_t flashattn_buffer_write(flashattn_buffer_t buf, size_t offset,
                                                        const void* src, size_t bytes) {
  return guarded(__func__, [&] {
    require_buffer(buf);
    if (src == nullptr) fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "src is NULL");
    check_range(buf, offset, bytes);
    ContextUse use(*buf->state);
    if (bytes == 0) return;
    buf->state->backend->copy_from_host(static_cast<char*>(buf->data) + offset, src, bytes);
  });
}

FLASHATTN_API flashattn_status_t flashattn_buffer_read(flashattn_buffer_t buf, size_t offset,
                                                       void* dst, size_t bytes) {
  return guarded(__func__, [&] {
    require_buffer(buf);
    if (dst == nullptr) fail(FLASHATTN_ERROR_INVALID_ARGUMENT, "dst is NULL");
    check_range(buf, offset, bytes);
    ContextUse use(*buf->state);
    if (bytes == 0) return;
    buf->state->backend->copy_to_host(dst, static_cast<const char*>(buf->data) + offset, bytes);
  });
}

FLASHATTN_API flashattn_status_t flashattn_buffer_data(void** out, flashattn_buffer_t buf) {
  return guarded(__func__, [&] {
    require_out(out);
    require_buffer(buf);
    *out = buf->data;
  });
}

FLASHATTN_API flashattn_status_t flashattn_buffer_size(size_t* out, flashattn_buffer_t buf) {
  return guarded(__func__, [&] {
    require_out(out);
    require_buffer(buf);
    *out = buf->size;
  });
}

FLASHATTN_API flashattn_status_t flashattn_tensor_4d(flashattn_tensor_t* out, void* data,
                                                     flashattn_dtype_t dtype, int64_t batch,
                                                     int64_t seqlen, int64_t heads,
                                                     int64_t head_dim) {
  return guarded(__func__, [&] {
    require_out(out);
    const int64_t shape[4] = {batch, seqlen, heads, head_dim};
    int64_t strides[4];
    int64_t acc = 1;
    for (int i = 3; i >= 0; --i) {
      if (shape[i] < 1) {
        fail(FLASHATTN_ERROR_INVALID_SHAPE, "shape[%d] is %lld, must be >= 1", i,
             static_cast<long long>(shape[i]));
      }
      strides[i] = acc;
      if (__builtin_mul_overflow(acc, shape[i], &acc)) {
        fail(FLASHATTN_ERROR_INVALID_SHAPE, "the element count overflows 64 bits");
      }
    }
    flashattn_tensor_t t{};
    t.data = data;
    std::memcpy(&t.dtype, &dtype, sizeof dtype);  // any int: validated where the view is used
    t.rank = 4;
    for (int i = 0; i < 4; ++i) {
      t.shape[i] = shape[i];
      t.strides[i] = strides[i];
    }
    *out = t;
  });
}

FLASHATTN_API flashattn_status_t flashattn_tensor_lse(flashattn_tensor_t* out, void* data,
                                                      int64_t batch, int64_t heads,
                                                      int64_t seqlen) {
  return guarded(__func__, [&] {
    require_out(out);
    const int64_t shape[3] = {batch, heads, seqlen};
    for (int i = 0; i < 3; ++i) {
      if (shape[i] < 1) {
        fail(FLASHATTN_ERROR_INVALID_SHAPE, "shape[%d] is %lld, must be >= 1", i,
             static_cast<long long>(shape[i]));
      }
    }
    int64_t hs, bs;
    if (__builtin_mul_overflow(heads, seqlen, &hs) || __builtin_mul_overflow(hs, batch, &bs)) {
      fail(FLASHATTN_ERROR_INVALID_SHAPE, "the element count overflows 64 bits");
    }
    flashattn_tensor_t t{};
    t.data = data;
    t.dtype = FLASHATTN_DTYPE_FLOAT32;
    t.rank = 3;
    t.shape[0] = batch;
    t.shape[1] = heads;
    t.shape[2] = seqlen;
    t.strides[0] = hs;
    t.strides[1] = seqlen;
    t.strides[2] = 1;
    *out = t;
  });
}

FLASHATTN_API flashattn_status_t flashattn_options_init_sized(flashattn_options_t* out,
                                                             size_t size) {
  return guarded(__func__, [&] {
    require_out(out);
    init_options_sized(out, size);
  });
}

// The entry point of the first header, where flashattn_options_init was a function; programs
// built against it call this symbol with a struct of the first version's size, so it writes
// only that much (the header now maps the name onto flashattn_options_init_sized).
#undef flashattn_options_init
FLASHATTN_API flashattn_status_t flashattn_options_init(flashattn_options_t* out);
FLASHATTN_API flashattn_status_t flashattn_options_init(flashattn_options_t* out) {
  return guarded(__func__, [&] {
    require_out(out);
    init_options_sized(out, kOptionsFirstSize);
  });
}

FLASHATTN_API flashattn_status_t flashattn_args_init_sized(flashattn_args_t* out, size_t size) {
  return guarded(__func__, [&] {
    require_out(out);
    init_args_sized(out, size);
  });
}

FLASHATTN_API flashattn_status_t flashattn_supported(flashattn_context_t ctx,
                                                     const flashattn_tensor_t* q,
                                                     const flashattn_tensor_t* k,
                                                     const flashattn_tensor_t* v,
                                                     const flashattn_options_t* options,
                                                     int backward) {
  return guarded(__func__, [&] {
    supported(state_of(ctx), plain_args(q, k, v, options), backward != 0);
  });
}

FLASHATTN_API flashattn_status_t flashattn_supported_ex(flashattn_context_t ctx,
                                                        const flashattn_args_t* args,
                                                        int backward) {
  return guarded(__func__, [&] {
    ContextState& state = state_of(ctx);
    supported(state, read_args(args), backward != 0);
  });
}

FLASHATTN_API flashattn_status_t flashattn_workspace_size(size_t* out, flashattn_context_t ctx,
                                                          const flashattn_tensor_t* q,
                                                          const flashattn_tensor_t* k,
                                                          const flashattn_tensor_t* v,
                                                          const flashattn_options_t* options,
                                                          int backward) {
  return guarded(__func__, [&] {
    require_out(out);
    *out = workspace_size(state_of(ctx), plain_args(q, k, v, options), backward != 0);
  });
}

FLASHATTN_API flashattn_status_t flashattn_workspace_size_ex(size_t* out, flashattn_context_t ctx,
                                                             const flashattn_args_t* args,
                                                             int backward) {
  return guarded(__func__, [&] {
    require_out(out);
    ContextState& state = state_of(ctx);
    *out = workspace_size(state, read_args(args), backward != 0);
  });
}

FLASHATTN_API flashattn_status_t flashattn_forward(flashattn_context_t ctx,
                                                   const flashattn_tensor_t* q,
                                                   const flashattn_tensor_t* k,
                                                   const flashattn_tensor_t* v,
                                                   const flashattn_tensor_t* out,
                                                   const flashattn_tensor_t* lse,
                                                   const flashattn_options_t* options,
                                                   void* workspace, size_t workspace_size) {
  return guarded(__func__, [&] {
    flashattn_args_t a = plain_args(q, k, v, options);
    a.out = out;
    a.lse = lse;
    forward(state_of(ctx), a, workspace, workspace_size);
  });
}

FLASHATTN_API flashattn_status_t flashattn_forward_ex(flashattn_context_t ctx,
                                                      const flashattn_args_t* args,
                                                      void* workspace, size_t workspace_size) {
  return guarded(__func__, [&] {
    ContextState& state = state_of(ctx);
    forward(state, read_args(args), workspace, workspace_size);
  });
}

FLASHATTN_API flashattn_status_t flashattn_backward(
    flashattn_context_t ctx, const flashattn_tensor_t* q, const flashattn_tensor_t* k,
    const flashattn_tensor_t* v, const flashattn_tensor_t* out, const flashattn_tensor_t* dout,
    const flashattn_tensor_t* lse, const flashattn_tensor_t* dq, const flashattn_tensor_t* dk,
    const flashattn_tensor_t* dv, const flashattn_options_t* options, void* workspace,
    size_t workspace_size) {
  return guarded(__func__, [&] {
    flashattn_args_t a = plain_args(q, k, v, options);
    a.out = out;
    a.dout = dout;
    a.lse = lse;
    a.dq = dq;
    a.dk = dk;
    a.dv = dv;
    backward(state_of(ctx), a, workspace, workspace_size);
  });
}

FLASHATTN_API flashattn_status_t flashattn_backward_ex(flashattn_context_t ctx,
                                                       const flashattn_args_t* args,
                                                       void* workspace, size_t workspace_size) {
  return guarded(__func__, [&] {
    ContextState& state = state_of(ctx);
    backward(state, read_args(args), workspace, workspace_size);
  });
}

FLASHATTN_API flashattn_status_t flashattn_merge_args_init_sized(flashattn_merge_args_t* out,
                                                                 size_t size) {
  return guarded(__func__, [&] {
    require_out(out);
    init_merge_args_sized(out, size);
  });
}

FLASHATTN_API flashattn_status_t flashattn_merge(flashattn_context_t ctx,
                                                 const flashattn_merge_args_t* args) {
  return guarded(__func__, [&] {
    ContextState& state = state_of(ctx);
    merge(state, read_merge_args(args));
  });
}

FLASHATTN_API flashattn_status_t flashattn_cp_args_init_sized(flashattn_cp_args_t* out,
                                                              size_t size) {
  return guarded(__func__, [&] {
    require_out(out);
    init_cp_args_sized(out, size);
  });
}

FLASHATTN_API flashattn_status_t flashattn_cp_workspace_size(size_t* out, flashattn_context_t ctx,
                                                             const flashattn_cp_args_t* cp,
                                                             const flashattn_args_t* args,
                                                             int backward) {
  return guarded(__func__, [&] {
    require_out(out);
    ContextState& state = state_of(ctx);
    *out = cp_workspace_size(state, read_cp_args(cp), read_args(args), backward != 0);
  });
}

FLASHATTN_API flashattn_status_t flashattn_cp_forward(flashattn_context_t ctx,
                                                      const flashattn_cp_args_t* cp,
                                                      const flashattn_args_t* args,
                                                      void* workspace, size_t workspace_size) {
  return guarded(__func__, [&] {
    ContextState& state = state_of(ctx);
    cp_forward(state, read_cp_args(cp), read_args(args), workspace, workspace_size);
  });
}

FLASHATTN_API flashattn_status_t flashattn_cp_backward(flashattn_context_t ctx,
                                                       const flashattn_cp_args_t* cp,
                                                       const flashattn_args_t* args,
                                                       void* workspace, size_t workspace_size) {
  return guarded(__func__, [&] {
    ContextState& state = state_of(ctx);
    cp_backward(state, read_cp_args(cp), read_args(args), workspace, workspace_size);
  });
}

}  // extern "C"
