// Held-out evaluation during training ([eval] data / interval): the drafter's loss and teacher-forced τ on
// feature files that `dflash_mpi extract --for-config` wrote for this run, forward only, with the same
// anchors every time so successive evaluations compare. Runs on drafter 0 beside the training step; the files
// are read batch by batch on every evaluation, so a large held-out set costs no memory between evaluations.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "data/feature_file.h"
#include "model/drafter.h"
#include "pipeline/drafter_memory.h"

namespace df {

class HeldoutEval {
 public:
  // Opens every eval.data file and checks it holds the drafter's taps (and final_norm for the soft-KL loss)
  // at its hidden size; packs its sequences (the first eval.max_sequences over all files) into batches of at
  // most data.token_budget tokens, cutting a longer sequence to its first token_budget tokens as training does.
  HeldoutEval(const Config& cfg, const DrafterConfig& drafter);
  ~HeldoutEval();
  // Σ w·L, Σ w, per-offset accuracy and τ over the whole held-out set (opts.backward is ignored: no
  // backward). Each batch is staged through `mem` (the training loop's, planned for data.token_budget) into
  // the backend's act dtype, and its blocks capped at m.limits.max_blocks as a training batch's are.
  LossStats run(DrafterModel& m, DrafterMemory& mem, const DrafterLossOptions& opts);
  int64_t sequences() const { return sequences_; }

 private:
  struct Batch {
    size_t file = 0;
    int64_t first_seq = 0, num_seqs = 0;
  };
  DrafterConfig dc_;
  std::vector<std::unique_ptr<FeatureFileReader>> readers_;
  std::vector<TokenData> tokens_;
  std::vector<Batch> batches_;
  int64_t budget_ = 0;
  int64_t sequences_ = 0;
  bool final_hidden_ = false;
};

}  // namespace df
