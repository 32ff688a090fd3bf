// The ops the DFlash drafter's forward and analytic backward call, at fused-kernel granularity. Separate
// from Ops (the frozen target's inference ops) because training needs saved statistics, backward passes,
// an optimizer and a loss that never materialises the full [rows, vocab] logits.
//
// Conventions (shared with ops/ops.h):
//  - Tensors are 2-D row-major views (core/tensor.h), possibly strided; token-major activations [rows, feat].
//  - Precision: activations, their gradients and GEMM operands are act_dtype() (f32 on CPU, bf16 on CUDA);
//    GEMM weights are the bf16 shadow of the master weights on CUDA (AdamW refreshes it); norm weights,
//    parameter gradients (dw), saved statistics, losses and the flat optimizer buffers are always f32.
//  - Multi-head tensors are [rows, heads·hd] with head h in columns [h·hd, (h+1)·hd).
//  - Backward ops overwrite their input gradients unless a `beta` says otherwise. Parameter gradients (dw)
//    take one too: beta 1 adds (+=, gradient accumulation over micro-batches is free), beta 0 writes without
//    reading dw (an optimizer step's first backward, model/drafter.h drafter_begin_step, so nothing has to
//    zero-fill the gradients first). gemm's beta serves both.
//  - Saved statistics (rstd, logsumexp) are f32 and owned by the caller between forward and backward.
//  - Determinism, as promised and tested (test_train_ops.cpp): for a fixed input, configuration and machine
//    every op returns the same bits on every call and for any thread count (the backends' own reductions run
//    in a fixed order; the CPU GEMM is OpenBLAS, which never splits the inner dimension across threads), so a
//    resumed run reproduces the same bits. Across CPU models, and across lm_head_loss chunk sizes, results
//    agree to float rounding only: OpenBLAS picks its kernels by CPU model and matrix shape (AVX-512 hosts
//    run small-matrix kernels that sum in another order), so the same dot product can differ in the last
//    bits.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "ops/dflash2_conv.h"
#include "ops/dflash2_selector.h"
#include "ops/domino_head.h"
#include "ops/dspark_head.h"
#include "ops/wire_pool.h"

namespace df {

// One DFlash block per row of `blocks` (i32 [nb, 2]): col 0 = packed row where the block's sequence starts
// in the context keys, col 1 = anchor position a within that sequence, or −1 for a padding block (it sees
// nothing: output 0, lse −inf, no gradient). Block j owns query rows [j·B, (j+1)·B) and, after the T context
// rows, key rows T + [j·B, (j+1)·B).
struct DFlashAttnShape {
  int hq = 0;          // query heads
  int hkv = 0;         // key/value heads; query head h reads kv head h / (hq / hkv)
  int hd = 0;          // head dim
  int block = 0;       // B
  int window = 0;      // 0: full layer (bidirectional block, all context t < a). W > 0: sliding layer
                       // (causal in the block, context t ≥ a + k − (W − 1))
  float scale = 1.0f;  // softmax scale, hd^−½
};

enum class LmLossKind : uint8_t {
  ce,  // cross-entropy against the label token
  kl,  // KL(p_target ‖ p_draft), p_target = softmax(lm_head · target_hidden_row)
};

// D-PACE row weights (MODELS.md "D-PACE loss", SpecForge's loss_type "dpace" and its two ablations;
// ops/loss_rows.h loss_dpace_weights).
enum class DpaceKind : uint8_t {
  off,
  full,                        // "dpace": w_k = Σ_{j≥k} prefix_j·m_j
  cumulative_confidence_only,  // "dpace-cumulative-confidence-only": w_k = prefix_k
  continuation_value_only,     // "dpace-continuation-value-only": w_k = (Σ_{j≥k} prefix_j·m_j) / prefix_k
};

class TrainOps {
 public:
  virtual ~TrainOps() = default;
  virtual Device device() const = 0;
  virtual const char* name() const = 0;
  // dtype of activations, activation gradients and GEMM operands (see Precision above).
  virtual DType act_dtype() const = 0;

  // ---- memory -------------------------------------------------------------------------------------
  virtual void* alloc_bytes(size_t bytes) = 0;  // backend memory, zero-filled
  virtual void free_bytes(void* p) = 0;
  virtual void upload_raw(const Tensor& dst, const void* host) = 0;  // host bytes of dst's dtype, contiguous
  virtual void download_raw(const Tensor& src, void* host) = 0;      // contiguous src, its own dtype, to host
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;       // same shape, f32
  virtual void fill(const Tensor& dst, float value) = 0;
  // The feature channel's receive slots in this backend's memory (ops/wire_pool.h), as Ops::wire_pool
  // (mirrors = false for the NCCL wire).
  virtual std::unique_ptr<WirePool> wire_pool(int depth, size_t bytes, bool mirrors = true) {
    return wire_pool_host(depth, bytes);
  }

  // ---- dense --------------------------------------------------------------------------------------
  // c = alpha · op(a) · op(b) + beta · c with op(x) = xᵀ when trans_x; beta 0 never reads c, and K = 0 (an
  // empty row range of dYᵀ·X) gives c = beta · c, zeros for beta 0. Covers y = x·Wᵀ (false, true),
  // dX = dY·W (false, false) and dW = beta · dW + dYᵀ·X (true, false).
  virtual void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, float alpha,
                    float beta) = 0;
  // out = alpha · op(a) · op(b) + beta · c_in, c_in of out's shape and dtype: the residual add
  // h = x + att·Woᵀ written into h without copying x there first. c_in is out itself (then this is gemm) or
  // does not overlap it. Same bits as copy(c_in, out) then gemm(..., out, alpha, beta).
  virtual void gemm_add(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c_in,
                        const Tensor& out, float alpha, float beta) = 0;
  // out[r] = table[ids[r]]; ids i32 [1, rows]; ids validated by the caller.
  virtual void embedding(const Tensor& ids, const Tensor& table, const Tensor& out) = 0;
  // x[r] *= s[r]; s f32 [1, rows].
  virtual void scale_rows(const Tensor& x, const Tensor& s) = 0;
  // x += std · N(0, 1) where the normal draw of element (r, c) is a pure function of (seed, r·cols + c), so
  // every backend and every thread count draws the same noise.
  virtual void add_gaussian_noise(const Tensor& x, float std, uint64_t seed) = 0;

  // ---- normalisation and RoPE ---------------------------------------------------------------------
  // Plain RMSNorm y = w · x · rstd, rstd = rsqrt(mean(x²) + eps) saved as f32 [1, rows].
  virtual void rmsnorm_fwd(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd, float eps) = 0;
  // dx = beta_dx · dx + ∂/∂x, dw = beta_dw · dw + ∂/∂w (rows 0: ∂/∂w = 0, so beta_dw 0 still zeroes dw).
  virtual void rmsnorm_bwd(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                           const Tensor& dx, const Tensor& dw, float beta_dx, float beta_dw) = 0;
  // Per head: y = rope(w · x · rstd) at positions pos (i32 [1, rows]); rotate-half over all hd dims,
  // inv_freq_j = theta^(−2j/hd). rstd saved as f32 [rows, heads]. y must not alias x.
  virtual void qk_norm_rope_fwd(const Tensor& x, const Tensor& w, const Tensor& pos, const Tensor& y,
                                const Tensor& rstd, int heads, int hd, float theta, float eps) = 0;
  // dx = ∂/∂x (overwritten), dw = beta_dw · dw + ∂/∂w.
  virtual void qk_norm_rope_bwd(const Tensor& x, const Tensor& w, const Tensor& pos, const Tensor& rstd,
                                const Tensor& dy, const Tensor& dx, const Tensor& dw, int heads, int hd,
                                float theta, float beta_dw) = 0;

  // ---- attention ----------------------------------------------------------------------------------
  // q [nb·B, hq·hd]; k, v [T + nb·B, hkv·hd] (T context rows, then the block rows); out [nb·B, hq·hd];
  // lse f32 [nb·B, hq] saved for the backward. Mask as described at DFlashAttnShape / MODELS.md.
  virtual void dflash_attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& blocks,
                                    const Tensor& out, const Tensor& lse, const DFlashAttnShape& s) = 0;
  // dq, dk, dv overwritten (dk/dv rows no query sees are zero).
  virtual void dflash_attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& blocks,
                                    const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dq,
                                    const Tensor& dk, const Tensor& dv, const DFlashAttnShape& s) = 0;

  // ---- MLP ----------------------------------------------------------------------------------------
  virtual void swiglu_fwd(const Tensor& gate, const Tensor& up, const Tensor& out) = 0;  // silu(g)·u
  virtual void swiglu_bwd(const Tensor& gate, const Tensor& up, const Tensor& dout, const Tensor& dgate,
                          const Tensor& dup) = 0;

  // ---- loss through the frozen lm_head ------------------------------------------------------------
  // For every row r with active[r] != 0 (u8 [1, rows]): logits = lm_head · hidden[r] (lm_head [V, H]),
  // computed a chunk of rows at a time so at most [chunk, V] logits exist. Writes
  //   loss[r]    CE(label[r]) or KL(p_target ‖ p_draft) (kind kl needs target_hidden [rows, H]),
  //   p_label[r] softmax(logits)[label[r]], argmax[r] (i32; ties → lowest id),
  //   dhidden[r] ∂loss[r]/∂hidden[r] for unit weight: the caller scales rows by their (detached) weights
  //              afterwards, which is exact because row r's loss depends on hidden[r] only.
  // Inactive rows get loss 0, p_label 0, argmax −1, dhidden 0. labels i32 [1, rows]. max_active: −1, or the
  // number of active rows when the caller knows it on the host (it must not be less: the CUDA backend sizes its
  // GEMMs by it instead of by rows, since counting on the device would need a synchronisation).
  virtual void lm_head_loss(const Tensor& hidden, const Tensor& lm_head, const Tensor& labels, const Tensor& active,
                            const Tensor& target_hidden, LmLossKind kind, const Tensor& loss, const Tensor& p_label,
                            const Tensor& argmax, const Tensor& dhidden,
                            int64_t max_active = -1) = 0;

  // ---- loss weights and step statistics ----------------------------------------------------------
  // The weight of every block row and the statistics a metrics line reports, on the backend, so a micro-batch
  // never waits for the host. Rows are nb blocks of `block` rows, block-major (row r = j·block + k).
  // Row k ≥ 1 with active[r] gets w = exp(−(k−1)/γ) (ops/loss_rows.h loss_offset_weight), times, when streak,
  // the detached Π over earlier active offsets j < k of p_label[j]^α (loss_apply_streak); every other row
  // gets 0. With dpace (not off) the rows get the D-PACE weights of loss_dpace_weights (α = dpace_alpha) instead,
  // and the Σ w slot gets the micro-batch's `sequences` added instead of the weights: D-PACE divides the
  // step's Σ w·CE by its sequences. CPU backend only; the CUDA one refuses it. With weights_given, row_w is
  // read instead of written (gradient checks hold the weights fixed).
  // stats: LossStatsSlots f64 accumulators (kernels/train/loss_slots.h), stored as u8 [1, 8·slots], ADDED to:
  //   Σ w·loss, Σ w, Σ (1 + leading correct offsets) and the number of blocks with an active row, then
  //   per offset k = 1..B−1 the active rows whose argmax equals the label, then the active rows.
  // Sums run in a fixed order on every backend (deterministic, like every op here).
  struct LossRowArgs {
    int block = 0;
    float gamma = 1;
    bool streak = false;
    float streak_alpha = 1;
    bool weights_given = false;
    DpaceKind dpace = DpaceKind::off;
    float dpace_alpha = 0.5f;
    int64_t sequences = 0;
  };
  virtual void loss_row_stats(const Tensor& labels, const Tensor& active, const Tensor& loss,
                              const Tensor& p_label, const Tensor& argmax, const LossRowArgs& a,
                              const Tensor& row_w, const Tensor& stats) = 0;

  // ---- Domino's head (drafter.kind = "domino"; ops/domino_head.h is the math) -----------------------
  // The head's four matrices (ops/domino_head.h DominoHeadTensors names them), or their f32 gradients.
  struct DominoHeadWeights {
    Tensor gru_ih, gru_hh, proj_in, proj_out;
  };
  struct DominoHeadArgs {
    DominoHeadDims dims;
    double lambda = 0;     // the weight of CE(base); CE(final) gets 1 − λ
    bool backward = true;  // false: neither dy nor dw is written
    float beta_dw = 0;     // head gradients: beta 0 writes, beta 1 adds
  };
  // nb blocks of the final-norm output y [nb·B, H] (block-major rows; act_dtype) through the head and both
  // losses: gru_in [nb·B, H] holds the target embeddings of each block's GRU input tokens, labels i32 and
  // row_w f32 [1, nb·B] what each slot predicts and its loss weight (ops/domino_head.h domino_block_rows;
  // 0: the slot has no label). Writes argmax i32 [1, nb·B] of the final logits (−1 where row_w is 0) and,
  // with backward, dy [nb·B, H] = ∂(Σ w·L)/∂y with L = (1 − λ)·CE(final) + λ·CE(base) (the weights are
  // already in it) and dw. Adds Σ w·L, Σ w and the accuracy and τ counts to stats as loss_row_stats does,
  // slot k counted at block offset k + 1 with shift_label (its label is x[a+k+1]) and k without, so the
  // counts mean what DFlash's do; a slot past offset B − 1 (the last one with shift_label) is not counted:
  // decoding never proposes from it. Both backends (the CUDA one: kernels/train/domino_head.cu).
  virtual void domino_head_loss(const Tensor& y, const Tensor& lm_head, const Tensor& gru_in,
                                const DominoHeadWeights& w, const Tensor& labels, const Tensor& row_w,
                                const DominoHeadArgs& a, const Tensor& argmax, const Tensor& dy,
                                const DominoHeadWeights& dw, const Tensor& stats) = 0;
  // Domino's greedy proposals for one block (ops/domino_head.h domino_block_propose): y [B, H] the block's
  // final-norm output, lm_head and embed [V, H], `first` the last committed token; returns B − 1 tokens.
  virtual std::vector<int32_t> domino_head_propose(const Tensor& y, const Tensor& lm_head,
                                                   const Tensor& embed, const DominoHeadWeights& w,
                                                   const DominoHeadDims& d, int32_t first) = 0;

  // ---- DFlash2 (drafter.kind = "dflash2"; ops/dflash2_conv.h and ops/dflash2_selector.h are the math) ----
  // The base class refuses these, naming the backend: the CPU and CUDA backends have them.
  // One convolution's weights: base_kernel f32 [2·taps, H], kernel_projection [coeffs, H] (a GEMM weight).
  struct Dflash2ConvWeights {
    Tensor base_kernel, kernel_projection;
  };
  // out = resid + conv_side(u) (resid empty: no residual); u, resid, out [rows, H] and coeff [rows, coeffs]
  // (x·kernel_projectionᵀ, both sides) act_dtype; rows whole blocks. out must not alias u.
  virtual void dflash2_conv_fwd(const Tensor& u, const Tensor& base, const Tensor& coeff, int side,
                                const Tensor& resid, const Tensor& out, const Dflash2ConvDims& d);
  // Backward of conv_side (not of the residual): du = ∂/∂u and dcoeff's side-s columns = ∂/∂coeff
  // (overwritten; the other side's columns untouched), dbase's side-s rows = beta_dbase · dbase + ∂/∂base.
  virtual void dflash2_conv_bwd(const Tensor& u, const Tensor& base, const Tensor& coeff, int side,
                                const Tensor& dout, const Tensor& du, const Tensor& dcoeff,
                                const Tensor& dbase, float beta_dbase, const Dflash2ConvDims& d);
  // The candidate selector's three matrices (ops/dflash2_selector.h names them), or their f32 gradients.
  struct Dflash2SelectorWeights {
    Tensor predecessor_codebook, successor_codebook, hidden_projection;
  };
  struct Dflash2SelectorArgs {
    Dflash2SelectorDims dims;
    double alpha = 0;            // the selector term's weight (dflash2_selector_alpha's schedule)
    bool stop_gradient = false;  // the selector term trains the selector only
    bool backward = true;        // false: neither dy nor dw is written
    float beta_dw = 0;           // selector gradients: beta 0 writes, beta 1 adds
  };
  // nb blocks of the final-norm output y [nb·B, H] through the lm_head's CE and the selector's K-way CE:
  // labels, prev i32 and row_w f32 [1, nb·B] each slot's label, its predecessor and its DFlash row weight
  // (ops/dflash2_selector.h dflash2_block_rows; 0: no label; slot 0, the anchor, must carry 0: the CPU
  // backend rejects a weight there, the CUDA one skips the anchor rows and gives a NaN loss for one).
  // Writes argmax i32 [1, nb·B] of the raw logits
  // (−1 where row_w is 0) and, with backward, dy = ∂(Σ w·CE + α·Σ w·CE_selector)/∂y (weights in it) and dw.
  // Adds Σ w·CE + α·Σ w·CE_selector, Σ w and the accuracy and τ counts of the raw argmax to stats as
  // loss_row_stats does.
  virtual void dflash2_selector_loss(const Tensor& y, const Tensor& lm_head, const Dflash2SelectorWeights& w,
                                     const Tensor& labels, const Tensor& prev, const Tensor& row_w,
                                     const Dflash2SelectorArgs& a, const Tensor& argmax, const Tensor& dy,
                                     const Dflash2SelectorWeights& dw, const Tensor& stats);
  // DFlash2's proposals for one block (dflash2_selector_greedy_path over rows 1..B−1 of y [B, H], the
  // block's final-norm output), walking from `first`, the last committed token; returns B − 1 tokens.
  virtual std::vector<int32_t> dflash2_selector_propose(const Tensor& y, const Tensor& lm_head,
                                                        const Dflash2SelectorWeights& w,
                                                        const Dflash2SelectorDims& d, int32_t first);
  // ---- DSpark's head (drafter.kind = "dspark"; ops/dspark_head.h is the math) -----------------------
  // The head's tensors (ops/dspark_head.h DSparkHeadTensors names them; a part the head type or the config
  // lacks is empty), or their f32 gradients.
  struct DSparkHeadWeights {
    Tensor markov_w1, markov_w2, gate_w, gate_b, joint_w, joint_b, conf_w, conf_b;
  };
  struct DSparkHeadArgs {
    DSparkHeadDims dims;
    DSparkLossAlphas alpha;  // the weights of Σ w·CE, Σ w·L1 and Σ w·BCE
    bool backward = true;    // false: neither dy nor dw is written
    float beta_dw = 0;       // head gradients: beta 0 writes, beta 1 adds
    // [nb·B] row r's row of target_hidden (read only with target_hidden; a row outside it is an error)
    std::vector<int32_t> target_rows;
  };
  // nb blocks of the final-norm output y [nb·B, H] (block-major rows; act_dtype) through the Markov bias, the
  // confidence head and DSpark's loss: labels, prev i32 and row_w f32 [1, nb·B] what each slot predicts, its
  // previous (gold) token and its loss weight (ops/dspark_head.h dspark_block_rows; 0: no loss);
  // target_hidden [T, H] the target's final-norm output per token, a.target_rows the one that predicts each
  // row's label (blocks of neighbouring anchors share most of theirs), or empty when
  // dspark_needs_target_hidden(dims, alpha) is false. Writes argmax i32 [1, nb·B] of the draft logits
  // (−1 where row_w is 0) and, with backward, dy [nb·B, H] = ∂(Σ w·L)/∂y with L = α_ce·CE + α_l1·L1 +
  // α_conf·BCE (the weights are already in it) and dw. Adds Σ w·L, Σ w and the accuracy and τ counts to
  // stats as loss_row_stats does, slot k counted at block offset k + 1 (its label is x[a+k+1]); slot B − 1
  // is not counted: decoding never proposes from it. Both backends (the CUDA one:
  // kernels/train/dspark_head.cu).
  virtual void dspark_head_loss(const Tensor& y, const Tensor& lm_head, const Tensor& target_hidden,
                                const DSparkHeadWeights& w, const Tensor& labels, const Tensor& prev,
                                const Tensor& row_w, const DSparkHeadArgs& a, const Tensor& argmax,
                                const Tensor& dy, const DSparkHeadWeights& dw, const Tensor& stats) = 0;
  // DSpark's greedy proposals for one block (ops/dspark_head.h dspark_block_propose): y [B, H] the block's
  // final-norm output, lm_head [V, H], `first` the last committed token; returns B − 1 tokens and, when
  // `confidence` is set and the head has one, the confidence logit of each proposal.
  virtual std::vector<int32_t> dspark_head_propose(const Tensor& y, const Tensor& lm_head,
                                                   const DSparkHeadWeights& w, const DSparkHeadDims& d,
                                                   int32_t first, std::vector<double>* confidence) = 0;

  // ---- optimizer ----------------------------------------------------------------------------------
  // Σ x² over a flat f32 buffer, accumulated in double in a fixed order.
  virtual double sum_squares(const Tensor& x) = 0;
  // One AdamW update over flat f32 buffers [1, n] (p, m, v updated; g read as g · grad_scale). Elements
  // [0, n_decay) get decoupled weight decay, the rest none. step_t = 1-based step for bias correction.
  // p_lp: empty, or a flat bf16 [1, n] shadow of p that receives bf16(p) of the updated weights in the same
  // pass (the CUDA drafter's GEMM weights).
  struct AdamW {
    float lr = 0, beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f, weight_decay = 0, grad_scale = 1;
    int64_t step_t = 1;
    int64_t n_decay = 0;
  };
  virtual void adamw(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const Tensor& p_lp,
                     const AdamW& hp) = 0;
};

}  // namespace df
