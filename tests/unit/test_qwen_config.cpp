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
void expect_error(const json& j, std::initializer_list<const char*> fragments, const char* where = "cfg.json") {
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
  json bare = {{"model_type", "qwen3_5_text"}, {"hidden_size", 7},           {"num_hidden_layers", 1},
               {"intermediate_size", 3},       {"vocab_size", 1},           {"num_attention_heads", 1},
               {"rope_theta", 1e4},            {"num_key_value_heads", 1}};
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
  json j = {{"model_type", "qwen3"},       {"hidden_size", 65},        {"num_hidden_layers", 1},
            {"intermediate_size", 19},     {"vocab_size", 7},          {"num_attention_heads", 3},
            {"num_key_value_heads", 3},    {"head_dim", 4},            {"tie_word_embeddings", true},
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

TEST(QwenConfig, ToJsonRoundTrips) {
  for (const json& src : {json::parse(kQwen3_8B), json::parse(kQwen36_27B), small_q35()}) {
    QwenConfig c = qwen_config_from_json(src, "src.json");
    json out = qwen_config_to_json(c);
    QwenConfig back = qwen_config_from_json(out, "out.json");
    expect_same(c, back);
    if (c.family == ModelFamily::qwen3_5) {
      // The hybrid is written in the qwen3_5_text form transformers builds Qwen3_5ForCausalLM from.
      EXPECT_EQ(out["model_type"], "qwen3_5_text");
      EXPECT_EQ(out["layer_types"].size(), size_t(c.layers));
      const auto sec = out["rope_parameters"]["mrope_section"].get<std::vector<int>>();
      EXPECT_EQ(sec[0] + sec[1] + sec[2], c.rot_dim / 2);
    } else {
      EXPECT_EQ(out["model_type"], "qwen3");
    }
  }
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
  {
    std::ofstream(dir / "config.json") << kQwen36_27B;
  }
  EXPECT_EQ(qwen_config_load(dir.string()).layers, 64);
  EXPECT_EQ(qwen_config_load((dir / "config.json").string()).hidden, 5120);
  {
    std::ofstream(dir / "broken.json") << "{\"model_type\": ";
  }
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
