// Shared fixture of the drafter tests: a tiny but awkward config (2 layers: sliding then full, GQA 4/2,
// block 4, window 5), a packed batch of sequences of lengths 11, 1, 13 with holes in the loss mask, random
// taps, frozen embedding/lm_head and target final hidden states, all from fixed seeds.
#pragma once
#include <memory>
#include <vector>

#include "model/drafter.h"
#include "ops/cpu/cpu_train_ops.h"
#include "train/anchors.h"
#include "core/rng.h"

namespace df::testing {

inline DrafterConfig tiny_drafter_config() {
  DrafterConfig c;
  c.hidden = 16;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 8;
  c.intermediate = 24;
  c.rope_theta = 10000.0f;
  c.rms_eps = 1e-6f;
  c.block_size = 4;
  c.vocab = 37;
  c.mask_token_id = 36;
  c.target_layer_ids = {1, 3};
  c.layer_types = {DrafterLayerType::sliding, DrafterLayerType::full};
  c.sliding_window = 5;
  c.num_anchors = 3;
  return c;
}

// The same drafter with a Domino head (odd GRU and projection sizes).
inline DrafterConfig tiny_domino_config(bool shift_label = true, int pure_draft_prefix_len = 1) {
  DrafterConfig c = tiny_drafter_config();
  c.kind = DrafterKind::domino;
  c.pure_draft_prefix_len = pure_draft_prefix_len;
  c.emb_dim = 7;
  c.gru_hidden_dim = 5;
  c.shift_label = shift_label;
  return c;
}

// The same drafter as DFlash2 (2 taps in groups of 4 channels, selector rank 3); top_k = vocab makes the
// candidate set every token, so the loss is smooth for finite differences.
inline DrafterConfig tiny_dflash2_config(int top_k = 37) {
  DrafterConfig c = tiny_drafter_config();
  c.kind = DrafterKind::dflash2;
  c.conv_kernel_size = 2;
  c.conv_group_size = 4;
  c.selector_rank = 3;
  c.selector_top_k = top_k;
  c.output_multiplier = 1.0f;
  return c;
}

// The same drafter with a DSpark head: an odd Markov rank, the confidence head over [h ; W1[prev]] when there
// is a Markov head.
inline DrafterConfig tiny_dspark_config(DrafterMarkovHead type = DrafterMarkovHead::vanilla, int rank = 3,
                                        bool confidence = true) {
  DrafterConfig c = tiny_drafter_config();
  c.kind = DrafterKind::dspark;
  c.markov_rank = rank;
  c.markov_head_type = type;
  c.enable_confidence_head = confidence;
  c.confidence_head_with_markov = confidence && rank > 0;
  c.confidence_head_alpha = confidence ? 1.0f : 0.0f;
  return c;
}

inline std::vector<float> normal_vec(size_t n, float std, uint64_t seed) {
  Rng r(seed);
  std::vector<float> v(n);
  for (auto& x : v) x = float(std * r.normal());
  return v;
}

// Plans m's workspace for batches of up to `tokens` tokens and `blocks` blocks, soft-KL and noise included.
inline void plan_workspace(DrafterModel& m, int64_t tokens, int64_t blocks) {
  DrafterLimits lim;
  lim.max_tokens = tokens;
  lim.max_blocks = blocks;
  lim.kl = true;
  lim.noise = true;
  drafter_plan_workspace(m, lim);
}

// Owns the host memory behind a DrafterBatch and the frozen tables.
struct TinySetup {
  DrafterConfig cfg = tiny_drafter_config();
  CpuTrainOps ops;
  std::unique_ptr<DrafterModel> model;
  std::vector<float> taps, target_hidden, embed, lm_head;
  DrafterBatch batch;

  explicit TinySetup(std::vector<int64_t> lens = {11, 1, 13}, uint64_t seed = 7,
                     const DrafterConfig& c = tiny_drafter_config())
      : cfg(c) {
    model = std::make_unique<DrafterModel>(cfg, ops);
    drafter_init_params(*model, seed);
    batch.offsets = {0};
    for (int64_t l : lens) batch.offsets.push_back(batch.offsets.back() + l);
    const int64_t T = batch.offsets.back(), H = cfg.hidden;
    Rng r(seed + 1);
    for (int64_t t = 0; t < T; ++t) {
      batch.tokens.push_back(int32_t(r.below(uint64_t(cfg.vocab - 1))));
      batch.loss_mask.push_back(t % 7 == 5 ? 0 : 1);
    }
    taps = normal_vec(size_t(T * H * cfg.num_taps()), 1.0f, seed + 2);
    target_hidden = normal_vec(size_t(T * H), 1.0f, seed + 3);
    embed = normal_vec(size_t(cfg.vocab * H), 1.0f, seed + 4);
    lm_head = normal_vec(size_t(cfg.vocab * H), 0.3f, seed + 5);
    batch.taps = tensor_make(taps.data(), DType::f32, Device::cpu, T, H * cfg.num_taps());
    batch.target_hidden = tensor_make(target_hidden.data(), DType::f32, Device::cpu, T, H);
    model->set_frozen(tensor_make(embed.data(), DType::f32, Device::cpu, cfg.vocab, H),
                      tensor_make(lm_head.data(), DType::f32, Device::cpu, cfg.vocab, H));
    plan_workspace(*model, T, 4 * T);  // an anchor at every token, with room for padding blocks
  }

  float* params() { return model->params.ptr<float>(); }
  float* grads() { return model->grads.ptr<float>(); }
};

}  // namespace df::testing
