// Target:drafter split planner: given measured per-GPU rates of each side, which T:D over N GPUs gives the
// most training throughput. Used by `dflash_mpi plan split` and by the training run's final summary.
#pragma once
#include <string>
#include <vector>

namespace df {

enum class SplitBottleneck { target, drafter, balanced };

struct SplitRow {
  int targets = 0, drafters = 0;
  double target_capacity = 0;   // T * R_t: what the targets can produce
  double drafter_capacity = 0;  // D * R_d: what the drafters can consume
  double throughput = 0;        // min of the two: the pipeline runs at its slower side
  double efficiency = 0;        // throughput / max of the two: the share of the faster side kept busy
  SplitBottleneck bottleneck = SplitBottleneck::balanced;
};

struct SplitPlan {
  std::vector<SplitRow> rows;  // T = N-1 .. 1 (D = 1 .. N-1)
  int best = 0;                // index into rows: highest throughput, ties to fewer drafters
};

// Rates are per GPU, in any one unit (batches/s, tok/s). Throws unless both are finite and > 0 and gpus >= 2.
SplitPlan plan_split_compute(double target_rate, double drafter_rate, int gpus);

// The table and the recommendation line, numbers in `unit`.
std::string plan_split_format(const SplitPlan& plan, const std::string& unit);

const char* split_bottleneck_name(SplitBottleneck b);

}  // namespace df
