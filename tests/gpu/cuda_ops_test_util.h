// The fixture and helpers of the CUDA op tests (test_cuda_ops.cpp, test_cuda_ops_gdn.cpp): one tensor on both
// backends, NaN-poisoned GPU outputs, tolerance checks and bit-for-bit comparisons against the CPU fp32 oracle.
// Included by CUDA builds only (DF_HAVE_CUDA).
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/arena.h"
#include "core/dtype.h"
#include "kernels/dispatch/dispatch.h"
#include "kernels/gemm/gemm.cuh"
#include "model/target.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cuda/cuda_ops.h"
#include "tests/unit/cpu_test_util.h"

using namespace df;
using namespace df::test;

namespace {

// bf16 keeps 7 explicit mantissa bits: rounding to nearest is a relative error of at most 2^-8 ≈ 3.9e-3
// (seen on the H200: 0.0037 on a value of 1.06). Each tolerance below counts the roundings the GPU path makes
// that the fp32 CPU path does not.
constexpr double kBf16Ulp = 1.0 / 256.0;

// One tensor on both backends: CPU f32, GPU bf16 (or f32 for parameter vectors).
struct Pair {
  Tensor cpu, gpu;
};

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports 0): GPU test skipped";
    gpu_ = std::make_unique<CudaOps>(0);
    host_ = HostBuffer(size_t(256) << 20);
    cpu_arena_ = Arena(host_.data(), host_.size(), Device::cpu);
    gblock_ = gpu_->alloc_bytes(size_t(512) << 20);
    gpu_arena_ = Arena(gblock_, size_t(512) << 20, Device::cuda);
  }
  void TearDown() override {
    if (gpu_) gpu_->free_bytes(gblock_);
  }

  // An output pair; the GPU side is filled with NaN (all-ones bytes) so unwritten elements fail the check. The
  // fill runs on the ops' own stream: CudaOps' stream does not wait for the legacy default stream, so a plain
  // cudaMemset could land after the upload or the kernel that follows it (it did, with other processes on the GPU).
  Pair out(int64_t rows, int64_t cols, DType gdt = DType::bf16, int64_t pad = 0) {
    Pair p;
    p.cpu = cpu_arena_.alloc(DType::f32, rows, cols);
    p.gpu = gpu_arena_.alloc(gdt, rows, cols + pad).cols_view(0, cols);
    poison(p.gpu.data, size_t(rows) * (cols + pad) * dtype_size(gdt));
    return p;
  }
  // All-ones bytes (NaN in f32 and bf16) over `bytes` of GPU memory, ordered on the ops' stream.
  void poison(void* p, size_t bytes) { EXPECT_EQ(cudaMemsetAsync(p, 0xff, bytes, gpu_->stream()), cudaSuccess); }
  // Uniform values rounded to bf16 so both backends read exactly the same numbers. pad > 0 makes the GPU
  // side a strided view (the CPU side stays contiguous; strides are tested by CpuOps' own tests).
  Pair rand(int64_t rows, int64_t cols, float lo, float hi, DType gdt = DType::bf16, int64_t pad = 0) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> h(size_t(rows * cols));
    for (float& v : h) v = bf16_round(d(rng_));
    Pair p = out(rows, cols, gdt, pad);
    cpu_.upload_f32(p.cpu, h.data());
    gpu_->upload_f32(p.gpu, h.data());
    return p;
  }
  std::vector<float> down_gpu(const Tensor& t) {
    std::vector<float> h(size_t(t.numel()));
    gpu_->download_f32(t, h.data());
    return h;
  }
  std::vector<double> down_cpu(const Tensor& t) {
    std::vector<float> h(size_t(t.numel()));
    cpu_.download_f32(t, h.data());
    return std::vector<double>(h.begin(), h.end());
  }
  // Compares and prints the worst error (the numbers the report quotes).
  void check(const Pair& p, double atol, double rtol, const std::string& what) {
    std::vector<float> got = down_gpu(p.gpu);
    std::vector<double> want = down_cpu(p.cpu);
    double worst = 0.0, scale = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
      worst = std::max(worst, std::fabs(double(got[i]) - want[i]));
      scale = std::max(scale, std::fabs(want[i]));
    }
    std::printf("[ maxerr ] %-48s max|err| %.3e  max|ref| %.3e\n", what.c_str(), worst, scale);
    EXPECT_EQ(count_mismatch(got, want, atol, rtol, what), 0);
  }
  // Two GPU results that must be identical bits (two kernels or paths of the same arithmetic); names the
  // first differing element and both values.
  void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& what, const char* a_is,
                        const char* b_is) {
    const std::vector<float> x = down_gpu(a), y = down_gpu(b);
    int64_t differ = 0, first = -1;
    for (size_t i = 0; i < x.size(); ++i)
      if (std::isnan(x[i]) || x[i] != y[i]) {
        if (first < 0) first = int64_t(i);
        ++differ;
      }
    if (differ)
      ADD_FAILURE() << what << ": " << a_is << " and " << b_is << " differ in " << differ << " of " << x.size()
                    << ", first at element " << first << " (" << a_is << " " << x[size_t(first)] << ", " << b_is
                    << " " << y[size_t(first)] << ")";
  }
  struct Layouts {
    SeqLayout cpu, gpu;
  };
  Layouts layouts(const std::vector<int32_t>& lens) {
    return {seq_layout_make(lens, cpu_, cpu_arena_), seq_layout_make(lens, *gpu_, gpu_arena_)};
  }

  std::mt19937 rng_{1234};
  CpuOps cpu_;
  std::unique_ptr<CudaOps> gpu_;
  HostBuffer host_;
  Arena cpu_arena_, gpu_arena_;
  void* gblock_ = nullptr;
};

// Resets both arenas to where they stood at construction: a loop over many cases frees each case's tensors.
struct ArenaMarks {
  ArenaMarks(Arena& c, Arena& g) : cpu(c), gpu(g), cm(c.mark()), gm(g.mark()) {}
  ~ArenaMarks() {
    cpu.reset(cm);
    gpu.reset(gm);
  }
  Arena &cpu, &gpu;
  size_t cm, gm;
};

// The registry's variants in force when constructed come back when it goes out of scope, failed checks and
// exceptions included, so later tests in the process run the default forms.
struct VariantsRestore {
  KernelVariants saved = kernel_variants();
  ~VariantsRestore() { kernel_variants_set(saved); }
};

std::string name_of(const char* op, std::initializer_list<int64_t> sizes) {
  std::string s = op;
  for (int64_t v : sizes) s += " " + std::to_string(v);
  return s;
}

const std::vector<std::vector<int32_t>> kBatches = {{1}, {7}, {65}, {300}, {1, 7, 65, 300}, {64, 64, 3}};

}  // namespace
