// The soft-KL drafter loss against a direct restatement of MODELS.md in double precision: for every labelled
// block row, KL(softmax(lm_head · target_hidden[t−1]) ‖ softmax(lm_head · y_row)) at the label's position t,
// weighted by exp(−(k−1)/γ). The restatement starts from the step's own final hidden y (read back with
// drafter_final_hidden); the forward up to y is the one the CE golden (test_drafter_golden) pins, so this
// test covers what the KL path adds: which target row each block row compares with, the labelled set, the
// weights and the KL itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "test_drafter_util.h"

using namespace df;
using namespace df::testing;

namespace {

// log softmax of lm_head · h, in double.
std::vector<double> log_softmax(const std::vector<float>& lm_head, const float* h, int vocab, int hidden) {
  std::vector<double> z(static_cast<size_t>(vocab));
  for (int v = 0; v < vocab; ++v) {
    double acc = 0;
    for (int c = 0; c < hidden; ++c) acc += double(lm_head[size_t(v * hidden + c)]) * double(h[c]);
    z[size_t(v)] = acc;
  }
  const double mx = *std::max_element(z.begin(), z.end());
  double se = 0;
  for (double x : z) se += std::exp(x - mx);
  const double lse = mx + std::log(se);
  for (double& x : z) x -= lse;
  return z;
}

}  // namespace

TEST(DrafterKl, LossMatchesADirectRestatement) {
  TinySetup s;
  const DrafterConfig& c = s.cfg;
  const int B = c.block_size, H = c.hidden, V = c.vocab;
  // seq 0 (len 11): the block at 8 runs past the end; seq 2 (len 13): the block at 11 has one label; one
  // padding block; holes in the loss mask at t % 7 == 5 (TinySetup).
  const std::vector<DrafterAnchor> an = {{0, 0}, {0, 4}, {0, 8}, {2, 1}, {0, -1}, {2, 6}, {2, 11}, {1, 0}};
  DrafterLossOptions o;
  o.kind = LmLossKind::kl;
  o.gamma = 2.5f;  // not the default: the decay must come from the options
  const LossStats st = drafter_forward_backward(*s.model, s.batch, an, o);
  const std::vector<float> y = drafter_final_hidden(*s.model, s.batch, an, o);
  ASSERT_EQ(y.size(), an.size() * size_t(B * H));

  double loss = 0, wsum = 0;
  int rows = 0;
  for (size_t j = 0; j < an.size(); ++j) {
    for (int k = 1; k < B; ++k) {
      const size_t r = j * size_t(B) + size_t(k);
      const int64_t s0 = s.batch.offsets[size_t(an[j].seq)], len = s.batch.offsets[size_t(an[j].seq) + 1] - s0;
      const bool labelled = an[j].pos >= 0 && an[j].pos + k < len && s.batch.loss_mask[size_t(s0 + an[j].pos + k)];
      if (!labelled) {
        EXPECT_EQ(st.row_weight[r], 0.0f) << "block " << j << " offset " << k << " carries no label";
        continue;
      }
      const int64_t t = s0 + an[j].pos + k;  // the label's packed position
      const double w = std::exp(-(k - 1) / double(o.gamma));
      // Weights: float exp against double, ≤ 1 ulp of a value ≤ 1.
      EXPECT_NEAR(st.row_weight[r], w, 2e-7) << "block " << j << " offset " << k;
      const std::vector<double> lt = log_softmax(s.lm_head, &s.target_hidden[size_t((t - 1) * H)], V, H);
      const std::vector<double> ld = log_softmax(s.lm_head, &y[r * size_t(H)], V, H);
      double kl = 0;
      for (int v = 0; v < V; ++v) kl += std::exp(lt[size_t(v)]) * (lt[size_t(v)] - ld[size_t(v)]);
      loss += w * kl;
      wsum += w;
      ++rows;
    }
  }
  ASSERT_GE(rows, 12);  // enough rows that a wrong target row or weight cannot hide
  EXPECT_NEAR(st.weight_sum, wsum, 1e-6 * wsum);
  // The library computes logits and each row's KL in fp32 (2⁻²⁴ relative per operation, H = 16 terms per
  // logit, V = 37 per log-sum-exp); seen: 2.5e-7 absolute on a loss of 12.1 over 13 rows. The tolerance
  // 5e-6 · (1 + loss) is ~250× that and still ~1e-4 of what a wrong target row changes (comparing with
  // target_hidden[t] instead of [t − 1] moves this loss by 0.95).
  EXPECT_NEAR(st.loss_sum, loss, 5e-6 * (1 + loss)) << rows << " labelled rows";
  ASSERT_GT(loss, 0.0);
}
