// The DFlash drafter (MODELS.md "DFlash drafter"): config, the one parameter table over flat fp32 buffers
// (params, grads, Adam m, v, plus a bf16 shadow of params on a bf16 backend) and the training step. The model
// calls TrainOps only, so the CPU oracle and the CUDA backend run the same definition; activations are the
// backend's act_dtype (f32 on CPU, bf16 on CUDA), statistics f32/f64 (train_ops.h, Precision).
//
// How the training pipeline drives it (one optimizer step = several micro-batches on several drafters):
//
//   auto ops = train_ops_create("cuda", gpu);         // ops/ops_factory.h, or CpuTrainOps
//   DrafterModel model(cfg, *ops);                     // allocates params/grads/m/v (+ bf16 shadow), zero
//   drafter_init_params(model, seed);                  // or checkpoint_load + drafter_refresh_shadow
//   model.set_frozen(embed, lm_head);                  // frozen embedding, lm_head [V, H] (act_dtype)
//   drafter_plan_workspace(model, limits);             // the one activation allocation, largest batch
//   for each step:
//     drafter_begin_step(model);                         // grads stale: the first backward writes them
//     for each micro-batch:
//       anchors = anchors_sample_batch(batch, cfg.num_anchors, rng);           // train/anchors.h
//       drafter_accumulate(model, batch, anchors, opts);   // grads (+)= ∂(Σ w·L), statistics on the backend
//     drafter_grads_ready(model);                          // zeros if no micro-batch ran a backward
//     LossStats st = drafter_take_stats(model);            // the step's one device→host read
//     all-reduce model.grads and (st.loss_sum, st.weight_sum) among drafters;
//     adamw_step(model, optim, step, 1.0 / total_weight_sum);                  // train/optimizer.h
//
// The step's first backward writes every gradient (beta 0) and later ones add (beta 1), so no pass zero-fills
// the 4 GiB of fp32 gradients of the 8B drafter first; adamw_step refuses gradients still stale.
//
// Gradients accumulate the *unnormalised* Σ w·L, so the caller divides once by Σ w of the whole step
// (grad_scale of adamw_step): the loss is then Σ w·L / Σ w over all micro-batches of all drafters.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"
#include "model/drafter_config.h"
#include "ops/loss_rows.h"
#include "ops/train_ops.h"

namespace df {

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
// Whether `name` is a DFlash2 base kernel (layers.{i}.{attention,mlp}_conv.base_kernel, [2·taps, H] in the
// table: side s, tap t at row s·taps + t).
bool drafter_param_is_base_kernel(const std::string& name);
// A tensor's shape in a Hugging Face folder (export writes it, init_from reads it): [rows, cols], a norm
// vector [cols], a DFlash2 base kernel the peer's [2, taps, H].
std::vector<int64_t> drafter_param_hf_shape(const DrafterConfig& c, const DrafterParamEntry& e);
// Element i of a DFlash2 base kernel of `cols` channels at the identity (tap 0 of each side 1, the other taps
// 0; SpecForge DFlashGroupedConv's initialisation).
float drafter_base_kernel_identity(int64_t i, int64_t cols, int taps);

// Throws unless the step of c.kind exists on `backend` ("cpu" | "cuda"): every kind's ops run on both, and a
// config naming another backend must never silently train a DFlash drafter.
void drafter_check_kind_trainable(const DrafterConfig& c, const std::string& backend);

// The Domino head's sizes (ops/domino_head.h) of a kind = domino config.
DominoHeadDims domino_head_dims(const DrafterConfig& c);
// DFlash2's convolution and selector sizes (ops/dflash2_conv.h, ops/dflash2_selector.h) of a kind = dflash2
// config.
Dflash2ConvDims dflash2_conv_dims(const DrafterConfig& c);
Dflash2SelectorDims dflash2_selector_dims(const DrafterConfig& c);
// The DSpark head's sizes (ops/dspark_head.h) of a kind = dspark config.
DSparkHeadDims dspark_head_dims(const DrafterConfig& c);

// Views of one flat buffer as the model's tensors (used for params and for grads alike).
struct DrafterLayerTensors {
  Tensor input_layernorm, q_proj, k_proj, v_proj, o_proj, q_norm, k_norm, post_attention_layernorm, gate_proj,
      up_proj, down_proj;
  // kind = dflash2 only (layers.{i}.{attention,mlp}_conv.*), else empty.
  TrainOps::Dflash2ConvWeights attention_conv, mlp_conv;
};
struct DrafterTensors {
  Tensor fc, hidden_norm, norm;
  std::vector<DrafterLayerTensors> layers;
  TrainOps::DominoHeadWeights domino;  // kind = domino only (prefix_gru.*, embed_proj.*), else empty
  TrainOps::Dflash2SelectorWeights selector;  // kind = dflash2 only (candidate_selector.*), else empty
  TrainOps::DSparkHeadWeights dspark;  // kind = dspark only (markov_head.*, confidence_head.*), else empty
};

// The packed micro-batch a drafter trains on: S sequences back to back (positions restart at 0 in each).
struct DrafterBatch {
  std::vector<int64_t> offsets;     // S+1, offsets[0] = 0, offsets[S] = T
  std::vector<int32_t> tokens;      // [T] host copy (block inputs and labels)
  std::vector<uint8_t> loss_mask;   // [T] host copy
  Tensor taps;                      // act_dtype [T, k·H] backend memory: concatenated target layer outputs
  Tensor target_hidden;             // act_dtype [T, H] target final-norm output: the soft-KL loss's teacher,
                                    // DSpark's target distributions (drafter_streams_final_hidden)
  int num_seqs() const { return int(offsets.size()) - 1; }
};

// One block: anchor position `pos` within sequence `seq`; pos < 0 marks a padding block (no loss, sees nothing).
struct DrafterAnchor {
  int32_t seq = 0;
  int32_t pos = -1;
};

// How drafter_forward_backward weights and reports the loss rows (train/loss.h fills it from a run config).
struct DrafterLossOptions {
  LmLossKind kind = LmLossKind::ce;  // kl needs DrafterBatch::target_hidden
  float gamma = 7.0f;                // offset decay w_k = exp(−(k−1)/γ)
  // Streak-aware weighting: row k of a block is multiplied by Π_{j=1..k−1} c_j, where the smoothed
  // confidence c_j = p_draft(label_j)^α (α = streak_alpha ∈ (0, 1]) of each earlier labelled offset j, taken
  // from this forward pass and detached (no gradient flows through it). α < 1 flattens the product so one
  // unsure early offset does not silence the rest of the block. Offsets without a label contribute 1.
  // The multiplied weights enter both Σ w·L and Σ w.
  bool streak = false;
  float streak_alpha = 0.5f;
  // D-PACE row weights instead of the offset decay (the CE itself is unchanged): Σ w·CE over the step is then
  // divided by the number of sequences (LossStats::weight_sum counts sequences, not weights).
  DpaceKind dpace = DpaceKind::off;
  float dpace_alpha = 0.5f;
  // Gaussian noise on the context features (the concatenated taps) before fc; std as scheduled by
  // noise_std_at (train/optimizer.h), seed fresh per micro-batch from the training RNG.
  float noise_std = 0.0f;
  uint64_t noise_seed = 0;
  // kind = domino: λ, the weight of CE(base) in (1 − λ)·CE(final) + λ·CE(base) (ops/domino_head.h
  // domino_lambda_base schedules it); the row weights are Domino's own (domino_block_rows, γ = gamma).
  double domino_lambda = 0;
  // kind = dflash2: α, the weight of the selector's CE in Σ w·CE + α·Σ w·CE_selector (ops/dflash2_selector.h
  // dflash2_selector_alpha schedules it), and whether that term trains the selector only (stop-gradient).
  double dflash2_selector_alpha = 0;
  bool dflash2_stop_gradient = false;
  // kind = dspark: the weights of its loss terms (train.dspark_*_alpha); its row weights are its own
  // (dspark_block_rows, γ = gamma).
  DSparkLossAlphas dspark;
  // Skip the backward (evaluation). Gradients are then left untouched.
  bool backward = true;
  // Gradient checks and replays: use these per-row weights (one per block row, nb·B) instead of computing
  // them, so a finite difference sees the same constants the analytic gradient treats as detached.
  const std::vector<float>* fixed_row_weights = nullptr;
};

// What the activation workspace is planned for (drafter_plan_workspace): a micro-batch beyond it is an error.
struct DrafterLimits {
  int64_t max_tokens = 0;  // packed context tokens per micro-batch (data.token_budget)
  int64_t max_blocks = 0;  // blocks per micro-batch, padding blocks included (drafter.max_block_rows / B)
  bool kl = false;         // soft-KL loss: room for the gathered target hidden rows
  bool noise = false;      // feature noise: room for the noisy copy of the taps
};

// The limits a run config implies: data.token_budget tokens; drafter.max_block_rows / block_size blocks, or
// without a cap one block per token (anchors are distinct positions of the batch); the loss kind; noise on
// when train.noise_std > 0.
DrafterLimits drafter_limits_from_run(const Config& cfg);

// Whether the run's loss reads the target's final-norm output, so that targets run every layer and the final
// norm and stream it beside the taps ([T, H] bf16 more per batch; feature files hold it as final_norm): the
// soft-KL loss's teacher, and a DSpark drafter's target distributions (its L1 term and confidence target,
// dspark_needs_target_hidden).
bool drafter_streams_final_hidden(const Config& cfg);

class DrafterModel {
 public:
  DrafterModel(const DrafterConfig& cfg, TrainOps& ops);
  ~DrafterModel();
  DrafterModel(const DrafterModel&) = delete;
  DrafterModel& operator=(const DrafterModel&) = delete;

  // The frozen target embedding and lm_head, both act_dtype [vocab, hidden] in backend memory; not owned,
  // must outlive the model's use.
  void set_frozen(const Tensor& embed, const Tensor& lm_head);

  const DrafterConfig& config() const { return cfg_; }
  const DrafterParamTable& table() const { return table_; }
  TrainOps& ops() const { return *ops_; }
  Tensor entry_view(const Tensor& flat, const std::string& name) const;  // one named tensor of a flat buffer

  // Flat f32 [1, table.total] buffers: the fp32 master weights, gradients and Adam moments. No backward
  // writes the alignment padding between entries of grads: it keeps the zeros of the allocation
  // (drafter_zero_grads rewrites them, the all-reduce sums zeros), so the norm and AdamW can run over the
  // whole buffer.
  Tensor params, grads, adam_m, adam_v;
  // grads still hold the previous step's values (drafter_begin_step): the next backward writes every gradient
  // (beta 0) instead of adding. A backward, drafter_zero_grads and drafter_grads_ready clear it.
  bool grads_stale = false;
  // bf16 [1, table.total] copy of params (same offsets) when act_dtype is bf16, else empty: the GEMM weights.
  // AdamW rewrites it with every update; drafter_refresh_shadow after anything else writes params.
  Tensor params_lp;
  DrafterTensors w;  // matrices: views into params_lp when it exists, else params; norm vectors: params
  DrafterTensors g;  // views into grads
  Tensor embed, lm_head;
  // u8 [1, 8·LossStatsSlots::size(B)]: f64 statistics of the micro-batches since the last drafter_take_stats.
  Tensor stats;

  // Activation workspace, allocated once by drafter_plan_workspace for `limits`.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  DrafterLimits limits;

 private:
  DrafterConfig cfg_;
  DrafterParamTable table_;
  TrainOps* ops_;
  void* flat_ = nullptr;
};

// Deterministic init from a seed: matrices N(0, 0.02²) (HF initializer_range), norm weights 1. Element i of
// tensor `name` is 0.02 · rng_normal_at(seed, stream of name, i) (core/rng.h): the same values on every
// backend and for any table layout. Zeroes grads and Adam moments, refreshes the bf16 shadow.
void drafter_init_params(DrafterModel& m, uint64_t seed);
// Zero-fills m.grads (padding included) and marks them current: the backwards that follow add to zero.
void drafter_zero_grads(DrafterModel& m);
// Opens an optimizer step: marks m.grads stale, so the step's first backward writes them (beta 0) and later
// ones add (beta 1).
void drafter_begin_step(DrafterModel& m);
// Makes m.grads the step's gradient for the all-reduce and the optimizer: nothing when a backward has run
// since drafter_begin_step, else zeros (every micro-batch of the step was empty, or ran forward only).
void drafter_grads_ready(DrafterModel& m);
// params_lp = bf16(params) (round to nearest even); no-op without a shadow. Call after a checkpoint load.
void drafter_refresh_shadow(DrafterModel& m);

// Bytes of the activation workspace for these limits on a backend of activation dtype `act` (what
// drafter_plan_workspace allocates; plan vram reports it).
size_t drafter_workspace_bytes(const DrafterConfig& c, const DrafterLimits& limits, DType act);
// The one workspace allocation; a second call is an error.
void drafter_plan_workspace(DrafterModel& m, const DrafterLimits& limits);

// Forward over all blocks of the micro-batch, the loss through the frozen lm_head and (opts.backward) the
// analytic backward, adding ∂(Σ w·L)/∂θ to m.grads (writing it when they are stale: drafter_begin_step) and
// Σ w·L, Σ w, accuracy and τ counts into m.stats, with no device→host copy. anchors: any number of blocks up
// to limits.max_blocks (none: nothing runs, the gradients stay as they are), in any order; padding blocks
// (pos < 0) are allowed.
void drafter_accumulate(DrafterModel& m, const DrafterBatch& batch, const std::vector<DrafterAnchor>& anchors,
                        const DrafterLossOptions& opts);
// The statistics accumulated since the last take (one download), then zeroed.
LossStats drafter_take_stats(DrafterModel& m);
// One micro-batch as its own step (tests, evaluation): drafter_accumulate, then drafter_take_stats, with
// row_weight the final weight of every block row and row_argmax its argmax (the drafts; −1 where a row has
// no label), read back from the workspace.
LossStats drafter_forward_backward(DrafterModel& m, const DrafterBatch& batch, const std::vector<DrafterAnchor>& anchors,
                                   const DrafterLossOptions& opts);
// kind = domino: the greedy proposals (ops/domino_head.h domino_block_propose) of the one block that
// drafter_accumulate last ran, forward only, with these same arguments, from its anchor token on.
std::vector<int32_t> drafter_domino_drafts(const DrafterModel& m, const DrafterBatch& batch,
                                           const std::vector<DrafterAnchor>& anchors,
                                           const DrafterLossOptions& opts);
// kind = dflash2: the selector's greedy lattice walk (ops/dflash2_selector.h dflash2_selector_greedy_path)
// over the one block that drafter_accumulate last ran, forward only, with these same arguments, from its
// anchor token on.
std::vector<int32_t> drafter_dflash2_drafts(const DrafterModel& m, const DrafterBatch& batch,
                                            const std::vector<DrafterAnchor>& anchors,
                                            const DrafterLossOptions& opts);
// kind = dspark: the greedy proposals (ops/dspark_head.h dspark_block_propose) of the one block that
// drafter_accumulate last ran, forward only, with these same arguments, from its anchor token on;
// `confidence` (may be null) gets each proposal's confidence logit when the head has a confidence head.
std::vector<int32_t> drafter_dspark_drafts(const DrafterModel& m, const DrafterBatch& batch,
                                           const std::vector<DrafterAnchor>& anchors,
                                           const DrafterLossOptions& opts, std::vector<double>* confidence);
// The final-norm output y [nb·B, H] (row j·B + k: block j, offset k) of the step drafter_accumulate last ran
// with these same arguments, as host f32, read back from the workspace (the backward does not write it): the
// input of the lm_head loss, for tests that restate the loss.
std::vector<float> drafter_final_hidden(const DrafterModel& m, const DrafterBatch& batch,
                                        const std::vector<DrafterAnchor>& anchors, const DrafterLossOptions& opts);

}  // namespace df
