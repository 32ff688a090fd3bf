// The target forward on the CPU backend with random tiny models: packing sequences changes nothing,
// early stop changes nothing, chunked and recurrent DeltaNet agree through the whole model, and a model
// saved as a Hugging Face checkpoint loads back to the same outputs. (Agreement with transformers itself
// is test_golden's job.)
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/safetensors.h"
#include "model/target.h"
#include "ops/cpu/cpu_ops.h"
#include "target_test_util.h"

using namespace df;

namespace {

// CpuOps that claims a DeltaNet workspace as the CUDA backend does (a made-up size, growing with the tokens)
// and records what each gdn_prefill call is handed, so the CPU build tests TargetForward's planning of it.
class WorkspaceProbeOps final : public Ops {
 public:
  static int64_t need(int64_t tokens) { return 13 * tokens + 5; }
  int calls = 0;
  std::vector<const void*> seen;  // workspace base of each call
  int64_t smallest = INT64_MAX;   // fewest bytes handed to any call, minus what that call needed

  Device device() const override { return c_.device(); }
  DType act_dtype() const override { return c_.act_dtype(); }
  const char* name() const override { return "cpu+probe"; }
  void* alloc_bytes(size_t bytes) override { return c_.alloc_bytes(bytes); }
  void free_bytes(void* p) override { c_.free_bytes(p); }
  void upload_f32(const Tensor& d, const float* h) override { c_.upload_f32(d, h); }
  void upload_raw(const Tensor& d, const void* h) override { c_.upload_raw(d, h); }
  void download_f32(const Tensor& s, float* h) override { c_.download_f32(s, h); }
  void download_raw(const Tensor& s, void* h) override { c_.download_raw(s, h); }
  void copy(const Tensor& s, const Tensor& d) override { c_.copy(s, d); }
  void fill_normal(const Tensor& d, uint64_t seed, uint64_t st, float mean, float std) override {
    c_.fill_normal(d, seed, st, mean, std);
  }
  void synchronize() override { c_.synchronize(); }
  void embedding(const Tensor& ids, const Tensor& t, const Tensor& o) override { c_.embedding(ids, t, o); }
  void gemm(const Tensor& a, const Tensor& w, const Tensor& c, float beta) override {
    c_.gemm(a, w, c, beta);
  }
  void rmsnorm(const Tensor& x, const Tensor& w, const Tensor& o, float eps, NormKind k) override {
    c_.rmsnorm(x, w, o, eps, k);
  }
  void add_rmsnorm(const Tensor& r, const Tensor& d, const Tensor& w, const Tensor& o, float eps,
                   NormKind k) override {
    c_.add_rmsnorm(r, d, w, o, eps, k);
  }
  void qk_norm_rope(const Tensor& x, const Tensor& w, const Tensor& pos, int heads, int hd, int rot,
                    float theta, float eps, NormKind k) override {
    c_.qk_norm_rope(x, w, pos, heads, hd, rot, theta, eps, k);
  }
  void attention_causal(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                        const SeqLayout& s, int hq, int hkv, int hd, float scale,
                        const Tensor* gate = nullptr) override {
    c_.attention_causal(q, k, v, o, s, hq, hkv, hd, scale, gate);
  }
  void sigmoid_gate(const Tensor& o, const Tensor& g) override { c_.sigmoid_gate(o, g); }
  void swiglu(const Tensor& g, const Tensor& u, const Tensor& o) override { c_.swiglu(g, u, o); }
  void conv1d_silu(const Tensor& x, const Tensor& w, const Tensor& o, const SeqLayout& s) override {
    c_.conv1d_silu(x, w, o, s);
  }
  void gdn_prefill(const Tensor& qkv, const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt,
                   const Tensor& o, const SeqLayout& s, const GdnShape& sh, const Tensor& ws) override {
    ++calls;
    seen.push_back(ws.data);
    EXPECT_EQ(ws.dtype, DType::u8);
    smallest = std::min(smallest, (ws.empty() ? 0 : int64_t(ws.nbytes())) - need(s.tokens));
    c_.gdn_prefill(qkv, a, b, A_log, dt, o, s, sh, ws);
  }
  int64_t gdn_workspace_bytes(int64_t tokens, const GdnShape&) const override { return need(tokens); }
  void gated_rmsnorm(const Tensor& o, const Tensor& z, const Tensor& w, const Tensor& out, int heads, int dv,
                     float eps) override {
    c_.gated_rmsnorm(o, z, w, out, heads, dv, eps);
  }
  void attention_cached(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, int64_t past, int hq,
                        int hkv, int hd, float scale, const Tensor* gate = nullptr) override {
    c_.attention_cached(q, k, v, o, past, hq, hkv, hd, scale, gate);
  }
  void gdn_decode(const Tensor& qkv, const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt,
                  const Tensor& o, const Tensor& st, const Tensor& sts, const GdnShape& sh) override {
    c_.gdn_decode(qkv, a, b, A_log, dt, o, st, sts, sh);
  }

 private:
  CpuOps c_;
};

}  // namespace

using TargetForwardTest = TargetFamilyTest;

TEST_P(TargetForwardTest, PackingIsInvisible) {
  CpuOps ops;
  QwenConfig c = cfg();
  auto m = target_random(c, 7, ops, {});
  std::vector<int32_t> lengths{1, 19, 65, 7};
  int total = 0;
  for (int l : lengths) total += l;
  std::vector<int32_t> ids = random_ids(total, c.vocab, 3);
  FwdResult packed = run_model(*m, ops, ids, lengths, c.layers, true);
  int off = 0;
  for (int32_t len : lengths) {
    std::vector<int32_t> one(ids.begin() + off, ids.begin() + off + len);
    FwdResult alone = run_model(*m, ops, one, {len}, c.layers, true);
    const int64_t H = c.hidden;
    std::vector<float> slice(packed.final_norm.begin() + off * H, packed.final_norm.begin() + (off + len) * H);
    // Identical arithmetic per token except GEMM blocking over a different M: fp32 rounding only.
    EXPECT_LT(max_err(slice, alone.final_norm), 1e-5 * rounding_factor()) << "sequence of length " << len;
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
  FwdResult full = run_model(*full_model, ops, ids, {33}, c.layers, true);
  FwdResult part = run_model(*short_model, ops, ids, {33}, 2, false);
  for (int l = 0; l < 2; ++l) EXPECT_EQ(max_err(part.taps[l], full.taps[l]), 0.0) << "layer " << l;
  EXPECT_THROW(run_model(*short_model, ops, ids, {33}, 2, true), Error);  // final norm needs every layer
}

TEST_P(TargetForwardTest, SaveAndLoadRoundTrip) {
  CpuOps ops;
  QwenConfig c = cfg();
  TargetLoadOptions opt;
  opt.need_lm_head = !c.tie_word_embeddings;
  auto m = target_random(c, 13, ops, opt);
  auto dir = std::filesystem::temp_directory_path() /
             ("df_target_rt_" + std::to_string(GetParam()) + "_" + std::to_string(::getpid()));
  target_save_hf(*m, dir.string());
  auto loaded = target_load(dir.string(), ops, opt);
  std::vector<int32_t> ids = random_ids(40, c.vocab, 9);
  FwdResult a = run_model(*m, ops, ids, {25, 15}, c.layers, true);
  FwdResult b = run_model(*loaded, ops, ids, {25, 15}, c.layers, true);
  EXPECT_EQ(max_err(a.final_norm, b.final_norm), 0.0);  // f32 weights written and read back exactly
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Families, TargetForwardTest, ::testing::Values(0, 1, 2, 3, 4), target_family_name);

TEST(TargetForward, ChunkedAndRecurrentDeltaNetAgree) {
  CpuOps chunked(CpuGdnMode::chunked), recurrent(CpuGdnMode::recurrent);
  QwenConfig c = tiny_hybrid();
  auto m1 = target_random(c, 17, chunked, {});
  auto m2 = target_random(c, 17, recurrent, {});
  std::vector<int32_t> ids = random_ids(64 + 65 + 1, c.vocab, 21);
  FwdResult a = run_model(*m1, chunked, ids, {64, 65, 1}, c.layers, true);
  FwdResult b = run_model(*m2, recurrent, ids, {64, 65, 1}, c.layers, true);
  // Same math, different association order inside a 64-chunk (UT solve vs token steps): fp32 noise
  // amplified by four layers stays well under 1e-4.
  EXPECT_LT(max_err(a.final_norm, b.final_norm), 1e-4);
}

TEST(TargetLoad, MissingAndMisshapedTensorsAreNamed) {
  CpuOps ops;
  QwenConfig c = tiny_dense();
  auto m = target_random(c, 1, ops, {});
  auto dir = std::filesystem::temp_directory_path() / ("df_target_bad_" + std::to_string(::getpid()));
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

// An MoE checkpoint whose experts disagree with its config or with themselves is refused naming the tensor: an expert
// past num_experts (here the file's fifth of a config that says 4), a layer holding both the fused and the
// per-expert naming.
TEST(TargetLoad, StrayMoeExpertsAreNamed) {
  CpuOps ops;
  auto expect_refusal = [&](const std::filesystem::path& dir, const std::string& needle) {
    try {
      target_load(dir.string(), ops, {});
      FAIL() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const QwenConfig per_expert = tiny_moe_dense();  // qwen3_moe: saved one triple per expert, 5 experts
  auto dir = std::filesystem::temp_directory_path() / ("df_moe_stray_" + std::to_string(::getpid()));
  target_save_hf(*target_random(per_expert, 3, ops, {}), dir.string());
  QwenConfig fewer = per_expert;
  fewer.num_experts = 4;
  std::ofstream((dir / "config.json").string()) << qwen_config_to_json(fewer).dump();
  expect_refusal(dir, "model.layers.0.mlp.experts.4.gate_proj.weight");
  std::filesystem::remove_all(dir);

  const QwenConfig fused = tiny_moe_hybrid();  // qwen3_5_moe_text: saved fused
  target_save_hf(*target_random(fused, 4, ops, with_lm_head()), dir.string());
  {  // the same file with one per-expert tensor added beside layer 0's fused experts
    const SafetensorsIndex st = SafetensorsIndex::open(dir.string());
    std::vector<StWriteTensor> out;
    for (const std::string& name : st.names()) {
      const StTensor* t = st.find(name);
      out.push_back({name, t->dtype, t->shape, t->data});
    }
    const std::vector<float> extra(static_cast<size_t>(fused.moe_intermediate * fused.hidden), 0.0f);
    out.push_back({"model.layers.0.mlp.experts.0.gate_proj.weight", DType::f32,
                   {fused.moe_intermediate, fused.hidden}, extra.data()});
    safetensors_write((dir / "model.safetensors.new").string(), out);
  }
  std::filesystem::rename(dir / "model.safetensors.new", dir / "model.safetensors");
  expect_refusal(dir, "model.layers.0.mlp.experts.0.gate_proj.weight");
  std::filesystem::remove_all(dir);
}

// The DeltaNet workspace is planned once, inside the forward's block, for the largest batch: every
// gdn_prefill of every batch gets the same bytes, at least what it asked for, and nothing changes the
// outputs.
TEST(TargetForward, PlansTheDeltaNetWorkspaceOnce) {
  QwenConfig c = tiny_hybrid();  // layers 0 and 2 are DeltaNet
  WorkspaceProbeOps probe;
  CpuOps plain;
  auto mp = target_random(c, 23, probe, {});
  auto m = target_random(c, 23, plain, {});
  const int64_t max_tokens = 19;
  const size_t with_ws = TargetForward(*mp, max_tokens).workspace_bytes();
  const size_t without = TargetForward(*m, max_tokens).workspace_bytes();
  // The arena rounds each allocation's start up to Arena::kAlign, so the block grows by the request plus at
  // most one alignment gap.
  EXPECT_GE(with_ws, without + size_t(WorkspaceProbeOps::need(max_tokens)));
  EXPECT_LE(with_ws, without + size_t(WorkspaceProbeOps::need(max_tokens)) + Arena::kAlign);

  std::vector<int32_t> ids = random_ids(19, c.vocab, 29);
  FwdResult a = run_model(*mp, probe, ids, {7, 1, 11}, c.layers, true);
  FwdResult b = run_model(*m, plain, ids, {7, 1, 11}, c.layers, true);
  EXPECT_EQ(probe.calls, 2);
  ASSERT_EQ(probe.seen.size(), 2u);
  EXPECT_NE(probe.seen[0], nullptr);
  EXPECT_EQ(probe.seen[0], probe.seen[1]);
  EXPECT_GE(probe.smallest, 0);
  EXPECT_EQ(max_err(a.final_norm, b.final_norm), 0.0);
}
