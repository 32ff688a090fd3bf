// DSpark's head oracle (ops/dspark_head.h): the block rows (shifted labels, the cumulative mask that a hole
// or the sequence end closes, exp(-k/γ) from slot 0, padding), the head's parameters in the drafter's table,
// and the analytic backward of CE + L1 + BCE against central finite differences on awkward shapes (odd H, V,
// R; rank 1; no Markov head; every head type, with and without the Markov input to the confidence head), and
// the CUDA head's plan of each logits chunk's distinct target rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "head_test_util.h"
#include "kernels/train/dspark_workspace.h"
#include "model/drafter.h"
#include "ops/dspark_head.h"
#include "test_drafter_util.h"

using namespace df;
using df::testing::fd_check;
using df::testing::normal_f64;
using df::testing::tiny_drafter_config;

namespace {

DSparkHeadDims dims(DrafterMarkovHead type, int rank, bool confidence, bool with_markov) {
  DSparkHeadDims d;
  d.hidden = 5;
  d.vocab = 11;
  d.block_size = 5;
  d.markov_rank = rank;
  d.markov_head_type = type;
  d.confidence = confidence;
  d.confidence_with_markov = with_markov;
  return d;
}

double bce(double c, double acc) {
  return std::max(c, 0.0) - c * acc + std::log1p(std::exp(-std::fabs(c)));
}

// Every input of one block step, in double. Parameters of parts the head lacks stay empty.
struct Block {
  DSparkHeadDims d;
  std::vector<double> w1, w2, gw, gb, jw, jb, cw, cb, lm, z, th;
  DSparkBlockRows rows;
  DSparkLossAlphas alpha{0.3, 0.9, 0.7};

  Block(const DSparkHeadDims& dd, uint64_t seed, bool all_weighted) : d(dd) {
    const int H = d.hidden, V = d.vocab, B = d.block_size, R = d.markov_rank, C = d.confidence_in();
    if (R > 0) {
      w1 = normal_f64(size_t(V * R), 0.8, seed);
      w2 = normal_f64(size_t(V * R), 0.8, seed + 1);
      if (d.markov_head_type == DrafterMarkovHead::gated) {
        gw = normal_f64(size_t(R * (H + R)), 0.6, seed + 2);
        gb = normal_f64(size_t(R), 0.3, seed + 3);
      } else if (d.markov_head_type == DrafterMarkovHead::rnn) {
        jw = normal_f64(size_t(3 * R * (2 * R + H)), 0.6, seed + 2);
        jb = normal_f64(size_t(3 * R), 0.3, seed + 3);
      }
    }
    if (d.confidence) {
      cw = normal_f64(size_t(C), 0.6, seed + 4);
      cb = normal_f64(1, 0.3, seed + 5);
    }
    lm = normal_f64(size_t(V * H), 0.7, seed + 6);
    z = normal_f64(size_t(B * H), 1.0, seed + 7);
    th = normal_f64(size_t(B * H), 1.0, seed + 8);
    // Anchor 1: labels x[2..6]; x[5] is a hole, so slots 0..2 carry weight and 3, 4 do not. The previous
    // token 9 repeats, so one W1 row gathers two slots' gradients.
    const std::vector<int32_t> tokens = {3, 9, 1, 9, 10, 0, 7, 2};
    const std::vector<uint8_t> mask = {1, 1, 1, 1, 1, 0, 1, 1};
    rows = dspark_block_rows(d, tokens.data(), mask.data(), int64_t(tokens.size()), 1, 3.0);
    if (all_weighted)
      for (int k = 0; k < B; ++k) rows.weights[size_t(k)] = 0.5 + 0.25 * k;
  }
  static const double* p(const std::vector<double>& v) { return v.empty() ? nullptr : v.data(); }
  DSparkHeadTensors<const double> weights() const {
    return {p(w1), p(w2), p(gw), p(gb), p(jw), p(jb), p(cw), p(cb)};
  }
  DSparkBlockLoss step(std::vector<double>* logits, std::vector<double>* conf,
                       const DSparkHeadTensors<double>* grads, double* dz) const {
    return dspark_block_step<double>(d, weights(), lm.data(), z.data(), th.data(), rows, alpha,
                                     logits ? logits->data() : nullptr, conf ? conf->data() : nullptr, grads,
                                     dz);
  }
  // The acceptance target acc_k = clamp(1 - L1_k/2, 0, 1) at the current weights, from the draft logits.
  std::vector<double> acceptance() const {
    const int H = d.hidden, V = d.vocab, B = d.block_size;
    const size_t Bn = size_t(B), Vn = size_t(V);
    std::vector<double> logits(Bn * Vn), acc(Bn);
    step(&logits, nullptr, nullptr, nullptr);
    for (int k = 0; k < B; ++k) {
      std::vector<double> q(Vn), t(Vn);
      double mq = -1e300, mt = -1e300, sq = 0, st = 0;
      for (int v = 0; v < V; ++v) {
        double tl = 0;
        for (int i = 0; i < H; ++i) tl += lm[size_t(v * H + i)] * th[size_t(k * H + i)];
        t[size_t(v)] = tl;
        q[size_t(v)] = logits[size_t(k * V + v)];
        mq = std::max(mq, q[size_t(v)]);
        mt = std::max(mt, tl);
      }
      for (int v = 0; v < V; ++v) {
        sq += (q[size_t(v)] = std::exp(q[size_t(v)] - mq));
        st += (t[size_t(v)] = std::exp(t[size_t(v)] - mt));
      }
      double l1 = 0;
      for (int v = 0; v < V; ++v) l1 += std::fabs(q[size_t(v)] / sq - t[size_t(v)] / st);
      acc[size_t(k)] = std::clamp(1.0 - 0.5 * l1, 0.0, 1.0);
    }
    return acc;
  }
  // The objective whose gradient the backward gives: the BCE target acc is held at `acc` (SpecForge detaches
  // it), so the BCE sum is rebuilt here from the confidence logits.
  double loss(const std::vector<double>& acc) const {
    std::vector<double> conf(size_t(d.block_size), 0.0);
    const DSparkBlockLoss l = step(nullptr, &conf, nullptr, nullptr);
    double b = 0;
    if (d.confidence)
      for (int k = 0; k < d.block_size; ++k)
        b += rows.weights[size_t(k)] * bce(conf[size_t(k)], acc[size_t(k)]);
    return alpha.ce * l.ce_sum + alpha.l1 * l.l1_sum + alpha.confidence * b;
  }
};

void expect_fd_gradients(const DSparkHeadDims& d, bool all_weighted, uint64_t seed) {
  Block b(d, seed, all_weighted);
  std::vector<double> g1(b.w1.size(), 0.0), g2(b.w2.size(), 0.0), ggw(b.gw.size(), 0.0),
      ggb(b.gb.size(), 0.0), gjw(b.jw.size(), 0.0), gjb(b.jb.size(), 0.0), gcw(b.cw.size(), 0.0),
      gcb(b.cb.size(), 0.0), dz(b.z.size(), 0.0);
  auto p = [](std::vector<double>& v) { return v.empty() ? nullptr : v.data(); };
  const DSparkHeadTensors<double> grads{p(g1), p(g2), p(ggw), p(ggb), p(gjw), p(gjb), p(gcw), p(gcb)};
  std::vector<double> conf(size_t(d.block_size), 0.0);
  const DSparkBlockLoss l = b.step(nullptr, &conf, &grads, dz.data());
  const std::vector<double> acc = b.acceptance();
  // The oracle's own BCE sum is the one rebuilt from its confidence logits.
  double want_bce = 0;
  if (d.confidence)
    for (int k = 0; k < d.block_size; ++k)
      want_bce += b.rows.weights[size_t(k)] * bce(conf[size_t(k)], acc[size_t(k)]);
  EXPECT_NEAR(l.confidence_sum, want_bce, 1e-12 * std::max(1.0, want_bce));
  EXPECT_GT(l.ce_sum, 0.0);
  EXPECT_GT(l.l1_sum, 0.0);

  struct Param {
    const char* name;
    std::vector<double>* value;
    const std::vector<double>* grad;
  } params[] = {{"markov_w1", &b.w1, &g1},
                {"markov_w2", &b.w2, &g2},
                {"gate_proj.weight", &b.gw, &ggw},
                {"gate_proj.bias", &b.gb, &ggb},
                {"joint_proj.weight", &b.jw, &gjw},
                {"joint_proj.bias", &b.jb, &gjb},
                {"confidence.weight", &b.cw, &gcw},
                {"confidence.bias", &b.cb, &gcb},
                {"z", &b.z, &dz}};
  for (const Param& pr : params) {
    if (pr.value->empty()) continue;
    const df::testing::FdError e = fd_check(*pr.value, *pr.grad, [&] { return b.loss(acc); });
    EXPECT_GT(e.ref2, 1e-8) << pr.name << ": the loss must depend on it";
    EXPECT_LE(e.rel_rms, 1e-6) << pr.name << " (head " << drafter_markov_head_name(d.markov_head_type)
                               << ", rank " << d.markov_rank << ", confidence " << d.confidence
                               << ", with markov " << d.confidence_with_markov << ", all weighted "
                               << all_weighted << ")";
  }
}

}  // namespace

TEST(DSparkHead, RowsShiftLabelsAndAHoleEndsTheBlock) {
  const DSparkHeadDims d = dims(DrafterMarkovHead::vanilla, 3, true, true);
  const std::vector<int32_t> tokens = {3, 9, 1, 4, 10, 0};
  const std::vector<uint8_t> mask = {1, 1, 1, 1, 0, 1};
  const int64_t len = int64_t(tokens.size());
  // Anchor 1: labels x[2..6]; x[4] is a hole, so slots 2.. carry nothing even where x[5] is supervised.
  DSparkBlockRows r = dspark_block_rows(d, tokens.data(), mask.data(), len, 1, 2.0);
  EXPECT_EQ(r.labels, (std::vector<int32_t>{1, 4, 10, 0, 0}));
  EXPECT_EQ(r.prev, (std::vector<int32_t>{9, 1, 4, 10, 0}));
  EXPECT_EQ(r.target_pos, (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(r.weights, (std::vector<double>{1.0, std::exp(-0.5), 0.0, 0.0, 0.0}));
  // Anchor 4 (mask on x[4] does not matter: only labels are checked): x[5] then the sequence end.
  r = dspark_block_rows(d, tokens.data(), mask.data(), len, 4, 2.0);
  EXPECT_EQ(r.labels, (std::vector<int32_t>{0, 0, 0, 0, 0}));
  EXPECT_EQ(r.prev, (std::vector<int32_t>{10, 0, 0, 0, 0}));
  EXPECT_EQ(r.target_pos, (std::vector<int64_t>{4, 5, 5, 5, 5}));
  EXPECT_EQ(r.weights, (std::vector<double>{1.0, 0.0, 0.0, 0.0, 0.0}));
  // A padding block carries no weight.
  r = dspark_block_rows(d, tokens.data(), mask.data(), len, -1, 2.0);
  EXPECT_EQ(r.weights, std::vector<double>(5, 0.0));
  EXPECT_THROW(dspark_block_rows(d, tokens.data(), mask.data(), len, 6, 2.0), Error);
}

TEST(DSparkHead, ParametersJoinTheDrafterTable) {
  DrafterConfig c = tiny_drafter_config();  // H 16, V 37
  const int64_t dflash_total = drafter_param_table(c).total;
  c.kind = DrafterKind::dspark;
  c.markov_rank = 3;
  c.markov_head_type = DrafterMarkovHead::rnn;
  c.enable_confidence_head = true;
  c.confidence_head_with_markov = true;
  const DrafterParamTable t = drafter_param_table(c);
  const DrafterParamEntry& jw = t.find("markov_head.joint_proj.weight");
  EXPECT_EQ(jw.rows, 9);
  EXPECT_EQ(jw.cols, 2 * 3 + 16);
  EXPECT_TRUE(jw.decay);
  EXPECT_LT(jw.offset, t.n_decay);
  const DrafterParamEntry& jb = t.find("markov_head.joint_proj.bias");
  EXPECT_FALSE(jb.decay);
  EXPECT_GE(jb.offset, t.n_decay);
  EXPECT_EQ(t.find("markov_head.markov_w1.weight").rows, 37);
  EXPECT_EQ(t.find("confidence_head.proj.weight").cols, 16 + 3);
  EXPECT_EQ(t.find("confidence_head.proj.bias").cols, 1);
  EXPECT_THROW(t.find("markov_head.gate_proj.weight"), Error);
  // Every entry 64-aligned: the head adds its 6 tensors' aligned sizes.
  int64_t head = 0;
  for (const DSparkHeadParam& p : dspark_head_params(dspark_head_dims(c)))
    head += (p.rows * p.cols + 63) / 64 * 64;
  EXPECT_EQ(t.total, dflash_total + head);
  // Without a Markov head only the confidence head remains.
  c.markov_rank = 0;
  c.confidence_head_with_markov = false;
  const std::vector<DSparkHeadParam> only_conf = dspark_head_params(dspark_head_dims(c));
  ASSERT_EQ(only_conf.size(), 2u);
  EXPECT_EQ(only_conf[0].name, "confidence_head.proj.weight");
  EXPECT_EQ(only_conf[0].cols, 16);
}

TEST(DSparkHead, VanillaBiasIsTheLowRankProductAndRankZeroHasNone) {
  for (int rank : {0, 2}) {
    const DSparkHeadDims d = dims(DrafterMarkovHead::vanilla, rank, false, false);
    const Block b(d, 21, false);
    std::vector<double> logits(size_t(d.block_size * d.vocab));
    b.step(&logits, nullptr, nullptr, nullptr);
    for (int k = 0; k < d.block_size; ++k)
      for (int v = 0; v < d.vocab; ++v) {
        double want = 0;
        for (int i = 0; i < d.hidden; ++i)
          want += b.lm[size_t(v * d.hidden + i)] * b.z[size_t(k * d.hidden + i)];
        const int prev = b.rows.prev[size_t(k)];
        for (int r = 0; r < rank; ++r) want += b.w2[size_t(v * rank + r)] * b.w1[size_t(prev * rank + r)];
        EXPECT_NEAR(logits[size_t(k * d.vocab + v)], want, 1e-12) << "rank " << rank << " slot " << k;
      }
  }
}

TEST(DSparkHead, TargetHiddenIsNeededOnlyForL1AndConfidence) {
  const DSparkHeadDims d = dims(DrafterMarkovHead::gated, 2, true, true);
  Block b(d, 3, false);
  b.alpha = {1.0, 0.0, 0.0};
  EXPECT_FALSE(dspark_needs_target_hidden(d, b.alpha));
  const DSparkBlockLoss l = dspark_block_step<double>(d, b.weights(), b.lm.data(), b.z.data(), nullptr,
                                                      b.rows, b.alpha, nullptr, nullptr, nullptr, nullptr);
  EXPECT_GT(l.ce_sum, 0.0);
  EXPECT_EQ(l.l1_sum, 0.0);
  EXPECT_EQ(l.confidence_sum, 0.0);
  b.alpha = {1.0, 0.0, 1.0};
  EXPECT_TRUE(dspark_needs_target_hidden(d, b.alpha));
  EXPECT_THROW(dspark_block_step<double>(d, b.weights(), b.lm.data(), b.z.data(), nullptr, b.rows, b.alpha,
                                         nullptr, nullptr, nullptr, nullptr),
               Error);
}

// Blocks of B = 4 at anchors 0, 1, 2, 7, 11 of one sequence and 3, 4 of another (starting at token 20), a
// padding block (row 0): row j·B + k reads target row a_j + k. Every chunk's list holds its rows' target rows
// once each, in increasing order, and each row finds its own through local.
TEST(DSparkHead, TargetPlanListsEachChunksDistinctRowsOnce) {
  std::vector<int32_t> rows;
  for (int a : {0, 1, 2, 7, 11, 23, 24})
    for (int k = 0; k < 4; ++k) rows.push_back(a + k);
  for (int k = 0; k < 4; ++k) rows.push_back(0);
  const int64_t N = int64_t(rows.size());
  for (int64_t chunk : {int64_t(1), int64_t(3), int64_t(8), int64_t(12), N, N + 5}) {
    const DSparkTargetPlan p = dspark_target_plan(rows.data(), N, chunk);
    const int64_t chunks = (N + chunk - 1) / chunk;
    ASSERT_EQ(int64_t(p.start.size()), chunks + 1) << chunk;
    EXPECT_EQ(p.start.front(), 0);
    EXPECT_EQ(p.start.back(), int64_t(p.list.size()));
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t r0 = c * chunk, r1 = std::min(N, r0 + chunk);
      std::vector<int32_t> want(rows.begin() + r0, rows.begin() + r1);
      std::sort(want.begin(), want.end());
      want.erase(std::unique(want.begin(), want.end()), want.end());
      const std::vector<int32_t> got(p.list.begin() + p.start[size_t(c)],
                                     p.list.begin() + p.start[size_t(c) + 1]);
      EXPECT_EQ(got, want) << "chunk " << c << " of " << chunk << " rows";
      for (int64_t r = r0; r < r1; ++r) {
        ASSERT_LT(p.local[size_t(r)], int32_t(got.size())) << r;
        EXPECT_EQ(got[size_t(p.local[size_t(r)])], rows[size_t(r)]) << "row " << r << ", chunk of " << chunk;
      }
    }
  }
  // One chunk over everything: the overlapping blocks read 19 distinct rows of the 32.
  EXPECT_EQ(dspark_target_plan(rows.data(), N, N).list.size(), size_t(19));
}

TEST(DSparkHead, AnalyticBackwardMatchesFiniteDifferences) {
  uint64_t seed = 100;
  for (DrafterMarkovHead type :
       {DrafterMarkovHead::vanilla, DrafterMarkovHead::gated, DrafterMarkovHead::rnn})
    for (int rank : {1, 3})
      for (bool with_markov : {false, true})
        for (bool all_weighted : {false, true})
          expect_fd_gradients(dims(type, rank, true, with_markov), all_weighted, seed += 10);
  // No Markov head: the confidence head reads h alone; no head at all: CE + L1 on the backbone's logits.
  expect_fd_gradients(dims(DrafterMarkovHead::vanilla, 0, true, false), true, 7);
  expect_fd_gradients(dims(DrafterMarkovHead::rnn, 0, false, false), false, 8);
}

TEST(DSparkHead, Fp32OracleAgreesWithDouble) {
  const DSparkHeadDims d = dims(DrafterMarkovHead::rnn, 3, true, true);
  const Block b(d, 5, true);
  auto f = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  const std::vector<float> w1 = f(b.w1), w2 = f(b.w2), jw = f(b.jw), jb = f(b.jb), cw = f(b.cw), cb = f(b.cb),
                           lm = f(b.lm), z = f(b.z), th = f(b.th);
  std::vector<float> g1(w1.size(), 0.0f), g2(w2.size(), 0.0f), gjw(jw.size(), 0.0f), gjb(jb.size(), 0.0f),
      gcw(cw.size(), 0.0f), gcb(cb.size(), 0.0f), dz(z.size(), 0.0f);
  const DSparkHeadTensors<float> grads{g1.data(),  g2.data(),  nullptr,    nullptr,
                                       gjw.data(), gjb.data(), gcw.data(), gcb.data()};
  const DSparkBlockLoss lf = dspark_block_step<float>(
      d, {w1.data(), w2.data(), nullptr, nullptr, jw.data(), jb.data(), cw.data(), cb.data()}, lm.data(),
      z.data(), th.data(), b.rows, b.alpha, nullptr, nullptr, &grads, dz.data());
  std::vector<double> d1(b.w1.size(), 0.0), d2(b.w2.size(), 0.0), djw(b.jw.size(), 0.0),
      djb(b.jb.size(), 0.0), dcw(b.cw.size(), 0.0), dcb(b.cb.size(), 0.0), dzd(b.z.size(), 0.0);
  const DSparkHeadTensors<double> grads_d{d1.data(),  d2.data(),  nullptr,    nullptr,
                                          djw.data(), djb.data(), dcw.data(), dcb.data()};
  const DSparkBlockLoss ld = b.step(nullptr, nullptr, &grads_d, dzd.data());
  EXPECT_NEAR(lf.ce_sum, ld.ce_sum, 1e-5 * std::fabs(ld.ce_sum));
  EXPECT_NEAR(lf.l1_sum, ld.l1_sum, 1e-5 * std::fabs(ld.l1_sum));
  EXPECT_NEAR(lf.confidence_sum, ld.confidence_sum, 1e-5 * std::fabs(ld.confidence_sum));
  for (size_t i = 0; i < gjw.size(); ++i) EXPECT_NEAR(gjw[i], djw[i], 1e-5 + 1e-4 * std::fabs(djw[i])) << i;
  for (size_t i = 0; i < g1.size(); ++i) EXPECT_NEAR(g1[i], d1[i], 1e-5 + 1e-4 * std::fabs(d1[i])) << i;
  for (size_t i = 0; i < dz.size(); ++i) EXPECT_NEAR(dz[i], dzd[i], 1e-5 + 1e-4 * std::fabs(dzd[i])) << i;
}
