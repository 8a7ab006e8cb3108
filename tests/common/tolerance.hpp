// The numerics rule of DESIGN.md, as FlashAttention's own tests state it: a result `got` is
// right when
//     max |got - ref| <= 2 * max |base - ref| + atol * max(1, max |ref|)   (3 * with a softcap)
// where ref is the float64 reference, base the STANDARD algorithm's result in the same dtype
// (what an exact-but-unfused computation achieves there), and atol a small per-dtype floor.
// Infinities must match exactly (the LSE of a fully masked row is -inf); a NaN always fails.
// Failures carry a message with the worst index and its values.
#pragma once

#include <string>
#include <vector>

#include <flashattn/flashattn.h>

namespace flashattn_test {

struct Comparison {
  bool ok = true;
  double error = 0.0;  // max |got - ref| (inf when an infinity or NaN disagrees)
  double bound = 0.0;
  std::string message;  // says what failed and where; a summary when ok
};

// The floor: about one unit in the last place at 1.0 for 16-bit types, a few for float32.
double dtype_atol(flashattn_dtype_t dtype);

// The fused CUDA kernels evaluate a softcap's tanh with tanh.approx.f32, whose relative error
// the PTX ISA bounds by 2^-11: with |tanh| <= 1, c * tanh(s / c) may move by c * 2^-11, and an
// LSE, a weighted mean of its logits' moves (to first order), by no more. The 16-bit outputs
// and the gradients stay inside the rule's factor 3; the float32 LSE does not at float32's
// floor (measured on the H100: up to 2.1e-5 at caps 3-10, against floors near 5e-6).
constexpr double kTanhApproxRelError = 0x1p-11;
// check_rule's atol for a float32 LSE: float32's floor, plus softcap * kTanhApproxRelError
// (0: none) as an absolute term (check_rule scales atol by max(1, max |ref|)).
double lse_atol(double softcap, const std::vector<double>& ref);

// |a - b|, 0 when equal (equal infinities included), +inf when either is NaN or they differ
// and either is infinite.
double element_error(double a, double b);

// The rule above (factor 2; FlashAttention's tests take 3 with a softcap). All three vectors
// hold the same logical elements.
constexpr double kRuleFactor = 2.0;
constexpr double kSoftcapRuleFactor = 3.0;
Comparison check_rule(const std::string& what, const std::vector<double>& got,
                      const std::vector<double>& base, const std::vector<double>& ref, double atol,
                      double factor = kRuleFactor);

// max |got - ref| <= tol (for a base result itself, or against finite differences).
Comparison check_close(const std::string& what, const std::vector<double>& got,
                       const std::vector<double>& ref, double tol);

// No element is NaN (an output poisoned with NaN and not written shows here).
Comparison check_no_nan(const std::string& what, const std::vector<double>& got);

double max_abs(const std::vector<double>& v);

}  // namespace flashattn_test
