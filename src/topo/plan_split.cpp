// The split planner: the pipeline's rate is that of its slower side, so for each T:D the throughput is
// min(T*R_t, D*R_d). Ties go to fewer drafters, which leaves more GPUs producing features. The best split is
// chosen among those the limits allow, so the recommendation never names a split a move would refuse.
#include "topo/plan_split.h"

#include <algorithm>
#include <cmath>

#include "core/count_noun.h"
#include "core/error.h"

namespace df {

namespace {

// Products of measured rates differ in the last bits between equal splits; 1e-9 relative is far below any
// rate difference a measurement can resolve and far above double rounding (~1e-16).
bool nearly_equal(double a, double b) {
  return std::fabs(a - b) <= 1e-9 * std::max(std::fabs(a), std::fabs(b));
}

// Why `limits` rule out `targets`-`drafters`; empty when they do not.
std::string split_unreachable(int targets, int drafters, const SplitLimits& limits) {
  if (limits.global_batch > 0 && limits.global_batch % drafters != 0)
    return strfmt("the global batch of %s a step (drafters x grad_accum) does not split over %s",
                  count_noun(limits.global_batch, "micro-batch", "micro-batches").c_str(),
                  count_noun(drafters, "drafter").c_str());
  if (targets < limits.min_targets || targets > limits.max_targets)
    return strfmt(
        "pinned ranks (rankfile `pinned`, pipeline.rebalance_pinned; drafter 0 never moves) keep %d..%d "
        "targets",
        limits.min_targets, limits.max_targets);
  return "";
}

}  // namespace

const char* split_bottleneck_name(SplitBottleneck b) {
  switch (b) {
    case SplitBottleneck::target:
      return "target";
    case SplitBottleneck::drafter:
      return "drafter";
    default:
      return "balanced";
  }
}

SplitPlan plan_split_compute(double target_rate, double drafter_rate, int gpus, const SplitLimits& limits) {
  DF_CHECK(std::isfinite(target_rate) && target_rate > 0, "--target-rate %g must be a positive per-GPU rate",
           target_rate);
  DF_CHECK(std::isfinite(drafter_rate) && drafter_rate > 0,
           "--drafter-rate %g must be a positive per-GPU rate", drafter_rate);
  DF_CHECK(gpus >= 2, "--gpus %d: a split needs at least 2 GPUs (one target, one drafter)", gpus);
  SplitPlan plan;
  plan.target_rate = target_rate;
  plan.drafter_rate = drafter_rate;
  for (int d = 1; d < gpus; ++d) {
    SplitRow r;
    r.targets = gpus - d;
    r.drafters = d;
    r.target_capacity = r.targets * target_rate;
    r.drafter_capacity = d * drafter_rate;
    r.throughput = std::min(r.target_capacity, r.drafter_capacity);
    r.efficiency = r.throughput / std::max(r.target_capacity, r.drafter_capacity);
    r.bottleneck = nearly_equal(r.target_capacity, r.drafter_capacity) ? SplitBottleneck::balanced
                   : r.target_capacity < r.drafter_capacity            ? SplitBottleneck::target
                                                                       : SplitBottleneck::drafter;
    r.unreachable = split_unreachable(r.targets, r.drafters, limits);
    plan.rows.push_back(r);
  }
  plan.best = -1;
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    if (!plan.rows[i].unreachable.empty()) continue;
    const double t = plan.rows[i].throughput;
    if (plan.best < 0) {
      plan.best = static_cast<int>(i);
      continue;
    }
    const double best = plan.rows[size_t(plan.best)].throughput;
    if (t > best && !nearly_equal(t, best)) plan.best = static_cast<int>(i);
  }
  return plan;
}

std::string plan_split_format(const SplitPlan& plan, const std::string& unit) {
  std::string out = strfmt("per-GPU rates: target %.4f, drafter %.4f %s; capacities and throughput in %s\n",
                           plan.target_rate, plan.drafter_rate, unit.c_str(), unit.c_str());
  out += strfmt("%-7s %-14s %-14s %-14s %-10s %s\n", "split", "targets", "drafters", "pipeline", "efficiency",
                "bottleneck");
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const SplitRow& r = plan.rows[i];
    const std::string note = static_cast<int>(i) == plan.best ? "  <- best"
                             : r.unreachable.empty()          ? ""
                                                              : "  (unreachable: " + r.unreachable + ")";
    out += strfmt("%-7s %-14.4f %-14.4f %-14.4f %-10s %s%s\n", strfmt("%d-%d", r.targets, r.drafters).c_str(),
                  r.target_capacity, r.drafter_capacity, r.throughput,
                  strfmt("%.1f%%", 100 * r.efficiency).c_str(), split_bottleneck_name(r.bottleneck),
                  note.c_str());
  }
  if (plan.best < 0) return out + "recommendation: none; every split above is unreachable\n";
  const SplitRow& b = plan.rows[size_t(plan.best)];
  out +=
      strfmt("recommendation: %d-%d (%s, %s): %.4f %s, %.1f%% efficiency, bottleneck %s\n", b.targets,
             b.drafters, count_noun(b.targets, "target").c_str(), count_noun(b.drafters, "drafter").c_str(),
             b.throughput, unit.c_str(), 100 * b.efficiency, split_bottleneck_name(b.bottleneck));
  return out;
}

}  // namespace df
