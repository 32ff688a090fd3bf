// Hugging Face DFlash drafter folder -> DrafterConfig and weights (drafter.init_from). The Qwen3 keys are read
// by the target's config parser (so rope_theta is found wherever transformers keeps it); only the DFlash keys
// are read here.
#include "train/init_from.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/strfmt.h"
#include "model/qwen_config.h"
#include "model/safetensors.h"
#include "train/export_hf.h"

namespace df {

namespace {

using json = nlohmann::json;

int json_int(const json& v, const std::string& where, const char* key) {
  DF_CHECK(v.is_number_integer() && v.get<int64_t>() >= INT32_MIN && v.get<int64_t>() <= INT32_MAX,
           "%s: key '%s' must be a 32-bit integer, got %s", where.c_str(), key, v.dump().c_str());
  return v.get<int>();
}

std::string join(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += strfmt("%s%d", i ? ", " : "", v[i]);
  return s + "]";
}

std::string join(const std::vector<DrafterLayerType>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += strfmt("%s\"%s\"", i ? ", " : "", drafter_layer_type_hf_name(v[i]));
  return s + "]";
}

bool any_sliding(const DrafterConfig& c) {
  for (DrafterLayerType t : c.layer_types)
    if (t == DrafterLayerType::sliding) return true;
  return false;
}

}  // namespace

DrafterConfig drafter_config_from_hf_json(const json& j, const std::string& where) {
  DF_CHECK(j.is_object(), "%s: a config.json must hold a JSON object", where.c_str());
  if (const auto it = j.find("architectures"); it != j.end() && it->is_array()) {
    bool dflash = false;
    for (const json& a : *it) dflash |= a.is_string() && a.get<std::string>() == "DFlashDraftModel";
    DF_CHECK(dflash, "%s: architectures is %s, not DFlashDraftModel; HINT: drafter.init_from names a DFlash drafter "
             "folder (as `dflash_mpi export` writes), not the target model", where.c_str(), it->dump().c_str());
  }
  // Sliding layer types are DFlash's own; the Qwen3 target parser refuses them, so it reads the rest.
  json base = j;
  base.erase("layer_types");
  base.erase("use_sliding_window");
  const QwenConfig q = qwen_config_from_json(base, where);
  DF_CHECK(q.family == ModelFamily::qwen3, "%s: model_type '%s'; DFlash drafters are model_type qwen3",
           where.c_str(), q.model_type.c_str());
  DrafterConfig c;
  c.hidden = q.hidden;
  c.layers = q.layers;
  c.heads = q.heads;
  c.kv_heads = q.kv_heads;
  c.head_dim = q.head_dim;
  c.intermediate = q.intermediate;
  c.vocab = q.vocab;
  c.rope_theta = q.rope_theta;
  c.rms_eps = q.rms_eps;

  const json* dflash = nullptr;
  if (const auto it = j.find("dflash_config"); it != j.end() && !it->is_null()) {
    DF_CHECK(it->is_object(), "%s: key 'dflash_config' must be an object", where.c_str());
    dflash = &*it;
  }
  // dflash_config first, then the top level (MODELS.md "Export format").
  auto dflash_key = [&](const char* key) -> const json* {
    for (const json* o : {dflash, &j}) {
      if (!o) continue;
      const auto it = o->find(key);
      if (it != o->end() && !it->is_null()) return &*it;
    }
    DF_FAIL("%s: key '%s' is missing (looked in dflash_config and at the top level); is this a DFlash drafter?",
            where.c_str(), key);
  };
  c.block_size = json_int(*dflash_key("block_size"), where, "block_size");
  c.mask_token_id = json_int(*dflash_key("mask_token_id"), where, "dflash_config.mask_token_id");
  const json& taps = *dflash_key("target_layer_ids");
  DF_CHECK(taps.is_array(), "%s: key 'target_layer_ids' must be an array of layer ids", where.c_str());
  for (const json& t : taps) c.target_layer_ids.push_back(json_int(t, where, "target_layer_ids"));

  const auto lt = j.find("layer_types");
  if (lt == j.end() || lt->is_null()) {
    c.layer_types.assign(size_t(c.layers), DrafterLayerType::full);
  } else {
    DF_CHECK(lt->is_array() && int(lt->size()) == c.layers,
             "%s: key 'layer_types' must be an array of num_hidden_layers (%d) strings, got %s", where.c_str(),
             c.layers, lt->dump().c_str());
    for (const json& t : *lt) {
      const std::string s = t.is_string() ? t.get<std::string>() : t.dump();
      DF_CHECK(s == "sliding_attention" || s == "full_attention",
               "%s: key 'layer_types' holds '%s'; DFlash layers are sliding_attention or full_attention",
               where.c_str(), s.c_str());
      c.layer_types.push_back(s == "sliding_attention" ? DrafterLayerType::sliding : DrafterLayerType::full);
    }
  }
  if (any_sliding(c)) {
    // transformers' Qwen3Config drops sliding_window unless use_sliding_window is set; the draft would then
    // fail to load in SpecForge / SGLang, so such a file is refused here too.
    const auto use = j.find("use_sliding_window");
    DF_CHECK(use == j.end() || use->is_null() || (use->is_boolean() && use->get<bool>()),
             "%s: layer_types has sliding_attention layers but use_sliding_window is %s", where.c_str(),
             use->dump().c_str());
    const auto sw = j.find("sliding_window");
    DF_CHECK(sw != j.end() && !sw->is_null(), "%s: layer_types has sliding_attention layers but no sliding_window",
             where.c_str());
    c.sliding_window = json_int(*sw, where, "sliding_window");
  }
  drafter_config_validate(c);
  return c;
}

DrafterConfig drafter_config_load_hf(const std::string& path) {
  std::string file;
  const json j = qwen_config_read_json(path, &file);
  return drafter_config_from_hf_json(j, file);
}

void drafter_config_check_same(const DrafterConfig& run, const DrafterConfig& hf, const std::string& where) {
  auto differ = [&](const char* field, const char* run_key, const std::string& theirs, const std::string& ours) {
    DF_FAIL("drafter.init_from %s: config.json has %s = %s but this run's drafter has %s (%s); HINT: make the run "
            "config match the folder, or point drafter.init_from at a drafter of this architecture",
            where.c_str(), field, theirs.c_str(), ours.c_str(), run_key);
  };
  const struct {
    const char* field;
    const char* key;
    int hf, run;
  } ints[] = {{"hidden_size", "the target's hidden_size", hf.hidden, run.hidden},
              {"vocab_size", "the target's vocab_size", hf.vocab, run.vocab},
              {"num_hidden_layers", "drafter.layers", hf.layers, run.layers},
              {"num_attention_heads", "drafter.heads", hf.heads, run.heads},
              {"num_key_value_heads", "drafter.kv_heads", hf.kv_heads, run.kv_heads},
              {"head_dim", "drafter.head_dim", hf.head_dim, run.head_dim},
              {"intermediate_size", "drafter.intermediate", hf.intermediate, run.intermediate},
              {"block_size", "drafter.block_size", hf.block_size, run.block_size},
              {"dflash_config.mask_token_id", "drafter.mask_token_id", hf.mask_token_id, run.mask_token_id}};
  for (const auto& f : ints)
    if (f.hf != f.run) differ(f.field, f.key, std::to_string(f.hf), std::to_string(f.run));
  if (hf.target_layer_ids != run.target_layer_ids)
    differ("dflash_config.target_layer_ids", "drafter.target_layer_ids", join(hf.target_layer_ids),
           join(run.target_layer_ids));
  if (hf.layer_types != run.layer_types)
    differ("layer_types", "drafter.layer_types", join(hf.layer_types), join(run.layer_types));
  if (any_sliding(run) && hf.sliding_window != run.sliding_window)
    differ("sliding_window", "drafter.sliding_window", std::to_string(hf.sliding_window),
           std::to_string(run.sliding_window));
  if (hf.rope_theta != run.rope_theta)
    differ("rope_theta", "drafter.rope_theta", strfmt("%g", double(hf.rope_theta)), strfmt("%g", double(run.rope_theta)));
  if (hf.rms_eps != run.rms_eps)
    differ("rms_norm_eps", "drafter.rms_norm_eps", strfmt("%g", double(hf.rms_eps)), strfmt("%g", double(run.rms_eps)));
}

void drafter_load_hf_weights(DrafterModel& m, const std::string& dir) {
  const SafetensorsIndex idx = SafetensorsIndex::open(dir);
  const DrafterParamTable& table = m.table();
  std::set<std::string> known;
  std::vector<float> buf;
  for (const DrafterParamEntry& e : table.entries) {
    known.insert(e.name);
    const StTensor* t = idx.find(e.name);
    DF_CHECK(t, "drafter.init_from %s: tensor '%s' is missing; HINT: the folder must hold every drafter parameter "
             "(as `dflash_mpi export` writes them)", dir.c_str(), e.name.c_str());
    const bool shape_ok = t->shape == std::vector<int64_t>{e.rows, e.cols} ||
                          (e.rows == 1 && t->shape == std::vector<int64_t>{e.cols});
    std::string shape;
    for (int64_t d : t->shape) shape += strfmt("%s%lld", shape.empty() ? "" : ", ", (long long)d);
    DF_CHECK(shape_ok, "%s: tensor '%s' has shape [%s], the run's drafter needs [%lld, %lld]", t->file.c_str(),
             e.name.c_str(), shape.c_str(), (long long)e.rows, (long long)e.cols);
    DF_CHECK(t->dtype == DType::f32 || t->dtype == DType::bf16 || t->dtype == DType::f16,
             "%s: tensor '%s' is %s; drafter weights must be F32, BF16 or F16", t->file.c_str(), e.name.c_str(),
             dtype_name(t->dtype));
    buf.resize(size_t(e.rows * e.cols));
    st_to_f32(*t, buf.data());
    for (size_t i = 0; i < buf.size(); ++i)
      DF_CHECK(std::isfinite(buf[i]), "%s: tensor '%s' holds a non-finite value (%g) at element %zu", t->file.c_str(),
               e.name.c_str(), double(buf[i]), i);
    m.ops().upload_raw(m.entry_view(m.params, e.name), buf.data());
  }
  for (const std::string& name : idx.names())
    DF_CHECK(known.count(name), "drafter.init_from %s: tensor '%s' is not a drafter parameter; HINT: is this a "
             "DFlash drafter folder (not a target checkpoint)?", dir.c_str(), name.c_str());
}

void drafter_init_from(DrafterModel& m, const std::string& dir) {
  drafter_config_check_same(m.config(), drafter_config_load_hf(dir), dir);
  drafter_load_hf_weights(m, dir);
  m.ops().fill(m.adam_m, 0.0f);
  m.ops().fill(m.adam_v, 0.0f);
  drafter_zero_grads(m);
}

}  // namespace df
