// Drafter -> Hugging Face folder. Besides the keys MODELS.md lists, config.json carries the Qwen3Config keys
// that the public z-lab DFlash checkpoints set and that loaders read when present (attention_bias,
// hidden_act, max_position_embeddings, max_window_layers, ...), with the values this drafter actually has.
#include "train/export_hf.h"

#include <filesystem>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/file_util.h"
#include "model/qwen_config.h"
#include "model/safetensors.h"
#include "train/init_from.h"

namespace df {

nlohmann::json drafter_hf_config(const DrafterConfig& c, int num_target_layers,
                                 int64_t max_position_embeddings) {
  drafter_config_validate(c);
  DF_CHECK(num_target_layers > 0, "export: num_target_layers is %d; pass the target model's layer count",
           num_target_layers);
  for (int id : c.target_layer_ids)
    DF_CHECK(id >= 0 && id < num_target_layers,
             "export: target layer id %d is outside the target's %d layers "
             "(wrong num_target_layers?)",
             id, num_target_layers);
  nlohmann::json j;
  j["architectures"] = {"DFlashDraftModel"};
  j["model_type"] = "qwen3";
  j["block_size"] = c.block_size;
  j["dflash_config"] = {{"mask_token_id", c.mask_token_id},
                        {"target_layer_ids", c.target_layer_ids},
                        {"block_size", c.block_size}};
  if (c.kind == DrafterKind::domino) {
    // SpecForge's export as its normaliser (scripts/gates/normalize_dflash_export.py) leaves it for SGLang:
    // architectures DFlashDraftModel, the head named by projector_type and its keys in dflash_config.
    j["dflash_config"]["projector_type"] = drafter_kind_name(c.kind);
    j["dflash_config"]["pure_draft_prefix_len"] = c.pure_draft_prefix_len;
    j["dflash_config"]["emb_dim"] = c.emb_dim;
    j["dflash_config"]["gru_hidden_dim"] = c.gru_hidden_dim;
    j["dflash_config"]["shift_label"] = c.shift_label;
  }
  if (c.kind == DrafterKind::dflash2) {
    // SpecForge's DFlash2DraftModel (and SGLang's loader) is named by its architecture, its keys in
    // dflash_config; final_logit_softcapping absent means none there.
    j["architectures"] = {"DFlash2DraftModel"};
    j["dflash_config"]["conv_kernel_size"] = c.conv_kernel_size;
    j["dflash_config"]["conv_group_size"] = c.conv_group_size;
    j["dflash_config"]["selector_rank"] = c.selector_rank;
    j["dflash_config"]["selector_top_k"] = c.selector_top_k;
    j["dflash_config"]["output_multiplier"] = float_for_json(c.output_multiplier);
    if (c.final_logit_softcapping > 0)
      j["dflash_config"]["final_logit_softcapping"] = float_for_json(c.final_logit_softcapping);
  }
  if (c.kind == DrafterKind::dspark) {
    // As SpecForge's normaliser (normalize_dflash_export.py _normalize_dspark) leaves it for SGLang's
    // standalone DSpark: architectures Qwen3DSparkModel, the head's keys in dflash_config (as
    // DSparkDraftModel saves them) and its four shape keys also at the top level. The normaliser refuses a
    // drafter without a Markov head, so does this.
    DF_CHECK(c.markov_rank > 0,
             "export: drafter.markov_rank is 0, but SpecForge's DSpark export layout (and SGLang's "
             "Qwen3DSparkModel) needs a Markov head; HINT: train with markov_rank > 0");
    j["architectures"] = {"Qwen3DSparkModel"};
    nlohmann::json& dc = j["dflash_config"];
    dc["projector_type"] = drafter_kind_name(c.kind);
    dc["attention_mode"] = c.kv_heads < c.heads ? "gqa" : "mha";
    dc["markov_rank"] = c.markov_rank;
    dc["markov_head_type"] = drafter_markov_head_name(c.markov_head_type);
    dc["enable_confidence_head"] = c.enable_confidence_head;
    dc["confidence_head_with_markov"] = c.confidence_head_with_markov;
    dc["confidence_head_alpha"] = float_for_json(c.confidence_head_alpha);
    for (const char* key :
         {"markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov"})
      j[key] = dc[key];
  }
  j["hidden_size"] = c.hidden;
  j["intermediate_size"] = c.intermediate;
  j["num_hidden_layers"] = c.layers;
  j["num_attention_heads"] = c.heads;
  j["num_key_value_heads"] = c.kv_heads;
  j["head_dim"] = c.head_dim;
  j["num_target_layers"] = num_target_layers;
  j["rms_norm_eps"] = float_for_json(c.rms_eps);
  j["rope_theta"] = float_for_json(c.rope_theta);
  nlohmann::json types = nlohmann::json::array();
  bool any_sliding = false;
  int leading_full = 0;  // old-style Qwen configs slide on layers >= max_window_layers
  for (DrafterLayerType t : c.layer_types) {
    types.push_back(drafter_layer_type_hf_name(t));
    if (t == DrafterLayerType::sliding) any_sliding = true;
    if (!any_sliding) ++leading_full;
  }
  j["layer_types"] = types;
  // transformers' Qwen3Config keeps sliding_window only when use_sliding_window is set; mirror that.
  j["use_sliding_window"] = any_sliding;
  j["sliding_window"] = any_sliding ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
  j["max_window_layers"] = leading_full;
  j["vocab_size"] = c.vocab;
  j["tie_word_embeddings"] = false;
  j["dtype"] = "bfloat16";
  j["torch_dtype"] = "bfloat16";  // the pre-5.x transformers spelling of dtype
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["max_position_embeddings"] = max_position_embeddings;
  j["rope_scaling"] = nullptr;
  j["initializer_range"] = 0.02;
  j["use_cache"] = true;
  return j;
}

void drafter_export_hf(const std::string& dir, const DrafterModel& model, int num_target_layers,
                       int64_t max_position_embeddings) {
  const std::string config_text =
      drafter_hf_config(model.config(), num_target_layers, max_position_embeddings).dump(2) + "\n";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  DF_CHECK(!ec, "export: cannot create the folder %s: %s", dir.c_str(), ec.message().c_str());

  const DrafterParamTable& table = model.table();
  std::vector<uint16_t> bf16(size_t(table.total));
  std::vector<float> scratch;
  std::vector<StWriteTensor> tensors;
  for (const auto& e : table.entries) {
    scratch.resize(size_t(e.rows * e.cols));
    model.ops().download_raw(model.entry_view(model.params, e.name), scratch.data());
    uint16_t* out = bf16.data() + e.offset;
    for (size_t i = 0; i < scratch.size(); ++i) out[i] = f32_to_bf16(scratch[i]);
    tensors.push_back({e.name, DType::bf16, drafter_param_hf_shape(model.config(), e), out});
  }
  // Weights first: a folder with a config.json always has the weights that go with it.
  safetensors_write(dir + "/model.safetensors", tensors, {{"format", "pt"}});
  file_write_text_atomic(dir + "/config.json", config_text);
}

void drafter_export_hf_folder(const std::string& in, const std::string& out, TrainOps& ops) {
  std::string file;
  const nlohmann::json j = qwen_config_read_json(in, &file);
  const auto layers = j.find("num_target_layers");
  DF_CHECK(layers != j.end() && layers->is_number_integer(),
           "export: %s has no integer num_target_layers (the target's layer count, which SGLang reads); "
           "HINT: add it to the drafter's config.json",
           file.c_str());
  int64_t max_positions = 262144;
  if (const auto it = j.find("max_position_embeddings"); it != j.end() && it->is_number_integer())
    max_positions = it->get<int64_t>();
  DrafterModel model(drafter_config_from_hf_json(j, file), ops);
  drafter_load_hf_weights(model, in);
  drafter_export_hf(out, model, layers->get<int>(), max_positions);
}

}  // namespace df
