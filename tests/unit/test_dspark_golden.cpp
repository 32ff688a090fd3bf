// DSpark's head oracle (ops/dspark_head.h) and the whole CPU DSpark step against SpecForge's own
// OnlineDSparkModel, one golden per Markov head type: the files of `make_drafter_golden.py --kind dspark
// --markov-head H` hold the backbone's normed output of every block, the loss's gradient with respect to it
// and the target's final hidden state per token, so the head and its loss are checked alone, with the block
// rows (labels, previous tokens, weights, target positions) built from the packed tokens as our step builds
// them; then the step from the drafter folder on. Loss rel ≤ 1e-5, every gradient rel-RMS ≤ 1e-4, as the
// DFlash golden holds.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "drafter_golden_util.h"
#include "model/drafter.h"
#include "ops/cpu/cpu_train_ops.h"
#include "ops/dspark_head.h"

using namespace df;
using df::drafter_golden::describe;
using df::drafter_golden::grad_diff;
using df::drafter_golden::read_f32;
using df::drafter_golden::read_raw;

namespace {

void check_golden(const std::string& head) {
  const std::string dir = std::string(DF_SOURCE_DIR) + "/tests/golden/drafter_dspark_" + head;
  if (!std::filesystem::exists(dir + "/golden.safetensors"))
    GTEST_SKIP()
        << "tests/golden/drafter_dspark_" << head
        << "/ is absent: run `python3 tests/golden/make_drafter_golden.py --kind dspark --markov-head "
        << head
        << "` where torch, transformers and .peer/SpecForge exist (the GPU machine) and commit "
           "tests/golden/drafter_dspark_"
        << head << "/";
  const DrafterConfig cfg = drafter_config_load_hf(dir + "/model");
  ASSERT_EQ(cfg.kind, DrafterKind::dspark);
  ASSERT_EQ(drafter_markov_head_name(cfg.markov_head_type), head);
  const DSparkHeadDims d = dspark_head_dims(cfg);
  ASSERT_TRUE(d.confidence);
  const SafetensorsIndex g = SafetensorsIndex::open(dir + "/golden.safetensors");
  const SafetensorsIndex m = SafetensorsIndex::open(dir + "/model");
  const int H = d.hidden, B = d.block_size;

  const std::vector<int64_t> offsets = read_raw<int64_t>(g, "offsets", DType::i64);
  const std::vector<int32_t> anchors = read_raw<int32_t>(g, "anchors", DType::i32),
                             tokens = read_raw<int32_t>(g, "tokens", DType::i32),
                             prev_ids = read_raw<int32_t>(g, "prev_ids", DType::i32),
                             target_ids = read_raw<int32_t>(g, "target_ids", DType::i32);
  const std::vector<uint8_t> loss_mask = read_raw<uint8_t>(g, "loss_mask", DType::u8);
  const std::vector<float> hidden = read_f32(g, "hidden"), lm_head = read_f32(g, "lm_head"),
                           target_hidden = read_f32(g, "target_hidden"),
                           weight_mask = read_f32(g, "weight_mask"), alphas = read_f32(g, "alphas");
  const double gamma = read_f32(g, "gamma")[0];
  const DSparkLossAlphas alpha{alphas[0], alphas[1], alphas[2]};
  const int64_t blocks = int64_t(anchors.size()) / 2;
  ASSERT_EQ(int64_t(hidden.size()), blocks * B * H);

  // The head's tensors by their peer names, in dspark_head_params order, and the pointers into them.
  const std::vector<DSparkHeadParam> params = dspark_head_params(d);
  std::vector<std::vector<float>> w(params.size()), grad(params.size());
  DSparkHeadTensors<const float> weights;
  DSparkHeadTensors<float> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    const StTensor* t = m.find(params[i].name);
    ASSERT_TRUE(t) << params[i].name << " is not in the golden model";
    ASSERT_EQ(t->numel(), params[i].rows * params[i].cols) << params[i].name;
    w[i].resize(size_t(t->numel()));
    st_to_f32(*t, w[i].data());
    grad[i].assign(w[i].size(), 0.0f);
    const std::string& n = params[i].name;
    const auto slot = [&](const char* name, const float*& wp, float*& gp) {
      if (n == name) wp = w[i].data(), gp = grad[i].data();
    };
    slot("markov_head.markov_w1.weight", weights.markov_w1, grads.markov_w1);
    slot("markov_head.markov_w2.weight", weights.markov_w2, grads.markov_w2);
    slot("markov_head.gate_proj.weight", weights.gate_w, grads.gate_w);
    slot("markov_head.gate_proj.bias", weights.gate_b, grads.gate_b);
    slot("markov_head.joint_proj.weight", weights.joint_w, grads.joint_w);
    slot("markov_head.joint_proj.bias", weights.joint_b, grads.joint_b);
    slot("confidence_head.proj.weight", weights.conf_w, grads.conf_w);
    slot("confidence_head.proj.bias", weights.conf_b, grads.conf_b);
  }

  std::vector<float> dz(hidden.size(), 0.0f), th(size_t(B) * H);
  DSparkBlockLoss sum;
  double weight_sum = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t seq = anchors[size_t(2 * b)], pos = anchors[size_t(2 * b + 1)];
    const int64_t start = offsets[size_t(seq)], len = offsets[size_t(seq + 1)] - start;
    const DSparkBlockRows rows =
        dspark_block_rows(d, tokens.data() + start, loss_mask.data() + start, len, pos, gamma);
    for (int k = 0; k < B; ++k) {
      const size_t at = size_t(b * B + k);
      const double wk = rows.weights[size_t(k)];
      ASSERT_NEAR(wk, weight_mask[at], 1e-6 * std::max(1.0, double(weight_mask[at])))
          << "block " << b << " slot " << k;
      weight_sum += wk;
      // SpecForge reads padding past a sequence's end where we read its last token: only weightless slots.
      if (wk > 0) {
        ASSERT_EQ(rows.prev[size_t(k)], prev_ids[at]) << "block " << b << " slot " << k;
        ASSERT_EQ(rows.labels[size_t(k)], target_ids[at]) << "block " << b << " slot " << k;
      }
      std::copy_n(target_hidden.begin() + (start + rows.target_pos[size_t(k)]) * H, H,
                  th.begin() + int64_t(k) * H);
    }
    const DSparkBlockLoss l =
        dspark_block_step<float>(d, weights, lm_head.data(), hidden.data() + b * B * H, th.data(), rows,
                                 alpha, nullptr, nullptr, &grads, dz.data() + b * B * H);
    sum.ce_sum += l.ce_sum;
    sum.l1_sum += l.l1_sum;
    sum.confidence_sum += l.confidence_sum;
  }
  const double ce = read_f32(g, "ce_num")[0], l1 = read_f32(g, "l1_num")[0],
               conf = read_f32(g, "confidence_num")[0];
  EXPECT_NEAR(sum.ce_sum, ce, 1e-5 * ce);
  EXPECT_NEAR(sum.l1_sum, l1, 1e-5 * l1);
  EXPECT_NEAR(sum.confidence_sum, conf, 1e-5 * conf);
  const double den = weight_sum;  // SpecForge's global_loss_den (no epsilon)
  EXPECT_NEAR(den, read_f32(g, "loss_den")[0], 1e-6 * den);
  const double loss =
      (alpha.ce * sum.ce_sum + alpha.l1 * sum.l1_sum + alpha.confidence * sum.confidence_sum) / den;
  const double want = read_f32(g, "loss")[0];
  EXPECT_NEAR(loss, want, 1e-5 * want);
  for (float& x : dz) x = float(x / den);
  const std::vector<float> want_dz = read_f32(g, "grad.hidden");
  EXPECT_LE(grad_diff(dz, want_dz, 0, 0).rel_rms, 1e-4)
      << describe("grad.hidden", want_dz, H, grad_diff(dz, want_dz, 0, 0));
  for (size_t i = 0; i < params.size(); ++i) {
    for (float& x : grad[i]) x = float(x / den);
    const std::vector<float> want_g = read_f32(g, "grad." + params[i].name);
    const auto diff = grad_diff(grad[i], want_g, 0, 0);
    EXPECT_LE(diff.rel_rms, 1e-4) << describe(params[i].name, want_g, params[i].cols, diff);
  }
}

// The whole CPU DSpark step (backbone, Markov and confidence heads, CE + L1 + BCE with p_target from the
// target's final hidden state) on the golden's inputs, the drafter read through drafter.init_from: which rows
// carry loss, Σ w, the loss (rel ≤ 1e-5) and every parameter's gradient (rel-RMS ≤ 1e-4).
void check_whole_step(const std::string& head) {
  const std::string dir = std::string(DF_SOURCE_DIR) + "/tests/golden/drafter_dspark_" + head;
  if (!std::filesystem::exists(dir + "/golden.safetensors"))
    GTEST_SKIP() << "tests/golden/drafter_dspark_" << head << "/ is absent (see the head's test)";
  const SafetensorsIndex g = SafetensorsIndex::open(dir + "/golden.safetensors");
  CpuTrainOps ops;
  const df::drafter_golden::StepResult r = df::drafter_golden::run_golden_step(ops, g, dir + "/model");
  ASSERT_EQ(r.cfg.kind, DrafterKind::dspark);
  df::drafter_golden::expect_rows_and_loss(r, g, 1e-5);
  for (const auto& [name, got] : r.grads) {
    const std::vector<float> want = read_f32(g, "grad." + name);
    ASSERT_EQ(want.size(), got.size()) << name;
    const auto diff = grad_diff(got, want, 0, 0);
    EXPECT_LE(diff.rel_rms, 1e-4) << describe(name, want, int64_t(want.size()), diff);
  }
}

}  // namespace

TEST(DSparkGolden, WholeStepMatchesSpecForge) {
  for (const char* head : {"vanilla", "gated", "rnn"}) {
    SCOPED_TRACE(head);
    check_whole_step(head);
  }
}

TEST(DSparkGolden, VanillaHeadLossAndGradientsMatchSpecForge) {
  check_golden("vanilla");
}

TEST(DSparkGolden, GatedHeadLossAndGradientsMatchSpecForge) {
  check_golden("gated");
}

TEST(DSparkGolden, RnnHeadLossAndGradientsMatchSpecForge) {
  check_golden("rnn");
}
