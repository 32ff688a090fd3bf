// drafter.init_from: a Hugging Face DFlash drafter folder's config.json (read by model/drafter_config.h)
// checked against the run's drafter, and its weights loaded.
#include "train/init_from.h"

#include <cmath>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/strfmt.h"
#include "model/safetensors.h"

namespace df {

void drafter_config_check_same(const DrafterConfig& run, const DrafterConfig& hf, const std::string& where) {
  const std::vector<DrafterFieldText> ours = drafter_config_texts(run), theirs = drafter_config_texts(hf);
  for (size_t i = 0; i < ours.size(); ++i) {
    const DrafterField& f = ours[i].field;
    // Not in config.json (num_anchors), or not used: a window where no layer slides.
    if (!f.hf_key || (std::string(f.key) == "sliding_window" && !drafter_config_any_sliding(run))) continue;
    DF_CHECK(ours[i].text == theirs[i].text,
             "drafter.init_from %s: config.json has %s = %s but this run's drafter has %s (%s); HINT: make the "
             "run config match the folder, or point drafter.init_from at a drafter of this architecture",
             where.c_str(), f.hf_key, theirs[i].text.c_str(), ours[i].text.c_str(), f.run_key);
  }
}

namespace {
// Early SpecForge Domino/DSpark checkpoints saved their heads under a `logit_head.` container
// (dflash.py normalize_draft_head_checkpoint_keys maps them back); a tensor's direct name wins over it.
const std::string kHeadPrefix = "logit_head.";
}  // namespace

void drafter_load_hf_weights(DrafterModel& m, const std::string& dir) {
  const SafetensorsIndex idx = SafetensorsIndex::open(dir);
  const DrafterParamTable& table = m.table();
  std::set<std::string> known;
  std::vector<float> buf;
  for (const DrafterParamEntry& e : table.entries) {
    known.insert(e.name);
    known.insert(kHeadPrefix + e.name);
    const StTensor* t = idx.find(e.name);
    if (!t) t = idx.find(kHeadPrefix + e.name);
    DF_CHECK(
        t,
        "drafter.init_from %s: tensor '%s' is missing; HINT: the folder must hold every drafter parameter "
        "(as `dflash_mpi export` writes them)",
        dir.c_str(), e.name.c_str());
    const bool shape_ok = t->shape == std::vector<int64_t>{e.rows, e.cols} ||
                          (e.rows == 1 && t->shape == std::vector<int64_t>{e.cols});
    std::string shape;
    for (int64_t d : t->shape) shape += strfmt("%s%lld", shape.empty() ? "" : ", ", (long long)d);
    DF_CHECK(shape_ok, "%s: tensor '%s' has shape [%s], the run's drafter needs [%lld, %lld]",
             t->file.c_str(), e.name.c_str(), shape.c_str(), (long long)e.rows, (long long)e.cols);
    DF_CHECK(t->dtype == DType::f32 || t->dtype == DType::bf16 || t->dtype == DType::f16,
             "%s: tensor '%s' is %s; drafter weights must be F32, BF16 or F16", t->file.c_str(),
             e.name.c_str(), dtype_name(t->dtype));
    buf.resize(size_t(e.rows * e.cols));
    st_to_f32(*t, buf.data());
    for (size_t i = 0; i < buf.size(); ++i)
      DF_CHECK(std::isfinite(buf[i]), "%s: tensor '%s' holds a non-finite value (%g) at element %zu",
               t->file.c_str(), e.name.c_str(), double(buf[i]), i);
    m.ops().upload_raw(m.entry_view(m.params, e.name), buf.data());
  }
  for (const std::string& name : idx.names())
    DF_CHECK(known.count(name),
             "drafter.init_from %s: tensor '%s' is not a drafter parameter; HINT: is this a "
             "DFlash drafter folder (not a target checkpoint)?",
             dir.c_str(), name.c_str());
}

void drafter_init_from(DrafterModel& m, const std::string& dir) {
  drafter_config_check_same(m.config(), drafter_config_load_hf(dir), dir);
  drafter_load_hf_weights(m, dir);
  m.ops().fill(m.adam_m, 0.0f);
  m.ops().fill(m.adam_v, 0.0f);
  drafter_zero_grads(m);
}

}  // namespace df
