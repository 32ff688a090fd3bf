// The VRAM planner's mixture-of-experts lines; see plan_vram_moe.h. Parameter counts follow
// plan_vram_target_layer_params (one sum, split by part), buffer sizes the grouped forward's data flow.
#include "topo/plan_vram_moe.h"

#include <cmath>

#include "core/fp8.h"
#include "core/strfmt.h"
#include "kernels/moe/moe_workspace.h"

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

std::vector<VramItem> plan_vram_moe_fp8_weights(const QwenConfig& t, const MoeParamCount& n, bool blocks) {
  const double h = t.hidden, I = t.moe_intermediate, Is = t.shared_intermediate, E = t.num_experts;
  // Scales of a [rows, K] projection: a row each, or ceil(rows/128) block rows of fp8_block_scale_ld(K).
  auto scales = [&](double rows, double K) {
    return blocks ? std::ceil(rows / 128) * double(fp8_block_scale_ld(int64_t(K))) : rows;
  };
  const double routed_scales = n.layers * E * (scales(2 * I, h) + scales(h, I));
  const double shared_elems = n.layers * 3.0 * h * Is;
  const double shared_scales = Is > 0 ? n.layers * (scales(2 * Is, h) + scales(h, Is)) : 0;
  const char* what = blocks ? "128x128 block scales" : "row scales";
  std::vector<VramItem> out = {
      {"MoE routed experts FP8 e4m3 + scales", n.experts + kF32 * routed_scales,
       strfmt(
           "1 B x %d MoE layers x %d experts x 3 x %.0f x %d (gate, up, down) = %.4g params + 4 B x %.4g %s",
           n.layers, t.num_experts, h, t.moe_intermediate, n.experts, routed_scales, what)},
      {"MoE router + shared expert gate bf16", kBf16 * (n.router + (Is > 0 ? n.layers * h : 0)),
       strfmt("2 B x %d MoE layers x (router %d x %.0f%s)", n.layers, t.num_experts, h,
              Is > 0 ? strfmt(" + shared expert gate %.0f", h).c_str() : "")}};
  if (Is > 0)
    out.push_back({"MoE shared expert FP8 e4m3 + scales", shared_elems + kF32 * shared_scales,
                   strfmt("1 B x %d MoE layers x 3 x %.0f x %d = %.4g params + 4 B x %.4g %s", n.layers, h,
                          t.shared_intermediate, shared_elems, shared_scales, what)});
  return out;
}

std::vector<VramItem> plan_vram_moe_routing(const QwenConfig& t, int64_t T, bool fp8, bool blocks) {
  // What moe_scratch_plan allocates: the routing and the CUDA launchers' workspace
  // (kernels/moe/moe_workspace.h), whose grouped rows are every token's top-k copies of its input, padded to
  // whole tiles per expert (dropless: the bound holds for every routing, all tokens on the same experts
  // included), with their gate|up (the SwiGLU written over it) and the expert outputs over the inputs, plus
  // the shared expert's.
  const double k = t.experts_per_tok;
  const MoeDims md{
      t.hidden,         t.num_experts, t.experts_per_tok, t.moe_intermediate, t.shared_intermediate,
      t.norm_topk_prob, fp8,           blocks ? 128 : 0};
  const MoeTiles tiles = moe_plan_tiles(T, md);
  const std::string shared =
      t.shared_intermediate > 0
          ? strfmt("; shared expert %lld x 2 B x %d", (long long)T, 2 * t.shared_intermediate + t.hidden)
          : "";
  return {
      {"MoE routing ids + weights [T,k]", (kI32 + kF32) * T * k,
       strfmt("(4 B i32 + 4 B f32) x %lld x %.0f", (long long)T, k)},
      {"MoE expert workspace", double(moe_workspace_bytes(T, md)),
       strfmt(
           "%lld grouped rows (%lld tiles of %d) x 2 B x (input/output %d + gate|up %d)%s%s + sort and "
           "routing",
           (long long)(tiles.tiles * tiles.rows), (long long)tiles.tiles, tiles.rows, t.hidden,
           2 * t.moe_intermediate, shared.c_str(),
           fp8 ? strfmt(" + FP8 codes 1 B x (%d + %d) a row and their scales", t.hidden, t.moe_intermediate)
                     .c_str()
               : "")},
  };
}

std::string plan_vram_target_too_big(const Config& cfg, const QwenConfig& t, const VramPlan& p) {
  const double need = p.target_weight_bytes / kGiB;
  const bool fp8 = cfg.target.dtype == "fp8";
  const double gib = std::ceil(need);
  const std::string hint =
      fp8 ? strfmt("a GPU with more than %.0f GiB", gib)
          : strfmt(
                "target.dtype = \"fp8\" (1 B projections%s; re-run plan vram with it), or a GPU with more "
                "than %.0f GiB",
                t.is_moe() ? " and experts" : "", gib);
  return strfmt(
      "The target's weights alone are %.2f GiB (%.0f B in %s, the %d layers up to the last tap) but one GPU "
      "has %.2f GiB (%s). A target rank holds its whole model on its own GPU, so no data.token_budget, "
      "pipeline.hs_queue_depth or target:drafter split makes this target fit; target ranks spanning several "
      "GPUs (tensor- or expert-parallel groups, docs/multi-gpu-targets.md) are not implemented yet. HINT: %s",
      need, p.target_weight_bytes, fp8 ? "FP8 + bf16" : "bf16", p.target_layers_run, p.gpu_bytes / kGiB,
      p.gpu_source.c_str(), hint.c_str());
}

}  // namespace df
