// The target shapes the end-to-end benchmarks run with random weights: Qwen3.6-27B (48 Gated DeltaNet + 16
// gated full-attention layers, 3:1), Qwen3-8B and Qwen3.6-35B-A3B (the 27B's layer pattern at hidden 2048
// with a mixture-of-experts MLP), as their Hugging Face config.json give them. One copy for
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

// Qwen/Qwen3.6-35B-A3B's text config (tests/unit/test_qwen_config.cpp holds the published file): 40 layers of
// [3 DeltaNet, 1 gated attention] x 10, every MLP top-8 of 256 experts of 512 plus a gated shared expert of
// 512.
inline QwenConfig config_qwen36_35b_a3b() {
  nlohmann::json types = nlohmann::json::array();
  for (int i = 0; i < 40; ++i) types.push_back(i % 4 == 3 ? "full_attention" : "linear_attention");
  nlohmann::json j = {{"model_type", "qwen3_5_moe_text"},
                      {"hidden_size", 2048},
                      {"num_hidden_layers", 40},
                      {"layer_types", types},
                      {"vocab_size", 248320},
                      {"num_attention_heads", 16},
                      {"num_key_value_heads", 2},
                      {"head_dim", 256},
                      {"attn_output_gate", true},
                      {"partial_rotary_factor", 0.25},
                      {"rope_theta", 1e7},
                      {"rms_norm_eps", 1e-6},
                      {"linear_num_key_heads", 16},
                      {"linear_num_value_heads", 32},
                      {"linear_key_head_dim", 128},
                      {"linear_value_head_dim", 128},
                      {"linear_conv_kernel_dim", 4},
                      {"tie_word_embeddings", false},
                      {"num_experts", 256},
                      {"num_experts_per_tok", 8},
                      {"moe_intermediate_size", 512},
                      {"shared_expert_intermediate_size", 512}};
  return qwen_config_from_json(j, "Qwen3.6-35B-A3B shapes");
}

}  // namespace df
