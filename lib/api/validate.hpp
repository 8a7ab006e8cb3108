// Checks every view and option the C API receives and turns them into the plain structs the
// backends take. Each failure throws Error with a status and a message naming the argument.
// The plain entry points (flashattn_forward, ...) and the _ex ones share one path: the plain
// ones fill a flashattn_args_t with their arguments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/problem.hpp"

namespace flashattn {

// The int a caller stored in an enum argument or field. C lets any int sit in an enum object;
// loading an out-of-range value through the C++ enum type is undefined behaviour, so read the
// bits.
template <class E>
int32_t enum_bits(const E& e) {
  static_assert(sizeof(E) == sizeof(int32_t), "C enums here are int-sized");
  int32_t v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

// A view that passed its own checks, with its extent in bytes from data.
struct CheckedView {
  const char* name = "";
  const flashattn_tensor_t* view = nullptr;
  size_t elem_size = 0;
  size_t extent_bytes = 0;  // from data to one past the last element
  bool output = false;
};

// A view whose data lies in a library buffer (its bytes or the guard after them) must end
// inside that buffer (INVALID_MEMORY otherwise); other views are left to the backend.
void check_within_buffer(const CheckedView& v);

// The size of the first flashattn_options_t (size, softmax_scale, causal, algorithm,
// deterministic): what a program built against that header passes, and all that the exported
// flashattn_options_init symbol, which such programs call, may write.
constexpr size_t kOptionsFirstSize = offsetof(flashattn_options_t, window);
// The size of the first flashattn_args_t: the end of max_seqlen_k, before the KV cache's
// fields were appended.
constexpr size_t kArgsFirstSize = offsetof(flashattn_args_t, max_seqlen_k) + sizeof(int64_t);

// Fills the first `size` bytes of *out (not NULL) with the defaults and sets out->size = size:
// the _sized initializers. A size below the first version's, past a plausible struct size or
// inside a field is refused (INVALID_ARGUMENT, nothing written); one larger than this library's
// struct gets zeros, the default of every field, past what the library knows.
void init_options_sized(flashattn_options_t* out, size_t size);
void init_args_sized(flashattn_args_t* out, size_t size);
void init_merge_args_sized(flashattn_merge_args_t* out, size_t size);
void init_cp_args_sized(flashattn_cp_args_t* out, size_t size);

// Defaults, then the first options->size bytes the library knows of (NULL: all defaults).
flashattn_options_t read_options(const flashattn_options_t* options);
// The same for the arguments struct of the _ex calls (NULL: INVALID_ARGUMENT).
flashattn_args_t read_args(const flashattn_args_t* args);
flashattn_merge_args_t read_merge_args(const flashattn_merge_args_t* args);
flashattn_cp_args_t read_cp_args(const flashattn_cp_args_t* cp);

// Shapes, dtypes, strides and options of a configuration (what flashattn_supported and
// flashattn_workspace_size examine); data pointers are not looked at.
Problem validate_problem(const flashattn_args_t& args, bool backward);

// The forward's and backward's full checks, data pointers and aliasing included (memory
// spaces are the backend's to check). `views` receives every view for those checks.
ForwardArgs validate_forward(const flashattn_args_t& args, std::vector<CheckedView>* views);
BackwardArgs validate_backward(const flashattn_args_t& args, std::vector<CheckedView>* views);

// The merge's full checks (flashattn_merge): shapes, dtypes, strides, data pointers and the
// aliasing rules of the header (an output may coincide exactly with one part, or share nothing).
// `views` receives a view per tensor, whose extents cover every part, for the memory checks.
MergeArgs validate_merge(const flashattn_merge_args_t& args, std::vector<CheckedView>* views);

// True when the element sets of two views can share a byte (conservative: may say true for
// exotic layouts that do not, never false for views that do).
bool views_may_overlap(const CheckedView& a, const CheckedView& b);

}  // namespace flashattn
