// "The checkpoint is the truth for what was trained": the drafter config stored in a checkpoint (as JSON),
// its header without the tensors, and the comparison of a run config against it that resume and export make.
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "core/config.h"
#include "core/error.h"
#include "core/h5_util.h"
#include "train/checkpoint_io.h"
#include "train/export_hf.h"

namespace df {

namespace {

std::string num(double v) {
  return strfmt("%.15g", v);  // 15 digits: a double's value, without binary noise
}

std::string list(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

std::string types(const DrafterConfig& c) {
  std::string s = "[";
  for (size_t i = 0; i < c.layer_types.size(); ++i)
    s += (i ? ", " : "") + std::string(drafter_layer_type_hf_name(c.layer_types[i]));
  return s + "]";
}

// What a run config decides about training, by its TOML key. The drafter's fields come from the resolved
// DrafterConfig (taps default, intermediate 0 = the target's), the rest from the parsed run config.
struct Field {
  const char* key;
  std::string (*drafter)(const DrafterConfig&);
  std::string (*run)(const Config&);
};

const Field kFields[] = {
    {"drafter.layers", [](const DrafterConfig& c) { return std::to_string(c.layers); }, nullptr},
    {"drafter.heads", [](const DrafterConfig& c) { return std::to_string(c.heads); }, nullptr},
    {"drafter.kv_heads", [](const DrafterConfig& c) { return std::to_string(c.kv_heads); }, nullptr},
    {"drafter.head_dim", [](const DrafterConfig& c) { return std::to_string(c.head_dim); }, nullptr},
    {"drafter.intermediate", [](const DrafterConfig& c) { return std::to_string(c.intermediate); }, nullptr},
    {"drafter.block_size", [](const DrafterConfig& c) { return std::to_string(c.block_size); }, nullptr},
    {"drafter.mask_token_id", [](const DrafterConfig& c) { return std::to_string(c.mask_token_id); },
     nullptr},
    {"drafter.target_layer_ids", [](const DrafterConfig& c) { return list(c.target_layer_ids); }, nullptr},
    {"drafter.layer_types", [](const DrafterConfig& c) { return types(c); }, nullptr},
    {"drafter.sliding_window", [](const DrafterConfig& c) { return std::to_string(c.sliding_window); },
     nullptr},
    {"drafter.rope_theta", [](const DrafterConfig& c) { return num(c.rope_theta); }, nullptr},
    {"drafter.rms_norm_eps", [](const DrafterConfig& c) { return num(c.rms_eps); }, nullptr},
    {"drafter.num_anchors", [](const DrafterConfig& c) { return std::to_string(c.num_anchors); }, nullptr},
    {"target (hidden size)", [](const DrafterConfig& c) { return std::to_string(c.hidden); }, nullptr},
    {"target (vocabulary)", [](const DrafterConfig& c) { return std::to_string(c.vocab); }, nullptr},
    {"train.loss", nullptr, [](const Config& c) { return c.train.loss; }},
    {"train.gamma", nullptr, [](const Config& c) { return num(c.train.gamma); }},
    {"train.streak", nullptr, [](const Config& c) { return std::string(c.train.streak ? "true" : "false"); }},
    {"train.streak_alpha", nullptr, [](const Config& c) { return num(c.train.streak_alpha); }},
    {"train.dpace_alpha", nullptr, [](const Config& c) { return num(c.train.dpace_alpha); }},
    {"train.noise_std", nullptr, [](const Config& c) { return num(c.train.noise_std); }},
    {"train.lr", nullptr, [](const Config& c) { return num(c.train.lr); }},
    {"train.warmup_ratio", nullptr, [](const Config& c) { return num(c.train.warmup_ratio); }},
    {"train.epochs", nullptr, [](const Config& c) { return num(c.train.epochs); }},
    {"run.max_steps", nullptr, [](const Config& c) { return std::to_string(c.run.max_steps); }},
};

}  // namespace

std::string drafter_config_json(const DrafterConfig& c) {
  nlohmann::json j;
  j["hidden"] = c.hidden;
  j["layers"] = c.layers;
  j["heads"] = c.heads;
  j["kv_heads"] = c.kv_heads;
  j["head_dim"] = c.head_dim;
  j["intermediate"] = c.intermediate;
  j["rope_theta"] = c.rope_theta;
  j["rms_eps"] = c.rms_eps;
  j["block_size"] = c.block_size;
  j["mask_token_id"] = c.mask_token_id;
  j["target_layer_ids"] = c.target_layer_ids;
  nlohmann::json t = nlohmann::json::array();
  for (DrafterLayerType x : c.layer_types) t.push_back(drafter_layer_type_hf_name(x));
  j["layer_types"] = t;
  j["sliding_window"] = c.sliding_window;
  j["num_anchors"] = c.num_anchors;
  j["vocab"] = c.vocab;
  return j.dump();
}

DrafterConfig drafter_config_from_json(const std::string& text, const std::string& where) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  DF_CHECK(j.is_object(), "%s: drafter_config is not a JSON object (file corrupt?)", where.c_str());
  DrafterConfig c;
  auto get = [&](const char* key, auto& out) {
    DF_CHECK(j.contains(key), "%s: drafter_config has no '%s' (file corrupt or written by another tool?)",
             where.c_str(), key);
    try {
      out = j.at(key).get<std::remove_reference_t<decltype(out)>>();
    } catch (const nlohmann::json::exception&) {
      DF_FAIL("%s: drafter_config '%s' has the wrong type: %s", where.c_str(), key, j.at(key).dump().c_str());
    }
  };
  get("hidden", c.hidden);
  get("layers", c.layers);
  get("heads", c.heads);
  get("kv_heads", c.kv_heads);
  get("head_dim", c.head_dim);
  get("intermediate", c.intermediate);
  get("rope_theta", c.rope_theta);
  get("rms_eps", c.rms_eps);
  get("block_size", c.block_size);
  get("mask_token_id", c.mask_token_id);
  get("target_layer_ids", c.target_layer_ids);
  std::vector<std::string> names;
  get("layer_types", names);
  for (const std::string& n : names) {
    DF_CHECK(n == "sliding_attention" || n == "full_attention", "%s: drafter_config layer_types holds '%s'",
             where.c_str(), n.c_str());
    c.layer_types.push_back(n == "sliding_attention" ? DrafterLayerType::sliding : DrafterLayerType::full);
  }
  get("sliding_window", c.sliding_window);
  get("num_anchors", c.num_anchors);
  get("vocab", c.vocab);
  try {
    drafter_config_validate(c);
  } catch (const Error& e) {
    DF_FAIL("%s: the stored drafter_config is invalid: %s", where.c_str(), e.what());
  }
  return c;
}

std::string h5_read_string_attr_or_empty(hid_t file, const char* name, const std::string& path) {
  if (H5Aexists(file, name) <= 0) return "";
  H5Handle attr(H5Aopen(file, name, H5P_DEFAULT), H5Aclose);
  H5Handle ftype(H5Aget_type(attr.get()), H5Tclose);
  DF_CHECK(attr.get() >= 0 && H5Tget_class(ftype.get()) == H5T_STRING && H5Tis_variable_str(ftype.get()) == 0,
           "%s: root attribute '%s' must be a fixed-length string", path.c_str(), name);
  const size_t n = H5Tget_size(ftype.get());
  H5Handle mtype(h5_string_type(n), H5Tclose);
  std::string buf(n, '\0');
  DF_CHECK(H5Aread(attr.get(), mtype.get(), buf.data()) >= 0, "%s: cannot read root attribute '%s'",
           path.c_str(), name);
  buf.resize(strnlen(buf.data(), n));
  return buf;
}

CheckpointHeader checkpoint_read_header(const std::string& path) {
  H5Quiet quiet;
  H5Handle file(checkpoint_open(path), H5Fclose);
  CheckpointHeader h;
  h.state.step = h5_read_attr<int64_t>(file.get(), "step", H5T_NATIVE_INT64, path);
  h.state.batch_cursor = h5_read_attr<int64_t>(file.get(), "batch_cursor", H5T_NATIVE_INT64, path);
  h.state.tokens_seen = h5_read_attr<int64_t>(file.get(), "tokens_seen", H5T_NATIVE_INT64, path);
  h.state.data_fingerprint = h5_read_attr<uint64_t>(file.get(), "data_fingerprint", H5T_NATIVE_UINT64, path);
  h.state.run_id = h5_read_string_attr_or_empty(file.get(), "run_id", path);
  h.state.config_text = h5_read_string_dataset(file.get(), "config_text", path);
  h.drafter = drafter_config_from_json(h5_read_string_dataset(file.get(), "drafter_config", path), path);
  return h;
}

std::vector<CheckpointChange> checkpoint_config_changes(const CheckpointHeader& h, const std::string& path,
                                                        const Config& cfg, const DrafterConfig& now) {
  Config stored;
  try {
    stored = config_parse(h.state.config_text, path + " (its stored config_text)");
  } catch (const Error& e) {
    DF_FAIL(
        "%s: the run config stored in the checkpoint does not parse: %s. HINT: use the dflash_mpi that wrote "
        "it",
        path.c_str(), e.what());
  }
  std::vector<CheckpointChange> out;
  for (const Field& f : kFields) {
    std::string was = f.drafter ? f.drafter(h.drafter) : f.run(stored);
    std::string is = f.drafter ? f.drafter(now) : f.run(cfg);
    if (was != is) out.push_back({f.key, was, is});
  }
  return out;
}

void checkpoint_check_resume_config(const CheckpointHeader& h, const std::string& path, const Config& cfg,
                                    const DrafterConfig& now, const std::vector<std::string>& allowed) {
  std::set<std::string> known;
  for (const Field& f : kFields) known.insert(f.key);
  for (const std::string& a : allowed) {
    std::string keys;
    for (const Field& f : kFields) keys += std::string(keys.empty() ? "" : ", ") + f.key;
    DF_CHECK(known.count(a), "--allow-change %s: not a setting a resume compares; HINT: one of %s", a.c_str(),
             keys.c_str());
  }
  const std::set<std::string> ok(allowed.begin(), allowed.end());
  for (const CheckpointChange& c : checkpoint_config_changes(h, path, cfg, now)) {
    if (ok.count(c.key)) continue;
    DF_FAIL(
        "%s: '%s' is %s but %s was trained with %s; a resume trains what the checkpoint trained. HINT: set "
        "it "
        "back, pass --allow-change %s to change it on purpose, or start fresh with checkpoint.resume = "
        "\"none\"",
        cfg.path.c_str(), c.key.c_str(), c.now.c_str(), path.c_str(), c.checkpoint.c_str(), c.key.c_str());
  }
}

}  // namespace df
