// The CUDA drafter step against SpecForge's own DFlash, Domino, DSpark and DFlash2 steps (golden files of
// tests/golden/make_drafter_golden.py; the CPU twins are tests/unit/test_drafter_golden.cpp,
// test_domino_golden.cpp, test_dspark_golden.cpp and test_dflash2_golden.cpp), with bf16 weights and
// activations: the rows that carry
// loss must match exactly, the loss and every gradient within what bf16 allows. Skips without a device,
// without a CUDA build, or while the golden files have not been generated.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

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

// The golden step of `dir` (its golden.safetensors and model/) on the CUDA backend against the reference.
void expect_golden_step(const std::string& dir) {
#ifdef DF_HAVE_CUDA
  const SafetensorsIndex g = SafetensorsIndex::open(dir + "/golden.safetensors");
  CudaTrainOps ops(0, 1024);
  const StepResult r = run_golden_step(ops, g, dir + "/model");

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
#else
  (void)dir;
#endif
}

TEST(DrafterGoldenCuda, MatchesSpecForgeLossAndGradients) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device or no CUDA build: GPU drafter golden test skipped";
  if (!golden_present()) GTEST_SKIP() << kMissing;
  expect_golden_step(golden_dir());
}

// The Domino step (head, GRU and both CE terms at the golden's λ) against SpecForge's OnlineDominoModel, at
// the same bounds: the head adds a handful of bf16 roundings (the GRU state and gates' gradients, the MLP's
// activation) to the ~20 of the backbone.
TEST(DrafterGoldenCuda, DominoMatchesSpecForgeLossAndGradients) {
  const std::string dir = std::string(DF_SOURCE_DIR) + "/tests/golden/drafter_domino";
  if (!have_device()) GTEST_SKIP() << "no CUDA device or no CUDA build: GPU drafter golden test skipped";
  if (!std::filesystem::exists(dir + "/golden.safetensors") ||
      !std::filesystem::exists(dir + "/model/config.json"))
    GTEST_SKIP()
        << "tests/golden/drafter_domino/ is absent: run `python3 tests/golden/make_drafter_golden.py "
           "--kind domino` on the GPU machine and commit it";
  expect_golden_step(dir);
}

// The DSpark step (Markov head of each type, confidence head, CE + L1 + BCE with the target distributions
// from the frozen lm_head over the target's final hidden state) against SpecForge's OnlineDSparkModel, one
// golden per head type, at the same bounds: the head adds a few bf16 roundings (u, the Markov input rows, the
// logit gradients) to the ~20 of the backbone.
TEST(DrafterGoldenCuda, DSparkMatchesSpecForgeLossAndGradients) {
  if (!have_device()) GTEST_SKIP() << "no CUDA device or no CUDA build: GPU drafter golden test skipped";
  for (const char* head : {"vanilla", "gated", "rnn"}) {
    SCOPED_TRACE(head);
    const std::string dir = std::string(DF_SOURCE_DIR) + "/tests/golden/drafter_dspark_" + head;
    if (!std::filesystem::exists(dir + "/golden.safetensors") ||
        !std::filesystem::exists(dir + "/model/config.json"))
      GTEST_SKIP()
          << "tests/golden/drafter_dspark_" << head
          << "/ is absent: run `python3 tests/golden/make_drafter_golden.py --kind dspark --markov-head "
          << head << "` on the GPU machine and commit it";
    expect_golden_step(dir);
  }
}

// The DFlash2 step (both convolutions around every sublayer, the selector's K-way CE at the golden's α; the
// CPU twin is test_dflash2_golden.cpp) against SpecForge's OnlineDFlashModel with DFlash2DraftModel, at the
// same bounds: the convolutions add two bf16 roundings a sublayer, the selector's term a few on its own rows.
TEST(DrafterGoldenCuda, Dflash2MatchesSpecForgeLossAndGradients) {
  const std::string dir = std::string(DF_SOURCE_DIR) + "/tests/golden/drafter_dflash2";
  if (!have_device()) GTEST_SKIP() << "no CUDA device or no CUDA build: GPU drafter golden test skipped";
  if (!std::filesystem::exists(dir + "/golden.safetensors") ||
      !std::filesystem::exists(dir + "/model/config.json"))
    GTEST_SKIP()
        << "tests/golden/drafter_dflash2/ is absent: run `python3 tests/golden/make_drafter_golden.py "
           "--kind dflash2 --specforge .peer/SpecForge-dflash2` on the GPU machine and commit it";
  expect_golden_step(dir);
}

}  // namespace
