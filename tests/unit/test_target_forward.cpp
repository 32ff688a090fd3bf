// The target forward on the CPU backend with random tiny models: packing sequences changes nothing,
// early stop changes nothing, chunked and recurrent DeltaNet agree through the whole model, and a model
// saved as a Hugging Face checkpoint loads back to the same outputs. (Agreement with transformers itself
// is test_golden's job.)
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "model/target.h"
#include "ops/cpu/cpu_ops.h"

using namespace df;

namespace {

QwenConfig tiny_hybrid() {
  nlohmann::json j = {{"model_type", "qwen3_5_text"},
                      {"hidden_size", 24},
                      {"num_hidden_layers", 4},
                      {"layer_types", {"linear_attention", "full_attention", "linear_attention", "full_attention"}},
                      {"intermediate_size", 40},
                      {"vocab_size", 37},
                      {"num_attention_heads", 3},
                      {"num_key_value_heads", 1},
                      {"head_dim", 8},
                      {"attn_output_gate", true},
                      {"partial_rotary_factor", 0.5},
                      {"rope_theta", 10000.0},
                      {"rms_norm_eps", 1e-6},
                      {"linear_num_key_heads", 1},
                      {"linear_num_value_heads", 3},
                      {"linear_key_head_dim", 8},
                      {"linear_value_head_dim", 4},
                      {"linear_conv_kernel_dim", 4},
                      {"tie_word_embeddings", false}};
  return qwen_config_from_json(j, "tiny_hybrid");
}

QwenConfig tiny_dense() {
  nlohmann::json j = {{"model_type", "qwen3"},       {"hidden_size", 20},        {"num_hidden_layers", 3},
                      {"intermediate_size", 36},     {"vocab_size", 29},         {"num_attention_heads", 5},
                      {"num_key_value_heads", 1},    {"head_dim", 6},            {"rope_theta", 1e6},
                      {"rms_norm_eps", 1e-6},        {"tie_word_embeddings", true}};
  return qwen_config_from_json(j, "tiny_dense");
}

struct Run {
  std::vector<std::vector<float>> taps;  // one per layer
  std::vector<float> final_norm;
};

// Runs `lengths` as one packed batch with taps at every layer and the final norm.
Run run_model(const TargetModel& m, CpuOps& ops, const std::vector<int32_t>& ids, const std::vector<int32_t>& lengths,
              int num_taps, bool final_norm) {
  const int64_t T = ids.size(), H = m.cfg.hidden;
  TargetForward fwd(m, T);
  std::vector<float> store((num_taps + 2) * T * H + 64 + T);
  HostBuffer meta(64 * 1024);
  Arena arena(meta.data(), meta.size(), Device::cpu);
  SeqLayout seqs = seq_layout_make(lengths, ops, arena);
  Tensor id_t = arena.alloc(DType::i32, 1, T);
  ops.upload_raw(id_t, ids.data());
  TargetOutputs out;
  for (int l = 0; l < num_taps; ++l) {
    out.tap_layers.push_back(l);
    out.taps.push_back(tensor_make(store.data() + l * T * H, DType::f32, Device::cpu, T, H));
  }
  out.want_final_norm = final_norm;
  out.final_norm = tensor_make(store.data() + num_taps * T * H, DType::f32, Device::cpu, T, H);
  fwd.run(id_t, seqs, out);
  Run r;
  for (int l = 0; l < num_taps; ++l) r.taps.emplace_back(store.begin() + l * T * H, store.begin() + (l + 1) * T * H);
  if (final_norm) r.final_norm.assign(store.begin() + num_taps * T * H, store.begin() + (num_taps + 1) * T * H);
  return r;
}

std::vector<int32_t> random_ids(int n, int vocab, uint32_t seed) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<int32_t>((seed * 2654435761u + i * 40503u) % vocab);
  return v;
}

// Max |a − b| / (1 + |b|): all values here are O(1), so this is a relative error with an absolute floor.
double max_err(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_FALSE(std::isnan(a[i]));
    e = std::max(e, std::abs(double(a[i]) - b[i]) / (1.0 + std::abs(double(b[i]))));
  }
  return e;
}

}  // namespace

class TargetForwardTest : public ::testing::TestWithParam<int> {
 protected:
  QwenConfig cfg() const { return GetParam() == 0 ? tiny_hybrid() : tiny_dense(); }
};

TEST_P(TargetForwardTest, PackingIsInvisible) {
  CpuOps ops;
  QwenConfig c = cfg();
  auto m = target_random(c, 7, ops, {});
  std::vector<int32_t> lengths{1, 19, 65, 7};
  int total = 0;
  for (int l : lengths) total += l;
  std::vector<int32_t> ids = random_ids(total, c.vocab, 3);
  Run packed = run_model(*m, ops, ids, lengths, c.layers, true);
  int off = 0;
  for (int32_t len : lengths) {
    std::vector<int32_t> one(ids.begin() + off, ids.begin() + off + len);
    Run alone = run_model(*m, ops, one, {len}, c.layers, true);
    const int64_t H = c.hidden;
    std::vector<float> slice(packed.final_norm.begin() + off * H, packed.final_norm.begin() + (off + len) * H);
    // Identical arithmetic per token except GEMM blocking over a different M: fp32 rounding only.
    EXPECT_LT(max_err(slice, alone.final_norm), 1e-5) << "sequence of length " << len;
    off += len;
  }
}

TEST_P(TargetForwardTest, EarlyStopMatchesFullRun) {
  CpuOps ops;
  QwenConfig c = cfg();
  auto full_model = target_random(c, 11, ops, {});
  TargetLoadOptions two;
  two.num_layers = 2;
  auto short_model = target_random(c, 11, ops, two);
  std::vector<int32_t> ids = random_ids(33, c.vocab, 5);
  Run full = run_model(*full_model, ops, ids, {33}, c.layers, true);
  Run part = run_model(*short_model, ops, ids, {33}, 2, false);
  for (int l = 0; l < 2; ++l) EXPECT_EQ(max_err(part.taps[l], full.taps[l]), 0.0) << "layer " << l;
  EXPECT_THROW(run_model(*short_model, ops, ids, {33}, 2, true), Error);  // final norm needs every layer
}

TEST_P(TargetForwardTest, SaveAndLoadRoundTrip) {
  CpuOps ops;
  QwenConfig c = cfg();
  TargetLoadOptions opt;
  opt.need_lm_head = !c.tie_word_embeddings;
  auto m = target_random(c, 13, ops, opt);
  auto dir = std::filesystem::temp_directory_path() / ("df_target_rt_" + std::to_string(GetParam()));
  target_save_hf(*m, dir.string());
  auto loaded = target_load(dir.string(), ops, opt);
  std::vector<int32_t> ids = random_ids(40, c.vocab, 9);
  Run a = run_model(*m, ops, ids, {25, 15}, c.layers, true);
  Run b = run_model(*loaded, ops, ids, {25, 15}, c.layers, true);
  EXPECT_EQ(max_err(a.final_norm, b.final_norm), 0.0);  // f32 weights written and read back exactly
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Families, TargetForwardTest, ::testing::Values(0, 1),
                         [](const auto& info) { return info.param == 0 ? "qwen3_5" : "qwen3"; });

TEST(TargetForward, ChunkedAndRecurrentDeltaNetAgree) {
  CpuOps chunked(CpuGdnMode::chunked), recurrent(CpuGdnMode::recurrent);
  QwenConfig c = tiny_hybrid();
  auto m1 = target_random(c, 17, chunked, {});
  auto m2 = target_random(c, 17, recurrent, {});
  std::vector<int32_t> ids = random_ids(64 + 65 + 1, c.vocab, 21);
  Run a = run_model(*m1, chunked, ids, {64, 65, 1}, c.layers, true);
  Run b = run_model(*m2, recurrent, ids, {64, 65, 1}, c.layers, true);
  // Same math, different association order inside a 64-chunk (UT solve vs token steps): fp32 noise
  // amplified by four layers stays well under 1e-4.
  EXPECT_LT(max_err(a.final_norm, b.final_norm), 1e-4);
}

TEST(TargetLoad, MissingAndMisshapedTensorsAreNamed) {
  CpuOps ops;
  QwenConfig c = tiny_dense();
  auto m = target_random(c, 1, ops, {});
  auto dir = std::filesystem::temp_directory_path() / "df_target_bad";
  target_save_hf(*m, dir.string());
  // Change the config so the stored tensors no longer fit: intermediate 36 -> 38.
  QwenConfig wrong = c;
  wrong.intermediate = 38;
  {
    std::ofstream f((dir / "config.json").string());
    f << qwen_config_to_json(wrong).dump();
  }
  try {
    target_load(dir.string(), ops, {});
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("model.layers.0.mlp.gate_proj.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[38, 20]"), std::string::npos) << msg;
  }
  std::filesystem::remove_all(dir);
}
