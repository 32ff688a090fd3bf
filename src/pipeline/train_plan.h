// What every rank of a training run agrees on before any data moves: the configs (run, target, drafter),
// the corpus and its deterministic batch order, the step count, and where a resume starts. Built the same
// way on every rank from the same files, so only the resume point needs a broadcast.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "data/batcher.h"
#include "data/token_file.h"
#include "comm/dist.h"
#include "model/drafter.h"
#include "model/qwen_config.h"
#include "train/run_dir.h"

namespace df {

struct TrainPlan {
  Config cfg;
  QwenConfig target;
  DrafterConfig drafter;
  // The loss reads the target's final-norm output (drafter_streams_final_hidden): targets run every layer
  // and the final norm and send it beside the taps.
  bool final_hidden = false;
  int num_targets = 1, num_drafters = 1, grad_accum = 1;
  int64_t batches_per_step = 1;    // num_drafters · grad_accum
  int64_t total_steps = 0;
  int64_t start_step = 0;          // > 0 when resuming
  int64_t stop_at_step = 0;        // > 0: stop cleanly after this step (--stop-at-step)
  std::string resume_path;         // the checkpoint resumed from, if any
  // Only on the checkpoint owner (drafter 0): the run dir's lock for the whole run, the lineage id every
  // checkpoint gets, and where --fresh-start moved earlier checkpoints.
  std::unique_ptr<RunLock> lock;
  std::string run_id, moved_aside;
  uint64_t data_fingerprint = 0;   // batch order (seed, budget, buckets, lengths) and token content
  int64_t anchor_positions = 0;    // positions of the corpus that training can anchor a block at
  std::unique_ptr<TokenCorpus> corpus;
  std::unique_ptr<Batcher> batcher;

  std::string ckpt_dir() const { return cfg.run.dir + "/checkpoints"; }
  // Global batch index of micro-batch `micro` of optimizer step `step` on drafter `d`.
  int64_t batch_of(int64_t step, int micro, int d) const {
    return step * batches_per_step + int64_t(micro) * num_drafters + d;
  }
};

// Everything a run is checked for before step 1, without MPI (also `config check`): the target and drafter
// configs (mask id < vocab, taps < layers), run.dir usable, the token files readable with every token id below
// the target's vocabulary, at least one position to train on, and at least one optimizer step.
TrainPlan train_plan_build(const Config& cfg, int num_targets, int num_drafters);

// Where a run would resume (cfg.checkpoint.resume, "" = fresh) and the checks a resume makes before it
// loads anything: the checkpoint trained the same drafter, loss and LR schedule as `plan` (unless the key is
// in `allow_change`) and has the same batches per step. Sets plan.start_step and plan.resume_path.
std::string train_plan_find_resume(const TrainPlan& plan);
void train_plan_check_resume(TrainPlan& plan, const std::string& path, const std::vector<std::string>& allow_change);

// train_plan_build with the run's role counts, the VRAM check of a CUDA run (before any weights or data are
// loaded, printing the table), then on drafter 0 (and broadcast): the run dir locked, the start decided —
// refusing checkpoints the run would overwrite unless fresh_start moves them aside (run_dir.h) — and the
// resume point checked; stop_at_step (0: none) must lie after the step resumed from.
TrainPlan train_plan_make(const Config& cfg, const DistContext& ctx, bool fresh_start, int64_t stop_at_step,
                          const std::vector<std::string>& allow_change = {});

// The checkpoint a drafter loaded is the one the plan was checked against, on the same data.
struct CheckpointState;
void train_plan_check_loaded(const TrainPlan& plan, const CheckpointState& st);

// "what the run would do": roles, drafter size, corpus, steps, resume point; printed by `config check`.
std::string train_plan_summary(const TrainPlan& plan);

}  // namespace df
