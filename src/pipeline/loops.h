// The two roles of a training run. Each returns when the run is over (all steps done, or a stop agreed on
// after SIGTERM / SIGUSR1) or, with pipeline.rebalance = "auto", when the drafters agreed to move the roles
// (LoopEnd, rebalance_reform); errors throw and end the job through MPI_Abort.
#pragma once
#include "comm/dist.h"
#include "pipeline/rebalance.h"
#include "pipeline/train_plan.h"

namespace df {

// Target: prefetch this target's batches, run the frozen target forward with taps, pack bf16 features and
// send them to their drafter under credits.
void target_loop(const TrainPlan& plan, const DistContext& ctx);

// Drafter: receive features, train the DFlash drafter, all-reduce gradients, AdamW, metrics, checkpoints.
LoopEnd drafter_loop(const TrainPlan& plan, const DistContext& ctx);

}  // namespace df
