// `dflash_mpi train --config F` (also plain `dflash_mpi --config F`): the training run. Every rank parses the
// same config, resolves its role, and runs the target or the drafter loop.
#include <limits>

#include "cli/commands.h"
#include "core/config.h"
#include "core/count_noun.h"
#include "core/log.h"
#include "comm/dist.h"
#include "pipeline/loops.h"
#include "pipeline/train_plan.h"

namespace df {

void train_run(const TrainArgs& args) {
  Config cfg = config_load(args.config);
  signals_install();
  DistContext ctx = dist_init(args.rankfile, cfg.topology, cfg.target.device == "cuda" || cfg.drafter.device == "cuda",
                              cfg.pipeline.transport, cfg.run.watchdog_s != 0);
  roles_pin(ctx.roles, cfg.pipeline.rebalance_pinned);
  if (ctx.rank == 0) log_here("%s", config_table(cfg).c_str());
  // One pass per role map: pipeline.rebalance = "auto" may end a pass after an agreed checkpoint, and the same
  // processes then re-form their roles and resume it (rebalance.cpp says why in process, not by exec).
  bool fresh_start = args.fresh_start;
  for (int64_t moved_at = -1;;) {
    LoopEnd end;
    {
      TrainPlan plan = train_plan_make(cfg, ctx, fresh_start, args.stop_at_step, args.allow_change);
      if (moved_at >= 0) rebalance_check_resumed(plan.start_step, moved_at, ctx);
      if (ctx.rank == 0)
        log_here("plan: %s, %s, grad_accum %d -> %lld batches per step; steps %lld..%lld%s%s",
                 count_noun(plan.num_targets, "target").c_str(),
                 count_noun(plan.num_drafters, "drafter").c_str(), plan.grad_accum,
                 (long long)plan.batches_per_step, (long long)plan.start_step, (long long)plan.total_steps,
                 plan.resume_path.empty() ? "" : "; resume from ", plan.resume_path.c_str());
      if (ctx.rank == 0 && plan.target.is_moe()) log_here("target: %s", qwen_config_summary(plan.target).c_str());
      dist_nccl_start(ctx, cfg.run.watchdog_s != 0);
      if (ctx.role == RankRole::target)
        target_loop(plan, ctx);
      else
        end = drafter_loop(plan, ctx);
    }  // the plan goes, and with it drafter 0's run-dir lock, which the next pass takes again
    moved_at = rebalance_reform(end, ctx, cfg);
    if (moved_at < 0) break;
    fresh_start = false;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  dist_finalize(ctx);
}

void train_add_options(CLI::App& app, TrainArgs& args) {
  app.add_option("--config", args.config,
                 "TOML run config (see configs/tiny.toml; [pipeline] rebalance = \"off\" turns role rebalancing "
                 "off; pipeline.test_target_delay_s is a test knob that slows every target, not for real runs)");
  app.add_option("--rankfile", args.rankfile, "rankfile with '# role=target|drafter gpu=N' annotations "
                                              "(also DFLASH_RANKFILE)");
  CLI::Option* stop = app.add_option(
      "--stop-at-step", args.stop_at_step,
      "N >= 1, above the step the run resumes from: after optimizer step N, write a checkpoint and exit 0; "
      "the next run with this config resumes from step N (the LR schedule still spans all steps)");
  stop->check(CLI::Range(int64_t(1), std::numeric_limits<int64_t>::max()));
  app.add_flag(
      "--fresh-start", args.fresh_start,
      "start although <run.dir>/checkpoints holds checkpoints this run would overwrite: move that folder "
      "to <run.dir>/checkpoints.old-<UTC time>/ first (nothing is deleted); checkpoint.resume = \"auto\" "
      "then starts at step 0");
  app.add_option("--allow-change", args.allow_change, "a setting (e.g. train.lr) that a resume may change from what "
                                                      "the checkpoint trained; repeatable");
}

void cmd_train_register(CLI::App& root) {
  CLI::App* t = root.add_subcommand("train", "Train a DFlash drafter (run under mpirun / srun: one rank per GPU)");
  auto sub = std::make_shared<TrainArgs>();
  train_add_options(*t, *sub);
  t->get_option("--config")->required();
  t->footer(
      "Stopping early: SIGUSR1 or SIGTERM to any rank, or the file DFLASH_STOP_FILE names coming\n"
      "into being (the SLURM scripts in launch/slurm create it on USR1), makes every rank agree on\n"
      "a step, checkpoint it and exit 0; the next run with the same config resumes from it.");
  t->callback([sub] { train_run(*sub); });
}

}  // namespace df
