// Domino's head oracle (ops/domino_head.h) and the whole CPU Domino step against SpecForge's own
// OnlineDominoModel: the golden files of `make_drafter_golden.py --kind domino` hold the backbone's normed
// output of every block and the gradient of the loss with respect to it, so the head and its loss are checked
// alone, with the block rows (labels, weights) built from the packed tokens as our step builds them; then the
// step from the drafter folder on. Loss rel ≤ 1e-5, every gradient rel-RMS ≤ 1e-4, as the DFlash golden
// holds.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "drafter_golden_util.h"
#include "ops/cpu/cpu_train_ops.h"
#include "ops/domino_head.h"

using namespace df;
using df::drafter_golden::read_f32;
using df::drafter_golden::read_raw;

namespace {

const std::string kDir = std::string(DF_SOURCE_DIR) + "/tests/golden/drafter_domino";
constexpr const char* kMissing =
    "tests/golden/drafter_domino/ is absent: run `python3 tests/golden/make_drafter_golden.py --kind domino` "
    "where torch, transformers and .peer/SpecForge exist (the GPU machine) and commit "
    "tests/golden/drafter_domino/";

double rel_rms(const std::vector<float>& got, const std::vector<float>& want) {
  double e = 0, r = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    e += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    r += double(want[i]) * want[i];
  }
  return std::sqrt(e / std::max(r, 1e-300));
}

}  // namespace

TEST(DominoGolden, HeadLossAndGradientsMatchSpecForge) {
  if (!std::filesystem::exists(kDir + "/golden.safetensors")) GTEST_SKIP() << kMissing;
  const DrafterConfig cfg = drafter_config_load_hf(kDir + "/model");
  ASSERT_EQ(cfg.kind, DrafterKind::domino);
  const DominoHeadDims d = domino_head_dims(cfg);
  const SafetensorsIndex g = SafetensorsIndex::open(kDir + "/golden.safetensors");
  const SafetensorsIndex m = SafetensorsIndex::open(kDir + "/model");
  const int H = d.hidden, B = d.block_size;

  const std::vector<int64_t> offsets = read_raw<int64_t>(g, "offsets", DType::i64);
  const std::vector<int32_t> anchors = read_raw<int32_t>(g, "anchors", DType::i32),
                             tokens = read_raw<int32_t>(g, "tokens", DType::i32),
                             prev_ids = read_raw<int32_t>(g, "prev_ids", DType::i32);
  const std::vector<uint8_t> loss_mask = read_raw<uint8_t>(g, "loss_mask", DType::u8);
  const std::vector<float> hidden = read_f32(g, "hidden"), embed = read_f32(g, "embed"),
                           lm_head = read_f32(g, "lm_head"), weight_mask = read_f32(g, "weight_mask");
  const double gamma = read_f32(g, "gamma")[0], lambda = read_f32(g, "lambda_base")[0];
  const int64_t blocks = int64_t(anchors.size()) / 2;
  ASSERT_EQ(int64_t(hidden.size()), blocks * B * H);

  const char* names[4] = {"prefix_gru.weight_ih_l0", "prefix_gru.weight_hh_l0", "embed_proj.0.weight",
                          "embed_proj.2.weight"};
  std::vector<float> w[4], grad[4];
  for (int i = 0; i < 4; ++i) {
    const StTensor* t = m.find(names[i]);
    ASSERT_TRUE(t) << names[i];
    w[i].resize(size_t(t->numel()));
    st_to_f32(*t, w[i].data());
    grad[i].assign(w[i].size(), 0.0f);
  }
  const DominoHeadTensors<const float> weights{w[0].data(), w[1].data(), w[2].data(), w[3].data()};
  const DominoHeadTensors<float> grads{grad[0].data(), grad[1].data(), grad[2].data(), grad[3].data()};
  std::vector<float> dz(hidden.size(), 0.0f), emb(size_t(B) * H);
  double final_sum = 0, base_sum = 0, weight_sum = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t seq = anchors[size_t(2 * b)], pos = anchors[size_t(2 * b + 1)];
    const int64_t start = offsets[size_t(seq)], len = offsets[size_t(seq + 1)] - start;
    const DominoBlockRows rows =
        domino_block_rows(d, tokens.data() + start, loss_mask.data() + start, len, pos, gamma);
    for (int k = 0; k < B; ++k) {
      const double want = weight_mask[size_t(b * B + k)];
      ASSERT_NEAR(rows.weights[size_t(k)], want, 1e-6 * std::max(1.0, want))
          << "block " << b << " slot " << k;
      weight_sum += rows.weights[size_t(k)];
      // SpecForge reads padding past a sequence's end where we read its last token: only weightless slots.
      if (rows.weights[size_t(k)] > 0) {
        ASSERT_EQ(rows.inputs[size_t(k)], prev_ids[size_t(b * B + k)]) << "block " << b << " slot " << k;
      }
      const int64_t tok = prev_ids[size_t(b * B + k)];
      std::copy_n(embed.begin() + tok * H, H, emb.begin() + int64_t(k) * H);
    }
    const DominoBlockLoss l =
        domino_block_step<float>(d, weights, lm_head.data(), hidden.data() + b * B * H, emb.data(), rows,
                                 lambda, nullptr, &grads, dz.data() + b * B * H);
    final_sum += l.final_sum;
    base_sum += l.base_sum;
  }
  const double den = weight_sum + 1e-6;  // SpecForge's valid_token_count
  EXPECT_NEAR(final_sum / den, read_f32(g, "final_loss")[0], 1e-5 * read_f32(g, "final_loss")[0]);
  EXPECT_NEAR(base_sum / den, read_f32(g, "base_loss")[0], 1e-5 * read_f32(g, "base_loss")[0]);
  const double loss = ((1 - lambda) * final_sum + lambda * base_sum) / den, want = read_f32(g, "loss")[0];
  EXPECT_NEAR(loss, want, 1e-5 * want);
  for (float& x : dz) x = float(x / den);
  EXPECT_LE(rel_rms(dz, read_f32(g, "grad.hidden")), 1e-4) << "grad.hidden";
  for (int i = 0; i < 4; ++i) {
    for (float& x : grad[i]) x = float(x / den);
    EXPECT_LE(rel_rms(grad[i], read_f32(g, std::string("grad.") + names[i])), 1e-4) << names[i];
  }
}

// The whole CPU Domino step (backbone, head, both CE terms at the golden's λ) on the golden's inputs, the
// drafter read through drafter.init_from: which rows carry loss, Σ w, the loss (rel ≤ 1e-5) and every
// parameter's gradient (rel-RMS ≤ 1e-4) against SpecForge's OnlineDominoModel.
TEST(DominoGolden, WholeStepMatchesSpecForge) {
  if (!std::filesystem::exists(kDir + "/golden.safetensors")) GTEST_SKIP() << kMissing;
  const SafetensorsIndex g = SafetensorsIndex::open(kDir + "/golden.safetensors");
  CpuTrainOps ops;
  const df::drafter_golden::StepResult r = df::drafter_golden::run_golden_step(ops, g, kDir + "/model");
  ASSERT_EQ(r.cfg.kind, DrafterKind::domino);
  df::drafter_golden::expect_rows_and_loss(r, g, 1e-5);
  for (const auto& [name, got] : r.grads) {
    const std::vector<float> want = read_f32(g, "grad." + name);
    ASSERT_EQ(want.size(), got.size()) << name;
    EXPECT_LE(rel_rms(got, want), 1e-4) << name;
  }
}
