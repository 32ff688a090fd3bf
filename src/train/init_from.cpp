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

// The DFlash2 parameters a DFlash folder lacks (drafter_init_from's DFlash → DFlash2 start), as that start
// sets them: identity base kernels, zero kernel projections and successor codebook; false for the two the
// model keeps (predecessor codebook, hidden projection) and for any other name.
bool dflash2_start_value(const DrafterModel& m, const DrafterParamEntry& e, std::vector<float>& buf) {
  const bool base = drafter_param_is_base_kernel(e.name);
  const bool zero = e.name.find("_conv.kernel_projection.") != std::string::npos ||
                    e.name == "candidate_selector.successor_codebook";
  if (!base && !zero) return false;
  buf.assign(size_t(e.rows * e.cols), 0.0f);
  if (base)
    for (size_t i = 0; i < buf.size(); ++i)
      buf[i] = drafter_base_kernel_identity(int64_t(i), e.cols, m.config().conv_kernel_size);
  return true;
}

bool is_dflash2_only(const std::string& name) {
  return name.find("_conv.") != std::string::npos || name.rfind("candidate_selector.", 0) == 0;
}

// drafter_load_hf_weights; from_dflash: the folder is a DFlash drafter and m a DFlash2 one, whose own
// tensors start as dflash2_start_value says.
void load_hf_weights(DrafterModel& m, const std::string& dir, bool from_dflash) {
  const SafetensorsIndex idx = SafetensorsIndex::open(dir);
  const DrafterParamTable& table = m.table();
  std::set<std::string> known;
  std::vector<float> buf;
  for (const DrafterParamEntry& e : table.entries) {
    known.insert(e.name);
    known.insert(kHeadPrefix + e.name);
    if (from_dflash && is_dflash2_only(e.name)) {
      if (dflash2_start_value(m, e, buf)) m.ops().upload_raw(m.entry_view(m.params, e.name), buf.data());
      continue;
    }
    const StTensor* t = idx.find(e.name);
    if (!t) t = idx.find(kHeadPrefix + e.name);
    DF_CHECK(
        t,
        "drafter.init_from %s: tensor '%s' is missing; HINT: the folder must hold every drafter parameter "
        "(as `dflash_mpi export` writes them)",
        dir.c_str(), e.name.c_str());
    const bool shape_ok =
        t->shape == std::vector<int64_t>{e.rows, e.cols} || t->shape == drafter_param_hf_shape(m.config(), e);
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

}  // namespace

void drafter_load_hf_weights(DrafterModel& m, const std::string& dir) {
  load_hf_weights(m, dir, false);
}

void drafter_init_from(DrafterModel& m, const std::string& dir) {
  DrafterConfig hf = drafter_config_load_hf(dir);
  const bool from_dflash = m.config().kind == DrafterKind::dflash2 && hf.kind == DrafterKind::dflash;
  if (from_dflash) {
    // The backbone must match; the DFlash2 fields are the run's own.
    const DrafterConfig& c = m.config();
    hf.kind = c.kind;
    hf.conv_kernel_size = c.conv_kernel_size;
    hf.conv_group_size = c.conv_group_size;
    hf.selector_rank = c.selector_rank;
    hf.selector_top_k = c.selector_top_k;
    hf.output_multiplier = c.output_multiplier;
    hf.final_logit_softcapping = c.final_logit_softcapping;
  }
  drafter_config_check_same(m.config(), hf, dir);
  load_hf_weights(m, dir, from_dflash);
  m.ops().fill(m.adam_m, 0.0f);
  m.ops().fill(m.adam_v, 0.0f);
  drafter_zero_grads(m);
}

}  // namespace df
