// The rebalancing controller, its records, and the in-process re-form; see rebalance.h.
//
// Why the same processes re-form in process rather than exec'ing the command line again: MPI forbids a
// second MPI_Init in a process that called MPI_Finalize, and a process that exec's itself would have to
// join its job's world again as the same rank, which Open MPI does not support for a rank that finalized
// (the launcher counts it as done), so an exec would need a new mpirun from outside, i.e. the restart by
// hand this feature replaces. MPI_COMM_WORLD, by contrast, outlives any role:
// after the agreed checkpoint every loop returns and frees its channels, reducers and NCCL communicators,
// and the world only needs a new drafter_comm split and a fresh data_comm. Resuming that checkpoint through
// the normal path makes the re-formed run train exactly what a run stopped and resumed by hand would.
#include "pipeline/rebalance.h"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/log.h"
#include "topo/plan_split.h"

namespace df {

namespace {

std::string split_name(int t, int d) {
  return strfmt("%d-%d", t, d);
}

const char* kind_name(RebalanceEvent::Kind k) {
  switch (k) {
    case RebalanceEvent::Kind::move:
      return "rebalance";
    case RebalanceEvent::Kind::refused:
      return "rebalance_refused";
    default:
      return "rebalance_advice";
  }
}

}  // namespace

SplitLimits rebalance_split_limits(const RebalanceLimits& lim) {
  SplitLimits s;
  s.global_batch = int64_t(lim.drafters) * lim.grad_accum;
  s.min_targets = lim.range.min_targets;
  s.max_targets = lim.range.max_targets;
  return s;
}

std::vector<RebalanceEvent> rebalance_choose(double target_rate, double drafter_rate,
                                             const RebalanceLimits& lim, double margin, int64_t step) {
  std::vector<RebalanceEvent> out;
  if (!(std::isfinite(target_rate) && target_rate > 0 && std::isfinite(drafter_rate) && drafter_rate > 0))
    return out;
  const SplitLimits limits = rebalance_split_limits(lim);
  const SplitPlan plan = plan_split_compute(target_rate, drafter_rate, lim.gpus, limits);
  double now = 0;
  for (const SplitRow& r : plan.rows)
    if (r.targets == lim.targets) now = r.throughput;
  auto event = [&](const SplitRow& r, RebalanceEvent::Kind kind) {
    RebalanceEvent e;
    e.kind = kind;
    e.step = step;
    e.targets = lim.targets;
    e.drafters = lim.drafters;
    e.grad_accum = lim.grad_accum;
    e.new_targets = r.targets;
    e.new_drafters = r.drafters;
    e.target_rate = target_rate;
    e.drafter_rate = drafter_rate;
    e.predicted_now = now;
    e.predicted_new = r.throughput;
    e.reason = r.unreachable;
    if (kind == RebalanceEvent::Kind::advise) e.new_grad_accum = int(limits.global_batch / r.drafters);
    return e;
  };
  // The planner's best reachable split is the advice; the unreachable splits that would beat it (and the
  // current split by the margin) are the refusals, best first (equal throughputs: fewer drafters first).
  const SplitRow* best = plan.best >= 0 ? &plan.rows[size_t(plan.best)] : nullptr;
  std::vector<SplitRow> rows = plan.rows;
  std::stable_sort(rows.begin(), rows.end(), [](const SplitRow& a, const SplitRow& b) {
    return a.throughput > b.throughput || (a.throughput == b.throughput && a.drafters < b.drafters);
  });
  for (const SplitRow& r : rows) {
    if ((best && r.targets == best->targets) || r.targets == lim.targets ||
        !(r.throughput > now * (1 + margin)))
      break;
    if (!r.unreachable.empty()) out.push_back(event(r, RebalanceEvent::Kind::refused));
  }
  if (best && best->targets != lim.targets && best->throughput > now * (1 + margin))
    out.push_back(event(*best, RebalanceEvent::Kind::advise));
  return out;
}

Rebalancer::Rebalancer(const PipelineSection& cfg, const RebalanceLimits& lim, int64_t start_step)
    : cfg_(cfg), lim_(lim), start_step_(start_step) {}

std::vector<RebalanceEvent> Rebalancer::observe(int64_t step, double batches, double target_busy_s,
                                                double drafter_busy_s) {
  if (cfg_.rebalance == "off" || moved_) return {};
  const int64_t done = step + 1 - start_step_;  // steps of this segment
  if (done > cfg_.rebalance_warmup_steps) {
    window_.push_back({batches, target_busy_s, drafter_busy_s});
    if (int64_t(window_.size()) > cfg_.rebalance_window_steps) window_.pop_front();
  }
  if (done < cfg_.rebalance_dwell_steps || int64_t(window_.size()) < cfg_.rebalance_window_steps) return {};
  Sample sum{0, 0, 0};
  for (const Sample& s : window_) {
    sum.batches += s.batches;
    sum.target_busy_s += s.target_busy_s;
    sum.drafter_busy_s += s.drafter_busy_s;
  }
  // Per rank: a batch costs its target target_busy_s and its drafter drafter_busy_s (both summed over ranks).
  const double rt = sum.target_busy_s > 0 ? sum.batches / sum.target_busy_s : 0;
  const double rd = sum.drafter_busy_s > 0 ? sum.batches / sum.drafter_busy_s : 0;
  std::vector<RebalanceEvent> out;
  for (RebalanceEvent& e : rebalance_choose(rt, rd, lim_, cfg_.rebalance_margin, step + 1)) {
    e.window_steps = int64_t(window_.size());
    const std::string key = strfmt("%s %d-%d", kind_name(e.kind), e.new_targets, e.new_drafters);
    const bool take = e.kind == RebalanceEvent::Kind::advise && cfg_.rebalance == "auto";
    if (!take && std::find(said_.begin(), said_.end(), key) != said_.end()) continue;
    said_.push_back(key);
    if (take) {
      e.kind = RebalanceEvent::Kind::move;
      moved_ = true;
    }
    out.push_back(e);
  }
  return out;
}

std::string rebalance_event_json(const RebalanceEvent& e) {
  nlohmann::json j = {{"event", kind_name(e.kind)},
                      {"step", e.kind == RebalanceEvent::Kind::move ? e.moved_at : e.step},
                      {"decided_at", e.step},
                      {"from", split_name(e.targets, e.drafters)},
                      {"to", split_name(e.new_targets, e.new_drafters)},
                      {"grad_accum_from", e.grad_accum},
                      {"target_rate", e.target_rate},
                      {"drafter_rate", e.drafter_rate},
                      {"predicted_now", e.predicted_now},
                      {"predicted_new", e.predicted_new},
                      {"predicted_gain", e.predicted_now > 0 ? e.predicted_new / e.predicted_now - 1 : 0.0},
                      {"window_steps", e.window_steps}};
  if (e.kind == RebalanceEvent::Kind::refused)
    j["reason"] = e.reason;
  else
    j["grad_accum_to"] = e.new_grad_accum;
  if (e.kind == RebalanceEvent::Kind::move) j["moved_ranks"] = e.moved;
  return j.dump();
}

std::string rebalance_event_text(const RebalanceEvent& e) {
  const std::string rates = strfmt(
      "measured per rank over %lld steps: target %.3f, drafter %.3f batches/s; pipeline %s %.3f -> %s %.3f "
      "batches/s predicted (%+.1f%%)",
      (long long)e.window_steps, e.target_rate, e.drafter_rate, split_name(e.targets, e.drafters).c_str(),
      e.predicted_now, split_name(e.new_targets, e.new_drafters).c_str(), e.predicted_new,
      100 * (e.predicted_now > 0 ? e.predicted_new / e.predicted_now - 1 : 0.0));
  switch (e.kind) {
    case RebalanceEvent::Kind::refused:
      return strfmt("rebalance: %s refused: %s (%s)", split_name(e.new_targets, e.new_drafters).c_str(),
                    e.reason.c_str(), rates.c_str());
    case RebalanceEvent::Kind::move: {
      std::string ranks;
      for (int r : e.moved) ranks += strfmt("%s%d", ranks.empty() ? "" : ",", r);
      return strfmt(
          "rebalance: moving %s -> %s after step %lld (ranks %s change role, grad_accum %d -> %d): %s",
          split_name(e.targets, e.drafters).c_str(), split_name(e.new_targets, e.new_drafters).c_str(),
          (long long)e.moved_at, ranks.c_str(), e.grad_accum, e.new_grad_accum, rates.c_str());
    }
    default:
      return strfmt("rebalance advice: %s would be faster (grad_accum %d keeps the global batch): %s",
                    split_name(e.new_targets, e.new_drafters).c_str(), e.new_grad_accum, rates.c_str());
  }
}

int64_t rebalance_reform(const LoopEnd& end, DistContext& ctx, Config& cfg) {
  const int owner = ctx.roles.drafters[0];
  // new targets, step, grad_accum, how many ranks move, then the moving ranks.
  std::vector<int64_t> msg(size_t(4 + ctx.world), 0);
  if (ctx.rank == owner && end.new_targets > 0) {
    msg[0] = end.new_targets;
    msg[1] = end.move.moved_at;
    msg[2] = end.move.new_grad_accum;
    msg[3] = int64_t(end.move.moved.size());
    for (size_t i = 0; i < end.move.moved.size(); ++i) msg[4 + i] = end.move.moved[i];
  }
  MPI_Bcast(msg.data(), int(msg.size()), MPI_INT64_T, owner, MPI_COMM_WORLD);
  if (msg[0] == 0) return -1;
  if (const char* kill = std::getenv("DFLASH_TEST_KILL_AT_REFORM"); kill && std::atoi(kill) == ctx.rank) {
    log_all("DFLASH_TEST_KILL_AT_REFORM: killing this rank during the move (a test knob)");
    std::raise(SIGKILL);
  }
  std::vector<int> moved;
  for (int64_t i = 0; i < msg[3]; ++i) moved.push_back(int(msg[size_t(4 + i)]));
  dist_nccl_stop(ctx);
  dist_reform(ctx, roles_after_move(ctx.roles, moved));
  DF_CHECK(ctx.num_targets() == int(msg[0]), "rank %d: re-formed to %d targets, but drafter 0 moved to %lld",
           ctx.rank, ctx.num_targets(), (long long)msg[0]);
  cfg.train.grad_accum = int(msg[2]);
  cfg.checkpoint.resume = "auto";  // the move's checkpoint is the run dir's latest
  return msg[1];
}

void rebalance_check_resumed(int64_t planned_start, int64_t expected, const DistContext& ctx) {
  DF_CHECK(
      planned_start == expected,
      "rank %d: after the role move the run would resume step %lld, but the move checkpointed step %lld; "
      "HINT: something else wrote into run.dir's checkpoints during the move; resume by hand from "
      "step_%08lld.h5",
      ctx.rank, (long long)planned_start, (long long)expected, (long long)expected);
}

}  // namespace df
