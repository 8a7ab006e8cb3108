// Checks every view and option the C API receives and turns them into the plain structs the
// backends take. Each failure throws Error with a status and a message naming the argument.
#pragma once

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

// Defaults, then the first options->size bytes the library knows of (NULL: all defaults).
flashattn_options_t read_options(const flashattn_options_t* options);

// Shapes, dtypes, strides and options of q, k, v; data pointers are not looked at.
Problem validate_problem(const flashattn_tensor_t* q, const flashattn_tensor_t* k,
                         const flashattn_tensor_t* v, const flashattn_options_t* options,
                         std::vector<CheckedView>* views);

// The forward's and backward's full checks, data pointers and aliasing included (memory
// spaces are the backend's to check). `views` receives every view for those checks.
ForwardArgs validate_forward(const flashattn_tensor_t* q, const flashattn_tensor_t* k,
                             const flashattn_tensor_t* v, const flashattn_tensor_t* out,
                             const flashattn_tensor_t* lse, const flashattn_options_t* options,
                             std::vector<CheckedView>* views);

BackwardArgs validate_backward(const flashattn_tensor_t* q, const flashattn_tensor_t* k,
                               const flashattn_tensor_t* v, const flashattn_tensor_t* out,
                               const flashattn_tensor_t* dout, const flashattn_tensor_t* lse,
                               const flashattn_tensor_t* dq, const flashattn_tensor_t* dk,
                               const flashattn_tensor_t* dv, const flashattn_options_t* options,
                               std::vector<CheckedView>* views);

// True when the element sets of two views can share a byte (conservative: may say true for
// exotic layouts that do not, never false for views that do).
bool views_may_overlap(const CheckedView& a, const CheckedView& b);

}  // namespace flashattn
