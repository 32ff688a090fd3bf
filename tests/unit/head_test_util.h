// Shared by the drafter heads' oracle tests (test_domino_head.cpp, test_dspark_head.cpp): seeded normal draws
// in double, and the central finite-difference check of one parameter's analytic gradient.
#pragma once
#include <cmath>
#include <functional>
#include <vector>

#include "core/rng.h"

namespace df::testing {

inline std::vector<double> normal_f64(size_t n, double std, uint64_t seed) {
  Rng r(seed);
  std::vector<double> v(n);
  for (double& x : v) x = std * r.normal();
  return v;
}

struct FdError {
  double rel_rms = 0;  // ‖analytic − finite difference‖ / ‖finite difference‖
  double ref2 = 0;     // ‖finite difference‖²: near 0 when the loss does not depend on the parameter
};

// (loss(x + ε) − loss(x − ε)) / 2ε for every element x of `value` (perturbed in place and restored; `loss`
// reads it) against `grad`.
inline FdError fd_check(std::vector<double>& value, const std::vector<double>& grad,
                        const std::function<double()>& loss, double eps = 1e-6) {
  double err2 = 0;
  FdError e;
  for (size_t i = 0; i < value.size(); ++i) {
    const double keep = value[i];
    value[i] = keep + eps;
    const double up = loss();
    value[i] = keep - eps;
    const double down = loss();
    value[i] = keep;
    const double fd = (up - down) / (2 * eps);
    err2 += (grad[i] - fd) * (grad[i] - fd);
    e.ref2 += fd * fd;
  }
  e.rel_rms = std::sqrt(err2 / e.ref2);
  return e;
}

}  // namespace df::testing
