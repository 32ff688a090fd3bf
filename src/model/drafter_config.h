// The DFlash drafter's architecture (MODELS.md "DFlash drafter") and the three places it is read from: a run
// config's [drafter] section with the target, a checkpoint's stored drafter_config JSON, and a Hugging Face
// DFlash config.json (z-lab's, or what `dflash_mpi export` writes). The last two, and the comparisons that a
// resume and drafter.init_from make, walk the one list of fields, drafter_config_fields.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/config.h"
#include "model/qwen_config.h"
#include "ops/dspark_head.h"

namespace df {

enum class DrafterLayerType : uint8_t { sliding, full };
// The drafter's head and loss terms over the one backbone (MODELS.md "Drafter kinds beyond DFlash").
enum class DrafterKind : uint8_t { dflash, domino, dspark, dflash2 };

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
  DrafterKind kind = DrafterKind::dflash;
  // Domino's head (config.h DrafterSection has the meaning); 0 / false for any other kind.
  int pure_draft_prefix_len = 0;
  int emb_dim = 0;
  int gru_hidden_dim = 0;
  bool shift_label = false;
  // DFlash2's convolutions and candidate selector (config.h DrafterSection has the meaning); 0 for any other
  // kind. final_logit_softcapping 0: none (SpecForge's absent key).
  int conv_kernel_size = 0;
  int conv_group_size = 0;
  int selector_rank = 0;
  int selector_top_k = 0;
  float output_multiplier = 0.0f;
  float final_logit_softcapping = 0.0f;
  // DSpark's head (config.h DrafterSection has the meaning); 0 / vanilla / false for any other kind.
  int markov_rank = 0;
  DrafterMarkovHead markov_head_type = DrafterMarkovHead::vanilla;
  bool enable_confidence_head = false;
  bool confidence_head_with_markov = false;
  float confidence_head_alpha = 0.0f;

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

// A DrafterConfig field's names: its key in a checkpoint's drafter_config JSON, the run-config key that sets
// it (or what fixes it: the target), and its Hugging Face config.json key (null: config.json has none;
// mask_token_id, target_layer_ids and block_size may sit inside dflash_config; the kind's keys sit there).
struct DrafterField {
  const char* key;
  const char* run_key;
  const char* hf_key;
};

// Calls f(field, c.member) for every field of c (a DrafterConfig, const or not), in the order a resume lists
// its changes.
template <class C, class F>
void drafter_config_fields(C& c, F&& f) {
  f(DrafterField{"layers", "drafter.layers", "num_hidden_layers"}, c.layers);
  f(DrafterField{"heads", "drafter.heads", "num_attention_heads"}, c.heads);
  f(DrafterField{"kv_heads", "drafter.kv_heads", "num_key_value_heads"}, c.kv_heads);
  f(DrafterField{"head_dim", "drafter.head_dim", "head_dim"}, c.head_dim);
  f(DrafterField{"intermediate", "drafter.intermediate", "intermediate_size"}, c.intermediate);
  f(DrafterField{"block_size", "drafter.block_size", "block_size"}, c.block_size);
  f(DrafterField{"mask_token_id", "drafter.mask_token_id", "mask_token_id"}, c.mask_token_id);
  f(DrafterField{"target_layer_ids", "drafter.target_layer_ids", "target_layer_ids"}, c.target_layer_ids);
  f(DrafterField{"layer_types", "drafter.layer_types", "layer_types"}, c.layer_types);
  f(DrafterField{"sliding_window", "drafter.sliding_window", "sliding_window"}, c.sliding_window);
  f(DrafterField{"rope_theta", "drafter.rope_theta", "rope_theta"}, c.rope_theta);
  f(DrafterField{"rms_eps", "drafter.rms_norm_eps", "rms_norm_eps"}, c.rms_eps);
  f(DrafterField{"num_anchors", "drafter.num_anchors", nullptr}, c.num_anchors);
  f(DrafterField{"hidden", "target (hidden size)", "hidden_size"}, c.hidden);
  f(DrafterField{"vocab", "target (vocabulary)", "vocab_size"}, c.vocab);
  // The kind and its head: SpecForge's dflash_config keys (projector_type absent = dflash).
  f(DrafterField{"kind", "drafter.kind", "projector_type"}, c.kind);
  f(DrafterField{"pure_draft_prefix_len", "drafter.pure_draft_prefix_len", "pure_draft_prefix_len"},
    c.pure_draft_prefix_len);
  f(DrafterField{"emb_dim", "drafter.emb_dim", "emb_dim"}, c.emb_dim);
  f(DrafterField{"gru_hidden_dim", "drafter.gru_hidden_dim", "gru_hidden_dim"}, c.gru_hidden_dim);
  f(DrafterField{"shift_label", "drafter.shift_label", "shift_label"}, c.shift_label);
  f(DrafterField{"conv_kernel_size", "drafter.conv_kernel_size", "conv_kernel_size"}, c.conv_kernel_size);
  f(DrafterField{"conv_group_size", "drafter.conv_group_size", "conv_group_size"}, c.conv_group_size);
  f(DrafterField{"selector_rank", "drafter.selector_rank", "selector_rank"}, c.selector_rank);
  f(DrafterField{"selector_top_k", "drafter.selector_top_k", "selector_top_k"}, c.selector_top_k);
  f(DrafterField{"output_multiplier", "drafter.output_multiplier", "output_multiplier"}, c.output_multiplier);
  f(DrafterField{"final_logit_softcapping", "drafter.final_logit_softcapping", "final_logit_softcapping"},
    c.final_logit_softcapping);
  f(DrafterField{"markov_rank", "drafter.markov_rank", "markov_rank"}, c.markov_rank);
  f(DrafterField{"markov_head_type", "drafter.markov_head_type", "markov_head_type"}, c.markov_head_type);
  f(DrafterField{"enable_confidence_head", "drafter.enable_confidence_head", "enable_confidence_head"},
    c.enable_confidence_head);
  f(DrafterField{"confidence_head_with_markov", "drafter.confidence_head_with_markov",
                 "confidence_head_with_markov"},
    c.confidence_head_with_markov);
  f(DrafterField{"confidence_head_alpha", "drafter.confidence_head_alpha", "confidence_head_alpha"},
    c.confidence_head_alpha);
}

// Every field of c with its value as messages show it, in drafter_config_fields order: what the comparisons
// of two drafter configs (resume, drafter.init_from) walk side by side. Equal text means an equal value (a
// float is written with the fewest digits that read back as the same float); lists read [a, b], layer types
// by their HF names.
struct DrafterFieldText {
  DrafterField field;
  std::string text;
};
std::vector<DrafterFieldText> drafter_config_texts(const DrafterConfig& c);

// "dflash" | "domino" | "dspark" | "dflash2": drafter.kind's spelling, also SpecForge's
// dflash_config.projector_type (absent = dflash; a DFlash2 drafter is named by its architecture,
// DFlash2DraftModel, instead).
const char* drafter_kind_name(DrafterKind k);
// The kind named `name`; throws naming `where` and the accepted names.
DrafterKind drafter_kind_parse(const std::string& name, const std::string& where);
// "vanilla" | "gated" | "rnn": drafter.markov_head_type, SpecForge's dflash_config spelling.
const char* drafter_markov_head_name(DrafterMarkovHead h);
// The head named `name` (any case, as SpecForge lowercases it); throws naming `where` and the accepted names.
DrafterMarkovHead drafter_markov_head_parse(const std::string& name, const std::string& where);

// "sliding_attention" | "full_attention", the HF layer_types spelling.
const char* drafter_layer_type_hf_name(DrafterLayerType t);
bool drafter_config_any_sliding(const DrafterConfig& c);

// The checkpoint's drafter_config: a JSON object under each field's key, and back (every key required; errors
// name `where` and the key; the result is validated).
std::string drafter_config_json(const DrafterConfig& c);
DrafterConfig drafter_config_from_json(const std::string& text, const std::string& where);

// A DFlash drafter config.json object, in either layout: `block_size` / `rope_theta` at the top level, or
// inside `dflash_config` / `rope_parameters` (dflash_config wins when both hold a key). The Qwen3 keys are
// read by the target's parser (model/qwen_config.h), which also refuses anything but model_type qwen3.
// num_anchors is a training setting and keeps its default. `where` names the file in messages.
DrafterConfig drafter_config_from_hf_json(const nlohmann::json& j, const std::string& where);
// DIR/config.json (or a .json file path).
DrafterConfig drafter_config_load_hf(const std::string& path);

}  // namespace df
