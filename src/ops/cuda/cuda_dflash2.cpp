// CudaTrainOps' DFlash2 ops (train_ops.h "DFlash2"): each checks its tensors against train_ops.h (device,
// dtype, shape; messages name the op and the tensor), sizes its workspace in the shared scratch and makes one
// launcher call (kernels/train/dflash2_conv.cu, dflash2_selector.cu). Activations and GEMM weights bf16, base
// kernels and gradients
// f32.
#include <vector>

#include "kernels/primitives/cuda_check.cuh"
#include "kernels/train_launchers.cuh"
#include "ops/cuda/cuda_train_ops.h"

namespace df {

namespace {

void expect_conv(const char* op, const Tensor& u, const Tensor& base, const Tensor& coeff, int side,
                 const Dflash2ConvDims& d) {
  DF_CHECK(side == 0 || side == 1, "%s: side %d is neither the input (0) nor the output (1) side", op, side);
  DF_CHECK(d.block_size >= 1 && d.hidden >= 1 && d.group_size >= 1 && d.hidden % d.group_size == 0 &&
               d.taps >= 1 && d.taps <= d.block_size,
           "%s: bad dims hidden %d block %d taps %d group %d", op, d.hidden, d.block_size, d.taps,
           d.group_size);
  DF_CHECK(u.rows % d.block_size == 0, "%s: %lld rows are not whole blocks of %d", op, (long long)u.rows,
           d.block_size);
  cuda_expect_as(u, DType::bf16, u.rows, d.hidden, op, "u");
  cuda_expect_as(base, DType::f32, 2 * int64_t(d.taps), d.hidden, op, "base_kernel");
  DF_CHECK(base.contiguous(), "%s: base_kernel %s must be contiguous", op, base.shape_str().c_str());
  cuda_expect_as(coeff, DType::bf16, u.rows, d.coeffs(), op, "coeff");
}

Dflash2ConvShape conv_shape(const Dflash2ConvDims& d) {
  return {d.hidden, d.block_size, d.taps, d.group_size};
}

// The selector's three matrices, contiguous, of dtype dt (bf16 weights, f32 gradients).
void expect_selector(const TrainOps::Dflash2SelectorWeights& w, const Dflash2SelectorDims& d, DType dt,
                     const char* op, const char* what) {
  const std::pair<const Tensor*, std::pair<int64_t, int64_t>> mats[] = {
      {&w.predecessor_codebook, {d.vocab, d.rank}},
      {&w.successor_codebook, {d.vocab, d.rank}},
      {&w.hidden_projection, {d.rank, d.hidden}}};
  for (const auto& [t, shape] : mats) {
    cuda_expect_as(*t, dt, shape.first, shape.second, op, what);
    DF_CHECK(t->contiguous(), "%s: %s %s must be contiguous", op, what, t->shape_str().c_str());
  }
}

Dflash2SelectorShape selector_shape(const Dflash2SelectorDims& d, int64_t nb) {
  Dflash2SelectorShape s;
  s.nb = nb;
  s.B = d.block_size;
  s.H = d.hidden;
  s.V = d.vocab;
  s.R = d.rank;
  s.K = d.top_k;
  s.mult = float(d.output_multiplier);
  s.softcap = float(d.softcap);
  return s;
}

Dflash2SelectorWeightPtrs selector_weights(const TrainOps::Dflash2SelectorWeights& w) {
  return {bptr(w.predecessor_codebook), bptr(w.successor_codebook), bptr(w.hidden_projection)};
}

}  // namespace

void CudaTrainOps::dflash2_conv_fwd(const Tensor& u, const Tensor& base, const Tensor& coeff, int side,
                                    const Tensor& resid, const Tensor& out, const Dflash2ConvDims& d) {
  const char* op = "dflash2_conv_fwd";
  expect_conv(op, u, base, coeff, side, d);
  cuda_expect_as(out, DType::bf16, u.rows, d.hidden, op, "out");
  DF_CHECK(out.data != u.data, "%s: out must not alias u", op);
  if (!resid.empty()) cuda_expect_as(resid, DType::bf16, u.rows, d.hidden, op, "resid");
  dflash2_conv_fwd_launch(conv_shape(d), side, bptr(u), u.stride, static_cast<const float*>(base.data),
                          bptr(coeff), coeff.stride, resid.empty() ? nullptr : bptr(resid),
                          resid.empty() ? 0 : resid.stride, bptr(out), out.stride, u.rows, dev_.stream);
}

void CudaTrainOps::dflash2_conv_bwd(const Tensor& u, const Tensor& base, const Tensor& coeff, int side,
                                    const Tensor& dout, const Tensor& du, const Tensor& dcoeff,
                                    const Tensor& dbase, float beta_dbase, const Dflash2ConvDims& d) {
  const char* op = "dflash2_conv_bwd";
  expect_conv(op, u, base, coeff, side, d);
  cuda_expect_as(dout, DType::bf16, u.rows, d.hidden, op, "dout");
  cuda_expect_as(du, DType::bf16, u.rows, d.hidden, op, "du");
  cuda_expect_as(dcoeff, DType::bf16, u.rows, d.coeffs(), op, "dcoeff");
  cuda_expect_as(dbase, DType::f32, 2 * int64_t(d.taps), d.hidden, op, "dbase");
  DF_CHECK(dbase.contiguous(), "%s: dbase %s must be contiguous", op, dbase.shape_str().c_str());
  const size_t ws = dflash2_conv_bwd_workspace_bytes(u.rows, d.hidden, d.taps);
  dflash2_conv_bwd_launch(conv_shape(d), side, bptr(u), u.stride, static_cast<const float*>(base.data),
                          bptr(coeff), coeff.stride, bptr(dout), dout.stride, bptr(du), du.stride,
                          bptr(dcoeff), dcoeff.stride, static_cast<float*>(dbase.data), beta_dbase, u.rows,
                          u.rows > 0 ? scratch(ws) : nullptr, ws, dev_.stream);
}

void CudaTrainOps::dflash2_selector_loss(const Tensor& y, const Tensor& lm_head,
                                         const Dflash2SelectorWeights& w, const Tensor& labels,
                                         const Tensor& prev, const Tensor& row_w,
                                         const Dflash2SelectorArgs& a, const Tensor& argmax, const Tensor& dy,
                                         const Dflash2SelectorWeights& dw, const Tensor& stats) {
  const char* op = "dflash2_selector_loss";
  const Dflash2SelectorDims& d = a.dims;
  const int B = d.block_size, H = d.hidden;
  const int64_t N = y.rows;
  cuda_expect_head_loss(y, lm_head, labels, row_w, argmax, stats, B, H, d.vocab, op);
  cuda_expect_as(prev, DType::i32, 1, N, op, "prev");
  expect_selector(w, d, DType::bf16, op, "a selector weight");
  if (a.backward) {
    cuda_expect_as(dy, DType::bf16, N, H, op, "dy");
    expect_selector(dw, d, DType::f32, op, "a selector gradient");
  }
  const Dflash2SelectorShape s = selector_shape(d, N / B);
  const size_t ws = dflash2_selector_workspace_bytes(s, loss_chunk_rows_);
  const Dflash2SelectorGradPtrs g =
      a.backward ? Dflash2SelectorGradPtrs{static_cast<float*>(dw.predecessor_codebook.data),
                                           static_cast<float*>(dw.successor_codebook.data),
                                           static_cast<float*>(dw.hidden_projection.data)}
                 : Dflash2SelectorGradPtrs{};
  dflash2_selector_loss_launch(
      dev_.gemm, s, bptr(y), y.stride, bptr(lm_head), selector_weights(w),
      static_cast<const int32_t*>(labels.data), static_cast<const int32_t*>(prev.data),
      static_cast<const float*>(row_w.data), float(a.alpha), a.stop_gradient, a.backward, a.beta_dw,
      static_cast<int32_t*>(argmax.data), a.backward ? bptr(dy) : nullptr, a.backward ? dy.stride : 0, g,
      static_cast<double*>(stats.data), loss_chunk_rows_, N > 0 ? scratch(ws) : nullptr, ws, dev_.stream);
}

std::vector<int32_t> CudaTrainOps::dflash2_selector_propose(const Tensor& y, const Tensor& lm_head,
                                                            const Dflash2SelectorWeights& w,
                                                            const Dflash2SelectorDims& d, int32_t first) {
  const char* op = "dflash2_selector_propose";
  cuda_expect_as(y, DType::bf16, d.block_size, d.hidden, op, "y");
  cuda_expect_as(lm_head, DType::bf16, d.vocab, d.hidden, op, "lm_head");
  DF_CHECK(lm_head.contiguous(), "%s: lm_head %s must be contiguous", op, lm_head.shape_str().c_str());
  expect_selector(w, d, DType::bf16, op, "a selector weight");
  const size_t ws = dflash2_propose_layout(d.block_size, d.vocab, d.rank, d.top_k).bytes;
  const int32_t* tok =
      dflash2_selector_propose_launch(dev_.gemm, selector_shape(d, 1), bptr(y), y.stride, bptr(lm_head),
                                      selector_weights(w), first, scratch(ws), ws, dev_.stream);
  return download_proposals(tok, d.block_size);
}

}  // namespace df
