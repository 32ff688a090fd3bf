// Domino's head oracle (ops/domino_head.h): the block rows (label shifting, weights, holes, padding, the
// sequence end), the λ schedule against SpecForge's linear_lambda_base, and the analytic backward against
// central finite differences on awkward shapes (odd H, G, E, V; both label modes; prefix lengths 0..2), and
// the greedy proposals of decoding against the teacher-forced block they imply.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "head_test_util.h"
#include "ops/domino_head.h"

using namespace df;
using df::testing::fd_check;
using df::testing::normal_f64;

namespace {

DominoHeadDims dims(int prefix, bool shift) {
  DominoHeadDims d;
  d.hidden = 5;
  d.gru_hidden = 3;
  d.emb_dim = 7;
  d.vocab = 11;
  d.block_size = 5;
  d.pure_draft_prefix_len = prefix;
  d.shift_label = shift;
  return d;
}

// Every input of one block step: the head weights, lm_head, z and the embeddings, all in double.
struct Block {
  DominoHeadDims d;
  std::vector<double> ih, hh, pin, pout, lm, z, emb;
  DominoBlockRows rows;
  double lambda = 0.3;

  Block(const DominoHeadDims& dd, uint64_t seed) : d(dd) {
    const int H = d.hidden, G = d.gru_hidden, E = d.emb_dim, V = d.vocab, B = d.block_size;
    ih = normal_f64(size_t(3 * G * H), 0.6, seed);
    hh = normal_f64(size_t(3 * G * G), 0.6, seed + 1);
    pin = normal_f64(size_t(E * (H + G)), 0.5, seed + 2);
    pout = normal_f64(size_t(V * E), 0.5, seed + 3);
    lm = normal_f64(size_t(V * H), 0.7, seed + 4);
    z = normal_f64(size_t(B * H), 1.0, seed + 5);
    emb = normal_f64(size_t(B * H), 1.0, seed + 6);
    // Slot 2 is a hole in the loss mask; every label differs.
    const std::vector<int32_t> tokens = {3, 9, 1, 4, 10, 0, 7, 2};
    const std::vector<uint8_t> mask = {1, 1, 1, 0, 1, 1, 1, 1};
    rows = domino_block_rows(d, tokens.data(), mask.data(), int64_t(tokens.size()), 1, 3.0);
  }
  DominoHeadTensors<const double> weights() const { return {ih.data(), hh.data(), pin.data(), pout.data()}; }
  double loss() const {
    const DominoBlockLoss l = domino_block_step<double>(d, weights(), lm.data(), z.data(), emb.data(), rows,
                                                        lambda, nullptr, nullptr, nullptr);
    return (1.0 - lambda) * l.final_sum + lambda * l.base_sum;
  }
};

void expect_fd_gradients(const DominoHeadDims& d) {
  Block b(d, 40 + uint64_t(d.pure_draft_prefix_len) * 7 + (d.shift_label ? 1 : 0));
  std::vector<double> gih(b.ih.size(), 0.0), ghh(b.hh.size(), 0.0), gpin(b.pin.size(), 0.0),
      gpout(b.pout.size(), 0.0), dz(b.z.size(), 0.0);
  const DominoHeadTensors<double> grads{gih.data(), ghh.data(), gpin.data(), gpout.data()};
  domino_block_step<double>(d, b.weights(), b.lm.data(), b.z.data(), b.emb.data(), b.rows, b.lambda, nullptr,
                            &grads, dz.data());
  struct Param {
    const char* name;
    std::vector<double>* value;
    const std::vector<double>* grad;
  } params[] = {{"prefix_gru.weight_ih_l0", &b.ih, &gih},
                {"prefix_gru.weight_hh_l0", &b.hh, &ghh},
                {"embed_proj.0.weight", &b.pin, &gpin},
                {"embed_proj.2.weight", &b.pout, &gpout},
                {"z", &b.z, &dz}};
  for (const Param& p : params) {
    const df::testing::FdError e = fd_check(*p.value, *p.grad, [&] { return b.loss(); });
    EXPECT_GT(e.ref2, 1e-8) << p.name << ": the loss must depend on it";
    EXPECT_LE(e.rel_rms, 1e-6) << p.name << " (prefix " << d.pure_draft_prefix_len << ", shift_label "
                               << d.shift_label << ")";
  }
}

}  // namespace

TEST(DominoHead, RowsShiftLabelsAndWeighHolesAndTheEnd) {
  const std::vector<int32_t> tokens = {3, 9, 1, 4, 10, 0};
  const std::vector<uint8_t> mask = {1, 1, 1, 0, 1, 1};
  const int64_t len = int64_t(tokens.size());
  // shift_label: slot k predicts x[a+k+1], weight exp(-k/γ); anchor 2 runs past the end from slot 3 on.
  DominoBlockRows r = domino_block_rows(dims(1, true), tokens.data(), mask.data(), len, 2, 2.0);
  EXPECT_EQ(r.labels, (std::vector<int32_t>{4, 10, 0, 0, 0}));
  EXPECT_EQ(r.inputs, (std::vector<int32_t>{1, 4, 10, 0, 0}));
  EXPECT_DOUBLE_EQ(r.weights[0], 0.0);  // x[3] is a hole
  EXPECT_DOUBLE_EQ(r.weights[1], std::exp(-1.0 / 2.0));
  EXPECT_DOUBLE_EQ(r.weights[2], std::exp(-2.0 / 2.0));
  EXPECT_DOUBLE_EQ(r.weights[3], 0.0);
  EXPECT_DOUBLE_EQ(r.weights[4], 0.0);
  // Unshifted: slot k predicts x[a+k], slot 0 carries nothing, weight exp(-(k-1)/γ).
  r = domino_block_rows(dims(0, false), tokens.data(), mask.data(), len, 0, 2.0);
  EXPECT_EQ(r.labels, (std::vector<int32_t>{3, 9, 1, 4, 10}));
  EXPECT_EQ(r.weights, (std::vector<double>{0.0, 1.0, std::exp(-0.5), 0.0, std::exp(-1.5)}));
  // A padding block carries no weight.
  r = domino_block_rows(dims(1, true), tokens.data(), mask.data(), len, -1, 2.0);
  EXPECT_EQ(r.weights, std::vector<double>(5, 0.0));
}

TEST(DominoHead, LambdaScheduleIsSpecForgesLinearBase) {
  EXPECT_DOUBLE_EQ(domino_lambda_base(0, 100, 1.0, 0.5), 1.0);
  EXPECT_DOUBLE_EQ(domino_lambda_base(25, 100, 1.0, 0.5), 0.5);
  EXPECT_DOUBLE_EQ(domino_lambda_base(50, 100, 1.0, 0.5), 0.0);
  EXPECT_DOUBLE_EQ(domino_lambda_base(90, 100, 1.0, 0.5), 0.0);
  EXPECT_DOUBLE_EQ(domino_lambda_base(3, 7, 0.8, 0.5), 0.0);  // decay over max(1, int(3.5)) = 3 steps
  EXPECT_DOUBLE_EQ(domino_lambda_base(1, 7, 0.8, 0.5), 0.8 * (1.0 - 1.0 / 3.0));
  EXPECT_DOUBLE_EQ(domino_lambda_base(0, 10, 1.0, 0.0), 1.0);  // decay over max(1, 0) = 1 step
  EXPECT_DOUBLE_EQ(domino_lambda_base(1, 10, 1.0, 0.0), 0.0);
  EXPECT_DOUBLE_EQ(domino_lambda_base(5, 0, 1.0, 0.5), 0.0);  // no horizon: the final loss only
}

TEST(DominoHead, CorrectionStartsAtTheSuffixSlot) {
  for (const DominoHeadDims& d : {dims(2, true), dims(1, false)}) {
    const Block b(d, 11);
    std::vector<double> logits(size_t(d.block_size) * d.vocab);
    domino_block_step<double>(d, b.weights(), b.lm.data(), b.z.data(), b.emb.data(), b.rows, b.lambda,
                              logits.data(), nullptr, nullptr);
    for (int k = 0; k < d.block_size; ++k) {
      double diff = 0;
      for (int v = 0; v < d.vocab; ++v) {
        double base = 0;
        for (int i = 0; i < d.hidden; ++i)
          base += b.lm[size_t(v * d.hidden + i)] * b.z[size_t(k * d.hidden + i)];
        diff += std::fabs(logits[size_t(k * d.vocab + v)] - base);
      }
      if (k < d.suffix_start())
        EXPECT_LT(diff, 1e-12) << "slot " << k;
      else
        EXPECT_GT(diff, 1e-3) << "slot " << k;
    }
  }
}

TEST(DominoHead, AnalyticBackwardMatchesFiniteDifferences) {
  for (int prefix = 0; prefix <= 2; ++prefix)
    for (bool shift : {true, false}) expect_fd_gradients(dims(prefix, shift));
}

TEST(DominoHead, Fp32OracleAgreesWithDouble) {
  const DominoHeadDims d = dims(1, true);
  const Block b(d, 5);
  auto f = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  const std::vector<float> ih = f(b.ih), hh = f(b.hh), pin = f(b.pin), pout = f(b.pout), lm = f(b.lm),
                           z = f(b.z), emb = f(b.emb);
  std::vector<float> gpin(pin.size(), 0.0f), gih(ih.size(), 0.0f), ghh(hh.size(), 0.0f),
      gpout(pout.size(), 0.0f), dz(z.size(), 0.0f);
  const DominoHeadTensors<float> grads{gih.data(), ghh.data(), gpin.data(), gpout.data()};
  const DominoBlockLoss lf =
      domino_block_step<float>(d, {ih.data(), hh.data(), pin.data(), pout.data()}, lm.data(), z.data(),
                               emb.data(), b.rows, b.lambda, nullptr, &grads, dz.data());
  std::vector<double> gin_d(b.pin.size(), 0.0), gih_d(b.ih.size(), 0.0), ghh_d(b.hh.size(), 0.0),
      gout_d(b.pout.size(), 0.0), dz_d(b.z.size(), 0.0);
  const DominoHeadTensors<double> grads_d{gih_d.data(), ghh_d.data(), gin_d.data(), gout_d.data()};
  const DominoBlockLoss ld = domino_block_step<double>(d, b.weights(), b.lm.data(), b.z.data(), b.emb.data(),
                                                       b.rows, b.lambda, nullptr, &grads_d, dz_d.data());
  EXPECT_NEAR(lf.final_sum, ld.final_sum, 1e-5 * std::fabs(ld.final_sum));
  EXPECT_NEAR(lf.base_sum, ld.base_sum, 1e-5 * std::fabs(ld.base_sum));
  for (size_t i = 0; i < gih.size(); ++i)
    EXPECT_NEAR(gih[i], gih_d[i], 1e-5 + 1e-4 * std::fabs(gih_d[i])) << i;
  for (size_t i = 0; i < dz.size(); ++i) EXPECT_NEAR(dz[i], dz_d[i], 1e-5 + 1e-4 * std::fabs(dz_d[i])) << i;
}

// Decoding proposes token p from the GRU over its own earlier proposals: run as a teacher-forced block over
// [first, proposals...], every slot that proposed scores its proposal highest. The correction must decide at
// least once (a proposal the base logits alone would not make), or the test would not see the GRU.
TEST(DominoHead, ProposalsAreTheArgmaxOfTheirOwnTeacherForcedBlock) {
  for (const DominoHeadDims& d : {dims(1, true), dims(0, true), dims(1, false), dims(2, false)}) {
    const Block b(d, 60 + uint64_t(d.pure_draft_prefix_len));
    const std::vector<double> embed = normal_f64(size_t(d.vocab * d.hidden), 1.0, 61);
    const std::vector<int32_t> drafts =
        domino_block_propose<double>(d, b.weights(), b.lm.data(), embed.data(), b.z.data(), 6);
    ASSERT_EQ(int(drafts.size()), d.block_size - 1);
    std::vector<int32_t> tokens{6};
    tokens.insert(tokens.end(), drafts.begin(), drafts.end());
    std::vector<double> emb;
    for (int32_t t : tokens)
      emb.insert(emb.end(), &embed[size_t(t * d.hidden)], &embed[size_t((t + 1) * d.hidden)]);
    DominoBlockRows rows;
    rows.labels.assign(size_t(d.block_size), 0);
    rows.weights.assign(size_t(d.block_size), 0.0);
    std::vector<double> logits(size_t(d.block_size * d.vocab));
    domino_block_step<double>(d, b.weights(), b.lm.data(), b.z.data(), emb.data(), rows, 0.0, logits.data(),
                              nullptr, nullptr);
    int corrected_differs = 0;
    for (int p = 1; p < d.block_size; ++p) {
      const int slot = d.shift_label ? p - 1 : p;
      const double* row = &logits[size_t(slot * d.vocab)];
      EXPECT_EQ(int32_t(std::max_element(row, row + d.vocab) - row), drafts[size_t(p - 1)])
          << "token " << p << " (prefix " << d.pure_draft_prefix_len << ", shift_label " << d.shift_label
          << ")";
      std::vector<double> base(size_t(d.vocab), 0.0);
      for (int v = 0; v < d.vocab; ++v)
        for (int i = 0; i < d.hidden; ++i)
          base[size_t(v)] += b.lm[size_t(v * d.hidden + i)] * b.z[size_t(slot * d.hidden + i)];
      corrected_differs +=
          int32_t(std::max_element(base.begin(), base.end()) - base.begin()) != drafts[size_t(p - 1)];
    }
    EXPECT_GT(corrected_differs, 0) << "prefix " << d.pure_draft_prefix_len << ", shift_label "
                                    << d.shift_label;
  }
}
