// `dflash_mpi config check`: every validation a training run makes before step 1 (config keys, target and
// drafter configs, run.dir, the token files and their content, the step count, the resume checkpoint), then
// what the run would do, so a mistake is found before a job waits in a queue for hours.
#include "cli/commands.h"
#include "core/config.h"
#include "core/log.h"
#include "model/drafter.h"
#include "pipeline/train_plan.h"

namespace df {

void cmd_config_register(CLI::App& root) {
  struct Args {
    std::string path;
    int targets = 0, drafters = 0;
    std::vector<std::string> allow_change;
  };
  auto args = std::make_shared<Args>();
  CLI::App* c = root.add_subcommand("config", "Run-config utilities");
  c->require_subcommand(1);
  CLI::App* chk =
      c->add_subcommand("check", "Run every check a training run makes before step 1, print the plan");
  chk->add_option("--config", args->path, "TOML run config")->required();
  chk->add_option("--targets", args->targets, "target ranks (default: [topology] targets, else 1)");
  chk->add_option("--drafters", args->drafters, "drafter ranks (default: [topology] drafters, else 1)");
  chk->add_option("--allow-change", args->allow_change, "as for train: a setting a resume may change");
  chk->callback([args] {
    Config cfg = config_load(args->path);
    const int t = args->targets > 0 ? args->targets : cfg.topology.targets > 0 ? cfg.topology.targets : 1;
    const int d = args->drafters > 0 ? args->drafters : cfg.topology.drafters > 0 ? cfg.topology.drafters : 1;
    TrainPlan plan = train_plan_build(cfg, t, d);
    const std::string resume = train_plan_find_resume(plan);
    if (!resume.empty()) train_plan_check_resume(plan, resume, args->allow_change);
    log_info("%s%s", config_table(cfg).c_str(), train_plan_summary(plan).c_str());
    drafter_check_kind_trainable(plan.drafter, cfg.drafter.device);
    log_info("config OK");
  });
}

}  // namespace df
