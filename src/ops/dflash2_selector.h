// DFlash2's candidate selector and its loss term (drafter.kind = "dflash2"; SpecForge 5943b2f6 dflash2.py
// CandidateSelector, dflash_family_model.py OnlineDFlashModel._dflash_objective_chunk_terms): the exact fp32
// math of one block on the host, forward and analytic backward, as the oracle the drafter step and the CUDA
// ops are checked against. The backbone gives the normed draft hidden z [B, H] of a block.
//
//   logits_k = lm_head z_k;  u = m·logits, then c·tanh(u/c) when c = final_logit_softcapping > 0 (unary)
//   candidates: the K largest u (K = selector_top_k, over the whole vocabulary, descending, ties to the lower
//     id). Training: a gold label outside them replaces the K-th (weakest) candidate, with its own unary
//     value, and is the target there (the pinned peer; later SpecForge drops such rows instead).
//   score_j = u[cand_j] + ⟨pred[prev_k] ⊙ (W_h z_k), succ[cand_j]⟩    (rank R codebooks [V, R], W_h [R, H])
//   selector CE_k = logsumexp_j(score) − score_target
//   block terms: Σ_k w_k·CE(logits_k) and Σ_k w_k·selector CE_k, w_k the DFlash row weight; the step loss is
//   (Σ base + α·Σ selector) / Σ w with α on dflash2_selector_alpha's schedule.
//
// prev_k is the true previous token x[a+k−1] in training; decoding walks the candidate lattice greedily from
// the anchor (dflash2_selector_greedy_path). With a zero successor codebook every score is its unary value,
// so the walk proposes argmax(logits) per slot, as DFlash does.
//
// Parameter names (the peer's, also the export names): candidate_selector.predecessor_codebook [V, R],
// candidate_selector.successor_codebook [V, R], candidate_selector.hidden_projection.weight [R, H].
#pragma once
#include <cstdint>
#include <vector>

namespace df {

struct Dflash2SelectorDims {
  int hidden = 0;      // H
  int vocab = 0;       // V
  int rank = 0;        // R
  int top_k = 0;       // K
  int block_size = 0;  // B
  double output_multiplier = 1.0;
  double softcap = 0.0;  // 0: none
};

// The selector's weights (read) or their gradients (accumulated into).
template <class T>
struct Dflash2SelectorTensors {
  T* predecessor_codebook = nullptr;  // [V, R]
  T* successor_codebook = nullptr;    // [V, R]
  T* hidden_projection = nullptr;     // [R, H]
};

// The unary value of a raw logit, and its derivative d unary / d logit.
double dflash2_unary(const Dflash2SelectorDims& d, double logit);
double dflash2_unary_grad(const Dflash2SelectorDims& d, double logit);

// One slot's candidate set: ids and unary values, and (training) which of them is the gold label.
struct Dflash2Candidates {
  std::vector<int32_t> ids;   // [K]
  std::vector<double> unary;  // [K]
  int target = -1;            // index of the gold label in ids; -1 without one
  bool covered = false;       // the gold label was among the strict top-K
};
// The strict top-K of the unary values of logits [V] (gold < 0); with a gold label, the training set above.
template <class T>
Dflash2Candidates dflash2_selector_candidates(const Dflash2SelectorDims& d, const T* logits, int32_t gold);

// One block's rows: slot k's label x[a+k], its predecessor x[a+k−1] (the anchor's token for slot 0, which
// carries no weight) and the DFlash row weight exp(−(k−1)/γ) × [a+k < len] × loss_mask[a+k] for k ≥ 1; a
// padding block (anchor < 0) carries none. Positions past the sequence read its last token (the peer's
// clamped gather); they feed only slots that carry no weight.
struct Dflash2BlockRows {
  std::vector<int32_t> labels;  // [B]
  std::vector<int32_t> prev;    // [B]
  std::vector<double> weights;  // [B]
};
Dflash2BlockRows dflash2_block_rows(int block_size, const int32_t* tokens, const uint8_t* loss_mask,
                                    int64_t len, int64_t anchor, double gamma);

// SpecForge's selector weight schedule: 0 for the first ⌊total·warmup_ratio⌋ completed optimizer steps, then
// alpha·min((step − warmup + 1) / ⌊total·ramp_ratio⌋, 1), alpha itself without a ramp or a horizon.
double dflash2_selector_alpha(int64_t step, int64_t total_steps, double alpha, double warmup_ratio,
                              double ramp_ratio);

struct Dflash2BlockLoss {
  double base_sum = 0;      // Σ_k w_k·CE(logits_k)
  double selector_sum = 0;  // Σ_k w_k·selector CE_k
  int covered = 0;          // weighted slots whose gold label was in the strict top-K
};

// One block forward: z [B, H] draft hidden (normed), lm_head [V, H] frozen; the raw logits of every weighted
// slot go to logits [B, V] when it is set (other slots' rows are left as they are). With `grads` set, also
// runs the backward of base_sum + alpha·selector_sum: the selector's gradients are added into *grads and ∂/∂z
// into dz [B, H] (dz may be null); stop_gradient keeps the selector term out of dz (it then trains the
// selector's weights only). T = float is the oracle; T = double serves the finite-difference test.
template <class T>
Dflash2BlockLoss dflash2_block_step(const Dflash2SelectorDims& d, const Dflash2SelectorTensors<const T>& w,
                                    const T* lm_head, const T* z, const Dflash2BlockRows& rows, double alpha,
                                    bool stop_gradient, T* logits, const Dflash2SelectorTensors<T>* grads,
                                    T* dz);

// Decoding: n slots of raw logits [n, V] and draft hidden [n, H] after the anchor token; each slot takes the
// best-scoring of its strict top-K given the previous slot's choice (the anchor for the first).
template <class T>
std::vector<int32_t> dflash2_selector_greedy_path(const Dflash2SelectorDims& d,
                                                  const Dflash2SelectorTensors<const T>& w, const T* logits,
                                                  const T* z, int n, int32_t anchor_token);

}  // namespace df
