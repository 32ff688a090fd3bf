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
#include "model/target_decode.h"

namespace df {

// How far an FP8 CUDA forward's taps may sit from the CPU FP8 emulation's, as a multiple of the FP8 rounding
// error itself (CPU FP8 vs CPU fp32 on the same weights): the CUDA path's bf16 weights and activations move an
// element across an e4m3 rounding boundary now and then, a bf16 difference of up to 2^-9 against an e4m3 spacing
// of 2^-4..2^-3 relative, each flip one e4m3 step; the two paths' code flips are two draws of that noise, at most
// the FP8 error apart (1x). The residual adds round the projection's product to bf16 before adding it (as HF's
// bf16 Linear + add does; kernels/gemm/gemm.cuh gemm_fp8_launch), up to twice the bf16 difference of one rounding,
// twice the flips, sqrt(2) their RMS. Measured on the H200: 1.06-1.07x on the tiny hybrids with that add, below
// 1x with a single rounding. The bugs left possible (the GEMM takes only codes, so an unquantised operand cannot
// reach it) are wrong scales, a mis-placed scale vector or lost b / a rows: O(1), 10x and more.
constexpr double kFp8CudaAgreement = 1.41421356;

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

// tiny_dense with a mixture-of-experts MLP (qwen3_moe): top-2 of 5 experts of width 12, probabilities not
// renormalised, layer 1 dense (mlp_only_layers).
inline QwenConfig tiny_moe_dense() {
  nlohmann::json j = {{"model_type", "qwen3_moe"},    {"hidden_size", 20},         {"num_hidden_layers", 3},
                      {"intermediate_size", 36},      {"vocab_size", 29},          {"num_attention_heads", 5},
                      {"num_key_value_heads", 1},     {"head_dim", 6},             {"rope_theta", 1e6},
                      {"rms_norm_eps", 1e-6},         {"tie_word_embeddings", true}, {"num_experts", 5},
                      {"num_experts_per_tok", 2},     {"moe_intermediate_size", 12}, {"norm_topk_prob", false},
                      {"mlp_only_layers", {1}}};
  return qwen_config_from_json(j, "tiny_moe_dense");
}

// tiny_hybrid as a Qwen3.5-MoE (qwen3_5_moe_text): every layer top-3 of 7 experts of width 10 plus a gated shared
// expert of 14.
inline nlohmann::json tiny_moe_hybrid_json() {
  return {
      {"model_type", "qwen3_5_moe_text"},
      {"hidden_size", 24},
      {"num_hidden_layers", 4},
      {"layer_types", {"linear_attention", "full_attention", "linear_attention", "full_attention"}},
      {"vocab_size", 37},
      {"num_attention_heads", 3},
      {"num_key_value_heads", 1},
      {"head_dim", 8},
      {"partial_rotary_factor", 0.5},
      {"rope_theta", 10000.0},
      {"rms_norm_eps", 1e-6},
      {"linear_num_key_heads", 1},
      {"linear_num_value_heads", 3},
      {"linear_key_head_dim", 8},
      {"linear_value_head_dim", 4},
      {"linear_conv_kernel_dim", 4},
      {"tie_word_embeddings", false},
      {"num_experts", 7},
      {"num_experts_per_tok", 3},
      {"moe_intermediate_size", 10},
      {"shared_expert_intermediate_size", 14}};
}

inline QwenConfig tiny_moe_hybrid() { return qwen_config_from_json(tiny_moe_hybrid_json(), "tiny_moe_hybrid"); }

// tiny_moe_hybrid as a Qwen3-Next (qwen3_next): DeltaNet projections fused per key head, here 2 key heads of 4 feeding
// 2 value heads of 3 each so every piece of that layout is regrouped; top-3 not renormalised; layer 2 dense
// (mlp_only_layers, width 18).
inline QwenConfig tiny_next() {
  nlohmann::json j = tiny_moe_hybrid_json();
  j.update({{"model_type", "qwen3_next"},
            {"linear_num_key_heads", 2},
            {"linear_num_value_heads", 4},
            {"linear_key_head_dim", 4},
            {"linear_value_head_dim", 3},
            {"norm_topk_prob", false},
            {"mlp_only_layers", {2}},
            {"intermediate_size", 18}});
  return qwen_config_from_json(j, "tiny_next");
}

// A gated hybrid of `layers` layers alternating a DeltaNet layer (1 key and 2 value heads) and an attention layer
// (2 heads, 1 KV head), of the given widths: the FP8 tests choose them against the FP8 GEMMs' 16-wide K steps and
// the 128-wide blocks.
inline QwenConfig gated_hybrid(int64_t hidden, int64_t intermediate, int head_dim, int lin_dk, int lin_dv,
                               const char* name, int layers = 2, int64_t vocab = 64) {
  nlohmann::json types = nlohmann::json::array();
  for (int l = 0; l < layers; ++l) types.push_back(l % 2 == 0 ? "linear_attention" : "full_attention");
  nlohmann::json j = {{"model_type", "qwen3_5_text"},
                      {"hidden_size", hidden},
                      {"num_hidden_layers", layers},
                      {"layer_types", types},
                      {"intermediate_size", intermediate},
                      {"vocab_size", vocab},
                      {"num_attention_heads", 2},
                      {"num_key_value_heads", 1},
                      {"head_dim", head_dim},
                      {"attn_output_gate", true},
                      {"partial_rotary_factor", 0.5},
                      {"rope_theta", 10000.0},
                      {"rms_norm_eps", 1e-6},
                      {"linear_num_key_heads", 1},
                      {"linear_num_value_heads", 2},
                      {"linear_key_head_dim", lin_dk},
                      {"linear_value_head_dim", lin_dv},
                      {"linear_conv_kernel_dim", 4},
                      {"tie_word_embeddings", false}};
  return qwen_config_from_json(j, name);
}

struct FwdResult {
  std::vector<std::vector<float>> taps;  // one per layer
  std::vector<float> final_norm;
};

// Runs `lengths` as one packed batch with taps at the first num_taps layers and the final norm, on any backend:
// the outputs in its act dtype, downloaded as f32.
inline FwdResult run_model(const TargetModel& m, Ops& ops, const std::vector<int32_t>& ids,
                           const std::vector<int32_t>& lengths, int num_taps, bool final_norm) {
  const int64_t T = ids.size(), H = m.cfg.hidden;
  TargetForward fwd(m, T);
  Tensor taps, fin, id_t;
  Arena arena;
  // The sequence layout (offsets and positions, each aligned) goes into the extra bytes.
  const size_t layout_bytes = (lengths.size() + 1 + size_t(T)) * 4 + 2 * Arena::kAlign;
  void* block = ops_alloc_planned(
      ops,
      [&](Arena& a) {
        taps = a.alloc(ops.act_dtype(), T, int64_t(std::max(num_taps, 1)) * H);
        fin = a.alloc(ops.act_dtype(), T, H);
        id_t = a.alloc(DType::i32, 1, T);
      },
      layout_bytes, arena);
  SeqLayout seqs = seq_layout_make(lengths, ops, arena);
  ops.upload_raw(id_t, ids.data());
  TargetOutputs out;
  for (int l = 0; l < num_taps; ++l) {
    out.tap_layers.push_back(l);
    out.taps.push_back(taps.cols_view(int64_t(l) * H, H));
  }
  out.want_final_norm = final_norm;
  out.final_norm = fin;
  fwd.run(id_t, seqs, out);
  FwdResult r;
  for (int l = 0; l < num_taps; ++l) {
    r.taps.emplace_back(size_t(T * H));
    ops.download_f32(out.taps[size_t(l)], r.taps.back().data());
  }
  if (final_norm) {
    r.final_norm.resize(size_t(T * H));
    ops.download_f32(fin, r.final_norm.data());
  }
  ops.free_bytes(block);
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

// ||a − b|| / ||b|| (relative RMS error), flagging NaN in a and a size mismatch.
inline double rel_rms(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    EXPECT_FALSE(std::isnan(a[i])) << "element " << i;
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
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

// Tests run for both families: parameter 0 = the Qwen3.5 hybrid, 1 = Qwen3 dense, and where a test also covers
// the mixture-of-experts targets 2 = Qwen3-MoE, 3 = Qwen3.5-MoE, 4 = Qwen3-Next (INSTANTIATE with
// target_family_name).
class TargetFamilyTest : public ::testing::TestWithParam<int> {
 protected:
  QwenConfig cfg() const {
    switch (GetParam()) {
      case 0: return tiny_hybrid();
      case 1: return tiny_dense();
      case 2: return tiny_moe_dense();
      case 3: return tiny_moe_hybrid();
      default: return tiny_next();
    }
  }
  // How much more than the others this model amplifies fp32 rounding, for bounds that compare two summation
  // orders. The tiny Qwen3.5-MoE's third layer (DeltaNet + 3 of 7 experts + the shared expert) grows a
  // difference about 5x more than the dense hybrid's third layer does: packed vs alone, the 65-token sequence's
  // taps differ by 2.0e-5 after it (4.3e-6 on the dense hybrid), 1.3e-6 before it on both. Still rounding: a
  // routing decision flipped by it would move a tap by ~1e-2.
  double rounding_factor() const { return GetParam() >= 3 ? 5.0 : 1.0; }
};
// The rollback scenario both backends test, on model seed 5 and ids seed 8. The speculative path: a prompt of
// 9, a 6-token block rejected outright (nothing of it may remain), another of which 3 are kept, then a probe
// step of 4 tokens. The fresh path: a prefill of the 12 accepted tokens, then the same probe. Returns each
// path's probe logits and taps of the first and last layer (host f32) and the speculative path's length.
struct RollbackRun {
  std::vector<float> spec_logits, fresh_logits;
  std::vector<std::vector<float>> spec_taps, fresh_taps;
  int64_t spec_length = 0;
};
inline RollbackRun rollback_vs_fresh_prefill(const TargetModel& m) {
  Ops& ops = *m.ops;
  const std::vector<int32_t> ids = random_ids(30, m.cfg.vocab, 8);
  auto span = [&](int64_t a, int64_t b) { return std::vector<int32_t>(ids.begin() + a, ids.begin() + b); };
  auto host = [&](const Tensor& t) {
    std::vector<float> v(size_t(t.numel()));
    ops.download_f32(t, v.data());
    return v;
  };
  TargetDecoder spec(m, {40, 16, 6}, {0, m.cfg.layers - 1});
  spec.step(span(0, 9));
  spec.commit(9);
  spec.step(span(20, 26));
  spec.commit(0);
  spec.step(span(9, 15));
  spec.commit(3);
  spec.step(span(12, 16));
  TargetDecoder fresh(m, {40, 16, 6}, {0, m.cfg.layers - 1});
  fresh.step(span(0, 12));
  fresh.commit(12);
  fresh.step(span(12, 16));
  RollbackRun r;
  r.spec_logits = host(spec.logits());
  r.fresh_logits = host(fresh.logits());
  for (size_t i = 0; i < 2; ++i) {
    r.spec_taps.push_back(host(spec.tap(i)));
    r.fresh_taps.push_back(host(fresh.tap(i)));
  }
  r.spec_length = spec.length();
  return r;
}

inline std::string target_family_name(const ::testing::TestParamInfo<int>& info) {
  static const char* names[] = {"qwen3_5", "qwen3", "qwen3_moe", "qwen3_5_moe", "qwen3_next"};
  return names[info.param];
}

}  // namespace df
