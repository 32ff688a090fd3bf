// The CPU drafter step against SpecForge's own DFlash step (tests/golden/make_drafter_golden.py): the drafter
// is read through drafter.init_from, and the rows that carry loss, the loss and every parameter gradient must
// match. Skips (saying so) only while the golden files have not been generated and committed.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "ops/cpu/cpu_train_ops.h"
#include "tests/unit/drafter_golden_util.h"

namespace {

using namespace df;
using namespace df::drafter_golden;

// Tolerance, fp32 against the float64 reference on identical (float32-exact) inputs. Each op rounds to 2^-24
// (6e-8) relative; the deepest gradient path is ~40 ops (2 layers, lm_head, backward) with sums of at most
// 128 terms (H 64, vocab 97, ≤ 64 keys per row, 48 context rows), so ≲ 3e-6 of the magnitudes that meet in a
// sum. The reference itself uses float32 for the RoPE tables and the decay weights (transformers / SpecForge
// compute them in float32), the same values we use. A gradient element is held to 1e-5 of its tensor's
// largest |element| plus 1e-5 of its own size: wrong semantics (a mask, a label offset, a weight) give 1e-2
// to 1.
constexpr double kAtolFrac = 1e-5;
constexpr double kRtol = 1e-5;

TEST(DrafterGolden, MatchesSpecForgeLossAndGradients) {
  if (!golden_present()) GTEST_SKIP() << kMissing;
  const SafetensorsIndex g = SafetensorsIndex::open(golden_dir() + "/golden.safetensors");
  CpuTrainOps ops;
  const StepResult r = run_golden_step(ops, g);

  expect_rows_and_loss(r, g, 1e-5);

  const DrafterParamTable table = drafter_param_table(r.cfg);
  for (const auto& [name, got] : r.grads) {
    const std::vector<float> ref = read_f32(g, "grad." + name);
    ASSERT_EQ(ref.size(), got.size()) << name;
    const GradDiff d = grad_diff(got, ref, kAtolFrac, kRtol);
    EXPECT_TRUE(d.finite && d.worst_ratio <= 1.0) << describe(name, ref, table.find(name).cols, d);
  }
}

// Both config layouts reach the same DrafterConfig: the golden folder's (block_size in dflash_config,
// rope_theta in rope_parameters) and the same drafter as `export` writes it (top-level keys too).
TEST(DrafterGolden, ConfigLayoutsAgree) {
  if (!golden_present()) GTEST_SKIP() << kMissing;
  const DrafterConfig a = drafter_config_load_hf(model_dir());
  EXPECT_EQ(a.block_size, 4);
  EXPECT_EQ(a.rope_theta, 10000.0f);
  EXPECT_EQ(a.layer_types,
            (std::vector<DrafterLayerType>{DrafterLayerType::sliding, DrafterLayerType::full}));
  EXPECT_NO_THROW(
      drafter_config_check_same(a, drafter_config_from_hf_json(drafter_hf_config(a, 6), "export"), "x"));
}

}  // namespace
