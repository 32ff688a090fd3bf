// CpuTrainOps' DFlash2 ops (train_ops.h "DFlash2"): ops/dflash2_conv.h's side convolution and
// ops/dflash2_selector.h's block functions on the host tensors, so the CPU drafter's DFlash2 step is the
// oracle's own arithmetic.
#include <algorithm>
#include <vector>

#include "ops/cpu/cpu_heads.h"
#include "ops/cpu/cpu_train_ops.h"

namespace df {

namespace {

void expect_selector(const TrainOps::Dflash2SelectorWeights& w, const Dflash2SelectorDims& d, const char* op,
                     const char* what) {
  cpu_expect(w.predecessor_codebook, DType::f32, d.vocab, d.rank, op, what);
  cpu_expect(w.successor_codebook, DType::f32, d.vocab, d.rank, op, what);
  cpu_expect(w.hidden_projection, DType::f32, d.rank, d.hidden, op, what);
}

template <class T>
Dflash2SelectorTensors<T> selector_ptrs(const TrainOps::Dflash2SelectorWeights& w) {
  return {w.predecessor_codebook.ptr<float>(), w.successor_codebook.ptr<float>(),
          w.hidden_projection.ptr<float>()};
}

void expect_conv(const Tensor& u, const Tensor& base, const Tensor& coeff, int side, const Dflash2ConvDims& d,
                 const char* op) {
  DF_CHECK(side == 0 || side == 1, "%s: side %d is neither the input (0) nor the output (1) side", op, side);
  DF_CHECK(u.rows % d.block_size == 0, "%s: %lld rows are not whole blocks of %d", op, (long long)u.rows,
           d.block_size);
  cpu_expect(u, DType::f32, u.rows, d.hidden, op, "u");
  cpu_expect(base, DType::f32, 2 * int64_t(d.taps), d.hidden, op, "base_kernel");
  cpu_expect(coeff, DType::f32, u.rows, d.coeffs(), op, "coeff");
}

}  // namespace

void CpuTrainOps::dflash2_conv_fwd(const Tensor& u, const Tensor& base, const Tensor& coeff, int side,
                                   const Tensor& resid, const Tensor& out, const Dflash2ConvDims& d) {
  const char* op = "dflash2_conv_fwd";
  expect_conv(u, base, coeff, side, d, op);
  cpu_expect(out, DType::f32, u.rows, d.hidden, op, "out");
  DF_CHECK(out.data != u.data, "%s: out must not alias u", op);
  dflash2_conv_side<float>(d, base.ptr<float>(), coeff.ptr<float>(), side, u.ptr<float>(), u.rows,
                           out.ptr<float>());
  if (resid.empty()) return;
  cpu_expect(resid, DType::f32, u.rows, d.hidden, op, "resid");
  float* o = out.ptr<float>();
  const float* r = resid.ptr<float>();
  for (int64_t i = 0; i < out.numel(); ++i) o[i] += r[i];
}

void CpuTrainOps::dflash2_conv_bwd(const Tensor& u, const Tensor& base, const Tensor& coeff, int side,
                                   const Tensor& dout, const Tensor& du, const Tensor& dcoeff,
                                   const Tensor& dbase, float beta_dbase, const Dflash2ConvDims& d) {
  const char* op = "dflash2_conv_bwd";
  expect_conv(u, base, coeff, side, d, op);
  cpu_expect(dout, DType::f32, u.rows, d.hidden, op, "dout");
  cpu_expect(du, DType::f32, u.rows, d.hidden, op, "du");
  cpu_expect(dcoeff, DType::f32, u.rows, d.coeffs(), op, "dcoeff");
  cpu_expect(dbase, DType::f32, 2 * int64_t(d.taps), d.hidden, op, "dbase");
  // The oracle adds into all three: clear what this call writes first.
  fill(du, 0.0f);
  const int64_t side_cols = int64_t(d.taps) * d.groups(), C = d.coeffs();
  float* dc = dcoeff.ptr<float>();
  for (int64_t r = 0; r < u.rows; ++r) std::fill_n(dc + r * C + side * side_cols, side_cols, 0.0f);
  float* db = dbase.ptr<float>() + int64_t(side) * d.taps * d.hidden;
  const int64_t side_base = int64_t(d.taps) * d.hidden;
  if (beta_dbase == 0.0f)
    std::fill_n(db, side_base, 0.0f);
  else if (beta_dbase != 1.0f)
    for (int64_t i = 0; i < side_base; ++i) db[i] *= beta_dbase;
  dflash2_conv_side_backward<float>(d, base.ptr<float>(), coeff.ptr<float>(), side, u.ptr<float>(), u.rows,
                                    dout.ptr<float>(), du.ptr<float>(), dc, dbase.ptr<float>());
}

void CpuTrainOps::dflash2_selector_loss(const Tensor& y, const Tensor& lm_head,
                                        const Dflash2SelectorWeights& w, const Tensor& labels,
                                        const Tensor& prev, const Tensor& row_w, const Dflash2SelectorArgs& a,
                                        const Tensor& argmax, const Tensor& dy,
                                        const Dflash2SelectorWeights& dw, const Tensor& stats) {
  const char* op = "dflash2_selector_loss";
  const Dflash2SelectorDims& d = a.dims;
  const int B = d.block_size, H = d.hidden, V = d.vocab;
  const int64_t N = y.rows;
  cpu_expect_head_loss(y, lm_head, labels, row_w, argmax, stats, B, H, V, op);
  cpu_expect(prev, DType::i32, 1, N, op, "prev");
  expect_selector(w, d, op, "a selector weight");
  for (int64_t r = 0; r < N; r += B)
    DF_CHECK(row_w.ptr<float>()[r] == 0.0f,
             "%s: row_w of block row %lld, a block's anchor slot, is %g: the anchor carries no weight "
             "(dflash2_block_rows; the CUDA backend skips these rows)",
             op, (long long)r, double(row_w.ptr<float>()[r]));
  const Dflash2SelectorTensors<const float> wt = selector_ptrs<const float>(w);
  Dflash2SelectorTensors<float> gt;
  if (a.backward) {
    cpu_expect(dy, DType::f32, N, H, op, "dy");
    expect_selector(dw, d, op, "a selector gradient");
    gt = selector_ptrs<float>(dw);
    fill(dy, 0.0f);  // dflash2_block_step adds ∂/∂z
    if (a.beta_dw == 0.0f)
      for (const Tensor* g : {&dw.predecessor_codebook, &dw.successor_codebook, &dw.hidden_projection})
        fill(*g, 0.0f);
  }
  // The accuracy counts in block offsets: slot k predicts offset k.
  cpu_head_blocks<Dflash2BlockRows>(labels, &prev, row_w, argmax, stats, B, V, 0,
                                    [&](int64_t r0, const Dflash2BlockRows& rows, float* logits) {
                                      const Dflash2BlockLoss l = dflash2_block_step<float>(
                                          d, wt, lm_head.ptr<float>(), y.ptr<float>() + r0 * H, rows, a.alpha,
                                          a.stop_gradient, logits, a.backward ? &gt : nullptr,
                                          a.backward ? dy.ptr<float>() + r0 * H : nullptr);
                                      return l.base_sum + a.alpha * l.selector_sum;
                                    });
}

std::vector<int32_t> CpuTrainOps::dflash2_selector_propose(const Tensor& y, const Tensor& lm_head,
                                                           const Dflash2SelectorWeights& w,
                                                           const Dflash2SelectorDims& d, int32_t first) {
  const char* op = "dflash2_selector_propose";
  const int B = d.block_size, H = d.hidden, V = d.vocab;
  cpu_expect(y, DType::f32, B, H, op, "y");
  cpu_expect(lm_head, DType::f32, V, H, op, "lm_head");
  expect_selector(w, d, op, "a selector weight");
  // Raw logits of the rows after the anchor; the walk takes the unary transform and the top-K itself.
  const int n = B - 1;
  std::vector<float> logits(size_t(n) * size_t(V));
  const float* z = y.ptr<float>() + H;
  const float* lm = lm_head.ptr<float>();
  for (int k = 0; k < n; ++k)
    for (int v = 0; v < V; ++v) {
      double s = 0;
      for (int h = 0; h < H; ++h) s += double(lm[int64_t(v) * H + h]) * double(z[int64_t(k) * H + h]);
      logits[size_t(k) * size_t(V) + size_t(v)] = float(s);
    }
  return dflash2_selector_greedy_path<float>(d, selector_ptrs<const float>(w), logits.data(), z, n, first);
}

}  // namespace df
