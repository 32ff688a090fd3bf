// DSpark's head and loss (drafter.kind = "dspark"; SpecForge a6b6b023 dspark.py, OnlineDSparkModel): the
// exact fp32 math of one block on the host, forward and analytic backward, as the oracle that the drafter
// step and the CUDA ops are checked against. The backbone (model/drafter.h) gives the normed draft hidden z
// [B, H] of a block; this adds a low-rank Markov bias on its logits and a confidence head, and computes
// DSpark's three loss terms.
//
//   slot k (0..B-1) predicts y_k = x[a+k+1]; its previous token p_k = x[a+k] (gold in training), e_k =
//   W1[p_k] Markov bias b_k = W2 · u_k (R = markov_rank; none when R = 0) with
//     vanilla: u_k = e_k
//     gated:   u_k = σ(G [z_k ; e_k] + g) ⊙ e_k
//     rnn:     [r ; c ; o] = J [s_{k-1} ; e_k ; z_k] + j (chunks of R), s_{-1} = 0,
//              s_k = σ(r) ⊙ s_{k-1} + (1 - σ(r)) ⊙ tanh(c),  u_k = tanh(o)
//   draft logits d_k = lm_head z_k + b_k;  target distribution t_k = softmax(lm_head h^T_{a+k}), h^T the
//   target's final-norm output (frozen, no gradient)
//   CE_k = −log softmax(d_k)[y_k];  L1_k = ‖softmax(d_k) − t_k‖₁;  acc_k = clamp(1 − L1_k / 2, 0, 1) (no
//   gradient) confidence logit c_k = C [z_k ; e_k if confidence_head_with_markov] + c_b; BCE_k =
//   softplus(c_k) − acc_k · c_k (binary cross-entropy with logits against acc_k) block sums Σ w_k·CE_k, Σ
//   w_k·L1_k, Σ w_k·BCE_k; the step loss is (α_ce·Σ CE + α_l1·Σ L1 + α_conf·Σ BCE) / Σ w over the whole step
//   (train.dspark_*_alpha).
//
// Parameter names (the peer's, also the export names) and shapes: markov_head.markov_w1.weight [V, R],
// markov_head.markov_w2.weight [V, R], markov_head.gate_proj.{weight [R, H+R], bias [R]} (gated),
// markov_head.joint_proj.{weight [3R, 2R+H], bias [3R]} (rnn), confidence_head.proj.{weight [1, C], bias [1]}
// with C = H (+ R with confidence_head_with_markov).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"

namespace df {

// DSpark's Markov bias on the logits, one of three head types (the math of each is above).
enum class DrafterMarkovHead : uint8_t { vanilla, gated, rnn };

struct DSparkHeadDims {
  int hidden = 0;       // H
  int vocab = 0;        // V
  int block_size = 0;   // B
  int markov_rank = 0;  // R; 0: no Markov head
  DrafterMarkovHead markov_head_type = DrafterMarkovHead::vanilla;
  bool confidence = false;              // enable_confidence_head
  bool confidence_with_markov = false;  // confidence_head_with_markov

  int confidence_in() const { return hidden + (confidence_with_markov ? markov_rank : 0); }
};

// One trainable tensor of the head, in the drafter's parameter table: matrices get weight decay and the
// GEMM shadow, bias vectors do not.
struct DSparkHeadParam {
  std::string name;
  int64_t rows = 0, cols = 0;
  bool matrix = false;
};
std::vector<DSparkHeadParam> dspark_head_params(const DSparkHeadDims& d);

// The head's weights (read) or their gradients (accumulated into), row-major as named above; a part the
// head type or the config lacks stays null.
template <class T>
struct DSparkHeadTensors {
  T* markov_w1 = nullptr;  // [V, R]
  T* markov_w2 = nullptr;  // [V, R]
  T* gate_w = nullptr;     // [R, H+R]
  T* gate_b = nullptr;     // [R]
  T* joint_w = nullptr;    // [3R, 2R+H]
  T* joint_b = nullptr;    // [3R]
  T* conf_w = nullptr;     // [C]
  T* conf_b = nullptr;     // [1]
};

// One block's rows. Slot k's label is x[a+k+1], its previous token x[a+k], its target distribution comes from
// the target's final hidden state at position a+k (the one that predicts the label). Its weight is exp(-k/γ)
// (1 with γ = 0: SpecForge's loss_decay_gamma unset)
// while every label up to and including slot k lies inside the sequence and is in the loss mask (SpecForge's
// cumulative eval mask: the first hole ends the block's loss), else 0; a padding block (anchor < 0) carries
// none. Positions past the sequence read its last token; they feed only weightless slots.
struct DSparkBlockRows {
  std::vector<int32_t> labels;      // [B]
  std::vector<int32_t> prev;        // [B]
  std::vector<int64_t> target_pos;  // [B] positions in the sequence
  std::vector<double> weights;      // [B]
};
DSparkBlockRows dspark_block_rows(const DSparkHeadDims& d, const int32_t* tokens, const uint8_t* loss_mask,
                                  int64_t len, int64_t anchor, double gamma);

// train.dspark_ce_loss_alpha, dspark_l1_loss_alpha, dspark_confidence_head_alpha.
struct DSparkLossAlphas {
  double ce = 0.1, l1 = 0.9, confidence = 1.0;
};
DSparkLossAlphas dspark_loss_alphas(const TrainSection& t);

struct DSparkBlockLoss {
  double ce_sum = 0;          // Σ_k w_k·CE_k
  double l1_sum = 0;          // Σ_k w_k·L1_k (0 without a target distribution)
  double confidence_sum = 0;  // Σ_k w_k·BCE_k (0 without a confidence head or with α_conf = 0)
};

// Whether a step with these settings reads the target's final hidden state: for the L1 term and for the
// confidence head's target (SpecForge's need_target).
bool dspark_needs_target_hidden(const DSparkHeadDims& d, const DSparkLossAlphas& alpha);

// One block: z [B, H] draft hidden (normed), lm_head [V, H] frozen, target_hidden [B, H] the target's final
// hidden at rows.target_pos (may be null unless dspark_needs_target_hidden). Writes the draft logits [B, V]
// and the confidence logits [B] where those pointers are set. With `grads` set, also runs the backward of
// α_ce·ce_sum + α_l1·l1_sum + α_conf·confidence_sum, adding the head's parameter gradients into *grads and
// ∂/∂z into dz [B, H] (dz may be null). T = float is the oracle; T = double serves the finite-difference
// test.
template <class T>
DSparkBlockLoss dspark_block_step(const DSparkHeadDims& d, const DSparkHeadTensors<const T>& w,
                                  const T* lm_head, const T* z, const T* target_hidden,
                                  const DSparkBlockRows& rows, const DSparkLossAlphas& alpha, T* draft_logits,
                                  T* confidence_logits, const DSparkHeadTensors<T>* grads, T* dz);

// DSpark's greedy proposals for one block, with the labels training shifts (slot k predicts x[a+k+1]): token
// 0 is `first` (the last committed token); token p = 1..B−1 is the argmax of slot p − 1's draft logits
// lm_head z_{p−1} + the Markov bias of previous token p − 1, the drafter's own proposal (the RNN head's state
// runs over slots 0..p−1, as DSparkDraftModel's sample_block_tokens; SpecForge's spec_generate hands that
// sampler slots 1..B−1 instead, one slot later than its own training labels). Ties go to the lowest id. z [B, H] is
// the block's normed draft hidden; slot B − 1 proposes nothing. When `confidence` is set and the head has a
// confidence head, it gets the confidence logit of each proposal's slot (B − 1 values; input [z ; W1[prev]]
// with confidence_head_with_markov): σ of it estimates the probability that the target accepts the proposal.
template <class T>
std::vector<int32_t> dspark_block_propose(const DSparkHeadDims& d, const DSparkHeadTensors<const T>& w,
                                          const T* lm_head, const T* z, int32_t first,
                                          std::vector<double>* confidence);

}  // namespace df
