// The CUDA backend's STANDARD algorithm emulated on the host, rounding where it rounds: S in
// fp32, P and dS in the input dtype, outputs in the input dtype; everything else in double. A
// correct GPU run matches it to an ulp or two of the output's scale, so it checks that the GPU
// computes exactly this algorithm (indexing, masks, GQA sums), independently of how far the
// algorithm itself is from the float64 reference.
// Arrays are contiguous [batch, seqlen, heads, head_dim] doubles, the LSE [batch, heads_q,
// seqlen_q], as in common/reference.hpp.
#pragma once

#include <vector>

#include <flashattn/flashattn.h>

#include "common/reference.hpp"

namespace gpu_test {

void emulate_standard_forward(const flashattn_test::RefProblem& p, flashattn_dtype_t dtype,
                              const std::vector<double>& q, const std::vector<double>& k,
                              const std::vector<double>& v, std::vector<double>* out,
                              std::vector<double>* lse);

// The standard algorithm takes D = rowsum(P * dP), not rowsum(dO * O): no forward output.
void emulate_standard_backward(const flashattn_test::RefProblem& p, flashattn_dtype_t dtype,
                               const std::vector<double>& q, const std::vector<double>& k,
                               const std::vector<double>& v, const std::vector<double>& dout,
                               std::vector<double>* dq,
                               std::vector<double>* dk, std::vector<double>* dv);

// Tolerance for "matches the emulation": `ulps` units in the last place of the dtype at the
// magnitude of the largest |ref| (taken as at least 2^-6).
double emulation_tolerance(flashattn_dtype_t dtype, const std::vector<double>& ref,
                           double ulps = 2.0);

}  // namespace gpu_test
