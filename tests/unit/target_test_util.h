// Shared helpers for the target model tests: two tiny random configs (a Qwen3.5 hybrid with both layer kinds
// and a tied Qwen3 dense), a full-sequence forward returning host taps, host logits, deterministic ids and a
// relative error.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/arena.h"
#include "model/target.h"

namespace df {

inline QwenConfig tiny_hybrid() {
  nlohmann::json j = {
      {"model_type", "qwen3_5_text"},
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

inline QwenConfig tiny_dense() {
  nlohmann::json j = {{"model_type", "qwen3"},      {"hidden_size", 20},
                      {"num_hidden_layers", 3},     {"intermediate_size", 36},
                      {"vocab_size", 29},           {"num_attention_heads", 5},
                      {"num_key_value_heads", 1},   {"head_dim", 6},
                      {"rope_theta", 1e6},          {"rms_norm_eps", 1e-6},
                      {"tie_word_embeddings", true}};
  return qwen_config_from_json(j, "tiny_dense");
}

struct FwdResult {
  std::vector<std::vector<float>> taps;  // one per layer
  std::vector<float> final_norm;
};

// Runs `lengths` as one packed batch with taps at every layer and the final norm.
inline FwdResult run_model(const TargetModel& m, Ops& ops, const std::vector<int32_t>& ids,
                           const std::vector<int32_t>& lengths, int num_taps, bool final_norm) {
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
  FwdResult r;
  for (int l = 0; l < num_taps; ++l)
    r.taps.emplace_back(store.begin() + l * T * H, store.begin() + (l + 1) * T * H);
  if (final_norm)
    r.final_norm.assign(store.begin() + num_taps * T * H, store.begin() + (num_taps + 1) * T * H);
  return r;
}

inline std::vector<int32_t> random_ids(int n, int vocab, uint32_t seed) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = static_cast<int32_t>((seed * 2654435761u + i * 40503u) % vocab);
  return v;
}

// Max |a − b| / (1 + |b|): all values here are O(1), so this is a relative error with an absolute floor.
inline double max_err(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_FALSE(std::isnan(a[i]));
    e = std::max(e, std::abs(double(a[i]) - b[i]) / (1.0 + std::abs(double(b[i]))));
  }
  return e;
}

// Host logits final_norm · lm_headᵀ, row-major [T, V], in double: the reference for the decoder's logits.
inline std::vector<float> host_logits(const TargetModel& m, Ops& ops, const std::vector<float>& final_norm) {
  const int64_t H = m.cfg.hidden, V = m.cfg.vocab, T = int64_t(final_norm.size()) / H;
  std::vector<float> w(size_t(V * H)), out(size_t(T * V));
  ops.download_f32(m.lm_head, w.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t v = 0; v < V; ++v) {
      double d = 0;
      for (int64_t i = 0; i < H; ++i) d += double(final_norm[size_t(t * H + i)]) * w[size_t(v * H + i)];
      out[size_t(t * V + v)] = float(d);
    }
  return out;
}

inline TargetLoadOptions with_lm_head() {
  TargetLoadOptions o;
  o.need_lm_head = true;
  return o;
}

// Tests run for both families: parameter 0 = the Qwen3.5 hybrid, 1 = Qwen3 dense (INSTANTIATE with
// target_family_name).
class TargetFamilyTest : public ::testing::TestWithParam<int> {
 protected:
  QwenConfig cfg() const { return GetParam() == 0 ? tiny_hybrid() : tiny_dense(); }
};
inline std::string target_family_name(const ::testing::TestParamInfo<int>& info) {
  return info.param == 0 ? "qwen3_5" : "qwen3";
}

}  // namespace df
