// The FLOP formulas of model_flops.h, one term a line.
#include "model/model_flops.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/error.h"

namespace df {

namespace {

constexpr double kGdnChunk = 64;  // the chunk of the chunked Gated DeltaNet (MODELS.md; kernels/gdn)

}  // namespace

double target_forward_flops_per_token(const QwenConfig& c, int64_t seq_len, int layers_run) {
  DF_CHECK(layers_run >= 1 && layers_run <= c.layers, "target layers run %d outside 1..%d", layers_run,
           c.layers);
  DF_CHECK(seq_len >= 1, "sequence length %lld must be >= 1", (long long)seq_len);
  double params = layers_run == c.layers ? c.hidden : 0.0;  // the final norm runs only after the last layer
  int full = 0, linear = 0;
  for (int l = 0; l < layers_run; ++l) {
    params += c.layer_params(l, true);
    (c.layer_types[size_t(l)] == LayerKind::full_attention ? full : linear)++;
  }
  double f = 2.0 * params;
  f += full * 4.0 * c.heads * c.head_dim * (double(seq_len) + 1) / 2.0;
  if (linear > 0) {
    const double C = kGdnChunk, dk = c.lin_dk, dv = c.lin_dv;
    const double per_chunk =
        2 * C * C * dk + 2 * C * C * dk + 2 * C * C * dv + C * C * (dk + dv) + 3 * (2 * C * dk * dv);
    f += linear * double(c.lin_nv) * per_chunk / C;
  }
  return f;
}

double drafter_step_flops(const DrafterConfig& c, const std::vector<DrafterAnchor>& anchors,
                          const std::vector<int64_t>& seq_lens) {
  int64_t T = 0, active = 0;
  // Domino with shift_label and DSpark label slot 0 too.
  const int shift = (c.kind == DrafterKind::domino && c.shift_label) || c.kind == DrafterKind::dspark ? 1 : 0;
  for (int64_t len : seq_lens) T += len;
  for (const DrafterAnchor& an : anchors) {
    if (an.pos < 0) continue;
    DF_CHECK(an.seq >= 0 && size_t(an.seq) < seq_lens.size(), "anchor in sequence %d of a batch of %zu",
             an.seq, seq_lens.size());
    active += std::min<int64_t>(c.block_size - 1 + shift, seq_lens[size_t(an.seq)] - 1 - an.pos);
  }
  const double H = c.hidden, qd = double(c.heads) * c.head_dim, kvd = double(c.kv_heads) * c.head_dim;
  const double layer_params = qd * H * 2 + kvd * H * 2 + 3.0 * c.intermediate * H;
  const double N = double(anchors.size()) * c.block_size;
  double f = 6.0 * layer_params * c.layers * N;
  f += 6.0 * (2 * kvd * H) * c.layers * double(T);
  f += 4.0 * (H * c.num_taps() * H) * double(T);
  f += 4.0 * H * double(c.vocab) * double(active);
  if (c.kind == DrafterKind::domino) {
    const double G = c.gru_hidden_dim, E = c.emb_dim;
    f += (4.0 * 3 * G * H + 6.0 * 3 * G * G + 6.0 * E * (H + G) + 6.0 * E * double(c.vocab)) * N;
  }
  if (c.kind == DrafterKind::dspark) {
    // The target distributions (the frozen lm_head over the target's final hidden state, forward only) once
    // per distinct position a labelled slot reads (slot k of anchor a reads a + k; neighbouring anchors'
    // blocks share most: the CUDA head makes them once per logits chunk, so this is its floor), the Markov
    // bias u·W2ᵀ (forward, dU, dW2), the gated or RNN projection and the confidence head.
    int64_t distinct = 0;
    std::vector<std::vector<uint8_t>> read(seq_lens.size());
    for (size_t s = 0; s < seq_lens.size(); ++s) read[s].assign(size_t(std::max<int64_t>(0, seq_lens[s])), 0);
    for (const DrafterAnchor& an : anchors) {
      if (an.pos < 0) continue;
      const int64_t n = std::min<int64_t>(c.block_size, seq_lens[size_t(an.seq)] - 1 - an.pos);
      for (int64_t k = 0; k < n; ++k) {
        uint8_t& r = read[size_t(an.seq)][size_t(an.pos + k)];
        distinct += r == 0;
        r = 1;
      }
    }
    const double R = c.markov_rank, V = c.vocab;
    const bool gated = R > 0 && c.markov_head_type == DrafterMarkovHead::gated,
               rnn = R > 0 && c.markov_head_type == DrafterMarkovHead::rnn;
    const double proj = gated ? R * (H + R) : rnn ? 3 * R * (2 * R + H) : 0.0;
    const double conf = c.enable_confidence_head ? H + (c.confidence_head_with_markov ? R : 0.0) : 0.0;
    f += 2.0 * H * V * double(distinct);
    f += (6.0 * R * V + 6.0 * proj + 6.0 * conf) * N;
  }
  for (int l = 0; l < c.layers; ++l) {
    const int W = c.layer_types[size_t(l)] == DrafterLayerType::sliding ? c.sliding_window : 0;
    double keys = 0;
    for (const DrafterAnchor& an : anchors) {
      if (an.pos < 0) continue;
      for (int k = 0; k < c.block_size; ++k) {
        const int64_t lo = W ? std::max<int64_t>(0, int64_t(an.pos) + k - (W - 1)) : 0;
        keys += double(std::max<int64_t>(0, an.pos - lo)) + (W ? k + 1 : c.block_size);
      }
    }
    f += 3.5 * 4.0 * c.head_dim * c.heads * keys;
  }
  return f;
}

}  // namespace df
