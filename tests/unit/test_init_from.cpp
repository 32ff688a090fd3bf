// drafter.init_from: a Hugging Face DFlash drafter folder (as `export` writes it, and in the 2026 published
// layout) loads into a model of the same architecture with a fresh optimizer; every disagreement is an error
// that names the field; missing, extra or misshapen tensors are named too.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/config.h"
#include "core/error.h"
#include "model/safetensors.h"
#include "tests/unit/test_data_util.h"
#include "tests/unit/test_drafter_util.h"
#include "train/export_hf.h"
#include "train/init_from.h"

using namespace df;
using namespace df::testing;
using df_test::ScratchDir;
using df_test::error_of;

namespace {

constexpr int kTargetLayers = 6;

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}
void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream(path) << j.dump(2);
}

// The tiny model's weights exported to dir, and the model they came from.
struct Exported {
  ScratchDir tmp;
  TinySetup src;
  std::string dir = tmp.file("drafter");
  Exported() { drafter_export_hf(dir, *src.model, kTargetLayers); }
};

}  // namespace

TEST(InitFrom, ExportRoundTripLoadsWeightsAndResetsOptimizer) {
  Exported ex;
  TinySetup dst({5}, 99);  // other weights, and optimizer state that must be cleared
  dst.ops.fill(dst.model->adam_m, 3.0f);
  dst.ops.fill(dst.model->adam_v, 4.0f);
  dst.ops.fill(dst.model->grads, 5.0f);
  drafter_init_from(*dst.model, ex.dir);
  const int64_t n = dst.model->table().total;
  for (const DrafterParamEntry& e : dst.model->table().entries)
    for (int64_t i = 0; i < e.rows * e.cols; ++i) {
      const int64_t at = e.offset + i;
      ASSERT_EQ(dst.params()[at], bf16_round(ex.src.params()[at])) << e.name << " element " << i;
    }
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(dst.model->adam_m.ptr<float>()[i], 0.0f);
    ASSERT_EQ(dst.model->adam_v.ptr<float>()[i], 0.0f);
    ASSERT_EQ(dst.grads()[i], 0.0f);
  }
}

TEST(InitFrom, PublishedLayoutReadsTheSame) {
  Exported ex;
  nlohmann::json j = read_json(ex.dir + "/config.json");
  const DrafterConfig top = drafter_config_from_hf_json(j, "export");
  // z-lab 2026: block_size only in dflash_config, rope_theta only in rope_parameters.
  j.erase("block_size");
  const double theta = j["rope_theta"].get<double>();
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", theta}};
  const DrafterConfig nested = drafter_config_from_hf_json(j, "nested");
  EXPECT_NO_THROW(drafter_config_check_same(top, nested, "nested"));
  EXPECT_NO_THROW(drafter_config_check_same(ex.src.cfg, nested, "nested"));
  EXPECT_EQ(nested.block_size, ex.src.cfg.block_size);
  EXPECT_EQ(nested.rope_theta, ex.src.cfg.rope_theta);
  // dflash_config wins over the top level where both hold a key.
  j["block_size"] = 99;
  EXPECT_EQ(drafter_config_from_hf_json(j, "both").block_size, ex.src.cfg.block_size);
}

TEST(InitFrom, EveryDisagreementNamesTheField) {
  Exported ex;
  const std::string cfg_path = ex.dir + "/config.json";
  const nlohmann::json orig = read_json(cfg_path);
  struct Case {
    const char* field;
    nlohmann::json value;
    const char* run_key;
  } cases[] = {{"intermediate_size", 32, "drafter.intermediate"},
               {"num_key_value_heads", 4, "drafter.kv_heads"},
               {"hidden_size", 32, "hidden_size"},
               {"rms_norm_eps", 1e-5, "drafter.rms_norm_eps"},
               {"rope_theta", 1e6, "drafter.rope_theta"},
               {"sliding_window", 7, "drafter.sliding_window"},
               {"layer_types", {"full_attention", "full_attention"}, "drafter.layer_types"}};
  for (const Case& c : cases) {
    nlohmann::json j = orig;
    j[c.field] = c.value;
    write_json(cfg_path, j);
    TinySetup dst({5}, 3);
    const std::string e = error_of([&] { drafter_init_from(*dst.model, ex.dir); });
    EXPECT_NE(e.find(c.field), std::string::npos) << c.field << ": " << e;
    EXPECT_NE(e.find(c.run_key), std::string::npos) << c.field << ": " << e;
  }
  for (const char* key : {"mask_token_id", "target_layer_ids", "block_size"}) {
    nlohmann::json j = orig;
    j["dflash_config"][key] =
        std::string(key) == "target_layer_ids" ? nlohmann::json{1, 2} : nlohmann::json(3);
    write_json(cfg_path, j);
    TinySetup dst({5}, 3);
    const std::string e = error_of([&] { drafter_init_from(*dst.model, ex.dir); });
    EXPECT_NE(e.find(key), std::string::npos) << key << ": " << e;
  }
  nlohmann::json j = orig;
  j["architectures"] = {"Qwen3ForCausalLM"};
  write_json(cfg_path, j);
  TinySetup dst({5}, 3);
  EXPECT_NE(error_of([&] { drafter_init_from(*dst.model, ex.dir); }).find("DFlashDraftModel"),
            std::string::npos);
}

TEST(InitFrom, MissingExtraAndMisshapenTensorsAreNamed) {
  Exported ex;
  const std::string st = ex.dir + "/model.safetensors";
  const SafetensorsIndex idx = SafetensorsIndex::open(st);
  auto rewrite = [&](const std::string& drop, const std::string& add, const std::string& reshape) {
    std::vector<std::vector<float>> keep;
    std::vector<StWriteTensor> out;
    for (const std::string& name : idx.names()) {
      if (name == drop) continue;
      const StTensor* t = idx.find(name);
      keep.emplace_back(size_t(t->numel()));
      st_to_f32(*t, keep.back().data());
      std::vector<int64_t> shape = name == reshape ? std::vector<int64_t>{t->numel()} : t->shape;
      out.push_back({name, DType::f32, shape, keep.back().data()});
    }
    std::vector<float> extra(4, 0.0f);
    if (!add.empty()) out.push_back({add, DType::f32, {4}, extra.data()});
    const std::string dir = ex.tmp.file("case");
    std::filesystem::create_directories(dir);
    std::filesystem::copy_file(ex.dir + "/config.json", dir + "/config.json",
                               std::filesystem::copy_options::overwrite_existing);
    safetensors_write(dir + "/model.safetensors", out, {});
    TinySetup dst({5}, 3);
    return error_of([&] { drafter_init_from(*dst.model, dir); });
  };
  EXPECT_NE(rewrite("layers.1.mlp.up_proj.weight", "", "").find("'layers.1.mlp.up_proj.weight' is missing"),
            std::string::npos);
  EXPECT_NE(rewrite("", "model.embed_tokens.weight", "").find("'model.embed_tokens.weight' is not a drafter"),
            std::string::npos);
  EXPECT_NE(rewrite("", "", "fc.weight").find("'fc.weight' has shape"), std::string::npos);
  EXPECT_EQ(rewrite("", "", ""), "");  // the same tensors rewritten as F32 load fine
}

TEST(InitFrom, ConfigKeyIsParsed) {
  const Config c = config_parse(R"(
[target]
random_config = "configs/tiny-target.json"
device = "cpu"
[drafter]
mask_token_id = 255
init_from = "/models/drafter"
)",
                                "test.toml");
  EXPECT_EQ(c.drafter.init_from, "/models/drafter");
  EXPECT_TRUE(config_parse("[target]\nrandom_config = \"x.json\"\n[drafter]\nmask_token_id = 1\n", "t.toml")
                  .drafter.init_from.empty());
}

TEST(InitFrom, DominoConfigJsonReadsItsHeadAndKindMismatchIsNamed) {
  Exported ex;
  const std::string cfg_path = ex.dir + "/config.json";
  nlohmann::json j = read_json(cfg_path);
  j["architectures"] = {"DominoDraftModel"};
  j["dflash_config"]["projector_type"] = "domino";
  j["dflash_config"]["emb_dim"] = 8;
  j["dflash_config"]["gru_hidden_dim"] = 12;
  j["dflash_config"]["pure_draft_prefix_len"] = 1;
  j["dflash_config"]["shift_label"] = true;
  const DrafterConfig c = drafter_config_from_hf_json(j, "domino");
  EXPECT_EQ(c.kind, DrafterKind::domino);
  EXPECT_EQ(c.emb_dim, 8);
  EXPECT_EQ(c.gru_hidden_dim, 12);
  EXPECT_EQ(c.pure_draft_prefix_len, 1);
  EXPECT_TRUE(c.shift_label);
  const std::string e = error_of([&] { drafter_config_check_same(ex.src.cfg, c, "domino"); });
  EXPECT_NE(e.find("projector_type = domino but this run's drafter has dflash (drafter.kind)"),
            std::string::npos)
      << e;

  // The peer's defaults where dflash_config leaves them out; its required sizes named when missing.
  nlohmann::json bare = j;
  bare["dflash_config"].erase("pure_draft_prefix_len");
  bare["dflash_config"].erase("shift_label");
  const DrafterConfig d = drafter_config_from_hf_json(bare, "bare");
  EXPECT_EQ(d.pure_draft_prefix_len, 0);
  EXPECT_FALSE(d.shift_label);
  bare["dflash_config"].erase("gru_hidden_dim");
  EXPECT_NE(error_of([&] {
              drafter_config_from_hf_json(bare, "bare");
            }).find("'dflash_config.gru_hidden_dim' is missing"),
            std::string::npos);
  j["dflash_config"]["projector_type"] = "eagle3";
  EXPECT_NE(error_of([&] { drafter_config_from_hf_json(j, "eagle3"); }).find("drafter kind 'eagle3'"),
            std::string::npos);
}

// SpecForge names a DFlash2 drafter by its architecture (configs/qwen3.6-27b-dflash2.json): no
// projector_type, the four sizes required in dflash_config, output_multiplier 1 and no softcapping where
// absent.
TEST(InitFrom, Dflash2ConfigJsonReadsItsFieldsFromTheArchitecture) {
  Exported ex;
  nlohmann::json j = read_json(ex.dir + "/config.json");
  j["architectures"] = {"DFlash2DraftModel"};
  j["dflash_config"]["conv_kernel_size"] = 3;
  j["dflash_config"]["conv_group_size"] = 4;
  j["dflash_config"]["selector_rank"] = 5;
  j["dflash_config"]["selector_top_k"] = 7;
  DrafterConfig c = drafter_config_from_hf_json(j, "dflash2");
  EXPECT_EQ(c.kind, DrafterKind::dflash2);
  EXPECT_EQ(c.conv_kernel_size, 3);
  EXPECT_EQ(c.conv_group_size, 4);
  EXPECT_EQ(c.selector_rank, 5);
  EXPECT_EQ(c.selector_top_k, 7);
  EXPECT_EQ(c.output_multiplier, 1.0f);
  EXPECT_EQ(c.final_logit_softcapping, 0.0f);
  const std::string e = error_of([&] { drafter_config_check_same(ex.src.cfg, c, "dflash2"); });
  EXPECT_NE(e.find("projector_type = dflash2 but this run's drafter has dflash (drafter.kind)"),
            std::string::npos)
      << e;

  j["dflash_config"]["output_multiplier"] = 0.5;
  j["dflash_config"]["final_logit_softcapping"] = 30.0;
  c = drafter_config_from_hf_json(j, "dflash2");
  EXPECT_EQ(c.output_multiplier, 0.5f);
  EXPECT_EQ(c.final_logit_softcapping, 30.0f);
  // The checkpoint records the kind and every DFlash2 field.
  const DrafterConfig back = drafter_config_from_json(drafter_config_json(c), "json");
  EXPECT_EQ(drafter_config_json(back), drafter_config_json(c));
  EXPECT_EQ(back.kind, DrafterKind::dflash2);

  const std::pair<const char*, nlohmann::json> bad[] = {
      {"final_logit_softcapping", 0.0},  // SpecForge: must be > 0 when present
      {"conv_group_size", 5},            // divides hidden_size 16
      {"conv_kernel_size", 5},           // at most block_size 4
      {"selector_top_k", 38},            // at most vocab_size 37
      {"selector_rank", true},           // an integer, not a bool
  };
  for (const auto& [key, value] : bad) {
    nlohmann::json b = j;
    b["dflash_config"][key] = value;
    const std::string msg = error_of([&] { drafter_config_from_hf_json(b, "bad"); });
    EXPECT_NE(msg.find(key), std::string::npos) << key << ": " << msg;
  }
  for (const char* key : {"conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"}) {
    nlohmann::json b = j;
    b["dflash_config"].erase(key);
    EXPECT_NE(error_of([&] {
                drafter_config_from_hf_json(b, "bare");
              }).find(std::string("'dflash_config.") + key + "' is missing"),
              std::string::npos)
        << key;
  }
  nlohmann::json domino = j;
  domino["dflash_config"]["projector_type"] = "domino";
  EXPECT_NE(error_of([&] {
              drafter_config_from_hf_json(domino, "both");
            }).find("a DFlash2 drafter has no projector"),
            std::string::npos);
  // A DFlash drafter's config never carries DFlash2 fields into the drafter.
  const DrafterConfig plain = drafter_config_load_hf(ex.dir);
  EXPECT_EQ(plain.kind, DrafterKind::dflash);
  EXPECT_EQ(plain.selector_top_k, 0);
  EXPECT_EQ(plain.output_multiplier, 0.0f);
}

TEST(InitFrom, DSparkConfigJsonReadsItsHeadWithThePeersDefaults) {
  Exported ex;
  nlohmann::json j = read_json(ex.dir + "/config.json");
  j["architectures"] = {"DSparkDraftModel"};
  j["dflash_config"]["projector_type"] = "dspark";
  j["dflash_config"]["markov_rank"] = 6;
  j["dflash_config"]["markov_head_type"] = "Gated";  // SpecForge lowercases it
  j["dflash_config"]["confidence_head_alpha"] = 1.0;
  j["dflash_config"]["confidence_head_with_markov"] = true;
  const int heads = j["num_attention_heads"].get<int>(), kv = j["num_key_value_heads"].get<int>();
  ASSERT_LT(kv, heads) << "the exported fixture must be GQA for DSpark's default attention_mode";
  DrafterConfig c = drafter_config_from_hf_json(j, "dspark");
  EXPECT_EQ(c.kind, DrafterKind::dspark);
  EXPECT_EQ(c.markov_rank, 6);
  EXPECT_EQ(c.markov_head_type, DrafterMarkovHead::gated);
  EXPECT_TRUE(c.enable_confidence_head);  // absent: confidence_head_alpha > 0
  EXPECT_TRUE(c.confidence_head_with_markov);
  EXPECT_FLOAT_EQ(c.confidence_head_alpha, 1.0f);
  const std::string e = error_of([&] { drafter_config_check_same(ex.src.cfg, c, "dspark"); });
  EXPECT_NE(e.find("projector_type = dspark but this run's drafter has dflash (drafter.kind)"),
            std::string::npos)
      << e;

  // SpecForge's export normaliser names it Qwen3DSparkModel and copies the head keys to the top level.
  nlohmann::json norm = j;
  norm["architectures"] = {"Qwen3DSparkModel"};
  norm["dflash_config"].erase("markov_rank");
  norm["markov_rank"] = 5;
  EXPECT_EQ(drafter_config_from_hf_json(norm, "normalised").markov_rank, 5);

  // The peer's defaults: no Markov head, vanilla, no confidence head.
  nlohmann::json bare = j;
  for (const char* key :
       {"markov_rank", "markov_head_type", "confidence_head_alpha", "confidence_head_with_markov"})
    bare["dflash_config"].erase(key);
  c = drafter_config_from_hf_json(bare, "bare");
  EXPECT_EQ(c.markov_rank, 0);
  EXPECT_EQ(c.markov_head_type, DrafterMarkovHead::vanilla);
  EXPECT_FALSE(c.enable_confidence_head);
  EXPECT_FALSE(c.confidence_head_with_markov);

  // Refused as DSparkDraftModel refuses: a Markov-fed confidence head without a Markov head, gqa with equal
  // head counts, mha with unequal ones, an unknown head type.
  bare["dflash_config"]["confidence_head_with_markov"] = true;
  EXPECT_NE(
      error_of([&] { drafter_config_from_hf_json(bare, "nomarkov"); }).find("confidence_head_with_markov"),
      std::string::npos);
  nlohmann::json mha = j;
  mha["dflash_config"]["attention_mode"] = "mha";
  EXPECT_NE(error_of([&] { drafter_config_from_hf_json(mha, "mha"); }).find("attention_mode \"mha\""),
            std::string::npos);
  nlohmann::json lstm = j;
  lstm["dflash_config"]["markov_head_type"] = "lstm";
  EXPECT_NE(error_of([&] {
              drafter_config_from_hf_json(lstm, "lstm");
            }).find("'lstm' is not vanilla, gated or rnn"),
            std::string::npos);
}

// A Domino drafter exports as SpecForge's normaliser leaves its export for SGLang (DFlashDraftModel, the head
// in dflash_config under projector_type "domino", the head's weights under the peer's names) and loads back.
TEST(InitFrom, DominoExportIsTheNormalisedLayoutAndRoundTrips) {
  ScratchDir tmp;
  const std::string dir = tmp.file("domino");
  TinySetup src({11, 1, 13}, 7, tiny_domino_config(true, 1));
  drafter_export_hf(dir, *src.model, kTargetLayers);
  const nlohmann::json j = read_json(dir + "/config.json");
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"DFlashDraftModel"}));
  EXPECT_FALSE(j.contains("auto_map"));
  const nlohmann::json& dc = j["dflash_config"];
  EXPECT_EQ(dc["projector_type"], "domino");
  EXPECT_EQ(dc["pure_draft_prefix_len"], 1);
  EXPECT_EQ(dc["emb_dim"], 7);
  EXPECT_EQ(dc["gru_hidden_dim"], 5);
  EXPECT_EQ(dc["shift_label"], true);
  const SafetensorsIndex idx = SafetensorsIndex::open(dir);
  const int64_t H = src.cfg.hidden, V = src.cfg.vocab;
  const std::pair<const char*, std::vector<int64_t>> head[] = {{"prefix_gru.weight_ih_l0", {15, H}},
                                                               {"prefix_gru.weight_hh_l0", {15, 5}},
                                                               {"embed_proj.0.weight", {7, H + 5}},
                                                               {"embed_proj.2.weight", {V, 7}}};
  for (const auto& [name, shape] : head) {
    const StTensor* t = idx.find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->shape, shape) << name;
  }

  TinySetup dst({5}, 99, tiny_domino_config(true, 1));
  drafter_init_from(*dst.model, dir);
  for (const DrafterParamEntry& e : dst.model->table().entries)
    for (int64_t i = 0; i < e.rows * e.cols; ++i)
      ASSERT_EQ(dst.params()[e.offset + i], bf16_round(src.params()[e.offset + i]))
          << e.name << " element " << i;
  // Another head, or none, is refused naming the field.
  TinySetup unshifted({5}, 99, tiny_domino_config(false, 1)), dflash({5}, 99);
  EXPECT_NE(error_of([&] { drafter_init_from(*unshifted.model, dir); }).find("shift_label = true"),
            std::string::npos);
  EXPECT_NE(error_of([&] { drafter_init_from(*dflash.model, dir); }).find("projector_type = domino"),
            std::string::npos);
}

// An early SpecForge Domino checkpoint keeps its head under `logit_head.` (the peer's
// normalize_draft_head_checkpoint_keys): init_from reads it as the head.
TEST(InitFrom, DominoHeadUnderLogitHeadLoads) {
  ScratchDir tmp;
  const std::string dir = tmp.file("domino"), early = tmp.file("early");
  TinySetup src({11, 1, 13}, 7, tiny_domino_config(true, 1));
  drafter_export_hf(dir, *src.model, kTargetLayers);
  std::filesystem::create_directories(early);
  std::filesystem::copy_file(dir + "/config.json", early + "/config.json");
  {
    const SafetensorsIndex idx = SafetensorsIndex::open(dir);
    std::vector<StWriteTensor> out;
    int renamed = 0;
    for (const std::string& name : idx.names()) {
      const StTensor* t = idx.find(name);
      const bool head = name.rfind("prefix_gru.", 0) == 0 || name.rfind("embed_proj.", 0) == 0;
      renamed += head;
      out.push_back({head ? "logit_head." + name : name, t->dtype, t->shape, t->data});
    }
    ASSERT_EQ(renamed, 4);
    safetensors_write(early + "/model.safetensors", out);
  }
  TinySetup dst({5}, 99, tiny_domino_config(true, 1));
  drafter_init_from(*dst.model, early);
  for (const DrafterParamEntry& e : dst.model->table().entries)
    for (int64_t i = 0; i < e.rows * e.cols; ++i)
      ASSERT_EQ(dst.params()[e.offset + i], bf16_round(src.params()[e.offset + i]))
          << e.name << " element " << i;
}

// A DFlash2 drafter exports as SpecForge's DFlash2DraftModel (named by its architecture, its keys in
// dflash_config, base kernels [2, taps, H]) and loads back; a DFlash run refuses it naming the field.
TEST(InitFrom, Dflash2ExportIsThePeersLayoutAndRoundTrips) {
  ScratchDir tmp;
  const std::string dir = tmp.file("dflash2");
  DrafterConfig c = tiny_dflash2_config(5);
  c.final_logit_softcapping = 30.0f;
  TinySetup src({11, 1, 13}, 7, c);
  drafter_export_hf(dir, *src.model, kTargetLayers);
  const nlohmann::json j = read_json(dir + "/config.json");
  EXPECT_EQ(j["architectures"], nlohmann::json::array({"DFlash2DraftModel"}));
  const nlohmann::json& dc = j["dflash_config"];
  EXPECT_FALSE(dc.contains("projector_type"));
  EXPECT_EQ(dc["conv_kernel_size"], 2);
  EXPECT_EQ(dc["conv_group_size"], 4);
  EXPECT_EQ(dc["selector_rank"], 3);
  EXPECT_EQ(dc["selector_top_k"], 5);
  EXPECT_EQ(dc["output_multiplier"], 1.0);
  EXPECT_EQ(dc["final_logit_softcapping"], 30.0);
  const SafetensorsIndex idx = SafetensorsIndex::open(dir);
  const int64_t H = c.hidden, V = c.vocab;
  const std::pair<const char*, std::vector<int64_t>> shapes[] = {
      {"layers.1.attention_conv.base_kernel", {2, 2, H}},
      {"layers.1.attention_conv.kernel_projection.weight", {2 * 2 * (H / 4), H}},
      {"layers.0.mlp_conv.base_kernel", {2, 2, H}},
      {"layers.0.mlp_conv.kernel_projection.weight", {2 * 2 * (H / 4), H}},
      {"candidate_selector.predecessor_codebook", {V, 3}},
      {"candidate_selector.successor_codebook", {V, 3}},
      {"candidate_selector.hidden_projection.weight", {3, H}}};
  for (const auto& [name, shape] : shapes) {
    const StTensor* t = idx.find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->shape, shape) << name;
  }
  TinySetup dst({5}, 99, c);
  drafter_init_from(*dst.model, dir);
  for (const DrafterParamEntry& e : dst.model->table().entries)
    for (int64_t i = 0; i < e.rows * e.cols; ++i)
      ASSERT_EQ(dst.params()[e.offset + i], bf16_round(src.params()[e.offset + i]))
          << e.name << " element " << i;
  TinySetup dflash({5}, 99), other_top_k({5}, 99, tiny_dflash2_config(4));
  EXPECT_NE(error_of([&] { drafter_init_from(*dflash.model, dir); }).find("projector_type = dflash2"),
            std::string::npos);
  EXPECT_NE(error_of([&] { drafter_init_from(*other_top_k.model, dir); }).find("selector_top_k = 5"),
            std::string::npos);
}

// A DFlash folder starts a DFlash2 drafter of the same backbone: identity convolutions, a zero successor
// codebook, the backbone's weights. It computes the DFlash drafter's hidden states and logits, so it drafts
// the same tokens; the predecessor codebook and hidden projection keep their initial values.
TEST(InitFrom, Dflash2FromDflashComputesTheSameLogits) {
  Exported ex;
  TinySetup dflash({11, 1, 13}, 7), dflash2({11, 1, 13}, 7, tiny_dflash2_config(5));
  const std::vector<float> fresh(dflash2.params(), dflash2.params() + dflash2.model->table().total);
  drafter_init_from(*dflash.model, ex.dir);
  drafter_init_from(*dflash2.model, ex.dir);
  const DrafterParamTable& t = dflash2.model->table();
  for (const DrafterParamEntry& e : t.entries) {
    const float* p = dflash2.params() + e.offset;
    for (int64_t i = 0; i < e.rows * e.cols; ++i) {
      const float want = drafter_param_is_base_kernel(e.name) ? ((i / e.cols) % 2 == 0 ? 1.0f : 0.0f)
                         : e.name.find("_conv.kernel_projection") != std::string::npos ||
                                 e.name == "candidate_selector.successor_codebook"
                             ? 0.0f
                         : e.name.rfind("candidate_selector.", 0) == 0
                             ? fresh[size_t(e.offset + i)]
                             : dflash.params()[dflash.model->table().find(e.name).offset + i];
      ASSERT_EQ(p[i], want) << e.name << " element " << i;
    }
  }
  const std::vector<DrafterAnchor> an = {{0, 0}, {0, 4}, {2, 1}, {2, 6}};
  DrafterLossOptions o;
  o.backward = false;
  const LossStats a = drafter_forward_backward(*dflash.model, dflash.batch, an, o);
  o.dflash2_selector_alpha = 1.0;
  const LossStats b = drafter_forward_backward(*dflash2.model, dflash2.batch, an, o);
  const std::vector<float> ya = drafter_final_hidden(*dflash.model, dflash.batch, an, o),
                           yb = drafter_final_hidden(*dflash2.model, dflash2.batch, an, o);
  ASSERT_EQ(ya.size(), yb.size());
  for (size_t i = 0; i < ya.size(); ++i) ASSERT_NEAR(yb[i], ya[i], 1e-5f * (1.0f + std::fabs(ya[i]))) << i;
  EXPECT_EQ(b.row_argmax, a.row_argmax);
  for (size_t j = 0; j < an.size(); ++j) {
    const std::vector<DrafterAnchor> block{an[j]};
    drafter_forward_backward(*dflash2.model, dflash2.batch, block, o);
    const std::vector<int32_t> drafts = drafter_dflash2_drafts(*dflash2.model, dflash2.batch, block, o);
    const int B = dflash2.cfg.block_size;
    const std::vector<float> y = drafter_final_hidden(*dflash2.model, dflash2.batch, block, o);
    for (int k = 1; k < B; ++k) {
      // The DFlash drafter's proposal: the argmax of the logits of the same row.
      const float* z = &y[size_t(k * dflash2.cfg.hidden)];
      int32_t best = 0;
      double best_v = -1e300;
      for (int v = 0; v < dflash2.cfg.vocab; ++v) {
        double s = 0;
        for (int h = 0; h < dflash2.cfg.hidden; ++h)
          s += double(dflash2.lm_head[size_t(v * dflash2.cfg.hidden + h)]) * double(z[h]);
        if (s > best_v) best_v = s, best = v;
      }
      EXPECT_EQ(drafts[size_t(k - 1)], best) << "block " << j << " slot " << k;
    }
  }
}

// A DSpark drafter exports as SpecForge's normaliser leaves its export for SGLang (Qwen3DSparkModel; the
// head's keys in dflash_config under projector_type "dspark" and its four shape keys also at the top level;
// the head's weights under the peer's names) and loads back, for every Markov head type; a drafter without a
// Markov head is refused (the normaliser refuses it too), and another head type is refused naming the field.
TEST(InitFrom, DSparkExportIsTheNormalisedLayoutAndRoundTrips) {
  ScratchDir tmp;
  for (DrafterMarkovHead type :
       {DrafterMarkovHead::vanilla, DrafterMarkovHead::gated, DrafterMarkovHead::rnn}) {
    const std::string name = drafter_markov_head_name(type);
    SCOPED_TRACE(name);
    const std::string dir = tmp.file("dspark_" + name);
    TinySetup src({11, 1, 13}, 7, tiny_dspark_config(type, 3, true));
    drafter_export_hf(dir, *src.model, kTargetLayers);
    const nlohmann::json j = read_json(dir + "/config.json");
    EXPECT_EQ(j["architectures"], nlohmann::json::array({"Qwen3DSparkModel"}));
    EXPECT_FALSE(j.contains("auto_map"));
    const nlohmann::json& dc = j["dflash_config"];
    EXPECT_EQ(dc["projector_type"], "dspark");
    EXPECT_EQ(dc["attention_mode"], "gqa");
    EXPECT_EQ(dc["confidence_head_alpha"], 1.0);
    for (const auto& [key, value] : {std::pair<const char*, nlohmann::json>{"markov_rank", 3},
                                     {"markov_head_type", name},
                                     {"enable_confidence_head", true},
                                     {"confidence_head_with_markov", true}}) {
      EXPECT_EQ(dc[key], value) << key;
      EXPECT_EQ(j[key], value) << key << " at the top level";
    }
    const SafetensorsIndex idx = SafetensorsIndex::open(dir);
    const int64_t H = src.cfg.hidden, V = src.cfg.vocab;
    std::vector<std::pair<std::string, std::vector<int64_t>>> head = {
        {"markov_head.markov_w1.weight", {V, 3}},
        {"markov_head.markov_w2.weight", {V, 3}},
        {"confidence_head.proj.weight", {1, H + 3}},
        {"confidence_head.proj.bias", {1}}};
    if (type == DrafterMarkovHead::gated) {
      head.push_back({"markov_head.gate_proj.weight", {3, H + 3}});
      head.push_back({"markov_head.gate_proj.bias", {3}});
    }
    if (type == DrafterMarkovHead::rnn) {
      head.push_back({"markov_head.joint_proj.weight", {9, 6 + H}});
      head.push_back({"markov_head.joint_proj.bias", {9}});
    }
    for (const auto& [tensor, shape] : head) {
      const StTensor* t = idx.find(tensor);
      ASSERT_NE(t, nullptr) << tensor;
      EXPECT_EQ(t->shape, shape) << tensor;
    }

    // The exported folder's config reads back as this drafter, and its weights load.
    EXPECT_NO_THROW(drafter_config_check_same(src.cfg, drafter_config_load_hf(dir), dir));
    TinySetup dst({5}, 99, tiny_dspark_config(type, 3, true));
    drafter_init_from(*dst.model, dir);
    for (const DrafterParamEntry& e : dst.model->table().entries)
      for (int64_t i = 0; i < e.rows * e.cols; ++i)
        ASSERT_EQ(dst.params()[e.offset + i], bf16_round(src.params()[e.offset + i]))
            << e.name << " element " << i;
    const DrafterMarkovHead other =
        type == DrafterMarkovHead::rnn ? DrafterMarkovHead::vanilla : DrafterMarkovHead::rnn;
    TinySetup wrong({5}, 99, tiny_dspark_config(other, 3, true));
    EXPECT_NE(error_of([&] { drafter_init_from(*wrong.model, dir); }).find("markov_head_type"),
              std::string::npos);
  }
  TinySetup rank0({11, 1, 13}, 7, tiny_dspark_config(DrafterMarkovHead::vanilla, 0, true));
  EXPECT_NE(error_of([&] {
              drafter_export_hf(tmp.file("rank0"), *rank0.model, kTargetLayers);
            }).find("drafter.markov_rank is 0"),
            std::string::npos);
}
