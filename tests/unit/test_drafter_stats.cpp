// The drafter's backend bookkeeping and memory plan: loss_row_stats against a restatement of the loss rules,
// statistics accumulated over micro-batches and read once, anchors over drafter.max_block_rows dropped at
// random, the workspace allocated once, the backend factory and the counter-based init.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "core/rng.h"
#include "ops/ops_factory.h"
#include "test_drafter_util.h"

using namespace df;
using namespace df::testing;

namespace {

template <class F>
std::string error_of(F fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

template <class T>
Tensor row_view(std::vector<T>& v, DType dt) {
  return tensor_make(v.data(), dt, Device::cpu, 1, int64_t(v.size()));
}

// Random per-row loss outputs for nb blocks of B rows: row 0 of a block never has a label, about a third of
// the others have none, argmax right about half the time.
struct RowInputs {
  std::vector<int32_t> labels, argmax;
  std::vector<uint8_t> active;
  std::vector<float> loss, p_label;
  RowInputs(int64_t nb, int B, uint64_t seed) {
    Rng r(seed);
    for (int64_t i = 0; i < nb * B; ++i) {
      const bool act = i % B != 0 && r.below(3) != 0;
      labels.push_back(int32_t(r.below(50)));
      argmax.push_back(act ? (r.below(2) ? labels.back() : int32_t(r.below(50))) : -1);
      active.push_back(act);
      loss.push_back(act ? float(3 * r.uniform()) : 0.0f);
      p_label.push_back(act ? float(r.uniform()) : 0.0f);
    }
  }
};

// MODELS.md / ops/loss_rows.h in words, written out again independently of loss_rows.cpp: w_k = e^{−(k−1)/γ} for a
// labelled row k ≥ 1, times Π_{j<k labelled} p_j^α with streak; τ = 1 + leading correct offsets per block
// with a label.
struct Restated {
  std::vector<float> w;
  std::vector<double> slots;
};

Restated restate(const RowInputs& in, int B, float gamma, bool streak, float alpha) {
  const size_t N = in.labels.size();
  Restated o;
  o.w.assign(N, 0.0f);
  o.slots.assign(size_t(LossStatsSlots::size(B)), 0.0);
  for (size_t j0 = 0; j0 < N; j0 += size_t(B)) {
    double prefix = 1;
    int lead = 0;
    bool leading = true, any = false;
    for (int k = 1; k < B; ++k) {
      const size_t r = j0 + size_t(k);
      if (in.active[r]) {
        o.w[r] = float(double(float(std::exp(-double(k - 1) / gamma))) * (streak ? prefix : 1.0));
        if (streak) prefix *= std::pow(double(in.p_label[r]), double(alpha));
      }
      const bool ok = in.active[r] && in.argmax[r] == in.labels[r];
      leading = leading && ok;
      lead += leading;
      if (in.active[r]) {
        any = true;
        o.slots[size_t(LossStatsSlots::count(B, k))] += 1;
        o.slots[size_t(LossStatsSlots::correct(k))] += ok;
      }
    }
    if (any) {
      o.slots[LossStatsSlots::kTauSum] += 1 + lead;
      o.slots[LossStatsSlots::kTauBlocks] += 1;
    }
  }
  for (size_t r = 0; r < N; ++r) {
    o.slots[LossStatsSlots::kLossSum] += double(o.w[r]) * in.loss[r];
    o.slots[LossStatsSlots::kWeightSum] += o.w[r];
  }
  return o;
}

std::vector<double> run_op(TrainOps& ops, RowInputs& in, const TrainOps::LossRowArgs& a,
                           std::vector<float>& w, int calls = 1) {
  std::vector<double> slots(size_t(LossStatsSlots::size(a.block)), 0.0);
  Tensor st = tensor_make(slots.data(), DType::u8, Device::cpu, 1, int64_t(slots.size() * sizeof(double)));
  for (int i = 0; i < calls; ++i)
    ops.loss_row_stats(row_view(in.labels, DType::i32), row_view(in.active, DType::u8),
                       row_view(in.loss, DType::f32), row_view(in.p_label, DType::f32),
                       row_view(in.argmax, DType::i32), a, row_view(w, DType::f32), st);
  return slots;
}

}  // namespace

// The same rows summed in the same order: the weights are equal to the last bit (the float rounding points
// are the same), and the f64 sums within 1e-12 relative (the restatement's pow/exp are the same libm calls).
TEST(LossRowStats, MatchesTheRestatedRules) {
  CpuTrainOps ops;
  for (int B : {2, 5, 16})
    for (bool streak : {false, true}) {
      RowInputs in(19, B, uint64_t(100 + B));
      TrainOps::LossRowArgs a;
      a.block = B;
      a.gamma = 3.5f;
      a.streak = streak;
      a.streak_alpha = 0.6f;
      std::vector<float> w(in.labels.size(), -1.0f);
      const std::vector<double> got = run_op(ops, in, a, w);
      const Restated want = restate(in, B, a.gamma, streak, a.streak_alpha);
      for (size_t r = 0; r < w.size(); ++r)
        ASSERT_EQ(w[r], want.w[r]) << "B " << B << " streak " << streak << " row " << r;
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_NEAR(got[i], want.slots[i], 1e-12 * std::fabs(want.slots[i])) << "B " << B << " slot " << i;
      EXPECT_GT(want.slots[LossStatsSlots::kTauBlocks], 0);
    }
}

TEST(LossRowStats, AccumulatesAndHonoursGivenWeights) {
  CpuTrainOps ops;
  const int B = 4;
  RowInputs in(7, B, 3);
  TrainOps::LossRowArgs a;
  a.block = B;
  a.gamma = 2.0f;
  std::vector<float> w(in.labels.size(), 0.0f);
  const std::vector<double> once = run_op(ops, in, a, w), twice = run_op(ops, in, a, w, 2);
  for (size_t i = 0; i < once.size(); ++i) EXPECT_EQ(twice[i], 2 * once[i]) << "slot " << i;
  // Given weights are read, not replaced, and are what the sums use.
  std::vector<float> given(in.labels.size());
  for (size_t r = 0; r < given.size(); ++r) given[r] = 0.25f * float(r % 3);
  std::vector<float> g = given;
  a.weights_given = true;
  const std::vector<double> s = run_op(ops, in, a, g);
  EXPECT_EQ(g, given);
  double ls = 0, ws = 0;
  for (size_t r = 0; r < given.size(); ++r) {
    ls += double(given[r]) * in.loss[r];
    ws += given[r];
  }
  EXPECT_EQ(s[LossStatsSlots::kLossSum], ls);
  EXPECT_EQ(s[LossStatsSlots::kWeightSum], ws);
  EXPECT_EQ(s[LossStatsSlots::kTauBlocks], once[LossStatsSlots::kTauBlocks]);  // accuracy ignores the weights
}

// Two micro-batches accumulated on the backend and read once give the sums of two separate one-batch steps,
// bit for bit on the CPU (same additions in the same order).
TEST(DrafterStats, ReadOncePerStepEqualsTheSumOfMicroBatches) {
  TinySetup s;
  const std::vector<DrafterAnchor> a1 = {{0, 0}, {0, 4}, {2, 1}}, a2 = {{2, 6}, {0, -1}, {2, 11}, {0, 8}};
  DrafterLossOptions o;
  o.streak = true;
  LossStats l1 = drafter_forward_backward(*s.model, s.batch, a1, o);
  LossStats l2 = drafter_forward_backward(*s.model, s.batch, a2, o);
  drafter_accumulate(*s.model, s.batch, a1, o);
  drafter_accumulate(*s.model, s.batch, a2, o);
  LossStats both = drafter_take_stats(*s.model);
  l1.merge(l2);
  EXPECT_EQ(both.loss_sum, l1.loss_sum);
  EXPECT_EQ(both.weight_sum, l1.weight_sum);
  EXPECT_EQ(both.tau_sum, l1.tau_sum);
  EXPECT_EQ(both.tau_blocks, l1.tau_blocks);
  EXPECT_EQ(both.correct, l1.correct);
  EXPECT_EQ(both.count, l1.count);
  EXPECT_GT(both.weight_sum, 0);
  // Taking zeroes the block.
  const LossStats empty = drafter_take_stats(*s.model);
  EXPECT_EQ(empty.weight_sum, 0);
  EXPECT_EQ(empty.tau_blocks, 0);
}

TEST(AnchorsCap, DropsUniformlyAtRandomKeepingOrder) {
  std::vector<DrafterAnchor> all;
  for (int i = 0; i < 10; ++i) all.push_back({i % 3, i});
  {
    std::vector<DrafterAnchor> a = all;
    Rng r(1), untouched(1);
    EXPECT_EQ(anchors_cap(a, 10, r), 0);
    EXPECT_EQ(anchors_cap(a, 0, r), 0);  // 0: no cap
    EXPECT_EQ(a.size(), all.size());
    EXPECT_EQ(r.next_u64(), untouched.next_u64());  // nothing drawn when nothing is dropped
  }
  // Same seed, same subset; order kept; every anchor kept about cap/n of the time (4000 draws: the kept
  // fraction 0.4 has a binomial std of 0.0077, the band ±0.04 is 5 std, with fixed seeds not a flake).
  std::map<int, int> kept;
  for (uint64_t seed = 0; seed < 4000; ++seed) {
    std::vector<DrafterAnchor> a = all, b = all;
    Rng r(seed), r2(seed);
    ASSERT_EQ(anchors_cap(a, 4, r), 6);
    anchors_cap(b, 4, r2);
    ASSERT_EQ(a.size(), 4u);
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].pos, b[i].pos);
      if (i > 0) ASSERT_LT(a[i - 1].pos, a[i].pos);
      ASSERT_EQ(a[i].seq, a[i].pos % 3);
      kept[a[i].pos] += 1;
    }
  }
  for (int i = 0; i < 10; ++i) EXPECT_NEAR(kept[i] / 4000.0, 0.4, 0.04) << "anchor " << i;
}

namespace {

// CpuTrainOps that counts allocations: the workspace must be the only one after the model's own buffers.
class CountingOps final : public TrainOps {
 public:
  int allocs = 0;
  CpuTrainOps cpu;
  Device device() const override { return cpu.device(); }
  const char* name() const override { return "counting cpu"; }
  DType act_dtype() const override { return cpu.act_dtype(); }
  void* alloc_bytes(size_t bytes) override {
    ++allocs;
    return cpu.alloc_bytes(bytes);
  }
  void free_bytes(void* p) override { cpu.free_bytes(p); }
  void upload_raw(const Tensor& d, const void* h) override { cpu.upload_raw(d, h); }
  void download_raw(const Tensor& s, void* h) override { cpu.download_raw(s, h); }
  void copy(const Tensor& s, const Tensor& d) override { cpu.copy(s, d); }
  void fill(const Tensor& d, float v) override { cpu.fill(d, v); }
  void gemm(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& c, float al,
            float be) override {
    cpu.gemm(a, ta, b, tb, c, al, be);
  }
  void gemm_add(const Tensor& a, bool ta, const Tensor& b, bool tb, const Tensor& ci, const Tensor& c,
                float al, float be) override {
    cpu.gemm_add(a, ta, b, tb, ci, c, al, be);
  }
  void embedding(const Tensor& i, const Tensor& t, const Tensor& o) override { cpu.embedding(i, t, o); }
  void scale_rows(const Tensor& x, const Tensor& s) override { cpu.scale_rows(x, s); }
  void add_gaussian_noise(const Tensor& x, float sd, uint64_t seed) override {
    cpu.add_gaussian_noise(x, sd, seed);
  }
  void rmsnorm_fwd(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& r, float e) override {
    cpu.rmsnorm_fwd(x, w, y, r, e);
  }
  void rmsnorm_bwd(const Tensor& x, const Tensor& w, const Tensor& r, const Tensor& dy, const Tensor& dx,
                   const Tensor& dw, float b, float bw) override {
    cpu.rmsnorm_bwd(x, w, r, dy, dx, dw, b, bw);
  }
  void qk_norm_rope_fwd(const Tensor& x, const Tensor& w, const Tensor& p, const Tensor& y, const Tensor& r,
                        int h, int hd, float th, float e) override {
    cpu.qk_norm_rope_fwd(x, w, p, y, r, h, hd, th, e);
  }
  void qk_norm_rope_bwd(const Tensor& x, const Tensor& w, const Tensor& p, const Tensor& r, const Tensor& dy,
                        const Tensor& dx, const Tensor& dw, int h, int hd, float th, float bw) override {
    cpu.qk_norm_rope_bwd(x, w, p, r, dy, dx, dw, h, hd, th, bw);
  }
  void dflash_attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& b,
                            const Tensor& o, const Tensor& l, const DFlashAttnShape& s) override {
    cpu.dflash_attention_fwd(q, k, v, b, o, l, s);
  }
  void dflash_attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& b,
                            const Tensor& o, const Tensor& l, const Tensor& d, const Tensor& dq,
                            const Tensor& dk, const Tensor& dv, const DFlashAttnShape& s) override {
    cpu.dflash_attention_bwd(q, k, v, b, o, l, d, dq, dk, dv, s);
  }
  void swiglu_fwd(const Tensor& g, const Tensor& u, const Tensor& o) override { cpu.swiglu_fwd(g, u, o); }
  void swiglu_bwd(const Tensor& g, const Tensor& u, const Tensor& d, const Tensor& dg,
                  const Tensor& du) override {
    cpu.swiglu_bwd(g, u, d, dg, du);
  }
  void lm_head_loss(const Tensor& h, const Tensor& lm, const Tensor& lab, const Tensor& act, const Tensor& th,
                    LmLossKind k, const Tensor& l, const Tensor& p, const Tensor& am, const Tensor& dh,
                    int64_t max_active) override {
    cpu.lm_head_loss(h, lm, lab, act, th, k, l, p, am, dh, max_active);
  }
  void loss_row_stats(const Tensor& lab, const Tensor& act, const Tensor& l, const Tensor& p,
                      const Tensor& am, const LossRowArgs& a, const Tensor& w, const Tensor& st) override {
    cpu.loss_row_stats(lab, act, l, p, am, a, w, st);
  }
  void domino_head_loss(const Tensor& y, const Tensor& lm, const Tensor& gi, const DominoHeadWeights& w,
                        const Tensor& lab, const Tensor& rw, const DominoHeadArgs& a, const Tensor& am,
                        const Tensor& dy, const DominoHeadWeights& dw, const Tensor& st) override {
    cpu.domino_head_loss(y, lm, gi, w, lab, rw, a, am, dy, dw, st);
  }
  std::vector<int32_t> domino_head_propose(const Tensor& y, const Tensor& lm, const Tensor& e,
                                           const DominoHeadWeights& w, const DominoHeadDims& d,
                                           int32_t first) override {
    return cpu.domino_head_propose(y, lm, e, w, d, first);
  }
  void dspark_head_loss(const Tensor& y, const Tensor& lm, const Tensor& th, const DSparkHeadWeights& w,
                        const Tensor& lab, const Tensor& pv, const Tensor& rw, const DSparkHeadArgs& a,
                        const Tensor& am, const Tensor& dy, const DSparkHeadWeights& dw,
                        const Tensor& st) override {
    cpu.dspark_head_loss(y, lm, th, w, lab, pv, rw, a, am, dy, dw, st);
  }
  std::vector<int32_t> dspark_head_propose(const Tensor& y, const Tensor& lm, const DSparkHeadWeights& w,
                                           const DSparkHeadDims& d, int32_t first,
                                           std::vector<double>* conf) override {
    return cpu.dspark_head_propose(y, lm, w, d, first, conf);
  }
  double sum_squares(const Tensor& x) override { return cpu.sum_squares(x); }
  void adamw(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const Tensor& lp,
             const AdamW& hp) override {
    cpu.adamw(p, g, m, v, lp, hp);
  }
};

}  // namespace

// Planned once for the largest batch: a small batch, then a larger one, then the largest allocate nothing;
// a batch beyond the plan fails naming the limit.
TEST(DrafterWorkspace, PlannedOnceNothingPerBatch) {
  TinySetup s;  // the host batch and tables (25 tokens)
  CountingOps ops;
  DrafterModel m(s.cfg, ops);
  drafter_init_params(m, 3);
  m.set_frozen(s.model->embed, s.model->lm_head);
  plan_workspace(m, 25, 8);
  const int after_plan = ops.allocs;
  const size_t bytes = m.workspace_bytes;
  EXPECT_EQ(bytes, drafter_workspace_bytes(s.cfg, m.limits, DType::f32));
  DrafterLossOptions o;
  o.noise_std = 0.1f;
  o.kind = LmLossKind::kl;
  DrafterBatch small = s.batch;
  small.offsets = {0, 11};
  small.tokens.resize(11);
  small.loss_mask.resize(11);
  small.taps = s.batch.taps.rows_view(0, 11);
  small.target_hidden = s.batch.target_hidden.rows_view(0, 11);
  drafter_accumulate(m, small, {{0, 2}}, o);
  drafter_accumulate(m, s.batch, {{0, 0}, {0, 4}, {2, 1}}, o);
  drafter_accumulate(m, s.batch, {{0, 0}, {0, 4}, {0, 8}, {2, 1}, {0, -1}, {2, 6}, {2, 11}, {2, 3}}, o);
  EXPECT_EQ(ops.allocs, after_plan);
  EXPECT_EQ(m.workspace_bytes, bytes);
  std::vector<DrafterAnchor> nine(9, DrafterAnchor{0, 1});
  const std::string e = error_of([&] { drafter_accumulate(m, s.batch, nine, o); });
  EXPECT_NE(e.find("max_block_rows"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { plan_workspace(m, 25, 8); }).find("planned once"), std::string::npos);
  DrafterModel unplanned(s.cfg, ops);
  unplanned.set_frozen(s.model->embed, s.model->lm_head);
  EXPECT_NE(error_of([&] {
              drafter_accumulate(unplanned, s.batch, {{0, 1}}, {});
            }).find("drafter_plan_workspace"),
            std::string::npos);
}

TEST(DrafterWorkspace, TokensBeyondThePlanNameTheBudget) {
  TinySetup s;
  CpuTrainOps ops;
  DrafterModel m(s.cfg, ops);
  m.set_frozen(s.model->embed, s.model->lm_head);
  plan_workspace(m, 24, 8);
  const std::string e = error_of([&] { drafter_accumulate(m, s.batch, {{0, 1}}, {}); });
  EXPECT_NE(e.find("data.token_budget"), std::string::npos) << e;
}

TEST(TrainOpsFactory, DevicesAndErrors) {
  EXPECT_STREQ(train_ops_create("cpu", 0)->name(), "cpu");
  EXPECT_NE(error_of([] { train_ops_create("tpu", 0); }).find("drafter.device"), std::string::npos);
#ifndef DF_HAVE_CUDA
  const std::string e = error_of([] { train_ops_create("cuda", 0); });
  EXPECT_NE(e.find("no CUDA backend"), std::string::npos) << e;
  EXPECT_NE(e.find("HINT"), std::string::npos) << e;
#endif
}

// Counter-based init: an element's value is a function of (seed, tensor name, index), so a deeper drafter
// shares every tensor of the shallower one bit for bit, and the values are the documented draws.
TEST(DrafterInit, CounterBasedPerTensorStreams) {
  CpuTrainOps ops;
  DrafterConfig c = tiny_drafter_config(), deeper = c;
  deeper.layers = 3;
  deeper.layer_types.push_back(DrafterLayerType::full);
  DrafterModel a(c, ops), b(deeper, ops);
  drafter_init_params(a, 9);
  drafter_init_params(b, 9);
  for (const DrafterParamEntry& e : a.table().entries) {
    const DrafterParamEntry& f = b.table().find(e.name);
    const float* pa = a.params.ptr<float>() + e.offset;
    const float* pb = b.params.ptr<float>() + f.offset;
    for (int64_t i = 0; i < e.rows * e.cols; ++i) ASSERT_EQ(pa[i], pb[i]) << e.name << " element " << i;
    if (!e.decay) {
      EXPECT_EQ(pa[0], 1.0f) << e.name;
      continue;
    }
    double sq = 0;
    for (int64_t i = 0; i < e.rows * e.cols; ++i) sq += double(pa[i]) * pa[i];
    // ≥ 256 draws of N(0, 0.02²): the RMS has a relative std ≤ 4.5%, the band is ±30%.
    EXPECT_NEAR(std::sqrt(sq / double(e.rows * e.cols)), 0.02, 0.006) << e.name;
  }
  DrafterModel other(c, ops);
  drafter_init_params(other, 10);
  EXPECT_NE(std::vector<float>(a.params.ptr<float>(), a.params.ptr<float>() + 64),
            std::vector<float>(other.params.ptr<float>(), other.params.ptr<float>() + 64));
}
