// The drafter's loss on the host side: per-row weights (offset decay, streak-aware multiplier), the statistics
// a metrics line reports (Σ w·loss, Σ w, per-offset accuracy, τ) and how micro-batches merge.
// The loss itself is normalised by the caller over the whole optimizer step: loss = Σ w·L / Σ w.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"
#include "ops/train_ops.h"

namespace df {

// The train.loss spelling → its DpaceKind (off for ce / kl); throws on anything else.
DpaceKind loss_dpace_kind(const std::string& loss);

struct DrafterLossOptions {
  LmLossKind kind = LmLossKind::ce;  // kl needs DrafterBatch::target_hidden
  float gamma = 7.0f;                // offset decay w_k = exp(−(k−1)/γ)
  // Streak-aware weighting: row k of a block is multiplied by Π_{j=1..k−1} c_j, where the smoothed
  // confidence c_j = p_draft(label_j)^α (α = streak_alpha ∈ (0, 1]) of each earlier labelled offset j, taken
  // from this forward pass and detached (no gradient flows through it). α < 1 flattens the product so one
  // unsure early offset does not silence the rest of the block. Offsets without a label contribute 1.
  // The multiplied weights enter both Σ w·L and Σ w.
  bool streak = false;
  float streak_alpha = 0.5f;
  // D-PACE row weights instead of the offset decay (the CE itself is unchanged): Σ w·CE over the step is then
  // divided by the number of sequences (LossStats::weight_sum counts sequences, not weights).
  DpaceKind dpace = DpaceKind::off;
  float dpace_alpha = 0.5f;
  // Gaussian noise on the context features (the concatenated taps) before fc; std as scheduled by
  // noise_std_at (train/optimizer.h), seed fresh per micro-batch from the training RNG.
  float noise_std = 0.0f;
  uint64_t noise_seed = 0;
  // Skip the backward (evaluation). Gradients are then left untouched.
  bool backward = true;
  // Gradient checks and replays: use these per-row weights (one per block row, nb·B) instead of computing
  // them, so a finite difference sees the same constants the analytic gradient treats as detached.
  const std::vector<float>* fixed_row_weights = nullptr;
};

struct LossStats {
  double loss_sum = 0;    // Σ w·L (CE or KL)
  double weight_sum = 0;  // Σ w (D-PACE: the sequences, DrafterLossOptions::dpace)
  std::vector<int64_t> correct;  // [B−1]: rows at offset k = index+1 whose argmax equals the label
  std::vector<int64_t> count;    // [B−1]: labelled rows at offset k
  double tau_sum = 0;            // Σ over blocks with a labelled row of (1 + leading correct offsets)
  int64_t tau_blocks = 0;
  std::vector<float> row_weight;    // drafter_forward_backward: the final weight of every block row (nb·B)
  std::vector<int32_t> row_argmax;  // drafter_forward_backward: the argmax of every block row (−1 unlabelled)

  void merge(const LossStats& o);  // adds another micro-batch (row_weight, row_argmax are not merged)
  double mean_loss() const { return weight_sum > 0 ? loss_sum / weight_sum : 0.0; }
  double tau() const { return tau_blocks > 0 ? tau_sum / double(tau_blocks) : 0.0; }
};

// The statistics block TrainOps::loss_row_stats adds into (f64 slots, read by the host once per optimizer
// step): the fixed sums, then correct[B−1], then count[B−1].
struct LossStatsSlots {
  static constexpr int kLossSum = 0, kWeightSum = 1, kTauSum = 2, kTauBlocks = 3, kFixed = 4;
  static int size(int block) { return kFixed + 2 * (block - 1); }
  static int correct(int k) { return kFixed + k - 1; }  // offset k = 1..B−1
  static int count(int block, int k) { return kFixed + block - 1 + k - 1; }
};
// The LossStats those slots hold (row_weight left empty).
LossStats loss_stats_from_slots(const std::vector<double>& slots, int block);

// correct[k] / count[k] per block offset (0 where an offset has no labelled row).
std::vector<double> loss_accuracy(const LossStats& st);

// exp(−(k−1)/γ) for block offset k ≥ 1.
float loss_offset_weight(int k, float gamma);

// Multiplies w (nb·B rows, block-major) by the streak factor described at DrafterLossOptions::streak.
// labelled[r] says whether row r has a label; p_label[r] is p_draft(label) from the forward pass.
void loss_apply_streak(std::vector<float>& w, const std::vector<uint8_t>& labelled, const std::vector<float>& p_label,
                       int block, float alpha);

// The options a run config's [train] section sets (loss kind, γ, streak, D-PACE); noise, backward and fixed
// weights are the caller's.
DrafterLossOptions loss_options_from_config(const TrainSection& t);

// D-PACE weights of nb blocks (block-major rows; offset 0 of each block gets 0): with m_k = labelled,
// p_k = p_label (detached), s_k = (1 − α)·p_k + α where m_k = 1 and 1 elsewhere, prefix_k = Π_{j=1..k} s_j and
// suffix_k = Σ_{j=k..B−1} prefix_j·m_j, row k gets m_k times suffix_k, prefix_k or suffix_k / prefix_k (kind).
std::vector<float> loss_dpace_weights(const std::vector<uint8_t>& labelled, const std::vector<float>& p_label,
                                      int block, float alpha, DpaceKind kind);

// Adds accuracy counts and τ for nb blocks. labelled/argmax/labels per block row.
void loss_count_accuracy(LossStats& st, const std::vector<uint8_t>& labelled, const std::vector<int32_t>& argmax,
                         const std::vector<int32_t>& labels, int block);

}  // namespace df
