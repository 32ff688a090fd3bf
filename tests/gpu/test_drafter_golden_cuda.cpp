// The CUDA drafter step against SpecForge's own DFlash step (golden files of
// tests/golden/make_drafter_golden.py; the CPU twin is tests/unit/test_drafter_golden.cpp), with bf16 weights
// and activations: the rows that carry loss must match exactly, the loss and every gradient within what bf16
// allows. Skips without a device, without a CUDA build, or while the golden files have not been generated.
#include <gtest/gtest.h>

#include "tests/unit/drafter_golden_util.h"

#ifdef DF_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_train_ops.h"
#endif

namespace {

using namespace df;
using namespace df::drafter_golden;

// Tolerance, bf16 against the float64 reference. The GEMM weights are the bf16 shadow (relative 2^-9), and
// every activation and activation gradient the CUDA step stores is bf16 (relative 2^-8 at most, rms ≈ 1.6e-3
// per rounding). A gradient passes through ~20 such roundings between the loss and a weight (2 layers forward
// and backward, the lm_head's dlogits, the attention's P and dS), which add in quadrature to an expected
// relative RMS error of ≈ 1.6e-3·√20 ≈ 7e-3, growing somewhat through the random layers. The bound is the
// per-tensor relative RMS error ||a − b|| / ||b|| ≤ 4e-2 (≈ 5× the estimate); wrong semantics (a mask, a
// label offset, a weight, a mis-wired dW) give 0.1 to 1. The elementwise worst is printed, not bounded: where
// a row's RMS is small (RMSNorm divides by it) one element can be far off in relative terms. The loss is a
// mean of ~50 CE terms of logits ~O(1) computed from bf16 inputs with fp32 accumulation: relative 1e-2.
constexpr double kMaxRelRms = 4e-2;
constexpr double kLossRtol = 1e-2;

bool have_device() {
#ifdef DF_HAVE_CUDA
  return cuda_device_count() > 0;
#else
  return false;
#endif
}

TEST(DrafterGoldenCuda, MatchesSpecForgeLossAndGradients) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device or no CUDA build: GPU drafter golden test skipped";
  if (!golden_present()) GTEST_SKIP() << kMissing;
#ifdef DF_HAVE_CUDA
  const SafetensorsIndex g = SafetensorsIndex::open(golden_dir() + "/golden.safetensors");
  CudaTrainOps ops(0, 1024);
  const StepResult r = run_golden_step(ops, g);

  expect_rows_and_loss(r, g, kLossRtol);

  const DrafterParamTable table = drafter_param_table(r.cfg);
  double worst = 0;
  for (const auto& [name, got] : r.grads) {
    const std::vector<float> ref = read_f32(g, "grad." + name);
    ASSERT_EQ(ref.size(), got.size()) << name;
    // Elementwise numbers at the CPU test's scale are only reported.
    const GradDiff d = grad_diff(got, ref, 1e-2, 1e-2);
    worst = std::max(worst, d.rel_rms);
    EXPECT_TRUE(d.finite && d.rel_rms <= kMaxRelRms) << describe(name, ref, table.find(name).cols, d);
  }
  std::printf("worst per-tensor relative RMS gradient error %.3g (bound %.3g)\n", worst, kMaxRelRms);
#endif
}

}  // namespace
