// What the CPU backend's head-loss ops (cpu_domino.cpp, cpu_dflash2.cpp) share: the checks that a tensor is
// contiguous host memory of one dtype and shape (else the op throws naming itself and the argument), and the
// gathering of one block's rows.
#pragma once
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/train/loss_slots.h"

namespace df {

inline void cpu_expect(const Tensor& t, DType dt, int64_t rows, int64_t cols, const char* op,
                       const char* what) {
  DF_CHECK(t.device == Device::cpu && t.dtype == dt && t.rows == rows && t.cols == cols && t.contiguous(),
           "%s: %s must be contiguous host %s [%lld, %lld], got %s %s", op, what, dtype_name(dt),
           (long long)rows, (long long)cols, dtype_name(t.dtype), t.shape_str().c_str());
}

// The arguments every head-loss op shares (domino_head_loss, dflash2_selector_loss): y [N, H] of whole
// blocks of B rows, lm_head [V, H], labels, row_w, argmax [1, N] and the statistics slots.
inline void cpu_expect_head_loss(const Tensor& y, const Tensor& lm_head, const Tensor& labels,
                                 const Tensor& row_w, const Tensor& argmax, const Tensor& stats, int B, int H,
                                 int V, const char* op) {
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

// Block j of a head-loss op's rows: its labels and weights (rows r0 = j·B ...) into `labels` and `weights` (B
// each), its argmax rows reset to −1. Returns whether any row carries weight (else the block has no loss and
// no gradient).
inline bool cpu_head_block_rows(const int32_t* lab, const float* row_w, int64_t r0, int B,
                                std::vector<int32_t>& labels, std::vector<double>& weights, int32_t* argmax) {
  bool any = false;
  labels.resize(size_t(B));
  weights.resize(size_t(B));
  for (int k = 0; k < B; ++k) {
    labels[size_t(k)] = lab[r0 + k];
    weights[size_t(k)] = double(row_w[r0 + k]);
    any |= row_w[r0 + k] != 0.0f;
    argmax[r0 + k] = -1;
  }
  return any;
}

}  // namespace df
