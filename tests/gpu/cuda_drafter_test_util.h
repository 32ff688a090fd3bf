// What the CUDA drafter tests share (test_cuda_drafter.cpp, test_cuda_dspark.cpp, test_cuda_dflash2.cpp; CUDA
// builds only): backend copies of host vectors, the fixture, bf16 rounding of host data, the element-wise
// comparison that prints the worst element, and the comparison of a head loss op's statistics.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/train/loss_slots.h"
#include "ops/cpu/cpu_train_ops.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_train_ops.h"
#include "ops/train_ops.h"

namespace df::testing {

// Backend copies of host rows (f32, bf16 or the backend's activation dtype), downloaded back to host vectors,
// freed with the owner.
class Dev {
 public:
  explicit Dev(TrainOps& ops) : ops_(ops) {}
  ~Dev() {
    for (void* p : mem_) ops_.free_bytes(p);
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  template <class T>
  Tensor up(const std::vector<T>& h, DType dt, int64_t rows, int64_t cols) {
    mem_.push_back(ops_.alloc_bytes(size_t(std::max<int64_t>(1, rows * cols)) * dtype_size(dt)));
    Tensor t = tensor_make(mem_.back(), dt, ops_.device(), rows, cols);
    if (rows * cols > 0) ops_.upload_raw(t, h.data());
    return t;
  }
  Tensor bf16(const std::vector<float>& h, int64_t rows, int64_t cols) {
    std::vector<uint16_t> b(h.size());
    for (size_t i = 0; i < h.size(); ++i) b[i] = f32_to_bf16(h[i]);
    return up(b, DType::bf16, rows, cols);
  }
  // An activation or GEMM weight: the backend's act_dtype (bf16 on CUDA, f32 on the CPU).
  Tensor act(const std::vector<float>& h, int64_t rows, int64_t cols) {
    return ops_.act_dtype() == DType::f32 ? up(h, DType::f32, rows, cols) : bf16(h, rows, cols);
  }
  template <class T>
  std::vector<T> down(const Tensor& t) {
    std::vector<T> h(size_t(t.numel()) * dtype_size(t.dtype) / sizeof(T));
    if (!h.empty()) ops_.download_raw(t, h.data());
    return h;
  }
  // A bf16 or f32 tensor's values as f32.
  std::vector<float> f32(const Tensor& t) {
    if (t.dtype == DType::f32) return down<float>(t);
    const std::vector<uint16_t> b = down<uint16_t>(t);
    std::vector<float> f(b.size());
    for (size_t i = 0; i < b.size(); ++i) f[i] = bf16_to_f32(b[i]);
    return f;
  }

 private:
  TrainOps& ops_;
  std::vector<void*> mem_;
};

// The CUDA training-op tests' fixture: skipped without a device; the CPU oracle and a CUDA backend on device
// 0.
class CudaTrainFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports 0): GPU test skipped";
    gpu_ = std::make_unique<CudaTrainOps>(0);
  }
  CpuTrainOps cpu_;
  std::unique_ptr<CudaTrainOps> gpu_;
};

// In place: the batch and the CPU model keep pointing at these vectors.
inline void round_to_bf16(std::vector<float>& v) {
  for (float& x : v) x = bf16_round(x);
}

// Worst |a−b| − (atol + rtol·|b|) over the elements, printed with its index and both values; true if none
// exceeds.
inline bool report(const std::string& what, const std::vector<double>& got, const std::vector<double>& want,
                   double atol, double rtol) {
  size_t worst = 0;
  double excess = -1e300, maxerr = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]), e = err - (atol + rtol * std::fabs(want[i]));
    maxerr = std::max(maxerr, err);
    if (e > excess || std::isnan(got[i])) {
      excess = std::isnan(got[i]) ? 1e300 : e;
      worst = i;
    }
  }
  std::printf("[ maxerr ] %-44s n %zu max|err| %.3e worst at %zu: gpu %.9g cpu %.9g\n", what.c_str(),
              got.size(), maxerr, worst, got.empty() ? 0.0 : got[worst], want.empty() ? 0.0 : want[worst]);
  return excess <= 0;
}

// Element for element the same floats.
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A head loss op's statistics and argmax on the GPU against the CPU oracle's for one call over rows with
// weights row_w, blocks of B: Σ w·L within loss_rtol relative, Σ w (the given weights, summed in f64) within
// 1e-6; labelled-row counts and τ blocks exact; weightless rows' argmax −1; an argmax may flip on a near tie,
// so at most 2 rows (and 5 %) differ and correct counts follow within that. `tag` prefixes the printed line.
inline void expect_head_stats_match(const std::string& tag, const std::string& name,
                                    const std::vector<float>& row_w, int B,
                                    const std::vector<int32_t>& am_gpu, const std::vector<int32_t>& am_cpu,
                                    const std::vector<double>& st_gpu, const std::vector<double>& st_cpu,
                                    double loss_rtol) {
  EXPECT_TRUE(report(name + " loss_sum", {st_gpu[0]}, {st_cpu[0]}, 0, loss_rtol));
  EXPECT_TRUE(report(name + " weight_sum", {st_gpu[1]}, {st_cpu[1]}, 0, 1e-6));
  int64_t flips = 0, weighted = 0;
  for (size_t i = 0; i < row_w.size(); ++i) {
    weighted += row_w[i] != 0.0f;
    flips += am_gpu[i] != am_cpu[i];
    if (row_w[i] == 0.0f) EXPECT_EQ(am_gpu[i], -1) << name << " row " << i;
  }
  std::printf("[ %s ] %s: argmax differs in %lld of %lld weighted rows\n", tag.c_str(), name.c_str(),
              (long long)flips, (long long)weighted);
  const int64_t flip_bound = std::max<int64_t>(2, weighted / 20);
  EXPECT_LE(flips, flip_bound) << name;
  for (int k = 1; k < B; ++k) {
    EXPECT_EQ(st_gpu[size_t(LossStatsSlots::count(B, k))], st_cpu[size_t(LossStatsSlots::count(B, k))])
        << name << " offset " << k;
    EXPECT_NEAR(st_gpu[size_t(LossStatsSlots::correct(k))], st_cpu[size_t(LossStatsSlots::correct(k))],
                double(flip_bound))
        << name << " offset " << k;
  }
  EXPECT_EQ(st_gpu[LossStatsSlots::kTauBlocks], st_cpu[LossStatsSlots::kTauBlocks]) << name;
}

}  // namespace df::testing
