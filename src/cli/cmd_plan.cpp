// `dflash_mpi plan split|vram|flops`: the target:drafter split table for measured per-GPU rates (with the
// interconnect's cost when a link is given), so choosing 7-1 versus 6-2 is arithmetic on measurements rather
// than a guess; the per-role VRAM budget of a config; and the FLOPs and wire bytes of one batch of it.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "core/config.h"
#include "core/error.h"
#include "model/qwen_config.h"
#include "topo/plan_flops.h"
#include "topo/plan_split.h"
#include "topo/plan_vram.h"

namespace df {

namespace {

struct PlanSplitOptions {
  double target_rate = 0, drafter_rate = 0;
  int gpus = 0;
  std::string unit = "batches/s";
  double link_gbps = 0;       // each GPU's link, GB/s a direction; 0: links not modelled
  std::string link_name;      // for the table
  std::string config;         // the bytes of a batch and of the gradients
  std::string target_config;  // overrides the config's target architecture
  bool json = false;
};

struct PlanFlopsOptions {
  std::string config, target_config;
  int64_t seq_len = 0;
  bool json = false;
};

// The architecture a plan is made for: --target-config, else the config's target.
QwenConfig plan_target(const Config& cfg, const std::string& target_config) {
  return qwen_config_load(!target_config.empty() ? target_config : cfg.target.architecture());
}

void run_plan_split(const PlanSplitOptions& o) {
  SplitLinks links;
  if (o.link_gbps > 0) {
    DF_CHECK(!o.config.empty(),
             "--link-gbps needs --config: the bytes of a batch and of the gradients come from it");
    DF_CHECK(o.unit == "batches/s",
             "--link-gbps needs rates in batches/s (got --unit %s): a link moves batches", o.unit.c_str());
    Config cfg = config_load(o.config);
    const FlopsPlan f = plan_flops_compute(cfg, plan_target(cfg, o.target_config), 0);
    links.bytes_per_s = o.link_gbps * 1e9;
    links.batch_bytes = f.payload_bytes;
    links.grad_bytes = f.grad_bytes;
    links.grad_accum = f.grad_accum;
    links.name = o.link_name;
  } else {
    DF_CHECK(o.config.empty() && o.link_name.empty(), "--config and --link-name go with --link-gbps");
  }
  SplitPlan p = plan_split_compute(o.target_rate, o.drafter_rate, o.gpus, {}, links);
  std::fputs(o.json ? (plan_split_json(p) + "\n").c_str() : plan_split_format(p, o.unit).c_str(), stdout);
}

void run_plan_flops(const PlanFlopsOptions& o) {
  Config cfg = config_load(o.config);
  const QwenConfig target = plan_target(cfg, o.target_config);
  const FlopsPlan p = plan_flops_compute(cfg, target, o.seq_len);
  if (o.json) {
    std::printf("%s\n", plan_flops_json(p).c_str());
    return;
  }
  std::printf("target %s\n", qwen_config_summary(target).c_str());
  std::fputs(plan_flops_format(p).c_str(), stdout);
}

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
  QwenConfig target = plan_target(cfg, o.target_config);
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
  CLI::App* plan = app.add_subcommand("plan", "planners: target/drafter split, VRAM per role, FLOPs a batch");
  plan->require_subcommand(1);
  auto o = std::make_shared<PlanSplitOptions>();
  CLI::App* split = plan->add_subcommand("split", "throughput of every T:D split for measured per-GPU rates");
  split->add_option("--target-rate", o->target_rate, "rate one target GPU produces (unit per GPU)")
      ->required();
  split->add_option("--drafter-rate", o->drafter_rate, "rate one drafter GPU consumes (unit per GPU)")
      ->required();
  split->add_option("--gpus", o->gpus, "GPUs to split (T + D)")->required();
  split->add_option("--unit", o->unit, "unit of the rates")->check(CLI::IsMember({"batches/s", "tok/s"}));
  split
      ->add_option(
          "--link-gbps", o->link_gbps,
          "each GPU's link in GB/s a direction (PCIe 5.0 x16: 63 raw; measure with bench_grad_allreduce): "
          "the feature stream and the all-reduce then cost time; needs --config")
      ->check(CLI::PositiveNumber);
  split->add_option("--link-name", o->link_name, "what the link is, for the table (e.g. \"PCIe 5.0 x16\")");
  split->add_option("--config", o->config, "run config: the bytes of a batch and of the gradients");
  split->add_option("--target-config", o->target_config,
                    "config.json (or its directory) for the target architecture instead of the config's");
  split->add_flag("--json", o->json, "print the plan as one JSON object");
  split->callback([o] { run_plan_split(*o); });

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

  auto f = std::make_shared<PlanFlopsOptions>();
  CLI::App* flops = plan->add_subcommand(
      "flops",
      "FLOPs of the target forward and the drafter step over one batch of a config, and its wire bytes");
  flops->add_option("--config", f->config, "TOML run config")->required();
  flops->add_option("--target-config", f->target_config,
                    "config.json (or its directory) for the target architecture instead of the config's");
  flops->add_option("--seq-len", f->seq_len, "sequence length (default: one sequence fills the budget)")
      ->check(CLI::PositiveNumber);
  flops->add_flag("--json", f->json, "print one JSON object");
  flops->callback([f] { run_plan_flops(*f); });
}

}  // namespace df
