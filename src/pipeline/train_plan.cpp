// Building the shared training plan; see train_plan.h.
#include "pipeline/train_plan.h"

#include <cmath>

#include "core/log.h"
#include "model/target.h"
#include "pipeline/feature_source.h"
#include "topo/plan_vram.h"
#include "train/checkpoint.h"

namespace df {

TrainPlan train_plan_make(const Config& cfg, const DistContext& ctx, bool fresh_start, int64_t stop_at_step) {
  TrainPlan p;
  p.cfg = cfg;
  p.target = qwen_config_load(cfg.target.architecture());
  if (cfg.target.device == "cuda" && !cfg.topology.offline) {
    // Stop before loading anything when a role cannot fit its GPU (plan vram prints the same table).
    std::string gpu_source;
    VramAssumptions assume;
    assume.targets = ctx.num_targets();
    VramPlan vram = plan_vram_compute(cfg, p.target, plan_vram_gpu_bytes(0, gpu_source), gpu_source, assume);
    if (ctx.rank == 0) log_here("%s", plan_vram_format(vram).c_str());
    plan_vram_check(vram);
  }
  p.drafter = drafter_config_from_run(cfg, p.target);
  p.kl = cfg.train.loss == "kl";
  p.num_targets = ctx.num_targets();
  p.num_drafters = ctx.num_drafters();
  p.grad_accum = cfg.train.grad_accum;
  p.batches_per_step = int64_t(p.num_drafters) * p.grad_accum;

  DF_CHECK(!cfg.data.train.empty() || cfg.topology.offline, "%s: 'data.train' lists no token files; HINT: make one "
           "with `dflash_mpi data synth`, `data convert` or `data tokenize` (or train offline from `extract` output "
           "with data.features)",
           cfg.path.c_str());
  // Offline, the feature files are the corpus: each holds the tokens its taps were extracted from.
  p.corpus = std::make_unique<TokenCorpus>(cfg.topology.offline ? cfg.data.features : cfg.data.train);
  if (cfg.topology.offline) feature_files_validate(p);
  if (p.corpus->vocab_size() > 0)
    DF_CHECK(p.corpus->vocab_size() <= p.target.vocab, "the token files were made for a vocabulary of %lld but the "
             "target has %d",
             (long long)p.corpus->vocab_size(), p.target.vocab);
  BatcherOptions bo;
  bo.seed = cfg.run.seed;
  bo.token_budget = cfg.data.token_budget;
  bo.bucket_bounds = cfg.data.buckets;
  p.batcher = std::make_unique<Batcher>(p.corpus->sequence_lengths(), bo);

  const int64_t full = int64_t(std::floor(cfg.train.epochs));
  const double frac = cfg.train.epochs - double(full);
  int64_t total_batches = p.batcher->epoch_start(full) + int64_t(std::llround(frac * p.batcher->batches_in_epoch(full)));
  p.total_steps = cfg.run.max_steps > 0 ? cfg.run.max_steps : total_batches / p.batches_per_step;
  DF_CHECK(p.total_steps > 0, "%lld batches in %.3g epochs make no optimizer step of %lld batches (%d drafters x "
           "grad_accum %d); HINT: more data, more epochs, a smaller data.token_budget or run.max_steps",
           (long long)total_batches, cfg.train.epochs, (long long)p.batches_per_step, p.num_drafters, p.grad_accum);

  // Drafter 0 owns the run dir: before anything is written it takes the lock, decides where the run starts
  // (refusing checkpoints it would overwrite) and tells everyone.
  const int owner = ctx.roles.drafters[0];
  RunStart rs;
  if (ctx.rank == owner) {
    p.lock = std::make_unique<RunLock>(cfg.run.dir);
    rs = run_start_decide(cfg.run.dir, p.ckpt_dir(), cfg.checkpoint.resume, fresh_start);
    p.lock->set_run_id(rs.state.run_id);
    p.run_id = rs.state.run_id;
    p.moved_aside = rs.moved_to;
  }
  std::string resume = rs.resume_path;
  int64_t len = int64_t(resume.size());
  MPI_Bcast(&len, 1, MPI_INT64_T, owner, MPI_COMM_WORLD);
  resume.resize(size_t(len));
  MPI_Bcast(resume.data(), int(len), MPI_CHAR, owner, MPI_COMM_WORLD);
  p.resume_path = resume;
  int64_t pos[2] = {rs.state.step, rs.state.batch_cursor};
  MPI_Bcast(pos, 2, MPI_INT64_T, owner, MPI_COMM_WORLD);
  p.start_step = pos[0];
  // The step → batch mapping is step · drafters · grad_accum: a checkpoint resumes exactly only with the same
  // product (the number of targets may change freely).
  DF_CHECK(pos[1] == p.start_step * p.batches_per_step,
           "%s is at step %lld with batch cursor %lld, i.e. %lld batches per step, but this run has %lld (%d drafters "
           "x grad_accum %d); HINT: resume with drafters x train.grad_accum = %lld",
           resume.c_str(), (long long)p.start_step, (long long)pos[1],
           (long long)(p.start_step > 0 ? pos[1] / p.start_step : 0), (long long)p.batches_per_step, p.num_drafters,
           p.grad_accum, (long long)(p.start_step > 0 ? pos[1] / p.start_step : 0));
  DF_CHECK(stop_at_step == 0 || stop_at_step > p.start_step,
           "--stop-at-step %lld is not after step %lld, where this run %s; HINT: give a step above %lld "
           "(it is the optimizer step after which the run checkpoints and exits), or leave it out",
           (long long)stop_at_step, (long long)p.start_step,
           p.start_step > 0 ? "resumes from its checkpoint" : "starts", (long long)p.start_step);
  p.stop_at_step = stop_at_step;
  return p;
}

std::unique_ptr<TargetModel> train_load_target(const TrainPlan& plan, Ops& ops, int num_layers, bool need_lm_head) {
  TargetLoadOptions opt;
  opt.num_layers = num_layers;
  opt.need_lm_head = need_lm_head;
  if (!plan.cfg.target.model.empty()) return target_load(plan.cfg.target.model, ops, opt);
  return target_random(plan.target, plan.cfg.target.random_seed, ops, opt);
}

}  // namespace df
