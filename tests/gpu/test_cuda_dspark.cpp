// DSpark's head ops on the CUDA backend (train_ops.h dspark_head_loss and dspark_head_propose,
// kernels/train/dspark_head.cu) against the CPU oracle (ops/dspark_head.h through CpuTrainOps) on awkward
// shapes: odd hidden sizes, vocabularies and ranks, blocks of 3 to 16, each Markov head type and none, the
// confidence head with and without the Markov input and absent, the loss terms switched off one by one (the
// confidence head present with its loss off), a padding block and holes, chunks smaller than a block and
// larger than the call, and 2,560 rows over 37 tokens: W1's sort spans two shared-memory tiles with each
// token's rows on both sides of the tile boundary. The whole DSpark step is
// compared in test_cuda_drafter.cpp. Skips itself without a GPU; one skipped test in a build without CUDA.
#include <gtest/gtest.h>

#ifndef DF_HAVE_CUDA
TEST(CudaDSpark, SkippedWithoutCudaBuild) {
  GTEST_SKIP() << "built without CUDA: GPU DSpark tests skipped";
}
#else
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/train/loss_slots.h"
#include "ops/cpu/cpu_train_ops.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_train_ops.h"
#include "tests/gpu/cuda_drafter_test_util.h"
#include "tests/unit/target_test_util.h"
#include "tests/unit/test_drafter_util.h"

using namespace df;
using namespace df::testing;

namespace {

struct DSparkCase {
  int64_t nb;
  int B, H, V, R;
  DrafterMarkovHead type;
  bool confidence, conf_markov;
  double a_ce, a_l1, a_conf;
  int64_t chunk;  // the CUDA backend's loss_chunk_rows (DSpark's chunk is half of it)
};

const char* type_name(DrafterMarkovHead t) {
  return t == DrafterMarkovHead::gated ? "gated" : t == DrafterMarkovHead::rnn ? "rnn" : "vanilla";
}

std::string name_of(const DSparkCase& c) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "nb %lld B %d H %d V %d R %d %s conf %d/%d alpha %g/%g/%g chunk %lld",
                (long long)c.nb, c.B, c.H, c.V, c.R, type_name(c.type), int(c.confidence), int(c.conf_markov),
                c.a_ce, c.a_l1, c.a_conf, (long long)c.chunk);
  return buf;
}

// The head's tensors in ops/dspark_head.h's order (markov_w1, markov_w2, gate_w, gate_b, joint_w, joint_b,
// conf_w, conf_b): shape, whether the head has it, whether it is a matrix (bf16 on the GPU).
struct Part {
  const char* name;
  int64_t rows, cols;
  bool present, matrix;
};

std::vector<Part> parts_of(const DSparkHeadDims& d) {
  const int64_t H = d.hidden, V = d.vocab, R = d.markov_rank;
  const bool m = R > 0, gated = m && d.markov_head_type == DrafterMarkovHead::gated,
             rnn = m && d.markov_head_type == DrafterMarkovHead::rnn;
  return {{"markov_w1", V, R, m, true},
          {"markov_w2", V, R, m, true},
          {"gate_proj.weight", R, H + R, gated, true},
          {"gate_proj.bias", 1, R, gated, false},
          {"joint_proj.weight", 3 * R, 2 * R + H, rnn, true},
          {"joint_proj.bias", 1, 3 * R, rnn, false},
          {"confidence_head.proj.weight", 1, d.confidence_in(), d.confidence, true},
          {"confidence_head.proj.bias", 1, 1, d.confidence, false}};
}

Tensor* slot_of(TrainOps::DSparkHeadWeights& w, int i) {
  Tensor* t[8] = {&w.markov_w1, &w.markov_w2, &w.gate_w, &w.gate_b,
                  &w.joint_w,   &w.joint_b,   &w.conf_w, &w.conf_b};
  return t[i];
}

// bf16-representable inputs of one call: block 0 is padding (no weight), a quarter of the other rows are
// holes, the rest weigh exp(−k/3); weights scaled so that the gates, the Markov bias and the confidence logit
// are neither saturated nor negligible, and the target distribution differs from the draft's. The target
// rows number about half the rows and each row reads a random one, so rows share them within a chunk and
// across chunks, as neighbouring anchors' blocks do.
struct DSparkInputs {
  DSparkHeadDims d;
  DSparkLossAlphas alpha;
  int64_t N = 0;
  int64_t T = 0;  // target rows
  std::vector<float> y, tgt, lm, row_w, w[8];
  std::vector<int32_t> labels, prev, target_rows;
};

DSparkInputs dspark_inputs(const DSparkCase& c, uint64_t seed) {
  DSparkInputs in;
  DSparkHeadDims& d = in.d;
  d.hidden = c.H;
  d.vocab = c.V;
  d.block_size = c.B;
  d.markov_rank = c.R;
  d.markov_head_type = c.type;
  d.confidence = c.confidence;
  d.confidence_with_markov = c.conf_markov;
  in.alpha = {c.a_ce, c.a_l1, c.a_conf};
  in.N = c.nb * c.B;
  in.T = in.N / 2 + 1;
  const size_t N = size_t(in.N), H = size_t(c.H), V = size_t(c.V);
  auto make = [&](size_t n, double std, uint64_t s) {
    std::vector<float> v = normal_vec(n, float(std), seed * 16 + s);
    round_to_bf16(v);
    return v;
  };
  in.y = make(N * H, 1.0, 1);
  in.tgt = make(size_t(in.T) * H, 1.0, 2);
  in.lm = make(V * H, 2.0 / std::sqrt(double(H)), 3);
  const std::vector<Part> parts = parts_of(d);
  for (int i = 0; i < 8; ++i)
    if (parts[size_t(i)].present)
      in.w[i] = make(size_t(parts[size_t(i)].rows * parts[size_t(i)].cols),
                     parts[size_t(i)].matrix ? 1.5 / std::sqrt(double(parts[size_t(i)].cols)) : 0.3,
                     4 + uint64_t(i));
  Rng r(seed), rt(seed + 1000);  // rt: the target rows, drawn apart so the other inputs stay as they were
  for (int64_t i = 0; i < in.N; ++i) {
    in.target_rows.push_back(int32_t(rt.below(uint64_t(in.T))));
    const int k = int(i % c.B);
    in.labels.push_back(int32_t(r.below(uint64_t(c.V))));
    in.prev.push_back(int32_t(r.below(uint64_t(c.V))));
    const bool hole = i < c.B || r.below(4) == 0;
    in.row_w.push_back(hole ? 0.0f : float(std::exp(-double(k) / 3.0)));
  }
  return in;
}

struct DSparkRun {
  std::vector<float> dy, dw[8];
  std::vector<int32_t> argmax;
  std::vector<double> stats;
};

// One dspark_head_loss call on `ops` (f32 tensors on the CPU; bf16 activations and matrices, f32 biases on
// CUDA); with `prior` the gradients start from its dw (beta_dw 1), else from NaN (beta_dw 0 must not read
// them).
DSparkRun run_dspark(TrainOps& ops, const DSparkInputs& in, bool backward, const DSparkRun* prior = nullptr) {
  Dev d(ops);
  const int64_t H = in.d.hidden, V = in.d.vocab, N = in.N;
  const std::vector<Part> parts = parts_of(in.d);
  TrainOps::DSparkHeadWeights w, dw;
  for (int i = 0; i < 8; ++i) {
    const Part& p = parts[size_t(i)];
    if (!p.present) continue;
    *slot_of(w, i) = p.matrix ? d.act(in.w[i], p.rows, p.cols) : d.up(in.w[i], DType::f32, p.rows, p.cols);
    *slot_of(dw, i) = d.up(prior ? prior->dw[i] : std::vector<float>(size_t(p.rows * p.cols), NAN),
                           DType::f32, p.rows, p.cols);
  }
  const int slots = LossStatsSlots::size(in.d.block_size);
  const Tensor stats = d.up(std::vector<double>(size_t(slots), 0.0), DType::u8, 1, slots * 8);
  const Tensor argmax = d.up(std::vector<int32_t>(size_t(N), 7), DType::i32, 1, N);
  const Tensor dy = d.act(std::vector<float>(size_t(N * H), NAN), N, H);
  TrainOps::DSparkHeadArgs a;
  a.dims = in.d;
  a.alpha = in.alpha;
  a.backward = backward;
  a.beta_dw = prior ? 1.0f : 0.0f;
  const bool target = dspark_needs_target_hidden(in.d, in.alpha);
  if (target) a.target_rows = in.target_rows;
  ops.dspark_head_loss(d.act(in.y, N, H), d.act(in.lm, V, H), target ? d.act(in.tgt, in.T, H) : Tensor{}, w,
                       d.up(in.labels, DType::i32, 1, N), d.up(in.prev, DType::i32, 1, N),
                       d.up(in.row_w, DType::f32, 1, N), a, argmax, dy, dw, stats);
  DSparkRun r;
  r.argmax = d.down<int32_t>(argmax);
  r.stats = d.down<double>(stats);
  if (!backward) return r;
  r.dy = d.f32(dy);
  for (int i = 0; i < 8; ++i)
    if (parts[size_t(i)].present) r.dw[i] = d.down<float>(*slot_of(dw, i));
  return r;
}

using CudaDSpark = CudaTrainFixture;

}  // namespace

// Through the CPU oracle's f32 math. The GPU multiplies bf16 weights, keeps u, the Markov input rows and the
// logit gradients in bf16 (2^-9 relative a rounding, a few roundings deep) and reduces both softmaxes in fp32
// with fast exp/log: every gradient within 3e-2 relative RMS of the oracle's, Σ w·L within 2e-2, Σ w (the
// given weights, summed in f64) within 1e-6. Labelled-row counts are exact; an argmax may flip on a near tie,
// so at most 2 rows (and 5 %) differ and correct counts follow within that. A second call with beta_dw 1 adds
// the same gradients (2× within 1e-5); a repeat gives the same bits (W1's scatter is sorted, not atomic); a
// forward-only call the same argmax and statistics.
TEST_F(CudaDSpark, HeadLossMatchesTheCpuOracle) {
  using T = DrafterMarkovHead;
  const DSparkCase cases[] = {{5, 3, 13, 37, 5, T::vanilla, true, true, 0.1, 0.9, 1.0, 4},
                              {4, 3, 13, 37, 5, T::gated, true, true, 0.1, 0.9, 1.0, 2},
                              {4, 5, 9, 101, 3, T::rnn, true, true, 0.1, 0.9, 1.0, 1000},
                              {6, 4, 13, 37, 0, T::vanilla, true, false, 0.1, 0.9, 1.0, 3},
                              {3, 3, 11, 37, 4, T::rnn, false, false, 0.1, 0.9, 0.0, 6},
                              {4, 3, 13, 37, 5, T::gated, true, true, 0.3, 0.0, 1.0, 5},
                              {4, 3, 13, 37, 5, T::vanilla, false, false, 1.0, 0.0, 0.0, 5},
                              {9, 16, 64, 999, 16, T::gated, true, false, 0.1, 0.9, 1.0, 64},
                              {9, 16, 64, 999, 16, T::rnn, true, true, 0.1, 0.9, 1.0, 64},
                              {4, 3, 13, 37, 5, T::rnn, true, true, 0.1, 0.9, 0.0, 5},
                              {160, 16, 13, 37, 5, T::vanilla, true, true, 0.1, 0.9, 1.0, 700}};
  for (const DSparkCase& c : cases) {
    const std::string name = name_of(c);
    const DSparkInputs in = dspark_inputs(c, uint64_t(c.nb * 100 + c.B * 10 + c.R));
    CudaTrainOps gpu(0, c.chunk);
    const DSparkRun rc = run_dspark(cpu_, in, true), rg = run_dspark(gpu, in, true);
    expect_head_stats_match("dspark", name, in.row_w, c.B, rg.argmax, rc.argmax, rg.stats, rc.stats, 2e-2);
    const double e_dy = rel_rms(rg.dy, rc.dy);
    std::printf("[ dspark ] %s: dy rel-RMS %.3e\n", name.c_str(), e_dy);
    EXPECT_LE(e_dy, 3e-2) << name << " dy";
    const std::vector<Part> parts = parts_of(in.d);
    for (int i = 0; i < 8; ++i) {
      if (!parts[size_t(i)].present) continue;
      const double e = rel_rms(rg.dw[i], rc.dw[i]);
      std::printf("[ dspark ] %s: %s rel-RMS %.3e\n", name.c_str(), parts[size_t(i)].name, e);
      EXPECT_LE(e, 3e-2) << name << " " << parts[size_t(i)].name;
    }

    const DSparkRun again = run_dspark(gpu, in, true);
    EXPECT_TRUE(same_bits(again.dy, rg.dy) && again.argmax == rg.argmax && again.stats == rg.stats) << name;
    for (int i = 0; i < 8; ++i)
      EXPECT_TRUE(same_bits(again.dw[i], rg.dw[i])) << name << " repeat " << parts[size_t(i)].name;
    const DSparkRun fwd = run_dspark(gpu, in, false);
    EXPECT_TRUE(fwd.argmax == rg.argmax && fwd.stats == rg.stats) << name << ": forward-only";
    const DSparkRun acc = run_dspark(gpu, in, true, &rg);
    for (int i = 0; i < 8; ++i) {
      if (!parts[size_t(i)].present) continue;
      std::vector<float> twice(rg.dw[i].size());
      for (size_t j = 0; j < twice.size(); ++j) twice[j] = 2.0f * rg.dw[i][j];
      EXPECT_LE(rel_rms(acc.dw[i], twice), 1e-5) << name << " beta_dw 1 " << parts[size_t(i)].name;
    }
  }
}

// Greedy proposals on the GPU: fed back through the CPU oracle as a teacher-forced block whose previous
// tokens are [first, proposals...], every proposal's biased logit is within bf16 error (2e-2·(1 + |max|)) of
// its slot's maximum, and every confidence logit within 2e-2·(1 + |c|) of the oracle's.
TEST_F(CudaDSpark, ProposalsAreTheOraclesArgmax) {
  using T = DrafterMarkovHead;
  const DSparkCase cases[] = {{1, 5, 13, 37, 5, T::vanilla, true, true, 0, 0, 0, 8},
                              {1, 5, 13, 37, 5, T::gated, true, false, 0, 0, 0, 8},
                              {1, 3, 13, 37, 3, T::rnn, true, true, 0, 0, 0, 8},
                              {1, 4, 13, 37, 0, T::vanilla, true, false, 0, 0, 0, 8},
                              {1, 16, 64, 999, 16, T::rnn, false, false, 0, 0, 0, 8}};
  for (const DSparkCase& c : cases) {
    const std::string name = name_of(c);
    const DSparkInputs in = dspark_inputs(c, 91 + uint64_t(c.R));
    Dev d(*gpu_);
    const std::vector<Part> parts = parts_of(in.d);
    TrainOps::DSparkHeadWeights w;
    DSparkHeadTensors<const float> wc;
    const float** wp[8] = {&wc.markov_w1, &wc.markov_w2, &wc.gate_w, &wc.gate_b,
                           &wc.joint_w,   &wc.joint_b,   &wc.conf_w, &wc.conf_b};
    for (int i = 0; i < 8; ++i) {
      const Part& p = parts[size_t(i)];
      if (!p.present) continue;
      *slot_of(w, i) = p.matrix ? d.bf16(in.w[i], p.rows, p.cols) : d.up(in.w[i], DType::f32, p.rows, p.cols);
      *wp[i] = in.w[i].data();
    }
    const int32_t first = 5;
    std::vector<double> conf;
    const std::vector<int32_t> drafts =
        gpu_->dspark_head_propose(d.bf16(in.y, c.B, c.H), d.bf16(in.lm, c.V, c.H), w, in.d, first, &conf);
    ASSERT_EQ(int(drafts.size()), c.B - 1) << name;
    ASSERT_EQ(conf.size(), c.confidence ? size_t(c.B - 1) : size_t(0)) << name;
    DSparkBlockRows rows;
    rows.prev = {first};
    for (int32_t t : drafts) {
      ASSERT_TRUE(t >= 0 && t < c.V) << name << " token " << t;
      rows.prev.push_back(t);
    }
    rows.labels.assign(size_t(c.B), 0);
    rows.target_pos.assign(size_t(c.B), 0);
    rows.weights.assign(size_t(c.B), 0.0);
    std::vector<float> logits(size_t(c.B) * size_t(c.V)), conf_cpu(size_t(c.B));
    dspark_block_step<float>(in.d, wc, in.lm.data(), in.y.data(), nullptr, rows, DSparkLossAlphas{0, 0, 0},
                             logits.data(), conf_cpu.data(), nullptr, nullptr);
    for (int k = 0; k + 1 < c.B; ++k) {
      const float* row = &logits[size_t(k) * size_t(c.V)];
      const float mx = *std::max_element(row, row + c.V), got = row[drafts[size_t(k)]];
      EXPECT_GE(got, mx - 2e-2f * (1.0f + std::fabs(mx)))
          << name << " slot " << k << ": " << drafts[size_t(k)] << " scores " << got << ", the best " << mx;
      if (c.confidence)
        EXPECT_NEAR(conf[size_t(k)], conf_cpu[size_t(k)], 2e-2 * (1.0 + std::fabs(conf_cpu[size_t(k)])))
            << name << " confidence of slot " << k;
    }
  }
}

#endif
