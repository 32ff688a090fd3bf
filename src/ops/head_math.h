// The double-precision scalar helpers the drafter heads' CPU oracles share (ops/domino_head.h,
// ops/dspark_head.h): their sums run in double in a fixed order, whatever T the weights are stored in.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

namespace df {

template <class T>
double head_dot(const T* a, const double* b, int n) {
  double s = 0;
  for (int i = 0; i < n; ++i) s += double(a[i]) * b[i];
  return s;
}

inline double head_sigmoid(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

// p = softmax(logits); returns logsumexp(logits).
inline double head_softmax(const std::vector<double>& logits, std::vector<double>& p) {
  const double mx = *std::max_element(logits.begin(), logits.end());
  double s = 0;
  for (size_t v = 0; v < logits.size(); ++v) s += (p[v] = std::exp(logits[v] - mx));
  for (double& x : p) x /= s;
  return mx + std::log(s);
}

}  // namespace df
