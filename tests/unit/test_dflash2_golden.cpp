// DFlash2's oracles (ops/dflash2_selector.h, ops/dflash2_conv.h) against SpecForge's own
// DFlash2DraftModel and OnlineDFlashModel at the commit that holds them: the golden files of
// `make_drafter_golden.py --kind dflash2` hold the backbone's normed output of every block with the loss's
// gradient (the selector and both CE terms are checked on those, with the block rows built from the packed
// tokens as our step builds them), and every grouped convolution's inputs, outputs and their gradients (each
// convolution is checked alone), then the whole CPU step against SpecForge's. Loss rel ≤ 1e-5, every gradient
// rel-RMS ≤ 1e-4, as the DFlash golden holds.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "drafter_golden_util.h"
#include "ops/cpu/cpu_train_ops.h"
#include "ops/dflash2_conv.h"
#include "ops/dflash2_selector.h"

using namespace df;
using df::drafter_golden::grad_diff;
using df::drafter_golden::read_f32;
using df::drafter_golden::read_raw;

namespace {

const std::string kDir = std::string(DF_SOURCE_DIR) + "/tests/golden/drafter_dflash2";
constexpr const char* kMissing =
    "tests/golden/drafter_dflash2/ is absent: run `python3 tests/golden/make_drafter_golden.py --kind "
    "dflash2 "
    "--specforge .peer/SpecForge-dflash2` where torch, transformers and SpecForge 5943b2f6 exist (the GPU "
    "machine) and commit tests/golden/drafter_dflash2/";

std::vector<float> weight_of(const SafetensorsIndex& m, const std::string& name) {
  const StTensor* t = m.find(name);
  if (!t) throw std::runtime_error("model.safetensors lacks '" + name + "'; rerun make_drafter_golden.py");
  std::vector<float> v(size_t(t->numel()));
  st_to_f32(*t, v.data());
  return v;
}

double rel_rms(const std::vector<float>& got, const std::vector<float>& want) {
  return grad_diff(got, want, 0.0, 0.0).rel_rms;
}

}  // namespace

TEST(Dflash2Golden, SelectorLossAndGradientsMatchSpecForge) {
  if (!std::filesystem::exists(kDir + "/golden.safetensors")) GTEST_SKIP() << kMissing;
  const DrafterConfig cfg = drafter_config_load_hf(kDir + "/model");
  ASSERT_EQ(cfg.kind, DrafterKind::dflash2);
  const Dflash2SelectorDims d = dflash2_selector_dims(cfg);
  const SafetensorsIndex g = SafetensorsIndex::open(kDir + "/golden.safetensors");
  const SafetensorsIndex m = SafetensorsIndex::open(kDir + "/model");
  const int H = d.hidden, B = d.block_size;

  const std::vector<int64_t> offsets = read_raw<int64_t>(g, "offsets", DType::i64);
  const std::vector<int32_t> anchors = read_raw<int32_t>(g, "anchors", DType::i32),
                             tokens = read_raw<int32_t>(g, "tokens", DType::i32),
                             target_ids = read_raw<int32_t>(g, "target_ids", DType::i32),
                             predecessor_ids = read_raw<int32_t>(g, "predecessor_ids", DType::i32);
  const std::vector<uint8_t> loss_mask = read_raw<uint8_t>(g, "loss_mask", DType::u8);
  const std::vector<float> hidden = read_f32(g, "hidden"), lm_head = read_f32(g, "lm_head"),
                           weight_mask = read_f32(g, "weight_mask");
  const double gamma = read_f32(g, "gamma")[0], alpha = read_f32(g, "selector_alpha")[0];
  const int64_t blocks = int64_t(anchors.size()) / 2;
  ASSERT_EQ(int64_t(hidden.size()), blocks * B * H);

  const char* names[3] = {"candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook",
                          "candidate_selector.hidden_projection.weight"};
  std::vector<float> w[3], grad[3];
  for (int i = 0; i < 3; ++i) {
    w[i] = weight_of(m, names[i]);
    grad[i].assign(w[i].size(), 0.0f);
  }
  const Dflash2SelectorTensors<const float> weights{w[0].data(), w[1].data(), w[2].data()};
  const Dflash2SelectorTensors<float> grads{grad[0].data(), grad[1].data(), grad[2].data()};
  std::vector<float> dz(hidden.size(), 0.0f);
  double base_sum = 0, selector_sum = 0, weight_sum = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t seq = anchors[size_t(2 * b)], pos = anchors[size_t(2 * b + 1)];
    const int64_t start = offsets[size_t(seq)], len = offsets[size_t(seq + 1)] - start;
    const Dflash2BlockRows rows =
        dflash2_block_rows(B, tokens.data() + start, loss_mask.data() + start, len, pos, gamma);
    for (int k = 0; k < B; ++k) {
      const size_t r = size_t(b * B + k);
      const double want = k == 0 ? 0.0 : weight_mask[r] * std::exp(-double(k - 1) / gamma);
      ASSERT_NEAR(rows.weights[size_t(k)], want, 1e-6 * std::max(1.0, want))
          << "block " << b << " slot " << k;
      weight_sum += rows.weights[size_t(k)];
      if (rows.weights[size_t(k)] > 0) {
        ASSERT_EQ(rows.labels[size_t(k)], target_ids[r]) << "block " << b << " slot " << k;
        ASSERT_EQ(rows.prev[size_t(k)], predecessor_ids[r]) << "block " << b << " slot " << k;
      }
    }
    const Dflash2BlockLoss l =
        dflash2_block_step<float>(d, weights, lm_head.data(), hidden.data() + b * B * H, rows, alpha, false,
                                  nullptr, &grads, dz.data() + b * B * H);
    base_sum += l.base_sum;
    selector_sum += l.selector_sum;
  }
  const double den = read_f32(g, "loss_den")[0];
  EXPECT_NEAR(weight_sum, den, 1e-6 * den) << "Σ w differs from SpecForge's loss_den";
  const double sel = read_f32(g, "selector_loss_num")[0];
  EXPECT_NEAR(selector_sum, sel, 1e-5 * sel);
  const double loss = (base_sum + alpha * selector_sum) / den, want = read_f32(g, "loss")[0];
  EXPECT_NEAR(loss, want, 1e-5 * want);
  for (float& x : dz) x = float(x / den);
  EXPECT_LE(rel_rms(dz, read_f32(g, "grad.hidden")), 1e-4) << "grad.hidden";
  for (int i = 0; i < 3; ++i) {
    for (float& x : grad[i]) x = float(x / den);
    EXPECT_LE(rel_rms(grad[i], read_f32(g, std::string("grad.") + names[i])), 1e-4) << names[i];
  }
}

TEST(Dflash2Golden, EveryConvolutionMatchesSpecForge) {
  if (!std::filesystem::exists(kDir + "/golden.safetensors")) GTEST_SKIP() << kMissing;
  const DrafterConfig cfg = drafter_config_load_hf(kDir + "/model");
  const Dflash2ConvDims d = dflash2_conv_dims(cfg);
  const SafetensorsIndex g = SafetensorsIndex::open(kDir + "/golden.safetensors");
  const SafetensorsIndex m = SafetensorsIndex::open(kDir + "/model");
  for (int layer = 0; layer < cfg.layers; ++layer)
    for (const char* which : {"attention_conv", "mlp_conv"}) {
      const std::string name = "layers." + std::to_string(layer) + "." + which;
      SCOPED_TRACE(name);
      const std::vector<float> base = weight_of(m, name + ".base_kernel"),
                               proj = weight_of(m, name + ".kernel_projection.weight");
      const auto golden = [&](const char* prefix, const char* t) {
        return read_f32(g, prefix + name + "." + t);
      };
      const std::vector<float> x = golden("conv.", "x"), y = golden("conv.", "y");
      const int64_t rows = int64_t(x.size()) / d.hidden;
      std::vector<float> a(x.size()), z(x.size()), coeff(size_t(rows * d.coeffs()));
      const Dflash2ConvTensors<const float> w{base.data(), proj.data()};
      dflash2_conv_prepare<float>(d, w, x.data(), rows, a.data(), coeff.data());
      dflash2_conv_finish<float>(d, w, y.data(), coeff.data(), rows, z.data());
      EXPECT_LE(rel_rms(a, golden("conv.", "a")), 1e-5) << "input side";
      EXPECT_LE(rel_rms(z, golden("conv.", "z")), 1e-5) << "output side";

      std::vector<float> dbase(base.size(), 0.0f), dproj(proj.size(), 0.0f), dx(x.size(), 0.0f),
          dy(x.size(), 0.0f), dcoeff(coeff.size(), 0.0f);
      const Dflash2ConvTensors<float> gw{dbase.data(), dproj.data()};
      const std::vector<float> da = golden("conv_grad.", "a"), dz = golden("conv_grad.", "z");
      dflash2_conv_finish_backward<float>(d, w, y.data(), coeff.data(), rows, dz.data(), dy.data(),
                                          dcoeff.data(), gw);
      dflash2_conv_prepare_backward<float>(d, w, x.data(), coeff.data(), rows, da.data(), dcoeff.data(),
                                           dx.data(), gw);
      EXPECT_LE(rel_rms(dy, golden("conv_grad.", "y")), 1e-4) << "∂/∂ sublayer output";
      EXPECT_LE(rel_rms(dx, golden("conv_grad.", "x")), 1e-4) << "∂/∂ sublayer input";
      EXPECT_LE(rel_rms(dbase, read_f32(g, "grad." + name + ".base_kernel")), 1e-4) << "base_kernel";
      EXPECT_LE(rel_rms(dproj, read_f32(g, "grad." + name + ".kernel_projection.weight")), 1e-4)
          << "kernel_projection";
    }
}

// The whole CPU DFlash2 step (backbone with both convolutions in every layer, the selector and both CE terms
// at the golden's α) on the golden's inputs, the drafter read through drafter.init_from: which rows carry
// loss, Σ w, the loss (rel ≤ 1e-5) and every parameter's gradient (rel-RMS ≤ 1e-4) against SpecForge's
// OnlineDFlashModel with DFlash2DraftModel.
TEST(Dflash2Golden, WholeStepMatchesSpecForge) {
  if (!std::filesystem::exists(kDir + "/golden.safetensors")) GTEST_SKIP() << kMissing;
  const SafetensorsIndex g = SafetensorsIndex::open(kDir + "/golden.safetensors");
  CpuTrainOps ops;
  const df::drafter_golden::StepResult r = df::drafter_golden::run_golden_step(ops, g, kDir + "/model");
  ASSERT_EQ(r.cfg.kind, DrafterKind::dflash2);
  df::drafter_golden::expect_rows_and_loss(r, g, 1e-5);
  for (const auto& [name, got] : r.grads) {
    const std::vector<float> want = read_f32(g, "grad." + name);
    ASSERT_EQ(want.size(), got.size()) << name;
    EXPECT_LE(rel_rms(got, want), 1e-4) << name;
  }
}
