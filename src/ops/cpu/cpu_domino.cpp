// CpuTrainOps' Domino ops (train_ops.h "Domino's head"): ops/domino_head.h's block functions run one block
// after another on the host tensors, so the CPU drafter's Domino step is the oracle's own arithmetic.
#include <vector>

#include "ops/cpu/cpu_heads.h"
#include "ops/cpu/cpu_train_ops.h"

namespace df {

namespace {

void expect_head(const TrainOps::DominoHeadWeights& w, const DominoHeadDims& d, const char* op,
                 const char* what) {
  const int H = d.hidden, G = d.gru_hidden, E = d.emb_dim;
  cpu_expect(w.gru_ih, DType::f32, 3 * G, H, op, what);
  cpu_expect(w.gru_hh, DType::f32, 3 * G, G, op, what);
  cpu_expect(w.proj_in, DType::f32, E, H + G, op, what);
  cpu_expect(w.proj_out, DType::f32, d.vocab, E, op, what);
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
  cpu_expect_head_loss(y, lm_head, labels, row_w, argmax, stats, B, H, V, op);
  cpu_expect(gru_in, DType::f32, N, H, op, "gru_in");
  expect_head(w, d, op, "a head weight");
  const DominoHeadTensors<const float> wt = head_ptrs<const float>(w);
  DominoHeadTensors<float> gt;
  if (a.backward) {
    cpu_expect(dy, DType::f32, N, H, op, "dy");
    expect_head(dw, d, op, "a head gradient");
    gt = head_ptrs<float>(dw);
    fill(dy, 0.0f);  // domino_block_step adds ∂/∂z
    if (a.beta_dw == 0.0f)
      for (const Tensor* g : {&dw.gru_ih, &dw.gru_hh, &dw.proj_in, &dw.proj_out}) fill(*g, 0.0f);
  }
  // The accuracy counts in block offsets (slot k predicts offset k + shift).
  cpu_head_blocks<DominoBlockRows>(
      labels, nullptr, row_w, argmax, stats, B, V, d.shift_label ? 1 : 0,
      [&](int64_t r0, const DominoBlockRows& rows, float* logits) {
        const DominoBlockLoss l = domino_block_step<float>(
            d, wt, lm_head.ptr<float>(), y.ptr<float>() + r0 * H, gru_in.ptr<float>() + r0 * H, rows,
            a.lambda, logits, a.backward ? &gt : nullptr, a.backward ? dy.ptr<float>() + r0 * H : nullptr);
        return (1.0 - a.lambda) * l.final_sum + a.lambda * l.base_sum;
      });
}

std::vector<int32_t> CpuTrainOps::domino_head_propose(const Tensor& y, const Tensor& lm_head,
                                                      const Tensor& embed, const DominoHeadWeights& w,
                                                      const DominoHeadDims& d, int32_t first) {
  const char* op = "domino_head_propose";
  cpu_expect(y, DType::f32, d.block_size, d.hidden, op, "y");
  cpu_expect(lm_head, DType::f32, d.vocab, d.hidden, op, "lm_head");
  cpu_expect(embed, DType::f32, d.vocab, d.hidden, op, "embed");
  expect_head(w, d, op, "a head weight");
  return domino_block_propose<float>(d, head_ptrs<const float>(w), lm_head.ptr<float>(), embed.ptr<float>(),
                                     y.ptr<float>(), first);
}

}  // namespace df
