// The fixture of the GPU tests that need one CudaOps and a 256 MiB device arena (test_fp8_cuda.cpp,
// test_fp8_block_cuda.cpp): skips itself without a device, frees the block after each test; their input
// generator and their FP8 GEMM check against the exact product.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/arena.h"
#include "core/dtype.h"
#include "ops/cuda/cuda_ops.h"

namespace df {

class CudaArenaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports 0): GPU test skipped";
    gpu_ = std::make_unique<CudaOps>(0);
    block_ = gpu_->alloc_bytes(kBlock);
    arena_ = Arena(block_, kBlock, Device::cuda);
  }
  void TearDown() override {
    if (gpu_) gpu_->free_bytes(block_);
  }
  // Host values rounded to bf16 (so both backends read the same numbers): normal draws, row r scaled by
  // 2^exps[r % size] (exp -1000: an all-zero row, no draws), and with group_step the 128-column groups further by
  // 2^(-group_step · (group % 5)), so that one scale per row would flush the small groups.
  static std::vector<float> bf16_rows(int64_t M, int64_t K, const std::vector<int>& exps, uint32_t seed,
                                      int group_step = 0) {
    std::mt19937 g(seed);
    std::normal_distribution<float> d;
    std::vector<float> v(size_t(M * K));
    for (int64_t r = 0; r < M; ++r) {
      const int e = exps[size_t(r) % exps.size()];
      for (int64_t c = 0; c < K; ++c)
        v[size_t(r * K + c)] =
            e == -1000 ? 0.0f : bf16_round(std::ldexp(d(g), e - group_step * int((c / 128) % 5)));
    }
    return v;
  }
  static constexpr size_t kBlock = size_t(256) << 20;
  std::unique_ptr<CudaOps> gpu_;
  void* block_ = nullptr;
  Arena arena_;
};

// The FP8 GEMM's output got [M, N] against the exact product in double, term(m, n, k) one K position's product
// of codes and scales, plus beta · c0. The bound: the output's bf16 rounding, 2^-8 · |want| (half an ulp, doubled
// for a result at the edge of a binade); with beta 1 the product's own bf16 rounding before the add (gemm.cuh
// gemm_fp8_launch: what HF's bf16 Linear + residual add does), 2^-8 · |product|; the accumulation, fp32 in any
// order within K · 2^-24 · Σ|terms|, and Hopper's FP8 MMA keeping only ~14 mantissa bits inside a chain of
// instructions before cuBLASLt promotes the partial sum to fp32 (DeepSeek-V3 report, section 3.3.2), 2^-12 ·
// Σ|terms| on top. Returns the number of elements outside it; *why says how many and the worst one.
template <class Term>
int64_t fp8_gemm_mismatches(const std::vector<float>& got, const std::vector<float>& c0, double beta, int64_t M,
                            int64_t N, int64_t K, Term term, std::string* why) {
  double worst = -1, worst_got = 0, worst_want = 0, worst_tol = 0;
  int64_t worst_i = -1, bad = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double t = term(m, n, k);
        acc += t;
        mag += std::fabs(t);
      }
      const double want = acc + beta * c0[size_t(m * N + n)];
      const double tol = std::ldexp(1.0, -8) * (std::fabs(want) + beta * std::fabs(acc)) +
                         (double(K) * std::ldexp(1.0, -24) + std::ldexp(1.0, -12)) * mag + 1e-30;
      const double err = std::fabs(double(got[size_t(m * N + n)]) - want);
      if (!(err <= tol)) ++bad;
      if (!(err / tol <= worst)) {
        worst = std::isfinite(err) ? err / tol : 1e30;
        worst_i = m * N + n, worst_got = got[size_t(m * N + n)], worst_want = want, worst_tol = tol;
      }
    }
  std::ostringstream o;
  o << bad << " of " << M * N
    << " outside |got - want| <= 2^-8 (|want| + beta |product|) + (K 2^-24 + 2^-12) sum|terms|; worst at ["
    << worst_i / N << ", " << worst_i % N << "] of [" << M << ", " << N << "]: GPU " << worst_got << " vs exact "
    << worst_want << " (tolerance " << worst_tol << ", " << worst << "x of it)";
  *why = o.str();
  return bad;
}

}  // namespace df
