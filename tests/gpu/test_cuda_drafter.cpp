// The drafter on the CUDA backend against the CPU fp32 oracle: loss_row_stats (kernels/train/loss_stats.cu)
// on awkward block counts and sizes, then whole drafter steps (bf16 activations, bf16 weight shadow,
// statistics on the device) on the tiny test drafter, DFlash and Domino, the shadow after AdamW, and Domino's
// head op (kernels/train/domino_head.cu) and its greedy proposals on awkward shapes. Prints the worst element
// of every comparison. Skips itself without a GPU; one skipped test in a build without CUDA.
#include <gtest/gtest.h>

#ifndef DF_HAVE_CUDA
TEST(CudaDrafter, SkippedWithoutCudaBuild) {
  GTEST_SKIP() << "built without CUDA: GPU drafter tests skipped";
}
#else
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_train_ops.h"
#include "tests/gpu/cuda_drafter_test_util.h"
#include "tests/unit/target_test_util.h"
#include "tests/unit/test_drafter_util.h"
#include "train/optimizer.h"

using namespace df;
using namespace df::testing;

namespace {

using CudaDrafter = CudaTrainFixture;

}  // namespace

// Weights: the kernel's double exp/pow against glibc's (each within 2 ulp of double) can move an f32 rounding
// by one ulp, and the streak prefix multiplies ≤ 15 such factors: |Δw| ≤ 16 ulp ≈ 1e-6 relative. Counts are
// integers: exact. Σ w·loss and Σ w: a tree of f64 partials against the host's sequential f64 sum, ≤ N·2^-52
// relative for N ≤ 12k rows, plus the f32 weight differences above: 2e-6 relative covers both.
TEST_F(CudaDrafter, LossRowStatsMatchesTheCpu) {
  struct Case {
    int64_t nb;
    int B;
  };
  for (Case c : {Case{1, 2}, Case{3, 5}, Case{37, 7}, Case{733, 16}})
    for (int mode = 0; mode < 3; ++mode) {  // 0 plain, 1 streak, 2 given weights
      const int64_t N = c.nb * c.B;
      Rng r(uint64_t(N * 3 + mode));
      const size_t n = static_cast<size_t>(N);
      std::vector<int32_t> labels(n), argmax(n);
      std::vector<uint8_t> active(n);
      std::vector<float> loss(n), p(n), w(n);
      for (int64_t i = 0; i < N; ++i) {
        active[size_t(i)] = i % c.B != 0 && r.below(4) != 0;
        labels[size_t(i)] = int32_t(r.below(9));
        argmax[size_t(i)] = r.below(2) ? labels[size_t(i)] : int32_t(r.below(9));
        loss[size_t(i)] = active[size_t(i)] ? float(4 * r.uniform()) : 0.0f;
        p[size_t(i)] = active[size_t(i)] ? float(r.uniform()) : 0.0f;
        w[size_t(i)] = mode == 2 ? float(r.uniform()) : -7.0f;
      }
      TrainOps::LossRowArgs a;
      a.block = c.B;
      a.gamma = 7.0f;
      a.streak = mode == 1;
      a.streak_alpha = 0.5f;
      a.weights_given = mode == 2;
      const int slots = LossStatsSlots::size(c.B);
      // Both backends start from the same non-zero block: the op adds.
      std::vector<double> st_cpu(size_t(slots), 1.0);
      std::vector<float> w_cpu = w;
      auto row = [](auto& v, DType dt) {
        return tensor_make(v.data(), dt, Device::cpu, 1, int64_t(v.size()));
      };
      cpu_.loss_row_stats(row(labels, DType::i32), row(active, DType::u8), row(loss, DType::f32),
                          row(p, DType::f32), row(argmax, DType::i32), a, row(w_cpu, DType::f32),
                          tensor_make(st_cpu.data(), DType::u8, Device::cpu, 1, slots * 8));
      Dev d(*gpu_);
      Tensor gw = d.up(w, DType::f32, 1, N),
             gst = d.up(std::vector<double>(size_t(slots), 1.0), DType::u8, 1, slots * 8);
      gpu_->loss_row_stats(d.up(labels, DType::i32, 1, N), d.up(active, DType::u8, 1, N),
                           d.up(loss, DType::f32, 1, N), d.up(p, DType::f32, 1, N),
                           d.up(argmax, DType::i32, 1, N), a, gw, gst);
      const std::string name = "loss_row_stats nb " + std::to_string(c.nb) + " B " + std::to_string(c.B) +
                               " mode " + std::to_string(mode);
      const std::vector<float> w_gpu = d.down<float>(gw);
      const std::vector<double> st_gpu = d.down<double>(gst);
      EXPECT_TRUE(report(name + " row_w", std::vector<double>(w_gpu.begin(), w_gpu.end()),
                         std::vector<double>(w_cpu.begin(), w_cpu.end()), 0, 1e-6));
      EXPECT_TRUE(report(name + " sums", {st_gpu[0], st_gpu[1]}, {st_cpu[0], st_cpu[1]}, 0, 2e-6));
      for (int i = 2; i < slots; ++i)
        EXPECT_EQ(st_gpu[size_t(i)], st_cpu[size_t(i)]) << name << " count slot " << i;
    }
}

// A whole drafter step, both losses, streak and noise: same init (counter-based), bf16-representable taps and
// tables. The GPU stores every activation in bf16 (2^-9 relative per store, ~40 stores deep through two
// layers and the loss) and multiplies bf16 weights: loss sums within 3e-2 relative; row weights depend on
// p_label through the streak and follow within the same bound. Counts of labelled rows are exact; argmax may
// flip on a near tie, so correct counts may differ by a few rows. Gradients: per tensor, cosine ≥ 0.98 and
// norm within 10% (bf16 rounding noise on a 2-layer network, far from a wrong formula, which gives cosines
// near 0 or norms off by a factor). The GPU runs the training path, its step's first backward writing the
// gradients over NaN (every element written, none read), against the oracle's zero-fill + accumulate; then a
// second GPU model whose gradients are zero-filled first (drafter_zero_grads: every backward adds) must give
// the same bits (the same GEMM plans serve beta 0 and 1, so beta 0's x and the fill's 0 + x differ at most in
// the sign of a zero).
namespace {

// One drafter step of host's config on both backends with options o, compared as described above; v names it
// in the messages.
void expect_step_matches(CudaTrainOps& gpu, TinySetup& host, const DrafterLossOptions& o,
                         const std::string& v) {
  const int64_t T = host.batch.offsets.back(), H = host.cfg.hidden, V = host.cfg.vocab;
  for (std::vector<float>* t : {&host.taps, &host.target_hidden, &host.embed, &host.lm_head})
    round_to_bf16(*t);
  DrafterModel gm(host.cfg, gpu);
  drafter_init_params(gm, 7);  // TinySetup's seed: identical master weights
  Dev d(gpu);
  gm.set_frozen(d.bf16(host.embed, V, H), d.bf16(host.lm_head, V, H));
  plan_workspace(gm, T, 4 * T);
  DrafterBatch gb = host.batch;
  gb.taps = d.bf16(host.taps, T, host.batch.taps.cols);
  gb.target_hidden = d.bf16(host.target_hidden, T, H);
  const std::vector<DrafterAnchor> an = {{0, 0}, {0, 4}, {0, 8}, {2, 1}, {0, -1}, {2, 6}, {2, 11}};
  drafter_zero_grads(*host.model);
  for (const DrafterParamEntry& e : gm.table().entries) gpu.fill(gm.entry_view(gm.grads, e.name), NAN);
  drafter_begin_step(gm);
  const LossStats sc = drafter_forward_backward(*host.model, host.batch, an, o);
  const LossStats sg = drafter_forward_backward(gm, gb, an, o);
  EXPECT_TRUE(report("step " + v + " loss_sum, weight_sum", {sg.loss_sum, sg.weight_sum},
                     {sc.loss_sum, sc.weight_sum}, 0, 3e-2));
  EXPECT_TRUE(report("step " + v + " row weights",
                     std::vector<double>(sg.row_weight.begin(), sg.row_weight.end()),
                     std::vector<double>(sc.row_weight.begin(), sc.row_weight.end()), 1e-3, 3e-2));
  EXPECT_EQ(sg.count, sc.count) << v;
  EXPECT_EQ(sg.tau_blocks, sc.tau_blocks) << v;
  for (size_t k = 0; k < sc.correct.size(); ++k)
    EXPECT_NEAR(double(sg.correct[k]), double(sc.correct[k]), 2) << v;
  const std::vector<float> g_gpu = d.down<float>(gm.grads);
  for (const DrafterParamEntry& e : host.model->table().entries) {
    double dot = 0, na = 0, nb = 0;
    for (int64_t i = 0; i < e.rows * e.cols; ++i) {
      const double a = g_gpu[size_t(e.offset + i)], b = host.grads()[e.offset + i];
      dot += a * b;
      na += a * a;
      nb += b * b;
    }
    const double cosine = dot / std::sqrt(std::max(na * nb, 1e-300)),
                 ratio = std::sqrt(na / std::max(nb, 1e-300));
    std::printf("[ grad   ] %-8s %-40s cosine %.5f norm gpu/cpu %.4f (cpu norm %.3e)\n", v.c_str(),
                e.name.c_str(), cosine, ratio, std::sqrt(nb));
    EXPECT_GE(cosine, 0.98) << v << " " << e.name;
    EXPECT_NEAR(ratio, 1.0, 0.1) << v << " " << e.name;
  }
  DrafterModel gf(host.cfg, gpu);
  drafter_init_params(gf, 7);
  gf.set_frozen(gm.embed, gm.lm_head);
  plan_workspace(gf, T, 4 * T);
  drafter_zero_grads(gf);
  drafter_forward_backward(gf, gb, an, o);
  const std::vector<float> g_fill = d.down<float>(gf.grads);
  int64_t differ = 0, first = -1;
  for (size_t i = 0; i < g_fill.size(); ++i) {
    const float a = g_gpu[i] + 0.0f;  // −0 to +0, nothing else
    if (std::memcmp(&a, &g_fill[i], sizeof(float)) != 0 && differ++ == 0) first = int64_t(i);
  }
  EXPECT_EQ(differ, 0) << v << ": first write and zero-fill + accumulate differ in " << differ
                       << " elements, first " << first << ": " << (first >= 0 ? g_gpu[size_t(first)] : 0.0f)
                       << " vs " << (first >= 0 ? g_fill[size_t(first)] : 0.0f);
}

}  // namespace

TEST_F(CudaDrafter, StepMatchesTheCpuOracle) {
  for (int variant = 0; variant < 2; ++variant) {
    TinySetup host;  // the CPU model, batch and tables
    DrafterLossOptions o;
    o.kind = variant == 0 ? LmLossKind::ce : LmLossKind::kl;
    o.streak = variant == 1;
    o.noise_std = variant == 1 ? 0.05f : 0.0f;
    o.noise_seed = 11;
    expect_step_matches(*gpu_, host, o, variant == 0 ? "ce" : "kl+streak+noise");
  }
}

// The same comparison for a Domino drafter (head, GRU and both CE terms; λ between 0 and 1 so both count):
// label shifting on and off, the correction from slot 0, 1 and 2.
TEST_F(CudaDrafter, DominoStepMatchesTheCpuOracle) {
  for (const auto& [shift, prefix] : {std::pair{true, 1}, {true, 0}, {false, 0}, {false, 2}}) {
    TinySetup host({11, 1, 13}, 7, tiny_domino_config(shift, prefix));
    DrafterLossOptions o;
    o.domino_lambda = 0.35;
    expect_step_matches(
        *gpu_, host, o,
        std::string("domino shift_label ") + (shift ? "1" : "0") + " prefix " + std::to_string(prefix));
  }
}

// The same comparison for a DSpark drafter (kernels/train/dspark_head.cu): each Markov head type with the
// confidence head over [h ; W1[prev]], no Markov head with and without the confidence head; the L1 term's
// target distributions from the target's final hidden state.
TEST_F(CudaDrafter, DSparkStepMatchesTheCpuOracle) {
  const struct {
    DrafterMarkovHead type;
    int rank;
    bool confidence;
    const char* name;
  } cases[] = {{DrafterMarkovHead::vanilla, 3, true, "dspark vanilla"},
               {DrafterMarkovHead::gated, 3, true, "dspark gated"},
               {DrafterMarkovHead::rnn, 5, true, "dspark rnn"},
               {DrafterMarkovHead::vanilla, 0, true, "dspark no markov"},
               {DrafterMarkovHead::vanilla, 0, false, "dspark bare"}};
  for (const auto& c : cases) {
    TinySetup host({11, 1, 13}, 7, tiny_dspark_config(c.type, c.rank, c.confidence));
    expect_step_matches(*gpu_, host, DrafterLossOptions{}, c.name);
  }
}

// The same comparison for a DFlash2 drafter (convolutions around both sublayers, the selector's term with α
// between 0 and 1, with and without stop_gradient; kernels/train/dflash2_conv.cu and dflash2_selector.cu,
// their ops' own cases in test_cuda_dflash2.cpp).
TEST_F(CudaDrafter, Dflash2StepMatchesTheCpuOracle) {
  for (const bool stop : {false, true}) {
    TinySetup host({11, 1, 13}, 7, tiny_dflash2_config(8));
    DrafterLossOptions o;
    o.dflash2_selector_alpha = 0.5;
    o.dflash2_stop_gradient = stop;
    expect_step_matches(*gpu_, host, o, stop ? "dflash2 stop_gradient" : "dflash2");
  }
}

// After AdamW the bf16 shadow is bf16(params) element for element (the GEMMs of the next step use it), and
// drafter_refresh_shadow gives the same after the master weights are written directly (a checkpoint load).
TEST_F(CudaDrafter, ShadowFollowsTheMasterWeights) {
  DrafterConfig c = tiny_drafter_config();
  DrafterModel m(c, *gpu_);
  drafter_init_params(m, 5);
  Dev d(*gpu_);
  std::vector<float> g(size_t(m.table().total));
  Rng r(3);
  for (float& x : g) x = float(r.normal());
  gpu_->upload_raw(m.grads, g.data());
  OptimConfig o;
  o.lr = 1e-2f;
  o.total_steps = 10;
  adamw_step(m, o, 0, 1.0);
  auto check = [&](const char* what) {
    const std::vector<float> p = d.down<float>(m.params);
    const std::vector<uint16_t> lp = d.down<uint16_t>(m.params_lp);
    int64_t bad = 0, first = -1;
    for (const DrafterParamEntry& e : m.table().entries)
      for (int64_t i = e.offset; i < e.offset + e.rows * e.cols; ++i)
        if (lp[size_t(i)] != f32_to_bf16(p[size_t(i)]) && bad++ == 0) first = i;
    EXPECT_EQ(bad, 0) << what << ": first at " << first << " params "
                      << (first >= 0 ? p[size_t(first)] : 0.0f) << " shadow "
                      << (first >= 0 ? bf16_to_f32(lp[size_t(first)]) : 0.0f);
  };
  check("after adamw");
  std::vector<float> p(size_t(m.table().total));
  for (float& x : p) x = float(r.normal());
  gpu_->upload_raw(m.params, p.data());
  drafter_refresh_shadow(m);
  check("after refresh");
}
// ---- Domino's head op (train_ops.h domino_head_loss, domino_head_propose) against the CPU oracle ----------

namespace {

struct DominoCase {
  int64_t nb;
  int B, H, G, E, V, prefix;
  bool shift;
  int64_t chunk;  // the CUDA backend's loss_chunk_rows (Domino's chunk is half of it)
};

std::string name_of(const DominoCase& c) {
  return "nb " + std::to_string(c.nb) + " B " + std::to_string(c.B) + " H " + std::to_string(c.H) + " G " +
         std::to_string(c.G) + " E " + std::to_string(c.E) + " V " + std::to_string(c.V) + " prefix " +
         std::to_string(c.prefix) + " shift " + std::to_string(int(c.shift)) + " chunk " +
         std::to_string(c.chunk);
}

// bf16-representable inputs of one call: block 0 is padding (no weight), a quarter of the other rows are
// holes, the rest weigh exp(−k/3); weights scaled so that GRU gates and the correction are neither saturated
// nor negligible.
struct DominoInputs {
  DominoHeadDims d;
  int64_t N = 0;
  std::vector<float> y, gru_in, lm, ih, hh, pin, pout, row_w;
  std::vector<int32_t> labels;
};

DominoInputs domino_inputs(const DominoCase& c, uint64_t seed) {
  DominoInputs in;
  DominoHeadDims& d = in.d;
  d.hidden = c.H;
  d.gru_hidden = c.G;
  d.emb_dim = c.E;
  d.vocab = c.V;
  d.block_size = c.B;
  d.pure_draft_prefix_len = c.prefix;
  d.shift_label = c.shift;
  in.N = c.nb * c.B;
  const size_t N = size_t(in.N), H = size_t(c.H), G = size_t(c.G), E = size_t(c.E), V = size_t(c.V);
  auto make = [&](size_t n, double std, uint64_t s) {
    std::vector<float> v = normal_vec(n, float(std), seed * 16 + s);
    round_to_bf16(v);
    return v;
  };
  in.y = make(N * H, 1.0, 1);
  in.gru_in = make(N * H, 1.0, 2);
  in.lm = make(V * H, 2.0 / std::sqrt(double(H)), 3);
  in.ih = make(3 * G * H, 1.5 / std::sqrt(double(H)), 4);
  in.hh = make(3 * G * G, 1.5 / std::sqrt(double(G)), 5);
  in.pin = make(E * (H + G), 2.0 / std::sqrt(double(H + G)), 6);
  in.pout = make(V * E, 3.0 / std::sqrt(double(E)), 7);
  Rng r(seed);
  for (int64_t i = 0; i < in.N; ++i) {
    const int k = int(i % c.B);
    in.labels.push_back(int32_t(r.below(uint64_t(c.V))));
    const bool hole = i < c.B || r.below(4) == 0;
    in.row_w.push_back(hole ? 0.0f : float(std::exp(-double(k) / 3.0)));
  }
  return in;
}

struct DominoRun {
  std::vector<float> dy, dw[4];
  std::vector<int32_t> argmax;
  std::vector<double> stats;
};

// One domino_head_loss call on `ops` (f32 tensors on the CPU, bf16 activations and weights on CUDA); with
// `prior` the gradients start from its dw (beta_dw 1), else from NaN (beta_dw 0 must not read them).
DominoRun run_domino(TrainOps& ops, const DominoInputs& in, double lambda, bool backward,
                     const DominoRun* prior = nullptr) {
  Dev d(ops);
  const DominoHeadDims& dm = in.d;
  const int64_t H = dm.hidden, G = dm.gru_hidden, E = dm.emb_dim, V = dm.vocab, N = in.N;
  const int64_t shapes[4][2] = {{3 * G, H}, {3 * G, G}, {E, H + G}, {V, E}};
  const std::vector<float>* wv[4] = {&in.ih, &in.hh, &in.pin, &in.pout};
  TrainOps::DominoHeadWeights w, dw;
  Tensor* wt[4] = {&w.gru_ih, &w.gru_hh, &w.proj_in, &w.proj_out};
  Tensor* gt[4] = {&dw.gru_ih, &dw.gru_hh, &dw.proj_in, &dw.proj_out};
  for (int i = 0; i < 4; ++i) {
    *wt[i] = d.act(*wv[i], shapes[i][0], shapes[i][1]);
    *gt[i] = d.up(prior ? prior->dw[i] : std::vector<float>(size_t(shapes[i][0] * shapes[i][1]), NAN),
                  DType::f32, shapes[i][0], shapes[i][1]);
  }
  const int slots = LossStatsSlots::size(dm.block_size);
  const Tensor stats = d.up(std::vector<double>(size_t(slots), 0.0), DType::u8, 1, slots * 8);
  const Tensor argmax = d.up(std::vector<int32_t>(size_t(N), 7), DType::i32, 1, N);
  const Tensor dy = d.act(std::vector<float>(size_t(N * H), NAN), N, H);
  TrainOps::DominoHeadArgs a;
  a.dims = dm;
  a.lambda = lambda;
  a.backward = backward;
  a.beta_dw = prior ? 1.0f : 0.0f;
  ops.domino_head_loss(d.act(in.y, N, H), d.act(in.lm, V, H), d.act(in.gru_in, N, H), w,
                       d.up(in.labels, DType::i32, 1, N), d.up(in.row_w, DType::f32, 1, N), a, argmax, dy, dw,
                       stats);
  DominoRun r;
  r.argmax = d.down<int32_t>(argmax);
  r.stats = d.down<double>(stats);
  if (!backward) return r;
  r.dy = d.f32(dy);
  for (int i = 0; i < 4; ++i) r.dw[i] = d.down<float>(*gt[i]);
  return r;
}

}  // namespace

// Odd H, G, E and V, blocks of 3, 4, 5 and 16, the correction from slot 0, 1 or 2 in both label modes, a
// padding block, holes, and chunks of 1, 2 and 32 rows against blocks, through the CPU oracle's f32 math. The
// GPU multiplies bf16 weights, keeps the GRU state, the MLP activation and every gradient it passes on in
// bf16 (2^-9 relative a rounding, ~10 roundings deep from the loss to the GRU's input weights) and reduces
// the softmax in fp32 with fast exp/log: every gradient within 3e-2 relative RMS of the oracle's, Σ w·L
// within 2e-2, Σ w (the given weights, summed in f64) within 1e-6. Labelled-row counts are exact; an argmax
// may flip on a near tie, so at most 2 rows (and 5 %) differ and correct counts follow within that. A second
// call with beta_dw 1 adds the same gradients (2× within 1e-5); a repeat gives the same bits; a forward-only
// call the same argmax and statistics.
TEST_F(CudaDrafter, DominoHeadLossMatchesTheCpuOracle) {
  const DominoCase cases[] = {{5, 3, 13, 5, 7, 37, 0, true, 4},
                              {5, 3, 13, 5, 7, 37, 2, true, 2},
                              {4, 4, 13, 5, 7, 37, 2, false, 3},
                              {6, 5, 9, 3, 11, 101, 0, false, 1000},
                              {9, 16, 64, 24, 12, 999, 1, true, 64}};
  const double lambda = 0.3;
  for (const DominoCase& c : cases) {
    const std::string name = name_of(c);
    const DominoInputs in = domino_inputs(c, uint64_t(c.nb * 100 + c.B * 10 + c.prefix));
    CudaTrainOps gpu(0, c.chunk);
    const DominoRun rc = run_domino(cpu_, in, lambda, true), rg = run_domino(gpu, in, lambda, true);
    expect_head_stats_match("domino", name, in.row_w, c.B, rg.argmax, rc.argmax, rg.stats, rc.stats, 2e-2);
    const double e_dy = rel_rms(rg.dy, rc.dy);
    std::printf("[ domino ] %s: dy rel-RMS %.3e\n", name.c_str(), e_dy);
    EXPECT_LE(e_dy, 3e-2) << name << " dy";
    const char* wn[4] = {"prefix_gru.weight_ih_l0", "prefix_gru.weight_hh_l0", "embed_proj.0.weight",
                         "embed_proj.2.weight"};
    for (int i = 0; i < 4; ++i) {
      const double e = rel_rms(rg.dw[i], rc.dw[i]);
      std::printf("[ domino ] %s: %s rel-RMS %.3e\n", name.c_str(), wn[i], e);
      EXPECT_LE(e, 3e-2) << name << " " << wn[i];
    }

    const DominoRun again = run_domino(gpu, in, lambda, true);
    EXPECT_TRUE(same_bits(again.dy, rg.dy) && again.argmax == rg.argmax && again.stats == rg.stats) << name;
    for (int i = 0; i < 4; ++i) EXPECT_TRUE(same_bits(again.dw[i], rg.dw[i])) << name << " repeat " << wn[i];
    const DominoRun fwd = run_domino(gpu, in, lambda, false);
    EXPECT_TRUE(fwd.argmax == rg.argmax && fwd.stats == rg.stats) << name << ": forward-only";
    const DominoRun acc = run_domino(gpu, in, lambda, true, &rg);
    for (int i = 0; i < 4; ++i) {
      std::vector<float> twice(rg.dw[i].size());
      for (size_t j = 0; j < twice.size(); ++j) twice[j] = 2.0f * rg.dw[i][j];
      EXPECT_LE(rel_rms(acc.dw[i], twice), 1e-5) << name << " beta_dw 1 " << wn[i];
    }
  }
}

// Greedy proposals on the GPU: fed back through the CPU oracle as a teacher-forced block over [first,
// proposals...], every proposal's final logit is within bf16 error (2e-2·(1 + |max|)) of its slot's maximum.
TEST_F(CudaDrafter, DominoProposalsAreTheOraclesArgmax) {
  const DominoCase cases[] = {{1, 5, 13, 5, 7, 37, 1, true, 8},
                              {1, 5, 13, 5, 7, 37, 0, true, 8},
                              {1, 4, 13, 5, 7, 37, 1, false, 8},
                              {1, 16, 64, 24, 12, 999, 2, false, 8}};
  for (const DominoCase& c : cases) {
    const std::string name = name_of(c);
    const DominoInputs in = domino_inputs(c, 77 + uint64_t(c.prefix));
    std::vector<float> embed = normal_vec(size_t(c.V * c.H), 1.0f, 78);
    round_to_bf16(embed);
    Dev d(*gpu_);
    TrainOps::DominoHeadWeights w{d.bf16(in.ih, 3 * c.G, c.H), d.bf16(in.hh, 3 * c.G, c.G),
                                  d.bf16(in.pin, c.E, c.H + c.G), d.bf16(in.pout, c.V, c.E)};
    const int32_t first = 5;
    const std::vector<int32_t> drafts = gpu_->domino_head_propose(
        d.bf16(in.y, c.B, c.H), d.bf16(in.lm, c.V, c.H), d.bf16(embed, c.V, c.H), w, in.d, first);
    ASSERT_EQ(int(drafts.size()), c.B - 1) << name;
    std::vector<float> emb;
    std::vector<int32_t> tokens{first};
    tokens.insert(tokens.end(), drafts.begin(), drafts.end());
    for (int32_t t : tokens) {
      ASSERT_TRUE(t >= 0 && t < c.V) << name << " token " << t;
      emb.insert(emb.end(), &embed[size_t(t) * size_t(c.H)], &embed[size_t(t + 1) * size_t(c.H)]);
    }
    DominoBlockRows rows;
    rows.labels.assign(size_t(c.B), 0);
    rows.weights.assign(size_t(c.B), 0.0);
    std::vector<float> logits(size_t(c.B) * size_t(c.V));
    domino_block_step<float>(in.d, {in.ih.data(), in.hh.data(), in.pin.data(), in.pout.data()}, in.lm.data(),
                             in.y.data(), emb.data(), rows, 0.0, logits.data(), nullptr, nullptr);
    for (int p = 1; p < c.B; ++p) {
      const int slot = c.shift ? p - 1 : p;
      const float* row = &logits[size_t(slot) * size_t(c.V)];
      const float mx = *std::max_element(row, row + c.V), got = row[drafts[size_t(p - 1)]];
      EXPECT_GE(got, mx - 2e-2f * (1.0f + std::fabs(mx)))
          << name << " token " << p << ": " << drafts[size_t(p - 1)] << " scores " << got << ", the best "
          << mx;
    }
  }
}

#endif
