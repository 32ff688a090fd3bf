// DFlash2's oracles (ops/dflash2_conv.h, ops/dflash2_selector.h): a hand-computed convolution, the block
// boundary, the identity at initialisation, the selector's candidate sets and schedule, and every analytic
// gradient against central finite differences in double on awkward shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <vector>

#include "core/rng.h"
#include "ops/dflash2_conv.h"
#include "ops/dflash2_selector.h"

using namespace df;

namespace {

std::vector<double> randn(size_t n, double std, uint64_t seed) {
  Rng r(seed);
  std::vector<double> v(n);
  for (double& x : v) x = std * r.normal();
  return v;
}

// |analytic − numeric| ≤ 1e-7 + 1e-6·|numeric| for every element of `param`, numeric = central difference of
// loss() with step 1e-6 (double throughout, so the bound is far above the rounding of either side).
void expect_fd(const char* what, std::vector<double>& param, const std::vector<double>& analytic,
               const std::function<double()>& loss) {
  ASSERT_EQ(param.size(), analytic.size()) << what;
  const double eps = 1e-6;
  for (size_t i = 0; i < param.size(); ++i) {
    const double keep = param[i];
    param[i] = keep + eps;
    const double up = loss();
    param[i] = keep - eps;
    const double down = loss();
    param[i] = keep;
    const double num = (up - down) / (2 * eps);
    ASSERT_NEAR(analytic[i], num, 1e-7 + 1e-6 * std::fabs(num)) << what << " element " << i;
  }
}

Dflash2ConvDims conv_dims(int H, int gs, int taps, int B) {
  Dflash2ConvDims d;
  d.hidden = H;
  d.group_size = gs;
  d.taps = taps;
  d.block_size = B;
  return d;
}

}  // namespace

TEST(Dflash2Conv, HandComputedTwoBlocks) {
  // H 2, one group, 2 taps, blocks of 2. Side 0: base taps [1, 1] and [2, −1]; the projection gives side 0's
  // tap 1 the dynamic coefficient 0.5·x[r, 0] and everything else 0.
  const Dflash2ConvDims d = conv_dims(2, 2, 2, 2);
  const std::vector<float> base = {1, 1, 2, -1, 1, 1, 0, 0}, proj = {0, 0, 0.5f, 0, 0, 0, 0, 0};
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8};
  std::vector<float> out(8), coeff(16);
  dflash2_conv_prepare<float>(d, {base.data(), proj.data()}, x.data(), 4, out.data(), coeff.data());
  // Row 1: [3, 4] + ([2, −1] + 1.5)·[1, 2]; row 2 starts the second block and reads nothing before it;
  // row 3: [7, 8] + ([2, −1] + 3.5)·[5, 6].
  const std::vector<float> want = {1, 2, 6.5f, 5, 5, 6, 34.5f, 23};
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(out[size_t(i)], want[size_t(i)]) << i;
  EXPECT_FLOAT_EQ(coeff[1 * 4 + 1], 1.5f);
  EXPECT_FLOAT_EQ(coeff[3 * 4 + 1], 3.5f);
  // Side 1 is the identity here (base tap 0 = 1, no dynamic part): finish returns its input.
  std::vector<float> fin(8);
  dflash2_conv_finish<float>(d, {base.data(), proj.data()}, x.data(), coeff.data(), 4, fin.data());
  EXPECT_EQ(fin, x);
}

TEST(Dflash2Conv, NoTapReadsTheBlockBefore) {
  const Dflash2ConvDims d = conv_dims(12, 4, 4, 4);  // taps = B: the last row reads the whole block
  const int64_t rows = 12, H = 12, C = d.coeffs();
  std::vector<double> base = randn(size_t(2 * d.taps * H), 1.0, 1), proj = randn(size_t(C * H), 0.3, 2),
                      x = randn(size_t(rows * H), 1.0, 3);
  std::vector<double> out(x.size()), coeff(size_t(rows * C)), out2(x.size()), coeff2(coeff.size());
  dflash2_conv_prepare<double>(d, {base.data(), proj.data()}, x.data(), rows, out.data(), coeff.data());
  for (int64_t h = 0; h < H; ++h) x[size_t(3 * H + h)] += 1.0;  // the last row of block 0
  dflash2_conv_prepare<double>(d, {base.data(), proj.data()}, x.data(), rows, out2.data(), coeff2.data());
  for (int64_t r = 0; r < rows; ++r) {
    bool same = true;
    for (int64_t h = 0; h < H; ++h) same &= out[size_t(r * H + h)] == out2[size_t(r * H + h)];
    EXPECT_EQ(same, r != 3) << "row " << r;
  }
}

TEST(Dflash2Conv, IdentityAtInitialisation) {
  // base = [1, 0, ..] per side, kernel_projection = 0: x' = x + conv₁(f(conv₀(n))) is x + f(n) bit for bit,
  // so a DFlash2 layer started this way computes its DFlash layer.
  const Dflash2ConvDims d = conv_dims(10, 5, 3, 4);
  const int64_t rows = 8, H = 10;
  std::vector<float> base(size_t(2 * 3 * H), 0.0f), proj(size_t(d.coeffs() * H), 0.0f);
  std::fill_n(base.begin(), H, 1.0f);
  std::fill_n(base.begin() + 3 * H, H, 1.0f);
  std::vector<float> n(size_t(rows * H));
  Rng r(7);
  for (float& v : n) v = float(r.normal());
  std::vector<float> a(n.size()), coeff(size_t(rows * d.coeffs())), y(n.size()), z(n.size());
  dflash2_conv_prepare<float>(d, {base.data(), proj.data()}, n.data(), rows, a.data(), coeff.data());
  EXPECT_EQ(a, n);
  for (size_t i = 0; i < y.size(); ++i) y[i] = std::tanh(a[i]) * 3.0f;
  dflash2_conv_finish<float>(d, {base.data(), proj.data()}, y.data(), coeff.data(), rows, z.data());
  EXPECT_EQ(z, y);
}

TEST(Dflash2Conv, GradientsMatchFiniteDifferences) {
  // (H, gs, taps, B, blocks): several groups and taps; one group of all channels with one tap; a group per
  // channel with taps = B.
  const int shapes[][5] = {{12, 4, 3, 5, 2}, {6, 6, 1, 2, 3}, {10, 1, 4, 4, 2}};
  for (const auto& s : shapes) {
    SCOPED_TRACE(testing::Message() << "H " << s[0] << " gs " << s[1] << " taps " << s[2] << " B " << s[3]);
    const Dflash2ConvDims d = conv_dims(s[0], s[1], s[2], s[3]);
    const int64_t H = s[0], rows = int64_t(s[3]) * s[4], C = d.coeffs();
    std::vector<double> base = randn(size_t(2 * d.taps * H), 0.7, 11), proj = randn(size_t(C * H), 0.4, 12),
                        x = randn(size_t(rows * H), 1.0, 13), m = randn(size_t(rows * H), 1.0, 14),
                        r0 = randn(size_t(rows * H), 1.0, 15), r1 = randn(size_t(rows * H), 1.0, 16);
    std::vector<double> a(x.size()), y(x.size()), z(x.size()), coeff(size_t(rows * C));
    // L = Σ r1·conv₁(y) + Σ r0·a with a = conv₀(x), y = m ⊙ tanh(a): a sublayer that is not linear.
    const auto forward = [&] {
      dflash2_conv_prepare<double>(d, {base.data(), proj.data()}, x.data(), rows, a.data(), coeff.data());
      for (size_t i = 0; i < y.size(); ++i) y[i] = m[i] * std::tanh(a[i]);
      dflash2_conv_finish<double>(d, {base.data(), proj.data()}, y.data(), coeff.data(), rows, z.data());
      double l = 0;
      for (size_t i = 0; i < z.size(); ++i) l += r1[i] * z[i] + r0[i] * a[i];
      return l;
    };
    forward();
    std::vector<double> dbase(base.size(), 0.0), dproj(proj.size(), 0.0), dx(x.size(), 0.0),
        dy(x.size(), 0.0), da(x.size()), dcoeff(coeff.size(), 0.0);
    const Dflash2ConvTensors<double> g{dbase.data(), dproj.data()};
    dflash2_conv_finish_backward<double>(d, {base.data(), proj.data()}, y.data(), coeff.data(), rows,
                                         r1.data(), dy.data(), dcoeff.data(), g);
    for (size_t i = 0; i < da.size(); ++i) {
      const double t = std::tanh(a[i]);
      da[i] = r0[i] + dy[i] * m[i] * (1 - t * t);
    }
    dflash2_conv_prepare_backward<double>(d, {base.data(), proj.data()}, x.data(), coeff.data(), rows,
                                          da.data(), dcoeff.data(), dx.data(), g);
    expect_fd("x", x, dx, forward);
    expect_fd("base_kernel", base, dbase, forward);
    expect_fd("kernel_projection", proj, dproj, forward);
  }
}

namespace {

Dflash2SelectorDims selector_dims(double multiplier, double softcap) {
  Dflash2SelectorDims d;
  d.hidden = 6;
  d.vocab = 23;
  d.rank = 5;
  d.top_k = 4;
  d.block_size = 5;
  d.output_multiplier = multiplier;
  d.softcap = softcap;
  return d;
}

std::vector<double> logits_of(const Dflash2SelectorDims& d, const std::vector<double>& lm_head,
                              const double* z) {
  std::vector<double> l(size_t(d.vocab), 0.0);
  for (int v = 0; v < d.vocab; ++v)
    for (int h = 0; h < d.hidden; ++h) l[size_t(v)] += lm_head[size_t(v * d.hidden + h)] * z[h];
  return l;
}

}  // namespace

TEST(Dflash2Selector, CandidatesAreTheStrictTopKAndAMissingGoldReplacesTheWeakest) {
  const Dflash2SelectorDims d = selector_dims(0.5, 2.0);
  std::vector<float> logits(23, 0.0f);
  for (int v = 0; v < 23; ++v) logits[size_t(v)] = float((v * 7) % 23) * 0.25f;  // distinct, scrambled
  logits[4] = logits[9] = 10.0f;  // a tie at the top: the lower id first
  const Dflash2Candidates top = dflash2_selector_candidates(d, logits.data(), -1);
  ASSERT_EQ(top.ids.size(), 4u);
  EXPECT_EQ(top.ids[0], 4);
  EXPECT_EQ(top.ids[1], 9);
  for (size_t j = 0; j < 4; ++j) {
    EXPECT_DOUBLE_EQ(top.unary[j], 2.0 * std::tanh(0.5 * logits[size_t(top.ids[j])] / 2.0));
    if (j) EXPECT_GE(top.unary[j - 1], top.unary[j]);
  }
  EXPECT_EQ(top.target, -1);

  const Dflash2Candidates in = dflash2_selector_candidates(d, logits.data(), top.ids[2]);
  EXPECT_TRUE(in.covered);
  EXPECT_EQ(in.target, 2);
  EXPECT_EQ(in.ids, top.ids);

  const Dflash2Candidates out = dflash2_selector_candidates(d, logits.data(), 0);  // logit 0: the smallest
  EXPECT_FALSE(out.covered);
  EXPECT_EQ(out.target, 3);
  EXPECT_EQ(out.ids[3], 0);
  EXPECT_DOUBLE_EQ(out.unary[3], 0.0);
  for (size_t j = 0; j < 3; ++j) EXPECT_EQ(out.ids[j], top.ids[j]);
}

TEST(Dflash2Selector, BlockRowsLabelPredecessorAndWeight) {
  const std::vector<int32_t> tokens = {10, 11, 12, 13, 14, 15};
  const std::vector<uint8_t> mask = {1, 1, 1, 0, 1, 1};
  const Dflash2BlockRows r = dflash2_block_rows(4, tokens.data(), mask.data(), 6, 2, 3.0);
  EXPECT_EQ(r.labels, (std::vector<int32_t>{12, 13, 14, 15}));
  EXPECT_EQ(r.prev, (std::vector<int32_t>{12, 12, 13, 14}));
  EXPECT_EQ(r.weights[0], 0.0);  // the anchor
  EXPECT_EQ(r.weights[1], 0.0);  // a masked label
  EXPECT_NEAR(r.weights[2], std::exp(-1.0 / 3.0), 1e-7);
  EXPECT_NEAR(r.weights[3], std::exp(-2.0 / 3.0), 1e-7);
  const Dflash2BlockRows end = dflash2_block_rows(4, tokens.data(), mask.data(), 6, 4, 3.0);
  EXPECT_EQ(end.labels, (std::vector<int32_t>{14, 15, 15, 15}));  // clamped past the end, weightless
  EXPECT_EQ(end.weights, (std::vector<double>{0.0, 1.0, 0.0, 0.0}));
  const Dflash2BlockRows pad = dflash2_block_rows(4, tokens.data(), mask.data(), 6, -1, 3.0);
  EXPECT_EQ(pad.weights, (std::vector<double>(4, 0.0)));
}

TEST(Dflash2Selector, AlphaScheduleIsSpecForges) {
  EXPECT_EQ(dflash2_selector_alpha(99, 1000, 0.8, 0.1, 0.2), 0.0);
  EXPECT_DOUBLE_EQ(dflash2_selector_alpha(100, 1000, 0.8, 0.1, 0.2), 0.8 / 200);
  EXPECT_DOUBLE_EQ(dflash2_selector_alpha(199, 1000, 0.8, 0.1, 0.2), 0.8 * 100 / 200);
  EXPECT_DOUBLE_EQ(dflash2_selector_alpha(299, 1000, 0.8, 0.1, 0.2), 0.8);
  EXPECT_DOUBLE_EQ(dflash2_selector_alpha(5000, 1000, 0.8, 0.1, 0.2), 0.8);
  EXPECT_DOUBLE_EQ(dflash2_selector_alpha(100, 1000, 0.8, 0.1, 0.0), 0.8);  // no ramp
  EXPECT_DOUBLE_EQ(dflash2_selector_alpha(0, 0, 0.8, 0.5, 0.5), 0.8);       // no horizon
  EXPECT_EQ(dflash2_selector_alpha(0, 1000, 0.0, 0.0, 0.0), 0.0);
}

TEST(Dflash2Selector, GradientsMatchFiniteDifferences) {
  for (const auto& [multiplier, softcap] : {std::pair<double, double>{1.0, 0.0}, {0.7, 2.5}}) {
    SCOPED_TRACE(testing::Message() << "output_multiplier " << multiplier << " softcap " << softcap);
    const Dflash2SelectorDims d = selector_dims(multiplier, softcap);
    const int H = d.hidden, V = d.vocab, R = d.rank, B = d.block_size;
    std::vector<double> lm = randn(size_t(V * H), 1.0, 21), z = randn(size_t(B * H), 1.0, 22),
                        pred = randn(size_t(V * R), 0.8, 23), succ = randn(size_t(V * R), 0.8, 24),
                        wh = randn(size_t(R * H), 0.6, 25);
    // Slots 1 and 3 are labelled with their argmax (inside the top-K), 2 and 4 with their argmin (outside:
    // the gold replaces the weakest candidate); slot 0 is the anchor.
    Dflash2BlockRows rows{std::vector<int32_t>(size_t(B), 0), {3, 5, 7, 9, 11}, {0.0, 1.0, 0.8, 0.6, 0.5}};
    for (int k = 1; k < B; ++k) {
      const std::vector<double> l = logits_of(d, lm, z.data() + k * H);
      const auto it = k % 2 ? std::max_element(l.begin(), l.end()) : std::min_element(l.begin(), l.end());
      rows.labels[size_t(k)] = int32_t(it - l.begin());
    }
    const double alpha = 0.6;
    const auto loss = [&] {
      const Dflash2BlockLoss l =
          dflash2_block_step<double>(d, {pred.data(), succ.data(), wh.data()}, lm.data(), z.data(), rows,
                                     alpha, false, nullptr, nullptr, nullptr);
      return l.base_sum + alpha * l.selector_sum;
    };
    std::vector<double> gp(pred.size(), 0.0), gs(succ.size(), 0.0), gw(wh.size(), 0.0), dz(z.size(), 0.0);
    const Dflash2SelectorTensors<double> g{gp.data(), gs.data(), gw.data()};
    const Dflash2BlockLoss l =
        dflash2_block_step<double>(d, {pred.data(), succ.data(), wh.data()}, lm.data(), z.data(), rows, alpha,
                                   false, nullptr, &g, dz.data());
    EXPECT_EQ(l.covered, 2);
    EXPECT_GT(l.selector_sum, 0.0);
    expect_fd("z", z, dz, loss);
    expect_fd("predecessor_codebook", pred, gp, loss);
    expect_fd("successor_codebook", succ, gs, loss);
    expect_fd("hidden_projection", wh, gw, loss);

    // stop_gradient: the selector's own gradients unchanged, ∂/∂z only the base CE's.
    std::vector<double> gp2(pred.size(), 0.0), gs2(succ.size(), 0.0), gw2(wh.size(), 0.0), dz2(z.size(), 0.0),
        dz_base(z.size(), 0.0);
    const Dflash2SelectorTensors<double> g2{gp2.data(), gs2.data(), gw2.data()};
    dflash2_block_step<double>(d, {pred.data(), succ.data(), wh.data()}, lm.data(), z.data(), rows, alpha,
                               true, nullptr, &g2, dz2.data());
    std::vector<double> u1(pred.size(), 0.0), u2(succ.size(), 0.0), u3(wh.size(), 0.0);
    const Dflash2SelectorTensors<double> g0{u1.data(), u2.data(), u3.data()};
    dflash2_block_step<double>(d, {pred.data(), succ.data(), wh.data()}, lm.data(), z.data(), rows, 0.0,
                               false, nullptr, &g0, dz_base.data());
    EXPECT_EQ(gp2, gp);
    EXPECT_EQ(gs2, gs);
    EXPECT_EQ(gw2, gw);
    for (size_t i = 0; i < dz.size(); ++i) EXPECT_NEAR(dz2[i], dz_base[i], 1e-12) << i;
    bool differs = false;
    for (size_t i = 0; i < dz.size(); ++i) differs |= std::fabs(dz[i] - dz_base[i]) > 1e-6;
    EXPECT_TRUE(differs) << "without stop_gradient the selector term reaches z";
  }
}

TEST(Dflash2Selector, ZeroSuccessorCodebookProposesTheArgmaxAsDflashDoes) {
  const Dflash2SelectorDims d = selector_dims(0.7, 2.5);
  const int H = d.hidden, V = d.vocab, R = d.rank, n = d.block_size - 1;
  std::vector<double> lm = randn(size_t(V * H), 1.0, 31), z = randn(size_t(n * H), 1.0, 32),
                      pred = randn(size_t(V * R), 0.02, 33), succ(size_t(V * R), 0.0),
                      wh = randn(size_t(R * H), 0.02, 34);
  std::vector<double> logits;
  std::vector<int32_t> argmax;
  for (int k = 0; k < n; ++k) {
    const std::vector<double> l = logits_of(d, lm, z.data() + k * H);
    logits.insert(logits.end(), l.begin(), l.end());
    argmax.push_back(int32_t(std::max_element(l.begin(), l.end()) - l.begin()));
  }
  const Dflash2SelectorTensors<const double> w{pred.data(), succ.data(), wh.data()};
  EXPECT_EQ(dflash2_selector_greedy_path<double>(d, w, logits.data(), z.data(), n, 17), argmax);
  // A trained successor codebook re-ranks: the walk then follows the transitions, not the unary argmax.
  succ = randn(succ.size(), 30.0, 35);
  pred = randn(pred.size(), 3.0, 36);
  wh = randn(wh.size(), 3.0, 37);
  const Dflash2SelectorTensors<const double> w2{pred.data(), succ.data(), wh.data()};
  EXPECT_NE(dflash2_selector_greedy_path<double>(d, w2, logits.data(), z.data(), n, 17), argmax);
}

TEST(Dflash2Selector, HandComputedScoresLossAndWalk) {
  // V 4, H 1, R 1, K 2. logits = [1, 2, 3, 0]: candidates 2, 1 (unary 3, 2). ctx = pred[0]·(W_h z) = 2·0.5 =
  // 1; successor scores −1 (token 2) and +1 (token 1): scores 2 and 3, so the selector prefers token 1.
  Dflash2SelectorDims d;
  d.hidden = 1;
  d.vocab = 4;
  d.rank = 1;
  d.top_k = 2;
  d.block_size = 2;
  const std::vector<float> lm = {1, 2, 3, 0}, z = {0, 1}, pred = {2, 0, 0, 0}, succ = {0, 1, -1, 0},
                           wh = {0.5f};
  const Dflash2SelectorTensors<const float> w{pred.data(), succ.data(), wh.data()};
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0) + 1.0);
  Dflash2BlockRows rows{{0, 1}, {0, 0}, {0.0, 1.0}};  // slot 1: label 1, previous token 0
  Dflash2BlockLoss l =
      dflash2_block_step<float>(d, w, lm.data(), z.data(), rows, 1.0, false, nullptr, nullptr, nullptr);
  EXPECT_NEAR(l.base_sum, lse - 2.0, 1e-6);
  EXPECT_NEAR(l.selector_sum, std::log(std::exp(2.0) + std::exp(3.0)) - 3.0, 1e-6);
  EXPECT_EQ(l.covered, 1);
  // Label 3 is outside the top 2: it replaces token 1 with its own unary 0 and no transition (succ[3] = 0).
  rows.labels[1] = 3;
  l = dflash2_block_step<float>(d, w, lm.data(), z.data(), rows, 1.0, false, nullptr, nullptr, nullptr);
  EXPECT_NEAR(l.base_sum, lse - 0.0, 1e-6);
  EXPECT_NEAR(l.selector_sum, std::log(std::exp(2.0) + 1.0), 1e-6);
  EXPECT_EQ(l.covered, 0);
  const std::vector<float> logits = {1, 2, 3, 0};
  EXPECT_EQ(dflash2_selector_greedy_path<float>(d, w, logits.data(), z.data() + 1, 1, 0),
            std::vector<int32_t>{1});
  // From another predecessor (pred[1] = 0) the transition vanishes and the unary argmax, token 2, wins.
  EXPECT_EQ(dflash2_selector_greedy_path<float>(d, w, logits.data(), z.data() + 1, 1, 1),
            std::vector<int32_t>{2});
}
