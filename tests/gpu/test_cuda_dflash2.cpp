// DFlash2's CUDA ops (kernels/train/dflash2_conv.cu, dflash2_selector.cu) against the CPU fp32 oracle
// (ops/cpu/cpu_dflash2.cpp) on awkward shapes: the in-block convolution forward and backward (odd H, groups
// of 1, 3 and 5 channels and the 8-channel vector path with groups of 8, 16 and 24, blocks of 3, 4 and 8, 1
// to 4 taps, both sides, more than 16 rows for several ∂/∂base chunks), the selector loss (odd H and V, K
// from 1 to 64 and larger than a thread's share of the vocabulary, chunks of 1 row to all rows, padding
// blocks and holes, gold labels outside the top-K, softcap, stop_gradient, beta_dw 0 and 1) and the greedy
// lattice walk. Prints the worst element of every comparison. Skips itself without a GPU; one skipped test in
// a build without CUDA.
#include <gtest/gtest.h>

#ifndef DF_HAVE_CUDA
TEST(CudaDflash2, SkippedWithoutCudaBuild) {
  GTEST_SKIP() << "built without CUDA: GPU DFlash2 tests skipped";
}
#else
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "kernels/train/loss_slots.h"
#include "kernels/train_launchers.cuh"
#include "ops/cpu/cpu_train_ops.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_train_ops.h"
#include "tests/gpu/cuda_drafter_test_util.h"
#include "tests/unit/target_test_util.h"
#include "tests/unit/test_drafter_util.h"

using namespace df;
using namespace df::testing;

namespace {

std::vector<float> bf16_vec(size_t n, double std, uint64_t seed) {
  std::vector<float> v = normal_vec(n, float(std), seed);
  for (float& x : v) x = bf16_round(x);
  return v;
}

double rel_err(double got, double want) {
  return std::fabs(got - want) / std::max(std::fabs(want), 1e-30);
}

using CudaDflash2 = CudaTrainFixture;

// ---- the convolution ----

struct ConvCase {
  int64_t nb;
  int B, H, taps, gs;
};

struct ConvRun {
  std::vector<float> out, du, dcoeff, dbase;
};

// One side's forward (with a residual on side 1) and backward on `ops`; dcoeff's other side and dbase start
// as `fill_dc` / from prior_dbase with beta 1 (beta 0: NaN, never read).
ConvRun run_conv(TrainOps& ops, const ConvCase& c, int side, const std::vector<float>& u,
                 const std::vector<float>& coeff, const std::vector<float>& base,
                 const std::vector<float>& resid, const std::vector<float>& dout,
                 const std::vector<float>* prior_dbase) {
  Dev d(ops);
  Dflash2ConvDims dm{c.H, c.B, c.taps, c.gs};
  const int64_t N = c.nb * c.B, C = dm.coeffs();
  const Tensor tu = d.act(u, N, c.H), tc = d.act(coeff, N, C), tb = d.up(base, DType::f32, 2 * c.taps, c.H);
  const Tensor out = d.act(std::vector<float>(size_t(N * c.H), NAN), N, c.H);
  ops.dflash2_conv_fwd(tu, tb, tc, side, side == 1 ? d.act(resid, N, c.H) : Tensor{}, out, dm);
  const Tensor du = d.act(std::vector<float>(size_t(N * c.H), NAN), N, c.H);
  const Tensor dc = d.act(std::vector<float>(size_t(N * C), 0.25f), N, C);
  const Tensor db = d.up(prior_dbase ? *prior_dbase : std::vector<float>(size_t(2 * c.taps * c.H), NAN),
                         DType::f32, 2 * c.taps, c.H);
  ops.dflash2_conv_bwd(tu, tb, tc, side, d.act(dout, N, c.H), du, dc, db, prior_dbase ? 1.0f : 0.0f, dm);
  ConvRun r{d.f32(out), d.f32(du), d.f32(dc), d.down<float>(db)};
  return r;
}

}  // namespace

// Every output is a short sum (≤ taps terms for out and du, gs·taps for dcoeff, N for dbase) of bf16 inputs,
// rounded once to bf16 on the GPU (f32 dbase): rel-RMS within 1e-2 of the oracle's (bf16's 2^-9 per rounding
// plus f32 order), dbase within 1e-4. The other side's dcoeff columns stay as they were (0.25) on both
// backends, and rows past the block's start read nothing across the boundary (the oracle's check). A second
// backward with beta 1 doubles dbase; a repeat gives the same bits.
TEST_F(CudaDflash2, ConvForwardAndBackwardMatchTheCpuOracle) {
  const ConvCase cases[] = {{5, 3, 15, 1, 5}, {4, 4, 15, 4, 3}, {3, 8, 33, 2, 1},  {2, 8, 48, 3, 16},
                            {7, 3, 9, 3, 9},  {3, 8, 40, 2, 8}, {2, 4, 48, 4, 24}, {41, 8, 64, 2, 16}};
  for (const ConvCase& c : cases) {
    const Dflash2ConvDims dm{c.H, c.B, c.taps, c.gs};
    const int64_t N = c.nb * c.B, C = dm.coeffs();
    const uint64_t seed = uint64_t(c.B * 100 + c.H + c.taps);
    const std::vector<float> u = bf16_vec(size_t(N * c.H), 1.0, seed),
                             coeff = bf16_vec(size_t(N * C), 0.5, seed + 1),
                             base = bf16_vec(size_t(2 * c.taps * c.H), 0.7, seed + 2),
                             resid = bf16_vec(size_t(N * c.H), 1.0, seed + 3),
                             dout = bf16_vec(size_t(N * c.H), 1.0, seed + 4);
    for (int side = 0; side < 2; ++side) {
      const std::string name = "nb " + std::to_string(c.nb) + " B " + std::to_string(c.B) + " H " +
                               std::to_string(c.H) + " taps " + std::to_string(c.taps) + " group " +
                               std::to_string(c.gs) + " side " + std::to_string(side);
      const ConvRun rc = run_conv(cpu_, c, side, u, coeff, base, resid, dout, nullptr);
      const ConvRun rg = run_conv(*gpu_, c, side, u, coeff, base, resid, dout, nullptr);
      const double e_out = rel_rms(rg.out, rc.out), e_du = rel_rms(rg.du, rc.du),
                   e_dc = rel_rms(rg.dcoeff, rc.dcoeff);
      // dbase: the side's rows are compared; the other side's rows are NaN on both (beta 0 never reads them).
      const size_t half = size_t(c.taps * c.H), off = size_t(side) * half;
      const std::vector<float> gb(rg.dbase.begin() + off, rg.dbase.begin() + off + half),
          cb(rc.dbase.begin() + off, rc.dbase.begin() + off + half);
      const double e_db = rel_rms(gb, cb);
      std::printf("[ conv   ] %s: out %.3e du %.3e dcoeff %.3e dbase %.3e (rel-RMS)\n", name.c_str(), e_out,
                  e_du, e_dc, e_db);
      EXPECT_LE(e_out, 1e-2) << name;
      EXPECT_LE(e_du, 1e-2) << name;
      EXPECT_LE(e_dc, 1e-2) << name;
      EXPECT_LE(e_db, 1e-4) << name;
      for (int64_t r = 0; r < N; ++r)
        for (int64_t j = 0; j < C; ++j)
          if ((j < C / 2) != (side == 0))
            ASSERT_EQ(rg.dcoeff[size_t(r * C + j)], 0.25f) << name << " other side";
      const ConvRun again = run_conv(*gpu_, c, side, u, coeff, base, resid, dout, nullptr);
      EXPECT_TRUE(same_bits(again.out, rg.out) && same_bits(again.du, rg.du) &&
                  same_bits(again.dbase, rg.dbase))
          << name << ": repeat";
      std::vector<float> prior(rg.dbase.size(), 0.0f);
      std::copy(gb.begin(), gb.end(), prior.begin() + long(off));
      const ConvRun acc = run_conv(*gpu_, c, side, u, coeff, base, resid, dout, &prior);
      std::vector<float> twice(half), got(acc.dbase.begin() + off, acc.dbase.begin() + off + half);
      for (size_t i = 0; i < half; ++i) twice[i] = 2.0f * gb[i];
      EXPECT_LE(rel_rms(got, twice), 1e-6) << name << ": beta 1";
    }
  }
}

// ---- the selector ----

namespace {

struct SelCase {
  int64_t nb;
  int B, H, V, R, K;
  double mult, softcap;
  int64_t chunk;
};

std::string name_of(const SelCase& c) {
  char b[200];
  std::snprintf(b, sizeof b, "nb %lld B %d H %d V %d R %d K %d mult %g softcap %g chunk %lld",
                (long long)c.nb, c.B, c.H, c.V, c.R, c.K, c.mult, c.softcap, (long long)c.chunk);
  return b;
}

struct SelInputs {
  Dflash2SelectorDims d;
  int64_t N = 0;
  std::vector<float> y, lm, pred, succ, proj, row_w;
  std::vector<int32_t> labels, prev;
};

// bf16-representable inputs: block 0 is padding, a quarter of the other rows are holes; half the labels are a
// row's argmax-ish token (so the gold is often inside the top-K) and half random (often outside).
SelInputs sel_inputs(const SelCase& c, uint64_t seed) {
  SelInputs in;
  in.d = {c.H, c.V, c.R, c.K, c.B, c.mult, c.softcap};
  in.N = c.nb * c.B;
  const size_t N = size_t(in.N), H = size_t(c.H), V = size_t(c.V), R = size_t(c.R);
  in.y = bf16_vec(N * H, 1.0, seed * 8 + 1);
  in.lm = bf16_vec(V * H, 2.0 / std::sqrt(double(H)), seed * 8 + 2);
  in.pred = bf16_vec(V * R, 1.0, seed * 8 + 3);
  in.succ = bf16_vec(V * R, 1.0, seed * 8 + 4);
  in.proj = bf16_vec(R * H, 1.0 / std::sqrt(double(H * R)), seed * 8 + 5);
  Rng r(seed);
  for (int64_t i = 0; i < in.N; ++i) {
    const int k = int(i % c.B);
    int32_t lab = int32_t(r.below(uint64_t(c.V)));
    if (r.below(2) == 0) {  // the row's best logit
      double best = -1e300;
      for (int v = 0; v < c.V; ++v) {
        double s = 0;
        for (int h = 0; h < c.H; ++h)
          s += double(in.lm[size_t(v) * H + size_t(h)]) * in.y[size_t(i) * H + size_t(h)];
        if (s > best) best = s, lab = v;
      }
    }
    in.labels.push_back(lab);
    in.prev.push_back(int32_t(r.below(uint64_t(c.V))));
    const bool hole = i < c.B || k == 0 || r.below(4) == 0;
    in.row_w.push_back(hole ? 0.0f : float(std::exp(-double(k - 1) / 3.0)));
  }
  return in;
}

struct SelRun {
  std::vector<float> dy, dw[3];
  std::vector<int32_t> argmax;
  std::vector<double> stats;
};

SelRun run_sel(TrainOps& ops, const SelInputs& in, double alpha, bool stop_gradient, bool backward,
               const SelRun* prior = nullptr) {
  Dev d(ops);
  const Dflash2SelectorDims& dm = in.d;
  const int64_t H = dm.hidden, V = dm.vocab, R = dm.rank, N = in.N;
  const int64_t shapes[3][2] = {{V, R}, {V, R}, {R, H}};
  const std::vector<float>* wv[3] = {&in.pred, &in.succ, &in.proj};
  TrainOps::Dflash2SelectorWeights w, dw;
  Tensor* wt[3] = {&w.predecessor_codebook, &w.successor_codebook, &w.hidden_projection};
  Tensor* gt[3] = {&dw.predecessor_codebook, &dw.successor_codebook, &dw.hidden_projection};
  for (int i = 0; i < 3; ++i) {
    *wt[i] = d.act(*wv[i], shapes[i][0], shapes[i][1]);
    *gt[i] = d.up(prior ? prior->dw[i] : std::vector<float>(size_t(shapes[i][0] * shapes[i][1]), NAN),
                  DType::f32, shapes[i][0], shapes[i][1]);
  }
  const int slots = LossStatsSlots::size(dm.block_size);
  const Tensor stats = d.up(std::vector<double>(size_t(slots), 0.0), DType::u8, 1, slots * 8);
  const Tensor argmax = d.up(std::vector<int32_t>(size_t(N), 7), DType::i32, 1, N);
  const Tensor dy = d.act(std::vector<float>(size_t(N * H), NAN), N, H);
  TrainOps::Dflash2SelectorArgs a;
  a.dims = dm;
  a.alpha = alpha;
  a.stop_gradient = stop_gradient;
  a.backward = backward;
  a.beta_dw = prior ? 1.0f : 0.0f;
  ops.dflash2_selector_loss(d.act(in.y, N, H), d.act(in.lm, V, H), w, d.up(in.labels, DType::i32, 1, N),
                            d.up(in.prev, DType::i32, 1, N), d.up(in.row_w, DType::f32, 1, N), a, argmax, dy,
                            dw, stats);
  SelRun r;
  r.argmax = d.down<int32_t>(argmax);
  r.stats = d.down<double>(stats);
  if (!backward) return r;
  r.dy = d.f32(dy);
  for (int i = 0; i < 3; ++i) r.dw[i] = d.down<float>(*gt[i]);
  return r;
}

}  // namespace

// The GPU's logits come from bf16 operands (the oracle's from the same values in f32) and its softmaxes run
// in f32 with fast exp/log: Σ w·(CE + α·CE_sel) within 2e-2 relative, Σ w within 1e-6; every gradient within
// 3e-2 relative RMS (the codebook gradients are sums of ∂/∂score·ctx rows in a fixed order; a candidate set
// that differs on a near tie moves a few rows, which this bound also covers on these sizes). Labelled-row
// counts exact; an argmax may flip on a near tie (at most 2 rows or 5 %). A repeat gives the same bits (no
// float atomics), a forward-only call the same argmax and statistics, beta_dw 1 adds the same gradients.
TEST_F(CudaDflash2, SelectorLossMatchesTheCpuOracle) {
  const SelCase cases[] = {{5, 3, 13, 37, 3, 16, 1.0, 0.0, 4},     {4, 4, 13, 37, 5, 1, 1.0, 0.0, 1},
                           {6, 8, 9, 101, 7, 8, 0.7, 5.0, 1000},   {9, 16, 64, 999, 24, 64, 1.0, 0.0, 64},
                           {3, 8, 31, 4099, 17, 16, 1.3, 30.0, 5}, {2, 3, 7, 64, 2, 64, 1.0, 0.0, 3}};
  for (const SelCase& c : cases)
    for (const bool stop : {false, true}) {
      const std::string name = name_of(c) + (stop ? " stop_gradient" : "");
      const SelInputs in = sel_inputs(c, uint64_t(c.nb * 100 + c.B * 10 + c.K));
      const double alpha = 0.6;
      CudaTrainOps gpu(0, c.chunk);
      const SelRun rc = run_sel(cpu_, in, alpha, stop, true), rg = run_sel(gpu, in, alpha, stop, true);
      EXPECT_LE(rel_err(rg.stats[0], rc.stats[0]), 2e-2)
          << name << " loss_sum " << rg.stats[0] << " vs " << rc.stats[0];
      EXPECT_LE(rel_err(rg.stats[1], rc.stats[1]), 1e-6) << name << " weight_sum";
      int64_t flips = 0, weighted = 0;
      for (int64_t i = 0; i < in.N; ++i) {
        weighted += in.row_w[size_t(i)] != 0.0f;
        flips += rg.argmax[size_t(i)] != rc.argmax[size_t(i)];
        if (in.row_w[size_t(i)] == 0.0f) EXPECT_EQ(rg.argmax[size_t(i)], -1) << name << " row " << i;
      }
      EXPECT_LE(flips, std::max<int64_t>(2, weighted / 20)) << name;
      for (int k = 1; k < c.B; ++k)
        EXPECT_EQ(rg.stats[size_t(LossStatsSlots::count(c.B, k))],
                  rc.stats[size_t(LossStatsSlots::count(c.B, k))])
            << name << " offset " << k;
      const double e_dy = rel_rms(rg.dy, rc.dy);
      std::printf("[ select ] %s: loss %.6g vs %.6g, dy rel-RMS %.3e\n", name.c_str(), rg.stats[0],
                  rc.stats[0], e_dy);
      EXPECT_LE(e_dy, 3e-2) << name << " dy";
      const char* wn[3] = {"predecessor_codebook", "successor_codebook", "hidden_projection"};
      for (int i = 0; i < 3; ++i) {
        const double e = rel_rms(rg.dw[i], rc.dw[i]);
        std::printf("[ select ] %s: %s rel-RMS %.3e\n", name.c_str(), wn[i], e);
        EXPECT_LE(e, 3e-2) << name << " " << wn[i];
      }
      const SelRun again = run_sel(gpu, in, alpha, stop, true);
      EXPECT_TRUE(same_bits(again.dy, rg.dy) && again.argmax == rg.argmax && again.stats == rg.stats) << name;
      for (int i = 0; i < 3; ++i)
        EXPECT_TRUE(same_bits(again.dw[i], rg.dw[i])) << name << " repeat " << wn[i];
      const SelRun fwd = run_sel(gpu, in, alpha, stop, false);
      EXPECT_TRUE(fwd.argmax == rg.argmax && fwd.stats == rg.stats) << name << ": forward-only";
      const SelRun acc = run_sel(gpu, in, alpha, stop, true, &rg);
      for (int i = 0; i < 3; ++i) {
        std::vector<float> twice(rg.dw[i].size());
        for (size_t j = 0; j < twice.size(); ++j) twice[j] = 2.0f * rg.dw[i][j];
        EXPECT_LE(rel_rms(acc.dw[i], twice), 1e-5) << name << " beta_dw 1 " << wn[i];
      }
    }
}

// The selector loss on logits that are exact on both backends (every lm_head row has one nonzero bf16 entry,
// so each logit is one exact product): every token ties with hundreds of others of its class, the 40 last
// tokens (the row's last slice and partial float4) beat all the rest, V = 4099; the gold label is the token
// tied with the K-th candidate just past it by id (outside the top-K), the K-th candidate itself, or random;
// K of 1, 16 and 64. The candidate sets must be the oracle's exactly: the tokens with a nonzero
// successor-codebook gradient row are the same set on both backends (K > 1; with one candidate ∂/∂score is
// 0); losses and gradients within the main test's bounds.
TEST_F(CudaDflash2, SelectorLossOnTiedLogitsMatchesTheCpuOracle) {
  for (const int K : {1, 16, 64}) {
    const SelCase c{6, 4, 16, 4099, 8, K, 1.0, 0.0, 7};
    const std::string name = "tied logits K " + std::to_string(K);
    SelInputs in = sel_inputs(c, 77 + uint64_t(K));
    const size_t H = size_t(c.H), V = size_t(c.V);
    std::fill(in.lm.begin(), in.lm.end(), 0.0f);
    for (size_t v = 0; v < V; ++v) in.lm[v * H + v % H] = v + 40 >= V ? 2.0f : 1.0f;
    Rng r(5);
    for (float& x : in.y) x = bf16_round(1.0f + float(r.below(60)) / 64.0f);
    for (int64_t i = 0; i < in.N; ++i) {
      std::vector<float> logits(V);
      for (size_t v = 0; v < V; ++v) logits[v] = in.y[size_t(i) * H + v % H] * in.lm[v * H + v % H];
      const Dflash2Candidates top = dflash2_selector_candidates<float>(in.d, logits.data(), -1);
      const int32_t kth = top.ids[size_t(K - 1)];
      int32_t past = kth;  // the next token by id tied with the K-th candidate
      for (size_t v = size_t(kth) + 1; v < V && past == kth; ++v)
        if (logits[v] == logits[size_t(kth)]) past = int32_t(v);
      const int pick = int(i % 3);
      if (pick == 0) in.labels[size_t(i)] = past;
      if (pick == 1) in.labels[size_t(i)] = kth;
    }
    CudaTrainOps gpu(0, c.chunk);
    for (const bool stop : {false, true}) {
      const SelRun rc = run_sel(cpu_, in, 0.6, stop, true), rg = run_sel(gpu, in, 0.6, stop, true);
      EXPECT_LE(rel_err(rg.stats[0], rc.stats[0]), 2e-2) << name << " loss_sum";
      EXPECT_LE(rel_rms(rg.dy, rc.dy), 3e-2) << name << " dy";
      for (int w = 0; w < 3; ++w) EXPECT_LE(rel_rms(rg.dw[w], rc.dw[w]), 3e-2) << name << " weight " << w;
      int64_t candidates = 0;
      for (size_t v = 0; v < V; ++v) {
        bool nz_c = false, nz_g = false;
        for (size_t j = 0; j < size_t(c.R); ++j) {
          nz_c = nz_c || rc.dw[1][v * size_t(c.R) + j] != 0.0f;
          nz_g = nz_g || rg.dw[1][v * size_t(c.R) + j] != 0.0f;
        }
        candidates += nz_c;
        EXPECT_EQ(nz_g, nz_c) << name << (stop ? " stop_gradient" : "") << ": token " << v
                              << (nz_c ? " is" : " is not") << " a candidate of the oracle";
      }
      if (K > 1) EXPECT_GE(candidates, K) << name;  // K = 1: one candidate, ∂/∂score 0
    }
  }
}

// The device top-K (kernels/train/row_topk.cuh, through dflash2_topk_rows_launch, which the proposals use and
// whose warp lists and merges the selector loss shares) equals the oracle's strict top-K exactly, ids and
// values, on rows built to break it: integer logits (hundreds of ties at the K-th place), the K best all in
// the row's last slice and last partial float4, every value equal, −inf everywhere but one, signed zeros,
// K − 1 distinct leaders then thousands tied; K from 1 to 64; V of 37 (fewer elements than a CTA's
// threads), 4099 and 250,003 (not a multiple of 4) and the 27B vocabulary; the row stride padded as the
// selector's workspace pads it. A row of NaN but fewer than K values (the oracle cannot order NaN) gives
// those values in order, then id 0 with a NaN value: never an id outside the vocabulary for the walk to read.
// The sm80-profile ctest entry runs it with one CTA a row.
TEST_F(CudaDflash2, TopKRowsAreTheOraclesStrictTopK) {
  const int Ks[] = {1, 2, 16, 33, 64};
  const int64_t Vs[] = {37, 4099, 250003, 248320};
  const char* kinds[] = {"normal",       "integers",     "ascending",         "all equal",
                         "-inf but one", "signed zeros", "leaders then ties", "NaN but K / 2"};
  constexpr int kKinds = 8;
  constexpr int kNanKind = 7;
  for (const int64_t V : Vs)
    for (const int K : Ks) {
      if (K > V) continue;
      const int64_t ld = (V + 7) / 8 * 8;
      std::vector<float> z(size_t(kKinds * ld), NAN);
      Rng rng(uint64_t(V * 131 + K));
      const auto value = [&](int kind, int64_t v) {
        if (kind == 0) return float(int64_t(rng.below(2001)) - 1000) / 250.0f;
        if (kind == 1) return float(int64_t(rng.below(7)) - 3);
        if (kind == 2) return float(v) * 1e-3f - 7.0f;
        if (kind == 3) return 0.5f;
        if (kind == 4) return v == V / 3 ? -1e30f : -INFINITY;
        if (kind == 5) return rng.below(2) ? 0.0f : -0.0f;
        if (kind == kNanKind) return v % 13 == 4 && v / 13 < K / 2 ? float(v % 5) : NAN;
        return v % 97 == 5 && v / 97 < K - 1 ? 10.0f + float(v) : 1.0f;
      };
      for (int k = 0; k < kKinds; ++k)
        for (int64_t v = 0; v < V; ++v) z[size_t(k * ld + v)] = value(k, v);
      Dev d(*gpu_);
      const Tensor tz = d.up(z, DType::f32, kKinds, ld);
      const Tensor cand = d.up(std::vector<int32_t>(size_t(kKinds * K), -7), DType::i32, kKinds, K);
      const Tensor cval = d.up(std::vector<float>(size_t(kKinds * K), NAN), DType::f32, kKinds, K);
      dflash2_topk_rows_launch(static_cast<const float*>(tz.data), ld, V, K, kKinds,
                               static_cast<int32_t*>(cand.data), static_cast<float*>(cval.data), nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<int32_t> ids = d.down<int32_t>(cand);
      const std::vector<float> vals = d.down<float>(cval);
      Dflash2SelectorDims dm;
      dm.vocab = int(V);
      dm.top_k = K;
      for (int k = 0; k < kKinds; ++k) {
        if (k == kNanKind) {
          const float* row = &z[size_t(k * ld)];
          std::vector<int32_t> real;
          for (int32_t v = 0; v < int32_t(V); ++v)
            if (!std::isnan(row[v])) real.push_back(v);
          std::sort(real.begin(), real.end(),
                    [&](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
          for (int j = 0; j < K; ++j) {
            const size_t e = size_t(k * K + j);
            const bool filled = j < int(real.size());
            ASSERT_EQ(ids[e], filled ? real[size_t(j)] : 0)
                << kinds[k] << " V " << V << " K " << K << " place " << j;
            if (filled)
              ASSERT_EQ(vals[e], row[real[size_t(j)]])
                  << kinds[k] << " V " << V << " K " << K << " place " << j;
            else
              ASSERT_TRUE(std::isnan(vals[e])) << kinds[k] << " V " << V << " K " << K << " place " << j;
          }
          continue;
        }
        const Dflash2Candidates want = dflash2_selector_candidates<float>(dm, &z[size_t(k * ld)], -1);
        for (int j = 0; j < K; ++j) {
          const size_t e = size_t(k * K + j);
          ASSERT_EQ(ids[e], want.ids[size_t(j)]) << kinds[k] << " V " << V << " K " << K << " place " << j;
          ASSERT_TRUE(
              same_bits(std::vector<float>{vals[e]}, std::vector<float>{z[size_t(k * ld) + size_t(ids[e])]}))
              << kinds[k] << " V " << V << " K " << K << " place " << j << " value";
        }
      }
    }
}

// The greedy lattice walk on the GPU: each proposal, given the GPU's previous one, is a strict top-K
// candidate of its slot in the oracle's f32 logits (up to a near tie at the K-th place) and scores within
// bf16 error (2e-2·(1 + |best|)) of the best candidate's score, both scored on the host in double. A zero
// successor codebook makes the walk propose argmax(logits) per slot, as DFlash does.
TEST_F(CudaDflash2, ProposalsWalkTheOraclesLattice) {
  const SelCase cases[] = {{1, 8, 13, 37, 3, 16, 1.0, 0.0, 8},
                           {1, 16, 64, 999, 24, 8, 0.7, 5.0, 8},
                           {1, 3, 9, 101, 5, 64, 1.0, 0.0, 8}};
  for (const SelCase& c : cases)
    for (const bool zero_succ : {false, true}) {
      const std::string name = name_of(c) + (zero_succ ? " zero successor codebook" : "");
      SelInputs in = sel_inputs(c, 91 + uint64_t(c.K));
      if (zero_succ) std::fill(in.succ.begin(), in.succ.end(), 0.0f);
      Dev d(*gpu_);
      TrainOps::Dflash2SelectorWeights w{d.act(in.pred, c.V, c.R), d.act(in.succ, c.V, c.R),
                                         d.act(in.proj, c.R, c.H)};
      const int32_t first = 5;
      const std::vector<int32_t> drafts =
          gpu_->dflash2_selector_propose(d.act(in.y, c.B, c.H), d.act(in.lm, c.V, c.H), w, in.d, first);
      ASSERT_EQ(int(drafts.size()), c.B - 1) << name;
      int32_t prev = first;
      for (int k = 0; k < c.B - 1; ++k) {
        const float* z = &in.y[size_t(k + 1) * size_t(c.H)];
        std::vector<float> logits(size_t(c.V));
        for (int v = 0; v < c.V; ++v) {
          double s = 0;
          for (int h = 0; h < c.H; ++h) s += double(in.lm[size_t(v) * size_t(c.H) + size_t(h)]) * z[h];
          logits[size_t(v)] = float(s);
        }
        const Dflash2Candidates cand = dflash2_selector_candidates<float>(in.d, logits.data(), -1);
        std::vector<double> ctx(size_t(c.R));
        for (int r = 0; r < c.R; ++r) {
          double p = 0;
          for (int h = 0; h < c.H; ++h) p += double(in.proj[size_t(r) * size_t(c.H) + size_t(h)]) * z[h];
          ctx[size_t(r)] = double(in.pred[size_t(prev) * size_t(c.R) + size_t(r)]) * p;
        }
        const auto score = [&](int32_t t) {
          double s = dflash2_unary(in.d, double(logits[size_t(t)]));
          for (int r = 0; r < c.R; ++r) s += ctx[size_t(r)] * in.succ[size_t(t) * size_t(c.R) + size_t(r)];
          return s;
        };
        double best = -1e300;
        for (int32_t t : cand.ids) best = std::max(best, score(t));
        const int32_t got = drafts[size_t(k)];
        ASSERT_TRUE(got >= 0 && got < c.V) << name << " slot " << k + 1 << " token " << got;
        const double kth = dflash2_unary(in.d, double(logits[size_t(cand.ids.back())]));
        EXPECT_GE(dflash2_unary(in.d, double(logits[size_t(got)])), kth - 2e-2 * (1.0 + std::fabs(kth)))
            << name << " slot " << k + 1 << ": " << got << " is not a top-" << c.K << " candidate";
        EXPECT_GE(score(got), best - 2e-2 * (1.0 + std::fabs(best)))
            << name << " slot " << k + 1 << ": " << got << " scores " << score(got) << ", the best " << best;
        prev = got;
      }
    }
}

#endif
