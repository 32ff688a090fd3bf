// Finite-difference checks of the drafter's analytic backward: every parameter tensor of the table, for the
// CE loss, the soft-KL loss, the streak-weighted and the D-PACE-weighted loss, with feature noise on, on a
// batch that has padding blocks, blocks running past their sequence's end and holes in the loss mask. Then
// the step's first backward writing the gradients (drafter_begin_step) against zero-fill + accumulate, bit
// for bit. Last, the Domino, DFlash2 and DSpark drafters: every tensor against finite differences, and their
// steps against the head oracles (ops/domino_head.h, ops/dflash2_selector.h, ops/dspark_head.h) restated block
// by block.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "test_drafter_util.h"
#include "train/optimizer.h"

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
  drafter_begin_step(*s.model);  // the training path: this backward writes the gradients
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

// A head step's statistics restated from its oracle (ops/domino_head.h, ops/dflash2_selector.h,
// ops/dspark_head.h), block by block: each slot's row weight and argmax (−1 where the weight is 0) are checked
// as the block is added, the sums and the accuracy counts (slot k counted at block offset k + shift, up to
// B − 1) at the end.
struct HeadOracleSums {
  double loss = 0, weight = 0;
  int64_t counted = 0;

  void add_block(const LossStats& st, size_t j, int B, int V, int shift, double block_loss,
                 const std::vector<double>& weights, const std::vector<float>& logits) {
    loss += block_loss;
    for (int k = 0; k < B; ++k) {
      const size_t r = j * size_t(B) + size_t(k);
      const float wk = float(weights[size_t(k)]);
      EXPECT_EQ(st.row_weight[r], wk) << "block " << j << " slot " << k;
      weight += wk;
      if (wk == 0.0f) {
        EXPECT_EQ(st.row_argmax[r], -1) << "block " << j << " slot " << k;
        continue;
      }
      const float* row = &logits[size_t(k * V)];
      EXPECT_EQ(st.row_argmax[r], int32_t(std::max_element(row, row + V) - row))
          << "block " << j << " slot " << k;
      counted += k + shift < B;
    }
  }
  void expect_matches(const LossStats& st) const {
    EXPECT_GT(weight, 0.0);
    EXPECT_NEAR(st.loss_sum, loss, 1e-6 * std::fabs(loss));
    EXPECT_NEAR(st.weight_sum, weight, 1e-6 * weight);
    int64_t count = 0;
    for (int64_t c : st.count) count += c;
    EXPECT_EQ(count, counted) << "the accuracy counts slot k at offset k + shift, up to B − 1";
  }
};

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
  drafter_begin_step(*s.model);
  drafter_forward_backward(*s.model, s.batch, fixed_anchors(), o);  // writes
  std::vector<float> once(s.grads(), s.grads() + s.model->table().total);
  drafter_forward_backward(*s.model, s.batch, fixed_anchors(), o);  // adds
  float gmax = 0;
  for (float v : once) gmax = std::max(gmax, std::fabs(v));
  // The second call adds into the buffer inside the GEMMs (beta 1), so the sum is reassociated: equal to 2g
  // up to a few ulp of the largest gradient entry.
  for (size_t i = 0; i < once.size(); ++i) {
    ASSERT_FALSE(std::isnan(s.grads()[i]));
    ASSERT_NEAR(s.grads()[i], 2.0f * once[i], 1e-5f * gmax) << "element " << i;
  }
}

// ---- the step's first backward writes the gradients
// ---------------------------------------------------------

namespace {

// Every table entry's gradient elements set to NaN (the padding keeps its zeros): an element the first
// backward does not write, or reads before writing, stays NaN or turns NaN.
void poison_grads(TinySetup& s) {
  for (const auto& e : s.model->table().entries)
    std::fill_n(s.grads() + e.offset, e.rows * e.cols, std::nanf(""));
}

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

// The first-write gradients against zero-fill + accumulate's. Beta 0 stores x where the fill path stores
// 0 + x, the same bits except that 0 + (−0) is +0; adding the same later terms to both keeps that the only
// difference. So first + 0 (which maps −0 to +0 and changes nothing else) must equal filled bit for bit,
// padding included (zeros in both).
void expect_same_bits(TinySetup& first, TinySetup& filled, const std::string& what) {
  const DrafterParamTable& t = first.model->table();
  int64_t negative_zeros = 0;
  for (int64_t i = 0; i < t.total; ++i) {
    const float a = first.grads()[i], b = filled.grads()[i];
    negative_zeros += a == 0.0f && std::signbit(a);
    ASSERT_EQ(bits_of(a + 0.0f), bits_of(b))
        << what << ": element " << i << " first write " << a << " fill " << b;
  }
  std::printf("[ bits   ] %s: %lld elements identical (%lld of them −0 against the fill path's +0)\n",
              what.c_str(), (long long)t.total, (long long)negative_zeros);
}

// Two identical models and batches: `first` opens each step on the first-write path (drafter_begin_step),
// `filled` zero-fills its gradients instead (drafter_zero_grads), so that every backward adds to zero.
struct FirstAndFilled {
  TinySetup first, filled;
  FirstAndFilled() {
    randomise_params(first, 21);
    randomise_params(filled, 21);
    poison_grads(first);
    poison_grads(filled);  // drafter_zero_grads rewrites them
  }
  void begin_step() {
    drafter_begin_step(*first.model);
    drafter_zero_grads(*filled.model);
  }
  void accumulate(const std::vector<DrafterAnchor>& an, const DrafterLossOptions& o) {
    drafter_accumulate(*first.model, first.batch, an, o);
    drafter_accumulate(*filled.model, filled.batch, an, o);
  }
};

}  // namespace

// One step of two micro-batches (CE, then soft-KL with feature noise and other anchors), then a second step:
// after every backward the first-write path holds the fill path's gradients bit for bit (up to the sign of
// zero), and every element was written (the NaN poison is gone).
TEST(DrafterGrad, FirstWriteMatchesFillAndAccumulateBitForBit) {
  FirstAndFilled p;
  DrafterLossOptions ce, kl;
  kl.kind = LmLossKind::kl;
  kl.noise_std = 0.05f;
  kl.noise_seed = 9;
  const std::vector<DrafterAnchor> other = {{2, 3}, {0, 2}, {0, -1}, {2, 9}};
  p.begin_step();
  ASSERT_TRUE(p.first.model->grads_stale);
  ASSERT_FALSE(p.filled.model->grads_stale);
  p.accumulate(fixed_anchors(), ce);
  EXPECT_FALSE(p.first.model->grads_stale);
  expect_same_bits(p.first, p.filled, "step 1, micro-batch 1");
  p.accumulate(other, kl);
  expect_same_bits(p.first, p.filled, "step 1, micro-batch 2");
  drafter_grads_ready(*p.first.model);  // a backward ran: leaves them as they are
  drafter_grads_ready(*p.filled.model);
  expect_same_bits(p.first, p.filled, "step 1, ready");
  // Step 2 over step 1's gradients: the first backward overwrites them.
  p.begin_step();
  p.accumulate(other, ce);
  expect_same_bits(p.first, p.filled, "step 2, micro-batch 1");
}

// A micro-batch without context rows (T = 0; only a padding block) still writes every gradient: the K = 0
// GEMMs of fc, k_proj and v_proj's context part and hidden_norm's row-less backward write zeros.
TEST(DrafterGrad, FirstWriteWithoutContextRowsWritesZeros) {
  FirstAndFilled p;
  for (TinySetup* s : {&p.first, &p.filled}) {
    s->batch.offsets = {0, 0};
    s->batch.tokens.clear();
    s->batch.loss_mask.clear();
    s->batch.taps = s->batch.taps.rows_view(0, 0);
    s->batch.target_hidden = s->batch.target_hidden.rows_view(0, 0);
  }
  p.begin_step();
  p.accumulate({{0, -1}}, DrafterLossOptions{});
  for (int64_t i = 0; i < p.first.model->table().total; ++i)
    ASSERT_EQ(p.first.grads()[i], 0.0f) << "element " << i;
  expect_same_bits(p.first, p.filled, "no context rows");
}

// A step whose micro-batches ran no backward (no blocks, or forward only) leaves the gradients stale:
// adamw_step refuses them and names the fix; drafter_grads_ready zero-fills them.
TEST(DrafterGrad, StaleGradientsAreRefusedUntilReady) {
  TinySetup s;
  poison_grads(s);
  drafter_begin_step(*s.model);
  DrafterLossOptions fwd;
  fwd.backward = false;
  drafter_accumulate(*s.model, s.batch, fixed_anchors(), fwd);
  drafter_accumulate(*s.model, s.batch, {}, DrafterLossOptions{});
  ASSERT_TRUE(s.model->grads_stale);
  OptimConfig o;
  try {
    adamw_step(*s.model, o, 0, 1.0);
    FAIL() << "adamw_step ran on stale gradients";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("drafter_grads_ready"), std::string::npos) << e.what();
  }
  drafter_grads_ready(*s.model);
  for (int64_t i = 0; i < s.model->table().total; ++i) ASSERT_EQ(s.grads()[i], 0.0f) << "element " << i;
  EXPECT_NO_THROW(adamw_step(*s.model, o, 0, 1.0));
}

// ---- Domino's head in the drafter step (drafter.kind = "domino") ----------------------------------------

// Every tensor, the head's four included, in both label modes, against finite differences of the whole
// step's (1 − λ)·CE(final) + λ·CE(base); its row weights depend on the data only, so nothing is held fixed.
TEST(DrafterGrad, DominoEveryTensor) {
  for (bool shift : {true, false}) {
    TinySetup s({11, 1, 13}, 7, tiny_domino_config(shift, shift ? 1 : 0));
    randomise_params(s, 16);
    DrafterLossOptions o;
    o.domino_lambda = 0.3;
    o.gamma = 3.0f;
    check_all(s, o, o);
  }
}

// The step's loss, weights, drafts and accuracy counts are the oracle's (ops/domino_head.h) over every block,
// restated here from the step's own final hidden states and the batch; the first backward writes every
// gradient (the NaN poison is gone).
TEST(DrafterGrad, DominoStepIsTheOracleOverEveryBlock) {
  for (bool shift : {true, false}) {
    TinySetup s({11, 1, 13}, 7, tiny_domino_config(shift, 1));
    randomise_params(s, 17);
    poison_grads(s);
    DrafterLossOptions o;
    o.domino_lambda = 0.4;
    o.gamma = 3.0f;
    const std::vector<DrafterAnchor> an = fixed_anchors();
    drafter_begin_step(*s.model);
    const LossStats st = drafter_forward_backward(*s.model, s.batch, an, o);
    for (int64_t i = 0; i < s.model->table().total; ++i) ASSERT_FALSE(std::isnan(s.grads()[i])) << i;
    const std::vector<float> y = drafter_final_hidden(*s.model, s.batch, an, o);
    const DominoHeadDims d = domino_head_dims(s.cfg);
    const DrafterParamTable& t = s.model->table();
    auto at = [&](const char* name) { return s.params() + t.find(name).offset; };
    const DominoHeadTensors<const float> w{at("prefix_gru.weight_ih_l0"), at("prefix_gru.weight_hh_l0"),
                                           at("embed_proj.0.weight"), at("embed_proj.2.weight")};
    const int B = d.block_size, H = d.hidden, V = d.vocab;
    HeadOracleSums sums;
    std::vector<float> emb(size_t(B * H)), logits(size_t(B * V));
    for (size_t j = 0; j < an.size(); ++j) {
      const int64_t s0 = s.batch.offsets[size_t(an[j].seq)],
                    len = s.batch.offsets[size_t(an[j].seq) + 1] - s0;
      const DominoBlockRows rows = domino_block_rows(d, s.batch.tokens.data() + s0,
                                                     s.batch.loss_mask.data() + s0, len, an[j].pos, o.gamma);
      for (int k = 0; k < B; ++k)
        std::copy_n(&s.embed[size_t(rows.inputs[size_t(k)] * H)], H, &emb[size_t(k * H)]);
      const DominoBlockLoss l =
          domino_block_step<float>(d, w, s.lm_head.data(), &y[j * size_t(B * H)], emb.data(), rows,
                                   o.domino_lambda, logits.data(), nullptr, nullptr);
      sums.add_block(st, j, B, V, shift ? 1 : 0,
                     (1 - o.domino_lambda) * l.final_sum + o.domino_lambda * l.base_sum, rows.weights,
                     logits);
    }
    sums.expect_matches(st);
  }
}

// ---- DSpark's head in the drafter step (drafter.kind = "dspark") ----------------------------------------

// Every tensor, the Markov head's included, for each head type, against finite differences of the whole
// step's CE. The other two terms are checked against the oracle below (its gradients, its ∂/∂z the step feeds
// into the backbone like CE's), the oracle's own against finite differences in test_dspark_head.cpp: the L1
// term's kinks (|q − t| where the two distributions cross) sit within this check's step of 1e-2 on the
// drafter's weights (seen: a 0.7 % error along q_proj's gradient with α_l1 0.9), and the BCE target 1 − L1/2
// is detached (SpecForge's), which a finite difference of the step cannot hold fixed.
TEST(DrafterGrad, DSparkEveryTensor) {
  for (DrafterMarkovHead type :
       {DrafterMarkovHead::vanilla, DrafterMarkovHead::gated, DrafterMarkovHead::rnn}) {
    SCOPED_TRACE(drafter_markov_head_name(type));
    TinySetup s({11, 1, 13}, 7, tiny_dspark_config(type, 3, false));
    randomise_params(s, 18);
    DrafterLossOptions o;
    o.dspark = {1.0, 0.0, 0.0};
    o.gamma = 3.0f;
    check_all(s, o, o);
  }
}

// The step's loss, weights, drafts, accuracy counts and head gradients are the oracle's (ops/dspark_head.h)
// over every block, restated here from the step's own final hidden states, the batch and the target's final
// hidden states; the first backward writes every gradient (the NaN poison is gone). γ = 0 (no decay) too.
TEST(DrafterGrad, DSparkStepIsTheOracleOverEveryBlock) {
  for (DrafterMarkovHead type :
       {DrafterMarkovHead::vanilla, DrafterMarkovHead::gated, DrafterMarkovHead::rnn}) {
    for (float gamma : {3.0f, 0.0f}) {
      SCOPED_TRACE(std::string(drafter_markov_head_name(type)) + " gamma " + std::to_string(gamma));
      TinySetup s({11, 1, 13}, 7, tiny_dspark_config(type, 3, true));
      randomise_params(s, 19);
      poison_grads(s);
      DrafterLossOptions o;
      o.dspark = {0.3, 0.8, 0.7};
      o.gamma = gamma;
      const std::vector<DrafterAnchor> an = fixed_anchors();
      drafter_begin_step(*s.model);
      const LossStats st = drafter_forward_backward(*s.model, s.batch, an, o);
      for (int64_t i = 0; i < s.model->table().total; ++i) ASSERT_FALSE(std::isnan(s.grads()[i])) << i;
      const std::vector<float> y = drafter_final_hidden(*s.model, s.batch, an, o);
      const DSparkHeadDims d = dspark_head_dims(s.cfg);
      const DrafterParamTable& t = s.model->table();
      const std::vector<DSparkHeadParam> params = dspark_head_params(d);
      // The head's weights and zeroed gradients, by name, in the oracle's struct.
      std::vector<std::vector<float>> grads(params.size());
      DSparkHeadTensors<const float> w;
      DSparkHeadTensors<float> g;
      for (size_t i = 0; i < params.size(); ++i) {
        const DSparkHeadParam& p = params[i];
        grads[i].assign(size_t(p.rows * p.cols), 0.0f);
        const float* wp = s.params() + t.find(p.name).offset;
        float* gp = grads[i].data();
        const std::pair<const char*, std::pair<const float**, float**>> slots[] = {
            {"markov_head.markov_w1.weight", {&w.markov_w1, &g.markov_w1}},
            {"markov_head.markov_w2.weight", {&w.markov_w2, &g.markov_w2}},
            {"markov_head.gate_proj.weight", {&w.gate_w, &g.gate_w}},
            {"markov_head.gate_proj.bias", {&w.gate_b, &g.gate_b}},
            {"markov_head.joint_proj.weight", {&w.joint_w, &g.joint_w}},
            {"markov_head.joint_proj.bias", {&w.joint_b, &g.joint_b}},
            {"confidence_head.proj.weight", {&w.conf_w, &g.conf_w}},
            {"confidence_head.proj.bias", {&w.conf_b, &g.conf_b}}};
        for (const auto& [name, ptrs] : slots)
          if (p.name == name) {
            *ptrs.first = wp;
            *ptrs.second = gp;
          }
      }
      const int B = d.block_size, H = d.hidden, V = d.vocab;
      HeadOracleSums sums;
      std::vector<float> th(size_t(B * H)), logits(size_t(B * V));
      for (size_t j = 0; j < an.size(); ++j) {
        const int64_t s0 = s.batch.offsets[size_t(an[j].seq)],
                      len = s.batch.offsets[size_t(an[j].seq) + 1] - s0;
        const DSparkBlockRows rows = dspark_block_rows(d, s.batch.tokens.data() + s0,
                                                       s.batch.loss_mask.data() + s0, len, an[j].pos, gamma);
        for (int k = 0; k < B; ++k)
          std::copy_n(&s.target_hidden[size_t((s0 + rows.target_pos[size_t(k)]) * H)], H, &th[size_t(k * H)]);
        const DSparkBlockLoss l =
            dspark_block_step<float>(d, w, s.lm_head.data(), &y[j * size_t(B * H)], th.data(), rows, o.dspark,
                                     logits.data(), nullptr, &g, nullptr);
        sums.add_block(
            st, j, B, V, 1,
            o.dspark.ce * l.ce_sum + o.dspark.l1 * l.l1_sum + o.dspark.confidence * l.confidence_sum,
            rows.weights, logits);
      }
      sums.expect_matches(st);
      for (size_t i = 0; i < params.size(); ++i) {
        const float* got = s.grads() + t.find(params[i].name).offset;
        double err = 0, ref = 0;
        for (size_t e = 0; e < grads[i].size(); ++e) {
          err += double(got[e] - grads[i][e]) * double(got[e] - grads[i][e]);
          ref += double(grads[i][e]) * double(grads[i][e]);
        }
        EXPECT_GT(ref, 0.0) << params[i].name << " got no gradient";
        EXPECT_LE(std::sqrt(err), 1e-5 * std::sqrt(ref)) << params[i].name;
      }
    }
  }
}

// ---- DFlash2's convolutions and selector in the drafter step (drafter.kind = "dflash2") -------------------

// randomise_params, with DFlash2's convolutions near the identity (tap 0 about 1, later taps and the dynamic
// coefficients about 0.1) as training keeps them: at randomise_params' scale (every tap ≈ 1 on both sides of
// two layers) the loss's curvature along the gradient puts h = 1e-2's truncation error at 0.5 % (it falls
// ≈ 10× at h = 3e-3, as a truncation error does).
void randomise_dflash2_params(TinySetup& s, uint64_t seed) {
  randomise_params(s, seed);
  Rng r(seed + 1);
  for (const auto& e : s.model->table().entries) {
    float* p = s.params() + e.offset;
    if (drafter_param_is_base_kernel(e.name)) {
      for (int64_t i = 0; i < e.rows * e.cols; ++i)
        p[i] = float((i / e.cols) % s.cfg.conv_kernel_size == 0 ? 1.0 + 0.1 * r.normal() : 0.1 * r.normal());
    } else if (e.name.find("_conv.kernel_projection") != std::string::npos) {
      for (int64_t i = 0; i < e.rows * e.cols; ++i) p[i] *= 0.1f;
    }
  }
}

// Every tensor, both convolutions of both layers and the selector included, against finite differences of
// the whole step's Σ w·CE + α·Σ w·CE_selector, with and without the softcap; top_k = vocab keeps the
// candidate set fixed under the perturbations.
TEST(DrafterGrad, Dflash2EveryTensor) {
  for (float softcap : {0.0f, 2.5f}) {
    DrafterConfig c = tiny_dflash2_config();
    c.final_logit_softcapping = softcap;
    c.output_multiplier = softcap > 0 ? 1.5f : 1.0f;
    TinySetup s({11, 1, 13}, 7, c);
    randomise_dflash2_params(s, 18);
    DrafterLossOptions o;
    o.dflash2_selector_alpha = 0.7;
    o.gamma = 3.0f;
    o.noise_std = 0.3f;
    check_all(s, o, o);
  }
}

// stop_gradient: the selector's own gradients are the full loss's, the backbone's are those of α = 0.
TEST(DrafterGrad, Dflash2StopGradientTrainsTheSelectorOnly) {
  TinySetup s({11, 1, 13}, 7, tiny_dflash2_config(5));
  randomise_params(s, 19);
  const auto an = fixed_anchors();
  const DrafterParamTable& t = s.model->table();
  auto grads_with = [&](double alpha, bool stop) {
    DrafterLossOptions o;
    o.dflash2_selector_alpha = alpha;
    o.dflash2_stop_gradient = stop;
    drafter_begin_step(*s.model);
    drafter_forward_backward(*s.model, s.batch, an, o);
    return std::vector<float>(s.grads(), s.grads() + t.total);
  };
  const std::vector<float> full = grads_with(0.7, false), stop = grads_with(0.7, true),
                           none = grads_with(0, false);
  for (const DrafterParamEntry& e : t.entries) {
    const bool selector = e.name.rfind("candidate_selector.", 0) == 0;
    const std::vector<float>& want = selector ? full : none;
    double diff = 0, norm = 0;
    for (int64_t i = e.offset; i < e.offset + e.rows * e.cols; ++i) {
      diff = std::max(diff, double(std::fabs(stop[size_t(i)] - want[size_t(i)])));
      norm = std::max(norm, double(std::fabs(want[size_t(i)])));
    }
    EXPECT_GT(norm, 0.0) << e.name;
    EXPECT_LE(diff, 1e-6 * norm) << e.name << (selector ? ": the full loss's" : ": α = 0's") << " gradient";
  }
}

// The step's loss, weights and drafts with a top-K smaller than the vocabulary (gold tokens outside it) are
// the oracle's (ops/dflash2_selector.h) over every block, restated from the step's own final hidden states.
TEST(DrafterGrad, Dflash2StepIsTheOracleOverEveryBlock) {
  TinySetup s({11, 1, 13}, 7, tiny_dflash2_config(4));
  randomise_params(s, 20);
  poison_grads(s);
  DrafterLossOptions o;
  o.dflash2_selector_alpha = 0.6;
  o.gamma = 3.0f;
  const std::vector<DrafterAnchor> an = fixed_anchors();
  drafter_begin_step(*s.model);
  const LossStats st = drafter_forward_backward(*s.model, s.batch, an, o);
  for (int64_t i = 0; i < s.model->table().total; ++i) ASSERT_FALSE(std::isnan(s.grads()[i])) << i;
  const std::vector<float> y = drafter_final_hidden(*s.model, s.batch, an, o);
  const Dflash2SelectorDims d = dflash2_selector_dims(s.cfg);
  const DrafterParamTable& t = s.model->table();
  auto at = [&](const char* name) { return s.params() + t.find(name).offset; };
  const Dflash2SelectorTensors<const float> w{at("candidate_selector.predecessor_codebook"),
                                              at("candidate_selector.successor_codebook"),
                                              at("candidate_selector.hidden_projection.weight")};
  const int B = d.block_size, H = d.hidden, V = d.vocab;
  HeadOracleSums sums;
  int covered = 0;
  std::vector<float> logits(size_t(B * V));
  for (size_t j = 0; j < an.size(); ++j) {
    const int64_t s0 = s.batch.offsets[size_t(an[j].seq)], len = s.batch.offsets[size_t(an[j].seq) + 1] - s0;
    const Dflash2BlockRows rows = dflash2_block_rows(B, s.batch.tokens.data() + s0,
                                                     s.batch.loss_mask.data() + s0, len, an[j].pos, o.gamma);
    const Dflash2BlockLoss l =
        dflash2_block_step<float>(d, w, s.lm_head.data(), &y[j * size_t(B * H)], rows,
                                  o.dflash2_selector_alpha, false, logits.data(), nullptr, nullptr);
    covered += l.covered;
    sums.add_block(st, j, B, V, 0, l.base_sum + o.dflash2_selector_alpha * l.selector_sum, rows.weights, logits);
  }
  EXPECT_LT(covered, sums.counted) << "some gold tokens must fall outside the top 4";
  sums.expect_matches(st);
}
