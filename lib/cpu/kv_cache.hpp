// The KV cache steps of a CPU forward that come before attention: the host checks of the
// lengths and block table, the rows appended into the cache, and the rotated copy of q. The
// attention itself reads the cache through Seq (its lengths) and for_kv_rows (its pages).
#pragma once

#include <cstddef>

#include "core/problem.hpp"
#include "cpu/thread_pool.hpp"

namespace flashattn {
namespace cpu {

// The header's rules for the lengths, the table entries each sequence uses, the rotary
// positions and the rows appended (no two sequences may append into one page row); throws
// INVALID_SHAPE naming the first offending entry. Reads only host memory; writes nothing.
void check_cache(const ForwardArgs& args);

// Bytes of workspace for the rotated copy of q (0 without a rotary embedding), a multiple of
// 256 so that what follows it stays aligned.
size_t rotated_queries_bytes(const Problem& p);

// Writes k_new / v_new (k_new rotated) into the cache as tokens cache_seqlens[b] + i.
void append_to_cache(const ForwardArgs& args, ThreadPool& pool);

// Writes q with its first rotary_dim features rotated into `dst` ([B, N_q, H_q, d], contiguous,
// q's dtype) and returns that view.
Tensor4 rotate_queries(const ForwardArgs& args, void* dst, ThreadPool& pool);

}  // namespace cpu
}  // namespace flashattn
