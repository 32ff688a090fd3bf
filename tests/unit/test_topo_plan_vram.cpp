// VRAM planner: every component of a tiny config against hand arithmetic, the Qwen3.6-27B recipe at 32K
// tokens on an 80 GiB GPU (must fit), configs that cannot fit (must throw), and consistency with QwenConfig's
// count.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/error.h"
#include "core/strfmt.h"
#include "model/qwen_config.h"
#include "topo/plan_vram.h"

using namespace df;

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kFixed = 64.0 * 1024 * 1024 + kGiB;  // cuBLASLt workspace + runtime reserve, on each role

// H 8, 4 layers, I 12, V 32, 2 heads / 1 kv head of 4, tied embeddings.
QwenConfig tiny_target() {
  return qwen_config_from_json(nlohmann::json::parse(R"({
    "model_type": "qwen3", "hidden_size": 8, "num_hidden_layers": 4, "intermediate_size": 12,
    "vocab_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": true})"),
                               "tiny");
}

// One drafter layer (2 heads / 1 kv of 4, I 12), taps [0, 1], block 4, 3 anchors, at most 12 block rows (3
// blocks), 10 tokens, depth 2.
std::string tiny_toml(const std::string& extra_train = "", int64_t budget = 10) {
  return R"([target]
random_config = "unused.json"
[drafter]
layers = 1
heads = 2
kv_heads = 1
head_dim = 4
intermediate = 12
block_size = 4
mask_token_id = 31
num_taps = 2
target_layer_ids = [0, 1]
num_anchors = 3
max_block_rows = 12
[data]
token_budget = )" +
         std::to_string(budget) +
         R"(
[pipeline]
hs_queue_depth = 2
[train]
)" + extra_train +
         "\n";
}

double item(const VramRole& r, const std::string& name) {
  for (const VramItem& it : r.items)
    if (it.name == name) return it.bytes;
  ADD_FAILURE() << r.role << " has no item '" << name << "'";
  return -1;
}

QwenConfig load_fixture(const char* name) {
  return qwen_config_load(std::string(DF_SOURCE_DIR) + "/tests/fixtures/models/" + name);
}

}  // namespace

// Every number below is worked out by hand from the shapes above (comments show the sum); byte counts are
// exact integers, so equality is the right test.
TEST(PlanVram, TinyConfigMatchesHandArithmetic) {
  Config cfg = config_parse(tiny_toml(), "tiny.toml");
  VramAssumptions a;
  a.targets = 1;
  VramPlan p = plan_vram_compute(cfg, tiny_target(), 80 * kGiB, "test", a);

  // fc 2·8·8 = 128, hidden_norm + norm 16, layer: norms 16 + q 64 + k|v 64 + o 64 + q/k norm 8 + MLP 288 =
  // 504.
  EXPECT_EQ(p.drafter_params, 648);
  // Flat buffers pad each tensor to 64 elements: fc 128, q 64, k 64, v 64, o 64, gate/up/down 3·128, four
  // 1-layer vectors 4·64, hidden_norm + norm 2·64 = 1152.
  EXPECT_EQ(p.drafter_flat, 1152);
  EXPECT_EQ(p.target_layers_run, 2);  // last tap is layer 1
  // target layer: MLP 288 + norms 16 + q 64 + k|v 64 + o 64 + q/k norm 8 = 504; 2 layers + embed 256 = 1264.
  EXPECT_DOUBLE_EQ(item(p.target, "weights bf16"), 2 * 1264);
  EXPECT_DOUBLE_EQ(item(p.target, "residual [T,H] bf16"), 2 * 10 * 8);
  EXPECT_DOUBLE_EQ(item(p.target, "largest fused projection bf16"), 2 * 10 * 24);  // gate|up 24 > q|k|v 16
  EXPECT_DOUBLE_EQ(item(p.target, "attention/DeltaNet outputs bf16"), 2 * 10 * 8);
  EXPECT_DOUBLE_EQ(item(p.target, "MLP intermediate [T,I] bf16"), 2 * 10 * 12);
  // The forward writes its taps into a wire slot: taps 10 x 16 bf16 = 320 B, the slot's final-hidden offset
  // rounds it to 512; hs_queue_depth 2 slots.
  EXPECT_DOUBLE_EQ(item(p.target, "send buffers"), 2 * 512);
  for (const VramItem& it : p.target.items) EXPECT_NE(it.name, "DeltaNet prefill workspace");  // no DeltaNet
  EXPECT_DOUBLE_EQ(p.target.total, 2528 + 160 + 160 + 480 + 160 + 240 + 1024 + kFixed);

  EXPECT_DOUBLE_EQ(item(p.drafter, "weights bf16 copy"), 2 * 1152);
  EXPECT_DOUBLE_EQ(item(p.drafter, "Adam m, v fp32"), 8 * 1152);
  EXPECT_DOUBLE_EQ(item(p.drafter, "frozen embedding [V,H] bf16"), 2 * 32 * 8);
  EXPECT_DOUBLE_EQ(item(p.drafter, "frozen lm_head"), 0);  // tied
  EXPECT_DOUBLE_EQ(item(p.drafter, "loss statistics f64"), 8 * (4 + 2 * 3));  // block 4: 10 slots
  EXPECT_DOUBLE_EQ(item(p.drafter, "receive slot's pinned mirror (host)"), 0);  // host memory
  EXPECT_EQ(p.anchors, 3);  // one 10-token sequence, min(3 anchors, 9 positions)
  EXPECT_EQ(p.max_blocks, 3);  // max_block_rows 12 / block 4
  EXPECT_DOUBLE_EQ(item(p.drafter, "batch staging bf16"), 0);  // online, no eval.data: nothing host-built
  EXPECT_DOUBLE_EQ(item(p.drafter, "receive slot bf16"), 512);  // one wire slot, as the target's
  // The workspace for 10 tokens and 3 blocks (12 block rows, 22 key rows), every tensor starting on a
  // 256-byte boundary; all of them fit 256 bytes but the [12, I 12] bf16 MLP tensors (288 B, two slots each).
  // Context: f, ctx, rstd, pos, blocks, x0 (6 slots); layer: 15 small + gate, up, act (21 slots); y, rstd,
  // ids, labels, active, tgt_rows, loss, p_label, argmax, row_w, dy, dx, dfc (13 slots); backward scratch:
  // 9 small + dgate, dup, dact (15 slots, the last one dctx [10, 8] bf16 ending after 160 B).
  EXPECT_DOUBLE_EQ(item(p.drafter, "activation workspace"), 256.0 * (6 + 21 + 13 + 14) + 160);
  EXPECT_DOUBLE_EQ(item(p.drafter, "activation workspace"),
                   double(drafter_workspace_bytes(drafter_config_from_run(cfg, tiny_target()),
                                                  drafter_limits_from_run(cfg), DType::bf16)));
  // The largest op workspace is the loss's, chunk = all 12 rows, each part rounded to 256 B: label index
  // 12·4, gathered hidden 12·8·2, f32 logits 12·32·4 = 1536, bf16 dlogits 12·32·2 = 768. (Attention bwd
  // 2 x (4·12·2 → 256), rmsnorm_bwd 1 chunk · 8 · 4, qk_norm_rope_bwd 2 chunks · 4 · 4, sum_squares 8 + 5 blocks ·
  // 8 are smaller.)
  EXPECT_DOUBLE_EQ(item(p.drafter, "op scratch"), 256 + 256 + 1536 + 768);
  // GEMM tuning output: the largest beta != 0 product is the f32 fc gradient [8, 16].
  EXPECT_DOUBLE_EQ(item(p.drafter, "GEMM tuning output"), 4 * 8 * 16);
  EXPECT_DOUBLE_EQ(p.drafter.total, 18 * 1152 + 80 + 512 + 512 + 13984 + 2816 + 512 + kFixed);
  EXPECT_NO_THROW(plan_vram_check(p));

  // Offline (or with eval.data on drafter 0) the host-built batches are staged instead; offline there is
  // no receive slot.
  cfg.topology.offline = true;
  p = plan_vram_compute(cfg, tiny_target(), 80 * kGiB, "test", a);
  EXPECT_DOUBLE_EQ(item(p.drafter, "batch staging bf16"), 2 * 10 * 16);
  EXPECT_DOUBLE_EQ(item(p.drafter, "receive slot bf16"), 0);
}

TEST(PlanVram, KlRunsEveryLayerAndShipsFinalHidden) {
  Config cfg = config_parse(tiny_toml("loss = \"kl\""), "tiny.toml");
  VramPlan p = plan_vram_compute(cfg, tiny_target(), 80 * kGiB, "test", {1, 0, 2048});
  EXPECT_EQ(p.target_layers_run, 4);
  EXPECT_DOUBLE_EQ(item(p.target, "weights bf16"), 2 * (256 + 4 * 504 + 8));  // + final norm
  // Each slot: taps 320 B rounded to 512, then the final hidden 10 x 8 bf16 = 160 B.
  EXPECT_DOUBLE_EQ(item(p.target, "send buffers"), 2 * (512 + 160));
  // + the gathered target rows (256 B) and their f32 logits 12·32·4.
  EXPECT_DOUBLE_EQ(item(p.drafter, "op scratch"), 256 + 256 + 256 + 1536 + 1536 + 768);
}

// A DSpark drafter reads the target's final hidden (its L1 term, its confidence target): the target runs
// every layer and the final norm and ships [T, H] more, as for the soft KL; its head's tensors join the
// drafter's parameters. With neither term on, nothing more travels.
TEST(PlanVram, DSparkShipsFinalHiddenAndCountsItsHead) {
  const auto dspark = [](const std::string& drafter, const std::string& train) {
    std::string toml = tiny_toml(train);
    toml.replace(toml.find("[drafter]\n"), 10, "[drafter]\nkind = \"dspark\"\n" + drafter);
    return config_parse(toml, "tiny.toml");
  };
  VramPlan p = plan_vram_compute(dspark("markov_rank = 3\nmarkov_head_type = \"gated\"\n", ""), tiny_target(),
                                 80 * kGiB, "test", {1, 0, 2048});
  EXPECT_EQ(p.target_layers_run, 4);
  EXPECT_DOUBLE_EQ(p.payload_bytes, 10.0 * (4 + 1 + 2 * 16 + 2 * 8));
  EXPECT_DOUBLE_EQ(item(p.target, "send buffers"), 2 * (512 + 160));
  // The backbone's 648 + W1, W2 2·32·3 + gate_proj 3·(8+3) + 3 + confidence (8+3) + 1.
  EXPECT_EQ(p.drafter_params, 648 + 192 + 33 + 3 + 11 + 1);
  // The largest op workspace is the DSpark head loss's (kernels/train/dspark_workspace.h), 12 rows, each part
  // rounded to 256 B: input rows [z ; e] 12·16·2 (512), u 12·8·2, the gate's pre-activation and gate 12·3·4,
  // confidence logits, L1 (5 × 256); f32 draft and target logits 2 × 12·32·4, bf16 dlogits 12·32·2 (3840);
  // the target rows' index per row, lists and gathered rows 12·8·2 (3 × 256); dz 12·8·4 (512); dconf, du, de,
  // dpre f32 and bf16 (5 × 256); din 12·16·4 (768); the RNN carry, the 16 sort keys, the column sums' partials
  // (one row chunk of the confidence weight's 8 columns) and the 5 statistics rows (8 × 256).
  EXPECT_DOUBLE_EQ(item(p.drafter, "op scratch"),
                   512 + 5 * 256 + 3840 + 3 * 256 + 512 + 5 * 256 + 768 + 8 * 256);
  // GEMM tuning output: the largest beta != 0 product is the Markov bias added into the f32 draft logits of
  // one chunk, [12, 32] (the fc gradient is [8, 16]).
  EXPECT_DOUBLE_EQ(item(p.drafter, "GEMM tuning output"), 4 * 12 * 32);
  // Only CE weighed and no confidence head: the target stops after the last tap and sends the taps alone.
  p = plan_vram_compute(dspark("enable_confidence_head = false\n", "dspark_l1_loss_alpha = 0.0\n"),
                        tiny_target(), 80 * kGiB, "test", {1, 0, 2048});
  EXPECT_EQ(p.target_layers_run, 2);
  EXPECT_DOUBLE_EQ(p.payload_bytes, 10.0 * (4 + 1 + 2 * 16));
}

// target.dtype = "fp8" (CUDA FP8 GEMMs): the projections are 1 B codes + one f32 scale per output row, the
// rest bf16, plus the planned input codes. Per layer of the tiny target: q 8x8, k|v 8x8, o 8x8, gate|up 24x8,
// down 8x12 = 480 weights in 56 rows; the other 24 parameters (norms, q/k norms) stay bf16.
TEST(PlanVram, Fp8TargetCountsCodesAndScales) {
  std::string toml = tiny_toml();
  toml.replace(toml.find("[target]\n"), 9, "[target]\ndtype = \"fp8\"\n");
  Config cfg = config_parse(toml, "tiny.toml");
  VramAssumptions a;
  a.targets = 1;
  VramPlan p = plan_vram_compute(cfg, tiny_target(), 80 * kGiB, "test", a);
  EXPECT_DOUBLE_EQ(item(p.target, "weights bf16"), 2 * (1264 - 2 * 480));  // embed 256 + 2 x 24
  EXPECT_DOUBLE_EQ(item(p.target, "weights FP8 e4m3 + scales"), 2 * 480 + 4 * 2 * 56);
  // 10 tokens x the widest input (down_proj's K = I = 12) + a scale per token.
  EXPECT_DOUBLE_EQ(item(p.target, "FP8 input codes + scales"), 10 * 12 + 4 * 10);
}

// From a 128x128 block checkpoint its block scales replace the channel scales: per layer of the tiny target four
// projections (q|k|v, o, gate|up, down) of one block row each, a row padded to 4 columns: 16 f32 a layer.
TEST(PlanVram, Fp8BlockCheckpointCountsBlockScales) {
  std::string toml = tiny_toml();
  toml.replace(toml.find("[target]\n"), 9, "[target]\ndtype = \"fp8\"\n");
  Config cfg = config_parse(toml, "tiny.toml");
  VramAssumptions a;
  a.targets = 1;
  QwenConfig t = tiny_target();
  t.fp8_block_n = t.fp8_block_k = 128;
  VramPlan p = plan_vram_compute(cfg, t, 80 * kGiB, "test", a);
  EXPECT_DOUBLE_EQ(item(p.target, "weights FP8 e4m3 + scales"), 2 * 480 + 4 * 2 * 16);
  // The widest input (K = 12) is one 128-column group: one scale per token, the 10 tokens' scales padded to 12
  // (core/fp8.h fp8_group_scales_size: the last 10 % 4 rows take a 4-row tail).
  EXPECT_DOUBLE_EQ(item(p.target, "FP8 input codes + scales"), 10 * 12 + 4 * 12);
}

TEST(PlanVram, ShortSequencesMeanMoreAnchors) {
  Config cfg = config_parse(tiny_toml(), "tiny.toml");
  // 10 tokens in sequences of 4: 3 sequences x min(3 anchors, 3 positions) = 9 anchor blocks.
  VramPlan p = plan_vram_compute(cfg, tiny_target(), 80 * kGiB, "test", {1, 4, 2048});
  EXPECT_EQ(p.anchors, 9);
  // 1-token sequences: every token an anchor, capped at the budget.
  p = plan_vram_compute(cfg, tiny_target(), 80 * kGiB, "test", {1, 1, 2048});
  EXPECT_EQ(p.anchors, 10);
}

// The recipe config at 32K tokens, 7 targets per drafter, 2048-row logits chunks. The planner's arithmetic
// (tests/gpu/test_plan_vram_cuda.cpp holds the drafter's to the CUDA allocations): target 56.28 GiB (its taps
// written into the 2 wire slots), drafter 50.33 GiB with the workspace planned for max_block_rows 8192
// (1,730,213,120 trainable drafter params) and one receive slot, both under 80 GiB.
TEST(PlanVram, Qwen36_27B_At32K_Fits80GiB) {
  Config cfg = config_load(std::string(DF_SOURCE_DIR) + "/configs/qwen3.6-27b.toml");
  ASSERT_EQ(cfg.data.token_budget, 32768);
  VramPlan p = plan_vram_compute(cfg, load_fixture("qwen3.6-27b"), 80 * kGiB, "test", {7, 0, 2048});
  EXPECT_EQ(p.drafter_params, 1730213120);  // MODELS.md: ≈1.73 B
  EXPECT_EQ(p.target_layers_run, 62);
  // 48 value heads, dk = dv = 128: 32768 tokens x 48 x (W, U 2·2·128 + scores 2·64 + scalars 16 = 656 B).
  EXPECT_DOUBLE_EQ(item(p.target, "DeltaNet prefill workspace"), 32768.0 * 48 * 656);
  EXPECT_NEAR(p.target.total / kGiB, 56.28, 0.01);
  EXPECT_NEAR(p.drafter.total / kGiB, 50.33, 0.01);
  EXPECT_NO_THROW(plan_vram_check(p));
}

TEST(PlanVram, TooLargeFailsNamingTheRole) {
  Config cfg = config_load(std::string(DF_SOURCE_DIR) + "/configs/qwen3.6-27b.toml");
  VramPlan p = plan_vram_compute(cfg, load_fixture("qwen3.6-27b"), 40 * kGiB, "test", {7, 0, 2048});
  try {
    plan_vram_check(p);
    FAIL() << "a 27B target on a 40 GiB GPU must not fit";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not fit a 40.00 GiB GPU"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("target needs"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("drafter needs"), std::string::npos) << e.what();
    // The 27B's bf16 weights alone pass 40 GiB: no budget helps, and the hint is FP8.
    EXPECT_NE(std::string(e.what()).find(
                  strfmt("The target's weights alone are %.2f GiB", p.target_weight_bytes / kGiB)),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("HINT: target.dtype = \"fp8\""), std::string::npos) << e.what();
  }
  cfg.data.token_budget = 262144;  // 8x the budget: the target's activations and send buffers pass 80 GiB
  p = plan_vram_compute(cfg, load_fixture("qwen3.6-27b"), 80 * kGiB, "test", {7, 0, 2048});
  EXPECT_TRUE(p.target_too_big.empty());  // the weights fit: the budget is what to lower
  try {
    plan_vram_check(p);
    FAIL() << "a 27B target at 262144 tokens must not fit 80 GiB";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("HINT: lower data.token_budget"), std::string::npos) << e.what();
  }
}

TEST(PlanVram, Qwen3_8B_DefaultTapsAndFit) {
  Config cfg = config_load(std::string(DF_SOURCE_DIR) + "/configs/qwen3-8b.toml");
  QwenConfig t = load_fixture("qwen3-8b");
  EXPECT_EQ(drafter_config_from_run(cfg, t).target_layer_ids, (std::vector<int>{1, 9, 17, 25, 33}));
  VramPlan p = plan_vram_compute(cfg, t, 80 * kGiB, "test", {7, 0, 2048});
  EXPECT_EQ(p.target_layers_run, 34);
  EXPECT_NO_THROW(plan_vram_check(p));
}

TEST(PlanVram, LayerCountAgreesWithQwenConfig) {
  for (const char* name : {"qwen3.6-27b", "qwen3-8b"}) {
    QwenConfig t = load_fixture(name);
    double sum = t.hidden;  // final norm
    for (int l = 0; l < t.layers; ++l) sum += plan_vram_target_layer_params(t, l);
    // Both sides add the same integers in double (< 2^53), so they must agree exactly.
    EXPECT_DOUBLE_EQ(sum, t.params_non_embedding()) << name;
  }
}

// tiny_target as a Qwen3-MoE: top-2 of 3 experts of width 5, layer 1 dense (I 12).
QwenConfig tiny_moe_target() {
  return qwen_config_from_json(nlohmann::json::parse(R"({
    "model_type": "qwen3_moe", "hidden_size": 8, "num_hidden_layers": 4, "intermediate_size": 12,
    "vocab_size": 32, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 4,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": true, "num_experts": 3,
    "num_experts_per_tok": 2, "moe_intermediate_size": 5, "mlp_only_layers": [1]})"),
                               "tiny_moe");
}

TEST(PlanVram, MoeTargetCountsEveryExpertAndTheRouting) {
  Config cfg = config_parse(tiny_toml(), "tiny.toml");
  VramPlan p = plan_vram_compute(cfg, tiny_moe_target(), 80 * kGiB, "test", {1, 0, 1024});
  // Taps [0, 1] run layers 0 (MoE) and 1 (dense). Layer 0: experts 3·3·8·5 = 360, router 3·8 = 24, the rest
  // as in tiny_target's layer without its MLP: 504 - 288 = 216; layer 1 as in tiny_target: 504; embed 256.
  EXPECT_DOUBLE_EQ(item(p.target, "weights bf16"), 2 * (256 + 216 + 504));
  EXPECT_DOUBLE_EQ(item(p.target, "MoE routed experts bf16"), 2 * 360);
  EXPECT_DOUBLE_EQ(item(p.target, "MoE router + shared expert bf16"), 2 * 24);
  EXPECT_DOUBLE_EQ(p.target_weight_bytes, 2 * 1360);
  // 10 tokens: ids + weights 10 x 2 x 8 B.
  EXPECT_DOUBLE_EQ(item(p.target, "MoE routing ids + weights [T,k]"), 8.0 * 10 * 2);
  // kernels/moe/moe_workspace.h for 10 tokens: 20 pairs over 3 experts make 16-row tiles, at most (20 + 3·15)
  // / 16 = 4 of them, 64 grouped rows. Five 256-byte-rounded index buffers (histogram, starts, row tokens,
  // pair rows, 24 tile pointers) + inputs/outputs 64 x 8 x 2 B + gate|up 64 x 10 x 2 B = 1280 + 1024 + 1280
  // (the routing's 512 B of logits and top-k rows share it).
  EXPECT_DOUBLE_EQ(item(p.target, "MoE expert workspace"), 3584);
  double sum = tiny_moe_target().hidden;
  for (int l = 0; l < 4; ++l) sum += plan_vram_target_layer_params(tiny_moe_target(), l);
  EXPECT_DOUBLE_EQ(sum, tiny_moe_target().params_non_embedding());
  EXPECT_TRUE(p.refused.empty());
  EXPECT_TRUE(p.target_too_big.empty());
}

// FP8 for an MoE target: the experts as 1 B codes with a 4 B scale per row (a bf16 checkpoint quantised at
// load), the router in bf16, the FP8 experts' input codes in the workspace; nothing refused.
TEST(PlanVram, MoeTargetFp8CountsExpertsAsCodes) {
  Config cfg = config_parse(tiny_toml(), "tiny.toml");
  cfg.target.dtype = "fp8";
  VramPlan p = plan_vram_compute(cfg, tiny_moe_target(), 80 * kGiB, "test", {1, 0, 1024});
  // Layer 0's experts: 360 codes + 4 B x 3 experts x (2·5 + 8) row scales; its router 2 B x 3 x 8.
  EXPECT_DOUBLE_EQ(item(p.target, "MoE routed experts FP8 e4m3 + scales"), 360 + 4 * 54);
  EXPECT_DOUBLE_EQ(item(p.target, "MoE router + shared expert gate bf16"), 2 * 24);
  for (const VramItem& it : p.target.items) EXPECT_NE(it.name, "MoE routed experts bf16");
  EXPECT_LT(p.target_weight_bytes, 2 * 1360);
  // kernels/moe/moe_workspace.h with FP8 experts for 10 tokens (64 grouped rows, 4 tiles of 16): the four
  // 256-byte index buffers, tile experts 256, input codes 64 x 8 = 512 with 64 scales 256, SwiGLU codes
  // 64 x 5 -> 512 with 64 scales 256, inputs/outputs 64 x 8 x 2 B = 1024, gate|up 64 x 10 x 2 B = 1280.
  EXPECT_DOUBLE_EQ(item(p.target, "MoE expert workspace"), 5120);
  EXPECT_TRUE(p.refused.empty()) << p.refused;
  const std::string out = plan_vram_format(p);
  EXPECT_EQ(out.find("REFUSED"), std::string::npos) << out;
}

namespace {

// A Qwen3.5-MoE target's parameters through layer `layers` - 1 by part, written out from the config's own
// fields (MODELS.md's tensor shapes), independently of the planner's sums.
struct HandCount {
  double dense = 0, experts = 0, router_shared = 0;
};
HandCount hand_count_q35_moe(const QwenConfig& t, int layers) {
  const double H = t.hidden, E = t.num_experts, I = t.moe_intermediate, Is = t.shared_intermediate;
  const double q = double(t.heads) * t.head_dim, kv = double(t.kv_heads) * t.head_dim;
  const double full = 2 * q * H + 2 * kv * H + q * H + 2.0 * t.head_dim;  // q|gate, k, v, o, q/k norms
  const double kd = double(t.lin_nk) * t.lin_dk, vd = double(t.lin_nv) * t.lin_dv, ch = 2 * kd + vd;
  const double linear = ch * H + vd * H + 2.0 * t.lin_nv * H  // in_proj_qkv, in_proj_z, in_proj_b, in_proj_a
                        + ch * t.conv_kernel + 2.0 * t.lin_nv + t.lin_dv +
                        vd * H;  // conv1d, A_log, dt_bias, norm, out
  HandCount c;
  c.dense = double(t.vocab) * H;  // the embedding (a target runs no lm_head)
  for (int l = 0; l < layers; ++l) {
    const bool is_full = (l + 1) % 4 == 0;  // full_attention_interval 4
    c.dense += 2 * H + (is_full ? full : linear);
    c.experts += E * 3 * H * I;
    c.router_shared += E * H + 3 * H * Is + H;
  }
  return c;
}

}  // namespace

// The Qwen3.6-35B-A3B recipe on its target (tests/fixtures/models/qwen3.6-35b-a3b: the published
// config.json's values in the multimodal layout, as public loaders pin them; the 122B-A10B's likewise) at its
// 32K-token budget: every MoE line against the hand counts above. Its taps end at layer 37, so 38 of the 40
// layers run. Target 67.82 GiB: it fits an 80 GiB GPU in bf16.
TEST(PlanVram, Qwen36_35B_A3B_RecipeCountsByHand) {
  Config cfg = config_load(std::string(DF_SOURCE_DIR) + "/configs/qwen3.6-35b-a3b.toml");
  const QwenConfig t = load_fixture("qwen3.6-35b-a3b");
  ASSERT_EQ(t.num_experts, 256);
  ASSERT_EQ(t.experts_per_tok, 8);
  const double T = double(cfg.data.token_budget), E = t.num_experts, k = t.experts_per_tok, H = t.hidden;
  const double I = t.moe_intermediate, Is = t.shared_intermediate;
  ASSERT_EQ(T, 32768);
  VramPlan p = plan_vram_compute(cfg, t, 80 * kGiB, "test", {7, 0, 2048});
  EXPECT_EQ(p.target_layers_run, 38);
  const HandCount c = hand_count_q35_moe(t, 38);
  EXPECT_DOUBLE_EQ(item(p.target, "weights bf16"), 2 * c.dense);
  EXPECT_DOUBLE_EQ(item(p.target, "MoE routed experts bf16"), 2 * c.experts);
  EXPECT_DOUBLE_EQ(item(p.target, "MoE router + shared expert bf16"), 2 * c.router_shared);
  EXPECT_DOUBLE_EQ(item(p.target, "MoE routed experts bf16"), 2.0 * 38 * 256 * 3 * 2048 * 512);  // 57 GiB
  EXPECT_DOUBLE_EQ(item(p.target, "MoE routing ids + weights [T,k]"), 8 * T * k);
  // The grouped rows (every token's top-k copies: input/output H and gate|up 2I, bf16) and the shared
  // expert's are the workspace's bulk; the per-expert tile padding adds at most one 128-row tile an expert,
  // the sort and routing buffers a few MiB.
  const double ws = item(p.target, "MoE expert workspace"),
               rows = 2 * T * k * (H + 2 * I) + 2 * T * (2 * Is + H);
  EXPECT_GE(ws, rows);
  EXPECT_LE(ws, rows + 2 * E * 128 * (H + 2 * I) + 64.0 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(item(p.target, "MLP intermediate [T,I] bf16"), 0);  // no dense MLP layer
  EXPECT_NEAR(p.target.total / kGiB, 67.82, 0.01);
  // 6 layers of q 2048·4096 + k|v 2·2048·1024 + o 4096·2048 + MLP 3·2048·6144 = 58,720,256, fc 8·2048·2048,
  // norms 6·(2·2048 + 2·128) + 2·2048.
  EXPECT_EQ(p.drafter_params, 6.0 * 58720256 + 8.0 * 2048 * 2048 + 6 * (2 * 2048 + 2 * 128) + 2 * 2048);
  EXPECT_NO_THROW(plan_vram_check(p));
}

// A Qwen3.5-122B-A10B in bf16 (tests/fixtures/models/qwen3.5-122b-a10b) cannot fit one card: the check and
// the printed plan say so with the weights' bytes and the GPU, and that no budget helps.
TEST(PlanVram, Qwen35_122B_A10B_WeightsAloneExceedOneGpu) {
  Config cfg = config_load(std::string(DF_SOURCE_DIR) + "/configs/qwen3.6-35b-a3b.toml");
  const QwenConfig t = load_fixture("qwen3.5-122b-a10b");
  ASSERT_EQ(t.hidden, 3072);
  const HandCount c = hand_count_q35_moe(t, 38);
  for (double gib : {80.0, 141.0}) {
    VramPlan p = plan_vram_compute(cfg, t, gib * kGiB, "NVML, GPU 0 test", {7, 0, 2048});
    EXPECT_DOUBLE_EQ(p.target_weight_bytes, 2 * (c.dense + c.experts + c.router_shared));
    const std::string gib_s = strfmt("%.2f GiB", p.target_weight_bytes / kGiB);
    EXPECT_NE(p.target_too_big.find("The target's weights alone are " + gib_s), std::string::npos)
        << p.target_too_big;
    EXPECT_NE(p.target_too_big.find(strfmt("one GPU has %.2f GiB (NVML, GPU 0 test)", gib)),
              std::string::npos)
        << p.target_too_big;
    EXPECT_NE(plan_vram_format(p).find("verdict: DOES NOT FIT"), std::string::npos);
    EXPECT_NE(plan_vram_format(p).find(p.target_too_big), std::string::npos);
    try {
      plan_vram_check(p);
      FAIL() << "a 122B-A10B in bf16 must not fit " << gib << " GiB";
    } catch (const Error& e) {
      const std::string w = e.what();
      EXPECT_NE(w.find(strfmt("does not fit a %.2f GiB GPU", gib)), std::string::npos) << w;
      EXPECT_NE(w.find("no data.token_budget, pipeline.hs_queue_depth or target:drafter split"),
                std::string::npos)
          << w;
      EXPECT_NE(w.find("docs/multi-gpu-targets.md"), std::string::npos) << w;
      EXPECT_EQ(w.find("HINT: lower data.token_budget"), std::string::npos) << w;
    }
  }
  // The 35B-A3B on the same 80 GiB GPU has no such line.
  EXPECT_TRUE(plan_vram_compute(cfg, load_fixture("qwen3.6-35b-a3b"), 80 * kGiB, "test", {7, 0, 2048})
                  .target_too_big.empty());
}

TEST(PlanVram, TapBeyondTheTargetIsAnError) {
  Config cfg = config_parse(tiny_toml(), "tiny.toml");
  cfg.drafter.target_layer_ids = {0, 7};
  try {
    drafter_config_from_run(cfg, tiny_target());
    FAIL() << "layer 7 of a 4-layer target must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("drafter.target_layer_ids holds layer 7"), std::string::npos)
        << e.what();
  }
}

// The same recipe as a DFlash2 drafter with SpecForge's published sizes (configs/qwen3.6-27b-dflash2.json:
// 2 taps, groups of 16, rank 256, top 16): per layer two convolutions of base 2·2·5120 + projection
// 2·2·320·5120 (6,574,080 each, 65,740,800 over 5 layers) and the selector's codebooks 2·248320·256 +
// projection 256·5120 (128,450,560): 194,191,360 more than DFlash's 1,730,213,120.
TEST(PlanVram, Qwen36_27B_Dflash2CountsItsConvolutionsAndSelector) {
  Config cfg = config_load(std::string(DF_SOURCE_DIR) + "/configs/qwen3.6-27b.toml");
  cfg.drafter.kind = "dflash2";
  cfg.drafter.block_size = 8;
  VramPlan p = plan_vram_compute(cfg, load_fixture("qwen3.6-27b"), 80 * kGiB, "test", {7, 0, 2048});
  EXPECT_EQ(p.drafter_params, 1730213120 + 194191360);
  // configs/qwen3.6-27b-dflash2.toml is that drafter (other taps, as many).
  const Config recipe = config_load(std::string(DF_SOURCE_DIR) + "/configs/qwen3.6-27b-dflash2.toml");
  EXPECT_EQ(
      plan_vram_compute(recipe, load_fixture("qwen3.6-27b"), 80 * kGiB, "test", {7, 0, 2048}).drafter_params,
      1730213120 + 194191360);
  cfg.drafter.conv_group_size = 24;  // does not divide 5120
  try {
    plan_vram_compute(cfg, load_fixture("qwen3.6-27b"), 80 * kGiB, "test", {7, 0, 2048});
    FAIL() << "a group size that does not divide the hidden size must be refused";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("drafter.conv_group_size 24 must divide the target's hidden size 5120"),
        std::string::npos)
        << e.what();
  }
}
