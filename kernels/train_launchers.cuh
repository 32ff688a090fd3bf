// Launchers of the drafter's training kernels that have no inference twin: DFlash block attention forward and
// backward, and the lm_head loss. Same conventions as launchers.cuh (raw device pointers, row strides in
// elements, a stream, launch checked, df::Error on failure); the math is train_ops.h's, the CPU oracle is
// ops/cpu/cpu_train_ops.cpp. Backward kernels of ops that have an inference kernel live beside it
// (rmsnorm.cu, rope.cu, elementwise.cu) and are declared in launchers.cuh.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/train/train_workspace.h"

namespace df {

using bf16 = __nv_bfloat16;
struct GemmContext;

// ---- dflash_attention.cu ------------------------------------------------------------------------------
// q [nb·B, hq·hd], k/v [T + nb·B, hkv·hd], out [nb·B, hq·hd] bf16; lse f32 [nb·B, hq] (row stride ld_lse);
// blocks i32 [nb, 2] on the device (col 0 = first context row of the block's sequence, col 1 = anchor or −1).
void dflash_attention_fwd_launch(const bf16* q, int64_t ld_q, const bf16* k, int64_t ld_k, const bf16* v,
                                 int64_t ld_v, const int32_t* blocks, bf16* out, int64_t ld_out, float* lse,
                                 int64_t ld_lse, const DFlashAttnDims& d, cudaStream_t stream);

// dq [nb·B, hq·hd], dk/dv [T + nb·B, hkv·hd] bf16, overwritten (rows no query sees are 0).
void dflash_attention_bwd_launch(const bf16* q, int64_t ld_q, const bf16* k, int64_t ld_k, const bf16* v,
                                 int64_t ld_v, const int32_t* blocks, const bf16* out, int64_t ld_out,
                                 const float* lse, int64_t ld_lse, const bf16* dout, int64_t ld_dout, bf16* dq,
                                 int64_t ld_dq, bf16* dk, int64_t ld_dk, bf16* dv, int64_t ld_dv,
                                 const DFlashAttnDims& d, void* ws, size_t ws_bytes, cudaStream_t stream);

// How dflash_attention_bwd_launch runs a call of dims d whose pointers and strides allow 16-byte copies
// (aligned) on the current device: whether the dk/dv pass runs before the dq pass
// (which then fills its tail), and whether the dq pass writes the own rows' dk and dv (the dk/dv pass then
// covers rows [0, T) only). The launch asks this same function; the kernel bench uses it to name each pass.
struct DFlashBwdPlan {
  bool kv_first = false, own_rows_in_dq = false;
};
DFlashBwdPlan dflash_attention_bwd_plan(const DFlashAttnDims& d, bool aligned);

// ---- lm_head_loss.cu ----------------------------------------------------------------------------------
// train_ops.h lm_head_loss on the device: hidden [rows, H] bf16, lm_head [V, H] bf16, labels i32 [rows],
// active u8 [rows], target_hidden [rows, H] bf16 (kl only, else nullptr); writes loss, p_label f32 [rows],
// argmax i32 [rows], dhidden bf16 [rows, H]. Logits exist for at most chunk_rows active rows at a time, through
// the one GEMM entry point (gemm.cuh). ws: device scratch of lm_head_loss_workspace_bytes(...) bytes
// (train_workspace.h, with DFlashAttnDims and the other launchers' scratch sizes).
// max_active: −1, or the host-known number of active rows (not less): the GEMMs then cover only those.
void lm_head_loss_launch(GemmContext* gemm, const bf16* hidden, int64_t ld_hidden, const bf16* lm_head,
                         int64_t ld_lm_head, const int32_t* labels, const uint8_t* active, const bf16* target_hidden,
                         int64_t ld_target, bool kl, float* loss, float* p_label, int32_t* argmax, bf16* dhidden,
                         int64_t ld_dhidden, int64_t rows, int64_t H, int64_t V, int64_t chunk_rows,
                         int64_t max_active, void* ws, size_t ws_bytes, cudaStream_t stream);

// n rows of H bf16 through an index (lm_head_loss's gather and scatter, DFlash2's compaction): gather, dst
// row i = src row idx[i] (zeros for idx −1); scatter, dst row idx[i] = src row i (idx −1 skipped).
void row_copy_launch(const bf16* src, int64_t ld_src, bf16* dst, int64_t ld_dst, const int32_t* idx,
                     int64_t n, int64_t H, bool scatter, cudaStream_t stream);

// ---- loss_stats.cu ------------------------------------------------------------------------------------
// train_ops.h loss_row_stats on the device for nb blocks of `block` rows: labels, argmax i32, active u8,
// loss, p_label f32 [nb·block] (contiguous); row_w f32 [nb·block] written (read when weights_given); stats:
// the kernels/train/loss_slots.h LossStatsSlots::size(block) f64 accumulators, added to. Deterministic (one thread block).
struct LossRowDims {
  int64_t nb = 0;
  int block = 0;
  float gamma = 1;
  bool streak = false;
  float streak_alpha = 1;
  bool weights_given = false;
};
void loss_row_stats_launch(const int32_t* labels, const uint8_t* active, const float* loss,
                           const float* p_label, const int32_t* argmax, const LossRowDims& d, float* row_w,
                           double* stats, cudaStream_t stream);

// ---- domino_head.cu -----------------------------------------------------------------------------------
// train_ops.h domino_head_loss and domino_head_propose on the device (ops/domino_head.h is the math, the CPU
// oracle ops/cpu/cpu_domino.cpp). Weights bf16 and contiguous (gru_ih [3G, H], gru_hh [3G, G], proj_in
// [E, H+G], proj_out [V, E]); their gradients f32 and contiguous.
struct DominoHeadShape {
  int64_t nb = 0;  // blocks (training); 1 for a proposal
  int B = 0, H = 0, G = 0, E = 0, V = 0;
  int suffix_start = 0;  // first slot whose logits get the correction
  int lag = 0;           // slot k reads the GRU state after input k − lag
};
struct DominoHeadWeightPtrs {
  const bf16 *gru_ih = nullptr, *gru_hh = nullptr, *proj_in = nullptr, *proj_out = nullptr;
};
struct DominoHeadGradPtrs {
  float *gru_ih = nullptr, *gru_hh = nullptr, *proj_in = nullptr, *proj_out = nullptr;
};
// y, gru_in [nb·B, H] bf16 (row strides ld_y, ld_gru_in), lm_head [V, H] bf16 (contiguous); labels i32, row_w
// f32 [nb·B]; writes argmax i32 [nb·B] (−1 where row_w is 0) and adds the step statistics to stats
// (LossStatsSlots f64) the way loss_row_stats does with given weights, slot k counted at block offset
// k + shift. With backward: dy bf16 [nb·B, H] (row stride ld_dy) overwritten, dw = beta_dw·dw + ∂/∂w.
// Logits exist for half of chunk_rows rows at a time. ws: domino_head_workspace_bytes(...) bytes
// (train_workspace.h), 256-byte aligned.
void domino_head_loss_launch(GemmContext* gemm, const DominoHeadShape& d, const bf16* y, int64_t ld_y,
                             const bf16* lm_head, const bf16* gru_in, int64_t ld_gru_in,
                             const DominoHeadWeightPtrs& w, const int32_t* labels, const float* row_w,
                             double lambda, int shift, bool backward, float beta_dw, int32_t* argmax,
                             bf16* dy, int64_t ld_dy, const DominoHeadGradPtrs& dw, double* stats,
                             int64_t chunk_rows, void* ws, size_t ws_bytes, cudaStream_t stream);
// One block's greedy proposals: y [B, H] bf16 (row stride ld_y), lm_head and embed [V, H] bf16; tokens i32
// [B] in ws gets `first` and the B − 1 proposals; returns where (the stream is not synchronised). shift: 1
// with shift_label (token p comes from slot p − 1), else 0. ws: domino_propose_layout(...).bytes.
const int32_t* domino_head_propose_launch(GemmContext* gemm, const DominoHeadShape& d, const bf16* y,
                                          int64_t ld_y, const bf16* lm_head, const bf16* embed,
                                          const DominoHeadWeightPtrs& w, int shift, int32_t first, void* ws,
                                          size_t ws_bytes, cudaStream_t stream);

// ---- token_scatter.cu ----------------------------------------------------------------------------------
// Sorts n (a power of two, token_sort_keys) u64 keys ascending in place; keys token << 32 | entry, unique,
// the padding all ones.
void token_sort_launch(uint64_t* keys, int64_t n, cudaStream_t stream);
// Over the first M sorted keys: out[token, c] += Σ over the token's entries e, in order, of coef[e]·src[(e /
// per)·R + c] (coef null: 1), out f32 [V, R]; tokens ≥ V are skipped.
void token_row_sum_launch(const uint64_t* keys, int64_t M, int64_t V, const float* coef, const float* src,
                          int per, int R, float* out, cudaStream_t stream);

// ---- dflash2_conv.cu, dflash2_selector.cu
// ------------------------------------------------------------------- train_ops.h's DFlash2 ops on the device
// (ops/dflash2_conv.h and ops/dflash2_selector.h are the math, the CPU oracle ops/cpu/cpu_dflash2.cpp).
struct Dflash2ConvShape {
  int H = 0, B = 0, taps = 0, gs = 0;  // hidden, block, taps, channels a group
};
// out = resid + conv_side(u) over rows (whole blocks): u, resid, out bf16 [rows, H], coeff bf16 [rows,
// 2·taps·G] (both sides), base f32 [2·taps, H] contiguous; resid may be null. out must not alias u.
void dflash2_conv_fwd_launch(const Dflash2ConvShape& d, int side, const bf16* u, int64_t ld_u,
                             const float* base, const bf16* coeff, int64_t ld_c, const bf16* resid,
                             int64_t ld_r, bf16* out, int64_t ld_o, int64_t rows, cudaStream_t stream);
// Its backward: du and dcoeff's side-s columns overwritten (bf16), dbase's side-s rows = beta·dbase + ∂/∂base
// (f32, summed in fixed row chunks). ws: dflash2_conv_bwd_workspace_bytes(rows, H, taps) (train_workspace.h).
void dflash2_conv_bwd_launch(const Dflash2ConvShape& d, int side, const bf16* u, int64_t ld_u,
                             const float* base, const bf16* coeff, int64_t ld_c, const bf16* dout,
                             int64_t ld_do, bf16* du, int64_t ld_du, bf16* dcoeff, int64_t ld_dc,
                             float* dbase, float beta_dbase, int64_t rows, void* ws, size_t ws_bytes,
                             cudaStream_t stream);

struct Dflash2SelectorShape {
  int64_t nb = 0;  // blocks (training); 1 for a proposal
  int B = 0, H = 0, V = 0, R = 0, K = 0;
  float mult = 1.0f, softcap = 0.0f;  // output_multiplier, final_logit_softcapping (0: none)
};
struct Dflash2SelectorWeightPtrs {
  const bf16 *pred = nullptr, *succ = nullptr, *proj = nullptr;  // [V, R], [V, R], [R, H]
};
struct Dflash2SelectorGradPtrs {
  float *pred = nullptr, *succ = nullptr, *proj = nullptr;
};
// The strict top-K (descending, ties to the lower id, NaN ranked nowhere) of n rows of V f32 logits (row
// stride ld, a multiple of 4; rows 16-byte aligned): ids to cand i32 [n, K], values to cval f32 [n, K]; a row
// with fewer than K non-NaN logits ends in id 0 with value NaN.
void dflash2_topk_rows_launch(const float* logits, int64_t ld, int64_t V, int K, int64_t n, int32_t* cand,
                              float* cval, cudaStream_t stream);
// The selector loss's workspace: dflash2_selector_layout of the shape.
size_t dflash2_selector_workspace_bytes(const Dflash2SelectorShape& d, int64_t chunk_rows);
// y [nb·B, H] bf16 (row stride ld_y), lm_head [V, H] bf16 contiguous, weights bf16 contiguous; labels, prev
// i32 and row_w f32 [nb·B]. Writes argmax i32 [nb·B] of the raw logits (−1 where row_w is 0) and adds Σ w·(CE
// + α·CE_selector), Σ w and the accuracy counts to stats as loss_row_stats does with given weights. With
// backward: dy bf16 (row stride ld_dy) overwritten with ∂/∂y (the selector term left out with stop_gradient),
// dw = beta_dw·dw + ∂/∂w (f32, contiguous). Logits exist for chunk_rows rows at a time.
// ws: dflash2_selector_workspace_bytes(d, chunk_rows) bytes, 256-byte aligned.
void dflash2_selector_loss_launch(GemmContext* gemm, const Dflash2SelectorShape& d, const bf16* y,
                                  int64_t ld_y, const bf16* lm_head, const Dflash2SelectorWeightPtrs& w,
                                  const int32_t* labels, const int32_t* prev, const float* row_w, float alpha,
                                  bool stop_gradient, bool backward, float beta_dw, int32_t* argmax, bf16* dy,
                                  int64_t ld_dy, const Dflash2SelectorGradPtrs& dw, double* stats,
                                  int64_t chunk_rows, void* ws, size_t ws_bytes, cudaStream_t stream);
// One block's greedy lattice walk (d.nb 1): y [B, H] bf16 (row stride ld_y); tokens i32 [B] in ws get `first`
// and the B − 1 proposals; returns where (the stream is not synchronised). ws: dflash2_propose_layout(B, V,
// R, K).bytes.
const int32_t* dflash2_selector_propose_launch(GemmContext* gemm, const Dflash2SelectorShape& d,
                                               const bf16* y, int64_t ld_y, const bf16* lm_head,
                                               const Dflash2SelectorWeightPtrs& w, int32_t first, void* ws,
                                               size_t ws_bytes, cudaStream_t stream);

}  // namespace df
