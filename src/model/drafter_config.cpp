// DrafterConfig from a run config, to and from a checkpoint's JSON, and from a Hugging Face DFlash
// config.json. The two JSON readers fill the fields through drafter_config_fields and one set of value
// readers, so a field is added in one list.
#include "model/drafter_config.h"

#include <cctype>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/strfmt.h"

namespace df {

namespace {

using json = nlohmann::json;

// The value readers and writers of both JSON forms: `key` names the field in `where`'s messages.
void read_value(const json& v, int& out, const std::string& where, const char* key) {
  DF_CHECK(v.is_number_integer() && v.get<int64_t>() >= INT32_MIN && v.get<int64_t>() <= INT32_MAX,
           "%s: key '%s' must be a 32-bit integer, got %s", where.c_str(), key, v.dump().c_str());
  out = v.get<int>();
}

void read_value(const json& v, float& out, const std::string& where, const char* key) {
  DF_CHECK(v.is_number(), "%s: key '%s' must be a number, got %s", where.c_str(), key, v.dump().c_str());
  out = v.get<float>();
}

void read_value(const json& v, std::vector<int>& out, const std::string& where, const char* key) {
  DF_CHECK(v.is_array(), "%s: key '%s' must be an array of integers, got %s", where.c_str(), key,
           v.dump().c_str());
  out.assign(v.size(), 0);
  for (size_t i = 0; i < v.size(); ++i) read_value(v[i], out[i], where, key);
}

void read_value(const json& v, std::vector<DrafterLayerType>& out, const std::string& where, const char* key) {
  DF_CHECK(v.is_array(), "%s: key '%s' must be an array of layer types, got %s", where.c_str(), key,
           v.dump().c_str());
  out.clear();
  for (const json& t : v) {
    const std::string s = t.is_string() ? t.get<std::string>() : t.dump();
    DF_CHECK(s == "sliding_attention" || s == "full_attention",
             "%s: key '%s' holds '%s'; DFlash layers are sliding_attention or full_attention", where.c_str(), key,
             s.c_str());
    out.push_back(s == "sliding_attention" ? DrafterLayerType::sliding : DrafterLayerType::full);
  }
}

void read_value(const json& v, bool& out, const std::string& where, const char* key) {
  DF_CHECK(v.is_boolean(), "%s: key '%s' must be true or false, got %s", where.c_str(), key,
           v.dump().c_str());
  out = v.get<bool>();
}

void read_value(const json& v, DrafterKind& out, const std::string& where, const char* key) {
  DF_CHECK(v.is_string(), "%s: key '%s' must be a drafter kind string, got %s", where.c_str(), key,
           v.dump().c_str());
  out = drafter_kind_parse(v.get<std::string>(), where + " key '" + key + "'");
}

void read_value(const json& v, DrafterMarkovHead& out, const std::string& where, const char* key) {
  DF_CHECK(v.is_string(), "%s: key '%s' must be a Markov head type string, got %s", where.c_str(), key,
           v.dump().c_str());
  out = drafter_markov_head_parse(v.get<std::string>(), where + " key '" + key + "'");
}

json write_value(int v) { return v; }
json write_value(bool v) {
  return v;
}
json write_value(DrafterKind v) {
  return drafter_kind_name(v);
}
json write_value(DrafterMarkovHead v) {
  return drafter_markov_head_name(v);
}
json write_value(float v) { return v; }
json write_value(const std::vector<int>& v) { return v; }
json write_value(const std::vector<DrafterLayerType>& v) {
  json names = json::array();
  for (DrafterLayerType t : v) names.push_back(drafter_layer_type_hf_name(t));
  return names;
}

std::string field_text(int v) { return std::to_string(v); }

std::string field_text(bool v) {
  return v ? "true" : "false";
}

std::string field_text(DrafterKind v) {
  return drafter_kind_name(v);
}

std::string field_text(DrafterMarkovHead v) {
  return drafter_markov_head_name(v);
}

std::string field_text(float v) { return strfmt("%.9g", float_for_json(v)); }

std::string field_text(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string field_text(const std::vector<DrafterLayerType>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::string(drafter_layer_type_hf_name(v[i]));
  return s + "]";
}

// Every field that has a name in `o` (name_of(field); null: the field keeps its default) read from o under
// that name; a name that o lacks is an error naming it.
template <class NameOf>
DrafterConfig read_fields(const json& o, NameOf name_of, const std::string& where) {
  DrafterConfig c;
  drafter_config_fields(c, [&](const DrafterField& f, auto& value) {
    const char* name = name_of(f);
    if (!name) return;
    const auto it = o.find(name);
    DF_CHECK(it != o.end() && !it->is_null(), "%s: key '%s' is missing", where.c_str(), name);
    read_value(*it, value, where, name);
  });
  return c;
}

// The kind and its head from dflash_config into `flat` under their hf keys; a kind's head fields are unset (0
// / false) under any other kind. Domino (SpecForge DominoDraftModel._init_draft_head): emb_dim and
// gru_hidden_dim required, pure_draft_prefix_len 0 and shift_label false when absent. DSpark
// (DSparkDraftModel): markov_rank 0 (no Markov head), markov_head_type vanilla, confidence_head_alpha 0,
// enable_confidence_head = alpha > 0 and confidence_head_with_markov false when absent, looked up in
// dflash_config and then at the top level (where SpecForge's export normaliser copies them); attention_mode
// "gqa" (absent) needs fewer KV heads than query heads, "mha" equal counts.
void flatten_hf_kind(const json& top, const json* dflash, const std::string& where, json& flat) {
  const auto get = [&](const char* key) -> const json* {
    if (!dflash) return nullptr;
    const auto it = dflash->find(key);
    return it == dflash->end() || it->is_null() ? nullptr : &*it;
  };
  const json* projector = get("projector_type");
  flat["projector_type"] = projector ? *projector : json("dflash");
  DrafterKind kind = DrafterKind::dflash;
  read_value(flat["projector_type"], kind, where, "dflash_config.projector_type");
  const bool domino = kind == DrafterKind::domino;
  for (const char* key : {"emb_dim", "gru_hidden_dim"}) {
    const json* v = get(key);
    DF_CHECK(!domino || v, "%s: key 'dflash_config.%s' is missing (a Domino drafter needs it)", where.c_str(),
             key);
    flat[key] = domino ? *v : json(0);
  }
  const json* prefix = get("pure_draft_prefix_len");
  const json* shift = get("shift_label");
  flat["pure_draft_prefix_len"] = domino && prefix ? *prefix : json(0);
  flat["shift_label"] = domino && shift ? *shift : json(false);

  const bool dspark = kind == DrafterKind::dspark;
  const auto get_dspark = [&](const char* key, json absent) {
    if (!dspark) return absent;  // the peer's defaults are also the unset values
    if (const json* v = get(key)) return *v;
    const auto it = top.find(key);
    return it == top.end() || it->is_null() ? absent : *it;
  };
  flat["markov_rank"] = get_dspark("markov_rank", 0);
  flat["markov_head_type"] = get_dspark("markov_head_type", "vanilla");
  flat["confidence_head_alpha"] = get_dspark("confidence_head_alpha", 0.0);
  float alpha = 0;
  read_value(flat["confidence_head_alpha"], alpha, where, "dflash_config.confidence_head_alpha");
  flat["enable_confidence_head"] = get_dspark("enable_confidence_head", dspark && alpha > 0);
  flat["confidence_head_with_markov"] = get_dspark("confidence_head_with_markov", false);
  if (!dspark) return;
  const json mode_value = get_dspark("attention_mode", "gqa");
  const std::string mode = mode_value.is_string() ? mode_value.get<std::string>() : mode_value.dump();
  const int heads = flat["num_attention_heads"].get<int>(), kv = flat["num_key_value_heads"].get<int>();
  DF_CHECK(mode == "gqa" || mode == "mha",
           "%s: key 'dflash_config.attention_mode' is '%s'; a DSpark drafter's is \"gqa\" or \"mha\"",
           where.c_str(), mode.c_str());
  DF_CHECK(mode == "gqa" ? kv < heads : kv == heads,
           "%s: dflash_config.attention_mode \"%s\" with %d KV heads and %d query heads; DSpark's gqa needs "
           "fewer KV "
           "heads, its mha equal counts (SpecForge DSparkDraftModel)",
           where.c_str(), mode.c_str(), kv, heads);
}

// DFlash2 from its architecture (SpecForge DFlash2DraftModel: no projector_type; conv_kernel_size,
// conv_group_size, selector_rank and selector_top_k required in dflash_config, output_multiplier 1 and no
// final_logit_softcapping when absent) into `flat`; any other drafter's DFlash2 fields are unset (0).
void flatten_hf_dflash2(bool dflash2, const json* dflash, const std::string& where, json& flat) {
  const auto get = [&](const char* key) -> const json* {
    if (!dflash) return nullptr;
    const auto it = dflash->find(key);
    return it == dflash->end() || it->is_null() ? nullptr : &*it;
  };
  if (dflash2) flat["projector_type"] = "dflash2";
  dflash2 = flat["projector_type"] == "dflash2";
  for (const char* key : {"conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"}) {
    const json* v = get(key);
    DF_CHECK(!dflash2 || v, "%s: key 'dflash_config.%s' is missing (a DFlash2DraftModel needs it)",
             where.c_str(), key);
    flat[key] = dflash2 ? *v : json(0);
  }
  const json* multiplier = get("output_multiplier");
  const json* softcap = get("final_logit_softcapping");
  flat["output_multiplier"] = !dflash2 ? json(0.0) : multiplier ? *multiplier : json(1.0);
  flat["final_logit_softcapping"] = dflash2 && softcap ? *softcap : json(0.0);
  DF_CHECK(!dflash2 || !softcap || !softcap->is_number() || softcap->get<double>() > 0,
           "%s: dflash_config.final_logit_softcapping %s must be > 0 (leave it out for none, as SpecForge)",
           where.c_str(), softcap ? softcap->dump().c_str() : "");
}

}  // namespace

std::vector<DrafterFieldText> drafter_config_texts(const DrafterConfig& c) {
  std::vector<DrafterFieldText> out;
  drafter_config_fields(c, [&](const DrafterField& f, const auto& value) { out.push_back({f, field_text(value)}); });
  return out;
}

const char* drafter_kind_name(DrafterKind k) {
  switch (k) {
    case DrafterKind::domino:
      return "domino";
    case DrafterKind::dflash2:
      return "dflash2";
    case DrafterKind::dspark:
      return "dspark";
    default:
      return "dflash";
  }
}

DrafterKind drafter_kind_parse(const std::string& name, const std::string& where) {
  for (DrafterKind k : {DrafterKind::dflash, DrafterKind::domino, DrafterKind::dspark, DrafterKind::dflash2})
    if (name == drafter_kind_name(k)) return k;
  DF_FAIL("%s: drafter kind '%s' is not one this build knows (dflash, domino, dspark, dflash2)",
          where.c_str(), name.c_str());
}

const char* drafter_markov_head_name(DrafterMarkovHead h) {
  switch (h) {
    case DrafterMarkovHead::gated:
      return "gated";
    case DrafterMarkovHead::rnn:
      return "rnn";
    default:
      return "vanilla";
  }
}

DrafterMarkovHead drafter_markov_head_parse(const std::string& name, const std::string& where) {
  std::string lower = name;
  for (char& ch : lower) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  for (DrafterMarkovHead h : {DrafterMarkovHead::vanilla, DrafterMarkovHead::gated, DrafterMarkovHead::rnn})
    if (lower == drafter_markov_head_name(h)) return h;
  DF_FAIL("%s: Markov head type '%s' is not vanilla, gated or rnn", where.c_str(), name.c_str());
}

const char* drafter_layer_type_hf_name(DrafterLayerType t) {
  return t == DrafterLayerType::sliding ? "sliding_attention" : "full_attention";
}

bool drafter_config_any_sliding(const DrafterConfig& c) {
  for (DrafterLayerType t : c.layer_types)
    if (t == DrafterLayerType::sliding) return true;
  return false;
}

DrafterConfig drafter_config_from_run(const Config& cfg, const QwenConfig& target) {
  const DrafterSection& d = cfg.drafter;
  DrafterConfig c;
  c.hidden = target.hidden;
  c.vocab = target.vocab;
  c.layers = d.layers;
  c.heads = d.heads;
  c.kv_heads = d.kv_heads;
  c.head_dim = d.head_dim;
  c.intermediate = d.intermediate > 0 ? d.intermediate : target.intermediate;
  DF_CHECK(c.intermediate > 0, "%s: drafter.intermediate is 0 (= the target's) but the target %s has no dense "
           "intermediate_size; a drafter MLP of width 0 cannot learn. HINT: set drafter.intermediate",
           cfg.path.c_str(), cfg.target.architecture().c_str());
  c.rope_theta = float(d.rope_theta);
  c.rms_eps = float(d.rms_norm_eps);
  c.block_size = d.block_size;
  DF_CHECK(d.mask_token_id < target.vocab, "%s: drafter.mask_token_id %lld is not below the target's vocab %d",
           cfg.path.c_str(), (long long)d.mask_token_id, target.vocab);
  c.mask_token_id = int(d.mask_token_id);
  c.target_layer_ids =
      d.target_layer_ids.empty() ? drafter_default_target_layer_ids(target.layers, d.num_taps) : d.target_layer_ids;
  for (int l : c.target_layer_ids)
    DF_CHECK(l >= 0 && l < target.layers,
             "%s: drafter.target_layer_ids holds layer %d but the target has %d layers (0..%d); HINT: fix the list "
             "or leave it empty for the DFlash default",
             cfg.path.c_str(), l, target.layers, target.layers - 1);
  for (int i = 0; i < d.layers; ++i)
    c.layer_types.push_back(!d.layer_types.empty() && d.layer_types[i] == "sliding_attention"
                                ? DrafterLayerType::sliding
                                : DrafterLayerType::full);
  c.sliding_window = d.sliding_window;
  c.num_anchors = d.num_anchors;
  c.kind = drafter_kind_parse(d.kind, cfg.path + ": drafter.kind");
  if (c.kind == DrafterKind::domino) {
    c.pure_draft_prefix_len = d.pure_draft_prefix_len;
    c.emb_dim = d.emb_dim;
    c.gru_hidden_dim = d.gru_hidden_dim;
    c.shift_label = d.shift_label;
  }
  if (c.kind == DrafterKind::dflash2) {
    DF_CHECK(
        d.conv_group_size > 0 && target.hidden % d.conv_group_size == 0,
        "%s: drafter.conv_group_size %d must divide the target's hidden size %d (channels share a dynamic "
        "coefficient in groups of it)",
        cfg.path.c_str(), d.conv_group_size, target.hidden);
    DF_CHECK(d.selector_top_k <= target.vocab,
             "%s: drafter.selector_top_k %d exceeds the target's vocabulary %d", cfg.path.c_str(),
             d.selector_top_k, target.vocab);
    c.conv_kernel_size = d.conv_kernel_size;
    c.conv_group_size = d.conv_group_size;
    c.selector_rank = d.selector_rank;
    c.selector_top_k = d.selector_top_k;
    c.output_multiplier = float(d.output_multiplier);
    c.final_logit_softcapping = float(d.final_logit_softcapping);
  }
  if (c.kind == DrafterKind::dspark) {
    c.markov_rank = d.markov_rank;
    c.markov_head_type =
        drafter_markov_head_parse(d.markov_head_type, cfg.path + ": drafter.markov_head_type");
    c.enable_confidence_head = d.enable_confidence_head;
    c.confidence_head_with_markov = d.confidence_head_with_markov;
    c.confidence_head_alpha = float(d.confidence_head_alpha);
  }
  drafter_config_validate(c);
  return c;
}

std::string drafter_config_json(const DrafterConfig& c) {
  json j;
  drafter_config_fields(c, [&](const DrafterField& f, const auto& value) { j[f.key] = write_value(value); });
  return j.dump();
}

DrafterConfig drafter_config_from_json(const std::string& text, const std::string& where) {
  json j = json::parse(text, nullptr, false);
  DF_CHECK(j.is_object(), "%s: drafter_config is not a JSON object (file corrupt?)", where.c_str());
  if (!j.contains("kind")) {
    // Written before drafters had kinds: a DFlash drafter, whose head fields are all unset.
    const DrafterConfig dflash;
    drafter_config_fields(dflash, [&](const DrafterField& f, const auto& value) {
      if (!j.contains(f.key)) j[f.key] = write_value(value);
    });
  }
  if (j["kind"] != "dflash2") {
    // Written before DFlash2 existed: its fields, absent, are unset.
    const DrafterConfig unset;
    const std::set<std::string> dflash2_keys = {"conv_kernel_size",  "conv_group_size",
                                                "selector_rank",     "selector_top_k",
                                                "output_multiplier", "final_logit_softcapping"};
    drafter_config_fields(unset, [&](const DrafterField& f, const auto& value) {
      if (dflash2_keys.count(f.key) && !j.contains(f.key)) j[f.key] = write_value(value);
    });
  }
  if (j["kind"] != "dspark") {
    // Written before DSpark existed: its head fields, absent, are unset.
    const std::set<std::string> dspark_keys = {"markov_rank", "markov_head_type", "enable_confidence_head",
                                               "confidence_head_with_markov", "confidence_head_alpha"};
    const DrafterConfig unset;
    drafter_config_fields(unset, [&](const DrafterField& f, const auto& value) {
      if (dspark_keys.count(f.key) && !j.contains(f.key)) j[f.key] = write_value(value);
    });
  }
  const std::string in = where + " drafter_config";
  const DrafterConfig c = read_fields(j, [](const DrafterField& f) { return f.key; }, in);
  try {
    drafter_config_validate(c);
  } catch (const Error& e) {
    DF_FAIL("%s: the stored drafter_config is invalid: %s", where.c_str(), e.what());
  }
  return c;
}

DrafterConfig drafter_config_from_hf_json(const json& j, const std::string& where) {
  DF_CHECK(j.is_object(), "%s: a config.json must hold a JSON object", where.c_str());
  bool dflash2 = false;  // SpecForge names a DFlash2 drafter by its architecture only
  if (const auto it = j.find("architectures"); it != j.end() && it->is_array()) {
    bool dflash = false;
    for (const json& a : *it) {
      for (const char* name : {"DFlashDraftModel", "DominoDraftModel", "DSparkDraftModel", "Qwen3DSparkModel",
                               "DFlash2DraftModel"})
        dflash |= a.is_string() && a.get<std::string>() == name;
      dflash2 |= a.is_string() && a.get<std::string>() == "DFlash2DraftModel";
    }
    DF_CHECK(
        dflash,
        "%s: architectures is %s, not DFlashDraftModel, DominoDraftModel, DSparkDraftModel, "
        "Qwen3DSparkModel (SpecForge's exported DSpark) or DFlash2DraftModel; HINT: drafter.init_from names "
        "a DFlash-family drafter folder (as `dflash_mpi export` writes), not the target model",
        where.c_str(), it->dump().c_str());
  }
  // Sliding layer types are DFlash's own; the Qwen3 target parser refuses them, so it reads the rest. Its
  // config.json of what it read (defaults filled in, rope_theta in rope_parameters) gives the Qwen3 fields.
  json base = j;
  base.erase("layer_types");
  base.erase("use_sliding_window");
  const QwenConfig q = qwen_config_from_json(base, where);
  DF_CHECK(q.family == ModelFamily::qwen3, "%s: model_type '%s'; DFlash drafters are model_type qwen3",
           where.c_str(), q.model_type.c_str());
  json flat = qwen_config_to_json(q);
  flat["rope_theta"] = flat["rope_parameters"]["rope_theta"];

  const json* dflash = nullptr;
  if (const auto it = j.find("dflash_config"); it != j.end() && !it->is_null()) {
    DF_CHECK(it->is_object(), "%s: key 'dflash_config' must be an object", where.c_str());
    dflash = &*it;
  }
  // dflash_config first, then the top level (MODELS.md "Export format").
  for (const char* key : {"block_size", "mask_token_id", "target_layer_ids"}) {
    const json* found = nullptr;
    for (const json* o : {dflash, &j}) {
      if (!o || found) continue;
      const auto it = o->find(key);
      if (it != o->end() && !it->is_null()) found = &*it;
    }
    DF_CHECK(found, "%s: key '%s' is missing (looked in dflash_config and at the top level); is this a DFlash "
             "drafter?", where.c_str(), key);
    flat[key] = *found;
  }

  const auto lt = j.find("layer_types");
  const bool typed = lt != j.end() && !lt->is_null();
  flat["layer_types"] = typed ? *lt : json(std::vector<std::string>(size_t(q.layers), "full_attention"));
  flat["sliding_window"] = DrafterConfig().sliding_window;  // read below where a layer slides
  if (const json* projector =
          dflash && dflash->contains("projector_type") ? &(*dflash)["projector_type"] : nullptr;
      dflash2 && projector && !projector->is_null())
    DF_CHECK(*projector == "dflash2",
             "%s: architectures names DFlash2DraftModel but dflash_config.projector_type "
             "is %s; a DFlash2 drafter has no projector",
             where.c_str(), projector->dump().c_str());
  flatten_hf_kind(j, dflash, where, flat);
  flatten_hf_dflash2(dflash2, dflash, where, flat);
  DrafterConfig c = read_fields(flat, [](const DrafterField& f) { return f.hf_key; }, where);
  DF_CHECK(int(c.layer_types.size()) == c.layers, "%s: key 'layer_types' must be an array of num_hidden_layers "
           "(%d) strings, got %s", where.c_str(), c.layers, flat["layer_types"].dump().c_str());
  if (drafter_config_any_sliding(c)) {
    // transformers' Qwen3Config drops sliding_window unless use_sliding_window is set; the draft would then
    // fail to load in SpecForge / SGLang, so such a file is refused here too.
    const auto use = j.find("use_sliding_window");
    DF_CHECK(use == j.end() || use->is_null() || (use->is_boolean() && use->get<bool>()),
             "%s: layer_types has sliding_attention layers but use_sliding_window is %s", where.c_str(),
             use->dump().c_str());
    const auto sw = j.find("sliding_window");
    DF_CHECK(sw != j.end() && !sw->is_null(),
             "%s: layer_types has sliding_attention layers but no sliding_window", where.c_str());
    read_value(*sw, c.sliding_window, where, "sliding_window");
  }
  drafter_config_validate(c);
  return c;
}

DrafterConfig drafter_config_load_hf(const std::string& path) {
  std::string file;
  const json j = qwen_config_read_json(path, &file);
  return drafter_config_from_hf_json(j, file);
}

}  // namespace df
