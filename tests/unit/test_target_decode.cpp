// Incremental target decoding (model/target_decode.h) on the CPU with random tiny models of both families:
// steps of any size reproduce the full-sequence forward's taps and logits, and rolling a step back to a
// partial accept leaves the caches exactly as a fresh prefill of the accepted prefix would.
#include <gtest/gtest.h>

#include <vector>

#include "model/target_decode.h"
#include "ops/cpu/cpu_ops.h"
#include "target_test_util.h"

using namespace df;

namespace {

std::vector<float> download(Ops& ops, const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  ops.download_f32(t, v.data());
  return v;
}

std::vector<int> all_layers(const QwenConfig& c) {
  std::vector<int> l;
  for (int i = 0; i < c.layers; ++i) l.push_back(i);
  return l;
}

using TargetDecodeTest = TargetFamilyTest;

}  // namespace

TEST_P(TargetDecodeTest, StepsReproduceTheFullForward) {
  // The full forward runs the DeltaNet recurrence too, so both sides do the same arithmetic up to GEMM
  // blocking over different row counts and the attention's sum order: fp32 rounding, amplified by a few
  // layers of O(1) activations, stays under 2e-5 relative (observed ~1e-6; rounding_factor for the MoE hybrid).
  CpuOps ops(CpuGdnMode::recurrent);
  const double tol = 2e-5 * rounding_factor();
  const QwenConfig c = cfg();
  auto m = target_random(c, 23, ops, with_lm_head());
  const std::vector<int32_t> ids = random_ids(23, c.vocab, 4);
  const FwdResult full = run_model(*m, ops, ids, {23}, c.layers, true);
  const std::vector<float> want_logits = host_logits(*m, ops, full.final_norm);

  TargetDecoder dec(*m, {32, 8, 8}, all_layers(c));
  const int64_t H = c.hidden, V = c.vocab;
  int64_t done = 0;
  for (int64_t n : {5, 1, 7, 3, 7}) {
    dec.step(std::vector<int32_t>(ids.begin() + done, ids.begin() + done + n));
    const std::vector<float> lg = download(ops, dec.logits());
    ASSERT_EQ(int64_t(lg.size()), n * V);
    const std::vector<float> want(want_logits.begin() + done * V, want_logits.begin() + (done + n) * V);
    EXPECT_LT(max_err(lg, want), tol) << "logits of tokens " << done << ".." << done + n - 1;
    for (int l = 0; l < c.layers; ++l) {
      const std::vector<float> tap = download(ops, dec.tap(size_t(l)));
      const std::vector<float> wt(full.taps[size_t(l)].begin() + done * H,
                                  full.taps[size_t(l)].begin() + (done + n) * H);
      EXPECT_LT(max_err(tap, wt), tol) << "layer " << l << " tokens " << done << ".." << done + n - 1;
    }
    dec.commit(n);
    done += n;
  }
  EXPECT_EQ(dec.length(), 23);
}

TEST_P(TargetDecodeTest, RollbackEqualsFreshPrefill) {
  CpuOps ops;
  auto m = target_random(cfg(), 5, ops, with_lm_head());
  const RollbackRun r = rollback_vs_fresh_prefill(*m);
  // Same arithmetic except GEMM row blocking and the conv/attention order over a different split: fp32
  // rounding.
  EXPECT_LT(max_err(r.spec_logits, r.fresh_logits), 1e-5);
  for (size_t i = 0; i < 2; ++i) EXPECT_LT(max_err(r.spec_taps[i], r.fresh_taps[i]), 1e-5) << "tap " << i;
  EXPECT_EQ(r.spec_length, 12);
}

TEST_P(TargetDecodeTest, BatchedStepsMatchSingleSlotSteps) {
  // Three slots prefilled with different lengths, then three batched steps: every row's logits and taps equal
  // those of the same sequence decoded alone (GEMMs over 3 rows instead of 1: fp32 rounding only).
  CpuOps ops;
  const QwenConfig c = cfg();
  auto m = target_random(c, 9, ops, with_lm_head());
  const std::vector<int64_t> lens{5, 1, 9};
  TargetDecoder batch(*m, {16, 9, 4, 3}, {0}), single(*m, {16, 9, 4}, {0});
  for (int s = 0; s < 3; ++s) {
    batch.step(random_ids(int(lens[size_t(s)]), c.vocab, uint32_t(s + 1)), s);
    batch.commit(lens[size_t(s)]);
  }
  std::vector<std::vector<float>> logits, taps;
  for (int t = 0; t < 3; ++t) {
    batch.step_all({int32_t(t + 1), int32_t(t + 2), int32_t(t + 3)});
    logits.push_back(download(ops, batch.logits()));
    taps.push_back(download(ops, batch.tap(0)));
  }
  for (int s = 0; s < 3; ++s) {
    single.reset();
    single.step(random_ids(int(lens[size_t(s)]), c.vocab, uint32_t(s + 1)));
    single.commit(lens[size_t(s)]);
    for (int t = 0; t < 3; ++t) {
      single.step({int32_t(t + 1 + s)});
      single.commit(1);
      const int64_t V = c.vocab, H = c.hidden;
      const std::vector<float> lg(logits[size_t(t)].begin() + s * V, logits[size_t(t)].begin() + (s + 1) * V);
      const std::vector<float> tp(taps[size_t(t)].begin() + s * H, taps[size_t(t)].begin() + (s + 1) * H);
      EXPECT_LT(max_err(lg, download(ops, single.logits())), 1e-5) << "slot " << s << " step " << t;
      EXPECT_LT(max_err(tp, download(ops, single.tap(0))), 1e-5) << "slot " << s << " step " << t;
    }
    EXPECT_EQ(batch.length(s), lens[size_t(s)] + 3);
  }
}

TEST_P(TargetDecodeTest, MisuseIsAnError) {
  CpuOps ops;
  const QwenConfig c = cfg();
  auto m = target_random(c, 3, ops, with_lm_head());
  TargetDecoder dec(*m, {16, 8, 4}, {});
  dec.step(random_ids(8, c.vocab, 1));
  EXPECT_THROW(dec.step({1}), Error);  // the last step is not committed
  EXPECT_THROW(dec.commit(3), Error);  // states are kept for the last 4 tokens only: 5..8 or 0
  dec.commit(8);
  EXPECT_THROW(dec.step(random_ids(9, c.vocab, 2)), Error);  // longer than max_step
  EXPECT_THROW(dec.step({int32_t(c.vocab)}), Error);         // not a token
  EXPECT_THROW(dec.step({1}, 1), Error);                     // one slot only
  EXPECT_THROW(dec.step_all({1, 2}), Error);                 // one token per slot
  auto no_head = target_random(c, 3, ops, {});
  EXPECT_THROW(TargetDecoder(*no_head, {16, 8, 4}, {}), Error);
}

INSTANTIATE_TEST_SUITE_P(Families, TargetDecodeTest, ::testing::Values(0, 1, 2, 3, 4), target_family_name);
