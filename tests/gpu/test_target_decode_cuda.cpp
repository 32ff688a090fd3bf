// Incremental target decoding and speculative decoding on CUDA (model/target_decode.h,
// pipeline/spec_decode.h) with random tiny targets of both families and their mixture-of-experts variants at
// shapes the CUDA forward runs (head dims 16/32, GQA, gated attention, partial rotary, DeltaNet 16×16 heads,
// routed and shared experts):
//  - decoding step by step reproduces the full-sequence forward: its error against the CPU fp32 forward is no
//    worse than the CUDA forward's own (both bf16), per tap and for the logits;
//  - rolling a step back to a partial accept equals a fresh prefill of the accepted prefix;
//  - speculative decoding with a CUDA DFlash, Domino, DSpark or DFlash2 drafter, and batched generation (eval
//    --generate), commit the CUDA target's plain greedy tokens (up to a near tie of the target's top two
//    logits, where bf16 rounding of a differently batched step may choose the other).
// Skips itself without a GPU or a CUDA build.
#include <gtest/gtest.h>

#ifndef DF_HAVE_CUDA
TEST(TargetDecodeCuda, SkippedWithoutCudaBuild) { GTEST_SKIP() << "built without CUDA: GPU decode tests skipped"; }
#else
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "ops/cpu/cpu_ops.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_train_ops.h"
#include "pipeline/spec_decode.h"
#include "tests/unit/target_test_util.h"
#include "tests/unit/test_drafter_util.h"

using namespace df;

namespace {

// cuda_hybrid's keys with `changes` over them: the hybrids below differ from it in a few shapes each.
nlohmann::json hybrid_json(const nlohmann::json& changes) {
  nlohmann::json j = {{"model_type", "qwen3_5_text"},
                      {"hidden_size", 64},
                      {"num_hidden_layers", 4},
                      {"layer_types", {"linear_attention", "full_attention", "linear_attention", "full_attention"}},
                      {"intermediate_size", 96},
                      {"vocab_size", 200},
                      {"num_attention_heads", 4},
                      {"num_key_value_heads", 2},
                      {"head_dim", 16},
                      {"attn_output_gate", true},
                      {"partial_rotary_factor", 0.25},
                      {"rope_theta", 10000.0},
                      {"rms_norm_eps", 1e-6},
                      {"linear_num_key_heads", 2},
                      {"linear_num_value_heads", 4},
                      {"linear_key_head_dim", 16},
                      {"linear_value_head_dim", 16},
                      {"linear_conv_kernel_dim", 4},
                      {"tie_word_embeddings", false}};
  j.update(changes);
  return j;
}

QwenConfig cuda_hybrid() {
  return qwen_config_from_json(hybrid_json(nlohmann::json::object()), "cuda_hybrid");
}

QwenConfig cuda_dense() {
  nlohmann::json j = {{"model_type", "qwen3"},    {"hidden_size", 64},        {"num_hidden_layers", 3},
                      {"intermediate_size", 96},  {"vocab_size", 160},        {"num_attention_heads", 4},
                      {"num_key_value_heads", 1}, {"head_dim", 32},           {"rope_theta", 1e6},
                      {"rms_norm_eps", 1e-6},     {"tie_word_embeddings", true}};
  return qwen_config_from_json(j, "cuda_dense");
}

// The odd shapes: gated attention with 3 q heads / 1 kv head of hd 32 and 8 rotary dims, DeltaNet key /
// value heads of 16 / 24, a hidden size that is no multiple of 64 — run by the general kernels.
QwenConfig odd_hybrid() {
  const nlohmann::json j =
      hybrid_json({{"hidden_size", 40},
                   {"num_hidden_layers", 3},
                   {"layer_types", {"linear_attention", "full_attention", "linear_attention"}},
                   {"intermediate_size", 72},
                   {"vocab_size", 150},
                   {"num_attention_heads", 3},
                   {"num_key_value_heads", 1},
                   {"head_dim", 32},
                   {"linear_num_key_heads", 1},
                   {"linear_num_value_heads", 2},
                   {"linear_value_head_dim", 24}});
  return qwen_config_from_json(j, "odd_hybrid");
}

QwenConfig odd_dense() {
  nlohmann::json j = {{"model_type", "qwen3"},    {"hidden_size", 48},        {"num_hidden_layers", 2},
                      {"intermediate_size", 80},  {"vocab_size", 120},        {"num_attention_heads", 5},
                      {"num_key_value_heads", 1}, {"head_dim", 16},           {"rope_theta", 1e6},
                      {"rms_norm_eps", 1e-6},     {"tie_word_embeddings", false}};
  return qwen_config_from_json(j, "odd_dense");
}

// The 27B layer's head layout at a small width: gated attention with 6 q heads per kv head of hd 128 (the
// split-KV decode kernel) and DeltaNet heads of 128 × 128 with 3 value heads per key head.
QwenConfig wide_hybrid() {
  const nlohmann::json j = hybrid_json({{"num_hidden_layers", 2},
                                        {"layer_types", {"linear_attention", "full_attention"}},
                                        {"num_attention_heads", 6},
                                        {"num_key_value_heads", 1},
                                        {"head_dim", 128},
                                        {"linear_num_key_heads", 1},
                                        {"linear_num_value_heads", 3},
                                        {"linear_key_head_dim", 128},
                                        {"linear_value_head_dim", 128}});
  return qwen_config_from_json(j, "wide_hybrid");
}

// cuda_hybrid as a Qwen3.5-MoE (qwen3_5_moe_text): top-3 of 9 experts of width 32 and a gated shared expert
// of 48 in every layer, widths the MoE kernels' 16-byte paths take; no dense MLP width and the model type's
// own attention gate.
QwenConfig cuda_moe_hybrid() {
  nlohmann::json j = hybrid_json({{"model_type", "qwen3_5_moe_text"},
                                  {"num_experts", 9},
                                  {"num_experts_per_tok", 3},
                                  {"moe_intermediate_size", 32},
                                  {"shared_expert_intermediate_size", 48}});
  j.erase("intermediate_size");
  j.erase("attn_output_gate");
  return qwen_config_from_json(j, "cuda_moe_hybrid");
}

// 0, 1: shapes the tiled kernels run; 2, 3: the CPU tests' tiny models (hd 8 / 6, DeltaNet dv 4, hidden 24 /
// 20); 4, 5: odd_hybrid / odd_dense; 6: wide_hybrid (the decode kernels' fast paths); 7, 8: the CPU tests'
// mixture-of-experts models (hidden 20 / 24: the MoE kernels' scalar paths); 9: cuda_moe_hybrid.
QwenConfig family_config(int i) {
  switch (i) {
    case 0: return cuda_hybrid();
    case 1: return cuda_dense();
    case 2: return tiny_hybrid();
    case 3: return tiny_dense();
    case 4: return odd_hybrid();
    case 5: return odd_dense();
    case 6:
      return wide_hybrid();
    case 7:
      return tiny_moe_dense();
    case 8:
      return tiny_moe_hybrid();
    default:
      return cuda_moe_hybrid();
  }
}
const char* const kFamilyNames[] = {"hybrid",          "dense",          "tiny_hybrid", "tiny_dense",
                                    "odd_hybrid",      "odd_dense",      "wide_hybrid", "tiny_moe_dense",
                                    "tiny_moe_hybrid", "cuda_moe_hybrid"};

class TargetDecodeCuda : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU decode test skipped";
    gpu_ = std::make_unique<CudaOps>(0);
  }
  QwenConfig cfg() const { return family_config(GetParam()); }
  std::vector<float> down(const Tensor& t) {
    std::vector<float> h(size_t(t.numel()));
    gpu_->download_f32(t, h.data());
    return h;
  }
  std::unique_ptr<CudaOps> gpu_;
};

// Plain greedy decoding of one prompt on the target's own device, one token a step, with each step's top-2
// logit margin and top logit (to tell a near tie from a real difference).
struct Greedy {
  std::vector<int32_t> tokens;
  std::vector<float> margin, top;
};
Greedy greedy_with_margins(const TargetModel& m, const std::vector<int32_t>& prompt, int n) {
  const int V = m.cfg.vocab;
  TargetDecoder plain(m, {int64_t(prompt.size()) + n + 1, int64_t(prompt.size()), 1}, {});
  Greedy g;
  plain.step(prompt);
  plain.commit(int64_t(prompt.size()));
  for (int i = 0; i < n; ++i) {
    const std::vector<float> lg = plain.logits_host();
    const float* row = &lg[lg.size() - size_t(V)];
    std::vector<float> sorted(row, row + V);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    g.tokens.push_back(int32_t(std::max_element(row, row + V) - row));
    g.margin.push_back(sorted[0] - sorted[1]);
    g.top.push_back(sorted[0]);
    plain.step({g.tokens.back()});
    plain.commit(1);
  }
  return g;
}

// `got` must equal the greedy tokens, or part from them only where the target's top two logits are within two
// bf16 ulps of each other (bf16 rounding of a differently batched GEMM may pick the other one there); the
// sequences differ from that point on, so only the first difference is judged.
void expect_greedy_up_to_a_near_tie(const std::vector<int32_t>& got, const Greedy& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.tokens.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == want.tokens[i]) continue;
    // One bf16 ulp of x: 2^(floor(log2 |x|) − 7).
    const float ulp = std::ldexp(1.0f, std::ilogb(std::max(std::fabs(want.top[i]), 1e-6f)) - 7);
    EXPECT_LE(want.margin[i], 2 * ulp) << what << ": token " << i << " is " << got[i] << ", greedy "
                                       << want.tokens[i] << " with a clear margin " << want.margin[i];
    std::printf("[ decode ] %s: tokens part at %zu (a near tie, margin %.3g)\n", what.c_str(), i,
                double(want.margin[i]));
    return;
  }
}

std::vector<int> all_layers(const QwenConfig& c) {
  std::vector<int> l;
  for (int i = 0; i < c.layers; ++i) l.push_back(i);
  return l;
}

}  // namespace

TEST_P(TargetDecodeCuda, ForwardMatchesFp32WithinBf16Error) {
  // Every shape runs on CUDA (tiled or general kernels) and stays within bf16's own error against the fp32
  // forward of the same draws. Bounds: 1.25 × what Hugging Face's bf16 forward itself shows against its fp32 on
  // random tiny models (shared/device/README.md: 8–11 % rel-RMS on random Qwen3.5 hybrids, whose random
  // DeltaNet gates amplify rounding; dense Qwen3 ~1e-2), i.e. 0.14 for hybrids; 8e-2 for dense models, the
  // golden test's bound. A wrong kernel, layout or head mapping is off by O(1).
  const QwenConfig c = cfg();
  CpuOps cpu(CpuGdnMode::recurrent);
  auto mg = target_random(c, 41, *gpu_, with_lm_head());
  auto mc = target_random(c, 41, cpu, with_lm_head());
  for (int n : {1, 63, 64, 65, 257}) {
    const std::vector<int32_t> ids = random_ids(n, c.vocab, uint32_t(n));
    const FwdResult gold = run_model(*mc, cpu, ids, {n}, c.layers, true);
    const FwdResult fwd = run_model(*mg, *gpu_, ids, {int32_t(ids.size())}, c.layers, true);
    const double bound = c.family == ModelFamily::qwen3_5 ? 0.14 : 8e-2;
    double worst = 0;
    for (int l = 0; l < c.layers; ++l) {
      const double e = rel_rms(fwd.taps[size_t(l)], gold.taps[size_t(l)]);
      worst = std::max(worst, e);
      EXPECT_LE(e, bound) << "tokens " << n << " tap " << l;
    }
    const double ef = rel_rms(fwd.final_norm, gold.final_norm);
    EXPECT_LE(ef, bound) << "tokens " << n << " final norm";
    std::printf("[ forward] %-11s %3d tokens: worst tap rel-RMS %.3e, final norm %.3e (bound %.2f)\n",
                kFamilyNames[GetParam()], n, worst, ef, bound);
  }
}

TEST_P(TargetDecodeCuda, StepsReproduceTheFullForward) {
  const QwenConfig c = cfg();
  CpuOps cpu(CpuGdnMode::recurrent);
  auto mg = target_random(c, 23, *gpu_, with_lm_head());
  auto mc = target_random(c, 23, cpu, with_lm_head());  // the same draws, unrounded: the fp32 golden
  const std::vector<int32_t> ids = random_ids(23, c.vocab, 4);
  const FwdResult gold = run_model(*mc, cpu, ids, {23}, c.layers, true);
  const std::vector<float> gold_logits = host_logits(*mc, cpu, gold.final_norm);
  const FwdResult fwd = run_model(*mg, *gpu_, ids, {int32_t(ids.size())}, c.layers, true);
  const std::vector<float> fwd_logits = host_logits(*mg, *gpu_, fwd.final_norm);

  TargetDecoder dec(*mg, {32, 8, 8}, all_layers(c));
  const int64_t H = c.hidden, V = c.vocab;
  std::vector<std::vector<float>> taps(size_t(c.layers));
  std::vector<float> logits;
  int64_t done = 0;
  for (int64_t n : {5, 1, 7, 3, 7}) {
    dec.step(std::vector<int32_t>(ids.begin() + done, ids.begin() + done + n));
    const std::vector<float> lg = down(dec.logits());
    ASSERT_EQ(int64_t(lg.size()), n * V);
    logits.insert(logits.end(), lg.begin(), lg.end());
    for (int l = 0; l < c.layers; ++l) {
      const std::vector<float> t = down(dec.tap(size_t(l)));
      ASSERT_EQ(int64_t(t.size()), n * H);
      taps[size_t(l)].insert(taps[size_t(l)].end(), t.begin(), t.end());
    }
    dec.commit(n);
    done += n;
  }
  EXPECT_EQ(dec.length(), 23);
  // Decoding and the forward make the same bf16 roundings of weights and activations; they differ in the
  // kernels' internal precision (decode keeps P and the DeltaNet products in fp32, the prefill kernels round
  // P / use bf16 hi+lo MMA products). So decoding may be no worse than the forward against fp32: 1.25x its
  // error (the anchor factor), plus 1e-3 (a quarter of a bf16 ulp) for taps the forward gets almost
  // exactly. The decoder's logits come from its own bf16 lm_head GEMM, the forward's here from host fp32
  // products of its bf16 final norm: the same bound covers that one extra rounding.
  auto expect_bounded = [&](const std::vector<float>& dec_v, const std::vector<float>& fwd_v,
                            const std::vector<float>& gold_v, const std::string& what) {
    const double e_dec = rel_rms(dec_v, gold_v), e_fwd = rel_rms(fwd_v, gold_v), e_df = rel_rms(dec_v, fwd_v);
    std::printf("[ decode ] %-12s rel-RMS vs fp32: decode %.3e, forward %.3e; decode vs forward %.3e\n",
                what.c_str(), e_dec, e_fwd, e_df);
    EXPECT_LE(e_dec, 1.25 * e_fwd + 1e-3) << what;
  };
  for (int l = 0; l < c.layers; ++l)
    expect_bounded(taps[size_t(l)], fwd.taps[size_t(l)], gold.taps[size_t(l)], "tap " + std::to_string(l));
  expect_bounded(logits, fwd_logits, gold_logits, "logits");
}

TEST_P(TargetDecodeCuda, RollbackEqualsFreshPrefill) {
  auto m = target_random(cfg(), 5, *gpu_, with_lm_head());
  const RollbackRun r = rollback_vs_fresh_prefill(*m);
  // The recurrence and the attention rows do the same arithmetic on both paths; the GEMMs see other row
  // counts (one cuBLASLt algorithm per M bucket, so the same here, but not promised): at most a few bf16
  // roundings apart, 1e-2 relative RMS (2.5 roundings of 2^-9).
  const double e_logits = rel_rms(r.spec_logits, r.fresh_logits);
  std::printf("[ decode ] rollback vs fresh prefill: logits rel-RMS %.3e\n", e_logits);
  EXPECT_LE(e_logits, 1e-2);
  for (size_t i = 0; i < 2; ++i) EXPECT_LE(rel_rms(r.spec_taps[i], r.fresh_taps[i]), 1e-2) << "tap " << i;
  EXPECT_EQ(r.spec_length, 12);
}

namespace {

// Speculative decoding of one prompt with a random CUDA drafter (block B) of `kind` commits the CUDA target's
// plain greedy tokens. Verification scores B rows at once, plain decoding one: the same row arithmetic up to
// the GEMM's row count.
void expect_spec_decoding_is_greedy(CudaOps& gpu, const QwenConfig& c, DrafterKind kind, int B = 4,
                                    DrafterMarkovHead markov = DrafterMarkovHead::vanilla,
                                    double confidence_threshold = 0) {
  auto target = target_random(c, 31, gpu, with_lm_head());
  const std::vector<int32_t> prompt = random_ids(11, c.vocab, 2);
  const int n = 24;
  const Greedy greedy = greedy_with_margins(*target, prompt, n);
  CudaTrainOps tops(0);
  DrafterConfig dc = kind == DrafterKind::domino    ? df::testing::tiny_domino_config()
                     : kind == DrafterKind::dspark  ? df::testing::tiny_dspark_config(markov, 3, true)
                     : kind == DrafterKind::dflash2 ? df::testing::tiny_dflash2_config(std::min(8, c.vocab))
                                                    : df::testing::tiny_drafter_config();
  if (kind == DrafterKind::dflash2 && c.hidden % dc.conv_group_size != 0) dc.conv_group_size = 1;
  dc.sliding_window = std::max(dc.sliding_window, B);  // a block must see itself
  dc.hidden = c.hidden;
  dc.vocab = c.vocab;
  dc.mask_token_id = c.vocab - 1;
  dc.head_dim = 16;
  dc.target_layer_ids = {0, c.layers - 1};
  dc.block_size = B;
  DrafterModel drafter(dc, tops);
  drafter_init_params(drafter, 5);
  drafter.set_frozen(target->embed, target->lm_head);
  DFlashBlockDrafter bd(drafter, confidence_threshold);
  SpecDecoder spec(*target, bd, 11, n);
  const SpecPromptResult r = spec.run(prompt);
  const std::string what = std::string("speculative decoding, ") + drafter_kind_name(kind) + " drafter, block " +
                           std::to_string(B) + (confidence_threshold > 0 ? ", confidence verify length" : "");
  if (confidence_threshold > 0)
    EXPECT_LT(r.verified, int64_t(r.accept_lengths.size()) * (B - 1))
        << what << ": the verify length cut no block";
  expect_greedy_up_to_a_near_tie(r.tokens, greedy, what);
  for (int a : r.accept_lengths) {
    EXPECT_GE(a, 1);
    EXPECT_LE(a, B);
  }
  std::printf("[ decode ] random CUDA %s drafter: tau %.3f over %zu blocks\n", drafter_kind_name(kind),
              r.tau(), r.accept_lengths.size());
}

}  // namespace

TEST_P(TargetDecodeCuda, SpeculativeDecodingCommitsTheGreedyTokens) {
  expect_spec_decoding_is_greedy(*gpu_, cfg(), DrafterKind::dflash);
}

// The same with a Domino drafter: its proposals come token by token from the GRU over its own drafts
// (CudaTrainOps::domino_head_propose); whatever they are, the committed tokens stay the target's.
TEST_P(TargetDecodeCuda, DominoSpeculativeDecodingCommitsTheGreedyTokens) {
  expect_spec_decoding_is_greedy(*gpu_, cfg(), DrafterKind::domino);
}

// The same with a DSpark drafter: Markov-biased proposals token by token on the device
// (CudaTrainOps::dspark_head_propose), every proposal verified, and with the confidence-based verify length
// (at 0.4 the block ends once the predicted prefix survival drops below it, so fewer are verified).
TEST_P(TargetDecodeCuda, DSparkSpeculativeDecodingCommitsTheGreedyTokens) {
  for (DrafterMarkovHead type : {DrafterMarkovHead::vanilla, DrafterMarkovHead::gated, DrafterMarkovHead::rnn})
    for (double threshold : {0.0, 0.4}) {
      SCOPED_TRACE(std::string(drafter_markov_head_name(type)) + " threshold " + std::to_string(threshold));
      expect_spec_decoding_is_greedy(*gpu_, cfg(), DrafterKind::dspark, 4, type, threshold);
    }
}

// The same with a DFlash2 drafter at the public checkpoints' block 8 and at 16: its proposals walk the
// selector's lattice on the device (CudaTrainOps::dflash2_selector_propose).
TEST_P(TargetDecodeCuda, Dflash2SpeculativeDecodingCommitsTheGreedyTokens) {
  for (const int B : {8, 16}) expect_spec_decoding_is_greedy(*gpu_, cfg(), DrafterKind::dflash2, B);
}

TEST_P(TargetDecodeCuda, BatchedGenerationEqualsOneAtATime) {
  // eval --generate on the GPU: prompts of different lengths side by side (one slot left without a prompt),
  // each continuation the target's greedy decoding of its prompt alone, up to a near tie.
  const QwenConfig c = cfg();
  auto target = target_random(c, 35, *gpu_, with_lm_head());
  const std::vector<std::vector<int32_t>> prompts{random_ids(7, c.vocab, 1), random_ids(3, c.vocab, 2),
                                                  random_ids(11, c.vocab, 3)};
  const int n = 12;
  TargetDecoder batch(*target, {11 + n, 11, 1, 4}, {});
  std::vector<Rng> rngs(3, Rng(0));
  const auto got = target_generate(batch, prompts, n, {}, rngs);
  ASSERT_EQ(got.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i)
    expect_greedy_up_to_a_near_tie(got[i], greedy_with_margins(*target, prompts[i], n),
                                   "batched generation, prompt " + std::to_string(i));
}

INSTANTIATE_TEST_SUITE_P(Shapes, TargetDecodeCuda, ::testing::Range(0, 10),
                         [](const ::testing::TestParamInfo<int>& i) {
                           return std::string(kFamilyNames[i.param]);
                         });

#endif  // DF_HAVE_CUDA
