// The host's loss rows (ops/loss_rows.h): weights that depend on the forward pass (streak, D-PACE) and the
// accuracy/τ counters.
#include "ops/loss_rows.h"

#include <cmath>

#include "core/error.h"

namespace df {

void LossStats::merge(const LossStats& o) {
  loss_sum += o.loss_sum;
  weight_sum += o.weight_sum;
  if (correct.size() < o.correct.size()) {
    correct.resize(o.correct.size(), 0);
    count.resize(o.count.size(), 0);
  }
  for (size_t i = 0; i < o.correct.size(); ++i) {
    correct[i] += o.correct[i];
    count[i] += o.count[i];
  }
  tau_sum += o.tau_sum;
  tau_blocks += o.tau_blocks;
}

LossStats loss_stats_from_slots(const std::vector<double>& slots, int block) {
  DF_CHECK(int(slots.size()) == LossStatsSlots::size(block),
           "loss statistics: %zu slots for block %d, expected %d", slots.size(), block,
           LossStatsSlots::size(block));
  LossStats st;
  st.loss_sum = slots[LossStatsSlots::kLossSum];
  st.weight_sum = slots[LossStatsSlots::kWeightSum];
  st.tau_sum = slots[LossStatsSlots::kTauSum];
  st.tau_blocks = int64_t(slots[LossStatsSlots::kTauBlocks]);
  for (int k = 1; k < block; ++k) {
    st.correct.push_back(int64_t(slots[size_t(LossStatsSlots::correct(k))]));
    st.count.push_back(int64_t(slots[size_t(LossStatsSlots::count(block, k))]));
  }
  return st;
}

void loss_stats_add_to_slots(const LossStats& st, int block, double* slots) {
  slots[LossStatsSlots::kLossSum] += st.loss_sum;
  slots[LossStatsSlots::kWeightSum] += st.weight_sum;
  slots[LossStatsSlots::kTauSum] += st.tau_sum;
  slots[LossStatsSlots::kTauBlocks] += double(st.tau_blocks);
  for (int k = 1; k < block && size_t(k - 1) < st.correct.size(); ++k) {
    slots[LossStatsSlots::correct(k)] += double(st.correct[size_t(k - 1)]);
    slots[LossStatsSlots::count(block, k)] += double(st.count[size_t(k - 1)]);
  }
}

std::vector<double> loss_accuracy(const LossStats& st) {
  std::vector<double> acc;
  for (size_t k = 0; k < st.correct.size(); ++k)
    acc.push_back(st.count[k] > 0 ? double(st.correct[k]) / double(st.count[k]) : 0.0);
  return acc;
}

float loss_offset_weight(int k, float gamma) {
  DF_CHECK(k >= 1 && gamma > 0, "loss_offset_weight: offset %d must be ≥ 1 and gamma %g > 0", k, double(gamma));
  return float(std::exp(-double(k - 1) / double(gamma)));
}

void loss_apply_streak(std::vector<float>& w, const std::vector<uint8_t>& labelled, const std::vector<float>& p_label,
                       int block, float alpha) {
  DF_CHECK(alpha > 0 && alpha <= 1, "streak_alpha %g must be in (0, 1]", double(alpha));
  DF_CHECK(w.size() == labelled.size() && w.size() == p_label.size() && w.size() % size_t(block) == 0,
           "loss_apply_streak: %zu weights, %zu labels, %zu confidences for block %d", w.size(), labelled.size(),
           p_label.size(), block);
  for (size_t j0 = 0; j0 < w.size(); j0 += size_t(block)) {
    double prefix = 1.0;
    for (int k = 1; k < block; ++k) {
      const size_t r = j0 + size_t(k);
      w[r] = float(w[r] * prefix);
      if (labelled[r]) prefix *= std::pow(double(p_label[r]), double(alpha));
    }
  }
}

std::vector<float> loss_dpace_weights(const std::vector<uint8_t>& labelled, const std::vector<float>& p_label,
                                      int block, float alpha, DpaceKind kind) {
  DF_CHECK(kind != DpaceKind::off, "loss_dpace_weights: no D-PACE kind given");
  DF_CHECK(alpha >= 0 && alpha <= 1, "dpace_alpha %g must be in [0, 1]", double(alpha));
  DF_CHECK(labelled.size() == p_label.size() && labelled.size() % size_t(block) == 0,
           "loss_dpace_weights: %zu labels and %zu confidences for block %d", labelled.size(), p_label.size(),
           block);
  std::vector<float> w(labelled.size(), 0.0f);
  std::vector<double> s(static_cast<size_t>(block) + 1, 1.0), prefix(static_cast<size_t>(block), 1.0);
  for (size_t j0 = 0; j0 < w.size(); j0 += size_t(block)) {
    for (int k = 1; k < block; ++k) {
      const size_t r = j0 + size_t(k);
      s[size_t(k)] = labelled[r] ? (1.0 - alpha) * double(p_label[r]) + alpha : 1.0;
      prefix[size_t(k)] = prefix[size_t(k) - 1] * s[size_t(k)];
    }
    // suffix_k and the continuation value c_k = suffix_k / prefix_k = m_k + s_{k+1}·c_{k+1}, built from the
    // end; the recursion needs no division, so c_k stays exact where prefix_k underflows (α near 0).
    double suffix = 0.0, cont = 0.0;
    for (int k = block - 1; k >= 1; --k) {
      const size_t r = j0 + size_t(k);
      const double m = labelled[r] ? 1.0 : 0.0;
      suffix += prefix[size_t(k)] * m;
      cont = m + s[size_t(k) + 1] * cont;
      const double wk = kind == DpaceKind::full                         ? suffix
                        : kind == DpaceKind::cumulative_confidence_only ? prefix[size_t(k)]
                                                                        : cont;
      w[r] = float(m * wk);
    }
  }
  return w;
}

void loss_count_accuracy(LossStats& st, const std::vector<uint8_t>& labelled, const std::vector<int32_t>& argmax,
                         const std::vector<int32_t>& labels, int block) {
  if (st.correct.size() < size_t(block - 1)) {
    st.correct.resize(size_t(block - 1), 0);
    st.count.resize(size_t(block - 1), 0);
  }
  for (size_t j0 = 0; j0 < labelled.size(); j0 += size_t(block)) {
    bool any = false, streak = true;
    int lead = 0;
    for (int k = 1; k < block; ++k) {
      const size_t r = j0 + size_t(k);
      const bool ok = labelled[r] && argmax[r] == labels[r];
      if (labelled[r]) {
        any = true;
        st.count[size_t(k - 1)] += 1;
        st.correct[size_t(k - 1)] += ok;
      }
      if (streak && ok)
        ++lead;
      else
        streak = false;
    }
    if (any) {
      st.tau_sum += 1.0 + lead;
      st.tau_blocks += 1;
    }
  }
}

}  // namespace df
