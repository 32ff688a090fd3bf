// The target model's architecture as read from a Hugging Face config.json (model_type qwen3, qwen3_5,
// qwen3_5_text, the mixture-of-experts qwen3_moe, qwen3_5_moe, qwen3_5_moe_text and qwen3_next, also nested under
// text_config), parsed once into this struct with every key checked.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/norm_kind.h"

namespace df {

enum class ModelFamily : uint8_t {
  qwen3,    // dense: plain RMSNorm, full RoPE, no output gate
  qwen3_5,  // hybrid: zero-centred RMSNorm, partial RoPE, gated attention + Gated DeltaNet layers
};

enum class LayerKind : uint8_t { full_attention, linear_attention };

struct QwenConfig {
  ModelFamily family = ModelFamily::qwen3;
  std::string model_type;  // as written in the file (text part for multimodal configs)
  int hidden = 0;
  int layers = 0;
  int intermediate = 0;
  int vocab = 0;
  float rms_eps = 1e-6f;
  bool tie_word_embeddings = false;
  std::vector<LayerKind> layer_types;  // size == layers; all full_attention for qwen3

  // full attention
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  float rope_theta = 1e6f;
  int rot_dim = 0;                 // head_dim · partial_rotary_factor (even)
  bool attn_output_gate = false;   // q_proj rows per head are [q | gate]

  // linear attention (Gated DeltaNet), qwen3_5 only
  int lin_nk = 0;    // linear_num_key_heads
  int lin_nv = 0;    // linear_num_value_heads
  int lin_dk = 0;    // linear_key_head_dim
  int lin_dv = 0;    // linear_value_head_dim
  int conv_kernel = 0;  // linear_conv_kernel_dim

  // quantization_config of a block-scaled FP8 checkpoint (quant_method "fp8", e4m3): weights stored as
  // F8_E4M3 with a scale per [fp8_block_n rows × fp8_block_k columns] block. 0 = not quantised. The loader
  // dequantises at load time, so this changes how the file is read, not what the model computes in.
  int fp8_block_n = 0;
  int fp8_block_k = 0;

  // Mixture of experts (qwen3_moe, qwen3_5_moe; MODELS.md "Mixture-of-experts MLP"): in a sparse layer the MLP is
  // a router over num_experts SwiGLU experts of width moe_intermediate, the top experts_per_tok of each token
  // weighted by their softmax probabilities (renormalised to sum to 1 with norm_topk_prob), plus, where
  // shared_intermediate > 0, a shared expert scaled by sigmoid(shared_expert_gate · x). Dense layers (qwen3_moe's
  // mlp_only_layers / decoder_sparse_step) keep the plain MLP of width `intermediate`, which is 0 when no layer is
  // dense.
  int num_experts = 0;
  int experts_per_tok = 0;
  int moe_intermediate = 0;
  int shared_intermediate = 0;
  bool norm_topk_prob = false;
  std::vector<uint8_t> moe_layers;  // size == layers; 1 where the layer's MLP is the sparse block

  bool is_moe() const { return num_experts > 0; }
  // qwen3_next: a Qwen3.5-family hybrid whose DeltaNet input projections come fused per key head
  // (in_proj_qkvz, in_proj_ba: for each key head its q, k, then its value heads' v and z; then its value heads'
  // b and a), regrouped at load time into Qwen3.5's in_proj_qkv / z / b / a; otherwise it computes as a
  // qwen3_5_moe model whose dense layers (mlp_only_layers, decoder_sparse_step) keep the plain MLP.
  bool per_key_head_gdn_proj() const { return model_type == "qwen3_next"; }
  bool layer_is_moe(int l) const { return l >= 0 && size_t(l) < moe_layers.size() && moe_layers[size_t(l)] != 0; }

  NormKind norm_kind() const { return family == ModelFamily::qwen3_5 ? NormKind::zero_centred : NormKind::plain; }
  int num_linear_layers() const;
  int num_full_layers() const;
  // Non-embedding parameter count: every expert (what the weights occupy).
  double params_non_embedding() const;
  // The part one token multiplies with: the router, its experts_per_tok experts and the shared expert in place
  // of all experts (FLOP accounting); equal to params_non_embedding for a dense model.
  double params_active_non_embedding() const;
  // Parameters of decoder layer `l` (norms, mixer, MLP); `active`: an MoE layer's router, experts_per_tok
  // experts and shared expert instead of every expert.
  double layer_params(int l, bool active) const;
};

// Parses a config.json object. `where` names the source in error messages. Throws df::Error naming the key
// on a missing, mistyped or inconsistent value and on an unknown model_type.
QwenConfig qwen_config_from_json(const nlohmann::json& j, const std::string& where);
// Reads DIR/config.json (or a .json file path).
QwenConfig qwen_config_load(const std::string& path);
// The parsed JSON of DIR/config.json (or a .json file path); *file_out receives the file's path.
nlohmann::json qwen_config_read_json(const std::string& path, std::string* file_out = nullptr);
// The HF config.json a model with this config would carry (used when writing random models).
nlohmann::json qwen_config_to_json(const QwenConfig& c);
// The shortest decimal that reads back as the same float, as a double: how a written config.json says a
// float (1e-06, not 9.99999997e-07); two floats print alike with %.9g only when they are equal.
double float_for_json(float f);
// One-line summary for logs.
std::string qwen_config_summary(const QwenConfig& c);
// The mixture-of-experts part of it ("MoE in 40 of 40 layers: top-8 of 256 experts × 512 ..."); MoE configs only.
std::string qwen_config_moe_summary(const QwenConfig& c);

}  // namespace df
