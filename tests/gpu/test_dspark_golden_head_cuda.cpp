// DSpark's CUDA head op alone on each DSpark golden's own block rows (the backbone's normed output `hidden`,
// the target rows, labels, previous tokens and weights that SpecForge's float64 step recorded), to tell which
// part of the bf16 CUDA step carries its gradient error: the head op against the CPU oracle on the same
// bf16-rounded inputs (the head's own rounding), both against the golden (what rounding the head's input
// alone costs), the L1 term's (row, token) pairs nearest to a sign flip, and the head's error when its input
// carries bf16-sized noise, as the backbone's forward leaves it. Asserts that the head op matches the oracle
// on the same inputs; the rest is printed for the reader. Skips without a device or a golden.
#include <gtest/gtest.h>

#ifndef DF_HAVE_CUDA
TEST(CudaDSparkGoldenHead, SkippedWithoutCudaBuild) {
  GTEST_SKIP() << "built without CUDA: GPU DSpark golden head test skipped";
}
#else
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "model/drafter.h"
#include "ops/dspark_head.h"
#include "tests/gpu/cuda_drafter_test_util.h"
#include "tests/unit/drafter_golden_util.h"
#include "tests/unit/test_drafter_util.h"

using namespace df;
using namespace df::testing;
using df::drafter_golden::grad_diff;
using df::drafter_golden::read_f32;
using df::drafter_golden::read_raw;

namespace {

// One golden's head inputs as the step hands them to dspark_head_loss (block-major rows).
struct GoldenHead {
  DSparkHeadDims d;
  DSparkLossAlphas alpha;
  int64_t N = 0;
  double den = 0;                                       // Σ w, SpecForge's loss denominator
  int64_t T = 0;                                        // tokens: target_hidden's rows
  std::vector<float> y, target_hidden, tgt, lm, row_w;  // tgt: target_hidden's row of each block row
  std::vector<int32_t> labels, prev, target_rows;
  std::vector<DSparkHeadParam> params;    // the head's parameters present, dspark_head_params order
  std::vector<std::vector<float> > w, g;  // their values and the golden's gradients (∂loss/∂θ)
  std::vector<float> dhidden;             // the golden's ∂loss/∂hidden
  std::vector<DSparkBlockRows> rows;      // each block's rows (the oracle's input)
};

GoldenHead load_golden_head(const std::string& dir) {
  GoldenHead h;
  const DrafterConfig cfg = drafter_config_load_hf(dir + "/model");
  h.d = dspark_head_dims(cfg);
  const SafetensorsIndex g = SafetensorsIndex::open(dir + "/golden.safetensors");
  const SafetensorsIndex m = SafetensorsIndex::open(dir + "/model");
  const int H = h.d.hidden, B = h.d.block_size;
  const std::vector<int64_t> offsets = read_raw<int64_t>(g, "offsets", DType::i64);
  const std::vector<int32_t> anchors = read_raw<int32_t>(g, "anchors", DType::i32),
                             tokens = read_raw<int32_t>(g, "tokens", DType::i32);
  const std::vector<uint8_t> loss_mask = read_raw<uint8_t>(g, "loss_mask", DType::u8);
  const std::vector<float> alphas = read_f32(g, "alphas");
  h.target_hidden = read_f32(g, "target_hidden");
  h.T = offsets.back();
  const double gamma = read_f32(g, "gamma")[0];
  h.alpha = {alphas[0], alphas[1], alphas[2]};
  h.y = read_f32(g, "hidden");
  h.lm = read_f32(g, "lm_head");
  h.dhidden = read_f32(g, "grad.hidden");
  h.den = read_f32(g, "loss_den")[0];
  const int64_t blocks = int64_t(anchors.size()) / 2;
  h.N = blocks * B;
  h.tgt.assign(size_t(h.N * H), 0.0f);
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t seq = anchors[size_t(2 * b)], pos = anchors[size_t(2 * b + 1)];
    const int64_t start = offsets[size_t(seq)], len = offsets[size_t(seq + 1)] - start;
    const DSparkBlockRows rows =
        dspark_block_rows(h.d, tokens.data() + start, loss_mask.data() + start, len, pos, gamma);
    h.rows.push_back(rows);
    for (int k = 0; k < B; ++k) {
      h.labels.push_back(rows.labels[size_t(k)]);
      h.prev.push_back(rows.prev[size_t(k)]);
      h.row_w.push_back(float(rows.weights[size_t(k)]));
      h.target_rows.push_back(int32_t(start + rows.target_pos[size_t(k)]));
      std::copy_n(h.target_hidden.begin() + int64_t(h.target_rows.back()) * H, H,
                  h.tgt.begin() + (b * B + k) * H);
    }
  }
  for (const DSparkHeadParam& p : dspark_head_params(h.d)) {
    const StTensor* t = m.find(p.name);
    if (!t) throw std::runtime_error(dir + "/model lacks " + p.name);
    std::vector<float> v(size_t(t->numel()));
    st_to_f32(*t, v.data());
    h.params.push_back(p);
    h.w.push_back(std::move(v));
    h.g.push_back(read_f32(g, "grad." + p.name));
  }
  return h;
}

// The slot of `w` that holds the parameter of this peer name.
Tensor& slot_of(TrainOps::DSparkHeadWeights& w, const std::string& name) {
  if (name == "markov_head.markov_w1.weight") return w.markov_w1;
  if (name == "markov_head.markov_w2.weight") return w.markov_w2;
  if (name == "markov_head.gate_proj.weight") return w.gate_w;
  if (name == "markov_head.gate_proj.bias") return w.gate_b;
  if (name == "markov_head.joint_proj.weight") return w.joint_w;
  if (name == "markov_head.joint_proj.bias") return w.joint_b;
  if (name == "confidence_head.proj.weight") return w.conf_w;
  if (name == "confidence_head.proj.bias") return w.conf_b;
  throw std::runtime_error("not a DSpark head parameter: " + name);
}

struct HeadRun {
  std::vector<float> dy;                // ∂loss/∂y (divided by Σ w, as the golden's)
  std::vector<std::vector<float> > dw;  // likewise, in h.params order
};

// One dspark_head_loss call with y (host f32; the backend rounds it to its activation dtype): matrices in the
// backend's activation dtype, biases f32, as the step holds them.
HeadRun run_head(TrainOps& ops, const GoldenHead& h, const std::vector<float>& y) {
  Dev dev(ops);
  const int64_t H = h.d.hidden, V = h.d.vocab, N = h.N;
  TrainOps::DSparkHeadWeights w, dw;
  for (size_t i = 0; i < h.params.size(); ++i) {
    const DSparkHeadParam& p = h.params[i];
    slot_of(w, p.name) =
        p.matrix ? dev.act(h.w[i], p.rows, p.cols) : dev.up(h.w[i], DType::f32, p.rows, p.cols);
    slot_of(dw, p.name) = dev.up(std::vector<float>(h.w[i].size(), 0.0f), DType::f32, p.rows, p.cols);
  }
  const int slots = LossStatsSlots::size(h.d.block_size);
  const Tensor stats = dev.up(std::vector<double>(size_t(slots), 0.0), DType::u8, 1, slots * 8);
  const Tensor argmax = dev.up(std::vector<int32_t>(size_t(N), 0), DType::i32, 1, N);
  const Tensor dy = dev.act(std::vector<float>(size_t(N * H), 0.0f), N, H);
  TrainOps::DSparkHeadArgs a;
  a.dims = h.d;
  a.alpha = h.alpha;
  a.backward = true;
  a.beta_dw = 0.0f;
  a.target_rows = h.target_rows;
  ops.dspark_head_loss(dev.act(y, N, H), dev.act(h.lm, V, H), dev.act(h.target_hidden, h.T, H), w,
                       dev.up(h.labels, DType::i32, 1, N), dev.up(h.prev, DType::i32, 1, N),
                       dev.up(h.row_w, DType::f32, 1, N), a, argmax, dy, dw, stats);
  HeadRun r;
  r.dy = dev.f32(dy);
  for (float& x : r.dy) x = float(x / h.den);
  for (const DSparkHeadParam& p : h.params) {
    r.dw.push_back(dev.down<float>(slot_of(dw, p.name)));
    for (float& x : r.dw.back()) x = float(x / h.den);
  }
  return r;
}

// The oracle's probabilities softmax(logits) of every row, draft (from y, with the head's Markov bias) or
// target (from the target rows and the lm_head alone), in float64 from its f32 logits.
std::vector<double> probabilities(const GoldenHead& h, const std::vector<float>& y, bool draft) {
  const int H = h.d.hidden, V = h.d.vocab, B = h.d.block_size;
  std::vector<float> logits(size_t(h.N) * V);
  if (draft) {
    DSparkHeadTensors<const float> w;
    for (size_t i = 0; i < h.params.size(); ++i) {
      const std::string& n = h.params[i].name;
      const float* p = h.w[i].data();
      if (n == "markov_head.markov_w1.weight") w.markov_w1 = p;
      if (n == "markov_head.markov_w2.weight") w.markov_w2 = p;
      if (n == "markov_head.gate_proj.weight") w.gate_w = p;
      if (n == "markov_head.gate_proj.bias") w.gate_b = p;
      if (n == "markov_head.joint_proj.weight") w.joint_w = p;
      if (n == "markov_head.joint_proj.bias") w.joint_b = p;
      if (n == "confidence_head.proj.weight") w.conf_w = p;
      if (n == "confidence_head.proj.bias") w.conf_b = p;
    }
    for (size_t b = 0; b < h.rows.size(); ++b)
      dspark_block_step<float>(h.d, w, h.lm.data(), y.data() + b * B * H, h.tgt.data() + b * B * H, h.rows[b],
                               h.alpha, logits.data() + b * B * V, nullptr, nullptr, nullptr);
  } else {
    for (int64_t r = 0; r < h.N; ++r)
      for (int v = 0; v < V; ++v) {
        double s = 0;
        for (int c = 0; c < H; ++c) s += double(h.tgt[size_t(r * H + c)]) * h.lm[size_t(v) * H + c];
        logits[size_t(r * V + v)] = float(s);
      }
  }
  std::vector<double> p(logits.size());
  for (int64_t r = 0; r < h.N; ++r) {
    const float* l = &logits[size_t(r * V)];
    const double mx = *std::max_element(l, l + V);
    double z = 0;
    for (int v = 0; v < V; ++v) z += (p[size_t(r * V + v)] = std::exp(double(l[v]) - mx));
    for (int v = 0; v < V; ++v) p[size_t(r * V + v)] /= z;
  }
  return p;
}

// A labelled (row, token) near a flip of the L1 sign sign(q − t): a flip there moves the logit gradient by
// 2·α_l1·w·q, whatever the precision that caused it.
struct NearTie {
  int64_t row = 0;
  int token = 0;
  double q = 0, log_ratio = 0;  // log q − log t
};

// The `k` labelled (row, token) with q ≥ 1 % nearest to a flip (|log q − log t| smallest).
std::vector<NearTie> nearest_ties(const GoldenHead& h, const std::vector<double>& q,
                                  const std::vector<double>& t, size_t k) {
  const int V = h.d.vocab;
  std::vector<NearTie> all;
  for (int64_t r = 0; r < h.N; ++r) {
    if (h.row_w[size_t(r)] == 0.0f) continue;
    for (int v = 0; v < V; ++v) {
      const size_t i = size_t(r * V + v);
      if (q[i] >= 1e-2) all.push_back({r, v, q[i], std::log(q[i]) - std::log(t[i])});
    }
  }
  std::sort(all.begin(), all.end(), [](const NearTie& a, const NearTie& b) {
    return std::fabs(a.log_ratio) < std::fabs(b.log_ratio);
  });
  if (all.size() > k) all.resize(k);
  return all;
}

void diagnose(const std::string& head) {
  const std::string dir = std::string(DF_SOURCE_DIR) + "/tests/golden/drafter_dspark_" + head;
  if (!std::filesystem::exists(dir + "/golden.safetensors")) {
    std::printf("[ dspark golden head ] %s: golden absent, skipped\n", head.c_str());
    return;
  }
  const GoldenHead h = load_golden_head(dir);
  std::vector<float> yb = h.y;
  round_to_bf16(yb);
  CpuTrainOps cpu;
  CudaTrainOps gpu(0, 1024);
  // The CPU oracle on the bf16-rounded inputs the GPU reads (its matrices rounded likewise).
  GoldenHead hb = h;
  for (size_t i = 0; i < hb.params.size(); ++i)
    if (hb.params[i].matrix) round_to_bf16(hb.w[i]);
  round_to_bf16(hb.lm);
  round_to_bf16(hb.tgt);
  round_to_bf16(hb.target_hidden);
  const HeadRun rg = run_head(gpu, h, h.y), rc = run_head(cpu, hb, yb);
  const auto rel = [](const std::vector<float>& a, const std::vector<float>& b) {
    return grad_diff(a, b, 0, 0).rel_rms;
  };
  std::printf(
      "[ dspark golden head ] %s: dy rel-RMS: GPU vs oracle on its inputs %.3e, GPU vs golden %.3e, "
      "oracle on bf16 inputs vs golden %.3e\n",
      head.c_str(), rel(rg.dy, rc.dy), rel(rg.dy, h.dhidden), rel(rc.dy, h.dhidden));
  EXPECT_LE(rel(rg.dy, rc.dy), 3e-2) << head << " dy: the CUDA head op against the oracle on the same inputs";
  for (size_t i = 0; i < h.params.size(); ++i) {
    std::printf(
        "[ dspark golden head ] %s: %s rel-RMS: GPU vs oracle %.3e, GPU vs golden %.3e, oracle on "
        "bf16 inputs vs golden %.3e\n",
        head.c_str(), h.params[i].name.c_str(), rel(rg.dw[i], rc.dw[i]), rel(rg.dw[i], h.g[i]),
        rel(rc.dw[i], h.g[i]));
    EXPECT_LE(rel(rg.dw[i], rc.dw[i]), 3e-2) << head << " " << h.params[i].name;
  }
  const std::vector<double> t = probabilities(h, h.y, false);
  const std::vector<NearTie> ties = nearest_ties(h, probabilities(h, h.y, true), t, 5);
  const int B = h.d.block_size;
  for (const NearTie& n : ties)
    std::printf(
        "[ dspark golden head ] %s: L1 near-tie row %lld (block %lld slot %lld, weight %.3f, previous "
        "token %d) token %d: q %.4f, log q - log t %.3e\n",
        head.c_str(), (long long)n.row, (long long)(n.row / B), (long long)(n.row % B),
        h.row_w[size_t(n.row)], h.prev[size_t(n.row)], n.token, n.q, n.log_ratio);
  // The backbone's forward leaves y with bf16-sized noise; the same head op on y·(1 + 2^-8·n), n ~ N(0, 1):
  // which near-ties each draw flips, and what it costs against the golden.
  for (uint64_t seed = 1; seed <= 8; ++seed) {
    const std::vector<float> n = normal_vec(h.y.size(), 1.0f, 7000 + seed);
    std::vector<float> yp(h.y.size());
    for (size_t i = 0; i < yp.size(); ++i) yp[i] = h.y[i] * (1.0f + n[i] / 256.0f);
    round_to_bf16(yp);
    const HeadRun rp = run_head(gpu, h, yp);
    const std::vector<double> qp = probabilities(h, yp, true);
    std::printf("[ dspark golden head ] %s: noisy y seed %llu: flipped near-ties [", head.c_str(),
                (unsigned long long)seed);
    for (const NearTie& nt : ties) {
      const size_t i = size_t(nt.row * h.d.vocab + nt.token);
      if ((qp[i] > t[i]) != (nt.log_ratio > 0))
        std::printf(" row %lld token %d", (long long)nt.row, nt.token);
    }
    std::printf(" ]; dy vs golden %.3e", rel(rp.dy, h.dhidden));
    for (size_t i = 0; i < h.params.size(); ++i)
      std::printf(", %s %.3e", h.params[i].name.c_str(), rel(rp.dw[i], h.g[i]));
    std::printf("\n");
  }
  // The whole CUDA step on the golden (what test_drafter_golden_cuda bounds): W1's gradient error by token
  // row. A flip of the L1 sign at the near-tie moves W1's row of that row's previous token alone.
  const SafetensorsIndex g = SafetensorsIndex::open(dir + "/golden.safetensors");
  const drafter_golden::StepResult step = drafter_golden::run_golden_step(gpu, g, dir + "/model");
  const std::string w1 = "markov_head.markov_w1.weight";
  if (h.d.markov_rank == 0 || !step.grads.count(w1)) return;
  const std::vector<float>& got = step.grads.at(w1);
  const std::vector<float>& want = h.g[0];
  const int R = h.d.markov_rank;
  std::vector<std::pair<double, int> > share;
  double total = 0;
  for (int v = 0; v < h.d.vocab; ++v) {
    double e = 0;
    for (int c = 0; c < R; ++c) e += std::pow(double(got[size_t(v * R + c)]) - want[size_t(v * R + c)], 2);
    share.push_back({e, v});
    total += e;
  }
  std::sort(share.rbegin(), share.rend());
  std::printf(
      "[ dspark golden head ] %s: the CUDA step's %s rel-RMS vs golden %.3e; its squared error by "
      "token row:",
      head.c_str(), w1.c_str(), rel(got, want));
  for (size_t i = 0; i < 3 && i < share.size(); ++i)
    std::printf(" token %d %.0f%%", share[i].second, total > 0 ? 100.0 * share[i].first / total : 0.0);
  std::printf(" (a flip at a near-tie above shows as its previous token's row)\n");
}

}  // namespace

TEST(CudaDSparkGoldenHead, HeadOpOnTheGoldensHiddenMatchesTheOracle) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU DSpark golden head test skipped";
  for (const char* head : {"vanilla", "gated", "rnn"}) {
    SCOPED_TRACE(head);
    diagnose(head);
  }
}

#endif
