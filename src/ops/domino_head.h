// Domino's head and loss (drafter.kind = "domino"; SpecForge a6b6b023 domino.py, OnlineDominoModel): the
// exact fp32 math of one block on the host, forward and analytic backward, and the greedy proposals of
// decoding: the oracle that the CPU backend's ops are made of and the CUDA ops are checked against. The
// backbone (model/drafter.h) gives the normed draft hidden z [B, H] of a block; this adds a GRU over the
// target embeddings of the block's gold tokens and a logit correction.
//
//   GRU (bias-free, PyTorch gate order r, z, n), h_{-1} = 0, input e_i = embed(x[min(a+i, len-1)]):
//     r = σ(W_ir e + W_hr h),  u = σ(W_iz e + W_hz h),
//     n = tanh(W_in e + r ⊙ (W_hn h)),  h' = (1-u) ⊙ n + u ⊙ h
//   slot k ≥ s (s = suffix_start): final_k = base_k + P1 · silu(P0 · [z_k ; h_{k-lag}]),
//   base_k = lm_head z_k; slot k < s: final_k = base_k.
//   lag = 0 with shift_label (slot k predicts x[a+k+1]), else 1 (slot k predicts x[a+k]).
//   Loss terms Σ_k w_k·CE(final_k) and Σ_k w_k·CE(base_k); the step loss is
//   ((1-λ)·Σ final + λ·Σ base) / Σ w.
//
// Parameter names (the peer's, also the export names): prefix_gru.weight_ih_l0 [3G, H],
// prefix_gru.weight_hh_l0 [3G, G], embed_proj.0.weight [E, H+G], embed_proj.2.weight [V, E].
#pragma once
#include <cstdint>
#include <vector>

namespace df {

struct DominoHeadDims {
  int hidden = 0;      // H
  int gru_hidden = 0;  // G
  int emb_dim = 0;     // E
  int vocab = 0;       // V
  int block_size = 0;  // B
  int pure_draft_prefix_len = 0;
  bool shift_label = false;

  int suffix_start() const { return pure_draft_prefix_len + (shift_label ? 0 : 1); }
  int gru_lag() const { return shift_label ? 0 : 1; }
};

// The head's weights (read) or their gradients (accumulated into), row-major as named above.
template <class T>
struct DominoHeadTensors {
  T* gru_ih = nullptr;    // [3G, H]
  T* gru_hh = nullptr;    // [3G, G]
  T* proj_in = nullptr;   // [E, H+G]
  T* proj_out = nullptr;  // [V, E]
};

// One block's rows: what slot k predicts, its loss weight and the token whose embedding is GRU input k.
// Slot k's label is x[a+k+1] (shift_label) or x[a+k]; its weight exp(-max(k - off, 0)/γ) (off = 0 with
// shift_label, else 1 and slot 0 carries none) × [label inside the sequence] × loss_mask[label position];
// a padding block (anchor < 0) carries none. Positions past the sequence read its last token (the peer's
// clamped gather); they feed only slots that carry no weight.
struct DominoBlockRows {
  std::vector<int32_t> labels;  // [B]
  std::vector<int32_t> inputs;  // [B] GRU input tokens
  std::vector<double> weights;  // [B]
};
DominoBlockRows domino_block_rows(const DominoHeadDims& d, const int32_t* tokens, const uint8_t* loss_mask,
                                  int64_t len, int64_t anchor, double gamma);

// SpecForge linear_lambda_base: λ from `start` down to 0 over the first max(1, ⌊total·ratio⌋) steps, then 0,
// clamped to [0, 1]; 0 without a horizon (total_steps 0).
double domino_lambda_base(int64_t step, int64_t total_steps, double start, double decay_ratio);

struct DominoBlockLoss {
  double final_sum = 0;  // Σ_k w_k·CE(final_k)
  double base_sum = 0;   // Σ_k w_k·CE(base_k)
};

// One block forward: z [B, H] draft hidden (normed), emb [B, H] the embeddings of rows.inputs, lm_head [V, H]
// frozen. Writes the final logits [B, V] when `final_logits` is set. With `grads` set, also runs the backward
// of (1-λ)·final_sum + λ·base_sum and adds the head's parameter gradients into *grads and ∂/∂z into dz [B, H]
// (dz may be null). T = float is the oracle; T = double serves the finite-difference test.
template <class T>
DominoBlockLoss domino_block_step(const DominoHeadDims& d, const DominoHeadTensors<const T>& w,
                                  const T* lm_head, const T* z, const T* emb, const DominoBlockRows& rows,
                                  double lambda, T* final_logits, const DominoHeadTensors<T>* grads, T* dz);

// Domino's greedy proposals for one block (SpecForge DominoDraftModel._sample_draft_tokens at temperature 0):
// token 0 is `first` (the last committed token); token p = 1..B−1 is the argmax of slot p − 1 (shift_label)
// or p, whose final logits read the GRU state after the embeddings of tokens 0..p−1, the drafter's own
// proposals; a slot before suffix_start proposes its base argmax. Ties go to the lowest id. z [B, H] is the
// block's normed draft hidden, embed [V, H] the target embedding. Returns the B − 1 proposals.
template <class T>
std::vector<int32_t> domino_block_propose(const DominoHeadDims& d, const DominoHeadTensors<const T>& w,
                                          const T* lm_head, const T* embed, const T* z, int32_t first);

}  // namespace df
