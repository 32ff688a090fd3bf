// CudaTrainOps: checks each training op's tensors against train_ops.h (device, dtype, shape; messages name
// the op and the tensor), sizes the op's workspace in the shared scratch buffer, and makes one launcher call.
#include "ops/cuda/cuda_train_ops.h"

#include <algorithm>
#include <cmath>

#include "kernels/launchers.cuh"
#include "kernels/primitives/cuda_check.cuh"
#include "kernels/train/dspark_head.cuh"
#include "kernels/train/loss_slots.h"
#include "kernels/train_launchers.cuh"
#include "ops/dspark_shape.h"

namespace df {

namespace {

// cuda_expect and cuda_expect_shape in one: most checks below are "this dtype, that shape".
// What the QK norm forward and backward share: x bf16 [rows, heads·hd], w f32 [1, hd], pos i32 [1, rows],
// rstd f32 [rows, heads].
void expect_qk(const char* op, const Tensor& x, const Tensor& w, const Tensor& pos, const Tensor& rstd,
               int heads, int hd) {
  DF_CHECK(heads > 0 && hd > 0 && hd % 2 == 0 && hd <= 512,
           "%s: need heads > 0 and an even hd <= 512, got %d, %d", op, heads, hd);
  cuda_expect_as(x, DType::bf16, x.rows, int64_t(heads) * hd, op, "x");
  cuda_expect_as(w, DType::f32, 1, hd, op, "w");
  cuda_expect_as(pos, DType::i32, 1, x.rows, op, "pos");
  cuda_expect_as(rstd, DType::f32, x.rows, heads, op, "rstd");
}

// A flat optimizer buffer: contiguous CUDA memory of dtype dt with n elements.
void expect_flat(const Tensor& t, DType dt, int64_t n, const char* op, const char* what) {
  cuda_expect(t, dt, op, what);
  DF_CHECK(t.contiguous() && t.numel() == n, "%s: %s %s must be a contiguous flat buffer of %lld elements",
           op, what, t.shape_str().c_str(), (long long)n);
}

// The tensors both DFlash attention passes take: q [nb·B, hq·hd], k/v [T + nb·B, hkv·hd], out like q (bf16),
// lse f32 [nb·B, hq], blocks contiguous i32 [nb, 2].
void expect_attn(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& blocks,
                 const Tensor& out, const Tensor& lse, const DFlashAttnShape& s) {
  DF_CHECK(s.hq > 0 && s.hkv > 0 && s.hq % s.hkv == 0 && s.hd > 0 && s.block > 0,
           "%s: bad head shape hq %d hkv %d hd %d block %d", op, s.hq, s.hkv, s.hd, s.block);
  DF_CHECK(s.window == 0 || s.window >= s.block, "%s: sliding window %d smaller than the block %d", op,
           s.window, s.block);
  cuda_expect(blocks, DType::i32, op, "blocks");
  DF_CHECK(blocks.cols == 2 && blocks.contiguous(), "%s: blocks %s must be contiguous i32 [nb, 2]", op,
           blocks.shape_str().c_str());
  const int64_t nb = blocks.rows;
  DF_CHECK(k.rows >= nb * s.block, "%s: k has %lld rows, fewer than the %lld block rows", op,
           (long long)k.rows, (long long)(nb * s.block));
  cuda_expect_as(q, DType::bf16, nb * s.block, int64_t(s.hq) * s.hd, op, "q");
  cuda_expect_as(k, DType::bf16, k.rows, int64_t(s.hkv) * s.hd, op, "k");
  cuda_expect_as(v, DType::bf16, k.rows, int64_t(s.hkv) * s.hd, op, "v");
  cuda_expect_as(out, DType::bf16, q.rows, q.cols, op, "out");
  cuda_expect_as(lse, DType::f32, q.rows, s.hq, op, "lse");
}

DFlashAttnDims attn_dims(const Tensor& k, const Tensor& blocks, const DFlashAttnShape& s) {
  const int64_t nb = blocks.rows;
  return DFlashAttnDims{k.rows - nb * s.block, nb, s.hq, s.hkv, s.hd, s.block, s.window, s.scale};
}

}  // namespace

CudaTrainOps::CudaTrainOps(int device, int64_t loss_chunk_rows)
    : dev_(device), loss_chunk_rows_(loss_chunk_rows) {
  DF_CHECK(loss_chunk_rows > 0, "CudaTrainOps: loss_chunk_rows must be positive, got %lld",
           (long long)loss_chunk_rows);
}

CudaTrainOps::~CudaTrainOps() {
  if (scratch_) cudaFree(scratch_);
}

void* CudaTrainOps::scratch(size_t bytes) {
  if (bytes <= scratch_bytes_) return scratch_;
  // Kernels queued earlier may still read the old buffer.
  DF_CUDA_CHECK(cudaStreamSynchronize(dev_.stream));
  tracked_free(scratch_);
  scratch_ = nullptr;
  scratch_bytes_ = 0;
  scratch_ = tracked_alloc(bytes);
  scratch_bytes_ = bytes;
  return scratch_;
}

// ---- memory ---------------------------------------------------------------------------------------------

void* CudaTrainOps::tracked_alloc(size_t bytes) {
  void* p = dev_.alloc(bytes);
  sizes_[p] = bytes;
  live_bytes_ += bytes;
  peak_bytes_ = std::max(peak_bytes_, live_bytes_);
  return p;
}

void CudaTrainOps::tracked_free(void* p) {
  if (!p) return;
  auto it = sizes_.find(p);
  DF_CHECK(it != sizes_.end(), "CudaTrainOps: free of %p, which this backend did not allocate", p);
  live_bytes_ -= it->second;
  sizes_.erase(it);
  dev_.free(p);
}

void* CudaTrainOps::alloc_bytes(size_t bytes) {
  void* p = tracked_alloc(bytes);
  // Synchronised: the memory may next be touched from another stream (NCCL) or the host.
  DF_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, dev_.stream));
  DF_CUDA_CHECK(cudaStreamSynchronize(dev_.stream));
  return p;
}

void CudaTrainOps::free_bytes(void* p) {
  // The stream may still use p: cudaFree alone does not wait for a non-blocking stream's work.
  if (p) DF_CUDA_CHECK(cudaStreamSynchronize(dev_.stream));
  tracked_free(p);
}

void CudaTrainOps::upload_raw(const Tensor& dst, const void* host) {
  dev_.upload_raw(dst, host);
}

void CudaTrainOps::download_raw(const Tensor& src, void* host) {
  dev_.download_raw(src, host);
}

void CudaTrainOps::copy(const Tensor& src, const Tensor& dst) {
  dev_.copy(src, dst);
}

void CudaTrainOps::fill(const Tensor& dst, float value) {
  cuda_expect_float(dst, "fill", "dst");
  fill_launch(dst.data, dst.dtype == DType::f32, dst.stride, dst.rows, dst.cols, value, dev_.stream);
}

// ---- dense ----------------------------------------------------------------------------------------------

void CudaTrainOps::gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                        float alpha, float beta) {
  cuda_gemm(dev_, a, trans_a, b, trans_b, c, c, alpha, beta);
}

void CudaTrainOps::gemm_add(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c_in,
                            const Tensor& out, float alpha, float beta) {
  cuda_gemm(dev_, a, trans_a, b, trans_b, c_in, out, alpha, beta);
}

void CudaTrainOps::embedding(const Tensor& ids, const Tensor& table, const Tensor& out) {
  cuda_embedding(dev_, ids, table, out);
}

void CudaTrainOps::scale_rows(const Tensor& x, const Tensor& s) {
  cuda_expect(x, DType::bf16, "scale_rows", "x");
  cuda_expect_as(s, DType::f32, 1, x.rows, "scale_rows", "s");
  scale_rows_launch(bptr(x), x.stride, fptr(s), x.rows, x.cols, dev_.stream);
}

void CudaTrainOps::add_gaussian_noise(const Tensor& x, float std, uint64_t seed) {
  cuda_expect(x, DType::bf16, "add_gaussian_noise", "x");
  add_gaussian_noise_launch(bptr(x), x.stride, x.rows, x.cols, std, seed, dev_.stream);
}

// ---- normalisation and RoPE -----------------------------------------------------------------------------

void CudaTrainOps::rmsnorm_fwd(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd,
                               float eps) {
  const char* op = "rmsnorm_fwd";
  cuda_expect(x, DType::bf16, op, "x");
  cuda_expect_as(w, DType::f32, 1, x.cols, op, "w");
  cuda_expect_as(y, DType::bf16, x.rows, x.cols, op, "y");
  cuda_expect_as(rstd, DType::f32, 1, x.rows, op, "rstd");
  rmsnorm_fwd_launch(bptr(x), x.stride, fptr(w), bptr(y), y.stride, fptr(rstd), x.rows, x.cols, eps,
                     dev_.stream);
}

void CudaTrainOps::rmsnorm_bwd(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                               const Tensor& dx, const Tensor& dw, float beta_dx, float beta_dw) {
  const char* op = "rmsnorm_bwd";
  cuda_expect(x, DType::bf16, op, "x");
  cuda_expect_as(w, DType::f32, 1, x.cols, op, "w");
  cuda_expect_as(rstd, DType::f32, 1, x.rows, op, "rstd");
  cuda_expect_as(dy, DType::bf16, x.rows, x.cols, op, "dy");
  cuda_expect_as(dx, DType::bf16, x.rows, x.cols, op, "dx");
  cuda_expect_as(dw, DType::f32, 1, x.cols, op, "dw");
  const size_t ws = rmsnorm_bwd_workspace_bytes(x.rows, x.cols);
  rmsnorm_bwd_launch(bptr(x), x.stride, fptr(w), fptr(rstd), bptr(dy), dy.stride, bptr(dx), dx.stride,
                     fptr(dw), beta_dx, beta_dw, x.rows, x.cols, scratch(ws), ws, dev_.stream);
}

void CudaTrainOps::qk_norm_rope_fwd(const Tensor& x, const Tensor& w, const Tensor& pos, const Tensor& y,
                                    const Tensor& rstd, int heads, int hd, float theta, float eps) {
  const char* op = "qk_norm_rope_fwd";
  expect_qk(op, x, w, pos, rstd, heads, hd);
  cuda_expect_as(y, DType::bf16, x.rows, x.cols, op, "y");
  DF_CHECK(x.data != y.data, "%s: y must not alias x", op);
  qk_norm_rope_fwd_launch(bptr(x), x.stride, fptr(w), iptr(pos), bptr(y), y.stride, fptr(rstd), rstd.stride,
                          x.rows, heads, hd, theta, eps, dev_.stream);
}

void CudaTrainOps::qk_norm_rope_bwd(const Tensor& x, const Tensor& w, const Tensor& pos, const Tensor& rstd,
                                    const Tensor& dy, const Tensor& dx, const Tensor& dw, int heads, int hd,
                                    float theta, float beta_dw) {
  const char* op = "qk_norm_rope_bwd";
  expect_qk(op, x, w, pos, rstd, heads, hd);
  cuda_expect_as(dy, DType::bf16, x.rows, x.cols, op, "dy");
  cuda_expect_as(dx, DType::bf16, x.rows, x.cols, op, "dx");
  cuda_expect_as(dw, DType::f32, 1, hd, op, "dw");
  const size_t ws = qk_norm_rope_bwd_workspace_bytes(x.rows, hd);
  qk_norm_rope_bwd_launch(bptr(x), x.stride, fptr(w), iptr(pos), fptr(rstd), rstd.stride, bptr(dy), dy.stride,
                          bptr(dx), dx.stride, fptr(dw), beta_dw, x.rows, heads, hd, theta, scratch(ws), ws,
                          dev_.stream);
}

// ---- attention ------------------------------------------------------------------------------------------

void CudaTrainOps::dflash_attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& blocks, const Tensor& out, const Tensor& lse,
                                        const DFlashAttnShape& s) {
  const char* op = "dflash_attention_fwd";
  expect_attn(op, q, k, v, blocks, out, lse, s);
  dflash_attention_fwd_launch(bptr(q), q.stride, bptr(k), k.stride, bptr(v), v.stride, iptr(blocks),
                              bptr(out), out.stride, fptr(lse), lse.stride, attn_dims(k, blocks, s),
                              dev_.stream);
}

void CudaTrainOps::dflash_attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& blocks, const Tensor& out, const Tensor& lse,
                                        const Tensor& dout, const Tensor& dq, const Tensor& dk,
                                        const Tensor& dv, const DFlashAttnShape& s) {
  const char* op = "dflash_attention_bwd";
  expect_attn(op, q, k, v, blocks, out, lse, s);
  cuda_expect_as(dout, DType::bf16, q.rows, q.cols, op, "dout");
  cuda_expect_as(dq, DType::bf16, q.rows, q.cols, op, "dq");
  cuda_expect_as(dk, DType::bf16, k.rows, k.cols, op, "dk");
  cuda_expect_as(dv, DType::bf16, v.rows, v.cols, op, "dv");
  const DFlashAttnDims d = attn_dims(k, blocks, s);
  const size_t ws = dflash_attention_bwd_workspace_bytes(d);
  dflash_attention_bwd_launch(bptr(q), q.stride, bptr(k), k.stride, bptr(v), v.stride, iptr(blocks),
                              bptr(out), out.stride, fptr(lse), lse.stride, bptr(dout), dout.stride, bptr(dq),
                              dq.stride, bptr(dk), dk.stride, bptr(dv), dv.stride, d, scratch(ws), ws,
                              dev_.stream);
}

// ---- MLP ------------------------------------------------------------------------------------------------

void CudaTrainOps::swiglu_fwd(const Tensor& gate, const Tensor& up, const Tensor& out) {
  cuda_swiglu(dev_, gate, up, out);
}

void CudaTrainOps::swiglu_bwd(const Tensor& gate, const Tensor& up, const Tensor& dout, const Tensor& dgate,
                              const Tensor& dup) {
  const char* op = "swiglu_bwd";
  for (const auto& [t, what] :
       {std::pair{&gate, "gate"}, {&up, "up"}, {&dout, "dout"}, {&dgate, "dgate"}, {&dup, "dup"}}) {
    cuda_expect_as(*t, DType::bf16, gate.rows, gate.cols, op, what);
  }
  swiglu_bwd_launch(bptr(gate), gate.stride, bptr(up), up.stride, bptr(dout), dout.stride, bptr(dgate),
                    dgate.stride, bptr(dup), dup.stride, gate.rows, gate.cols, dev_.stream);
}

// ---- loss -----------------------------------------------------------------------------------------------

void CudaTrainOps::lm_head_loss(const Tensor& hidden, const Tensor& lm_head, const Tensor& labels,
                                const Tensor& active, const Tensor& target_hidden, LmLossKind kind,
                                const Tensor& loss, const Tensor& p_label, const Tensor& argmax,
                                const Tensor& dhidden, int64_t max_active) {
  const char* op = "lm_head_loss";
  const int64_t rows = hidden.rows, H = hidden.cols, V = lm_head.rows;
  const bool kl = kind == LmLossKind::kl;
  cuda_expect(hidden, DType::bf16, op, "hidden");
  cuda_expect_as(lm_head, DType::bf16, V, H, op, "lm_head");
  cuda_expect_as(labels, DType::i32, 1, rows, op, "labels");
  cuda_expect_as(active, DType::u8, 1, rows, op, "active");
  cuda_expect_as(loss, DType::f32, 1, rows, op, "loss");
  cuda_expect_as(p_label, DType::f32, 1, rows, op, "p_label");
  cuda_expect_as(argmax, DType::i32, 1, rows, op, "argmax");
  cuda_expect_as(dhidden, DType::bf16, rows, H, op, "dhidden");
  if (kl) cuda_expect_as(target_hidden, DType::bf16, rows, H, op, "target_hidden");
  const size_t ws = lm_head_loss_workspace_bytes(rows, H, V, loss_chunk_rows_, kl);
  lm_head_loss_launch(dev_.gemm, bptr(hidden), hidden.stride, bptr(lm_head), lm_head.stride, iptr(labels),
                      static_cast<const uint8_t*>(active.data), kl ? bptr(target_hidden) : nullptr,
                      kl ? target_hidden.stride : 0, kl, fptr(loss), fptr(p_label),
                      static_cast<int32_t*>(argmax.data), bptr(dhidden), dhidden.stride, rows, H, V,
                      loss_chunk_rows_, max_active, scratch(ws), ws, dev_.stream);
}

// ---- optimizer ------------------------------------------------------------------------------------------

double CudaTrainOps::sum_squares(const Tensor& x) {
  const int64_t n = x.numel();
  expect_flat(x, DType::f32, n, "sum_squares", "x");
  // The result sits at the start of the scratch, the partials after it (both 8-byte aligned).
  const size_t ws = sum_squares_workspace_bytes(n);
  double* result = static_cast<double*>(scratch(sizeof(double) + ws));
  sum_squares_launch(fptr(x), n, result, result + 1, ws, dev_.stream);
  double host = 0.0;
  DF_CUDA_CHECK(cudaMemcpyAsync(&host, result, sizeof(double), cudaMemcpyDeviceToHost, dev_.stream));
  DF_CUDA_CHECK(cudaStreamSynchronize(dev_.stream));
  return host;
}

void CudaTrainOps::adamw(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v,
                         const Tensor& p_lp, const AdamW& hp) {
  const char* op = "adamw";
  const int64_t n = p.numel();
  expect_flat(p, DType::f32, n, op, "p");
  expect_flat(g, DType::f32, n, op, "g");
  expect_flat(m, DType::f32, n, op, "m");
  expect_flat(v, DType::f32, n, op, "v");
  if (!p_lp.empty()) expect_flat(p_lp, DType::bf16, n, op, "p_lp");
  DF_CHECK(hp.step_t >= 1 && hp.n_decay >= 0 && hp.n_decay <= n,
           "adamw: step_t %lld / n_decay %lld out of range", (long long)hp.step_t, (long long)hp.n_decay);
  // The CPU backend's bias corrections, in double, exactly as it forms them.
  const AdamWArgs a{hp.lr,
                    hp.beta1,
                    hp.beta2,
                    hp.eps,
                    hp.weight_decay,
                    hp.grad_scale,
                    1.0 - std::pow(double(hp.beta1), double(hp.step_t)),
                    1.0 - std::pow(double(hp.beta2), double(hp.step_t)),
                    hp.n_decay};
  adamw_launch(fptr(p), fptr(g), fptr(m), fptr(v), p_lp.empty() ? nullptr : bptr(p_lp), n, a, dev_.stream);
}

// ---- Domino's head ------------------------------------------------------------------------------------

void cuda_expect_head_loss(const Tensor& y, const Tensor& lm_head, const Tensor& labels, const Tensor& row_w,
                           const Tensor& argmax, const Tensor& stats, int B, int H, int V, const char* op) {
  const int64_t N = y.rows;
  DF_CHECK(B >= 1 && N % B == 0, "%s: %lld rows are not whole blocks of %d", op, (long long)N, B);
  cuda_expect_as(y, DType::bf16, N, H, op, "y");
  cuda_expect_as(lm_head, DType::bf16, V, H, op, "lm_head");
  DF_CHECK(lm_head.contiguous(), "%s: lm_head %s must be contiguous", op, lm_head.shape_str().c_str());
  cuda_expect_as(labels, DType::i32, 1, N, op, "labels");
  cuda_expect_as(row_w, DType::f32, 1, N, op, "row_w");
  cuda_expect_as(argmax, DType::i32, 1, N, op, "argmax");
  cuda_expect_as(stats, DType::u8, 1, int64_t(LossStatsSlots::size(B)) * int64_t(sizeof(double)), op,
                 "stats (f64 slots as bytes)");
}

namespace {

// The head's matrices as train_ops.h DominoHeadWeights names them, contiguous, of dtype dt (bf16 weights, f32
// gradients).
void expect_domino_head(const TrainOps::DominoHeadWeights& w, const DominoHeadDims& d, DType dt,
                        const char* op, const char* what) {
  const int64_t H = d.hidden, G = d.gru_hidden, E = d.emb_dim;
  const std::pair<const Tensor*, std::pair<int64_t, int64_t>> mats[] = {{&w.gru_ih, {3 * G, H}},
                                                                        {&w.gru_hh, {3 * G, G}},
                                                                        {&w.proj_in, {E, H + G}},
                                                                        {&w.proj_out, {d.vocab, E}}};
  for (const auto& [t, shape] : mats) {
    cuda_expect_as(*t, dt, shape.first, shape.second, op, what);
    DF_CHECK(t->contiguous(), "%s: %s %s must be contiguous", op, what, t->shape_str().c_str());
  }
}

DominoHeadShape domino_shape(const DominoHeadDims& d, int64_t nb) {
  DF_CHECK(
      d.block_size >= 2 && d.hidden >= 1 && d.gru_hidden >= 1 && d.emb_dim >= 1 && d.vocab >= 1 &&
          d.pure_draft_prefix_len >= 0,
      "domino head: bad dims block %d hidden %d gru_hidden %d emb_dim %d vocab %d pure_draft_prefix_len %d",
      d.block_size, d.hidden, d.gru_hidden, d.emb_dim, d.vocab, d.pure_draft_prefix_len);
  DominoHeadShape s;
  s.nb = nb;
  s.B = d.block_size;
  s.H = d.hidden;
  s.G = d.gru_hidden;
  s.E = d.emb_dim;
  s.V = d.vocab;
  s.suffix_start = d.suffix_start();
  s.lag = d.gru_lag();
  return s;
}

DominoHeadWeightPtrs domino_weights(const TrainOps::DominoHeadWeights& w) {
  return {bptr(w.gru_ih), bptr(w.gru_hh), bptr(w.proj_in), bptr(w.proj_out)};
}

}  // namespace

void CudaTrainOps::domino_head_loss(const Tensor& y, const Tensor& lm_head, const Tensor& gru_in,
                                    const DominoHeadWeights& w, const Tensor& labels, const Tensor& row_w,
                                    const DominoHeadArgs& a, const Tensor& argmax, const Tensor& dy,
                                    const DominoHeadWeights& dw, const Tensor& stats) {
  const char* op = "domino_head_loss";
  const DominoHeadDims& d = a.dims;
  const int B = d.block_size, H = d.hidden;
  const int64_t N = y.rows;
  DF_CHECK(B >= 2, "%s: block %d < 2", op, B);
  cuda_expect_head_loss(y, lm_head, labels, row_w, argmax, stats, B, H, d.vocab, op);
  cuda_expect_as(gru_in, DType::bf16, N, H, op, "gru_in");
  expect_domino_head(w, d, DType::bf16, op, "a head weight");
  if (a.backward) {
    cuda_expect_as(dy, DType::bf16, N, H, op, "dy");
    expect_domino_head(dw, d, DType::f32, op, "a head gradient");
  }
  const DominoHeadShape s = domino_shape(d, N / B);
  const size_t ws = domino_head_workspace_bytes(s.nb, B, H, s.G, s.E, s.V, loss_chunk_rows_);
  const DominoHeadGradPtrs g =
      a.backward ? DominoHeadGradPtrs{fptr(dw.gru_ih), fptr(dw.gru_hh), fptr(dw.proj_in), fptr(dw.proj_out)}
                 : DominoHeadGradPtrs{};
  domino_head_loss_launch(
      dev_.gemm, s, bptr(y), y.stride, bptr(lm_head), bptr(gru_in), gru_in.stride, domino_weights(w),
      iptr(labels), fptr(row_w), a.lambda, d.shift_label ? 1 : 0, a.backward, a.beta_dw,
      static_cast<int32_t*>(argmax.data), a.backward ? bptr(dy) : nullptr, a.backward ? dy.stride : 0, g,
      static_cast<double*>(stats.data), loss_chunk_rows_, N > 0 ? scratch(ws) : nullptr, ws, dev_.stream);
}

std::vector<int32_t> CudaTrainOps::domino_head_propose(const Tensor& y, const Tensor& lm_head,
                                                       const Tensor& embed, const DominoHeadWeights& w,
                                                       const DominoHeadDims& d, int32_t first) {
  const char* op = "domino_head_propose";
  cuda_expect_as(y, DType::bf16, d.block_size, d.hidden, op, "y");
  cuda_expect_as(lm_head, DType::bf16, d.vocab, d.hidden, op, "lm_head");
  cuda_expect_as(embed, DType::bf16, d.vocab, d.hidden, op, "embed");
  DF_CHECK(lm_head.contiguous() && embed.contiguous(), "%s: lm_head %s and embed %s must be contiguous", op,
           lm_head.shape_str().c_str(), embed.shape_str().c_str());
  expect_domino_head(w, d, DType::bf16, op, "a head weight");
  const DominoHeadShape s = domino_shape(d, 1);
  const size_t ws = domino_propose_layout(s.B, s.H, s.G, s.E, s.V).bytes;
  const int32_t* tok = domino_head_propose_launch(dev_.gemm, s, bptr(y), y.stride, bptr(lm_head), bptr(embed),
                                                  domino_weights(w), d.shift_label ? 1 : 0, first,
                                                  scratch(ws), ws, dev_.stream);
  return download_proposals(tok, d.block_size);
}

std::vector<int32_t> CudaTrainOps::download_proposals(const int32_t* tok, int block) {
  std::vector<int32_t> host(static_cast<size_t>(block));
  DF_CUDA_CHECK(
      cudaMemcpyAsync(host.data(), tok, host.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, dev_.stream));
  DF_CUDA_CHECK(cudaStreamSynchronize(dev_.stream));
  return std::vector<int32_t>(host.begin() + 1, host.end());
}

// ---- DSpark's head (kernels/train/dspark_head.cu) -------------------------------------------------------

namespace {

// Every part of the head that the shape has, contiguous at its shape (matrices of dtype `mat`, bias vectors
// f32: the bf16 GEMM shadow holds only the matrices), and no other.
void expect_dspark_head(const TrainOps::DSparkHeadWeights& w, const DSparkHeadShape& s, DType mat,
                        const char* op, const char* what) {
  const int64_t R = s.R, W = s.cat_width();
  const bool gated = s.markov == DSparkMarkov::gated, rnn = s.markov == DSparkMarkov::rnn;
  auto part = [&](const Tensor& t, bool present, DType dt, int64_t rows, int64_t cols, const char* name) {
    if (present) {
      cuda_expect_as(t, dt, rows, cols, op, what);
      DF_CHECK(t.contiguous(), "%s: %s %s %s must be contiguous", op, what, name, t.shape_str().c_str());
    } else {
      DF_CHECK(t.empty(), "%s: %s %s is set, but this DSpark head has none", op, what, name);
    }
  };
  const bool markov = s.markov != DSparkMarkov::none;
  part(w.markov_w1, markov, mat, s.V, R, "markov_w1");
  part(w.markov_w2, markov, mat, s.V, R, "markov_w2");
  part(w.gate_w, gated, mat, R, W, "gate_proj.weight");
  part(w.gate_b, gated, DType::f32, 1, R, "gate_proj.bias");
  part(w.joint_w, rnn, mat, 3 * R, W, "joint_proj.weight");
  part(w.joint_b, rnn, DType::f32, 1, 3 * R, "joint_proj.bias");
  part(w.conf_w, s.confidence, mat, 1, s.confidence_in(), "confidence_head.proj.weight");
  part(w.conf_b, s.confidence, DType::f32, 1, 1, "confidence_head.proj.bias");
}

const bf16* bptr_or_null(const Tensor& t) {
  return t.empty() ? nullptr : bptr(t);
}
float* fptr_or_null(const Tensor& t) {
  return t.empty() ? nullptr : fptr(t);
}

DSparkHeadWeightPtrs dspark_weights(const TrainOps::DSparkHeadWeights& w) {
  DSparkHeadWeightPtrs p;
  p.markov_w1 = bptr_or_null(w.markov_w1);
  p.markov_w2 = bptr_or_null(w.markov_w2);
  p.gate_w = bptr_or_null(w.gate_w);
  p.joint_w = bptr_or_null(w.joint_w);
  p.conf_w = bptr_or_null(w.conf_w);
  p.gate_b = fptr_or_null(w.gate_b);
  p.joint_b = fptr_or_null(w.joint_b);
  p.conf_b = fptr_or_null(w.conf_b);
  return p;
}

}  // namespace

void CudaTrainOps::dspark_head_loss(const Tensor& y, const Tensor& lm_head, const Tensor& target_hidden,
                                    const DSparkHeadWeights& w, const Tensor& labels, const Tensor& prev,
                                    const Tensor& row_w, const DSparkHeadArgs& a, const Tensor& argmax,
                                    const Tensor& dy, const DSparkHeadWeights& dw, const Tensor& stats) {
  const char* op = "dspark_head_loss";
  const DSparkHeadDims& d = a.dims;
  const int B = d.block_size, H = d.hidden;
  const int64_t N = y.rows;
  DF_CHECK(B >= 2 && N % B == 0, "%s: %lld rows are not whole blocks of %d", op, (long long)N, B);
  const DSparkHeadShape s = dspark_head_shape(d, N / B);
  cuda_expect_as(y, DType::bf16, N, H, op, "y");
  cuda_expect_as(lm_head, DType::bf16, d.vocab, H, op, "lm_head");
  DF_CHECK(lm_head.contiguous(), "%s: lm_head %s must be contiguous", op, lm_head.shape_str().c_str());
  const bool need_target = dspark_needs_target_hidden(d, a.alpha);
  if (need_target) {
    cuda_expect_as(target_hidden, DType::bf16, target_hidden.rows, H, op, "target_hidden");
    DF_CHECK(int64_t(a.target_rows.size()) == N, "%s: %zu target_rows for %lld rows", op,
             a.target_rows.size(), (long long)N);
  }
  cuda_expect_as(labels, DType::i32, 1, N, op, "labels");
  cuda_expect_as(prev, DType::i32, 1, N, op, "prev");
  cuda_expect_as(row_w, DType::f32, 1, N, op, "row_w");
  cuda_expect_as(argmax, DType::i32, 1, N, op, "argmax");
  cuda_expect_as(stats, DType::u8, 1, int64_t(LossStatsSlots::size(B)) * int64_t(sizeof(double)), op,
                 "stats (f64 slots as bytes)");
  expect_dspark_head(w, s, DType::bf16, op, "a head weight");
  DSparkHeadGradPtrs g;
  if (a.backward) {
    cuda_expect_as(dy, DType::bf16, N, H, op, "dy");
    expect_dspark_head(dw, s, DType::f32, op, "a head gradient");
    g = {fptr_or_null(dw.markov_w1), fptr_or_null(dw.markov_w2), fptr_or_null(dw.gate_w),
         fptr_or_null(dw.gate_b),    fptr_or_null(dw.joint_w),   fptr_or_null(dw.joint_b),
         fptr_or_null(dw.conf_w),    fptr_or_null(dw.conf_b)};
  }
  const DSparkLossWeights alpha{float(a.alpha.ce), float(a.alpha.l1), float(a.alpha.confidence)};
  const size_t ws = dspark_head_workspace_bytes(s, loss_chunk_rows_);
  dspark_head_loss_launch(dev_.gemm, s, bptr(y), y.stride, bptr(lm_head),
                          need_target ? bptr(target_hidden) : nullptr, need_target ? target_hidden.stride : 0,
                          need_target ? target_hidden.rows : 0, need_target ? a.target_rows.data() : nullptr,
                          dspark_weights(w), iptr(labels), iptr(prev), fptr(row_w), alpha, a.backward,
                          a.beta_dw, static_cast<int32_t*>(argmax.data), a.backward ? bptr(dy) : nullptr,
                          a.backward ? dy.stride : 0, g, static_cast<double*>(stats.data), loss_chunk_rows_,
                          N > 0 ? scratch(ws) : nullptr, ws, dev_.stream);
}

std::vector<int32_t> CudaTrainOps::dspark_head_propose(const Tensor& y, const Tensor& lm_head,
                                                       const DSparkHeadWeights& w, const DSparkHeadDims& d,
                                                       int32_t first, std::vector<double>* confidence) {
  const char* op = "dspark_head_propose";
  const DSparkHeadShape s = dspark_head_shape(d, 1);
  cuda_expect_as(y, DType::bf16, d.block_size, d.hidden, op, "y");
  cuda_expect_as(lm_head, DType::bf16, d.vocab, d.hidden, op, "lm_head");
  DF_CHECK(lm_head.contiguous(), "%s: lm_head %s must be contiguous", op, lm_head.shape_str().c_str());
  expect_dspark_head(w, s, DType::bf16, op, "a head weight");
  const size_t ws = dspark_propose_layout(s).bytes;
  float* conf = nullptr;
  const int32_t* tok =
      dspark_head_propose_launch(dev_.gemm, s, bptr(y), y.stride, bptr(lm_head), dspark_weights(w), first,
                                 &conf, scratch(ws), ws, dev_.stream);
  const size_t n = size_t(d.block_size);
  std::vector<int32_t> host(n);
  std::vector<float> host_conf(conf ? n - 1 : 0);
  DF_CUDA_CHECK(cudaMemcpyAsync(host.data(), tok, n * sizeof(int32_t), cudaMemcpyDeviceToHost, dev_.stream));
  if (conf)
    DF_CUDA_CHECK(cudaMemcpyAsync(host_conf.data(), conf, host_conf.size() * sizeof(float),
                                  cudaMemcpyDeviceToHost, dev_.stream));
  DF_CUDA_CHECK(cudaStreamSynchronize(dev_.stream));
  if (confidence) confidence->assign(host_conf.begin(), host_conf.end());
  return std::vector<int32_t>(host.begin() + 1, host.end());
}

}  // namespace df
