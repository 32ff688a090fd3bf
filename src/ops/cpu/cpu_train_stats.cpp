// CpuTrainOps::loss_row_stats: the row weights and step statistics of train_ops.h, computed by the host
// reference functions of ops/loss_rows.h themselves, so the CPU drafter's numbers are those functions' numbers.
// Apart from cpu_train_ops.cpp because it is bookkeeping, not a kernel oracle.
#include <vector>

#include "ops/cpu/cpu_train_ops.h"
#include "ops/loss_rows.h"

namespace df {

namespace {

template <class T>
std::vector<T> host_row(const char* what, const Tensor& t, DType want, int64_t n) {
  DF_CHECK(t.device == Device::cpu && t.dtype == want && t.rows == 1 && t.cols == n && t.contiguous(),
           "loss_row_stats: %s must be host %s [1, %lld], got %s", what, dtype_name(want), (long long)n,
           t.shape_str().c_str());
  const T* p = t.ptr<T>();
  return std::vector<T>(p, p + n);
}

}  // namespace

void CpuTrainOps::loss_row_stats(const Tensor& labels, const Tensor& active, const Tensor& loss,
                                 const Tensor& p_label, const Tensor& argmax, const LossRowArgs& a,
                                 const Tensor& row_w, const Tensor& stats) {
  const int B = a.block;
  const int64_t N = labels.cols;
  DF_CHECK(B >= 2 && N % B == 0, "loss_row_stats: %lld rows are not whole blocks of %d (block must be ≥ 2)",
           (long long)N, B);
  const std::vector<int32_t> lab = host_row<int32_t>("labels", labels, DType::i32, N);
  const std::vector<uint8_t> act = host_row<uint8_t>("active", active, DType::u8, N);
  const std::vector<float> l = host_row<float>("loss", loss, DType::f32, N);
  const std::vector<float> p = host_row<float>("p_label", p_label, DType::f32, N);
  const std::vector<int32_t> am = host_row<int32_t>("argmax", argmax, DType::i32, N);
  std::vector<float> w = host_row<float>("row_w", row_w, DType::f32, N);
  const int slots = LossStatsSlots::size(B);
  DF_CHECK(stats.device == Device::cpu && stats.dtype == DType::u8 && stats.contiguous() &&
               stats.numel() == int64_t(slots) * int64_t(sizeof(double)),
           "loss_row_stats: stats must be host u8 [1, %d] (%d f64 slots for block %d), got %s",
           slots * int(sizeof(double)), slots, B, stats.shape_str().c_str());
  if (!a.weights_given) {
    if (a.dpace != DpaceKind::off) {
      w = loss_dpace_weights(act, p, B, a.dpace_alpha, a.dpace);
    } else {
      for (int64_t r = 0; r < N; ++r)
        w[size_t(r)] = act[size_t(r)] && r % B > 0 ? loss_offset_weight(int(r % B), a.gamma) : 0.0f;
      if (a.streak) loss_apply_streak(w, act, p, B, a.streak_alpha);
    }
    std::copy(w.begin(), w.end(), row_w.ptr<float>());
  }
  LossStats st;
  for (int64_t r = 0; r < N; ++r) {
    st.loss_sum += double(w[size_t(r)]) * l[size_t(r)];
    st.weight_sum += w[size_t(r)];
  }
  if (a.dpace != DpaceKind::off) st.weight_sum = double(a.sequences);  // D-PACE divides by the sequences
  loss_count_accuracy(st, act, am, lab, B);
  loss_stats_add_to_slots(st, B, reinterpret_cast<double*>(stats.data));
}

}  // namespace df
