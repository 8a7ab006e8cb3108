#include "parallel/ring_plan.hpp"

#include <algorithm>

namespace flashattn {
namespace parallel {

std::vector<Chunk> shard_chunks(Layout layout, int64_t ranks, int64_t rank, int64_t n) {
  if (layout == Layout::Contiguous) return {Chunk{0, rank * n, n}};
  const int64_t c = n / 2;
  return {Chunk{0, rank * c, c}, Chunk{c, (2 * ranks - 1 - rank) * c, c}};
}

namespace {

// The call of one query chunk against one key chunk, if any pair is visible. Row i of the query
// chunk sees keys j of the key chunk in [i + delta - left, i + delta + right] (delta = the
// chunks' global offset), clipped to the chunk: the rows that see none form a prefix and a
// suffix, cut off; the keys no remaining row sees likewise; what remains is one window in the
// call's coordinates, each side unbounded where it cuts nothing.
bool chunk_call(const Chunk& q, const Chunk& k, GlobalMask m, RingCall* out) {
  const int64_t delta = q.global_begin - k.global_begin;
  const int64_t nq = q.length, nk = k.length;
  if (nq == 0 || nk == 0) return false;
  const int64_t qb = m.right < 0 ? 0 : std::max<int64_t>(0, -delta - m.right);
  const int64_t qe = m.left < 0 ? nq : std::min<int64_t>(nq, nk - delta + m.left);
  if (qb >= qe) return false;
  auto lo = [&](int64_t i) {
    return m.left < 0 ? int64_t{0} : std::max<int64_t>(0, i + delta - m.left);
  };
  auto hi = [&](int64_t i) {
    return m.right < 0 ? nk - 1 : std::min<int64_t>(nk - 1, i + delta + m.right);
  };
  const int64_t kb = lo(qb), ke = hi(qe - 1) + 1;
  if (kb >= ke) return false;
  // In the call's coordinates (i' = i - qb, j' = j - kb) row i' sees [i' + off - left,
  // i' + off + right]; the kernels' window is [i' + diag - L, i' + diag + R].
  const int64_t cq = qe - qb, ck = ke - kb, diag = ck - cq;
  const int64_t off = qb + delta - kb;
  const bool left_cuts = m.left >= 0 && cq - 1 + off - m.left > 0;
  const bool right_cuts = m.right >= 0 && off + m.right < ck - 1;
  RingCall c;
  c.q_begin = q.local_begin + qb;
  c.q_end = q.local_begin + qe;
  c.k_begin = k.local_begin + kb;
  c.k_end = k.local_begin + ke;
  c.window_left = left_cuts ? m.left - off + diag : -1;
  c.window_right = right_cuts ? m.right + off - diag : -1;
  *out = c;
  return true;
}

// Two unmasked calls over adjacent rows of one key range (or adjacent keys of one row range)
// are one call.
bool merge_unmasked(const RingCall& a, const RingCall& b, RingCall* out) {
  if (!a.unmasked() || !b.unmasked()) return false;
  RingCall m = a;
  if (a.k_begin == b.k_begin && a.k_end == b.k_end &&
      (a.q_end == b.q_begin || b.q_end == a.q_begin)) {
    m.q_begin = std::min(a.q_begin, b.q_begin);
    m.q_end = std::max(a.q_end, b.q_end);
  } else if (a.q_begin == b.q_begin && a.q_end == b.q_end &&
             (a.k_end == b.k_begin || b.k_end == a.k_begin)) {
    m.k_begin = std::min(a.k_begin, b.k_begin);
    m.k_end = std::max(a.k_end, b.k_end);
  } else {
    return false;
  }
  *out = m;
  return true;
}

}  // namespace

std::vector<RingCall> ring_calls(Layout layout, int64_t ranks, int64_t rank, int64_t source,
                                 int64_t n, GlobalMask mask) {
  // A shard keeps its tokens in global order, so against itself the causal mask (and no mask)
  // is the kernels' own: one call over the whole shard.
  if (source == rank && mask.left < 0 && (mask.right == 0 || mask.right < 0) && n > 0) {
    RingCall c;
    c.q_end = c.k_end = n;
    c.window_right = mask.right;
    return {c};
  }
  const std::vector<Chunk> qs = shard_chunks(layout, ranks, rank, n);
  const std::vector<Chunk> ks = shard_chunks(layout, ranks, source, n);
  std::vector<RingCall> calls;
  for (const Chunk& q : qs) {
    for (const Chunk& k : ks) {
      RingCall c;
      if (chunk_call(q, k, mask, &c)) calls.push_back(c);
    }
  }
  for (bool merged = true; merged;) {
    merged = false;
    for (size_t a = 0; a < calls.size() && !merged; ++a) {
      for (size_t b = a + 1; b < calls.size() && !merged; ++b) {
        RingCall m;
        if (merge_unmasked(calls[a], calls[b], &m)) {
          calls[a] = m;
          calls.erase(calls.begin() + static_cast<std::ptrdiff_t>(b));
          merged = true;
        }
      }
    }
  }
  return calls;
}

}  // namespace parallel
}  // namespace flashattn
