// The split planner: the measured 8-GPU rates must give 7-1, ties go to fewer drafters (also when the
// products differ only by rounding), the choice is the brute-force best on awkward GPU counts, and under a
// move's limits (global batch, pinned target range) the best is the best reachable split; with a link's cost
// (PCIe on the seed's box) the feature stream and the all-reduce slow the rates as the formulas say.
#include <cmath>
#include <limits>

#include "topo/plan_split.h"
#include "topo_test_util.h"

namespace df {
namespace {

// Every value here is one or two double operations on the inputs: 1e-12 relative is ~1e4 ulps of slack
// and far below the 4th decimal the table prints.
void expect_close(double a, double b) {
  EXPECT_LE(std::fabs(a - b), 1e-12 + 1e-12 * std::fabs(b)) << a << " vs " << b;
}

TEST(TopoPlanSplit, MeasuredEightGpuRatesGiveSevenOne) {
  const double rt = 0.92 / 7, rd = 0.86;
  SplitPlan p = plan_split_compute(rt, rd, 8);
  ASSERT_EQ(p.rows.size(), 7u);
  const SplitRow& best = p.rows[p.best];
  EXPECT_EQ(best.targets, 7);
  EXPECT_EQ(best.drafters, 1);
  expect_close(best.target_capacity, 0.92);
  expect_close(best.drafter_capacity, 0.86);
  expect_close(best.throughput, 0.86);
  expect_close(best.efficiency, 0.86 / 0.92);
  EXPECT_EQ(best.bottleneck, SplitBottleneck::drafter);
  const SplitRow& six_two = p.rows[1];
  EXPECT_EQ(six_two.targets, 6);
  expect_close(six_two.throughput, 6 * rt);
  expect_close(six_two.efficiency, 6 * rt / (2 * rd));
  EXPECT_EQ(six_two.bottleneck, SplitBottleneck::target);
  for (const SplitRow& r : p.rows) EXPECT_FALSE(std::isnan(r.throughput) || std::isnan(r.efficiency));
  std::string table = plan_split_format(p, "batches/s");
  EXPECT_NE(table.find("recommendation: 7-1 (7 targets, 1 drafter): 0.8600 batches/s"), std::string::npos)
      << table;
  EXPECT_NE(table.find("7-1     0.9200"), std::string::npos) << table;
}

TEST(TopoPlanSplit, TiesGoToFewerDrafters) {
  // 4-1: min(4,3)=3 and 3-2: min(3,6)=3.
  EXPECT_EQ(plan_split_compute(1.0, 3.0, 5).rows[plan_split_compute(1.0, 3.0, 5).best].drafters, 1);
  // 3*0.1 = 0.30000000000000004 > 0.3: a rounding-level difference is still a tie.
  SplitPlan p = plan_split_compute(0.1, 0.3, 5);
  EXPECT_EQ(p.rows[p.best].drafters, 1);
}

TEST(TopoPlanSplit, BalancedSplitHasFullEfficiency) {
  SplitPlan p = plan_split_compute(2.5, 2.5, 2);
  ASSERT_EQ(p.rows.size(), 1u);
  EXPECT_EQ(p.rows[0].bottleneck, SplitBottleneck::balanced);
  expect_close(p.rows[0].efficiency, 1.0);
}

TEST(TopoPlanSplit, BestIsTheBruteForceMaximumOnAwkwardSizes) {
  for (int n : {3, 7, 19, 65}) {
    SplitPlan p = plan_split_compute(0.37, 1.9, n);
    ASSERT_EQ(static_cast<int>(p.rows.size()), n - 1);
    double best = 0;
    int best_d = 0;
    for (int d = 1; d < n; ++d) {
      double t = std::min((n - d) * 0.37, d * 1.9);
      if (t > best * (1 + 1e-9)) best = t, best_d = d;
    }
    EXPECT_EQ(p.rows[p.best].drafters, best_d) << "n=" << n;
    for (const SplitRow& r : p.rows) EXPECT_EQ(r.targets + r.drafters, n);
  }
}

TEST(TopoPlanSplit, RejectsBadInputs) {
  expect_error_with([] { plan_split_compute(0.1, 0.8, 1); }, "--gpus 1");
  expect_error_with([] { plan_split_compute(0, 0.8, 8); }, "--target-rate");
  expect_error_with([] { plan_split_compute(0.1, -1, 8); }, "--drafter-rate");
  expect_error_with([] { plan_split_compute(std::numeric_limits<double>::quiet_NaN(), 0.8, 8); },
                    "--target-rate");
  expect_error_with([] { plan_split_compute(0.1, std::numeric_limits<double>::infinity(), 8); },
                    "--drafter-rate");
}

TEST(TopoPlanSplit, LimitsRuleOutSplitsAndTheBestIsReachable) {
  // 3 ranks, targets 118 and drafters 35.6 batches/s (the CPU demo's rates): 1-2 (71.2) beats 2-1 (35.6), but
  // a global batch of 1 micro-batch cannot split over 2 drafters, so 2-1 is the recommendation.
  SplitLimits one;
  one.global_batch = 1;
  SplitPlan p = plan_split_compute(118, 35.6, 3, one);
  ASSERT_EQ(p.rows.size(), 2u);
  EXPECT_EQ(p.rows[size_t(p.best)].targets, 2);
  EXPECT_TRUE(p.rows[0].unreachable.empty());
  EXPECT_NE(p.rows[1].unreachable.find("1 micro-batch a step"), std::string::npos) << p.rows[1].unreachable;
  std::string table = plan_split_format(p, "batches/s");
  EXPECT_NE(table.find("recommendation: 2-1 (2 targets, 1 drafter)"), std::string::npos) << table;
  EXPECT_NE(
      table.find("(unreachable: the global batch of 1 micro-batch a step (drafters x grad_accum) does not "
                 "split over 2 drafters)"),
      std::string::npos)
      << table;
  const size_t marked = table.find("<- best");  // on the 2-1 row, not on the faster unreachable 1-2
  ASSERT_NE(marked, std::string::npos) << table;
  EXPECT_EQ(table.rfind('\n', marked) + 1, table.find("2-1 ")) << table;
  // Without limits the same rates recommend 1-2.
  p = plan_split_compute(118, 35.6, 3);
  EXPECT_EQ(p.rows[size_t(p.best)].targets, 1);
  // Pins that keep 5..6 targets of 8: 7-1 is out, the best reachable is 6-2.
  SplitLimits pins;
  pins.min_targets = 5;
  pins.max_targets = 6;
  p = plan_split_compute(0.92 / 7, 0.86, 8, pins);
  EXPECT_EQ(p.rows[size_t(p.best)].targets, 6);
  EXPECT_NE(p.rows[0].unreachable.find("keep 5..6 targets"), std::string::npos) << p.rows[0].unreachable;
  // Nothing reachable: no best, and the table says so instead of recommending.
  SplitLimits none;
  none.min_targets = 9;
  p = plan_split_compute(1.0, 1.0, 4, none);
  EXPECT_EQ(p.best, -1);
  EXPECT_NE(plan_split_format(p, "batches/s").find("recommendation: none"), std::string::npos);
}

TEST(TopoPlanSplit, UnderLimitsTheBestIsTheBruteForceMaximumOfTheReachableSplits) {
  for (int n : {3, 6, 9, 17})
    for (int64_t global : {1, 2, 6, 12})
      for (double rd : {0.2, 0.9, 3.1}) {
        SplitLimits lim;
        lim.global_batch = global;
        lim.max_targets = n - 2;
        SplitPlan p = plan_split_compute(1.0, rd, n, lim);
        double best = -1;
        int best_d = -1;
        for (int d = 1; d < n; ++d) {
          if (global % d != 0 || n - d > n - 2) continue;
          double t = std::min((n - d) * 1.0, d * rd);
          if (t > best * (1 + 1e-9)) best = t, best_d = d;
        }
        if (best_d < 0) {
          EXPECT_EQ(p.best, -1) << "n=" << n << " global=" << global;
          continue;
        }
        ASSERT_GE(p.best, 0) << "n=" << n << " global=" << global;
        EXPECT_EQ(p.rows[size_t(p.best)].drafters, best_d)
            << "n=" << n << " global=" << global << " rd=" << rd;
        EXPECT_TRUE(p.rows[size_t(p.best)].unreachable.empty());
      }
}

TEST(TopoPlanSplit, PcieLinksChargeTheAllReduceAndMoveTheBest) {
  // Without links: 7-1 min(0.7, 0.4) = 0.4, 6-2 min(0.6, 0.8) = 0.6 (best), 5-3 min(0.5, 1.2) = 0.5.
  EXPECT_EQ(plan_split_compute(0.1, 0.4, 8).best, 1);
  // 50 GB/s links, 1.6 GB batches, 150 GB of gradients: a ring all-reduce over D drafters moves 2(D-1)/D x
  // 150 GB a drafter, 3 s for two drafters, 4 s for three; one drafter all-reduces nothing.
  SplitLinks pcie{50e9, 1.6e9, 150e9, 1, "PCIe 5.0 x16"};
  SplitPlan p = plan_split_compute(0.1, 0.4, 8, {}, pcie);
  expect_close(p.rows[0].allreduce_s, 0.0);
  expect_close(p.rows[1].allreduce_s, 3.0);
  expect_close(p.rows[2].allreduce_s, 4.0);
  expect_close(p.rows[0].drafter_rate, 0.4);  // receiving a batch (0.032 s) hides behind its 2.5 s step
  expect_close(p.rows[1].drafter_rate, 1.0 / (2.5 + 3.0));
  expect_close(p.rows[2].drafter_rate, 1.0 / (2.5 + 4.0));
  expect_close(p.rows[1].throughput, 2.0 / 5.5);
  expect_close(p.rows[2].throughput, 3.0 / 6.5);
  EXPECT_EQ(p.best, 2) << "5-3 (0.4615) beats 7-1 (0.4) and 6-2 (0.3636) once the all-reduce is paid";
  EXPECT_EQ(p.rows[2].bottleneck, SplitBottleneck::drafter);
  // grad_accum 4: one all-reduce every 4 micro-batches.
  pcie.grad_accum = 4;
  expect_close(plan_split_compute(0.1, 0.4, 8, {}, pcie).rows[1].drafter_rate, 1.0 / (2.5 + 3.0 / 4));
  // A slow link bounds both sides by the batch's transfer: 20 GB at 1 GB/s is 20 s a batch.
  SplitLinks slow{1e9, 20e9, 1e9, 1, ""};
  SplitPlan q = plan_split_compute(0.1, 0.4, 8, {}, slow);
  expect_close(q.rows[0].target_rate, 0.05);
  expect_close(q.rows[0].drafter_rate, 1.0 / 20);
  const std::string table = plan_split_format(p, "batches/s");
  EXPECT_NE(table.find("links: PCIe 5.0 x16 at 50 GB/s a GPU and direction"), std::string::npos) << table;
  EXPECT_NE(table.find("3.000 s/step"), std::string::npos) << table;
  EXPECT_NE(table.find("recommendation: 5-3"), std::string::npos) << table;
  expect_error_with(
      [] {
        plan_split_compute(0.1, 0.4, 8, {}, SplitLinks{50e9, 0, 1e9, 1, ""});
      },
      "the link cost needs the bytes of a batch");
  expect_error_with(
      [] {
        plan_split_compute(0.1, 0.4, 8, {}, SplitLinks{-1, 1, 1, 1, ""});
      },
      "link bandwidth");
}

TEST(TopoPlanSplit, JsonCarriesEveryRowAndTheBest) {
  const SplitPlan p = plan_split_compute(0.1, 0.4, 8, {}, SplitLinks{50e9, 1.6e9, 150e9, 1, "PCIe"});
  const std::string j = plan_split_json(p);
  EXPECT_NE(j.find("\"best\":2"), std::string::npos) << j;
  EXPECT_NE(j.find("\"link\":\"PCIe\""), std::string::npos) << j;
  EXPECT_NE(j.find("\"allreduce_s\":3.0"), std::string::npos) << j;
}

}  // namespace
}  // namespace df
