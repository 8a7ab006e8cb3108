// Which attention calls each step of ring attention makes: where a rank's tokens sit in the
// global sequence (the layout), which rank's shard it holds at each step, and how the global
// mask cuts into calls whose masks the attention kernels express (a window in each call's own
// coordinates). Pure arithmetic on sizes, tested on its own against the global mask.
#pragma once

#include <cstdint>
#include <vector>

namespace flashattn {
namespace parallel {

enum class Layout : int { Contiguous = 0, Zigzag = 1 };

// A run of a shard's tokens: local rows [local_begin, local_begin + length) are the global
// tokens [global_begin, global_begin + length).
struct Chunk {
  int64_t local_begin = 0;
  int64_t global_begin = 0;
  int64_t length = 0;
};

// The chunks of rank `rank`'s shard of n tokens: one (contiguous) or two (zigzag, n even).
std::vector<Chunk> shard_chunks(Layout layout, int64_t ranks, int64_t rank, int64_t n);

// The rank whose shard rank `rank` holds at step `step` (0: its own), the ring passing shards
// from rank r to r + 1.
inline int64_t shard_at_step(int64_t ranks, int64_t rank, int64_t step) {
  return ((rank - step) % ranks + ranks) % ranks;
}

// One attention call: queries [q_begin, q_end) of this rank's shard against keys [k_begin,
// k_end) of the shard held, with the mask in the call's own coordinates as Problem states it
// (query i sees key j when i + diag - window_left <= j <= i + diag + window_right, diag =
// keys - queries, -1 unbounded). Every (query, key) pair the global mask shows is in exactly one
// call, and no call shows a pair the mask hides.
struct RingCall {
  int64_t q_begin = 0, q_end = 0;
  int64_t k_begin = 0, k_end = 0;
  int64_t window_left = -1, window_right = -1;
  bool unmasked() const { return window_left < 0 && window_right < 0; }
};

// The global mask: query at position i sees key at position j when i - left <= j <= i + right
// (-1 unbounded; causal is right = 0).
struct GlobalMask {
  int64_t left = -1;
  int64_t right = -1;
};

// The calls of rank `rank` against the shard of rank `source` (each shard of n tokens).
std::vector<RingCall> ring_calls(Layout layout, int64_t ranks, int64_t rank, int64_t source,
                                 int64_t n, GlobalMask mask);

}  // namespace parallel
}  // namespace flashattn
