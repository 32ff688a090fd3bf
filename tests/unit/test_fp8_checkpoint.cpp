// Block-scaled FP8 checkpoints (model/fp8_weights.h, the target loader, quantization_config): dequantised
// weights are exactly e4m3(q)·scale_inv at block edges, a random tiny target written as FP8 loads back and
// runs the CPU forward close to the original, and every broken file is refused with the culprit named.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "core/dtype.h"
#include "core/error.h"
#include "core/fp8.h"
#include "core/strfmt.h"
#include "model/fp8_weights.h"
#include "model/safetensors.h"
#include "model/target.h"
#include "ops/cpu/cpu_ops.h"
#include "target_test_util.h"

using namespace df;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("df_fp8_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A checkpoint's tensors as owned bytes, so a test can edit them and write the file again.
struct Owned {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
};

std::vector<Owned> read_all(const fs::path& dir) {
  SafetensorsIndex st = SafetensorsIndex::open(dir.string());
  std::vector<Owned> out;
  for (const std::string& n : st.names()) {
    const StTensor* t = st.find(n);
    const uint8_t* p = static_cast<const uint8_t*>(t->data);
    out.push_back({n, t->dtype, t->shape, std::vector<uint8_t>(p, p + t->nbytes)});
  }
  return out;
}

void write_all(const fs::path& file, const std::vector<Owned>& ts) {
  std::vector<StWriteTensor> w;
  for (const Owned& t : ts) w.push_back({t.name, t.dtype, t.shape, t.bytes.data()});
  safetensors_write(file.string(), w);
}

template <class Vec>  // std::vector<Owned>, const or not
auto& find_owned(Vec& ts, const std::string& name) {
  for (auto& t : ts)
    if (t.name == name) return t;
  ADD_FAILURE() << "no tensor " << name;
  return ts.front();
}

std::vector<float> random_weights(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 0.05f);
  std::vector<float> w(n);
  for (float& v : w) v = d(rng);
  return w;
}

// Expects `fn` to throw a df::Error whose message holds every one of `parts`.
template <class F>
void expect_error(F fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

bool is_scale(const std::string& name) {
  const std::string suffix = "_scale_inv";
  return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

struct DequantCase {
  int64_t N, K;
  int bn, bk;
};

}  // namespace

// (a) The loader's dequantisation is the definition: w[n, k] = e4m3(q[n, k]) · scale_inv[n / bn, k / bk],
// bit for bit, with N and K not multiples of the block (partial last blocks) and tiny blocks (many of them),
// for F32 and BF16 scales. The quantiser's output is checked on the way: the largest |w| of each block maps
// to ±448 and every weight is within e4m3's half-ulp, 2^-4 relative (2^-10·scale absolute for subnormals).
TEST(Fp8Dequant, MatchesDefinitionAtBlockEdges) {
  const DequantCase cases[] = {{200, 72, 128, 128}, {200, 72, 16, 16}, {37, 29, 16, 8}, {5, 130, 128, 128}};
  for (const DequantCase& dc : cases) {
    SCOPED_TRACE(strfmt("[%lld, %lld] in %dx%d blocks", (long long)dc.N, (long long)dc.K, dc.bn, dc.bk));
    const std::vector<int64_t> sshape = fp8_scale_shape(dc.N, dc.K, dc.bn, dc.bk);
    EXPECT_EQ(sshape, (std::vector<int64_t>{(dc.N + dc.bn - 1) / dc.bn, (dc.K + dc.bk - 1) / dc.bk}));
    const int64_t kb = sshape[1];
    std::vector<float> w = random_weights(dc.N * dc.K, uint32_t(dc.N * 7 + dc.bk));
    std::vector<uint8_t> q(w.size());
    std::vector<float> scale(size_t(sshape[0] * kb));
    fp8_quantize(w.data(), dc.N, dc.K, dc.bn, dc.bk, q.data(), scale.data());

    std::vector<float> block_max(scale.size(), 0.0f);
    for (int64_t r = 0; r < dc.N; ++r)
      for (int64_t c = 0; c < dc.K; ++c) {
        const size_t b = size_t((r / dc.bn) * kb + c / dc.bk), i = size_t(r * dc.K + c);
        const float deq = e4m3_to_f32(q[i]) * scale[b];
        block_max[b] = std::max(block_max[b], std::fabs(e4m3_to_f32(q[i])));
        ASSERT_LE(std::fabs(deq - w[i]), std::ldexp(std::fabs(w[i]), -4) + std::ldexp(scale[b], -10))
            << "quantised [" << r << ", " << c << "]: " << w[i] << " -> " << deq;
      }
    for (float m : block_max) EXPECT_EQ(m, kE4m3Max);

    // BF16 scales: arbitrary bf16 numbers, so the F32 and BF16 reading paths both face the definition.
    std::vector<uint16_t> scale_bf16(scale.size());
    for (size_t b = 0; b < scale.size(); ++b) scale_bf16[b] = f32_to_bf16(scale[b] * (1.0f + 0.37f * b));
    const fs::path dir = temp_dir("dequant");
    safetensors_write((dir / "w.safetensors").string(),
                      {{"a.weight", DType::f8_e4m3, {dc.N, dc.K}, q.data()},
                       {"a.weight_scale_inv", DType::f32, sshape, scale.data()},
                       {"b.weight", DType::f8_e4m3, {dc.N, dc.K}, q.data()},
                       {"b.weight_scale_inv", DType::bf16, sshape, scale_bf16.data()}});
    SafetensorsIndex st = SafetensorsIndex::open((dir / "w.safetensors").string());
    std::vector<float> a(w.size()), b(w.size());
    fp8_dequantize(st, *st.find("a.weight"), dc.bn, dc.bk, a.data());
    fp8_dequantize(st, *st.find("b.weight"), dc.bn, dc.bk, b.data());
    for (int64_t r = 0; r < dc.N; ++r)
      for (int64_t c = 0; c < dc.K; ++c) {
        const size_t blk = size_t((r / dc.bn) * kb + c / dc.bk), i = size_t(r * dc.K + c);
        ASSERT_EQ(a[i], e4m3_to_f32(q[i]) * scale[blk]) << "f32 scales, [" << r << ", " << c << "]";
        ASSERT_EQ(b[i], e4m3_to_f32(q[i]) * bf16_to_f32(scale_bf16[blk]))
            << "bf16 scales, [" << r << ", " << c << "]";
      }
    fs::remove_all(dir);
  }
}

class Fp8CheckpointTest : public TargetFamilyTest {};

// Writes dir/model.safetensors + config.json (config c, no quantization) holding src's tensors with every
// _scale_inv dropped and every other tensor turned into f32 by `to_f32` (name, tensor, values out).
void write_f32_copy(
    const fs::path& src, const fs::path& dir, const QwenConfig& c,
    const std::function<void(const std::vector<Owned>&, const Owned&, std::vector<float>&)>& to_f32) {
  std::vector<Owned> ts = read_all(src), plain;
  for (const Owned& t : ts) {
    if (is_scale(t.name)) continue;
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    to_f32(ts, t, v);
    Owned o{t.name, DType::f32, t.shape, std::vector<uint8_t>(v.size() * 4)};
    std::memcpy(o.bytes.data(), v.data(), o.bytes.size());
    plain.push_back(std::move(o));
  }
  fs::create_directories(dir);
  write_all(dir / "model.safetensors", plain);
  std::ofstream((dir / "config.json").string()) << qwen_config_to_json(c).dump();
}

std::vector<float> owned_f32(const Owned& t) {
  std::vector<float> v(t.bytes.size() / 4);
  std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
  return v;
}

double norm_rel_err(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = double(a[i]) - ref[i];
    num += d * d;
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

// (b) A random tiny target written with FP8 projections (16x16 blocks, so every matrix spans several
// blocks and partial ones) loads back with exactly the dequantised weights — checked by an f32 checkpoint
// of the tensors dequantised here from the definition, whose forward must agree bit for bit — and its taps
// stay close to the original f32 model's.
//
// Bound: e4m3 rounds each weight (w / scale, then times scale) to within 2^-4 of itself (half an ulp of a
// 3-bit mantissa; subnormals, below 2^-6·scale, matter even less). So the reference for the taps' error is
// the same projections multiplied by 1 + 2^-4·u, u uniform in [-1, 1] and independent: a perturbation as
// large as e4m3's worst case everywhere, with an RMS (2^-4/√3) at least e4m3's (whose relative error is
// uniform in ±2^-4/m for significand m in [1, 2)). Going through the same model, this absorbs the model's own
// sensitivity, which is large, non-linear and concentrated in few directions in these tiny layers (a
// DeltaNet with 8-dim keys): one draw of such noise moved the hybrid's layer-0 taps by 0.056 to 0.26 over
// ten seeds. So the reference is the RMS over kDraws draws, and FP8 — one fixed, in effect random, draw of
// rounding errors — is allowed twice that: err_fp8 ≤ 2 · rms(err_noise) per tap layer (norm-wise relative
// error, both printed).
constexpr int kDraws = 8;

TEST_P(Fp8CheckpointTest, WrittenAsFp8LoadsBackAndRunsTheForward) {
  CpuOps ops;
  const QwenConfig c = cfg();
  const TargetLoadOptions opt = with_lm_head();
  auto m = target_random(c, 31, ops, opt);
  const fs::path root = temp_dir("model_" + std::to_string(GetParam()));
  TargetSaveOptions save;
  save.fp8_block_n = save.fp8_block_k = 16;
  target_save_hf(*m, (root / "fp8").string(), save);
  target_save_hf(*m, (root / "f32").string());

  int n_fp8 = 0;
  {
    SafetensorsIndex st = SafetensorsIndex::open((root / "fp8").string());
    for (const std::string& n : st.names()) {
      const bool fp8 = st.find(n)->dtype == DType::f8_e4m3;
      EXPECT_EQ(fp8, fp8_quantized_weight(n)) << n;
      n_fp8 += fp8;
      if (fp8) EXPECT_NE(st.find(fp8_scale_name(n)), nullptr) << n;
    }
  }
  // q, k, v, o per full layer, in_proj_qkv, in_proj_z, out_proj per DeltaNet layer, gate, up, down per dense
  // layer; per MoE layer the experts' (fused gate_up and down in the Qwen3.5 naming, three per expert in the
  // Qwen3 one) and the shared expert's three (the router and the shared expert's gate stay f32).
  int mlp = 0;
  for (int l = 0; l < c.layers; ++l)
    mlp += !c.layer_is_moe(l) ? 3
                              : (c.family == ModelFamily::qwen3_5 ? 2 : 3 * c.num_experts) +
                                    (c.shared_intermediate > 0 ? 3 : 0);
  EXPECT_EQ(n_fp8, 4 * c.num_full_layers() + 3 * c.num_linear_layers() + mlp);
  auto loaded = target_load((root / "fp8").string(), ops, opt);
  EXPECT_EQ(loaded->cfg.fp8_block_n, 16);
  EXPECT_EQ(loaded->cfg.fp8_block_k, 16);
  EXPECT_NE(qwen_config_summary(loaded->cfg).find("fp8"), std::string::npos);

  write_f32_copy(
      root / "fp8", root / "ref", c, [](const std::vector<Owned>& ts, const Owned& t, std::vector<float>& v) {
        if (t.dtype != DType::f8_e4m3) {
          v = owned_f32(t);
          return;
        }
        // 2-D [N, K], or the fused experts [E, N, K]: E matrices, each in its own 16x16 blocks.
        const std::vector<float> sc = owned_f32(find_owned(ts, fp8_scale_name(t.name)));
        const int64_t K = t.shape.back(), N = t.shape[t.shape.size() - 2], kb = (K + 15) / 16,
                      nb = (N + 15) / 16;
        for (size_t i = 0; i < v.size(); ++i) {
          const int64_t r = int64_t(i) / K;
          v[i] = e4m3_to_f32(t.bytes[i]) *
                 sc[size_t(((r / N) * nb + (r % N) / 16) * kb + (int64_t(i) % K) / 16)];
        }
      });
  auto reference = target_load((root / "ref").string(), ops, opt);
  EXPECT_EQ(reference->cfg.fp8_block_n, 0);

  std::vector<int32_t> ids = random_ids(41, c.vocab, 3);
  FwdResult orig = run_model(*m, ops, ids, {30, 11}, c.layers, true);
  FwdResult fp8 = run_model(*loaded, ops, ids, {30, 11}, c.layers, true);
  FwdResult ref = run_model(*reference, ops, ids, {30, 11}, c.layers, true);
  std::vector<double> noise_ms(size_t(c.layers), 0.0);  // mean square over the draws, per tap layer
  for (int draw = 0; draw < kDraws; ++draw) {
    std::mt19937 rng(uint32_t(draw + 1));
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const fs::path nd = root / ("noise" + std::to_string(draw));
    write_f32_copy(root / "f32", nd, c,
                   [&](const std::vector<Owned>&, const Owned& t, std::vector<float>& v) {
                     v = owned_f32(t);
                     if (fp8_quantized_weight(t.name))
                       for (float& x : v) x *= 1.0f + std::ldexp(u(rng), -4);
                   });
    FwdResult noise = run_model(*target_load(nd.string(), ops, opt), ops, ids, {30, 11}, c.layers, true);
    for (int l = 0; l < c.layers; ++l)
      noise_ms[l] += std::pow(norm_rel_err(noise.taps[l], orig.taps[l]), 2) / kDraws;
  }
  EXPECT_EQ(max_err(fp8.final_norm, ref.final_norm), 0.0)
      << "loader's dequantisation differs from the definition";
  for (int l = 0; l < c.layers; ++l) {
    EXPECT_EQ(max_err(fp8.taps[l], ref.taps[l]), 0.0) << "layer " << l;
    const double e8 = norm_rel_err(fp8.taps[l], orig.taps[l]), en = std::sqrt(noise_ms[l]);
    std::printf(
        "%s tap layer %d: norm-wise relative error FP8 %.4g, 2^-4 noise (rms of %d) %.4g, ratio %.3g "
        "(allowed <= 2)\n",
        c.model_type.c_str(), l, e8, kDraws, en, e8 / en);
    EXPECT_LE(e8, 2 * en) << "layer " << l;
  }
  fs::remove_all(root);
}

INSTANTIATE_TEST_SUITE_P(Families, Fp8CheckpointTest, ::testing::Values(0, 1, 2, 3), target_family_name);

// Published FP8 releases are sharded, and nothing keeps a weight and its scales in one shard: here every
// F8 weight goes to one shard and every scale to the other, and the model loads to the very same forward.
TEST(Fp8Checkpoint, ScalesInAnotherShard) {
  CpuOps ops;
  const QwenConfig c = tiny_hybrid();
  const TargetLoadOptions opt = with_lm_head();
  auto m = target_random(c, 9, ops, opt);
  const fs::path one = temp_dir("one"), sharded = temp_dir("sharded");
  TargetSaveOptions save;
  save.fp8_block_n = save.fp8_block_k = 16;
  target_save_hf(*m, one.string(), save);
  std::vector<Owned> a, b;
  json map = json::object();
  for (Owned& t : read_all(one)) {
    const bool scale = is_scale(t.name);
    map[t.name] = scale ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
    (scale ? b : a).push_back(std::move(t));
  }
  write_all(sharded / "model-00001-of-00002.safetensors", a);
  write_all(sharded / "model-00002-of-00002.safetensors", b);
  std::ofstream((sharded / "model.safetensors.index.json").string()) << json{{"weight_map", map}}.dump();
  fs::copy_file(one / "config.json", sharded / "config.json");
  std::vector<int32_t> ids = random_ids(23, c.vocab, 4);
  FwdResult x = run_model(*target_load(one.string(), ops, opt), ops, ids, {23}, c.layers, true);
  FwdResult y = run_model(*target_load(sharded.string(), ops, opt), ops, ids, {23}, c.layers, true);
  EXPECT_EQ(max_err(x.final_norm, y.final_norm), 0.0);
  fs::remove_all(one);
  fs::remove_all(sharded);
}

// (c) Broken FP8 checkpoints: each error names the tensor (or key), the file and what to do.
TEST(Fp8Checkpoint, BrokenFilesAreNamed) {
  CpuOps ops;
  const QwenConfig c = tiny_dense();
  auto m = target_random(c, 5, ops, {});
  const fs::path dir = temp_dir("broken");
  TargetSaveOptions save;
  save.fp8_block_n = 16;
  save.fp8_block_k = 8;
  target_save_hf(*m, dir.string(), save);
  const std::vector<Owned> good = read_all(dir);
  const std::string wname = "model.layers.1.mlp.down_proj.weight", sname = wname + "_scale_inv";
  const std::string file = (dir / "model.safetensors").string();
  auto load = [&] { target_load(dir.string(), ops, {}); };

  {  // the block scales are missing
    std::vector<Owned> ts;
    for (const Owned& t : good)
      if (t.name != sname) ts.push_back(t);
    write_all(file, ts);
    expect_error(load, {wname, sname, file, "missing"});
  }
  {  // the block scales have the shape of other blocks
    std::vector<Owned> ts = good;
    Owned& s = find_owned(ts, sname);
    s.shape = {s.shape[1], s.shape[0]};
    write_all(file, ts);
    expect_error(load, {sname, wname, file, "weight_block_size"});
  }
  {  // the block scales are integers
    std::vector<Owned> ts = good;
    find_owned(ts, sname).dtype = DType::i32;
    write_all(file, ts);
    expect_error(load, {sname, file, "F32 or BF16"});
  }
  {  // a NaN code inside a weight
    std::vector<Owned> ts = good;
    Owned& w = find_owned(ts, wname);
    w.bytes[w.shape[1] * 2 + 3] = 0xff;
    write_all(file, ts);
    expect_error(load, {wname, file, "NaN", "[2, 3]"});
  }
  {  // a 1-D tensor stored as FP8
    std::vector<Owned> ts = good;
    Owned& n = find_owned(ts, "model.layers.0.input_layernorm.weight");
    n.dtype = DType::f8_e4m3;
    n.bytes.resize(n.bytes.size() / 4);
    write_all(file, ts);
    expect_error(load, {"model.layers.0.input_layernorm.weight", file, "2-D"});
  }
  write_all(file, good);
  EXPECT_NO_THROW(load());
  {  // FP8 tensors but a config without quantization_config
    json j = qwen_config_to_json(c);
    std::ofstream((dir / "config.json").string()) << j.dump();
    expect_error(load, {"model.layers.0.self_attn.q_proj.weight", file, "quantization_config"});
  }
  {  // st_to_f32 cannot read FP8 codes without their scales
    SafetensorsIndex st = SafetensorsIndex::open(dir.string());
    std::vector<float> v(size_t(st.find(wname)->numel()));
    expect_error([&] { st_to_f32(*st.find(wname), v.data()); }, {wname, file, "F8_E4M3"});
  }
  fs::remove_all(dir);
}

// (d) Broken FP8 MoE checkpoints in both expert namings: the fused experts' 3-D scales and one expert's
// scales of the per-expert naming, each refused naming the tensor and the file.
TEST(Fp8Checkpoint, BrokenMoeFilesAreNamed) {
  CpuOps ops;
  TargetLoadOptions opt = with_lm_head();
  for (const QwenConfig& c : {tiny_moe_hybrid(), tiny_moe_dense()}) {
    SCOPED_TRACE(c.model_type);
    const fs::path dir = temp_dir("broken_moe");
    TargetSaveOptions save;
    save.fp8_block_n = save.fp8_block_k = 16;
    target_save_hf(*target_random(c, 3, ops, opt), dir.string(), save);
    const std::vector<Owned> good = read_all(dir);
    const bool fused = c.family == ModelFamily::qwen3_5;
    const std::string wname = fused ? "model.layers.2.mlp.experts.gate_up_proj"
                                    : "model.layers.2.mlp.experts.3.down_proj.weight",
                      sname = fp8_scale_name(wname), file = (dir / "model.safetensors").string();
    auto load = [&] { target_load(dir.string(), ops, opt); };
    EXPECT_NO_THROW(load());
    {  // the scales are missing
      std::vector<Owned> ts;
      for (const Owned& t : good)
        if (t.name != sname) ts.push_back(t);
      write_all(file, ts);
      expect_error(load, {wname, sname, file, "missing"});
    }
    {  // scales with a block row too few (per expert) or without the expert dimension (fused)
      std::vector<Owned> ts = good;
      Owned& sc = find_owned(ts, sname);
      if (fused)
        sc.shape = {sc.shape[0] * sc.shape[1], sc.shape[2]};
      else
        sc.shape = {sc.shape[0] - 1, sc.shape[1]};
      sc.bytes.resize(size_t(sc.shape[0] * sc.shape[1]) * 4);
      write_all(file, ts);
      expect_error(load, {sname, wname, file, "weight_block_size"});
    }
    fs::remove_all(dir);
  }
}

// quantization_config: the official Qwen FP8 form is read (at the top level of a multimodal wrapper too),
// written back by qwen_config_to_json, and everything else is refused naming the key and the file.
TEST(Fp8Checkpoint, QuantizationConfig) {
  json base = qwen_config_to_json(tiny_hybrid());
  json official = base;
  official["quantization_config"] = {
      {"activation_scheme", "dynamic"},
      {"fmt", "e4m3"},
      {"quant_method", "fp8"},
      {"weight_block_size", {128, 128}},
      {"modules_to_not_convert", {"lm_head", "model.visual.blocks.0.attn.qkv"}}};
  QwenConfig q = qwen_config_from_json(official, "/m/config.json");
  EXPECT_EQ(q.fp8_block_n, 128);
  EXPECT_EQ(q.fp8_block_k, 128);
  EXPECT_NE(qwen_config_summary(q).find("128x128"), std::string::npos);
  EXPECT_EQ(qwen_config_from_json(qwen_config_to_json(q), "rt").fp8_block_n, 128);
  EXPECT_EQ(qwen_config_from_json(base, "plain").fp8_block_n, 0);
  EXPECT_EQ(qwen_config_to_json(qwen_config_from_json(base, "plain")).count("quantization_config"), 0u);

  json wrapped = {{"model_type", "qwen3_5"},
                  {"text_config", base},
                  {"quantization_config", official["quantization_config"]}};
  wrapped["quantization_config"]["weight_block_size"] = {64, 32};
  QwenConfig w = qwen_config_from_json(wrapped, "/mm/config.json");
  EXPECT_EQ(w.fp8_block_n, 64);
  EXPECT_EQ(w.fp8_block_k, 32);

  struct Bad {
    const char* key;
    json value;  // null: remove the key
    std::string must_say;
  };
  const Bad bad[] = {{"quant_method", "awq", "quant_method 'awq'"},
                     {"quant_method", nullptr, "'quant_method' is missing"},
                     {"fmt", "e5m2", "fmt 'e5m2'"},
                     {"activation_scheme", "static", "activation_scheme 'static'"},
                     {"weight_block_size", nullptr, "'weight_block_size' is missing"},
                     {"weight_block_size", json::array({128}), "weight_block_size"},
                     {"weight_block_size", json::array({0, 128}), "weight_block_size"},
                     {"weight_block_size", json::array({128, 1.5}), "weight_block_size"},
                     {"modules_to_not_convert", "lm_head", "modules_to_not_convert"},
                     {"weight_per_tensor", true, "'weight_per_tensor' is not understood"}};
  for (const Bad& b : bad) {
    json j = official;
    if (b.value.is_null())
      j["quantization_config"].erase(b.key);
    else
      j["quantization_config"][b.key] = b.value;
    expect_error([&] { qwen_config_from_json(j, "/m/config.json"); },
                 {"/m/config.json: quantization_config", b.must_say});
  }
}
