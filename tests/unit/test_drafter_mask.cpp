// The DFlash attention mask, checked by perturbation: changing a key/value row a query may not see must leave
// its output bit-identical, changing one it may see must change it. The visibility rule is re-stated here
// from MODELS.md independently of the kernel's own range arithmetic.
#include <gtest/gtest.h>

#include <cmath>

#include "test_drafter_util.h"

using namespace df;
using namespace df::testing;

namespace {

struct MaskCase {
  std::vector<int64_t> seq_start = {0, 9};
  std::vector<int64_t> seq_len = {9, 7};
  // (sequence, anchor); anchor −1 = padding. Includes a = 0 (no context) and a block at the sequence end.
  std::vector<std::pair<int, int>> blocks = {{0, 0}, {0, 5}, {0, 8}, {1, 3}, {0, -1}, {1, 6}};
  int B = 4, hq = 4, hkv = 2, hd = 8;
};

bool visible(const MaskCase& mc, int64_t T, int j, int k, int64_t r, int window) {
  const auto [seq, a] = mc.blocks[size_t(j)];
  if (a < 0) return false;
  if (r >= T) {
    const int64_t jb = (r - T) / mc.B, kb = (r - T) % mc.B;
    return jb == j && (window == 0 || kb <= k);
  }
  const int64_t t = r - mc.seq_start[size_t(seq)];
  if (t < 0 || t >= mc.seq_len[size_t(seq)] || t >= a) return false;
  return window == 0 || t >= a + k - (window - 1);
}

void check_mask(int window) {
  MaskCase mc;
  CpuTrainOps ops;
  const int64_t T = 16, nb = int64_t(mc.blocks.size()), N = nb * mc.B;
  std::vector<int32_t> blk;
  for (auto [s, a] : mc.blocks) {
    blk.push_back(int32_t(mc.seq_start[size_t(s)]));
    blk.push_back(a);
  }
  auto q = normal_vec(size_t(N * mc.hq * mc.hd), 1.0f, 1), k = normal_vec(size_t((T + N) * mc.hkv * mc.hd), 1.0f, 2),
       v = normal_vec(size_t((T + N) * mc.hkv * mc.hd), 1.0f, 3);
  std::vector<float> out0(size_t(N * mc.hq * mc.hd)), out1(out0.size()), lse(size_t(N * mc.hq));
  auto mk = [](std::vector<float>& x, int64_t r, int64_t c) { return tensor_make(x.data(), DType::f32, Device::cpu, r, c); };
  Tensor bt = tensor_make(blk.data(), DType::i32, Device::cpu, nb, 2);
  DFlashAttnShape s{mc.hq, mc.hkv, mc.hd, mc.B, window, float(1.0 / std::sqrt(mc.hd))};
  const int64_t kvd = mc.hkv * mc.hd, qd = mc.hq * mc.hd;
  ops.dflash_attention_fwd(mk(q, N, qd), mk(k, T + N, kvd), mk(v, T + N, kvd), bt, mk(out0, N, qd), mk(lse, N, mc.hq), s);
  for (float x : out0) ASSERT_FALSE(std::isnan(x));
  // Padding block 4: zero output, lse −inf.
  for (int64_t i = 4 * mc.B * qd; i < 5 * mc.B * qd; ++i) ASSERT_EQ(out0[size_t(i)], 0.0f);
  ASSERT_TRUE(std::isinf(lse[size_t(4 * mc.B * mc.hq)]));
  int seen = 0, hidden = 0;
  for (int64_t r = 0; r < T + N; ++r)
    for (int g = 0; g < mc.hkv; ++g) {
      auto k2 = k, v2 = v;
      for (int d = 0; d < mc.hd; ++d) {
        k2[size_t(r * kvd + g * mc.hd + d)] += 0.5f;
        v2[size_t(r * kvd + g * mc.hd + d)] += 0.5f;
      }
      ops.dflash_attention_fwd(mk(q, N, qd), mk(k2, T + N, kvd), mk(v2, T + N, kvd), bt, mk(out1, N, qd),
                               mk(lse, N, mc.hq), s);
      for (int j = 0; j < nb; ++j)
        for (int kq = 0; kq < mc.B; ++kq)
          for (int h = 0; h < mc.hq; ++h) {
            bool changed = false;
            for (int d = 0; d < mc.hd; ++d) {
              const size_t i = size_t((j * mc.B + kq) * qd + h * mc.hd + d);
              changed |= out0[i] != out1[i];
            }
            const bool expect = h / (mc.hq / mc.hkv) == g && visible(mc, T, j, kq, r, window);
            ASSERT_EQ(changed, expect) << "window " << window << " block " << j << " offset " << kq << " head " << h
                                       << " key row " << r;
            (expect ? seen : hidden) += 1;
          }
    }
  // Both kinds of pairs were exercised.
  EXPECT_GT(seen, 100);
  EXPECT_GT(hidden, 1000);
}

}  // namespace

TEST(DrafterMask, FullLayerSeesStrictContextAndWholeBlock) { check_mask(0); }

TEST(DrafterMask, SlidingLayerIsCausalInBlockAndWindowed) { check_mask(5); }

// Model level: a block at anchor a must not read taps at positions ≥ a nor taps of another sequence.
TEST(DrafterMask, ModelReadsOnlyEarlierContext) {
  TinySetup s({11, 13});
  DrafterLossOptions o;
  o.backward = false;
  const std::vector<DrafterAnchor> an = {{1, 6}};  // sequence 1 starts at packed row 11; anchor row 17
  const double base = drafter_forward_backward(*s.model, s.batch, an, o).loss_sum;
  ASSERT_GT(base, 0.0);
  const int64_t cols = s.batch.taps.cols;
  auto loss_with_row_changed = [&](int64_t row) {
    std::vector<float> saved(s.taps.begin() + row * cols, s.taps.begin() + (row + 1) * cols);
    for (int64_t c = 0; c < cols; ++c) s.taps[size_t(row * cols + c)] += 1.0f;
    const double l = drafter_forward_backward(*s.model, s.batch, an, o).loss_sum;
    std::copy(saved.begin(), saved.end(), s.taps.begin() + row * cols);
    return l;
  };
  for (int64_t row = 0; row < 11; ++row) EXPECT_EQ(loss_with_row_changed(row), base) << "other sequence, row " << row;
  for (int64_t row = 17; row < 24; ++row) EXPECT_EQ(loss_with_row_changed(row), base) << "position ≥ anchor, row " << row;
  // Window 5 in layer 0 hides positions < a − 1 there, but the full layer 1 still reads all earlier context.
  for (int64_t row = 11; row < 17; ++row) EXPECT_NE(loss_with_row_changed(row), base) << "earlier context, row " << row;
}
