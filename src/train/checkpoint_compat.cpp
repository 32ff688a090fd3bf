// "The checkpoint is the truth for what was trained": a checkpoint's header without the tensors (the drafter
// config stored as JSON: model/drafter_config.h), and the comparison of a run config against it that resume and export make.
#include <cstring>
#include <set>

#include "core/config.h"
#include "core/error.h"
#include "core/h5_util.h"
#include "train/checkpoint_io.h"

namespace df {

namespace {

std::string num(double v) {
  return strfmt("%.15g", v);  // 15 digits: a double's value, without binary noise
}

// What a run config decides about training besides the drafter's own fields (drafter_config_fields, compared
// on the resolved DrafterConfig: taps default, intermediate 0 = the target's), by its TOML key.
struct RunField {
  const char* key;
  std::string (*value)(const Config&);
};

const RunField kRunFields[] = {
    {"train.loss", [](const Config& c) { return c.train.loss; }},
    {"train.gamma", [](const Config& c) { return num(c.train.gamma); }},
    {"train.streak", [](const Config& c) { return std::string(c.train.streak ? "true" : "false"); }},
    {"train.streak_alpha", [](const Config& c) { return num(c.train.streak_alpha); }},
    {"train.dpace_alpha", [](const Config& c) { return num(c.train.dpace_alpha); }},
    {"train.noise_std", [](const Config& c) { return num(c.train.noise_std); }},
    {"train.lambda_base_start", [](const Config& c) { return num(c.train.lambda_base_start); }},
    {"train.lambda_base_decay_ratio", [](const Config& c) { return num(c.train.lambda_base_decay_ratio); }},
    {"train.dflash2_selector_loss_alpha",
     [](const Config& c) { return num(c.train.dflash2_selector_loss_alpha); }},
    {"train.dflash2_selector_warmup_ratio",
     [](const Config& c) { return num(c.train.dflash2_selector_warmup_ratio); }},
    {"train.dflash2_selector_ramp_ratio",
     [](const Config& c) { return num(c.train.dflash2_selector_ramp_ratio); }},
    {"train.dflash2_selector_stop_gradient",
     [](const Config& c) { return std::string(c.train.dflash2_selector_stop_gradient ? "true" : "false"); }},
    {"train.dspark_ce_loss_alpha", [](const Config& c) { return num(c.train.dspark_ce_loss_alpha); }},
    {"train.dspark_l1_loss_alpha", [](const Config& c) { return num(c.train.dspark_l1_loss_alpha); }},
    {"train.dspark_confidence_head_alpha",
     [](const Config& c) { return num(c.train.dspark_confidence_head_alpha); }},
    {"train.lr", [](const Config& c) { return num(c.train.lr); }},
    {"train.warmup_ratio", [](const Config& c) { return num(c.train.warmup_ratio); }},
    {"train.epochs", [](const Config& c) { return num(c.train.epochs); }},
    {"run.max_steps", [](const Config& c) { return std::to_string(c.run.max_steps); }},
};

// Every key a resume compares, drafter fields first.
std::vector<std::string> compared_keys() {
  std::vector<std::string> keys;
  for (const DrafterFieldText& f : drafter_config_texts(DrafterConfig())) keys.push_back(f.field.run_key);
  for (const RunField& f : kRunFields) keys.push_back(f.key);
  return keys;
}

}  // namespace

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
  const std::vector<DrafterFieldText> was = drafter_config_texts(h.drafter), is = drafter_config_texts(now);
  for (size_t i = 0; i < was.size(); ++i)
    if (was[i].text != is[i].text) out.push_back({was[i].field.run_key, was[i].text, is[i].text});
  for (const RunField& f : kRunFields) {
    const std::string w = f.value(stored), n = f.value(cfg);
    if (w != n) out.push_back({f.key, w, n});
  }
  return out;
}

void checkpoint_check_resume_config(const CheckpointHeader& h, const std::string& path, const Config& cfg,
                                    const DrafterConfig& now, const std::vector<std::string>& allowed) {
  const std::vector<std::string> compared = compared_keys();
  const std::set<std::string> known(compared.begin(), compared.end());
  for (const std::string& a : allowed) {
    std::string keys;
    for (const std::string& k : compared) keys += (keys.empty() ? "" : ", ") + k;
    DF_CHECK(known.count(a), "--allow-change %s: not a setting a resume compares; HINT: one of %s", a.c_str(),
             keys.c_str());
  }
  // Another kind is another parameter set and loss: no --allow-change makes that a resume.
  DF_CHECK(h.drafter.kind == now.kind,
           "%s: 'drafter.kind' is \"%s\" but %s trained a \"%s\" drafter; a resume continues the same kind. "
           "HINT: set drafter.kind = \"%s\", or start a fresh run (checkpoint.resume = \"none\" and another "
           "run.dir)",
           cfg.path.c_str(), drafter_kind_name(now.kind), path.c_str(), drafter_kind_name(h.drafter.kind),
           drafter_kind_name(h.drafter.kind));
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
