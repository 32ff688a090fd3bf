// `dflash_mpi plan split|vram`: the target:drafter split table for measured per-GPU rates, so choosing 7-1
// versus 6-2 is arithmetic on measurements rather than a guess; and the per-role VRAM budget of a config.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "core/config.h"
#include "model/qwen_config.h"
#include "topo/plan_split.h"
#include "topo/plan_vram.h"

namespace df {

namespace {

struct PlanSplitOptions {
  double target_rate = 0, drafter_rate = 0;
  int gpus = 0;
  std::string unit = "batches/s";
};

struct PlanVramOptions {
  std::string config;
  std::string target_config;  // overrides the config's target architecture (plan before downloading)
  double gpu_mem = 0;         // GiB; 0: NVML, else 80
  int targets = 0;            // 0: [topology] targets, else 7
  int64_t seq_len = 0;
};

void run_plan_vram(const PlanVramOptions& o) {
  Config cfg = config_load(o.config);
  const std::string& arch = !o.target_config.empty() ? o.target_config : cfg.target.architecture();
  QwenConfig target = qwen_config_load(arch);
  VramAssumptions assume;
  assume.targets = o.targets > 0              ? o.targets
                   : cfg.topology.targets > 0 ? cfg.topology.targets
                                              : assume.targets;
  assume.seq_len = o.seq_len;
  std::string source;
  const double gpu = plan_vram_gpu_bytes(o.gpu_mem, source);
  VramPlan plan = plan_vram_compute(cfg, target, gpu, source, assume);
  std::printf(
      "target %s: %s\ndrafter: %lld trainable params (flat buffers of %lld), target layers run: %d\n\n",
      arch.c_str(), qwen_config_summary(target).c_str(), (long long)plan.drafter_params,
      (long long)plan.drafter_flat, plan.target_layers_run);
  std::fputs(plan_vram_format(plan).c_str(), stdout);
  std::fflush(stdout);
  plan_vram_check(plan);
}

}  // namespace

void cmd_plan_register(CLI::App& app) {
  CLI::App* plan = app.add_subcommand("plan", "planners: target/drafter split, VRAM per role");
  plan->require_subcommand(1);
  auto o = std::make_shared<PlanSplitOptions>();
  CLI::App* split = plan->add_subcommand("split", "throughput of every T:D split for measured per-GPU rates");
  split->add_option("--target-rate", o->target_rate, "rate one target GPU produces (unit per GPU)")
      ->required();
  split->add_option("--drafter-rate", o->drafter_rate, "rate one drafter GPU consumes (unit per GPU)")
      ->required();
  split->add_option("--gpus", o->gpus, "GPUs to split (T + D)")->required();
  split->add_option("--unit", o->unit, "unit of the rates")->check(CLI::IsMember({"batches/s", "tok/s"}));
  split->callback([o] {
    SplitPlan p = plan_split_compute(o->target_rate, o->drafter_rate, o->gpus);
    std::fputs(plan_split_format(p, o->unit).c_str(), stdout);
  });

  auto v = std::make_shared<PlanVramOptions>();
  CLI::App* vram =
      plan->add_subcommand("vram", "bytes per target and drafter rank for a config; fails if over");
  vram->add_option("--config", v->config, "TOML run config")->required();
  vram->add_option(
      "--target-config", v->target_config,
      "config.json (or its directory) to take the target architecture from instead of the config's "
      "target.model / target.random_config");
  vram->add_option("--gpu-mem", v->gpu_mem, "GPU memory in GiB (default: NVML's total of GPU 0, else 80)")
      ->check(CLI::PositiveNumber);
  vram->add_option("--targets", v->targets,
                   "targets feeding each drafter (default: [topology] targets, else 7)")
      ->check(CLI::PositiveNumber);
  vram->add_option("--seq-len", v->seq_len,
                   "typical sequence length (default: one sequence fills the budget)")
      ->check(CLI::PositiveNumber);
  vram->callback([v] { run_plan_vram(*v); });
}

}  // namespace df
