// Qwen3-Next targets (model_type qwen3_next) on the CPU backend: the config's own defaults and its dense layers
// (mlp_only_layers, decoder_sparse_step), and its DeltaNet projections fused per key head (in_proj_qkvz,
// in_proj_ba). A Qwen3.5-MoE checkpoint rewritten into Qwen3-Next's tensor layout, the way transformers'
// Qwen3NextGatedDeltaNet.fix_query_key_value_ordering reads it back, must compute exactly what the original
// computes; a random Qwen3-Next model saved as a checkpoint must load back to the same outputs.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/safetensors.h"
#include "model/target.h"
#include "ops/cpu/cpu_ops.h"
#include "target_test_util.h"

using namespace df;

namespace {

// tiny_moe_hybrid with 2 key heads of 4 and 4 value heads of 3 (2 value heads per key head), so that every piece
// of the per-key-head layout moves; `model_type` and the extra keys given.
nlohmann::json hybrid_json(const std::string& model_type, const nlohmann::json& extra = nlohmann::json::object()) {
  nlohmann::json j = tiny_moe_hybrid_json();
  j.update({{"model_type", model_type},
            {"linear_num_key_heads", 2},
            {"linear_num_value_heads", 4},
            {"linear_key_head_dim", 4},
            {"linear_value_head_dim", 3}});
  j.update(extra);
  return j;
}

std::filesystem::path temp_dir(const std::string& tag) {
  return std::filesystem::temp_directory_path() / ("df_qwen3_next_" + tag + "_" + std::to_string(::getpid()));
}

std::vector<float> host_tensor(const SafetensorsIndex& st, const std::string& name) {
  const StTensor* t = st.find(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  std::vector<float> v(static_cast<size_t>(t->numel()));
  st_to_f32(*t, v.data());
  return v;
}

// Rows [r0, r0 + n) of a row-major matrix with K columns, appended to `out`.
void append_rows(std::vector<float>& out, const std::vector<float>& m, int64_t K, int64_t r0, int64_t n) {
  out.insert(out.end(), m.begin() + r0 * K, m.begin() + (r0 + n) * K);
}

// The Qwen3.5 checkpoint at `from` rewritten into `to` as Qwen3-Next stores it: each DeltaNet layer's
// in_proj_qkv / z / b / a fused into in_proj_qkvz and in_proj_ba, viewed as transformers views them
// ([key heads, q | k | v of its value heads | z of its value heads] and [key heads, b | a]); every other
// tensor as it is.
void rewrite_as_qwen3_next(const std::filesystem::path& from, const std::filesystem::path& to,
                           const QwenConfig& c, const nlohmann::json& config) {
  const SafetensorsIndex st = SafetensorsIndex::open(from.string());
  const int64_t H = c.hidden, nk = c.lin_nk, dk = c.lin_dk, dv = c.lin_dv, r = c.lin_nv / c.lin_nk;
  std::map<std::string, std::vector<float>> keep;
  std::vector<StWriteTensor> out;
  for (const std::string& name : st.names()) {
    const std::string qkv = "linear_attn.in_proj_qkv.weight";
    if (name.size() > qkv.size() && name.compare(name.size() - qkv.size(), qkv.size(), qkv) == 0) {
      const std::string gp = name.substr(0, name.size() - qkv.size()) + "linear_attn.";
      const std::vector<float> w_qkv = host_tensor(st, name), w_z = host_tensor(st, gp + "in_proj_z.weight");
      const std::vector<float> w_b = host_tensor(st, gp + "in_proj_b.weight"),
                               w_a = host_tensor(st, gp + "in_proj_a.weight");
      std::vector<float> qkvz, ba;
      for (int64_t g = 0; g < nk; ++g) {
        append_rows(qkvz, w_qkv, H, g * dk, dk);                      // q of key head g
        append_rows(qkvz, w_qkv, H, nk * dk + g * dk, dk);            // k of key head g
        append_rows(qkvz, w_qkv, H, 2 * nk * dk + g * r * dv, r * dv);  // v of its value heads
        append_rows(qkvz, w_z, H, g * r * dv, r * dv);                // z of its value heads
        append_rows(ba, w_b, H, g * r, r);
        append_rows(ba, w_a, H, g * r, r);
      }
      const int64_t rows = int64_t(qkvz.size()) / H, ba_rows = int64_t(ba.size()) / H;
      out.push_back({gp + "in_proj_qkvz.weight", DType::f32, {rows, H}, (keep[gp + "qkvz"] = qkvz).data()});
      out.push_back({gp + "in_proj_ba.weight", DType::f32, {ba_rows, H}, (keep[gp + "ba"] = ba).data()});
      continue;
    }
    if (name.find("linear_attn.in_proj_") != std::string::npos) continue;  // fused above
    const StTensor* t = st.find(name);
    out.push_back({name, t->dtype, t->shape, t->data});  // as it is (the index's mapping outlives the write)
  }
  std::filesystem::create_directories(to);
  safetensors_write((to / "model.safetensors").string(), out);
  std::ofstream((to / "config.json").string()) << config.dump(2);
}

}  // namespace

TEST(Qwen3Next, ConfigReadsItsDefaultsAndDenseLayers) {
  // Qwen3NextConfig's defaults where the file is silent: 512 experts, top-10, experts and shared expert of 512,
  // renormalised top-k, dense layers of 5632; decoder_sparse_step and mlp_only_layers are honoured.
  nlohmann::json j = hybrid_json("qwen3_next", {{"decoder_sparse_step", 2}, {"mlp_only_layers", {3}}});
  for (const char* k : {"num_experts", "num_experts_per_tok", "moe_intermediate_size",
                        "shared_expert_intermediate_size"})
    j.erase(k);
  const QwenConfig c = qwen_config_from_json(j, "next");
  EXPECT_EQ(c.family, ModelFamily::qwen3_5);
  EXPECT_TRUE(c.per_key_head_gdn_proj());
  EXPECT_EQ(c.num_experts, 512);
  EXPECT_EQ(c.experts_per_tok, 10);
  EXPECT_EQ(c.moe_intermediate, 512);
  EXPECT_EQ(c.shared_intermediate, 512);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_EQ(c.intermediate, 5632);
  // Layer l is sparse where (l + 1) % 2 == 0 and l is not in mlp_only_layers: layer 1 only.
  EXPECT_EQ(c.moe_layers, (std::vector<uint8_t>{0, 1, 0, 0}));
  EXPECT_TRUE(c.attn_output_gate);
  EXPECT_EQ(c.rot_dim, 4);
  // Written back, it reads as the same model.
  const QwenConfig again = qwen_config_from_json(qwen_config_to_json(c), "written");
  EXPECT_EQ(again.model_type, "qwen3_next");
  EXPECT_EQ(again.moe_layers, c.moe_layers);
  EXPECT_EQ(again.intermediate, c.intermediate);
  EXPECT_EQ(again.experts_per_tok, c.experts_per_tok);
  EXPECT_EQ(again.norm_topk_prob, c.norm_topk_prob);
  EXPECT_EQ(again.shared_intermediate, c.shared_intermediate);
  // norm_topk_prob false is the file's to choose (Qwen2MoeTopKRouter reads it).
  EXPECT_FALSE(qwen_config_from_json(hybrid_json("qwen3_next", {{"norm_topk_prob", false}}), "n").norm_topk_prob);
}

TEST(Qwen3Next, ComputesAsTheQwen35MoeCheckpointItRegroups) {
  CpuOps ops;
  const QwenConfig c35 = qwen_config_from_json(hybrid_json("qwen3_5_moe_text"), "q35");
  auto m = target_random(c35, 31, ops, with_lm_head());
  const auto a_dir = temp_dir("a"), b_dir = temp_dir("b");
  target_save_hf(*m, a_dir.string());
  // The same model as Qwen3-Next: every layer sparse, the top-k renormalised, as Qwen3.5-MoE always does.
  rewrite_as_qwen3_next(a_dir, b_dir, c35,
                        hybrid_json("qwen3_next", {{"norm_topk_prob", true}, {"decoder_sparse_step", 1}}));
  auto a = target_load(a_dir.string(), ops, with_lm_head());
  auto b = target_load(b_dir.string(), ops, with_lm_head());
  ASSERT_TRUE(b->cfg.per_key_head_gdn_proj());
  const std::vector<int32_t> ids = random_ids(45, c35.vocab, 5);
  const FwdResult ra = run_model(*a, ops, ids, {30, 15}, c35.layers, true);
  const FwdResult rb = run_model(*b, ops, ids, {30, 15}, c35.layers, true);
  // The same f32 weights in the same places; a layout mistake would move q, k, v, z, b or a rows between heads
  // (2 key heads, 2 value heads each) and change the outputs at O(1).
  EXPECT_EQ(max_err(ra.final_norm, rb.final_norm), 0.0);
  std::filesystem::remove_all(a_dir);
  std::filesystem::remove_all(b_dir);
}

TEST(Qwen3Next, SaveAndLoadRoundTripWithDenseLayers) {
  CpuOps ops;
  const QwenConfig c =
      qwen_config_from_json(hybrid_json("qwen3_next", {{"mlp_only_layers", {2}}, {"intermediate_size", 18}}), "n");
  auto m = target_random(c, 7, ops, with_lm_head());
  const auto dir = temp_dir("rt");
  target_save_hf(*m, dir.string());
  const SafetensorsIndex st = SafetensorsIndex::open(dir.string());
  const StTensor* qkvz = st.find("model.layers.0.linear_attn.in_proj_qkvz.weight");
  ASSERT_NE(qkvz, nullptr);
  EXPECT_EQ(qkvz->shape, (std::vector<int64_t>{2 * 2 * 4 + 2 * 4 * 3, 24}));
  EXPECT_EQ(st.find("model.layers.0.linear_attn.in_proj_qkv.weight"), nullptr);
  EXPECT_NE(st.find("model.layers.2.mlp.gate_proj.weight"), nullptr);  // the dense layer
  auto loaded = target_load(dir.string(), ops, with_lm_head());
  const std::vector<int32_t> ids = random_ids(33, c.vocab, 3);
  EXPECT_EQ(max_err(run_model(*m, ops, ids, {33}, c.layers, true).final_norm,
                    run_model(*loaded, ops, ids, {33}, c.layers, true).final_norm),
            0.0);
  std::filesystem::remove_all(dir);
}

TEST(Qwen3Next, AQwen35LayoutIsRefusedNamingTheFusedTensor) {
  // A Qwen3.5-MoE checkpoint whose config claims qwen3_next: the loader asks for in_proj_qkvz and says so.
  CpuOps ops;
  const QwenConfig c35 = qwen_config_from_json(hybrid_json("qwen3_5_moe_text"), "q35");
  auto m = target_random(c35, 2, ops, with_lm_head());
  const auto dir = temp_dir("bad");
  target_save_hf(*m, dir.string());
  std::ofstream((dir / "config.json").string()) << hybrid_json("qwen3_next", {{"norm_topk_prob", true}}).dump();
  try {
    target_load(dir.string(), ops, with_lm_head());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.linear_attn.in_proj_qkvz.weight"), std::string::npos)
        << e.what();
  }
  std::filesystem::remove_all(dir);
}
