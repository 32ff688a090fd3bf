// The work of one batch on each side of the pipeline, for predicting rates on a GPU that is not at hand: the
// target forward's FLOPs over a batch of data.token_budget tokens, the drafter step's FLOPs over the same
// batch (anchors drawn as the drafter loop draws them, capped at drafter.max_block_rows), and the bytes the
// batch and the optimizer step put on the interconnect. Used by `dflash_mpi plan flops`
// (benchmarks/seed_machine.py reads its JSON).
#pragma once
#include <cstdint>
#include <string>

#include "core/config.h"
#include "model/qwen_config.h"

namespace df {

struct FlopsPlan {
  int64_t tokens = 0;   // context tokens a batch (data.token_budget)
  int64_t seq_len = 0;  // sequences of this length fill the batch (the last one may be shorter)
  int64_t seqs = 0;
  int target_layers_run = 0;
  double target_flops = 0;   // the target forward over the batch
  int64_t anchors = 0;       // anchor blocks sampled from the batch
  int64_t blocks = 0;        // of those, kept under drafter.max_block_rows
  double drafter_flops = 0;  // one drafter micro-batch: forward + backward over the kept blocks
  double payload_bytes = 0;  // one target->drafter batch on the wire (plan vram's figure)
  double grad_bytes = 0;     // the fp32 gradient buffer every drafter all-reduces once an optimizer step
  int grad_accum = 1;        // micro-batches a drafter trains per optimizer step
};

// `seq_len` 0: one sequence fills the budget. The anchors are those the drafter loop draws for batch 0 of the
// run (run.seed); another batch's differ in position, which moves the attention FLOPs by a fraction of a
// percent.
FlopsPlan plan_flops_compute(const Config& cfg, const QwenConfig& target, int64_t seq_len);

// Bytes each drafter sends (and receives) in a ring all-reduce of `grad_bytes` over `drafters` ranks:
// 2 (D-1)/D of the buffer (NCCL's busbw convention); 0 for one drafter.
double plan_allreduce_bytes(double grad_bytes, int drafters);

// The table `plan flops` prints: per batch and per token, each line with its formula.
std::string plan_flops_format(const FlopsPlan& p);

// The same figures as one JSON object (keys as the struct's fields).
std::string plan_flops_json(const FlopsPlan& p);

}  // namespace df
