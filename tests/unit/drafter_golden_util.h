// Shared by the drafter golden tests (tests/unit/test_drafter_golden.cpp on the CPU, tests/gpu/
// test_drafter_golden_cuda.cpp on CUDA): reads the files tests/golden/make_drafter_golden.py wrote from
// SpecForge's own DFlash step, runs our step on them with the drafter loaded through drafter.init_from, and
// compares. Header-only; each test executable includes it once.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/strfmt.h"
#include "model/drafter.h"
#include "model/safetensors.h"
#include "train/export_hf.h"
#include "train/init_from.h"

namespace df::drafter_golden {

inline std::string golden_dir() {
  return std::string(DF_SOURCE_DIR) + "/tests/golden/drafter";
}
inline std::string model_dir() {
  return golden_dir() + "/model";
}
inline bool golden_present() {
  return std::filesystem::exists(golden_dir() + "/golden.safetensors") &&
         std::filesystem::exists(model_dir() + "/config.json");
}
constexpr const char* kMissing =
    "tests/golden/drafter/ is absent: run `python3 tests/golden/make_drafter_golden.py` where torch, "
    "transformers "
    "and .peer/SpecForge exist (the GPU machine) and commit tests/golden/drafter/";

inline const StTensor& tensor_of(const SafetensorsIndex& g, const std::string& name) {
  const StTensor* t = g.find(name);
  if (!t) throw std::runtime_error("golden.safetensors lacks '" + name + "'; rerun make_drafter_golden.py");
  return *t;
}
inline std::vector<float> read_f32(const SafetensorsIndex& g, const std::string& name) {
  const StTensor& t = tensor_of(g, name);
  std::vector<float> v(size_t(t.numel()));
  st_to_f32(t, v.data());
  return v;
}
template <class T>
std::vector<T> read_raw(const SafetensorsIndex& g, const std::string& name, DType want) {
  const StTensor& t = tensor_of(g, name);
  if (t.dtype != want) throw std::runtime_error("golden '" + name + "' is " + dtype_name(t.dtype));
  std::vector<T> v(size_t(t.numel()));
  std::memcpy(v.data(), t.data, t.nbytes);
  return v;
}

// Host f32 values -> a backend tensor of `dtype` (f32 or bf16) inside `mem`.
inline Tensor upload_as(TrainOps& ops, void* mem, DType dtype, int64_t rows, int64_t cols,
                        const std::vector<float>& v) {
  Tensor t = tensor_make(mem, dtype, ops.device(), rows, cols);
  if (dtype == DType::f32) {
    ops.upload_raw(t, v.data());
  } else {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = f32_to_bf16(v[i]);
    ops.upload_raw(t, b.data());
  }
  return t;
}

struct StepResult {
  DrafterConfig cfg;
  double loss = 0, weight_sum = 0;
  std::vector<float> row_weight;
  std::vector<DrafterAnchor> anchors;
  std::map<std::string, std::vector<float>> grads;  // ∂loss/∂θ: our ∂(Σ w·L) divided by Σ w, as SpecForge's
};

// Our step on the golden inputs: drafter from `model` (the golden's model/ folder) through drafter_init_from,
// frozen tables and taps in the backend's activation dtype, the golden anchors in SpecForge's block order
// (sequence-major, padding as pos −1); a Domino drafter at the golden's λ, a DFlash2 one at its selector α, a
// DSpark one with the golden's loss weights and the target's final hidden states.
inline StepResult run_golden_step(TrainOps& ops, const SafetensorsIndex& g,
                                  const std::string& model = model_dir()) {
  StepResult r;
  r.cfg = drafter_config_load_hf(model);
  DrafterModel m(r.cfg, ops);
  drafter_init_from(m, model);
  drafter_refresh_shadow(m);
  const int64_t H = r.cfg.hidden, V = r.cfg.vocab;
  DrafterBatch b;
  b.offsets = read_raw<int64_t>(g, "offsets", DType::i64);
  b.tokens = read_raw<int32_t>(g, "tokens", DType::i32);
  b.loss_mask = read_raw<uint8_t>(g, "loss_mask", DType::u8);
  const int64_t T = b.offsets.back();
  const DType act = ops.act_dtype();
  const bool dspark = r.cfg.kind == DrafterKind::dspark;
  const size_t bytes = size_t(2 * V * H + T * H * (r.cfg.num_taps() + (dspark ? 1 : 0))) * dtype_size(act);
  void* mem = ops.alloc_bytes(bytes);
  char* p = static_cast<char*>(mem);
  const Tensor embed = upload_as(ops, p, act, V, H, read_f32(g, "embed"));
  const Tensor lm_head =
      upload_as(ops, p + size_t(V * H) * dtype_size(act), act, V, H, read_f32(g, "lm_head"));
  b.taps = upload_as(ops, p + size_t(2 * V * H) * dtype_size(act), act, T, H * r.cfg.num_taps(),
                     read_f32(g, "taps"));
  if (dspark)
    b.target_hidden = upload_as(ops, p + size_t(2 * V * H + T * H * r.cfg.num_taps()) * dtype_size(act), act,
                                T, H, read_f32(g, "target_hidden"));
  m.set_frozen(embed, lm_head);
  const std::vector<int32_t> an = read_raw<int32_t>(g, "anchors", DType::i32);
  for (size_t i = 0; i + 1 < an.size(); i += 2) r.anchors.push_back({an[i], an[i + 1]});
  DrafterLimits lim;
  lim.max_tokens = T;
  lim.max_blocks = int64_t(r.anchors.size());
  drafter_plan_workspace(m, lim);
  DrafterLossOptions opts;
  opts.gamma = read_f32(g, "gamma")[0];
  if (r.cfg.kind == DrafterKind::domino) opts.domino_lambda = read_f32(g, "lambda_base")[0];
  if (r.cfg.kind == DrafterKind::dflash2) opts.dflash2_selector_alpha = read_f32(g, "selector_alpha")[0];
  if (dspark) {
    const std::vector<float> a = read_f32(g, "alphas");
    opts.dspark = {a[0], a[1], a[2]};
  }
  drafter_begin_step(m);  // the training path: the backward writes the gradients
  LossStats st = drafter_forward_backward(m, b, r.anchors, opts);
  r.loss = st.mean_loss();
  r.weight_sum = st.weight_sum;
  r.row_weight = st.row_weight;
  for (const DrafterParamEntry& e : m.table().entries) {
    std::vector<float> v(size_t(e.rows * e.cols));
    ops.download_raw(m.entry_view(m.grads, e.name), v.data());
    for (float& x : v) x = float(double(x) / st.weight_sum);
    r.grads[e.name] = std::move(v);
  }
  ops.free_bytes(mem);
  return r;
}

// SpecForge's weight mask says which block rows carry loss (block validity × in-sequence × not the anchor ×
// loss_mask of the label); ours must agree row by row. Returns "" or a message naming the first row that
// differs.
inline std::string row_weight_mismatch(const StepResult& r, const std::vector<float>& weight_mask) {
  const int B = r.cfg.block_size;
  if (weight_mask.size() != r.row_weight.size())
    return strfmt("%zu SpecForge rows vs %zu ours", weight_mask.size(), r.row_weight.size());
  for (size_t i = 0; i < weight_mask.size(); ++i)
    if ((weight_mask[i] > 0) != (r.row_weight[i] > 0)) {
      const DrafterAnchor& a = r.anchors[i / size_t(B)];
      return strfmt(
          "row %zu (block %zu: sequence %d, anchor %d, offset %zu): SpecForge weight mask %g, ours %g", i,
          i / size_t(B), a.seq, a.pos, i % size_t(B), double(weight_mask[i]), double(r.row_weight[i]));
    }
  return "";
}

// The checks both backends share: which rows carry loss (exactly), Σ w against SpecForge's loss denominator
// (the exp(−(k−1)/γ) decay; float sums of ≤ 100 weights), and the loss within loss_rtol.
inline void expect_rows_and_loss(const StepResult& r, const SafetensorsIndex& g, double loss_rtol) {
  EXPECT_EQ(row_weight_mismatch(r, read_f32(g, "weight_mask")), "")
      << "which rows carry loss differs from SpecForge (anchor/label semantics)";
  const double den = read_f32(g, "loss_den")[0];
  EXPECT_NEAR(r.weight_sum, den, 1e-6 * den) << "Σ w (decayed weights) differs from SpecForge's loss_den";
  const double want = read_f32(g, "loss")[0];
  EXPECT_NEAR(r.loss, want, loss_rtol * std::fabs(want)) << "loss ours " << r.loss << " SpecForge " << want;
}

struct GradDiff {
  double worst_ratio = 0, rel_rms = 0, max_abs_want = 0;
  size_t worst = 0;
  double got = 0, want = 0;
  bool finite = true;
};

// Elementwise |a − b| against atol_frac·max|b| + rtol·|b| (worst element kept), and ||a − b|| / ||b||.
inline GradDiff grad_diff(const std::vector<float>& got, const std::vector<float>& want, double atol_frac,
                          double rtol) {
  GradDiff d;
  for (float w : want) d.max_abs_want = std::max(d.max_abs_want, std::fabs(double(w)));
  const double atol = atol_frac * d.max_abs_want;
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double a = got[i], b = want[i], diff = std::fabs(a - b);
    if (!std::isfinite(a)) d.finite = false;
    num += diff * diff;
    den += b * b;
    const double ratio = diff / std::max(atol + rtol * std::fabs(b), 1e-300);
    if (!(ratio <= d.worst_ratio)) {
      d.worst_ratio = ratio;
      d.worst = i;
      d.got = a;
      d.want = b;
    }
  }
  d.rel_rms = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return d;
}

inline std::string describe(const std::string& name, const std::vector<float>& want, int64_t cols,
                            const GradDiff& d) {
  return strfmt(
      "%s [%zu elements]: worst element %zu (row %lld, col %lld) ours %.9g SpecForge %.9g "
      "(|diff| / tol = %.3g), max |SpecForge| %.4g, relative RMS error %.3g",
      name.c_str(), want.size(), d.worst, (long long)(d.worst / size_t(cols)),
      (long long)(d.worst % size_t(cols)), d.got, d.want, d.worst_ratio, d.max_abs_want, d.rel_rms);
}

}  // namespace df::drafter_golden
