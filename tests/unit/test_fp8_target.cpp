// The FP8 target on the CPU (target.dtype = "fp8"): Ops::fp8_round_rows is e4m3 rounding on a per-row scale,
// and a target loaded with TargetLoadOptions::fp8 rounds its linear weights per output channel and each linear
// layer's input per token. The taps then differ from the fp32 forward by what e4m3 rounding predicts, not more.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <vector>

#include "core/fp8.h"
#include "core/rng.h"
#include "model/target_moe.h"
#include "ops/cpu/cpu_ops.h"
#include "target_test_util.h"

using namespace df;

namespace {

Tensor host_tensor(std::vector<float>& v, int64_t rows, int64_t cols) {
  return tensor_make(v.data(), DType::f32, Device::cpu, rows, cols);
}

using Fp8TargetTest = TargetFamilyTest;

}  // namespace

TEST(Fp8RoundRows, PerRowScaleExactCodesAndBoundedError) {
  CpuOps ops;
  const int64_t rows = 5, cols = 37;
  std::vector<float> x(size_t(rows * cols)), orig;
  Rng r(3);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < cols; ++c)  // rows spanning many magnitudes; row 3 all zeros
      x[size_t(i * cols + c)] = i == 3 ? 0.0f : float(r.normal()) * std::ldexp(1.0f, int(3 * i) - 4);
  orig = x;
  ops.fp8_round_rows(host_tensor(x, rows, cols));
  for (int64_t i = 0; i < rows; ++i) {
    float amax = 0;
    for (int64_t c = 0; c < cols; ++c) amax = std::max(amax, std::fabs(orig[size_t(i * cols + c)]));
    const float scale = amax / kE4m3Max;
    for (int64_t c = 0; c < cols; ++c) {
      const float got = x[size_t(i * cols + c)], want = orig[size_t(i * cols + c)];
      if (amax == 0) {
        EXPECT_EQ(got, 0.0f);
        continue;
      }
      // Exactly a code times the row's scale.
      EXPECT_EQ(got, e4m3_to_f32(e4m3_quantize(want, e4m3_inv_scale(scale))) * scale)
          << "row " << i << " col " << c;
      // e4m3 keeps 3 mantissa bits: a normal value (|x / scale| ≥ 2^-6) is within 2^-4 relative; below that
      // the spacing is the subnormal step 2^-9 · scale.
      const double bound = std::fabs(want / scale) >= 1.0 / 64 ? std::ldexp(1.0, -4) * std::fabs(want)
                                                               : std::ldexp(1.0, -10) * scale;
      EXPECT_LE(std::fabs(double(got) - want), bound * (1 + 1e-6)) << "row " << i << " col " << c;
    }
  }
  // Rounding again changes nothing: the row's amax is a code times the same scale.
  std::vector<float> again = x;
  ops.fp8_round_rows(host_tensor(again, rows, cols));
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(again[i], x[i], 1e-6 * std::fabs(x[i])) << i;
}

TEST_P(Fp8TargetTest, TapsDifferFromFp32ByE4m3Rounding) {
  CpuOps ops(CpuGdnMode::recurrent);
  const QwenConfig c = cfg();
  TargetLoadOptions fp8;
  fp8.fp8 = true;
  auto m32 = target_random(c, 7, ops, {});
  auto m8 = target_random(c, 7, ops, fp8);
  EXPECT_FALSE(m32->fp8);
  EXPECT_TRUE(m8->fp8);
  const std::vector<int32_t> ids = random_ids(70, c.vocab, 5);
  const FwdResult a = run_model(*m32, ops, ids, {40, 30}, c.layers, true);
  const FwdResult b = run_model(*m8, ops, ids, {40, 30}, c.layers, true);
  // Each GEMM sees its input and weights rounded to 3 mantissa bits: uniform relative errors of RMS
  // 2^-4/√3 ≈ 3.6 % per operand, ≈ 5 % on a product, averaged down over K terms only when signs vary. A
  // layer's sub-layers add that on the residual stream, so after L layers of O(1) updates the taps sit some
  // 5 %·√(2L) away: 15 % for these 3–4 layer models. Twice that bounds it; a tap computed from unrounded or
  // doubly rounded operands, or a wrong row scale, lands either at ~0 or at O(1).
  double worst = 0;
  for (int l = 0; l < c.layers; ++l) {
    const double e = rel_rms(b.taps[size_t(l)], a.taps[size_t(l)]);
    worst = std::max(worst, e);
    EXPECT_GT(e, 1e-3) << "tap " << l << ": FP8 rounding had no effect";
    EXPECT_LT(e, 0.30) << "tap " << l;
  }
  std::printf("[ fp8    ] %s: worst tap rel-RMS vs fp32 %.3f, final norm %.3f\n", c.model_type.c_str(), worst,
              rel_rms(b.final_norm, a.final_norm));
}

// A block-scaled FP8 checkpoint loaded with target.dtype = "fp8" is rounded per output channel like any other
// weight (model/target.h TargetLoadOptions::fp8): the CUDA FP8 GEMM has one scale per row, and this CPU path is
// its oracle. So every projection row is then a set of e4m3 codes on one scale (rounding it again moves nothing),
// which the block-scaled values alone (loaded as bf16) are not: their 16-column blocks carry other scales.
TEST_P(Fp8TargetTest, BlockScaledCheckpointIsRoundedPerChannel) {
  CpuOps ops;
  const QwenConfig c = cfg();
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("df_fp8_target_block_" + std::to_string(GetParam()) + "_" +
                                     std::to_string(::getpid()));
  TargetSaveOptions save;
  save.fp8_block_n = save.fp8_block_k = 16;
  TargetLoadOptions with_head;
  with_head.need_lm_head = true;  // an untied model is saved with its lm_head
  target_save_hf(*target_random(c, 11, ops, with_head), dir.string(), save);
  TargetLoadOptions fp8;
  fp8.fp8 = true;
  auto per_row = target_load(dir.string(), ops, fp8);
  auto blocks = target_load(dir.string(), ops, {});
  // How many elements of w move when its rows are rounded to e4m3 on their own scales once more.
  auto moved = [&](const Tensor& w) {
    std::vector<float> v(size_t(w.numel()));
    ops.download_f32(w, v.data());
    std::vector<float> again = v;
    ops.fp8_round_rows(tensor_make(again.data(), DType::f32, Device::cpu, w.rows, w.cols));
    int64_t n = 0;
    // The row's scale may come back an f32 ulp off (its amax / 448 is recomputed), hence not bit-exact.
    for (size_t i = 0; i < v.size(); ++i) n += std::fabs(again[i] - v[i]) > 1e-6f * std::fabs(v[i]);
    return n;
  };
  int64_t moved_blocks = 0;
  for (size_t l = 0; l < per_row->layers.size(); ++l) {
    const TargetLayer& L = per_row->layers[l];
    const TargetLayer& B = blocks->layers[l];
    std::vector<std::pair<const Tensor*, const Tensor*>> pairs;
    if (L.w_gate_up.empty()) {  // an MoE layer: its routed and shared experts
      const std::vector<MoeProjection> lp = target_moe_projections(L), bp = target_moe_projections(B);
      for (size_t i = 0; i < lp.size(); ++i) pairs.push_back({lp[i].w, bp[i].w});
    } else {
      pairs = {{&L.w_gate_up, &B.w_gate_up}, {&L.w_down, &B.w_down}};
    }
    for (auto [w, b] : pairs) {
      EXPECT_EQ(moved(*w), 0) << "layer " << l << ": a projection of the FP8 load is not per-row e4m3";
      moved_blocks += moved(*b);
    }
  }
  EXPECT_GT(moved_blocks, 0) << "the block-scaled values were per-row e4m3 already: the test shows nothing";
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Families, Fp8TargetTest, ::testing::Values(0, 1, 2, 3), target_family_name);
