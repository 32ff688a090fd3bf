// Model FLOP counts of the two halves of the pipeline: the target forward per token and one drafter training
// step. The benchmarks divide them by measured time (TFLOP/s), and `plan flops` prints them so that rates on
// a card that is not here (benchmarks/seed_machine.py) follow from an efficiency measured on one that is.
#pragma once
#include <cstdint>
#include <vector>

#include "model/drafter.h"
#include "model/qwen_config.h"

namespace df {

// FLOPs per token of a target forward over the first `layers_run` decoder layers, sequences of `seq_len`:
//   2 · active non-embedding parameters of those layers (each weight one multiply-add; the embedding is a
//   gather; lm_head is not run on targets),
// + per full-attention layer 4 · heads · hd · (average causal context (L+1)/2)   (Q Kᵀ and P V),
// + per DeltaNet layer nv · (chunk FLOPs / C) with, per chunk of C = 64 and head dims dk, dv:
//   K Kᵀ, Q Kᵀ (2·C²·dk each), A V' (2·C²·dv), the triangular solve (C²·(dk+dv)), W S, Q S, Kᵀ V'
//   (2·C·dk·dv each).
double target_forward_flops_per_token(const QwenConfig& c, int64_t seq_len, int layers_run);

// Model FLOPs of one drafter step (forward + backward) over `anchors` of a batch of `context_rows` tokens:
//   6 · (per-layer q, k, v, o, gate, up, down params) · layers · N block rows    (fwd 2, dX 2, dW 2 per
//   weight)
// + 6 · (k, v params) · layers · T context rows                                    (context K/V: fwd, dX, dW)
// + 4 · (fc params) · T                                                             (fc fwd + dW; taps need
// no dX)
// + 4 · H · V · labelled rows                                                       (lm_head fwd + dX; head
// frozen)
//   (offsets k = 1..B−1 with a + k inside the anchor's sequence, Domino with shift_label slots k = 0..B−1
//   with a + k + 1 inside it; a loss mask of all ones),
// + DSpark's target distributions, 2 · H · V · distinct target positions the labelled slots read (slot k of
//   anchor a reads a + k, k = 0..B−1 inside the sequence), and its head over the N block rows: 6 · R·V (Markov
//   bias fwd, dU, dW2) + 6 · the gated or RNN projection's and the confidence head's params,
// + Domino's head over the N block rows: 4 · 3G·H (GRU input projection fwd + dW; the embeddings are
//   frozen) + 6 · 3G·G (recurrence) + 6 · E·(H + G) + 6 · E·V (correction MLP), with G = gru_hidden_dim
//   and E = emb_dim,
// + attention: per layer, query row and head, 4 · hd · keys_seen forward (QKᵀ, PV) and 2.5× that backward
//   (recomputed S, dV, dP, dQ, dK), keys_seen counted exactly from the anchors and the layer's mask.
// `seq_lens` gives the sequences of the batch (anchor.seq indexes it); padding blocks (pos < 0) count
// nothing.
double drafter_step_flops(const DrafterConfig& c, const std::vector<DrafterAnchor>& anchors,
                          const std::vector<int64_t>& seq_lens);

}  // namespace df
