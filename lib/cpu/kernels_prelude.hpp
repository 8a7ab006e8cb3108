// Every header kernels_impl.hpp needs. kernels_copy.inc (the body of every kernels_<isa>.cpp)
// includes this first, then switches the instruction set on (a target pragma) and includes
// kernels_impl.hpp: functions defined in these headers keep the default instruction set, so no
// inline function compiled for a newer one can be picked by the linker for code that runs on
// any x86-64.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/half.hpp"
#include "core/problem.hpp"
#include "cpu/convert.hpp"
#include "cpu/kernels.hpp"
#include "cpu/plan.hpp"
#include "cpu/sequences.hpp"
#include "cpu/storage.hpp"
#include "cpu/thread_pool.hpp"
