// The elementwise steps of ring attention (core/ring.hpp) on host memory.
#pragma once

#include "core/ring.hpp"
#include "cpu/thread_pool.hpp"

namespace flashattn {
namespace cpu {

void ring_op(const RingOp& op, ThreadPool& pool);

}  // namespace cpu
}  // namespace flashattn
