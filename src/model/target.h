// The frozen target model (Qwen3 dense or Qwen3.5/3.6 hybrid): weights in one backend block, loaded from
// a Hugging Face checkpoint or drawn at random, and the backbone forward with hidden-state taps.
//
// Load-time fusion (the math is unchanged): q_proj's per-head [q | gate] rows are regrouped to
// [all q | all gate] and concatenated with k_proj and v_proj into one projection; the DeltaNet's
// in_proj_qkv, in_proj_z, in_proj_b, in_proj_a become one; gate_proj and up_proj become one. Each layer
// then runs three or four GEMMs whose output columns are used in place through column views.
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "model/qwen_config.h"
#include "ops/ops.h"

namespace df {

struct TargetLayer {
  LayerKind kind = LayerKind::full_attention;
  Tensor ln1, ln2;  // f32 [1, H]
  // full attention
  Tensor w_qkv;     // [heads·hd (q) | heads·hd (gate, if gated) | kv·hd (k) | kv·hd (v), H]
  Tensor w_o;       // [H, heads·hd]
  Tensor q_norm, k_norm;  // f32 [1, hd]
  // linear attention (Gated DeltaNet)
  Tensor w_in;      // [2·nk·dk + nv·dv (qkv) | nv·dv (z) | nv (b) | nv (a), H]
  Tensor conv_w;    // f32 [2·nk·dk + nv·dv, K]
  Tensor A_log, dt_bias;  // f32 [1, nv]
  Tensor gdn_norm;  // f32 [1, dv]
  Tensor w_out;     // [H, nv·dv]
  // MLP
  Tensor w_gate_up;  // [2·I, H]
  Tensor w_down;     // [H, I]
  // FP8 target on a backend with FP8 GEMMs (Ops::fp8_gemm): the six projections above hold e4m3 codes
  // (DType::f8_e4m3) and these their per-output-channel scales, f32 [1, rows of the weight]. The DeltaNet b / a
  // rows stay bf16 in w_in_ba [2·nv, H] (w_in's last 2·nv rows of codes are zero and unused). Empty otherwise.
  // From a 128x128 block checkpoint (TargetModel::fp8_group) the scales are its blocks' instead, f32
  // [FP8 rows / 128, fp8_block_scale_ld(K)] (ops/ops.h), the codes the file's.
  Tensor s_qkv, s_o, s_in, s_out, s_gate_up, s_down;
  Tensor w_in_ba;
  // Mixture-of-experts MLP (QwenConfig::layer_is_moe; model/target_moe.h): the router [E, H] and the experts
  // (ops.h MoeWeights) in place of w_gate_up / w_down, which stay empty.
  Tensor w_router;
  MoeWeights moe;

  // The six projections in this order (a layer's mixer leaves either w_qkv / w_o or w_in / w_out empty).
  std::array<const Tensor*, 6> projections() const { return {&w_qkv, &w_o, &w_in, &w_out, &w_gate_up, &w_down}; }
};

struct TargetModel {
  QwenConfig cfg;
  Ops* ops = nullptr;
  int num_loaded_layers = 0;  // layers [0, num_loaded_layers) are present (early stop needs no more)
  Tensor embed;               // [V, H]
  Tensor final_norm;          // f32 [1, H]
  Tensor lm_head;             // [V, H]; empty unless requested (== embed when tied)
  std::vector<TargetLayer> layers;
  void* block = nullptr;      // the one backend allocation holding every tensor above
  size_t block_bytes = 0;
  bool fp8 = false;           // target.dtype = "fp8": see target_linear
  bool fp8_codes = false;     // ... on a backend with FP8 GEMMs: projections are codes + scales (TargetLayer)
  // ... from a 128x128 block-scaled checkpoint, computed with its own numbers: the projections are the file's
  // codes and block scales (no re-rounding; on the CPU their dequantised values) and each linear layer's input
  // is quantised per token per fp8_group (128) columns, as inference engines run these releases. 0: per-channel
  // weights and per-token inputs.
  int64_t fp8_group = 0;

  TargetModel() = default;
  ~TargetModel();
  TargetModel(const TargetModel&) = delete;
  TargetModel& operator=(const TargetModel&) = delete;
};

struct TargetLoadOptions {
  int num_layers = -1;         // load layers [0, num_layers); −1 = all
  bool need_lm_head = false;   // the soft-KL loss needs target logits
  // FP8 compute (target.dtype = "fp8"): the linear layers' weights are rounded to e4m3 per output channel
  // once loaded, except the DeltaNet b / a rows (kept in bf16, as the official FP8 releases keep
  // in_proj_a / in_proj_b); embeddings, lm_head, norms and the conv stay as they are. On a backend with FP8
  // GEMMs the projections are held as codes + scales (1 byte a weight), never as bf16. A checkpoint in
  // 128x128 FP8 blocks keeps its own codes and block scales instead (TargetModel::fp8_group), on both
  // backends; other block sizes are dequantised (code · block scale) and then rounded per output channel.
  bool fp8 = false;
};

// Loads a Hugging Face checkpoint directory (config.json + safetensors, single or sharded; text-only
// `model.` or multimodal `model.language_model.` names; `mtp.*` and `model.visual.*` ignored). A missing or
// mis-shaped tensor is an error naming it and the expected shape.
std::unique_ptr<TargetModel> target_load(const std::string& dir, Ops& ops, const TargetLoadOptions& opt);

// Random weights from a config and a seed (demos, tests, benchmarks): identical on every backend.
std::unique_ptr<TargetModel> target_random(const QwenConfig& cfg, uint64_t seed, Ops& ops,
                                           const TargetLoadOptions& opt);

// The target a run config's [target] section names, the same on every rank: target.model's checkpoint, else
// random weights of `arch` (target.random_config's) from target.random_seed; FP8 where target.dtype = "fp8".
std::unique_ptr<TargetModel> target_load_for_run(const TargetSection& t, const QwenConfig& arch, Ops& ops,
                                                 int num_layers, bool need_lm_head);

struct TargetSaveOptions {
  // > 0: store the decoder's large projections (fp8_quantized_weight) as block-scaled FP8 in blocks of
  // fp8_block_n × fp8_block_k with f32 weight_scale_inv, and say so in config.json's quantization_config.
  int fp8_block_n = 0;
  int fp8_block_k = 0;
};

// Writes a model (loaded or random) as a Hugging Face checkpoint (config.json + model.safetensors, f32 or,
// with fp8 blocks, FP8 projections as the official Qwen FP8 releases store them).
void target_save_hf(const TargetModel& m, const std::string& dir, const TargetSaveOptions& opt = {});

// What a forward pass produces, into caller-owned tensors of act dtype [T, H].
struct TargetOutputs {
  std::vector<int> tap_layers;   // decoder layer ids whose outputs are wanted (HF hidden_states[l+1])
  std::vector<Tensor> taps;      // one per tap layer
  bool want_embeddings = false;  // HF hidden_states[0]
  Tensor embeddings;
  bool want_final_norm = false;  // HF last_hidden_state
  Tensor final_norm;
};

// The backbone forward. The workspace is planned once for max_tokens and reused for every batch.
class TargetForward {
 public:
  TargetForward(const TargetModel& model, int64_t max_tokens);
  ~TargetForward();
  TargetForward(const TargetForward&) = delete;
  TargetForward& operator=(const TargetForward&) = delete;

  // ids: i32 [1, T] in backend memory (validated < vocab by the caller). Stops after the last layer needed.
  void run(const Tensor& ids, const SeqLayout& seqs, TargetOutputs& out);
  size_t workspace_bytes() const { return ws_bytes_; }
  // The layer after which nothing more is needed for these outputs (−1: only embeddings).
  int last_needed_layer(const TargetOutputs& out) const;

 private:
  struct Workspace;
  void plan(Arena& arena);
  GdnShape gdn_shape() const;
  // n_quantised: the norm that made n also left its FP8 codes (norm_for_linear).
  void layer_full(const TargetLayer& L, const SeqLayout& seqs, int64_t T, bool n_quantised);
  void layer_linear(const TargetLayer& L, const SeqLayout& seqs, int64_t T, bool n_quantised);
  // n = rmsnorm(h) with weight w for the linear layers that read it next; with FP8 codes the norm also leaves
  // n's codes and scales in the FP8 input buffers (and with tail, n as code · scale for in_proj's bf16 b / a
  // rows), so those linears skip their own quantise pass. Returns whether it did.
  bool norm_for_linear(const Tensor& w, bool tail, int64_t T);

  const TargetModel& m_;
  Ops& ops_;
  int64_t max_tokens_;
  void* ws_block_ = nullptr;
  size_t ws_bytes_ = 0;
  std::unique_ptr<Workspace> ws_;
};

// The FP8 GEMMs' input: e4m3 codes f8_e4m3 [≥ T, ≥ max K] and per-token scales f32 [1, ≥ T], planned by a
// forward for its largest batch. Empty unless the model holds FP8 codes (TargetModel::fp8_codes).
struct Fp8Inputs {
  Tensor codes;
  Tensor scales;
};
// Plans `in` for T tokens of model m (nothing unless m.fp8_codes).
void fp8_inputs_plan(const TargetModel& m, int64_t T, Arena& a, Fp8Inputs& in);

// A linear layer of the target, out = x · wᵀ + beta · out, w_scale its FP8 scales (TargetLayer s_*, empty
// unless fp8_codes), ba the bf16 tail of w_in (nullptr for the others). On an FP8 target x's rows are first
// rounded to e4m3 per token (in place where the FP8 GEMM is emulated: x is that GEMM's input alone), so with
// the per-channel weights the product is what a row-wise-scaled FP8 GEMM with fp32 accumulation computes;
// with a block-scaled checkpoint's own weights (m.fp8_group) per token per 128 columns, the 1x128 x 128x128
// block-scaled GEMM's product; with codes, x is quantised into q and the FP8 GEMM runs; x_quantised: q already
// holds x's per-token codes (an Ops::rmsnorm_fp8 made x, with write_back where there is a tail; never with
// m.fp8_group).
void target_linear(const TargetModel& m, const Fp8Inputs& q, const Tensor& x, const Tensor& w,
                   const Tensor& w_scale, const Tensor& out, float beta, const Tensor* ba = nullptr,
                   bool x_quantised = false);

// One layer's MLP on T rows: h += down(silu(gate(n)) · up(n)), with proj [≥ T, 2I] and act [≥ T, I] as
// scratch (act unused with FP8 codes: Ops::swiglu_fp8 makes the down projection's input codes directly).
// Shared by the forward and the incremental decoder (model/target_decode.h).
void target_mlp(const TargetModel& m, const Fp8Inputs& q, const TargetLayer& L, const Tensor& n,
                const Tensor& proj, const Tensor& act, const Tensor& h, int64_t T, bool n_quantised = false);

// A packed SeqLayout for the given sequence lengths, with offsets and positions uploaded to the backend
// into tensors carved from `arena`.
SeqLayout seq_layout_make(const std::vector<int32_t>& lengths, Ops& ops, Arena& arena);

}  // namespace df
