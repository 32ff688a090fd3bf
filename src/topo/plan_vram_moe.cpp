// The VRAM planner's mixture-of-experts lines; see plan_vram_moe.h. Parameter counts follow
// plan_vram_target_layer_params (one sum, split by part), buffer sizes the grouped forward's data flow.
#include "topo/plan_vram_moe.h"

#include <cmath>

#include "core/strfmt.h"

namespace df {

namespace {

constexpr double kBf16 = 2, kF32 = 4, kI32 = 4;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

}  // namespace

MoeParamCount plan_vram_moe_params(const QwenConfig& t, int layers) {
  MoeParamCount n;
  const double h = t.hidden, E = t.num_experts;
  for (int l = 0; l < layers; ++l) {
    if (!t.layer_is_moe(l)) continue;
    ++n.layers;
    n.experts += E * 3.0 * h * t.moe_intermediate;
    n.router += E * h;
    if (t.shared_intermediate > 0) n.shared += 3.0 * h * t.shared_intermediate + h;
  }
  return n;
}

std::vector<VramItem> plan_vram_moe_weights(const QwenConfig& t, const MoeParamCount& n) {
  const double h = t.hidden;
  return {
      {"MoE routed experts bf16", kBf16 * n.experts,
       strfmt("2 B x %d MoE layers x %d experts x 3 x %.0f x %d (gate, up, down) = %.4g params", n.layers,
              t.num_experts, h, t.moe_intermediate, n.experts)},
      {"MoE router + shared expert bf16", kBf16 * (n.router + n.shared),
       strfmt(
           "2 B x %d MoE layers x (router %d x %.0f%s) = %.4g params", n.layers, t.num_experts, h,
           t.shared_intermediate > 0
               ? strfmt(" + shared expert 3 x %.0f x %d + its gate %.0f", h, t.shared_intermediate, h).c_str()
               : "",
           n.router + n.shared)},
  };
}

std::vector<VramItem> plan_vram_moe_routing(const QwenConfig& t, int64_t T) {
  const double E = t.num_experts, k = t.experts_per_tok, H = t.hidden, I = t.moe_intermediate;
  const double Is = t.shared_intermediate, rows = double(T) * k;
  const long long tl = (long long)T;
  std::vector<VramItem> v = {
      {"MoE router probs [T,E] f32", kF32 * T * E,
       strfmt("4 B x %lld x %.0f (softmax over the experts before the top-k)", tl, E)},
      {"MoE routing ids + weights [T,k]", (kI32 + kF32) * T * k,
       strfmt("(4 B i32 + 4 B f32) x %lld x %.0f", tl, k)},
      {"MoE counts, offsets, row maps", kI32 * (2 * E + 1) + 2 * kI32 * rows,
       strfmt("4 B x (counts %.0f + offsets %.0f) + 2 x 4 B x %.0f rows (each grouped row's token and slot, "
              "and its inverse for the combine)",
              E, E + 1, rows)},
      {"MoE grouped expert rows bf16", kBf16 * rows * (2 * H + 3 * I),
       strfmt(
           "2 B x %.0f rows (%lld tokens x top-%.0f, dropless: the same for every routing, all tokens on the "
           "same experts included) x (input %.0f + gate|up %.0f + act %.0f + output %.0f)",
           rows, tl, k, H, 2 * I, I, H)},
  };
  if (Is > 0)
    v.push_back({"MoE shared expert rows bf16", kBf16 * T * (3 * Is + H) + kF32 * T,
                 strfmt("2 B x %lld x (gate|up %.0f + act %.0f + output %.0f) + 4 B x %lld gate logits", tl,
                        2 * Is, Is, H, tl)});
  return v;
}

std::string plan_vram_target_too_big(const Config& cfg, const QwenConfig& t, const VramPlan& p) {
  const double need = p.target_weight_bytes / kGiB;
  const bool fp8 = cfg.target.dtype == "fp8" && !t.is_moe();
  const double gib = std::ceil(need);
  const std::string hint =
      fp8 ? strfmt("a GPU with more than %.0f GiB", gib)
      : t.is_moe()
          ? strfmt(
                "a GPU with more than %.0f GiB (FP8 for mixture-of-experts targets is not implemented yet "
                "either)",
                gib)
          : strfmt(
                "target.dtype = \"fp8\" (1 B projections; re-run plan vram with it), or a GPU with more "
                "than %.0f GiB",
                gib);
  return strfmt(
      "The target's weights alone are %.2f GiB (%.0f B in %s, the %d layers up to the last tap) but one GPU "
      "has %.2f GiB (%s). A target rank holds its whole model on its own GPU, so no data.token_budget, "
      "pipeline.hs_queue_depth or target:drafter split makes this target fit; target ranks spanning several "
      "GPUs (tensor- or expert-parallel groups, docs/multi-gpu-targets.md) are not implemented yet. HINT: %s",
      need, p.target_weight_bytes, fp8 ? "FP8 + bf16" : "bf16", p.target_layers_run, p.gpu_bytes / kGiB,
      p.gpu_source.c_str(), hint.c_str());
}

}  // namespace df
