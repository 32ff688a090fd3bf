// The shape check of the CPU backend's head ops: a tensor must be contiguous host memory of one dtype and
// shape, or the op throws naming itself and the argument.
#pragma once
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

}  // namespace df
