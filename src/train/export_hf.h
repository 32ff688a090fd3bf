// Hugging Face export of a trained drafter (MODELS.md "Export format"): config.json plus model.safetensors in
// bf16 under the parameter table's names, the layout SGLang and vLLM load as a DFlash draft model.
#pragma once
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "model/drafter.h"

namespace df {

// The config.json object. max_position_embeddings bounds the context a server allows the draft (vLLM takes
// the smaller of draft and target), so the default is the largest Qwen3.5/3.6 context rather than the HF
// 32768.
nlohmann::json drafter_hf_config(const DrafterConfig& c, int num_target_layers,
                                 int64_t max_position_embeddings = 262144);

// Writes <dir>/model.safetensors (every parameter rounded to nearest-even bf16; norm vectors 1-D [n],
// matrices [rows, cols]) and then <dir>/config.json, each atomically; the folder is created when missing.
// Throws naming the file on failure.
void drafter_export_hf(const std::string& dir, const DrafterModel& model, int num_target_layers,
                       int64_t max_position_embeddings = 262144);

// Rewrites the Hugging Face drafter folder `in` (SpecForge's own save, a published drafter: anything
// drafter.init_from reads) into `out` in the layout above, which SGLang loads: its config.json read as
// init_from reads it (num_target_layers required, max_position_embeddings kept when present), its weights
// loaded through init_from's strict reader into a model on `ops`, then drafter_export_hf.
void drafter_export_hf_folder(const std::string& in, const std::string& out, TrainOps& ops);

}  // namespace df
