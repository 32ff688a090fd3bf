// The loss rows of a drafter micro-batch on the host: the per-row weights (offset decay, streak-aware
// multiplier, D-PACE), the statistics a metrics line reports (Σ w·loss, Σ w, per-offset accuracy, τ) and how
// micro-batches merge. The CPU backend's loss_row_stats is made of these functions (the oracle of the CUDA
// kernel), and the drafter reads its step's statistics back through loss_stats_from_slots.
#pragma once
#include <cstdint>
#include <vector>

#include "kernels/train/loss_slots.h"
#include "ops/train_ops.h"

namespace df {

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

// The LossStats a LossStatsSlots block of this block size holds (row_weight left empty).
LossStats loss_stats_from_slots(const std::vector<double>& slots, int block);
// Adds st's sums and counts (row_weight and row_argmax aside) to a LossStatsSlots block of this block size.
void loss_stats_add_to_slots(const LossStats& st, int block, double* slots);

// correct[k] / count[k] per block offset (0 where an offset has no labelled row).
std::vector<double> loss_accuracy(const LossStats& st);

// exp(−(k−1)/γ) for block offset k ≥ 1.
float loss_offset_weight(int k, float gamma);

// Multiplies w (nb·B rows, block-major) by the streak factor described at DrafterLossOptions::streak
// (model/drafter.h).
// labelled[r] says whether row r has a label; p_label[r] is p_draft(label) from the forward pass.
void loss_apply_streak(std::vector<float>& w, const std::vector<uint8_t>& labelled, const std::vector<float>& p_label,
                       int block, float alpha);

// D-PACE weights of nb blocks (block-major rows; offset 0 of each block gets 0): with m_k = labelled,
// p_k = p_label (detached), s_k = (1 − α)·p_k + α where m_k = 1 and 1 elsewhere, prefix_k = Π_{j=1..k} s_j and
// suffix_k = Σ_{j=k..B−1} prefix_j·m_j, row k gets m_k times suffix_k, prefix_k or suffix_k / prefix_k (kind).
std::vector<float> loss_dpace_weights(const std::vector<uint8_t>& labelled, const std::vector<float>& p_label,
                                      int block, float alpha, DpaceKind kind);

// Adds accuracy counts and τ for nb blocks. labelled/argmax/labels per block row.
void loss_count_accuracy(LossStats& st, const std::vector<uint8_t>& labelled, const std::vector<int32_t>& argmax,
                         const std::vector<int32_t>& labels, int block);

}  // namespace df
