// Finite-difference checks of the drafter's analytic backward: every parameter tensor of the table, for the
// CE loss, the soft-KL loss, the streak-weighted and the D-PACE-weighted loss, with feature noise on, on a batch
// that has padding blocks, blocks running past their sequence's end and holes in the loss mask.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "test_drafter_util.h"

using namespace df;
using namespace df::testing;

namespace {

std::vector<DrafterAnchor> fixed_anchors() {
  // seq 0 (len 11): 8 runs past the end; seq 2 (len 13): 11 has one label; plus one padding block.
  return {{0, 0}, {0, 4}, {0, 8}, {2, 1}, {0, -1}, {2, 6}, {2, 11}};
}

// Larger-than-init weights so attention is far from uniform and every path carries gradient.
void randomise_params(TinySetup& s, uint64_t seed) {
  Rng r(seed);
  for (const auto& e : s.model->table().entries)
    for (int64_t i = 0; i < e.rows * e.cols; ++i)
      s.params()[e.offset + i] = e.decay ? float(0.25 * r.normal()) : float(1.0 + 0.1 * r.normal());
}

double loss_at(TinySetup& s, const std::vector<DrafterAnchor>& an, DrafterLossOptions o) {
  o.backward = false;
  return drafter_forward_backward(*s.model, s.batch, an, o).loss_sum;
}

// Directional derivative along u (unit norm over one tensor) by central differences, against g·u.
// fp32 forward: each row's loss carries ~1e-6 relative rounding, the summed loss (≈45) therefore ~5e-5
// absolute at worst, so with h = 1e-2 the quotient's rounding error is ≲ 2.5e-3 (seen: ≤ 2.5e-4 along random
// directions); truncation is O(h²·L''') and grows with the gradient (seen: ≤ 4e-4 relative along the
// gradient). The tolerance 1e-3 + 3e-3·|g·u| keeps a ≥ 4× margin over the worst seen and fails a 1% error
// in any tensor's gradient.
void check_tensor(TinySetup& s, const DrafterParamEntry& e, const std::vector<DrafterAnchor>& an,
                  const DrafterLossOptions& o, const std::vector<float>& grad, const std::vector<float>& u,
                  const char* what) {
  const double h = 1e-2;
  float* p = s.params() + e.offset;
  const int64_t n = e.rows * e.cols;
  std::vector<float> saved(p, p + n);
  double an_d = 0;
  for (int64_t i = 0; i < n; ++i) an_d += double(grad[size_t(e.offset + i)]) * u[size_t(i)];
  for (int64_t i = 0; i < n; ++i) p[i] = float(saved[size_t(i)] + h * u[size_t(i)]);
  const double lp = loss_at(s, an, o);
  for (int64_t i = 0; i < n; ++i) p[i] = float(saved[size_t(i)] - h * u[size_t(i)]);
  const double lm = loss_at(s, an, o);
  std::copy(saved.begin(), saved.end(), p);
  const double fd = (lp - lm) / (2 * h);
  EXPECT_TRUE(std::isfinite(an_d)) << e.name;
  EXPECT_LE(std::fabs(fd - an_d), 1e-3 + 3e-3 * std::fabs(an_d))
      << e.name << " (" << what << "): finite difference " << fd << " vs analytic " << an_d;
}

// Checks every tensor along a random direction and along its own gradient (the latter has the largest
// signal, the former catches errors orthogonal to the gradient).
void check_all(TinySetup& s, const DrafterLossOptions& o_grad, const DrafterLossOptions& o_eval) {
  const auto an = fixed_anchors();
  drafter_zero_grads(*s.model);
  LossStats st = drafter_forward_backward(*s.model, s.batch, an, o_grad);
  ASSERT_GT(st.weight_sum, 0.0);
  std::vector<float> grad(s.grads(), s.grads() + s.model->table().total);
  uint64_t seed = 100;
  for (const auto& e : s.model->table().entries) {
    const int64_t n = e.rows * e.cols;
    std::vector<float> u = normal_vec(size_t(n), 1.0f, seed++);
    std::vector<float> ug(static_cast<size_t>(n));
    double nu = 0, ng = 0;
    for (int64_t i = 0; i < n; ++i) {
      nu += double(u[size_t(i)]) * u[size_t(i)];
      ng += double(grad[size_t(e.offset + i)]) * grad[size_t(e.offset + i)];
    }
    EXPECT_GT(ng, 0.0) << e.name << " got no gradient at all";
    for (int64_t i = 0; i < n; ++i) {
      u[size_t(i)] = float(u[size_t(i)] / std::sqrt(nu));
      ug[size_t(i)] = float(grad[size_t(e.offset + i)] / std::sqrt(ng));
    }
    check_tensor(s, e, an, o_eval, grad, u, "random direction");
    check_tensor(s, e, an, o_eval, grad, ug, "gradient direction");
  }
}

}  // namespace

TEST(DrafterGrad, CrossEntropyEveryTensor) {
  TinySetup s;
  randomise_params(s, 11);
  DrafterLossOptions o;
  o.noise_std = 0.3f;
  o.noise_seed = 5;
  check_all(s, o, o);
}

TEST(DrafterGrad, SoftKlEveryTensor) {
  TinySetup s;
  randomise_params(s, 12);
  DrafterLossOptions o;
  o.kind = LmLossKind::kl;
  check_all(s, o, o);
}

TEST(DrafterGrad, StreakWeightsAreDetached) {
  TinySetup s;
  randomise_params(s, 13);
  DrafterLossOptions o;
  o.streak = true;
  o.streak_alpha = 0.7f;
  LossStats st = drafter_forward_backward(*s.model, s.batch, fixed_anchors(), [&] {
    DrafterLossOptions e = o;
    e.backward = false;
    return e;
  }());
  // The streak really changed the weights (else this test would only repeat the CE one).
  DrafterLossOptions plain;
  plain.backward = false;
  LossStats base = drafter_forward_backward(*s.model, s.batch, fixed_anchors(), plain);
  ASSERT_LT(st.weight_sum, base.weight_sum * 0.9);
  // The finite difference holds the streak weights at their forward values: that is what detached means.
  DrafterLossOptions frozen;
  frozen.fixed_row_weights = &st.row_weight;
  check_all(s, o, frozen);
}

TEST(DrafterGrad, DpaceWeightsAreDetached) {
  TinySetup s;
  randomise_params(s, 14);
  DrafterLossOptions o;
  o.dpace = DpaceKind::full;
  DrafterLossOptions fwd = o;
  fwd.backward = false;
  LossStats st = drafter_forward_backward(*s.model, s.batch, fixed_anchors(), fwd);
  ASSERT_EQ(st.weight_sum, 3.0);  // D-PACE divides by the batch's sequences
  DrafterLossOptions frozen;
  frozen.fixed_row_weights = &st.row_weight;
  check_all(s, o, frozen);
}

TEST(DrafterGrad, PaddingBlocksChangeNothing) {
  TinySetup s;
  randomise_params(s, 14);
  DrafterLossOptions o;
  auto an = fixed_anchors();
  std::vector<DrafterAnchor> real;
  for (auto a : an)
    if (a.pos >= 0) real.push_back(a);
  drafter_zero_grads(*s.model);
  LossStats a = drafter_forward_backward(*s.model, s.batch, real, o);
  std::vector<float> ga(s.grads(), s.grads() + s.model->table().total);
  drafter_zero_grads(*s.model);
  LossStats b = drafter_forward_backward(*s.model, s.batch, an, o);
  // Padding only changes the GEMM shapes (and so BLAS's blocking and summation order): equal up to fp32
  // reassociation, a few ulp of the largest summand, far below any real contribution of a padding block.
  EXPECT_NEAR(a.loss_sum, b.loss_sum, 1e-5 * std::fabs(a.loss_sum));
  EXPECT_EQ(a.weight_sum, b.weight_sum);
  EXPECT_EQ(a.tau_blocks, b.tau_blocks);
  float gmax = 0;
  for (float v : ga) gmax = std::max(gmax, std::fabs(v));
  for (size_t i = 0; i < ga.size(); ++i) ASSERT_NEAR(ga[i], s.grads()[i], 1e-5f * gmax) << "element " << i;
}

TEST(DrafterGrad, GradientsAccumulateAcrossCalls) {
  TinySetup s;
  randomise_params(s, 15);
  DrafterLossOptions o;
  drafter_zero_grads(*s.model);
  drafter_forward_backward(*s.model, s.batch, fixed_anchors(), o);
  std::vector<float> once(s.grads(), s.grads() + s.model->table().total);
  drafter_forward_backward(*s.model, s.batch, fixed_anchors(), o);
  float gmax = 0;
  for (float v : once) gmax = std::max(gmax, std::fabs(v));
  // The second call adds into the buffer inside the GEMMs (beta 1), so the sum is reassociated: equal to 2g
  // up to a few ulp of the largest gradient entry.
  for (size_t i = 0; i < once.size(); ++i) {
    ASSERT_FALSE(std::isnan(s.grads()[i]));
    ASSERT_NEAR(s.grads()[i], 2.0f * once[i], 1e-5f * gmax) << "element " << i;
  }
}
