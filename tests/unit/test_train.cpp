// The training pieces around the drafter: config validation, the parameter table, anchor sampling, loss
// weights (offset decay, streak) and τ, the LR and noise schedules, AdamW against hand-computed values, and a
// short run on a learnable synthetic signal where the loss must fall.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "test_drafter_util.h"
#include "ops/loss_rows.h"
#include "train/optimizer.h"

using namespace df;
using namespace df::testing;

namespace {

// Expects fn to throw a df::Error whose message contains `needle` (the field the user must fix).
template <class F>
void expect_error_naming(F fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no error; expected one naming " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(DrafterConfig, ValidationNamesTheField) {
  auto bad = [](auto mutate, const char* field) {
    DrafterConfig c = tiny_drafter_config();
    mutate(c);
    expect_error_naming([&] { drafter_config_validate(c); }, field);
  };
  bad([](DrafterConfig& c) { c.kv_heads = 3; }, "num_key_value_heads");
  bad([](DrafterConfig& c) { c.mask_token_id = 37; }, "mask_token_id");
  bad([](DrafterConfig& c) { c.layer_types.pop_back(); }, "layer_types");
  bad([](DrafterConfig& c) { c.sliding_window = 3; }, "sliding_window");
  bad([](DrafterConfig& c) { c.head_dim = 7; }, "head_dim");
  bad([](DrafterConfig& c) { c.block_size = 1; }, "block_size");
  bad([](DrafterConfig& c) { c.target_layer_ids.clear(); }, "target_layer_ids");
  bad([](DrafterConfig& c) { c.hidden = 0; }, "hidden_size");
  EXPECT_NO_THROW(drafter_config_validate(tiny_drafter_config()));
}

TEST(DrafterConfig, DefaultTapsMatchTheReleasedDrafter) {
  EXPECT_EQ(drafter_default_target_layer_ids(64, 5), (std::vector<int>{1, 16, 31, 46, 61}));
  EXPECT_EQ(drafter_default_target_layer_ids(36, 5), (std::vector<int>{1, 9, 17, 25, 33}));
}

TEST(DrafterParams, TableHasTheExportNamesAndTilesTheBuffer) {
  const DrafterConfig c = tiny_drafter_config();
  const DrafterParamTable t = drafter_param_table(c);
  const int64_t H = c.hidden, I = c.intermediate, qd = c.heads * c.head_dim, kvd = c.kv_heads * c.head_dim;
  const int64_t per_layer = qd * H + 2 * kvd * H + H * qd + 3 * I * H + 2 * H + 2 * c.head_dim;
  int64_t sum = 0, prev_end = 0;
  bool in_vectors = false;
  for (const auto& e : t.entries) {
    sum += e.rows * e.cols;
    EXPECT_EQ(e.offset % 64, 0) << e.name;
    EXPECT_GE(e.offset, prev_end) << e.name << " overlaps the previous tensor";
    prev_end = e.offset + e.rows * e.cols;
    if (!e.decay) in_vectors = true;
    EXPECT_FALSE(in_vectors && e.decay) << e.name << ": decayed tensors must come first";
    if (e.decay) EXPECT_LE(prev_end, t.n_decay) << e.name;
  }
  EXPECT_LE(prev_end, t.total);
  EXPECT_EQ(sum, H * H * c.num_taps() + H + H + c.layers * per_layer);
  for (const char* n : {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.1.self_attn.q_proj.weight",
                        "layers.1.self_attn.k_proj.weight", "layers.1.self_attn.v_proj.weight",
                        "layers.1.self_attn.o_proj.weight", "layers.1.self_attn.q_norm.weight",
                        "layers.1.self_attn.k_norm.weight", "layers.1.input_layernorm.weight",
                        "layers.1.post_attention_layernorm.weight", "layers.1.mlp.gate_proj.weight",
                        "layers.1.mlp.up_proj.weight", "layers.1.mlp.down_proj.weight"})
    EXPECT_NO_THROW(t.find(n)) << n;
  EXPECT_EQ(t.find("fc.weight").cols, 2 * H);
  EXPECT_EQ(t.find("layers.0.self_attn.k_proj.weight").rows, kvd);
  expect_error_naming([&] { t.find("layers.2.mlp.up_proj.weight"); }, "layers.2.mlp.up_proj.weight");
}

TEST(DrafterParams, InitIsDeterministicFromTheSeed) {
  CpuTrainOps ops;
  DrafterModel a(tiny_drafter_config(), ops), b(tiny_drafter_config(), ops), c(tiny_drafter_config(), ops);
  drafter_init_params(a, 3);
  drafter_init_params(b, 3);
  drafter_init_params(c, 4);
  const int64_t n = a.table().total;
  EXPECT_EQ(0, std::memcmp(a.params.data, b.params.data, size_t(n) * 4));
  EXPECT_NE(0, std::memcmp(a.params.data, c.params.data, size_t(n) * 4));
  EXPECT_EQ(a.w.norm.ptr<float>()[5], 1.0f);
  double ss = 0;
  for (int64_t i = 0; i < a.w.fc.numel(); ++i) ss += double(a.w.fc.ptr<float>()[i]) * a.w.fc.ptr<float>()[i];
  // 512 draws of N(0, 0.02²): the sample std is within 10% of 0.02 with overwhelming probability.
  EXPECT_NEAR(std::sqrt(ss / double(a.w.fc.numel())), 0.02, 0.002);
}

TEST(Anchors, SampledWhereTwoMaskedTokensAndSorted) {
  Rng rng(1);
  for (int64_t len : {1, 2, 3, 7, 19, 65}) {
    std::vector<uint8_t> mask(static_cast<size_t>(len));
    for (int64_t t = 0; t < len; ++t) mask[size_t(t)] = (t % 5 != 3);
    int64_t cand = 0;
    for (int64_t a = 0; a + 1 < len; ++a) cand += mask[size_t(a)] && mask[size_t(a + 1)];
    for (int max_anchors : {0, 1, 4, 100}) {
      auto an = anchors_sample_sequence(mask.data(), len, max_anchors, rng);
      EXPECT_EQ(int64_t(an.size()), std::min<int64_t>(cand, max_anchors)) << "len " << len;
      for (size_t i = 0; i < an.size(); ++i) {
        EXPECT_TRUE(an[i] + 1 < len && mask[size_t(an[i])] && mask[size_t(an[i] + 1)]) << an[i];
        if (i) EXPECT_LT(an[i - 1], an[i]);
      }
    }
  }
}

TEST(Anchors, UniformWithoutReplacement) {
  Rng rng(2);
  std::vector<uint8_t> mask(8, 1);  // 7 candidates, choose 3
  std::vector<int> hits(7, 0);
  const int draws = 21000;
  for (int i = 0; i < draws; ++i)
    for (int32_t a : anchors_sample_sequence(mask.data(), 8, 3, rng)) hits[size_t(a)]++;
  // Each position is chosen with probability 3/7: 9000 expected, binomial std ≈ 72; 5σ ≈ 360.
  for (int h : hits) EXPECT_NEAR(h, 9000, 360);
}

// A batch's anchors are padded to a multiple of the requested group and a length-1 sequence gets none. (No
// RNG state is checkpointed: every draw is keyed by (seed, global batch); tests/mpi/test_train_resume.sh
// shows a resume continuing bit-identically.)
TEST(Anchors, BatchPaddingAndShortSequences) {
  TinySetup s({11, 1, 13});
  Rng a(9);
  auto x = anchors_sample_batch(s.batch, 3, a, 4);
  EXPECT_EQ(x.size() % 4, 0u);
  EXPECT_EQ(x.back().pos, -1);  // 3 + 0 + 3 anchors padded to 8
  for (const auto& an : x) EXPECT_NE(an.seq, 1);  // the length-1 sequence has no anchor
}

TEST(Loss, OffsetWeightsAndStreak) {
  EXPECT_FLOAT_EQ(loss_offset_weight(1, 7), 1.0f);
  EXPECT_FLOAT_EQ(loss_offset_weight(8, 7), float(std::exp(-1.0)));
  // One block of 4: offset 0 is the anchor, offset 2 unlabelled.
  std::vector<float> w = {0, 1, 0.5f, 0.25f};
  std::vector<uint8_t> lab = {0, 1, 0, 1};
  std::vector<float> p = {0.9f, 0.64f, 0.3f, 0.5f};
  loss_apply_streak(w, lab, p, 4, 0.5f);
  EXPECT_FLOAT_EQ(w[1], 1.0f);          // nothing before it
  EXPECT_FLOAT_EQ(w[2], 0.5f * 0.8f);   // √0.64
  EXPECT_FLOAT_EQ(w[3], 0.25f * 0.8f);  // offset 2 has no label: contributes 1
  expect_error_naming([&] { loss_apply_streak(w, lab, p, 4, 0.0f); }, "streak_alpha");
}

TEST(Loss, AccuracyAndTau) {
  LossStats st;
  // Two blocks of 4. Block 0: offsets 1, 2 correct, 3 wrong → τ = 3. Block 1: offset 1 wrong → τ = 1.
  std::vector<uint8_t> lab = {0, 1, 1, 1, 0, 1, 1, 0};
  std::vector<int32_t> label = {0, 5, 6, 7, 0, 1, 2, 0};
  std::vector<int32_t> am = {-1, 5, 6, 9, -1, 4, 2, -1};
  loss_count_accuracy(st, lab, am, label, 4);
  EXPECT_EQ(st.count, (std::vector<int64_t>{2, 2, 1}));
  EXPECT_EQ(st.correct, (std::vector<int64_t>{1, 2, 0}));
  EXPECT_EQ(st.tau_blocks, 2);
  EXPECT_DOUBLE_EQ(st.tau(), 2.0);
  LossStats sum;
  sum.merge(st);
  sum.merge(st);
  EXPECT_EQ(sum.tau_blocks, 4);
  EXPECT_EQ(sum.correct[1], 4);
}

TEST(Schedule, WarmupThenCosineToZero) {
  OptimConfig o;
  o.lr = 1.0f;
  o.warmup_steps = 4;
  o.total_steps = 20;
  EXPECT_FLOAT_EQ(lr_at(o, 0), 0.25f);
  EXPECT_FLOAT_EQ(lr_at(o, 3), 1.0f);
  EXPECT_FLOAT_EQ(lr_at(o, 4), 1.0f);
  EXPECT_FLOAT_EQ(lr_at(o, 12), 0.5f);
  EXPECT_NEAR(lr_at(o, 8), 0.5 * (1 + std::cos(M_PI / 4)), 1e-6);
  EXPECT_FLOAT_EQ(lr_at(o, 20), 0.0f);
  EXPECT_FLOAT_EQ(lr_at(o, 25), 0.0f);
  o.warmup_steps = 0;
  EXPECT_FLOAT_EQ(lr_at(o, 0), 1.0f);
  o.warmup_steps = 30;
  expect_error_naming([&] { lr_at(o, 0); }, "warmup_steps");
  EXPECT_FLOAT_EQ(noise_std_at(0.2f, 0, 10), 0.2f);
  EXPECT_FLOAT_EQ(noise_std_at(0.2f, 5, 10), 0.1f);
  EXPECT_FLOAT_EQ(noise_std_at(0.2f, 10, 10), 0.0f);
}

TEST(AdamW, TwoStepsMatchHandComputation) {
  CpuTrainOps ops;
  std::vector<float> p = {0.5f, -1.0f, 2.0f, 0.1f, 3.0f}, g = {0.2f, -0.4f, 1e-3f, 0.0f, -2.0f}, m(5, 0), v(5, 0);
  auto t = [](std::vector<float>& x) { return tensor_make(x.data(), DType::f32, Device::cpu, 1, 5); };
  TrainOps::AdamW hp;
  hp.lr = 0.1f;
  hp.weight_decay = 0.5f;
  hp.n_decay = 3;  // the last two elements are "norm weights"
  hp.grad_scale = 0.5f;
  std::vector<double> P(p.begin(), p.end()), M(5, 0), V(5, 0);
  for (int64_t step = 1; step <= 2; ++step) {
    hp.step_t = step;
    ops.adamw(t(p), t(g), t(m), t(v), Tensor{}, hp);
    for (int i = 0; i < 5; ++i) {
      const double gi = 0.5 * g[size_t(i)];
      M[size_t(i)] = 0.9 * M[size_t(i)] + 0.1 * gi;
      V[size_t(i)] = 0.999 * V[size_t(i)] + 0.001 * gi * gi;
      const double mh = M[size_t(i)] / (1 - std::pow(0.9, step)), vh = V[size_t(i)] / (1 - std::pow(0.999, step));
      P[size_t(i)] -= 0.1 * (mh / (std::sqrt(vh) + 1e-8) + (i < 3 ? 0.5 * P[size_t(i)] : 0.0));
      // fp32 state: a few ulp of values of order 1.
      EXPECT_NEAR(p[size_t(i)], P[size_t(i)], 1e-6) << "step " << step << " element " << i;
      EXPECT_NEAR(m[size_t(i)], M[size_t(i)], 1e-7);
    }
  }
  EXPECT_FLOAT_EQ(p[3], 0.1f);  // zero gradient and no decay: untouched
}

TEST(AdamW, StepClipsToTheGlobalNorm) {
  TinySetup s;
  std::vector<float> before(s.params(), s.params() + s.model->table().total);
  for (int64_t i = 0; i < s.model->table().total; ++i) s.grads()[i] = 1.0f;  // padding included: norm = √total
  OptimConfig o;
  o.lr = 1e-2f;
  o.clip = 1.0f;
  o.total_steps = 10;
  AdamwStepResult r = adamw_step(*s.model, o, 0, 0.5);
  EXPECT_NEAR(r.grad_norm, 0.5 * std::sqrt(double(s.model->table().total)), 1e-3);
  EXPECT_NEAR(r.clip_scale, 1.0 / r.grad_norm, 1e-6);
  EXPECT_FLOAT_EQ(r.lr, 1e-2f);
  // First Adam step moves every element by lr·sign(g) (bias correction cancels the scale).
  EXPECT_NEAR(s.params()[5] - before[5], -1e-2, 1e-6);
  expect_error_naming([&] { adamw_step(*s.model, o, 1, 0.0); }, "grad_scale");
}

// A learnable signal: tokens follow x[t+1] = (5·x[t] + 3) mod 36, so the anchor token fixes the whole block;
// taps are a fixed random feature of each token. 60 steps of AdamW must cut the loss well below its start.
TEST(DrafterTraining, LossFallsOnALearnableSignal) {
  DrafterConfig cfg = tiny_drafter_config();
  CpuTrainOps ops;
  DrafterModel model(cfg, ops);
  drafter_init_params(model, 1);
  const int64_t H = cfg.hidden, K = H * cfg.num_taps();
  auto embed = normal_vec(size_t(cfg.vocab * H), 1.0f, 2), lm_head = normal_vec(size_t(cfg.vocab * H), 0.5f, 3);
  auto tap_table = normal_vec(size_t(cfg.vocab * K), 1.0f, 4);
  model.set_frozen(tensor_make(embed.data(), DType::f32, Device::cpu, cfg.vocab, H),
                   tensor_make(lm_head.data(), DType::f32, Device::cpu, cfg.vocab, H));
  plan_workspace(model, 23 + 31 + 17 + 29, 4 * 8);
  OptimConfig o;
  o.lr = 1e-2f;
  o.warmup_steps = 5;
  o.total_steps = 60;
  Rng rng(5);
  std::vector<double> losses;
  std::vector<float> taps;
  double first_tau = 0, last_tau = 0;
  for (int64_t step = 0; step < o.total_steps; ++step) {
    DrafterBatch b;
    b.offsets = {0};
    for (int64_t len : {23, 31, 17, 29}) {
      int32_t x = int32_t(rng.below(36));
      for (int64_t t = 0; t < len; ++t, x = (5 * x + 3) % 36) {
        b.tokens.push_back(x);
        b.loss_mask.push_back(1);
      }
      b.offsets.push_back(b.offsets.back() + len);
    }
    const int64_t T = b.offsets.back();
    taps.resize(size_t(T * K));
    for (int64_t t = 0; t < T; ++t)
      std::copy_n(&tap_table[size_t(b.tokens[size_t(t)] * K)], K, &taps[size_t(t * K)]);
    b.taps = tensor_make(taps.data(), DType::f32, Device::cpu, T, K);
    drafter_begin_step(model);
    DrafterLossOptions lo;
    lo.gamma = 4.0f;
    LossStats st = drafter_forward_backward(model, b, anchors_sample_batch(b, 8, rng), lo);
    drafter_grads_ready(model);
    ASSERT_TRUE(std::isfinite(st.loss_sum));
    losses.push_back(st.mean_loss());
    (step < 5 ? first_tau : last_tau) += step < 5 || step >= o.total_steps - 5 ? st.tau() / 5 : 0.0;
    adamw_step(model, o, step, 1.0 / st.weight_sum);
  }
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) {
    first += losses[size_t(i)] / 5;
    last += losses[losses.size() - 1 - size_t(i)] / 5;
  }
  std::printf("drafter training: loss %.3f -> %.3f, tau %.2f -> %.2f over %lld steps\n", first, last, first_tau,
              last_tau, (long long)o.total_steps);
  // Random frozen lm_head (std 0.5 over 16 normalised dims: logits of std ≈ 2) starts above ln 37 ≈ 3.6.
  EXPECT_GT(first, std::log(37.0));
  EXPECT_LT(last, 0.5 * first);
  EXPECT_GT(last_tau, first_tau);
}
