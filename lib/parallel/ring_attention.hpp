// Ring attention (context parallelism): a rank's queries against every rank's shard of k and v,
// the shards passed around the ring by a transport, the parts folded by their LSE. Written
// against the Backend interface only: the same steps run on the CPU and on CUDA.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/backend.hpp"
#include "core/ring.hpp"
#include "parallel/ring_plan.hpp"

namespace flashattn {
namespace parallel {

struct RingSetup {
  int64_t ranks = 1;
  int64_t rank = 0;
  Layout layout = Layout::Contiguous;
};

// The workspace ring_forward / ring_backward need for this rank's shard problem `local` (its
// seqlen_q = seqlen_k = the shard's tokens; the options the global call's). Checks that every
// call of the plan is supported by the backend (throws UNSUPPORTED as check_supported).
size_t ring_workspace_size(const Backend& backend, const RingSetup& setup, const Problem& local,
                           bool backward);

void ring_forward(Backend& backend, RingTransport& transport, const RingSetup& setup,
                  const ForwardArgs& local, Workspace ws);
void ring_backward(Backend& backend, RingTransport& transport, const RingSetup& setup,
                   const BackwardArgs& local, Workspace ws);

}  // namespace parallel
}  // namespace flashattn
