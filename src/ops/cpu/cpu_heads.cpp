#include "ops/cpu/cpu_heads.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/train/loss_slots.h"

namespace df {

void cpu_expect(const Tensor& t, DType dt, int64_t rows, int64_t cols, const char* op, const char* what) {
  DF_CHECK(t.device == Device::cpu && t.dtype == dt && t.rows == rows && t.cols == cols && t.contiguous(),
           "%s: %s must be contiguous host %s [%lld, %lld], got %s %s", op, what, dtype_name(dt),
           (long long)rows, (long long)cols, dtype_name(t.dtype), t.shape_str().c_str());
}

void cpu_expect_head_loss(const Tensor& y, const Tensor& lm_head, const Tensor& labels, const Tensor& row_w,
                          const Tensor& argmax, const Tensor& stats, int B, int H, int V, const char* op) {
  const int64_t N = y.rows;
  DF_CHECK(B >= 2 && N % B == 0, "%s: %lld rows are not whole blocks of %d", op, (long long)N, B);
  cpu_expect(y, DType::f32, N, H, op, "y");
  cpu_expect(lm_head, DType::f32, V, H, op, "lm_head");
  cpu_expect(labels, DType::i32, 1, N, op, "labels");
  cpu_expect(row_w, DType::f32, 1, N, op, "row_w");
  cpu_expect(argmax, DType::i32, 1, N, op, "argmax");
  cpu_expect(stats, DType::u8, 1, int64_t(LossStatsSlots::size(B)) * int64_t(sizeof(double)), op,
             "stats (f64 slots as bytes)");
}

HeadLossStats::HeadLossStats(int64_t rows, int block, int shift)
    : block_(block),
      shift_(shift),
      labelled_(size_t(rows), 0),
      argmax_(size_t(rows), -1),
      labels_(size_t(rows), 0) {}

bool HeadLossStats::open_block(int64_t r0, const int32_t* labels, const float* row_w, int32_t* argmax,
                               std::vector<int32_t>& block_labels, std::vector<double>& block_weights) const {
  bool any = false;
  block_labels.resize(size_t(block_));
  block_weights.resize(size_t(block_));
  for (int k = 0; k < block_; ++k) {
    block_labels[size_t(k)] = labels[r0 + k];
    block_weights[size_t(k)] = double(row_w[r0 + k]);
    any |= row_w[r0 + k] != 0.0f;
    argmax[r0 + k] = -1;
  }
  return any;
}

void HeadLossStats::add_block(int64_t r0, double loss, const float* logits, int vocab, const float* row_w,
                              const int32_t* labels, int32_t* argmax) {
  st_.loss_sum += loss;
  for (int k = 0; k < block_; ++k) {
    if (row_w[r0 + k] == 0.0f) continue;
    st_.weight_sum += double(row_w[r0 + k]);
    const float* lg = logits + size_t(k) * size_t(vocab);
    argmax[r0 + k] = int32_t(std::max_element(lg, lg + vocab) - lg);
    if (k + shift_ >= block_) continue;
    const size_t o = size_t(r0 + k + shift_);
    labelled_[o] = 1;
    argmax_[o] = argmax[r0 + k];
    labels_[o] = labels[r0 + k];
  }
}

void HeadLossStats::add_to(const Tensor& stats) {
  loss_count_accuracy(st_, labelled_, argmax_, labels_, block_);
  loss_stats_add_to_slots(st_, block_, reinterpret_cast<double*>(stats.data));
}

}  // namespace df
