#include "common/tolerance.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

namespace flashattn_test {
namespace {

struct Worst {
  double error = 0.0;
  size_t index = 0;
};

Worst worst(const std::vector<double>& got, const std::vector<double>& ref) {
  Worst w;
  for (size_t i = 0; i < got.size() && i < ref.size(); ++i) {
    const double e = element_error(got[i], ref[i]);
    if (e > w.error || (std::isinf(e) && !std::isinf(w.error))) {
      w.error = e;
      w.index = i;
    }
  }
  return w;
}

std::string where(const std::vector<double>& got, const std::vector<double>& ref, size_t i) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "; worst at element %zu: got %.9g, ref %.9g", i,
                got.empty() ? 0.0 : got[i], ref.empty() ? 0.0 : ref[i]);
  return buf;
}

Comparison size_mismatch(const std::string& what, size_t a, size_t b) {
  Comparison c;
  c.ok = false;
  c.error = std::numeric_limits<double>::infinity();
  c.message = what + ": " + std::to_string(a) + " elements against " + std::to_string(b);
  return c;
}

}  // namespace

double dtype_atol(flashattn_dtype_t dtype) {
  switch (dtype) {
    case FLASHATTN_DTYPE_FLOAT32:
      return 1e-6;
    case FLASHATTN_DTYPE_FLOAT16:
      return 1e-3;
    case FLASHATTN_DTYPE_BFLOAT16:
      return 8e-3;
    case FLASHATTN_DTYPE_INT32:
      return 0.0;
  }
  return 0.0;
}

double element_error(double a, double b) {
  if (a == b) return 0.0;
  if (std::isnan(a) || std::isnan(b) || std::isinf(a) || std::isinf(b)) {
    return std::numeric_limits<double>::infinity();
  }
  return std::fabs(a - b);
}

double lse_atol(double softcap, const std::vector<double>& ref) {
  return dtype_atol(FLASHATTN_DTYPE_FLOAT32) +
         softcap * kTanhApproxRelError / std::max(1.0, max_abs(ref));
}

double max_abs(const std::vector<double>& v) {
  double m = 0.0;
  for (double x : v)
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  return m;
}

Comparison check_rule(const std::string& what, const std::vector<double>& got,
                      const std::vector<double>& base, const std::vector<double>& ref,
                      double atol, double factor) {
  if (got.size() != ref.size()) return size_mismatch(what, got.size(), ref.size());
  if (base.size() != ref.size()) return size_mismatch(what + " (base)", base.size(), ref.size());
  const Worst g = worst(got, ref);
  const Worst b = worst(base, ref);
  Comparison c;
  c.error = g.error;
  c.bound = factor * b.error + atol * std::max(1.0, max_abs(ref));
  c.ok = g.error <= c.bound;
  char buf[200];
  std::snprintf(buf, sizeof buf,
                ": max |got - ref| = %.3g, bound %.3g (%g x base error %.3g + floor)", g.error,
                c.bound, factor, b.error);
  c.message = what + buf + where(got, ref, g.index);
  if (b.error > 0 && std::isinf(b.error)) c.message += " (the base result itself has NaN/inf)";
  return c;
}

Comparison check_close(const std::string& what, const std::vector<double>& got,
                       const std::vector<double>& ref, double tol) {
  if (got.size() != ref.size()) return size_mismatch(what, got.size(), ref.size());
  const Worst g = worst(got, ref);
  Comparison c;
  c.error = g.error;
  c.bound = tol;
  c.ok = g.error <= tol;
  char buf[160];
  std::snprintf(buf, sizeof buf, ": max |got - ref| = %.3g, tolerance %.3g", g.error, tol);
  c.message = what + buf + where(got, ref, g.index);
  return c;
}

Comparison check_no_nan(const std::string& what, const std::vector<double>& got) {
  Comparison c;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i])) {
      c.ok = false;
      c.error = std::numeric_limits<double>::infinity();
      c.message =
          what + ": element " + std::to_string(i) + " is NaN (not written, or computed as NaN)";
      return c;
    }
  }
  c.message = what + ": no NaN";
  return c;
}

}  // namespace flashattn_test
