// FLOP counts and `plan flops`: the drafter step's formula against hand arithmetic on a tiny drafter, the
// target forward's against the terms the bench used to write out (2 x params + attention + DeltaNet chunks),
// and the Qwen3.6-27B recipe's batch: the bench's 124.9 TFLOP a step at 1 x 4096, the block cap at 32K, the
// wire bytes.
#include <gtest/gtest.h>

#include <cmath>

#include "core/config.h"
#include "model/model_flops.h"
#include "model/qwen_config.h"
#include "topo/plan_flops.h"
#include "topo/plan_vram.h"
#include "topo_test_util.h"

namespace df {
namespace {

QwenConfig fixture_27b() {
  return qwen_config_load(std::string(DF_SOURCE_DIR) + "/tests/fixtures/models/qwen3.6-27b");
}

Config recipe_27b(int64_t budget) {
  Config cfg = config_load(std::string(DF_SOURCE_DIR) + "/configs/qwen3.6-27b.toml");
  cfg.data.token_budget = budget;
  return cfg;
}

TEST(ModelFlops, DrafterStepByHandOnATinyDrafter) {
  DrafterConfig c;
  c.hidden = 8, c.layers = 1, c.heads = 2, c.kv_heads = 1, c.head_dim = 4, c.intermediate = 12, c.vocab = 32;
  c.block_size = 4;
  c.target_layer_ids = {0, 1};
  c.layer_types = {DrafterLayerType::full};
  // One anchor at 2 of a 10-token sequence and one padding block.
  const std::vector<DrafterAnchor> anchors = {{0, 2}, {0, -1}};
  // Layer weights 8*8*2 + 4*8*2 + 3*12*8 = 480 over N = 2 blocks x 4 rows: 6*480*8 = 23040. Context K/V
  // 6*(2*4*8)*10 = 3840. fc 4*(8*2*8)*10 = 5120. lm_head over min(3, 10-1-2) = 3 labelled rows: 4*8*32*3 =
  // 3072. Attention (full layer): each of the 4 block rows sees 2 context keys + 4 block keys = 24 pairs a
  // head, 3.5 * 4 * 4 (hd) * 2 (heads) * 24 = 2688.
  EXPECT_DOUBLE_EQ(drafter_step_flops(c, anchors, {10}), 23040.0 + 3840 + 5120 + 3072 + 2688);
  // Sliding window 2: block row k sees context keys from max(0, 2 + k - 1) to 1, none but for k = 0 (key 1),
  // and its own k + 1 block keys: 1 + (1 + 2 + 3 + 4) = 11 pairs a head.
  c.layer_types = {DrafterLayerType::sliding};
  c.sliding_window = 2;
  EXPECT_DOUBLE_EQ(drafter_step_flops(c, anchors, {10}), 23040.0 + 3840 + 5120 + 3072 + 3.5 * 4 * 4 * 2 * 11);
  expect_error_with([&] { drafter_step_flops(c, {{1, 0}}, {10}); }, "anchor in sequence 1 of a batch of 1");
  // Domino with shift_label: slot 0 is labelled too, min(4, 10 - 1 - 2) = 4 rows (lm_head 4*8*32*4 = 4096),
  // and its head over the N = 8 block rows with G 3, E 5: (4*9*8 + 6*9*3 + 6*5*11 + 6*5*32)*8 = 13920.
  c.kind = DrafterKind::domino;
  c.gru_hidden_dim = 3, c.emb_dim = 5, c.shift_label = true;
  EXPECT_DOUBLE_EQ(drafter_step_flops(c, anchors, {10}),
                   23040.0 + 3840 + 5120 + 4096 + 3.5 * 4 * 4 * 2 * 11 + 13920);
  // DSpark without Markov or confidence head, anchors 2 and 3: each labels min(4, 10 - 1 - a) = 4 slots
  // (DFlash 3), so the lm_head adds 4*8*32*2; the target distributions are made once per distinct position
  // read, {2..5} and {3..6}: 5 of the 8 rows, 2*8*32*5.
  const std::vector<DrafterAnchor> two = {{0, 2}, {0, 3}, {0, -1}};
  c.kind = DrafterKind::dflash;
  const double dflash = drafter_step_flops(c, two, {10});
  c.kind = DrafterKind::dspark;
  c.markov_rank = 0, c.enable_confidence_head = false;
  EXPECT_DOUBLE_EQ(drafter_step_flops(c, two, {10}) - dflash, 4.0 * 8 * 32 * 2 + 2.0 * 8 * 32 * 5);
}

TEST(ModelFlops, TargetForwardIsTwiceTheParamsPlusAttentionAndDeltaNetChunks) {
  const QwenConfig t = fixture_27b();
  const double L = 4096, C = 64, dk = t.lin_dk, dv = t.lin_dv;
  const double chunk =
      2 * C * C * dk + 2 * C * C * dk + 2 * C * C * dv + C * C * (dk + dv) + 3 * 2 * C * dk * dv;
  const double attn = 4.0 * t.heads * t.head_dim * (L + 1) / 2, gdn = t.lin_nv * chunk / C;
  EXPECT_DOUBLE_EQ(target_forward_flops_per_token(t, 4096, 64),
                   2 * t.params_non_embedding() + 16 * attn + 48 * gdn);
  // The training target stops after tap 61: layers 62 (DeltaNet) and 63 (attention) and the final norm are
  // not run.
  EXPECT_NEAR(
      target_forward_flops_per_token(t, 4096, 62),
      2 * (t.params_non_embedding() - t.layer_params(62, true) - t.layer_params(63, true) - t.hidden) +
          15 * attn + 47 * gdn,
      1.0);
  // What the bench reported (benchmarks/RESULTS.md, the 27B bf16 forward): 638 TFLOP/s over 2.561 s for
  // 32,768 tokens, 49.86 GFLOP a token to the precision of the printed figures.
  EXPECT_NEAR(target_forward_flops_per_token(t, 4096, 64) / 1e9, 49.86, 0.05);
  expect_error_with([&] { target_forward_flops_per_token(t, 4096, 65); },
                    "target layers run 65 outside 1..64");
}

TEST(PlanFlops, TwentySevenBRecipeMatchesTheBenchAndCapsBlocks) {
  const QwenConfig t = fixture_27b();
  // The bench's shape (1 x 4096 tokens, 512 anchors): it printed 124.9 TFLOP a step (benchmarks/RESULTS.md);
  // the anchors' positions move the attention term by well under 0.5 %.
  const FlopsPlan small = plan_flops_compute(recipe_27b(4096), t, 0);
  EXPECT_EQ(small.seqs, 1);
  EXPECT_EQ(small.anchors, 512);
  EXPECT_EQ(small.blocks, 512);
  EXPECT_NEAR(small.drafter_flops / 1e12, 124.9, 0.6);
  EXPECT_EQ(small.target_layers_run, 62);
  // The recipe's 32K batch as 8 sequences of 4096: 8 x 512 anchors drawn, 8192 block rows / 16 kept.
  const Config cfg = recipe_27b(32768);
  const FlopsPlan p = plan_flops_compute(cfg, t, 4096);
  EXPECT_EQ(p.seqs, 8);
  EXPECT_EQ(p.anchors, 8 * 512);
  EXPECT_EQ(p.blocks, 512);
  EXPECT_DOUBLE_EQ(p.target_flops, 32768 * target_forward_flops_per_token(t, 4096, 62));
  // Wire: token id (4 B) + loss mask (1 B) + 5 taps of 5120 bf16 a token.
  EXPECT_DOUBLE_EQ(p.payload_bytes, 32768.0 * (4 + 1 + 2 * 5 * 5120));
  const VramPlan v = plan_vram_compute(cfg, t, 1, "test");
  EXPECT_DOUBLE_EQ(p.grad_bytes, 4.0 * double(v.drafter_flat));
  EXPECT_EQ(p.grad_accum, 1);
  const std::string text = plan_flops_format(p);
  EXPECT_NE(text.find("8 sequence(s) of 4096"), std::string::npos) << text;
  EXPECT_NE(plan_flops_json(p).find("\"blocks\":512"), std::string::npos);
  expect_error_with([&] { plan_flops_compute(cfg, t, -1); }, "--seq-len -1");
}

TEST(PlanFlops, AllReduceBytesFollowTheRing) {
  EXPECT_EQ(plan_allreduce_bytes(8e9, 1), 0.0);
  EXPECT_DOUBLE_EQ(plan_allreduce_bytes(8e9, 2), 8e9);
  EXPECT_DOUBLE_EQ(plan_allreduce_bytes(8e9, 4), 12e9);
  expect_error_with([] { plan_allreduce_bytes(8e9, 0); }, "at least one drafter");
}

}  // namespace
}  // namespace df
