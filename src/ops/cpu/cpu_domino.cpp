// CpuTrainOps' Domino ops (train_ops.h "Domino's head"): ops/domino_head.h's block functions run one block
// after another on the host tensors, so the CPU drafter's Domino step is the oracle's own arithmetic.
#include <vector>

#include "kernels/train/loss_slots.h"
#include "ops/cpu/cpu_train_ops.h"

namespace df {

namespace {

void expect_head(const TrainOps::DominoHeadWeights& w, const DominoHeadDims& d, const char* op,
                 const char* what) {
  const int H = d.hidden, G = d.gru_hidden, E = d.emb_dim;
  expect_host_tensor(w.gru_ih, DType::f32, 3 * G, H, op, what);
  expect_host_tensor(w.gru_hh, DType::f32, 3 * G, G, op, what);
  expect_host_tensor(w.proj_in, DType::f32, E, H + G, op, what);
  expect_host_tensor(w.proj_out, DType::f32, d.vocab, E, op, what);
}

template <class T>
DominoHeadTensors<T> head_ptrs(const TrainOps::DominoHeadWeights& w) {
  return {w.gru_ih.ptr<float>(), w.gru_hh.ptr<float>(), w.proj_in.ptr<float>(), w.proj_out.ptr<float>()};
}

}  // namespace

void CpuTrainOps::domino_head_loss(const Tensor& y, const Tensor& lm_head, const Tensor& gru_in,
                                   const DominoHeadWeights& w, const Tensor& labels, const Tensor& row_w,
                                   const DominoHeadArgs& a, const Tensor& argmax, const Tensor& dy,
                                   const DominoHeadWeights& dw, const Tensor& stats) {
  const char* op = "domino_head_loss";
  const DominoHeadDims& d = a.dims;
  const int B = d.block_size, H = d.hidden, V = d.vocab;
  const int64_t N = y.rows;
  DF_CHECK(B >= 2 && N % B == 0, "%s: %lld rows are not whole blocks of %d", op, (long long)N, B);
  expect_host_tensor(y, DType::f32, N, H, op, "y");
  expect_host_tensor(gru_in, DType::f32, N, H, op, "gru_in");
  expect_host_tensor(lm_head, DType::f32, V, H, op, "lm_head");
  expect_host_tensor(labels, DType::i32, 1, N, op, "labels");
  expect_host_tensor(row_w, DType::f32, 1, N, op, "row_w");
  expect_host_tensor(argmax, DType::i32, 1, N, op, "argmax");
  expect_host_tensor(stats, DType::u8, 1, int64_t(LossStatsSlots::size(B)) * int64_t(sizeof(double)), op,
                     "stats (f64 slots as bytes)");
  expect_head(w, d, op, "a head weight");
  const DominoHeadTensors<const float> wt = head_ptrs<const float>(w);
  DominoHeadTensors<float> gt;
  if (a.backward) {
    expect_host_tensor(dy, DType::f32, N, H, op, "dy");
    expect_head(dw, d, op, "a head gradient");
    gt = head_ptrs<float>(dw);
    fill(dy, 0.0f);  // domino_block_step adds ∂/∂z
    if (a.beta_dw == 0.0f)
      for (const Tensor* g : {&dw.gru_ih, &dw.gru_hh, &dw.proj_in, &dw.proj_out}) fill(*g, 0.0f);
  }
  const int32_t* lab = labels.ptr<int32_t>();
  const float* wr = row_w.ptr<float>();
  int32_t* am = argmax.ptr<int32_t>();
  // The accuracy counts in block offsets (slot k predicts offset k + shift).
  HeadLossStats hs(N, B, d.shift_label ? 1 : 0);
  std::vector<float> logits(size_t(B) * size_t(V));
  DominoBlockRows rows;
  rows.labels.resize(size_t(B));
  rows.weights.resize(size_t(B));
  for (int64_t j = 0; j < N / B; ++j) {
    const int64_t r0 = j * B;
    if (!hs.open_block(r0, wr, am)) continue;
    for (int k = 0; k < B; ++k) {
      rows.labels[size_t(k)] = lab[r0 + k];
      rows.weights[size_t(k)] = double(wr[r0 + k]);
    }
    const DominoBlockLoss l = domino_block_step<float>(
        d, wt, lm_head.ptr<float>(), y.ptr<float>() + r0 * H, gru_in.ptr<float>() + r0 * H, rows, a.lambda,
        logits.data(), a.backward ? &gt : nullptr, a.backward ? dy.ptr<float>() + r0 * H : nullptr);
    hs.add_block(r0, (1.0 - a.lambda) * l.final_sum + a.lambda * l.base_sum, logits.data(), V, wr, lab, am);
  }
  hs.add_to(stats);
}

std::vector<int32_t> CpuTrainOps::domino_head_propose(const Tensor& y, const Tensor& lm_head,
                                                      const Tensor& embed, const DominoHeadWeights& w,
                                                      const DominoHeadDims& d, int32_t first) {
  const char* op = "domino_head_propose";
  expect_host_tensor(y, DType::f32, d.block_size, d.hidden, op, "y");
  expect_host_tensor(lm_head, DType::f32, d.vocab, d.hidden, op, "lm_head");
  expect_host_tensor(embed, DType::f32, d.vocab, d.hidden, op, "embed");
  expect_head(w, d, op, "a head weight");
  return domino_block_propose<float>(d, head_ptrs<const float>(w), lm_head.ptr<float>(), embed.ptr<float>(),
                                     y.ptr<float>(), first);
}

}  // namespace df
