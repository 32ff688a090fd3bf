// Qwen config parsing: the published Qwen3-8B and Qwen3.6-27B config.json files (as JSON literals), the
// qwen3_5_text form, odd small configs, the error messages for broken files, and the to_json round trip.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/qwen_config.h"

using namespace df;
using json = nlohmann::json;

namespace {

// Qwen/Qwen3-8B config.json (transformers 4.51 era: rope_theta at the top level, rope_scaling null).
const char* kQwen3_8B = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 12288,
  "max_position_embeddings": 40960,
  "max_window_layers": 36,
  "model_type": "qwen3",
  "num_attention_heads": 32,
  "num_hidden_layers": 36,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "sliding_window": null,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.0",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// Qwen/Qwen3.6-27B config.json: multimodal wrapper, text part under text_config, rope in rope_parameters.
// layer_types is added by the test (the file lists it; the interval alone must give the same answer).
const char* kQwen36_27B = R"({
  "architectures": ["Qwen3_5ForConditionalGeneration"],
  "image_token_id": 248056,
  "model_type": "qwen3_5",
  "text_config": {
    "attention_bias": false,
    "attention_dropout": 0.0,
    "attn_output_gate": true,
    "bos_token_id": null,
    "dtype": "bfloat16",
    "eos_token_id": 248044,
    "full_attention_interval": 4,
    "head_dim": 256,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "initializer_range": 0.02,
    "intermediate_size": 17408,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 48,
    "linear_value_head_dim": 128,
    "mamba_ssm_dtype": "float32",
    "max_position_embeddings": 262144,
    "model_type": "qwen3_5_text",
    "mtp_num_hidden_layers": 1,
    "mtp_use_dedicated_embeddings": false,
    "num_attention_heads": 24,
    "num_hidden_layers": 64,
    "num_key_value_heads": 4,
    "pad_token_id": null,
    "partial_rotary_factor": 0.25,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {
      "mrope_interleaved": true,
      "mrope_section": [11, 11, 10],
      "partial_rotary_factor": 0.25,
      "rope_theta": 10000000,
      "rope_type": "default"
    },
    "tie_word_embeddings": false,
    "use_cache": true,
    "vocab_size": 248320
  },
  "tie_word_embeddings": false,
  "transformers_version": "4.57.0.dev0",
  "video_token_id": 248057,
  "vision_config": {
    "deepstack_visual_indexes": [],
    "depth": 27,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_size": 1152,
    "in_channels": 3,
    "initializer_range": 0.02,
    "intermediate_size": 4304,
    "model_type": "qwen3_5",
    "num_heads": 16,
    "num_position_embeddings": 2304,
    "out_hidden_size": 5120,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2
  },
  "vision_end_token_id": 248054,
  "vision_start_token_id": 248053
})";

// Qwen/Qwen3-30B-A3B config.json, the architecture keys (token ids, max_window_layers and the like left out).
const char* kQwen3_30B_A3B = R"({
  "architectures": ["Qwen3MoeForCausalLM"],
  "decoder_sparse_step": 1,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "intermediate_size": 6144,
  "mlp_only_layers": [],
  "model_type": "qwen3_moe",
  "moe_intermediate_size": 768,
  "norm_topk_prob": true,
  "num_attention_heads": 32,
  "num_experts": 128,
  "num_experts_per_tok": 8,
  "num_hidden_layers": 48,
  "num_key_value_heads": 4,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000.0,
  "tie_word_embeddings": false,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

// Qwen/Qwen3.6-35B-A3B config.json's text part as the model card describes it (40 layers of [3 DeltaNet, 1
// gated attention] x 10, 256 experts of 512, top-8 plus one shared expert of 512), in the multimodal wrapper;
// it carries intermediate_size and mlp_only_layers keys that Qwen3_5MoeTextConfig drops.
const char* kQwen36_35B_A3B = R"({
  "architectures": ["Qwen3_5MoeForConditionalGeneration"],
  "model_type": "qwen3_5_moe",
  "text_config": {
    "attn_output_gate": true,
    "full_attention_interval": 4,
    "head_dim": 256,
    "hidden_size": 2048,
    "intermediate_size": 512,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_value_head_dim": 128,
    "mlp_only_layers": [],
    "model_type": "qwen3_5_moe_text",
    "moe_intermediate_size": 512,
    "num_attention_heads": 16,
    "num_experts": 256,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 40,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {"mrope_interleaved": true, "mrope_section": [11, 11, 10], "rope_type": "default",
                        "rope_theta": 10000000, "partial_rotary_factor": 0.25},
    "shared_expert_intermediate_size": 512,
    "vocab_size": 248320
  },
  "tie_word_embeddings": false
})";

// A small qwen3_5_text config in the transformers 5.x layout, awkward sizes, explicit layer_types.
json small_q35() {
  return json::parse(R"({
    "model_type": "qwen3_5_text",
    "hidden_size": 19, "num_hidden_layers": 3, "intermediate_size": 7, "vocab_size": 65,
    "num_attention_heads": 3, "num_key_value_heads": 1, "head_dim": 6,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": true,
    "layer_types": ["linear_attention", "full_attention", "linear_attention"],
    "linear_num_key_heads": 1, "linear_num_value_heads": 3, "linear_key_head_dim": 5,
    "linear_value_head_dim": 7, "linear_conv_kernel_dim": 3,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.34}
  })");
}

// Expects the parse to throw a df::Error whose message contains every fragment.
void expect_error(const json& j, std::initializer_list<const char*> fragments,
                  const char* where = "cfg.json") {
  try {
    qwen_config_from_json(j, where);
    ADD_FAILURE() << "no error for " << j.dump();
  } catch (const Error& e) {
    for (const char* f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}

void expect_same(const QwenConfig& a, const QwenConfig& b) {
  EXPECT_EQ(a.family, b.family);
  EXPECT_EQ(a.hidden, b.hidden);
  EXPECT_EQ(a.layers, b.layers);
  EXPECT_EQ(a.intermediate, b.intermediate);
  EXPECT_EQ(a.vocab, b.vocab);
  EXPECT_EQ(a.rms_eps, b.rms_eps);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.layer_types, b.layer_types);
  EXPECT_EQ(a.heads, b.heads);
  EXPECT_EQ(a.kv_heads, b.kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rot_dim, b.rot_dim);
  EXPECT_EQ(a.attn_output_gate, b.attn_output_gate);
  EXPECT_EQ(a.lin_nk, b.lin_nk);
  EXPECT_EQ(a.lin_nv, b.lin_nv);
  EXPECT_EQ(a.lin_dk, b.lin_dk);
  EXPECT_EQ(a.lin_dv, b.lin_dv);
  EXPECT_EQ(a.conv_kernel, b.conv_kernel);
  EXPECT_EQ(a.num_experts, b.num_experts);
  EXPECT_EQ(a.experts_per_tok, b.experts_per_tok);
  EXPECT_EQ(a.moe_intermediate, b.moe_intermediate);
  EXPECT_EQ(a.shared_intermediate, b.shared_intermediate);
  EXPECT_EQ(a.norm_topk_prob, b.norm_topk_prob);
  EXPECT_EQ(a.moe_layers, b.moe_layers);
}

}  // namespace

TEST(QwenConfig, Qwen3_8B) {
  QwenConfig c = qwen_config_from_json(json::parse(kQwen3_8B), "Qwen3-8B/config.json");
  EXPECT_EQ(c.family, ModelFamily::qwen3);
  EXPECT_EQ(c.model_type, "qwen3");
  EXPECT_EQ(c.hidden, 4096);
  EXPECT_EQ(c.layers, 36);
  EXPECT_EQ(c.intermediate, 12288);
  EXPECT_EQ(c.vocab, 151936);
  EXPECT_EQ(c.heads, 32);
  EXPECT_EQ(c.kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rot_dim, 128);
  EXPECT_EQ(c.rope_theta, 1e6f);
  EXPECT_EQ(c.rms_eps, 1e-6f);
  EXPECT_FALSE(c.attn_output_gate);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.num_full_layers(), 36);
  EXPECT_EQ(c.num_linear_layers(), 0);
  EXPECT_EQ(c.lin_nk, 0);
  EXPECT_EQ(c.norm_kind(), NormKind::plain);
  // Qwen3-8B has 8.19 B parameters, 2 × 151936 × 4096 = 1.245 B of them in embed_tokens and lm_head.
  EXPECT_NEAR(c.params_non_embedding(), 6.95e9, 0.01e9);
  const std::string s = qwen_config_summary(c);
  EXPECT_NE(s.find("36 layers"), std::string::npos) << s;
  EXPECT_NE(s.find("hidden 4096"), std::string::npos) << s;
}

TEST(QwenConfig, Qwen36_27B_Multimodal) {
  json j = json::parse(kQwen36_27B);
  QwenConfig from_interval = qwen_config_from_json(j, "Qwen3.6-27B/config.json");
  json lt = json::array();
  for (int g = 0; g < 16; ++g)
    for (const char* s : {"linear_attention", "linear_attention", "linear_attention", "full_attention"})
      lt.push_back(s);
  j["text_config"]["layer_types"] = lt;
  QwenConfig c = qwen_config_from_json(j, "Qwen3.6-27B/config.json");
  expect_same(c, from_interval);

  EXPECT_EQ(c.family, ModelFamily::qwen3_5);
  EXPECT_EQ(c.model_type, "qwen3_5_text");
  EXPECT_EQ(c.hidden, 5120);
  EXPECT_EQ(c.layers, 64);
  EXPECT_EQ(c.intermediate, 17408);
  EXPECT_EQ(c.vocab, 248320);
  EXPECT_EQ(c.heads, 24);
  EXPECT_EQ(c.kv_heads, 4);
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.rot_dim, 64);
  EXPECT_EQ(c.rope_theta, 1e7f);
  EXPECT_TRUE(c.attn_output_gate);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.lin_nk, 16);
  EXPECT_EQ(c.lin_nv, 48);
  EXPECT_EQ(c.lin_dk, 128);
  EXPECT_EQ(c.lin_dv, 128);
  EXPECT_EQ(c.conv_kernel, 4);
  EXPECT_EQ(c.norm_kind(), NormKind::zero_centred);
  ASSERT_EQ(c.layer_types.size(), 64u);
  for (int i = 0; i < 64; ++i)
    EXPECT_EQ(c.layer_types[i], i % 4 == 3 ? LayerKind::full_attention : LayerKind::linear_attention) << i;
  EXPECT_EQ(c.num_full_layers(), 16);
  EXPECT_EQ(c.num_linear_layers(), 48);
  // By hand: 16 full layers × 104.9 M + 48 linear × 115.9 M + 64 MLPs × 267.4 M ≈ 24.35 B. The checkpoint's
  // ≈27.8 B is that plus the two 248320 × 5120 matrices (2.54 B), the vision tower and the MTP layer.
  EXPECT_GT(c.params_non_embedding(), 24.0e9);
  EXPECT_LT(c.params_non_embedding(), 25.5e9);

  // Without a model_type inside text_config the outer one is used.
  j["text_config"].erase("model_type");
  EXPECT_EQ(qwen_config_from_json(j, "x").model_type, "qwen3_5");
}

TEST(QwenConfig, Qwen35TextAndAwkwardSizes) {
  QwenConfig c = qwen_config_from_json(small_q35(), "small.json");
  EXPECT_EQ(c.family, ModelFamily::qwen3_5);
  EXPECT_EQ(c.hidden, 19);
  EXPECT_EQ(c.rot_dim, 2);  // int(6 · 0.34) = 2, transformers' truncation
  EXPECT_EQ(c.rms_eps, 1e-5f);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(c.attn_output_gate);  // qwen3_5 default
  EXPECT_EQ(c.layer_types, (std::vector<LayerKind>{LayerKind::linear_attention, LayerKind::full_attention,
                                                   LayerKind::linear_attention}));
  EXPECT_EQ(c.lin_nv, 3);
  EXPECT_EQ(c.conv_kernel, 3);

  // Defaults transformers applies to a bare qwen3_5_text config: interval 4, head_dim 256, factor 0.25,
  // 16/32 linear heads of 128, conv 4. One layer: (0+1) % 4 != 0, so it is linear.
  json bare = {{"model_type", "qwen3_5_text"},
               {"hidden_size", 7},
               {"num_hidden_layers", 1},
               {"intermediate_size", 3},
               {"vocab_size", 1},
               {"num_attention_heads", 1},
               {"rope_theta", 1e4},
               {"num_key_value_heads", 1}};
  c = qwen_config_from_json(bare, "bare.json");
  EXPECT_EQ(c.layer_types, std::vector<LayerKind>{LayerKind::linear_attention});
  EXPECT_EQ(c.head_dim, 256);
  EXPECT_EQ(c.rot_dim, 64);
  EXPECT_EQ(c.lin_nk, 16);
  EXPECT_EQ(c.lin_nv, 32);
  EXPECT_EQ(c.conv_kernel, 4);
  // full_attention_interval 1: every layer full.
  bare["num_hidden_layers"] = 3;
  bare["full_attention_interval"] = 1;
  EXPECT_EQ(qwen_config_from_json(bare, "bare.json").num_full_layers(), 3);

  // Legacy rope placement: rope_scaling holds the factor, rope_theta at the top level.
  json legacy = small_q35();
  legacy.erase("rope_parameters");
  legacy["rope_theta"] = 5e6;
  legacy["head_dim"] = 8;
  legacy["rope_scaling"] = {{"type", "mrope"}, {"partial_rotary_factor", 0.5}, {"mrope_section", {1, 1, 0}}};
  c = qwen_config_from_json(legacy, "legacy.json");
  EXPECT_EQ(c.rope_theta, 5e6f);
  EXPECT_EQ(c.rot_dim, 4);
}

TEST(QwenConfig, Qwen3Small) {
  // Tied embeddings, kv_heads = heads, head_dim ≠ hidden / heads, rope in the transformers 5.x place.
  json j = {{"model_type", "qwen3"},
            {"hidden_size", 65},
            {"num_hidden_layers", 1},
            {"intermediate_size", 19},
            {"vocab_size", 7},
            {"num_attention_heads", 3},
            {"num_key_value_heads", 3},
            {"head_dim", 4},
            {"tie_word_embeddings", true},
            {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1e6}}},
            {"layer_types", {"full_attention"}}};
  QwenConfig c = qwen_config_from_json(j, "q3.json");
  EXPECT_EQ(c.rot_dim, 4);
  EXPECT_EQ(c.rms_eps, 1e-6f);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.num_full_layers(), 1);
  // Exact count: mlp 3·65·19 + norms 2·65 + q,k,v,o 4·65·12 + q/k norms 2·4, plus the final norm 65.
  EXPECT_EQ(c.params_non_embedding(), 3.0 * 65 * 19 + 2 * 65 + 4 * 65 * 12 + 2 * 4 + 65);
  // transformers reads an explicit null num_key_value_heads as "= num_attention_heads".
  j["num_key_value_heads"] = nullptr;
  EXPECT_EQ(qwen_config_from_json(j, "q3.json").kv_heads, 3);
}

TEST(QwenConfig, ErrorsNameTheKeyAndFile) {
  json j = json::parse(kQwen3_8B);
  j.erase("hidden_size");
  expect_error(j, {"cfg.json", "hidden_size", "missing"});

  j = json::parse(kQwen3_8B);
  j["num_hidden_layers"] = "36";
  expect_error(j, {"cfg.json", "num_hidden_layers", "integer", "string"});
  j = json::parse(kQwen3_8B);
  j["num_hidden_layers"] = 36.5;
  expect_error(j, {"num_hidden_layers", "integer"});
  j = json::parse(kQwen3_8B);
  j["rms_norm_eps"] = "1e-6";
  expect_error(j, {"rms_norm_eps", "number"});
  j = json::parse(kQwen3_8B);
  j["tie_word_embeddings"] = 0;
  expect_error(j, {"tie_word_embeddings", "true or false"});

  j = json::parse(kQwen3_8B);
  j["model_type"] = "llama";
  expect_error(j, {"cfg.json", "model_type", "llama"});
  j.erase("model_type");
  expect_error(j, {"model_type", "missing"});

  j = json::parse(kQwen3_8B);
  j["num_key_value_heads"] = 5;
  expect_error(j, {"num_attention_heads (32)", "num_key_value_heads (5)"});
  j["num_key_value_heads"] = 0;
  expect_error(j, {"num_key_value_heads", "positive"});

  j = json::parse(kQwen3_8B);
  j.erase("rope_theta");
  expect_error(j, {"rope_theta", "missing"});
  j = json::parse(kQwen3_8B);
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  expect_error(j, {"rope_scaling", "yarn"});
  j = json::parse(kQwen3_8B);
  j["use_sliding_window"] = true;
  expect_error(j, {"use_sliding_window"});
  j = json::parse(kQwen3_8B);
  j["layer_types"] = json::array();
  for (int i = 0; i < 36; ++i) j["layer_types"].push_back(i == 7 ? "linear_attention" : "full_attention");
  expect_error(j, {"layer_types'[7]", "linear_attention", "qwen3"});

  json q = small_q35();
  q["layer_types"] = {"linear_attention", "full_attention"};
  expect_error(q, {"layer_types", "2 entries", "num_hidden_layers is 3"});
  q["layer_types"] = {"linear_attention", "sliding_attention", "full_attention"};
  expect_error(q, {"layer_types'[1]", "sliding_attention"});
  q["layer_types"] = {"linear_attention", 3, "full_attention"};
  expect_error(q, {"layer_types", "array of strings"});
  q["layer_types"] = "full_attention";
  expect_error(q, {"layer_types", "array"});

  q = small_q35();
  q["linear_num_value_heads"] = 4;
  q["linear_num_key_heads"] = 3;
  expect_error(q, {"linear_num_value_heads (4)", "linear_num_key_heads (3)"});
  q = small_q35();
  q["rope_parameters"]["partial_rotary_factor"] = 0.5;  // 6 · 0.5 = 3 rotary dims: odd
  expect_error(q, {"rope_parameters", "partial_rotary_factor", "even"});
  q["rope_parameters"]["partial_rotary_factor"] = 1.5;
  expect_error(q, {"partial_rotary_factor", "(0, 1]"});
  q = small_q35();
  q["rope_parameters"] = "default";
  expect_error(q, {"rope_parameters", "object"});

  json mm = json::parse(kQwen36_27B);
  mm["text_config"].erase("num_attention_heads");
  expect_error(mm, {"27b.json: text_config", "num_attention_heads"}, "27b.json");
  mm["text_config"] = 3;
  expect_error(mm, {"text_config", "object"});
  expect_error(json::array(), {"cfg.json", "JSON object"});
}

TEST(QwenConfig, Qwen3_30B_A3B) {
  const QwenConfig c = qwen_config_from_json(json::parse(kQwen3_30B_A3B), "30b.json");
  EXPECT_EQ(c.family, ModelFamily::qwen3);
  EXPECT_TRUE(c.is_moe());
  EXPECT_EQ(c.num_experts, 128);
  EXPECT_EQ(c.experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate, 768);
  EXPECT_EQ(c.shared_intermediate, 0);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.intermediate, 0);  // no dense layer: intermediate_size is unused
  EXPECT_EQ(c.moe_layers, std::vector<uint8_t>(48, 1));
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.norm_kind(), NormKind::plain);
  // Per layer: attention 2048·(4096 + 2·512) + 4096·2048 + 2·128, norms 2·2048, router 128·2048, experts
  // 128·3·2048·768 (8 of them active). With the embedding and lm_head (0.62 B): 30.5 B, 3.3 B active ("30B-A3B").
  EXPECT_EQ(c.params_non_embedding(), 48.0 * (18874624 + 4096 + 262144 + 603979776) + 2048);
  EXPECT_EQ(c.params_active_non_embedding(), 48.0 * (18874624 + 4096 + 262144 + 37748736) + 2048);
  // Without head_dim, Qwen3MoeConfig's attention takes hidden_size / num_attention_heads.
  json j = json::parse(kQwen3_30B_A3B);
  j.erase("head_dim");
  EXPECT_EQ(qwen_config_from_json(j, "30b.json").head_dim, 64);
  // Defaults: no norm_topk_prob means false; a dense layer brings intermediate_size back.
  j = json::parse(kQwen3_30B_A3B);
  j.erase("norm_topk_prob");
  j["mlp_only_layers"] = {0, 47};
  j["decoder_sparse_step"] = 2;
  const QwenConfig d = qwen_config_from_json(j, "30b.json");
  EXPECT_FALSE(d.norm_topk_prob);
  EXPECT_EQ(d.intermediate, 6144);
  for (int l = 0; l < 48; ++l) EXPECT_EQ(d.layer_is_moe(l), l != 47 && l % 2 == 1) << "layer " << l;
}

TEST(QwenConfig, Qwen36_35B_A3B_Multimodal) {
  const QwenConfig c = qwen_config_from_json(json::parse(kQwen36_35B_A3B), "35b.json");
  EXPECT_EQ(c.model_type, "qwen3_5_moe_text");
  EXPECT_EQ(c.family, ModelFamily::qwen3_5);
  EXPECT_EQ(c.num_experts, 256);
  EXPECT_EQ(c.experts_per_tok, 8);
  EXPECT_EQ(c.moe_intermediate, 512);
  EXPECT_EQ(c.shared_intermediate, 512);
  EXPECT_TRUE(c.norm_topk_prob);  // always, whatever the file says
  EXPECT_EQ(c.intermediate, 0);   // the file's intermediate_size is not a field of this model type
  EXPECT_EQ(c.moe_layers, std::vector<uint8_t>(40, 1));
  EXPECT_EQ(c.num_linear_layers(), 30);
  EXPECT_EQ(c.rot_dim, 64);
  EXPECT_EQ(c.kv_heads, 2);
  // 33.6 B (2.44 B active) + 1.02 B embedding and lm_head: "35B-A3B".
  EXPECT_NEAR(c.params_non_embedding() / 1e9, 33.64, 0.01);
  EXPECT_NEAR(c.params_active_non_embedding() / 1e9, 2.44, 0.01);
  json j = json::parse(kQwen36_35B_A3B);
  j["text_config"]["norm_topk_prob"] = false;      // deleted by Qwen3_5MoeTextConfig: ignored
  j["text_config"]["mlp_only_layers"] = {0, 1};    // likewise
  j["text_config"]["decoder_sparse_step"] = 3;     // likewise
  expect_same(c, qwen_config_from_json(j, "35b.json"));
}

TEST(QwenConfig, MoeErrorsNameTheKey) {
  json j = json::parse(kQwen3_30B_A3B);
  j["num_experts_per_tok"] = 129;
  expect_error(j, {"cfg.json", "num_experts_per_tok", "129", "1..num_experts (128)"});
  j["num_experts_per_tok"] = 0;
  expect_error(j, {"num_experts_per_tok"});
  j = json::parse(kQwen3_30B_A3B);
  j["num_local_experts"] = 64;  // Qwen3MoeConfig's own name for num_experts
  expect_error(j, {"num_experts' (128)", "num_local_experts' (64)", "disagree"});
  j.erase("num_experts");
  EXPECT_EQ(qwen_config_from_json(j, "cfg.json").num_experts, 64);
  j = json::parse(kQwen3_30B_A3B);
  j["moe_intermediate_size"] = 0;
  expect_error(j, {"moe_intermediate_size", "positive"});
  j = json::parse(kQwen3_30B_A3B);
  j["num_experts"] = -1;
  expect_error(j, {"num_experts", "negative"});
  j = json::parse(kQwen3_30B_A3B);
  j["mlp_only_layers"] = {3, 48};
  expect_error(j, {"mlp_only_layers", "layer 48", "0..47"});
  j["mlp_only_layers"] = "none";
  expect_error(j, {"mlp_only_layers", "array"});
  j["mlp_only_layers"] = {1.5};
  expect_error(j, {"mlp_only_layers", "integer"});
  j = json::parse(kQwen3_30B_A3B);
  j["decoder_sparse_step"] = 0;
  expect_error(j, {"decoder_sparse_step", "positive"});
  j = json::parse(kQwen3_30B_A3B);
  j["mlp_only_layers"] = {0};
  j["intermediate_size"] = 0;  // a dense layer needs a width
  expect_error(j, {"intermediate_size", "positive"});
  j = json::parse(kQwen3_30B_A3B);
  j["norm_topk_prob"] = "yes";
  expect_error(j, {"norm_topk_prob", "true or false"});
  json q = json::parse(kQwen36_35B_A3B);
  q["text_config"]["shared_expert_intermediate_size"] = -2;
  expect_error(q, {"text_config", "shared_expert_intermediate_size", "negative"});
  q = json::parse(kQwen36_35B_A3B);
  q["text_config"]["model_type"] = "qwen3_next";  // Qwen3-Next reads the sparse-step keys Qwen3.5-MoE drops
  q["text_config"]["decoder_sparse_step"] = 0;
  expect_error(q, {"text_config", "decoder_sparse_step", "positive"});
  q["text_config"]["decoder_sparse_step"] = 1;
  q["text_config"]["mlp_only_layers"] = {40};
  expect_error(q, {"text_config", "mlp_only_layers", "40"});
}

TEST(QwenConfig, ToJsonRoundTrips) {
  for (const json& src : {json::parse(kQwen3_8B), json::parse(kQwen36_27B), small_q35(), json::parse(kQwen3_30B_A3B),
                          json::parse(kQwen36_35B_A3B)}) {
    QwenConfig c = qwen_config_from_json(src, "src.json");
    json out = qwen_config_to_json(c);
    QwenConfig back = qwen_config_from_json(out, "out.json");
    expect_same(c, back);
    if (c.is_moe()) {
      EXPECT_EQ(out["model_type"], c.family == ModelFamily::qwen3_5 ? "qwen3_5_moe_text" : "qwen3_moe");
    } else if (c.family == ModelFamily::qwen3_5) {
      // The hybrid is written in the qwen3_5_text form transformers builds Qwen3_5ForCausalLM from.
      EXPECT_EQ(out["model_type"], "qwen3_5_text");
      EXPECT_EQ(out["layer_types"].size(), size_t(c.layers));
      const auto sec = out["rope_parameters"]["mrope_section"].get<std::vector<int>>();
      EXPECT_EQ(sec[0] + sec[1] + sec[2], c.rot_dim / 2);
    } else {
      EXPECT_EQ(out["model_type"], "qwen3");
    }
  }
  // Dense layers of a Qwen3-MoE survive as mlp_only_layers.
  json j = json::parse(kQwen3_30B_A3B);
  j["mlp_only_layers"] = {2, 5};
  const QwenConfig m = qwen_config_from_json(j, "src.json");
  expect_same(m, qwen_config_from_json(qwen_config_to_json(m), "out.json"));
  // Written decimals are the short ones.
  QwenConfig c = qwen_config_from_json(json::parse(kQwen3_8B), "src.json");
  EXPECT_EQ(qwen_config_to_json(c)["rms_norm_eps"].dump(), "1e-06");
  // A rotary width whose factor is not exact in binary still survives transformers' truncation.
  json odd = small_q35();
  odd["head_dim"] = 7;
  odd["rope_parameters"]["partial_rotary_factor"] = 2.0 / 7.0 + 1e-9;
  c = qwen_config_from_json(odd, "odd.json");
  EXPECT_EQ(c.rot_dim, 2);
  EXPECT_EQ(qwen_config_from_json(qwen_config_to_json(c), "out.json").rot_dim, 2);
}

TEST(QwenConfig, LoadFromDirectoryAndFile) {
  namespace fs = std::filesystem;
  std::string tmpl = (fs::temp_directory_path() / "df_cfg_XXXXXX").string();
  ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
  const fs::path dir = tmpl;
  { std::ofstream(dir / "config.json") << kQwen36_27B; }
  EXPECT_EQ(qwen_config_load(dir.string()).layers, 64);
  EXPECT_EQ(qwen_config_load((dir / "config.json").string()).hidden, 5120);
  { std::ofstream(dir / "broken.json") << "{\"model_type\": "; }
  try {
    qwen_config_load((dir / "broken.json").string());
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("broken.json"), std::string::npos) << e.what();
  }
  try {
    qwen_config_load((dir / "nope").string());
    ADD_FAILURE() << "no throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nope"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}
