// Hugging Face config.json -> QwenConfig, and back. Missing keys fall back to the defaults transformers 5.x
// itself uses for that model_type, so a file transformers loads is read the same way here; a file it would
// reject (or read in a way this code cannot run) is refused with the key and the file named.
#include "model/qwen_config.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_util.h"

namespace df {

namespace {

using json = nlohmann::json;

// A JSON object plus where it came from ("/m/config.json" or "/m/config.json: text_config"), so every
// message can name the file and the key.
struct CfgObj {
  const json& j;
  std::string where;

  // nullptr when the key is absent or null (transformers treats an explicit null as "use the default").
  const json* find(const char* key) const {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  [[noreturn]] void fail_type(const char* key, const char* want, const json& v) const {
    DF_FAIL("%s: key '%s' must be %s, got %s %s", where.c_str(), key, want, v.type_name(), v.dump().c_str());
  }
  [[noreturn]] void fail_missing(const char* key) const {
    DF_FAIL("%s: required key '%s' is missing; is this the config.json of a Qwen3 / Qwen3.5 model?",
            where.c_str(), key);
  }
  int get_int(const char* key) const {
    const json* v = find(key);
    if (!v) fail_missing(key);
    return as_int(key, *v);
  }
  int get_int(const char* key, int def) const {
    const json* v = find(key);
    return v ? as_int(key, *v) : def;
  }
  int as_int(const char* key, const json& v) const {
    if (!v.is_number_integer()) fail_type(key, "an integer", v);
    const int64_t x = v.get<int64_t>();
    if (x < INT32_MIN || x > INT32_MAX) fail_type(key, "an integer that fits in 32 bits", v);
    return static_cast<int>(x);
  }
  double get_double(const char* key, double def) const {
    const json* v = find(key);
    if (!v) return def;
    if (!v->is_number()) fail_type(key, "a number", *v);
    return v->get<double>();
  }
  bool get_bool(const char* key, bool def) const {
    const json* v = find(key);
    if (!v) return def;
    if (!v->is_boolean()) fail_type(key, "true or false", *v);
    return v->get<bool>();
  }
  std::string get_string(const char* key) const {
    const json* v = find(key);
    if (!v) fail_missing(key);
    if (!v->is_string()) fail_type(key, "a string", *v);
    return v->get<std::string>();
  }
  // A nested object, or nullptr when absent/null; any other type is an error.
  const json* get_object(const char* key) const {
    const json* v = find(key);
    if (v && !v->is_object()) fail_type(key, "an object", *v);
    return v;
  }
};

// The attention/mixer family of a model_type and whether its MLP is the mixture-of-experts block.
bool model_type_family(const std::string& t, ModelFamily* out, bool* moe) {
  *moe = t == "qwen3_moe" || t == "qwen3_5_moe" || t == "qwen3_5_moe_text" || t == "qwen3_next";
  if (t == "qwen3" || t == "qwen3_moe") {
    *out = ModelFamily::qwen3;
    return true;
  }
  if (t == "qwen3_5" || t == "qwen3_5_text" || t == "qwen3_5_moe" || t == "qwen3_5_moe_text" || t == "qwen3_next") {
    *out = ModelFamily::qwen3_5;
    return true;
  }
  return false;
}

// The MoE keys as transformers 5.x reads them. Qwen3MoeConfig: num_experts 128, top-8, experts of 768,
// norm_topk_prob false, decoder_sparse_step 1, mlp_only_layers [], no shared expert (a
// shared_expert_intermediate_size key in such a file is ignored, as Qwen3MoeSparseMoeBlock ignores it).
// Qwen3_5MoeTextConfig: 256 experts, top-8, experts and shared expert of 512, every layer sparse and the top-k
// always renormalised (its router has no norm_topk_prob; the config class deletes that key, decoder_sparse_step
// and mlp_only_layers, so the model ignores them and so does this reader). Qwen3NextConfig: 512 experts, top-10,
// experts and shared expert of 512, norm_topk_prob true, and it honours decoder_sparse_step and mlp_only_layers.
void parse_moe(const CfgObj& cfg, QwenConfig& c) {
  const bool next = c.per_key_head_gdn_proj();
  const bool q35 = c.family == ModelFamily::qwen3_5 && !next;
  // Qwen3MoeConfig maps num_experts to num_local_experts (its attribute_map), so transformers 5.x writes the
  // latter; released files carry the former. Both are read; two different values are refused.
  c.num_experts = cfg.get_int("num_experts", cfg.get_int("num_local_experts", next ? 512 : q35 ? 256 : 128));
  DF_CHECK(!cfg.find("num_experts") || !cfg.find("num_local_experts") ||
               cfg.get_int("num_local_experts") == c.num_experts,
           "%s: keys 'num_experts' (%d) and 'num_local_experts' (%d) disagree", cfg.where.c_str(), c.num_experts,
           cfg.get_int("num_local_experts", 0));
  c.experts_per_tok = cfg.get_int("num_experts_per_tok", next ? 10 : 8);
  c.moe_intermediate = cfg.get_int("moe_intermediate_size", q35 || next ? 512 : 768);
  c.shared_intermediate = q35 || next ? cfg.get_int("shared_expert_intermediate_size", 512) : 0;
  c.norm_topk_prob = q35 ? true : cfg.get_bool("norm_topk_prob", next);
  DF_CHECK(c.num_experts >= 0, "%s: key 'num_experts' must not be negative, got %d", cfg.where.c_str(),
           c.num_experts);
  DF_CHECK(c.shared_intermediate >= 0, "%s: key 'shared_expert_intermediate_size' must not be negative, got %d",
           cfg.where.c_str(), c.shared_intermediate);
  int step = 1;
  std::vector<uint8_t> dense(size_t(c.layers), 0);
  if (!q35) {
    step = cfg.get_int("decoder_sparse_step", 1);
    DF_CHECK(step > 0, "%s: key 'decoder_sparse_step' must be positive, got %d", cfg.where.c_str(), step);
    if (const json* mo = cfg.find("mlp_only_layers")) {
      if (!mo->is_array()) cfg.fail_type("mlp_only_layers", "an array of layer indices", *mo);
      for (const json& e : *mo) {
        const int l = cfg.as_int("mlp_only_layers", e);
        DF_CHECK(l >= 0 && l < c.layers, "%s: key 'mlp_only_layers' lists layer %d; layers are 0..%d",
                 cfg.where.c_str(), l, c.layers - 1);
        dense[size_t(l)] = 1;
      }
    }
  }
  c.moe_layers.assign(size_t(c.layers), 0);
  for (int l = 0; l < c.layers; ++l)
    c.moe_layers[size_t(l)] = c.num_experts > 0 && !dense[size_t(l)] && (l + 1) % step == 0;
  if (c.num_experts == 0) return;
  DF_CHECK(c.experts_per_tok >= 1 && c.experts_per_tok <= c.num_experts,
           "%s: key 'num_experts_per_tok' is %d; it must be 1..num_experts (%d)", cfg.where.c_str(),
           c.experts_per_tok, c.num_experts);
  DF_CHECK(c.moe_intermediate > 0, "%s: key 'moe_intermediate_size' must be positive, got %d", cfg.where.c_str(),
           c.moe_intermediate);
}

// transformers 5.x keeps rope settings in `rope_parameters` (per layer type in some files), 4.x at the top
// level with extras in `rope_scaling`; the first place that holds a key wins.
struct RopeSources {
  std::vector<CfgObj> objs;

  explicit RopeSources(const CfgObj& top) {
    if (const json* rp = top.get_object("rope_parameters")) {
      CfgObj rpo{*rp, top.where + ": rope_parameters"};
      if (const json* fa = rpo.get_object("full_attention"))
        objs.push_back({*fa, rpo.where + ".full_attention"});
      objs.push_back(rpo);
    }
    if (const json* rs = top.get_object("rope_scaling")) objs.push_back({*rs, top.where + ": rope_scaling"});
    objs.push_back(top);
    // Scaled RoPE variants (yarn, linear, dynamic ...) change the frequencies; running them as plain RoPE
    // would silently give wrong logits, so they are refused.
    for (const CfgObj& o : objs) {
      if (&o.j == &top.j) continue;
      for (const char* key : {"rope_type", "type"}) {
        const json* v = o.find(key);
        if (!v) continue;
        if (!v->is_string()) o.fail_type(key, "a string", *v);
        const std::string s = v->get<std::string>();
        DF_CHECK(
            s == "default" || s == "mrope",
            "%s: %s '%s' is not supported (only plain RoPE, and mRoPE for text, are implemented); remove "
            "the scaling entry to run at the native context length",
            o.where.c_str(), key, s.c_str());
      }
    }
  }
  const CfgObj* holder(const char* key) const {
    for (const CfgObj& o : objs)
      if (o.find(key)) return &o;
    return nullptr;
  }
};

std::string file_read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DF_CHECK(in.good(), "cannot open model config %s (expected a Hugging Face config.json)", path.c_str());
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// mRoPE splits the rotary frequencies into (temporal, height, width) sections; for text all three positions
// are equal so any split gives plain RoPE, but transformers wants the sections to cover rot_dim/2.
std::vector<int> mrope_sections(int rot_dim) {
  const int r = rot_dim / 2;
  const int a = (r + 2) / 3;
  const int b = std::min(a, r - a);
  return {a, b, r - a - b};
}

// quantization_config as the official Qwen FP8 releases write it (and transformers' FineGrainedFP8Config /
// vLLM's Fp8Config read it): block-scaled e4m3 weights, activations quantised on the fly ("dynamic").
// Anything this loader would read differently is refused rather than guessed at.
void parse_quantization_config(const CfgObj& q, QwenConfig& c) {
  for (const auto& item : q.j.items()) {
    // A named copy, not a structured binding: clang 14 (the sanitizer build) cannot capture those in a lambda.
    const std::string key = item.key();
    static const char* known[] = {"quant_method",           "fmt",
                                  "weight_block_size",      "activation_scheme",
                                  "modules_to_not_convert", "ignored_layers"};
    DF_CHECK(
        std::find_if(std::begin(known), std::end(known), [&](const char* k) { return key == k; }) !=
            std::end(known),
        "%s: key '%s' is not understood (known: quant_method, fmt, weight_block_size, activation_scheme, "
        "modules_to_not_convert, ignored_layers); HINT: only block-scaled FP8 checkpoints are supported",
        q.where.c_str(), key.c_str());
  }
  const std::string method = q.get_string("quant_method");
  DF_CHECK(method == "fp8",
           "%s: quant_method '%s' is not supported (only 'fp8', the block-scaled e4m3 format of the official "
           "Qwen FP8 releases); HINT: use the bf16 release of the model",
           q.where.c_str(), method.c_str());
  if (const json* fmt = q.find("fmt")) {
    if (!fmt->is_string()) q.fail_type("fmt", "a string", *fmt);
    DF_CHECK(fmt->get<std::string>() == "e4m3", "%s: fmt '%s' is not supported (only 'e4m3')",
             q.where.c_str(), fmt->get<std::string>().c_str());
  }
  if (const json* act = q.find("activation_scheme")) {
    if (!act->is_string()) q.fail_type("activation_scheme", "a string", *act);
    DF_CHECK(act->get<std::string>() == "dynamic",
             "%s: activation_scheme '%s' is not supported (only 'dynamic': static activation scales are "
             "not read)",
             q.where.c_str(), act->get<std::string>().c_str());
  }
  for (const char* key : {"modules_to_not_convert", "ignored_layers"}) {
    const json* v = q.find(key);
    if (v &&
        !(v->is_array() && std::all_of(v->begin(), v->end(), [](const json& e) { return e.is_string(); })))
      q.fail_type(key, "an array of module names", *v);
  }
  const json* bs = q.find("weight_block_size");
  DF_CHECK(bs,
           "%s: key 'weight_block_size' is missing; HINT: per-tensor or per-channel FP8 scales are not "
           "supported, only [block_n, block_k] blocks",
           q.where.c_str());
  if (!bs->is_array() || bs->size() != 2) q.fail_type("weight_block_size", "two positive integers", *bs);
  c.fp8_block_n = q.as_int("weight_block_size", (*bs)[0]);
  c.fp8_block_k = q.as_int("weight_block_size", (*bs)[1]);
  DF_CHECK(c.fp8_block_n > 0 && c.fp8_block_k > 0,
           "%s: key 'weight_block_size' must be two positive integers, got %s", q.where.c_str(),
           bs->dump().c_str());
}

}  // namespace

int QwenConfig::num_linear_layers() const {
  int n = 0;
  for (LayerKind k : layer_types) n += k == LayerKind::linear_attention;
  return n;
}

int QwenConfig::num_full_layers() const {
  return static_cast<int>(layer_types.size()) - num_linear_layers();
}

double QwenConfig::layer_params(int l, bool active) const {
  const QwenConfig& c = *this;
  const double h = c.hidden;
  double mlp = 3.0 * h * c.intermediate;
  if (c.layer_is_moe(l)) {
    const double shared =
        c.shared_intermediate > 0 ? 3.0 * h * c.shared_intermediate + h : 0.0;  // + its gate
    const double experts = active ? c.experts_per_tok : c.num_experts;
    mlp = h * c.num_experts + 3.0 * h * c.moe_intermediate * experts + shared;  // router first
  }
  const double norms = 2.0 * h;
  if (c.layer_types[size_t(l)] == LayerKind::full_attention) {
    const double q_rows = double(c.heads) * c.head_dim * (c.attn_output_gate ? 2 : 1);
    return mlp + norms + h * q_rows + 2.0 * h * c.kv_heads * c.head_dim + double(c.heads) * c.head_dim * h +
           2.0 * c.head_dim;
  }
  const double key_dim = double(c.lin_nk) * c.lin_dk, value_dim = double(c.lin_nv) * c.lin_dv;
  const double conv_ch = 2.0 * key_dim + value_dim;
  return mlp + norms + h * conv_ch + h * value_dim +
         2.0 * h * c.lin_nv                                     // in_proj_qkv, in_proj_z, in_proj_b/a
         + conv_ch * c.conv_kernel + 2.0 * c.lin_nv + c.lin_dv  // conv1d, A_log, dt_bias, norm
         + value_dim * h;                                       // out_proj
}

// Everything but embed_tokens and lm_head: every layer's weights plus the final norm.
static double params_of(const QwenConfig& c, bool active) {
  double p = c.hidden;
  for (int l = 0; l < c.layers; ++l) p += c.layer_params(l, active);
  return p;
}

double QwenConfig::params_non_embedding() const { return params_of(*this, false); }

double QwenConfig::params_active_non_embedding() const { return params_of(*this, true); }

QwenConfig qwen_config_from_json(const json& root, const std::string& where) {
  DF_CHECK(root.is_object(), "%s: a model config must be a JSON object, got %s", where.c_str(),
           root.type_name());
  const CfgObj outer{root, where};
  const json* text = outer.get_object("text_config");
  const CfgObj cfg = text ? CfgObj{*text, where + ": text_config"} : outer;

  QwenConfig c;
  c.model_type = cfg.find("model_type") ? cfg.get_string("model_type") : outer.get_string("model_type");
  bool moe = false;
  DF_CHECK(model_type_family(c.model_type, &c.family, &moe),
           "%s: model_type '%s' is not supported (supported: qwen3, qwen3_5, qwen3_5_text, qwen3_moe, "
           "qwen3_5_moe, qwen3_5_moe_text, qwen3_next)",
           cfg.where.c_str(), c.model_type.c_str());
  const bool q35 = c.family == ModelFamily::qwen3_5;

  c.hidden = cfg.get_int("hidden_size");
  c.layers = cfg.get_int("num_hidden_layers");
  DF_CHECK(c.layers > 0, "%s: key 'num_hidden_layers' must be positive, got %d", cfg.where.c_str(), c.layers);
  if (moe) parse_moe(cfg, c);
  const bool any_dense = !moe || std::count(c.moe_layers.begin(), c.moe_layers.end(), 0) > 0;
  // An MoE model's intermediate_size is the width of its dense layers only (Qwen3_5MoeTextConfig has none).
  const int dense_default = c.per_key_head_gdn_proj() ? 5632 : 6144;  // Qwen3NextConfig / Qwen3MoeConfig
  c.intermediate =
      !any_dense ? 0 : moe ? cfg.get_int("intermediate_size", dense_default) : cfg.get_int("intermediate_size");
  c.vocab = cfg.get_int("vocab_size");
  c.heads = cfg.get_int("num_attention_heads");
  // Defaults below are transformers' own (Qwen3Config / Qwen3_5TextConfig / Qwen3MoeConfig /
  // Qwen3_5MoeTextConfig field defaults).
  if (cfg.find("num_key_value_heads"))
    c.kv_heads = cfg.get_int("num_key_value_heads");
  else if (c.model_type == "qwen3" && cfg.j.contains("num_key_value_heads"))
    c.kv_heads = c.heads;  // Qwen3Config reads an explicit null as "one kv head per q head"
  else
    c.kv_heads = moe ? (q35 ? 2 : 4) : (q35 ? 4 : 32);
  // Qwen3MoeConfig has no head_dim field: its attention falls back to hidden_size / num_attention_heads.
  c.head_dim = cfg.get_int("head_dim", q35 ? 256 : moe && c.heads > 0 ? c.hidden / c.heads : 128);
  c.rms_eps = static_cast<float>(cfg.get_double("rms_norm_eps", 1e-6));
  // A multimodal wrapper may carry the tying flag only at the top level.
  c.tie_word_embeddings =
      cfg.get_bool("tie_word_embeddings", text ? outer.get_bool("tie_word_embeddings", false) : false);

  const std::pair<const char*, int> sizes[] = {
      {"hidden_size", c.hidden}, {"num_hidden_layers", c.layers},  {"intermediate_size", any_dense ? c.intermediate : 1},
      {"vocab_size", c.vocab},   {"num_attention_heads", c.heads}, {"num_key_value_heads", c.kv_heads},
      {"head_dim", c.head_dim}};
  for (const auto& [key, v] : sizes)
    DF_CHECK(v > 0, "%s: key '%s' must be positive, got %d", cfg.where.c_str(), key, v);
  DF_CHECK(c.heads % c.kv_heads == 0,
           "%s: num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)", cfg.where.c_str(),
           c.heads, c.kv_heads);
  DF_CHECK(c.rms_eps > 0, "%s: key 'rms_norm_eps' must be positive", cfg.where.c_str());

  const RopeSources rope(cfg);
  const CfgObj* theta_at = rope.holder("rope_theta");
  DF_CHECK(theta_at,
           "%s: key 'rope_theta' is missing (looked in rope_parameters, rope_scaling and the top level)",
           cfg.where.c_str());
  c.rope_theta = static_cast<float>(theta_at->get_double("rope_theta", 0));
  DF_CHECK(c.rope_theta > 0, "%s: key 'rope_theta' must be positive", theta_at->where.c_str());
  const CfgObj* prf_at = rope.holder("partial_rotary_factor");
  const double prf = prf_at ? prf_at->get_double("partial_rotary_factor", 0) : (q35 ? 0.25 : 1.0);
  const std::string prf_where = prf_at ? prf_at->where : cfg.where;
  DF_CHECK(prf > 0 && prf <= 1, "%s: key 'partial_rotary_factor' must be in (0, 1], got %g",
           prf_where.c_str(), prf);
  // transformers truncates head_dim · factor to an integer.
  c.rot_dim = static_cast<int>(c.head_dim * prf);
  DF_CHECK(
      c.rot_dim > 0 && c.rot_dim % 2 == 0,
      "%s: head_dim (%d) × partial_rotary_factor (%g) gives %d rotary dims; it must be even and positive",
      prf_where.c_str(), c.head_dim, prf, c.rot_dim);
  DF_CHECK(q35 || c.rot_dim == c.head_dim,
           "%s: partial_rotary_factor %g is not supported for model_type qwen3 (it rotates the whole head)",
           prf_where.c_str(), prf);

  // Qwen3.5 attention is always gated in transformers; the key exists in the released files and is honoured.
  c.attn_output_gate = cfg.get_bool("attn_output_gate", q35);
  DF_CHECK(q35 || !c.attn_output_gate, "%s: key 'attn_output_gate' true is not part of model_type qwen3",
           cfg.where.c_str());

  if (const json* lt = cfg.find("layer_types")) {
    if (!lt->is_array()) cfg.fail_type("layer_types", "an array of strings", *lt);
    DF_CHECK(static_cast<int>(lt->size()) == c.layers,
             "%s: key 'layer_types' has %zu entries but num_hidden_layers is %d", cfg.where.c_str(),
             lt->size(), c.layers);
    for (size_t i = 0; i < lt->size(); ++i) {
      const json& e = (*lt)[i];
      if (!e.is_string()) cfg.fail_type("layer_types", "an array of strings", *lt);
      const std::string s = e.get<std::string>();
      if (s == "full_attention") {
        c.layer_types.push_back(LayerKind::full_attention);
      } else if (s == "linear_attention" && q35) {
        c.layer_types.push_back(LayerKind::linear_attention);
      } else {
        DF_FAIL("%s: key 'layer_types'[%zu] is '%s'; %s supports %s", cfg.where.c_str(), i, s.c_str(),
                c.model_type.c_str(),
                q35 ? "'full_attention' and 'linear_attention'" : "only 'full_attention'");
      }
    }
  } else if (q35) {
    const int interval = cfg.get_int("full_attention_interval", 4);
    DF_CHECK(interval > 0, "%s: key 'full_attention_interval' must be positive, got %d", cfg.where.c_str(),
             interval);
    for (int i = 0; i < c.layers; ++i)
      c.layer_types.push_back((i + 1) % interval == 0 ? LayerKind::full_attention
                                                      : LayerKind::linear_attention);
  } else {
    DF_CHECK(!cfg.get_bool("use_sliding_window", false),
             "%s: key 'use_sliding_window' is true; sliding-window Qwen3 targets are not supported",
             cfg.where.c_str());
    c.layer_types.assign(c.layers, LayerKind::full_attention);
  }

  if (q35) {
    c.lin_nk = cfg.get_int("linear_num_key_heads", 16);
    c.lin_nv = cfg.get_int("linear_num_value_heads", 32);
    c.lin_dk = cfg.get_int("linear_key_head_dim", 128);
    c.lin_dv = cfg.get_int("linear_value_head_dim", 128);
    c.conv_kernel = cfg.get_int("linear_conv_kernel_dim", 4);
    const std::pair<const char*, int> lin[] = {{"linear_num_key_heads", c.lin_nk},
                                               {"linear_num_value_heads", c.lin_nv},
                                               {"linear_key_head_dim", c.lin_dk},
                                               {"linear_value_head_dim", c.lin_dv},
                                               {"linear_conv_kernel_dim", c.conv_kernel}};
    for (const auto& [key, v] : lin)
      DF_CHECK(v > 0, "%s: key '%s' must be positive, got %d", cfg.where.c_str(), key, v);
    DF_CHECK(c.lin_nv % c.lin_nk == 0,
             "%s: linear_num_value_heads (%d) must be a multiple of linear_num_key_heads (%d)",
             cfg.where.c_str(), c.lin_nv, c.lin_nk);
  }
  // A multimodal wrapper keeps it at the top level, next to text_config.
  const json* qc = cfg.get_object("quantization_config");
  const CfgObj& q_at = qc ? cfg : outer;
  if (!qc) qc = outer.get_object("quantization_config");
  if (qc) parse_quantization_config({*qc, q_at.where + ": quantization_config"}, c);
  return c;
}

json qwen_config_read_json(const std::string& path, std::string* file_out) {
  const std::string file = path_is_dir(path) ? path + (path.back() == '/' ? "" : "/") + "config.json" : path;
  const std::string text = file_read_text(file);
  if (file_out) *file_out = file;
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    DF_FAIL("%s: not valid JSON: %s", file.c_str(), e.what());
  }
}

QwenConfig qwen_config_load(const std::string& path) {
  std::string file;
  const json j = qwen_config_read_json(path, &file);
  return qwen_config_from_json(j, file);
}

double float_for_json(float f) {
  for (int prec = 6; prec < 9; ++prec) {
    const double d = std::strtod(strfmt("%.*g", prec, double(f)).c_str(), nullptr);
    if (static_cast<float>(d) == f) return d;
  }
  return f;
}

json qwen_config_to_json(const QwenConfig& c) {
  const bool q35 = c.family == ModelFamily::qwen3_5;
  json j;
  const bool next = c.per_key_head_gdn_proj();
  if (next) {
    j["architectures"] = {"Qwen3NextForCausalLM"};
    j["model_type"] = "qwen3_next";
  } else if (c.is_moe()) {
    j["architectures"] = {q35 ? "Qwen3_5MoeForCausalLM" : "Qwen3MoeForCausalLM"};
    j["model_type"] = q35 ? "qwen3_5_moe_text" : "qwen3_moe";
  } else {
    j["architectures"] = {q35 ? "Qwen3_5ForCausalLM" : "Qwen3ForCausalLM"};
    j["model_type"] = q35 ? "qwen3_5_text" : "qwen3";
  }
  j["hidden_size"] = c.hidden;
  j["num_hidden_layers"] = c.layers;
  if (c.intermediate > 0) j["intermediate_size"] = c.intermediate;
  if (c.is_moe()) {
    j["num_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.experts_per_tok;
    j["moe_intermediate_size"] = c.moe_intermediate;
    if (q35) j["shared_expert_intermediate_size"] = c.shared_intermediate;
    if (!q35 || next) {
      json dense = json::array();
      for (int l = 0; l < c.layers; ++l)
        if (!c.layer_is_moe(l)) dense.push_back(l);
      j["norm_topk_prob"] = c.norm_topk_prob;
      j["decoder_sparse_step"] = 1;
      j["mlp_only_layers"] = dense;
    }
  }
  j["vocab_size"] = c.vocab;
  j["num_attention_heads"] = c.heads;
  j["num_key_value_heads"] = c.kv_heads;
  j["head_dim"] = c.head_dim;
  j["rms_norm_eps"] = float_for_json(c.rms_eps);
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["max_position_embeddings"] = 32768;
  j["dtype"] = "bfloat16";
  json rope = {{"rope_type", "default"}, {"rope_theta", float_for_json(c.rope_theta)}};
  if (q35) {
    // Chosen so that transformers' int(head_dim · factor) gives back rot_dim exactly.
    double factor = double(c.rot_dim) / c.head_dim;
    if (static_cast<int>(c.head_dim * factor) != c.rot_dim) factor = std::nextafter(factor, 2.0);
    rope["partial_rotary_factor"] = factor;
    rope["mrope_interleaved"] = true;
    rope["mrope_section"] = mrope_sections(c.rot_dim);
    j["attn_output_gate"] = c.attn_output_gate;
    json lt = json::array();
    for (LayerKind k : c.layer_types)
      lt.push_back(k == LayerKind::full_attention ? "full_attention" : "linear_attention");
    j["layer_types"] = lt;
    j["linear_num_key_heads"] = c.lin_nk;
    j["linear_num_value_heads"] = c.lin_nv;
    j["linear_key_head_dim"] = c.lin_dk;
    j["linear_value_head_dim"] = c.lin_dv;
    j["linear_conv_kernel_dim"] = c.conv_kernel;
  } else {
    j["use_sliding_window"] = false;
  }
  j["rope_parameters"] = rope;
  if (c.fp8_block_n > 0)
    j["quantization_config"] = {{"quant_method", "fp8"},
                                {"fmt", "e4m3"},
                                {"activation_scheme", "dynamic"},
                                {"weight_block_size", {c.fp8_block_n, c.fp8_block_k}}};
  return j;
}

std::string qwen_config_moe_summary(const QwenConfig& c) {
  const int sparse = int(std::count(c.moe_layers.begin(), c.moe_layers.end(), 1));
  std::string s = strfmt("MoE in %d of %d layers: top-%d of %d experts × %d%s", sparse, c.layers, c.experts_per_tok,
                         c.num_experts, c.moe_intermediate, c.norm_topk_prob ? " (renormalised)" : "");
  if (c.shared_intermediate > 0) s += strfmt(" + gated shared expert × %d", c.shared_intermediate);
  const double a = c.params_active_non_embedding();
  return s + strfmt(", %.4g%s active", a >= 1e9 ? a / 1e9 : a / 1e6, a >= 1e9 ? "B" : "M");
}

std::string qwen_config_summary(const QwenConfig& c) {
  std::string s = strfmt("%s: %d layers", c.model_type.c_str(), c.layers);
  if (c.num_linear_layers() > 0)
    s += strfmt(" (%d linear + %d full)", c.num_linear_layers(), c.num_full_layers());
  s += strfmt(", hidden %d, intermediate %d, vocab %d, attn %d/%d heads × %d (rot %d, theta %g%s)", c.hidden,
              c.intermediate, c.vocab, c.heads, c.kv_heads, c.head_dim, c.rot_dim, double(c.rope_theta),
              c.attn_output_gate ? ", gated" : "");
  if (c.family == ModelFamily::qwen3_5)
    s += strfmt(", deltanet %d/%d heads × %d/%d conv %d", c.lin_nk, c.lin_nv, c.lin_dk, c.lin_dv,
                c.conv_kernel);
  if (c.is_moe()) s += ", " + qwen_config_moe_summary(c);
  if (c.fp8_block_n > 0)
    s += strfmt(", fp8 e4m3 weights in %dx%d blocks (dequantised at load)", c.fp8_block_n, c.fp8_block_k);
  const double p = c.params_non_embedding();
  s += strfmt(", eps %g, %s, %.4g%s non-embedding params", double(c.rms_eps),
              c.tie_word_embeddings ? "tied" : "untied", p >= 1e9 ? p / 1e9 : p / 1e6, p >= 1e9 ? "B" : "M");
  return s;
}

}  // namespace df
