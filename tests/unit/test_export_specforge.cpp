// `export --drafter` on each SpecForge-written golden (tests/golden/drafter*/model: config.json and weights as
// SpecForge's own classes saved them) must give the folder SGLang loads: exactly the tensors of SpecForge's
// class (same names and shapes, nothing missing or extra) holding the golden's values rounded to bf16 bit for
// bit, and a config.json whose architectures and dflash_config are what SpecForge's export normaliser
// (scripts/gates/normalize_dflash_export.py) leaves. tests/golden/check_export_specforge.py loads the same
// exports into the SpecForge classes themselves (torch; the GPU machine).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/dtype.h"
#include "model/safetensors.h"
#include "ops/cpu/cpu_train_ops.h"
#include "tests/unit/test_data_util.h"
#include "train/export_hf.h"

using namespace df;
using df_test::ScratchDir;

namespace {

nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  return nlohmann::json::parse(f);
}

// j[key], null when absent (const operator[] must not see a missing key).
nlohmann::json field(const nlohmann::json& j, const std::string& key) {
  return j.contains(key) ? j[key] : nlohmann::json();
}

std::set<std::string> keys_of(const nlohmann::json& j) {
  std::set<std::string> keys;
  for (const auto& item : j.items()) keys.insert(item.key());
  return keys;
}

// Exports tests/golden/<golden>/model and checks the folder against it; `architecture` is the one the
// normaliser writes for the kind.
void check_export(const std::string& golden, const char* architecture) {
  const std::string src = std::string(DF_SOURCE_DIR) + "/tests/golden/" + golden + "/model";
  ASSERT_TRUE(std::filesystem::exists(src + "/config.json"))
      << src << " is absent: run tests/golden/make_drafter_golden.py (README in tests/golden)";
  ScratchDir tmp;
  const std::string out = tmp.file("export");
  CpuTrainOps ops;
  drafter_export_hf_folder(src, out, ops);

  const SafetensorsIndex want = SafetensorsIndex::open(src + "/model.safetensors");
  const SafetensorsIndex got = SafetensorsIndex::open(out + "/model.safetensors");
  std::vector<std::string> want_names = want.names(), got_names = got.names();
  std::sort(want_names.begin(), want_names.end());
  std::sort(got_names.begin(), got_names.end());
  EXPECT_EQ(got_names, want_names) << "the export's tensor names differ from those SpecForge's class saved";
  for (const std::string& name : want_names) {
    const StTensor* w = want.find(name);
    const StTensor* g = got.find(name);
    if (!g) continue;  // reported above
    EXPECT_EQ(g->shape, w->shape) << name;
    ASSERT_EQ(g->dtype, DType::bf16) << name;
    if (g->shape != w->shape) continue;
    std::vector<float> values(size_t(w->numel()));
    st_to_f32(*w, values.data());
    std::vector<uint16_t> bits(values.size());
    std::memcpy(bits.data(), g->data, g->nbytes);
    for (size_t i = 0; i < values.size(); ++i)
      ASSERT_EQ(bits[i], f32_to_bf16(values[i])) << name << " element " << i;
  }

  const nlohmann::json w = read_json(src + "/config.json"), g = read_json(out + "/config.json");
  const nlohmann::json wd = field(w, "dflash_config"), gd = field(g, "dflash_config");
  EXPECT_EQ(field(g, "architectures"), nlohmann::json::array({architecture}));
  EXPECT_FALSE(g.contains("auto_map"));  // the normaliser drops it
  // dflash_config as SpecForge saved it (the normaliser keeps it), numbers compared as numbers.
  EXPECT_EQ(keys_of(gd), keys_of(wd));
  for (const auto& item : wd.items())
    EXPECT_EQ(field(gd, item.key()), item.value()) << "dflash_config." << item.key();
  // The normaliser refuses a config without the top-level block_size the run trained with.
  EXPECT_EQ(field(g, "block_size"), field(wd, "block_size"));
  for (const char* key : {"model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                          "num_attention_heads", "num_key_value_heads", "head_dim", "num_target_layers",
                          "rms_norm_eps", "layer_types", "sliding_window", "use_sliding_window", "vocab_size",
                          "tie_word_embeddings", "hidden_act", "attention_bias"})
    EXPECT_EQ(field(g, key), field(w, key)) << key;
  EXPECT_EQ(field(g, "rope_theta"), field(field(w, "rope_parameters"), "rope_theta"));
  if (field(gd, "projector_type") == "dspark")
    for (const char* key :
         {"markov_rank", "markov_head_type", "enable_confidence_head", "confidence_head_with_markov"})
      EXPECT_EQ(field(g, key), field(gd, key)) << key << " (the normaliser copies it to the top level)";
}

}  // namespace

TEST(ExportSpecForge, DFlash) {
  check_export("drafter", "DFlashDraftModel");
}
TEST(ExportSpecForge, Domino) {
  check_export("drafter_domino", "DFlashDraftModel");
}
TEST(ExportSpecForge, DSparkVanilla) {
  check_export("drafter_dspark_vanilla", "Qwen3DSparkModel");
}
TEST(ExportSpecForge, DSparkGated) {
  check_export("drafter_dspark_gated", "Qwen3DSparkModel");
}
TEST(ExportSpecForge, DSparkRnn) {
  check_export("drafter_dspark_rnn", "Qwen3DSparkModel");
}
TEST(ExportSpecForge, DFlash2) {
  check_export("drafter_dflash2", "DFlash2DraftModel");
}
