// CudaTrainOps::loss_row_stats: checks the tensors of train_ops.h's row-weight and statistics op and runs
// kernels/train/loss_stats.cu on the backend's stream. Apart from the other CudaTrainOps bodies because it is the
// drafter's bookkeeping, not a layer op.
#include "kernels/train/loss_slots.h"
#include "kernels/train_launchers.cuh"
#include "ops/cuda/cuda_train_ops.h"

namespace df {

void CudaTrainOps::loss_row_stats(const Tensor& labels, const Tensor& active, const Tensor& loss,
                                  const Tensor& p_label, const Tensor& argmax, const LossRowArgs& a,
                                  const Tensor& row_w, const Tensor& stats) {
  const int64_t N = labels.cols;
  DF_CHECK(a.block >= 2 && N % a.block == 0,
           "loss_row_stats: %lld rows are not whole blocks of %d (block ≥ 2)", (long long)N, a.block);
  DF_CHECK(a.dpace == DpaceKind::off,
           "train.loss: dpace is implemented on the CPU drafter only (no CUDA kernel for its row weights); HINT: "
           "drafter.device = \"cpu\"");
  cuda_expect_as(labels, DType::i32, 1, N, "loss_row_stats", "labels");
  cuda_expect_as(active, DType::u8, 1, N, "loss_row_stats", "active");
  cuda_expect_as(loss, DType::f32, 1, N, "loss_row_stats", "loss");
  cuda_expect_as(p_label, DType::f32, 1, N, "loss_row_stats", "p_label");
  cuda_expect_as(argmax, DType::i32, 1, N, "loss_row_stats", "argmax");
  cuda_expect_as(row_w, DType::f32, 1, N, "loss_row_stats", "row_w");
  cuda_expect_as(stats, DType::u8, 1, int64_t(LossStatsSlots::size(a.block)) * int64_t(sizeof(double)),
                 "loss_row_stats", "stats (f64 slots as bytes)");
  LossRowDims d;
  d.nb = N / a.block;
  d.block = a.block;
  d.gamma = a.gamma;
  d.streak = a.streak;
  d.streak_alpha = a.streak_alpha;
  d.weights_given = a.weights_given;
  loss_row_stats_launch(labels.ptr<int32_t>(), active.ptr<uint8_t>(), loss.ptr<float>(), p_label.ptr<float>(),
                        argmax.ptr<int32_t>(), d, row_w.ptr<float>(), static_cast<double*>(stats.data),
                        stream());
}

}  // namespace df
