// Role rebalancing during a run (pipeline.rebalance): from the target and drafter rates measured over a
// window of steps, the split planner's best target:drafter split (topo/plan_split.h) is either advised
// ("advise": a log line and a metrics.jsonl record) or taken ("auto"): the drafters agree on a step as they
// do for SIGUSR1, checkpoint it, every loop returns, and the same processes re-form their roles and resume
// that checkpoint (rebalance_reform). Hysteresis: a move needs a full window of rates measured after a
// warm-up, at least a dwell time after the last (re)start, and a predicted gain above the margin.
#pragma once
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "core/config.h"
#include "comm/dist.h"
#include "topo/plan_split.h"
#include "topo/role_move.h"

namespace df {

struct RebalanceEvent {
  enum class Kind { advise, move, refused };
  Kind kind = Kind::advise;
  int64_t step = 0;                                           // optimizer steps done when it was decided
  int targets = 0, drafters = 0, grad_accum = 0;              // the split now
  int new_targets = 0, new_drafters = 0, new_grad_accum = 0;  // the split advised, taken or refused
  double target_rate = 0, drafter_rate = 0;                   // measured per rank, batches/s of busy time
  double predicted_now = 0, predicted_new = 0;                // pipeline batches/s: min(T·R_t, D·R_d)
  int64_t window_steps = 0;                                   // steps the rates were measured over
  std::string reason;                                         // refused: why
  std::vector<int> moved;                                     // move: the world ranks that change role
  int64_t moved_at = 0;  // move: the step checkpointed and resumed with the new roles
};

// What a split may become: the ranks in all, the current split and grad_accum, and the target counts the pins
// allow (role_move_range). The global batch, drafters x grad_accum, is kept: a split whose drafters do not
// divide it is refused.
struct RebalanceLimits {
  int gpus = 2, targets = 1, drafters = 1, grad_accum = 1;
  RoleRange range;
};

// The split planner's limits for a move from `lim`: the global batch kept, the pins' target range. The
// end-of-run split table is computed with them, so its recommendation is the split a move would take.
SplitLimits rebalance_split_limits(const RebalanceLimits& lim);

// The best split for these per-rank rates that beats the current one by more than `margin`: the refusals
// (a better split that the global batch or the pins rule out) first, then at most one advise event (kind
// advise; the caller makes it a move), always a split the move accepts: the planner's best reachable one.
// Empty when the current split is within the margin of the best reachable one and nothing better is refused.
std::vector<RebalanceEvent> rebalance_choose(double target_rate, double drafter_rate,
                                             const RebalanceLimits& lim, double margin, int64_t step);

// The controller drafter 0 runs: observe() after every optimizer step with that step's reduced statistics.
class Rebalancer {
 public:
  // start_step: the step this segment of the run started at (a resume or a re-form starts a new one).
  Rebalancer(const PipelineSection& cfg, const RebalanceLimits& lim, int64_t start_step);
  // `step` is 0-based (the step just done). Returns the events to record: refusals and advice are each given
  // once per split and segment; in "auto" a move is returned once, and then nothing more.
  std::vector<RebalanceEvent> observe(int64_t step, double batches, double target_busy_s,
                                      double drafter_busy_s);

 private:
  struct Sample {
    double batches, target_busy_s, drafter_busy_s;
  };
  PipelineSection cfg_;
  RebalanceLimits lim_;
  int64_t start_step_;
  std::deque<Sample> window_;
  std::vector<std::string> said_;  // "advise 3-1", "refused 4-0": given this segment
  bool moved_ = false;
};

std::string rebalance_event_json(const RebalanceEvent& e);  // the metrics.jsonl record
std::string rebalance_event_text(const RebalanceEvent& e);  // the log line

// How a loop ended. Drafters under "auto" may end to re-form: new_targets > 0, with the step checkpointed and
// (on drafter 0) the move's event; targets and a finished run return the default.
struct LoopEnd {
  int new_targets = 0;
  RebalanceEvent move;
};

// Collective over MPI_COMM_WORLD, every rank after its loop: drafter 0 tells everyone whether the roles move.
// Returns -1 when the run is over; else re-forms this rank (NCCL torn down, roles and communicators rebuilt:
// dist_reform), sets cfg's grad_accum to keep the global batch and its resume to the checkpoint just written,
// and returns the step the re-formed run must resume (rebalance_check_resumed). DFLASH_TEST_KILL_AT_REFORM=R
// (a test knob) makes world rank R kill itself here, after the checkpoint and before the re-form.
int64_t rebalance_reform(const LoopEnd& end, DistContext& ctx, Config& cfg);

// After the re-formed run's plan: it resumes the move's checkpoint, else the job ends naming the rank.
void rebalance_check_resumed(int64_t planned_start, int64_t expected, const DistContext& ctx);

}  // namespace df
