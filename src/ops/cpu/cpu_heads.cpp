// What the CPU backend's drafter-head ops share (cpu_domino.cpp, cpu_dspark.cpp): the argument check and the
// statistics of a head's loss, block by block.
#include <algorithm>

#include "ops/cpu/cpu_train_ops.h"
#include "ops/loss_rows.h"

namespace df {

void expect_host_tensor(const Tensor& t, DType dt, int64_t rows, int64_t cols, const char* op,
                        const char* what) {
  DF_CHECK(t.device == Device::cpu && t.dtype == dt && t.rows == rows && t.cols == cols && t.contiguous(),
           "%s: %s must be contiguous host %s [%lld, %lld], got %s %s", op, what, dtype_name(dt),
           (long long)rows, (long long)cols, dtype_name(t.dtype), t.shape_str().c_str());
}

HeadLossStats::HeadLossStats(int64_t rows, int block, int shift)
    : block_(block),
      shift_(shift),
      labelled_(size_t(rows), 0),
      argmax_(size_t(rows), -1),
      labels_(size_t(rows), 0) {}

bool HeadLossStats::open_block(int64_t r0, const float* row_w, int32_t* argmax) const {
  bool any = false;
  for (int k = 0; k < block_; ++k) {
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
