// The check that a merge of partial attention results is attention over the union of the
// parts' keys, shared by the CPU and GPU tests: the library's forward runs on the whole key range
// and on each part (writing straight into slices of one parts buffer), flashattn_merge combines
// the parts, and the merged output and LSE are compared with the float64 reference by the
// tolerance rule, the unsplit forward as the base. Where the tensors live is the caller's
// (MergeMemory): host memory for a CPU context, device mirrors for CUDA.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <flashattn/flashattn.h>

#include "common/tensors.hpp"

namespace flashattn_test {

class MergeMemory {
 public:
  virtual ~MergeMemory() = default;
  virtual flashattn_context_t context() = 0;
  // t's view in the context's memory, holding t's contents.
  virtual flashattn_tensor_t place(const HostTensor& t) = 0;
  // The context's copy of t back into t.
  virtual void fetch(HostTensor& t) = 0;
};

// A CPU context's memory: the host tensors themselves.
class HostMergeMemory : public MergeMemory {
 public:
  explicit HostMergeMemory(flashattn_context_t ctx) : ctx_(ctx) {}
  flashattn_context_t context() override { return ctx_; }
  flashattn_tensor_t place(const HostTensor& t) override { return t.view(); }
  void fetch(HostTensor&) override {}

 private:
  flashattn_context_t ctx_;
};

struct MergeSplitCase {
  flashattn_dtype_t dtype = FLASHATTN_DTYPE_FLOAT32;
  int64_t batch = 1, seqlen_q = 1, seqlen_k = 1, heads_q = 1, heads_kv = 1, head_dim = 1;
  bool causal = false;
  // Where the parts' keys start and end: bounds[p] .. bounds[p + 1] for part p, from 0 to
  // seqlen_k. Equal neighbours make an empty part (LSE -inf, its output left NaN).
  std::vector<int64_t> bounds;
  // Elements of gap after each head, row and batch entry of the parts and of out (0: none), and
  // then one batch entry of gap between parts. A multiple of 8 keeps rows 16-byte aligned.
  int64_t pad = 0;
  bool in_place = false;  // out and lse are part 0's
  bool with_lse = true;   // false: the merged LSE is not asked for
  flashattn_algorithm_t algorithm = FLASHATTN_ALGORITHM_FLASH;
  uint64_t seed = 1;

  int64_t parts() const { return static_cast<int64_t>(bounds.size()) - 1; }
  std::string name() const;
};

// A case of these sizes split at `bounds`, its seed from the sizes (the CPU and GPU suites share
// their cases' inputs so).
MergeSplitCase split(flashattn_dtype_t dtype, int64_t b, int64_t nq, int64_t nk, int64_t hq,
                     int64_t hkv, int64_t d, bool causal, std::vector<int64_t> bounds);

// Runs the case and CHECKs the rule for out and LSE, no NaN, and rows that see no key of any part
// exactly 0 / -inf.
void check_merge_split(const MergeSplitCase& c, MergeMemory& memory);

// The window option that shows part [begin, end) of the keys the mask the whole range has under
// `causal` (bottom-right aligned): key j of the part is key begin + j of the whole.
flashattn_options_t part_options(const MergeSplitCase& c, int64_t end);

}  // namespace flashattn_test
