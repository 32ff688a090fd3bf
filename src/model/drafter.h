// The DFlash drafter (MODELS.md "DFlash drafter"): config, the one parameter table over flat fp32 buffers
// (params, grads, Adam m, v) and the training step. The model calls TrainOps only, so the CPU oracle and the
// CUDA backend run the same definition.
//
// How the training pipeline drives it (one optimizer step = several micro-batches on several drafters):
//
//   CpuTrainOps ops;                                   // or the CUDA TrainOps
//   DrafterModel model(cfg, ops);                      // allocates params/grads/m/v, zero
//   drafter_init_params(model, seed);                  // or load a checkpoint into model.params
//   model.set_frozen(embed, lm_head);                  // target embedding and lm_head [V, H], not owned
//   for each step:
//     drafter_zero_grads(model);
//     LossStats st;
//     for each micro-batch:
//       anchors = anchors_sample_batch(batch, cfg.num_anchors, rng);           // train/anchors.h
//       st.merge(drafter_forward_backward(model, batch, anchors, opts));       // grads += ∂(Σ w·L)
//     all-reduce model.grads and (st.loss_sum, st.weight_sum) among drafters;
//     adamw_step(model, optim, step, 1.0 / total_weight_sum);                  // train/optimizer.h
//
// Gradients accumulate the *unnormalised* Σ w·L, so the caller divides once by Σ w of the whole step
// (grad_scale of adamw_step): the loss is then Σ w·L / Σ w over all micro-batches of all drafters.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"
#include "model/qwen_config.h"
#include "ops/train_ops.h"
#include "train/loss.h"

namespace df {

enum class DrafterLayerType : uint8_t { sliding, full };

struct DrafterConfig {
  int hidden = 0;                        // = the target's hidden size H
  int layers = 0;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int intermediate = 0;
  float rope_theta = 1e7f;
  float rms_eps = 1e-6f;
  int block_size = 16;                   // B
  int mask_token_id = 0;
  std::vector<int> target_layer_ids;     // taps: outputs of these target layers, concatenated (k = size)
  std::vector<DrafterLayerType> layer_types;  // size == layers
  int sliding_window = 2048;             // W, used by sliding layers
  int num_anchors = 512;                 // per sequence
  int vocab = 0;                         // the target's vocabulary (embedding and lm_head rows)

  int num_taps() const { return int(target_layer_ids.size()); }
};

// Throws df::Error naming the offending field and what it must satisfy.
void drafter_config_validate(const DrafterConfig& c);
// The DFlash default taps for a target of `target_layers` layers: round(1 + i·(L−4)/(n−1)), i = 0..n−1.
std::vector<int> drafter_default_target_layer_ids(int target_layers, int n);
// The drafter a run config describes for this target: hidden size and vocabulary from the target, taps
// resolved (drafter.target_layer_ids, else the default), intermediate 0 = the target's; validated, errors
// name the config key.
DrafterConfig drafter_config_from_run(const Config& cfg, const QwenConfig& target);

// One trainable tensor inside the flat buffers. Names are the Hugging Face export names (MODELS.md).
struct DrafterParamEntry {
  std::string name;
  int64_t rows = 0, cols = 0;
  int64_t offset = 0;  // elements from the start of the flat buffer, 64-element aligned (256-byte loads)
  bool decay = false;  // matrices get weight decay, norm vectors do not
};

struct DrafterParamTable {
  std::vector<DrafterParamEntry> entries;  // matrices first, then vectors: decayed elements are [0, n_decay)
  int64_t total = 0;                       // flat buffer length, including alignment padding
  int64_t n_decay = 0;
  const DrafterParamEntry& find(const std::string& name) const;  // throws naming the tensor
};

DrafterParamTable drafter_param_table(const DrafterConfig& c);

// Views of one flat buffer as the model's tensors (used for params and for grads alike).
struct DrafterLayerTensors {
  Tensor input_layernorm, q_proj, k_proj, v_proj, o_proj, q_norm, k_norm, post_attention_layernorm, gate_proj,
      up_proj, down_proj;
};
struct DrafterTensors {
  Tensor fc, hidden_norm, norm;
  std::vector<DrafterLayerTensors> layers;
};

// The packed micro-batch a drafter trains on: S sequences back to back (positions restart at 0 in each).
struct DrafterBatch {
  std::vector<int64_t> offsets;     // S+1, offsets[0] = 0, offsets[S] = T
  std::vector<int32_t> tokens;      // [T] host copy (block inputs and labels)
  std::vector<uint8_t> loss_mask;   // [T] host copy
  Tensor taps;                      // f32 [T, k·H] backend memory: concatenated target layer outputs
  Tensor target_hidden;             // f32 [T, H] target final-norm output; only for the soft-KL loss
  int num_seqs() const { return int(offsets.size()) - 1; }
};

// One block: anchor position `pos` within sequence `seq`; pos < 0 marks a padding block (no loss, sees nothing).
struct DrafterAnchor {
  int32_t seq = 0;
  int32_t pos = -1;
};

class DrafterModel {
 public:
  DrafterModel(const DrafterConfig& cfg, TrainOps& ops);
  ~DrafterModel();
  DrafterModel(const DrafterModel&) = delete;
  DrafterModel& operator=(const DrafterModel&) = delete;

  // The frozen target embedding and lm_head, both [vocab, hidden]; not owned, must outlive the model's use.
  void set_frozen(const Tensor& embed, const Tensor& lm_head);

  const DrafterConfig& config() const { return cfg_; }
  const DrafterParamTable& table() const { return table_; }
  TrainOps& ops() const { return *ops_; }
  Tensor entry_view(const Tensor& flat, const std::string& name) const;  // one named tensor of a flat buffer

  // Flat f32 [1, table.total] buffers: the fp32 master weights, gradients and Adam moments.
  Tensor params, grads, adam_m, adam_v;
  DrafterTensors w;  // views into params
  DrafterTensors g;  // views into grads
  Tensor embed, lm_head;

  // Activation workspace, grown on demand by drafter_forward_backward (planned with a counting arena).
  void* workspace = nullptr;
  size_t workspace_bytes = 0;

 private:
  DrafterConfig cfg_;
  DrafterParamTable table_;
  TrainOps* ops_;
  void* flat_ = nullptr;
};

// Deterministic init from a seed: matrices N(0, 0.02²) (HF initializer_range), norm weights 1.
void drafter_init_params(DrafterModel& m, uint64_t seed);
void drafter_zero_grads(DrafterModel& m);

// Forward over all blocks of the micro-batch, the loss through the frozen lm_head and (opts.backward) the
// analytic backward, accumulating ∂(Σ w·L)/∂θ into m.grads. Returns Σ w·L, Σ w, accuracy and τ counts.
// anchors: any number of blocks, in any order; padding blocks (pos < 0) are allowed.
LossStats drafter_forward_backward(DrafterModel& m, const DrafterBatch& batch, const std::vector<DrafterAnchor>& anchors,
                                   const DrafterLossOptions& opts);

}  // namespace df
