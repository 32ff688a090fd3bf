// What the CUDA kernel benchmarks (bench_kernels, bench_kernels_fp8) share: a device arena with random fills,
// a host arena for the CpuOps checks, the slice check, event timing, and the printed rows with their % of the
// H200 ceilings, so every printed rate and check means the same in both.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include "benchmarks/cuda_timing.h"
#include "core/arena.h"
#include "kernels/launchers.cuh"
#include "ops/cpu/cpu_ops.h"
#include "ops/cuda/cuda_ops.h"

namespace df {

constexpr double kPeakTflops = 790.0;  // cuBLASLt bf16 8192³ on this H200 (shared/device/README.md)
constexpr double kPeakGBs = 4800.0;    // HBM3e datasheet; copy kernels reach a little less

struct Bench {
  CudaOps gpu{0};
  CpuOps cpu;
  void* block = nullptr;
  Arena arena;
  HostBuffer host{size_t(2) << 30};
  Arena harena{host.data(), host.size(), Device::cpu};
  uint64_t seed = 1;
  int failures = 0;

  explicit Bench(size_t bytes) {
    block = gpu.alloc_bytes(bytes);
    arena = Arena(block, bytes, Device::cuda);
  }
  ~Bench() { gpu.free_bytes(block); }

  Tensor rand(DType dt, int64_t rows, int64_t cols, float lo, float hi) {
    Tensor t = arena.alloc(dt, rows, cols);
    fill_uniform_launch(t.data, dt == DType::f32, t.stride, rows, cols, lo, hi, seed++, gpu.stream());
    return t;
  }
  // A host f32 copy of a device tensor (any view), as a CPU tensor for CpuOps.
  Tensor to_host(const Tensor& t) {
    Tensor h = harena.alloc(DType::f32, t.rows, t.cols);
    gpu.download_f32(t, h.ptr<float>());
    return h;
  }
  // max |gpu − cpu| / max |cpu| over a slice; fails the run above tol.
  void check(const char* what, const Tensor& got_gpu, const Tensor& want_cpu, double tol) {
    std::vector<float> got(size_t(got_gpu.numel()));
    gpu.download_f32(got_gpu, got.data());
    double err = 0, ref = 0;
    bool nan = false;
    for (int64_t r = 0; r < want_cpu.rows; ++r)
      for (int64_t c = 0; c < want_cpu.cols; ++c) {
        double w = want_cpu.ptr<float>()[r * want_cpu.stride + c], g = got[size_t(r * want_cpu.cols + c)];
        nan |= std::isnan(g);
        err = std::max(err, std::fabs(g - w));
        ref = std::max(ref, std::fabs(w));
      }
    double rel = err / std::max(ref, 1e-30);
    bool ok = !nan && rel <= tol;
    std::printf("check %-34s max|err|/max|ref| = %.2e (tol %.0e) %s\n", what, rel, tol, ok ? "ok" : "FAILED");
    if (!ok) ++failures;
  }
  // Median of `reps` event-timed runs after two warm-up runs, in ms; before: see cuda_median_ms.
  double time_ms(const std::function<void()>& fn, int reps = 10,
                 const std::function<void()>& before = nullptr) {
    return cuda_median_ms(gpu.stream(), fn, reps, before);
  }
};

inline void row_flops(const char* name, double flops, double ms) {
  double tf = flops / (ms * 1e-3) / 1e12;
  std::printf("%-40s %10.1f GFLOP %9.3f ms %8.1f TFLOP/s %6.1f %% of %.0f\n", name, flops / 1e9, ms, tf,
              100.0 * tf / kPeakTflops, kPeakTflops);
}
inline void row_bytes(const char* name, double bytes, double ms) {
  double gbs = bytes / (ms * 1e-3) / 1e9;
  std::printf("%-40s %10.1f MB    %9.3f ms %8.1f GB/s    %6.1f %% of %.0f\n", name, bytes / 1e6, ms, gbs,
              100.0 * gbs / kPeakGBs, kPeakGBs);
}

}  // namespace df
