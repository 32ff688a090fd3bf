// D-PACE (MODELS.md "D-PACE loss"): the row weights of ops/loss_rows.cpp against a direct restatement of the
// formula (nested products and sums, no recursion) and a hand-computed block, for the loss and both variants;
// and the drafter step with train.loss = "dpace": Σ w·CE with those weights over the per-row CE, divided by
// sequences.
#include <gtest/gtest.h>

#include <cmath>

#include "test_drafter_util.h"
#include "ops/loss_rows.h"
#include "train/loss.h"

using namespace df;
using namespace df::testing;

namespace {

// The formula as MODELS.md writes it, term by term.
std::vector<double> dpace_restated(const std::vector<uint8_t>& m, const std::vector<float>& p, int B,
                                   double alpha, DpaceKind kind) {
  std::vector<double> w(m.size(), 0.0);
  for (size_t j0 = 0; j0 < m.size(); j0 += size_t(B)) {
    auto s = [&](int j) { return m[j0 + size_t(j)] ? (1 - alpha) * p[j0 + size_t(j)] + alpha : 1.0; };
    auto prefix = [&](int k) {
      double v = 1;
      for (int j = 1; j <= k; ++j) v *= s(j);
      return v;
    };
    for (int k = 1; k < B; ++k) {
      double suffix = 0;
      for (int j = k; j < B; ++j) suffix += prefix(j) * m[j0 + size_t(j)];
      const double v = kind == DpaceKind::full                         ? suffix
                       : kind == DpaceKind::cumulative_confidence_only ? prefix(k)
                                                                       : suffix / prefix(k);
      w[j0 + size_t(k)] = m[j0 + size_t(k)] * v;
    }
  }
  return w;
}

const DpaceKind kKinds[] = {DpaceKind::full, DpaceKind::cumulative_confidence_only,
                            DpaceKind::continuation_value_only};

}  // namespace

TEST(Dpace, HandComputedBlock) {
  // B = 3, both offsets labelled, p = (0.6, 0.2), α = 0.5: s = (0.8, 0.6), prefix = (0.8, 0.48),
  // suffix = (1.28, 0.48), suffix / prefix = (1.6, 1.0).
  const std::vector<uint8_t> m{0, 1, 1};
  const std::vector<float> p{0.9f, 0.6f, 0.2f};
  const std::vector<float> full = loss_dpace_weights(m, p, 3, 0.5f, DpaceKind::full);
  const std::vector<float> cum = loss_dpace_weights(m, p, 3, 0.5f, DpaceKind::cumulative_confidence_only);
  const std::vector<float> cont = loss_dpace_weights(m, p, 3, 0.5f, DpaceKind::continuation_value_only);
  EXPECT_EQ(full[0], 0.0f);  // the anchor carries no loss
  EXPECT_FLOAT_EQ(full[1], 1.28f);
  EXPECT_FLOAT_EQ(full[2], 0.48f);
  EXPECT_FLOAT_EQ(cum[1], 0.8f);
  EXPECT_FLOAT_EQ(cum[2], 0.48f);
  EXPECT_FLOAT_EQ(cont[1], 1.6f);
  EXPECT_FLOAT_EQ(cont[2], 1.0f);
  EXPECT_EQ(loss_dpace_kind("dpace"), DpaceKind::full);
  EXPECT_EQ(loss_dpace_kind("ce"), DpaceKind::off);
  EXPECT_THROW(loss_dpace_kind("dpace-typo"), Error);
}

TEST(Dpace, WeightsMatchTheRestatedFormula) {
  const int B = 7, nb = 9;
  Rng r(3);
  std::vector<uint8_t> m(size_t(B * nb));
  std::vector<float> p(m.size());
  for (size_t i = 0; i < m.size(); ++i) {
    m[i] = i % size_t(B) != 0 && r.uniform() < 0.8;  // holes in the mask, also before labelled offsets
    p[i] = float(r.uniform());
  }
  for (float alpha : {0.5f, 0.1f, 1.0f})
    for (DpaceKind kind : kKinds) {
      const std::vector<float> got = loss_dpace_weights(m, p, B, alpha, kind);
      const std::vector<double> want = dpace_restated(m, p, B, alpha, kind);
      // float output of a double computation: one rounding, 1e-6 relative is a few ulps.
      for (size_t i = 0; i < m.size(); ++i)
        EXPECT_NEAR(got[i], want[i], 1e-6 * (1 + std::fabs(want[i])))
            << "row " << i << " alpha " << alpha << " kind " << int(kind);
    }
}

TEST(Dpace, DrafterStepUsesTheWeightsAndCountsSequences) {
  TinySetup s;
  const std::vector<DrafterAnchor> an{{0, 0}, {0, 5}, {2, 2}, {2, 9}, {0, -1}};
  const int B = s.cfg.block_size;
  const size_t N = an.size() * size_t(B);
  // Per-row CE and its label mask, one row at a time through fixed one-hot weights.
  std::vector<double> ce(N, 0.0);
  std::vector<uint8_t> m(N, 0);
  for (size_t r = 0; r < N; ++r) {
    const DrafterAnchor& a = an[r / size_t(B)];
    const int k = int(r % size_t(B));
    const int64_t s0 = s.batch.offsets[size_t(a.seq)], len = s.batch.offsets[size_t(a.seq) + 1] - s0;
    if (a.pos < 0 || k == 0 || a.pos + k >= len || !s.batch.loss_mask[size_t(s0 + a.pos + k)]) continue;
    m[r] = 1;
    std::vector<float> one(N, 0.0f);
    one[r] = 1.0f;
    DrafterLossOptions o;
    o.backward = false;
    o.fixed_row_weights = &one;
    ce[r] = drafter_forward_backward(*s.model, s.batch, an, o).loss_sum;
  }
  for (DpaceKind kind : kKinds) {
    DrafterLossOptions o;
    o.backward = false;
    o.dpace = kind;
    const LossStats st = drafter_forward_backward(*s.model, s.batch, an, o);
    std::vector<float> p(N);
    for (size_t r = 0; r < N; ++r) p[r] = float(std::exp(-ce[r]));  // p_draft(label) = exp(−CE)
    const std::vector<double> w = dpace_restated(m, p, B, 0.5, kind);
    double loss = 0;
    for (size_t r = 0; r < N; ++r) {
      // p from exp(−CE) differs from the op's softmax in the last bits: 1e-5 relative.
      EXPECT_NEAR(st.row_weight[r], w[r], 1e-5 * (1 + w[r])) << "row " << r;
      loss += w[r] * ce[r];
    }
    EXPECT_NEAR(st.loss_sum, loss, 1e-5 * (1 + loss));
    EXPECT_EQ(st.weight_sum, 3.0);  // three sequences
  }
}
