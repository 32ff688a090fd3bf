// The split planner: the pipeline's rate is that of its slower side, so for each T:D the throughput is
// min(T*R_t, D*R_d). Ties go to fewer drafters, which leaves more GPUs producing features. The best split is
// chosen among those the limits allow, so the recommendation never names a split a move would refuse.
#include "topo/plan_split.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "core/count_noun.h"
#include "core/error.h"
#include "topo/plan_flops.h"

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

SplitPlan plan_split_compute(double target_rate, double drafter_rate, int gpus, const SplitLimits& limits,
                             const SplitLinks& links) {
  DF_CHECK(std::isfinite(target_rate) && target_rate > 0, "--target-rate %g must be a positive per-GPU rate",
           target_rate);
  DF_CHECK(std::isfinite(drafter_rate) && drafter_rate > 0,
           "--drafter-rate %g must be a positive per-GPU rate", drafter_rate);
  DF_CHECK(gpus >= 2, "--gpus %d: a split needs at least 2 GPUs (one target, one drafter)", gpus);
  const double bw = links.bytes_per_s;
  DF_CHECK(std::isfinite(bw) && bw >= 0, "link bandwidth %g B/s must be >= 0", bw);
  if (bw > 0)
    DF_CHECK(
        links.batch_bytes > 0 && links.grad_bytes > 0 && links.grad_accum >= 1,
        "the link cost needs the bytes of a batch (%g) and of the gradients (%g) and grad_accum >= 1 (%d)",
        links.batch_bytes, links.grad_bytes, links.grad_accum);
  SplitPlan plan;
  plan.target_rate = target_rate;
  plan.drafter_rate = drafter_rate;
  plan.links = links;
  for (int d = 1; d < gpus; ++d) {
    SplitRow r;
    r.targets = gpus - d;
    r.drafters = d;
    r.target_rate = target_rate;
    r.drafter_rate = drafter_rate;
    if (bw > 0) {
      r.target_rate = std::min(target_rate, bw / links.batch_bytes);
      r.allreduce_s = plan_allreduce_bytes(links.grad_bytes, d) / bw;
      r.drafter_rate =
          1.0 / (std::max(1.0 / drafter_rate, links.batch_bytes / bw) + r.allreduce_s / links.grad_accum);
    }
    r.target_capacity = r.targets * r.target_rate;
    r.drafter_capacity = d * r.drafter_rate;
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
  const SplitLinks& L = plan.links;
  const bool links = L.bytes_per_s > 0;
  if (links)
    out += strfmt(
        "links: %s at %.4g GB/s a GPU and direction; %.4g GB a batch (feature stream), %.4g GB of fp32 "
        "gradients all-reduced every %d micro-batch(es); the per-GPU rates below include their cost\n",
        L.name.empty() ? "each GPU's link" : L.name.c_str(), L.bytes_per_s / 1e9, L.batch_bytes / 1e9,
        L.grad_bytes / 1e9, L.grad_accum);
  out += strfmt("%-7s %-14s %-14s %-14s %-10s %-10s", "split", "targets", "drafters", "pipeline",
                "efficiency", "bottleneck");
  out += links ? strfmt(" %-12s %-12s %-12s %-12s\n", "target/GPU", "drafter/GPU", "features", "all-reduce")
               : "\n";
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const SplitRow& r = plan.rows[i];
    const std::string note = static_cast<int>(i) == plan.best ? "  <- best"
                             : r.unreachable.empty()          ? ""
                                                              : "  (unreachable: " + r.unreachable + ")";
    out += strfmt("%-7s %-14.4f %-14.4f %-14.4f %-10s %-10s", strfmt("%d-%d", r.targets, r.drafters).c_str(),
                  r.target_capacity, r.drafter_capacity, r.throughput,
                  strfmt("%.1f%%", 100 * r.efficiency).c_str(), split_bottleneck_name(r.bottleneck));
    // Link columns: the rates after the link's cost, the feature bytes a second into each drafter as a share
    // of its link, and one optimizer step's all-reduce time.
    if (links)
      out += strfmt(
          " %-12.4f %-12.4f %-12s %-12s", r.target_rate, r.drafter_rate,
          strfmt("%.1f%% link", 100 * r.throughput / r.drafters * L.batch_bytes / L.bytes_per_s).c_str(),
          strfmt("%.3f s/step", r.allreduce_s).c_str());
    out += note + "\n";
  }
  if (plan.best < 0) return out + "recommendation: none; every split above is unreachable\n";
  const SplitRow& b = plan.rows[size_t(plan.best)];
  out +=
      strfmt("recommendation: %d-%d (%s, %s): %.4f %s, %.1f%% efficiency, bottleneck %s\n", b.targets,
             b.drafters, count_noun(b.targets, "target").c_str(), count_noun(b.drafters, "drafter").c_str(),
             b.throughput, unit.c_str(), 100 * b.efficiency, split_bottleneck_name(b.bottleneck));
  return out;
}

std::string plan_split_json(const SplitPlan& plan) {
  nlohmann::json rows = nlohmann::json::array();
  for (const SplitRow& r : plan.rows)
    rows.push_back(
        {{"targets", r.targets},
         {"drafters", r.drafters},
         {"target_rate", r.target_rate},
         {"drafter_rate", r.drafter_rate},
         {"allreduce_s", r.allreduce_s},
         {"allreduce_bytes", plan.links.bytes_per_s > 0 ? r.allreduce_s * plan.links.bytes_per_s : 0.0},
         {"target_capacity", r.target_capacity},
         {"drafter_capacity", r.drafter_capacity},
         {"throughput", r.throughput},
         {"bottleneck", split_bottleneck_name(r.bottleneck)},
         {"unreachable", r.unreachable}});
  const nlohmann::json j = {{"target_rate", plan.target_rate},
                            {"drafter_rate", plan.drafter_rate},
                            {"link_bytes_per_s", plan.links.bytes_per_s},
                            {"link", plan.links.name},
                            {"batch_bytes", plan.links.batch_bytes},
                            {"grad_bytes", plan.links.grad_bytes},
                            {"grad_accum", plan.links.grad_accum},
                            {"rows", rows},
                            {"best", plan.best}};
  return j.dump();
}

}  // namespace df
