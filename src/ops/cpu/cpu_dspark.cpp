// CpuTrainOps' DSpark ops (train_ops.h "DSpark's head"): ops/dspark_head.h's block functions run one block
// after another on the host tensors, so the CPU drafter's DSpark step is the oracle's own arithmetic.
#include <algorithm>
#include <vector>

#include "ops/cpu/cpu_heads.h"
#include "ops/cpu/cpu_train_ops.h"

namespace df {

namespace {

// Every part of the head that the dims have, at its shape (ops/dspark_head.h dspark_head_params), and no
// other.
void expect_head(const TrainOps::DSparkHeadWeights& w, const DSparkHeadDims& d, const char* op,
                 const char* what) {
  const int H = d.hidden, V = d.vocab, R = d.markov_rank;
  const bool markov = R > 0, gated = markov && d.markov_head_type == DrafterMarkovHead::gated,
             rnn = markov && d.markov_head_type == DrafterMarkovHead::rnn;
  auto part = [&](const Tensor& t, bool present, int64_t rows, int64_t cols, const char* name) {
    if (present) {
      cpu_expect(t, DType::f32, rows, cols, op, what);
    } else {
      DF_CHECK(t.empty(), "%s: %s %s is set, but this DSpark head has none", op, what, name);
    }
  };
  part(w.markov_w1, markov, V, R, "markov_w1");
  part(w.markov_w2, markov, V, R, "markov_w2");
  part(w.gate_w, gated, R, H + R, "gate_proj.weight");
  part(w.gate_b, gated, 1, R, "gate_proj.bias");
  part(w.joint_w, rnn, 3 * R, 2 * R + H, "joint_proj.weight");
  part(w.joint_b, rnn, 1, 3 * R, "joint_proj.bias");
  part(w.conf_w, d.confidence, 1, d.confidence_in(), "confidence_head.proj.weight");
  part(w.conf_b, d.confidence, 1, 1, "confidence_head.proj.bias");
}

template <class T>
T* ptr_or_null(const Tensor& t) {
  return t.empty() ? nullptr : t.ptr<float>();
}

template <class T>
DSparkHeadTensors<T> head_ptrs(const TrainOps::DSparkHeadWeights& w) {
  return {ptr_or_null<T>(w.markov_w1), ptr_or_null<T>(w.markov_w2), ptr_or_null<T>(w.gate_w),
          ptr_or_null<T>(w.gate_b),    ptr_or_null<T>(w.joint_w),   ptr_or_null<T>(w.joint_b),
          ptr_or_null<T>(w.conf_w),    ptr_or_null<T>(w.conf_b)};
}

}  // namespace

void CpuTrainOps::dspark_head_loss(const Tensor& y, const Tensor& lm_head, const Tensor& target_hidden,
                                   const DSparkHeadWeights& w, const Tensor& labels, const Tensor& prev,
                                   const Tensor& row_w, const DSparkHeadArgs& a, const Tensor& argmax,
                                   const Tensor& dy, const DSparkHeadWeights& dw, const Tensor& stats) {
  const char* op = "dspark_head_loss";
  const DSparkHeadDims& d = a.dims;
  const int B = d.block_size, H = d.hidden, V = d.vocab;
  const int64_t N = y.rows;
  cpu_expect_head_loss(y, lm_head, labels, row_w, argmax, stats, B, H, V, op);
  cpu_expect(prev, DType::i32, 1, N, op, "prev");
  const bool need_target = dspark_needs_target_hidden(d, a.alpha);
  if (need_target) {
    cpu_expect(target_hidden, DType::f32, target_hidden.rows, H, op, "target_hidden");
    DF_CHECK(int64_t(a.target_rows.size()) == N, "%s: %zu target_rows for %lld rows", op,
             a.target_rows.size(), (long long)N);
    for (size_t r = 0; r < a.target_rows.size(); ++r)
      DF_CHECK(a.target_rows[r] >= 0 && a.target_rows[r] < target_hidden.rows,
               "%s: target_rows[%zu] = %d is not a row of target_hidden (%lld rows)", op, r, a.target_rows[r],
               (long long)target_hidden.rows);
  }
  expect_head(w, d, op, "a head weight");
  const DSparkHeadTensors<const float> wt = head_ptrs<const float>(w);
  DSparkHeadTensors<float> gt;
  if (a.backward) {
    cpu_expect(dy, DType::f32, N, H, op, "dy");
    expect_head(dw, d, op, "a head gradient");
    gt = head_ptrs<float>(dw);
    fill(dy, 0.0f);  // dspark_block_step adds ∂/∂z
    if (a.beta_dw == 0.0f)
      for (const Tensor* g : {&dw.markov_w1, &dw.markov_w2, &dw.gate_w, &dw.gate_b, &dw.joint_w, &dw.joint_b,
                              &dw.conf_w, &dw.conf_b})
        if (!g->empty()) fill(*g, 0.0f);
  }
  // The accuracy counts in block offsets: slot k predicts offset k + 1. A block's target rows are gathered
  // into th.
  std::vector<float> th(need_target ? size_t(B) * size_t(H) : 0);
  cpu_head_blocks<DSparkBlockRows>(
      labels, &prev, row_w, argmax, stats, B, V, 1,
      [&](int64_t r0, const DSparkBlockRows& rows, float* logits) {
        for (int k = 0; need_target && k < B; ++k)
          std::copy_n(target_hidden.ptr<float>() + int64_t(a.target_rows[size_t(r0 + k)]) * H, H,
                      th.begin() + int64_t(k) * H);
        const DSparkBlockLoss l = dspark_block_step<float>(
            d, wt, lm_head.ptr<float>(), y.ptr<float>() + r0 * H, need_target ? th.data() : nullptr, rows,
            a.alpha, logits, nullptr, a.backward ? &gt : nullptr,
            a.backward ? dy.ptr<float>() + r0 * H : nullptr);
        return a.alpha.ce * l.ce_sum + a.alpha.l1 * l.l1_sum + a.alpha.confidence * l.confidence_sum;
      });
}

std::vector<int32_t> CpuTrainOps::dspark_head_propose(const Tensor& y, const Tensor& lm_head,
                                                      const DSparkHeadWeights& w, const DSparkHeadDims& d,
                                                      int32_t first, std::vector<double>* confidence) {
  const char* op = "dspark_head_propose";
  cpu_expect(y, DType::f32, d.block_size, d.hidden, op, "y");
  cpu_expect(lm_head, DType::f32, d.vocab, d.hidden, op, "lm_head");
  expect_head(w, d, op, "a head weight");
  return dspark_block_propose<float>(d, head_ptrs<const float>(w), lm_head.ptr<float>(), y.ptr<float>(),
                                     first, confidence);
}

}  // namespace df
