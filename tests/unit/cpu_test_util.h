// Shared helpers for the CPU backend tests: host matrices that can be strided views with NaN guard columns
// (an op reading or writing outside its view shows up as a NaN or a clobbered guard), packed sequence
// layouts, and the |got − want| <= atol + rtol·|want| comparison with a NaN check.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ops/ops.h"

namespace df::test {

// rows x cols values inside a buffer of row stride cols + pad, starting at column `off` (pad > 0 makes a
// strided view); everything outside the view holds NaN.
struct Mat {
  std::vector<float> buf;
  Tensor t;

  Mat(int64_t rows, int64_t cols, int64_t pad = 0, int64_t off = 0)
      : buf(size_t(rows * (cols + pad)) + 1, std::numeric_limits<float>::quiet_NaN()) {
    t = tensor_make(buf.data(), DType::f32, Device::cpu, rows, cols + pad).cols_view(off, cols);
  }
  float& at(int64_t r, int64_t c) { return reinterpret_cast<float*>(t.row_bytes(r))[c]; }
  void fill_uniform(std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
    std::uniform_real_distribution<float> d(lo, hi);
    for (int64_t r = 0; r < t.rows; ++r)
      for (int64_t c = 0; c < t.cols; ++c) at(r, c) = d(rng);
  }
  // Contiguous copy of the view.
  std::vector<float> host() {
    std::vector<float> h(size_t(t.numel()));
    for (int64_t r = 0; r < t.rows; ++r)
      for (int64_t c = 0; c < t.cols; ++c) h[size_t(r * t.cols + c)] = at(r, c);
    return h;
  }
  // Number of buffer elements outside the view that are no longer NaN.
  int64_t guards_clobbered() const {
    const float* base = buf.data();
    const float* v0 = static_cast<const float*>(t.data);
    int64_t bad = 0;
    for (size_t i = 0; i < buf.size(); ++i) {
      const int64_t rel = int64_t(&base[i] - v0);
      const bool inside = rel >= 0 && rel / t.stride < t.rows && rel % t.stride < t.cols;
      if (!inside && !std::isnan(base[i])) ++bad;
    }
    return bad;
  }
};

// A packed batch of sequences with host-side offsets and positions (the CPU backend's "device" memory).
struct Packed {
  std::vector<int32_t> cu, pos;
  SeqLayout seqs;
};

inline std::unique_ptr<Packed> packed_make(const std::vector<int>& lens) {
  auto p = std::make_unique<Packed>();
  p->cu.push_back(0);
  for (int len : lens) {
    for (int i = 0; i < len; ++i) p->pos.push_back(i);
    p->cu.push_back(p->cu.back() + len);
  }
  p->seqs.cu_host = p->cu;
  p->seqs.cu = tensor_make(p->cu.data(), DType::i32, Device::cpu, 1, int64_t(p->cu.size()));
  p->seqs.pos = tensor_make(p->pos.data(), DType::i32, Device::cpu, 1, int64_t(p->pos.size()));
  p->seqs.tokens = p->cu.back();
  p->seqs.num_seqs = int(lens.size());
  for (int len : lens) p->seqs.max_len = std::max(p->seqs.max_len, len);
  return p;
}

// Counts elements violating |got − want| <= atol + rtol·|want| (NaN in got always violates) and reports the
// first few with their index.
inline int64_t count_mismatch(const std::vector<float>& got, const std::vector<double>& want, double atol,
                              double rtol, const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0;
  double worst = 0.0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    const double err = std::fabs(double(got[i]) - want[i]);
    worst = std::max(worst, err);
    if (std::isnan(got[i]) || !(err <= atol + rtol * std::fabs(want[i]))) {
      if (bad < 5) ADD_FAILURE() << what << ": element " << i << " got " << got[i] << " want " << want[i];
      ++bad;
    }
  }
  if (bad) ADD_FAILURE() << what << ": " << bad << " of " << got.size() << " mismatched, worst |err| " << worst;
  return bad;
}

}  // namespace df::test
