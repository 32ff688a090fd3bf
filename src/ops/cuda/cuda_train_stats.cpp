// CudaTrainOps::loss_row_stats: checks the tensors of train_ops.h's row-weight and statistics op and runs
// kernels/loss_stats.cu on the backend's stream. Apart from the other CudaTrainOps bodies because it is the
// drafter's bookkeeping, not a layer op.
#include "kernels/train_launchers.cuh"
#include "ops/cuda/cuda_train_ops.h"
#include "train/loss.h"

namespace df {

namespace {

void expect_row(const Tensor& t, DType dt, int64_t n, const char* what) {
  DF_CHECK(t.device == Device::cuda && t.dtype == dt && t.rows == 1 && t.cols == n && t.contiguous(),
           "loss_row_stats: %s must be device %s [1, %lld], got %s %s", what, dtype_name(dt), (long long)n,
           dtype_name(t.dtype), t.shape_str().c_str());
}

}  // namespace

void CudaTrainOps::loss_row_stats(const Tensor& labels, const Tensor& active, const Tensor& loss,
                                  const Tensor& p_label, const Tensor& argmax, const LossRowArgs& a,
                                  const Tensor& row_w, const Tensor& stats) {
  const int64_t N = labels.cols;
  DF_CHECK(a.block >= 2 && N % a.block == 0,
           "loss_row_stats: %lld rows are not whole blocks of %d (block ≥ 2)", (long long)N, a.block);
  DF_CHECK(a.dpace == DpaceKind::off,
           "train.loss: dpace is implemented on the CPU drafter only (no CUDA kernel for its row weights); HINT: "
           "drafter.device = \"cpu\"");
  expect_row(labels, DType::i32, N, "labels");
  expect_row(active, DType::u8, N, "active");
  expect_row(loss, DType::f32, N, "loss");
  expect_row(p_label, DType::f32, N, "p_label");
  expect_row(argmax, DType::i32, N, "argmax");
  expect_row(row_w, DType::f32, N, "row_w");
  expect_row(stats, DType::u8, int64_t(LossStatsSlots::size(a.block)) * int64_t(sizeof(double)),
             "stats (f64 slots as bytes)");
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
