// Target:drafter split planner: given measured per-GPU rates of each side, which T:D over N GPUs gives the
// most training throughput, optionally with the interconnect's cost (the feature stream and the gradient
// all-reduce over each GPU's link: PCIe on boxes without NVLink). Used by `dflash_mpi plan split`, by the
// training run's final summary and by role rebalancing (pipeline/rebalance.h), which pass the limits of a
// move so that the split recommended is one the running job can reach.
#pragma once
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace df {

enum class SplitBottleneck { target, drafter, balanced };

// Each GPU's link, for the cost of the bytes a split moves. Rates are then batches/s. A target sends each
// batch (batch_bytes) while it computes the next, so it runs at min(R_t, bw / batch_bytes). A drafter
// receives each micro-batch while it trains the previous one and all-reduces grad_bytes once every grad_accum
// micro-batches after the whole backward (comm/grad_reducer.h: no overlap), so a micro-batch takes max(1/R_d,
// batch_bytes / bw) + plan_allreduce_bytes(grad_bytes, D) / bw / grad_accum.
struct SplitLinks {
  double bytes_per_s = 0;  // per GPU and direction; 0: links not modelled
  double batch_bytes = 0, grad_bytes = 0;
  int grad_accum = 1;
  std::string name;  // e.g. "PCIe 5.0 x16", for the table
};

struct SplitRow {
  int targets = 0, drafters = 0;
  double target_rate = 0, drafter_rate = 0;  // per GPU after the link's cost (the inputs without links)
  double allreduce_s = 0;                    // one optimizer step's all-reduce on the link
  double target_capacity = 0;   // T * R_t: what the targets can produce
  double drafter_capacity = 0;  // D * R_d: what the drafters can consume
  double throughput = 0;        // min of the two: the pipeline runs at its slower side
  double efficiency = 0;        // throughput / max of the two: the share of the faster side kept busy
  SplitBottleneck bottleneck = SplitBottleneck::balanced;
  std::string unreachable;  // why the limits rule this split out; empty: it can be had
};

// What a running job can move to: the global batch (drafters x grad_accum micro-batches a step) is kept, so
// it must split evenly over the new drafters, and pinned ranks bound the target count. The default rules
// nothing out (`plan split` on bare rates).
struct SplitLimits {
  int64_t global_batch = 0;  // micro-batches a step; 0: any drafter count
  int min_targets = 1, max_targets = std::numeric_limits<int>::max();
};

struct SplitPlan {
  double target_rate = 0, drafter_rate = 0;  // the per-GPU inputs
  SplitLinks links;
  std::vector<SplitRow> rows;                // T = N-1 .. 1 (D = 1 .. N-1)
  // Index into rows: the highest throughput among the reachable rows, ties to fewer drafters; -1 when the
  // limits rule out every row.
  int best = 0;
};

// Rates are per GPU, in any one unit (batches/s, tok/s). Throws unless both are finite and > 0 and gpus >= 2.
// With links.bytes_per_s > 0 the batch and gradient bytes must be > 0 and grad_accum >= 1.
SplitPlan plan_split_compute(double target_rate, double drafter_rate, int gpus,
                             const SplitLimits& limits = {}, const SplitLinks& links = {});

// The table (each unreachable row saying why) and the recommendation line, numbers in `unit`.
std::string plan_split_format(const SplitPlan& plan, const std::string& unit);

// The plan as one JSON object: the inputs, each row and the best index.
std::string plan_split_json(const SplitPlan& plan);

const char* split_bottleneck_name(SplitBottleneck b);

}  // namespace df
