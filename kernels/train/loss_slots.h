// The layout of the f64 statistics block that TrainOps::loss_row_stats adds into: loss_stats.cu writes it on
// the device, the CPU oracle (ops/cpu/cpu_train_stats.cpp) on the host, and the host reads it once per
// optimizer step (ops/loss_rows.h loss_stats_from_slots). Plain C++ with no CUDA header, like
// train_workspace.h, so that all three share this one definition.
#pragma once

namespace df {

// The fixed sums, then correct[B−1], then count[B−1].
struct LossStatsSlots {
  static constexpr int kLossSum = 0, kWeightSum = 1, kTauSum = 2, kTauBlocks = 3, kFixed = 4;
  static constexpr int size(int block) { return kFixed + 2 * (block - 1); }
  static constexpr int correct(int k) { return kFixed + k - 1; }  // offset k = 1..B−1
  static constexpr int count(int block, int k) { return kFixed + block - 1 + k - 1; }
};

}  // namespace df
