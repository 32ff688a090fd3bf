// The target shapes the end-to-end benchmarks run with random weights: Qwen3.6-27B (48 Gated DeltaNet + 16
// gated full-attention layers, 3:1) and Qwen3-8B, as their Hugging Face config.json give them. One copy for
// bench_target_forward and bench_target_decode, so both measure the same model.
#pragma once
#include <nlohmann/json.hpp>

#include "model/qwen_config.h"

namespace df {

inline QwenConfig config_qwen36_27b() {
  nlohmann::json types = nlohmann::json::array();
  for (int i = 0; i < 64; ++i) types.push_back(i % 4 == 3 ? "full_attention" : "linear_attention");
  nlohmann::json j = {{"model_type", "qwen3_5_text"},   {"hidden_size", 5120},
                      {"num_hidden_layers", 64},        {"layer_types", types},
                      {"intermediate_size", 17408},     {"vocab_size", 248320},
                      {"num_attention_heads", 24},      {"num_key_value_heads", 4},
                      {"head_dim", 256},                {"attn_output_gate", true},
                      {"partial_rotary_factor", 0.25},  {"rope_theta", 1e7},
                      {"rms_norm_eps", 1e-6},           {"linear_num_key_heads", 16},
                      {"linear_num_value_heads", 48},   {"linear_key_head_dim", 128},
                      {"linear_value_head_dim", 128},   {"linear_conv_kernel_dim", 4},
                      {"tie_word_embeddings", false}};
  return qwen_config_from_json(j, "Qwen3.6-27B shapes");
}

inline QwenConfig config_qwen3_8b() {
  nlohmann::json j = {{"model_type", "qwen3"},        {"hidden_size", 4096},     {"num_hidden_layers", 36},
                      {"intermediate_size", 12288},   {"vocab_size", 151936},    {"num_attention_heads", 32},
                      {"num_key_value_heads", 8},     {"head_dim", 128},         {"rope_theta", 1e6},
                      {"rms_norm_eps", 1e-6},         {"tie_word_embeddings", false}};
  return qwen_config_from_json(j, "Qwen3-8B shapes");
}

}  // namespace df
