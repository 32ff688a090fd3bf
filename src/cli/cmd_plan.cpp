// `dflash_mpi plan split`: the target:drafter split table for measured per-GPU rates, so choosing 7-1
// versus 6-2 is arithmetic on measurements rather than a guess.
#include <memory>

#include "cli/commands.h"
#include "topo/plan_split.h"

namespace df {

namespace {

struct PlanSplitOptions {
  double target_rate = 0, drafter_rate = 0;
  int gpus = 0;
  std::string unit = "batches/s";
};

}  // namespace

void cmd_plan_register(CLI::App& app) {
  CLI::App* plan = app.add_subcommand("plan", "planners: target/drafter split");
  plan->require_subcommand(1);
  auto o = std::make_shared<PlanSplitOptions>();
  CLI::App* split = plan->add_subcommand("split", "throughput of every T:D split for measured per-GPU rates");
  split->add_option("--target-rate", o->target_rate, "rate one target GPU produces (unit per GPU)")->required();
  split->add_option("--drafter-rate", o->drafter_rate, "rate one drafter GPU consumes (unit per GPU)")->required();
  split->add_option("--gpus", o->gpus, "GPUs to split (T + D)")->required();
  split->add_option("--unit", o->unit, "unit of the rates")->check(CLI::IsMember({"batches/s", "tok/s"}));
  split->callback([o] {
    SplitPlan p = plan_split_compute(o->target_rate, o->drafter_rate, o->gpus);
    std::fputs(plan_split_format(p, o->unit).c_str(), stdout);
  });
}

}  // namespace df
