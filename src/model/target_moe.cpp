// MoE layers of the target: weights (layout, checkpoint names in both release namings, writing) and the forward.
#include "model/target_moe.h"

#include <algorithm>

namespace df {

MoeShape target_moe_shape(const TargetModel& m) {
  const QwenConfig& c = m.cfg;
  return MoeShape{
      c.num_experts, c.experts_per_tok, c.moe_intermediate, c.shared_intermediate, c.norm_topk_prob, c.hidden,
      m.fp8,         int(m.fp8_group)};
}

void target_moe_layout(const TargetModel& m, TargetLayer& L, Arena& a, DType act) {
  const QwenConfig& c = m.cfg;
  const int64_t H = c.hidden, E = c.num_experts, I = c.moe_intermediate, Is = c.shared_intermediate;
  const DType pdt = m.fp8_codes ? DType::f8_e4m3 : act;
  // Per-row scales, or a 128x128 block checkpoint's (whole blocks per expert: fp8_check_blocks).
  auto scales = [&](const Tensor& w) {
    if (!m.fp8_codes) return Tensor();
    if (m.fp8_group > 0) return a.alloc(DType::f32, (w.rows + 127) / 128, fp8_block_scale_ld(w.cols));
    return a.alloc(DType::f32, 1, w.rows);
  };
  L.w_router = a.alloc(act, E, H);
  L.moe.gate_up = a.alloc(pdt, E * 2 * I, H);
  L.moe.down = a.alloc(pdt, E * H, I);
  L.moe.s_gate_up = scales(L.moe.gate_up);
  L.moe.s_down = scales(L.moe.down);
  if (Is > 0) {
    L.moe.shared_gate_up = a.alloc(pdt, 2 * Is, H);
    L.moe.shared_down = a.alloc(pdt, H, Is);
    L.moe.shared_gate = a.alloc(act, 1, H);
    L.moe.s_shared_gate_up = scales(L.moe.shared_gate_up);
    L.moe.s_shared_down = scales(L.moe.shared_down);
  }
}

std::vector<MoeProjection> target_moe_projections(const TargetLayer& L) {
  std::vector<MoeProjection> p = {{"mlp.experts gate|up_proj", &L.moe.gate_up, &L.moe.s_gate_up},
                                  {"mlp.experts down_proj", &L.moe.down, &L.moe.s_down}};
  if (!L.moe.shared_gate_up.empty()) {
    p.push_back({"mlp.shared_expert gate|up_proj", &L.moe.shared_gate_up, &L.moe.s_shared_gate_up});
    p.push_back({"mlp.shared_expert down_proj", &L.moe.shared_down, &L.moe.s_shared_down});
  }
  return p;
}

std::string target_moe_fused_name(const std::string& mp) { return mp + "experts.gate_up_proj"; }

void target_moe_fill(const QwenConfig& c, const TargetLayer& L, const std::string& mp, bool fused_experts,
                     const MoeTensorFill& fill, const MoeProjFill& proj) {
  const int64_t H = c.hidden, E = c.num_experts, I = c.moe_intermediate, Is = c.shared_intermediate;
  const MoeWeights& w = L.moe;
  fill(L.w_router, mp + "gate.weight", {E, H});
  if (fused_experts) {  // [E, 2I, H] and [E, H, I] are already our row order
    proj(w.gate_up, w.s_gate_up, 0, E * 2 * I, target_moe_fused_name(mp), {E, 2 * I, H});
    proj(w.down, w.s_down, 0, E * H, mp + "experts.down_proj", {E, H, I});
  } else {
    for (int64_t e = 0; e < E; ++e) {
      const std::string ep = mp + "experts." + std::to_string(e) + ".";
      proj(w.gate_up, w.s_gate_up, e * 2 * I, I, ep + "gate_proj.weight", {I, H});
      proj(w.gate_up, w.s_gate_up, e * 2 * I + I, I, ep + "up_proj.weight", {I, H});
      proj(w.down, w.s_down, e * H, H, ep + "down_proj.weight", {H, I});
    }
  }
  if (Is > 0) {
    const std::string sp = mp + "shared_expert.";
    proj(w.shared_gate_up, w.s_shared_gate_up, 0, Is, sp + "gate_proj.weight", {Is, H});
    proj(w.shared_gate_up, w.s_shared_gate_up, Is, Is, sp + "up_proj.weight", {Is, H});
    proj(w.shared_down, w.s_shared_down, 0, H, sp + "down_proj.weight", {H, Is});
    fill(w.shared_gate, mp + "shared_expert_gate.weight", {1, H});
  }
}

void target_moe_save(const QwenConfig& c, const TargetLayer& L, const std::string& mp,
                     const std::function<std::vector<float>(const Tensor&)>& get, const MoeTensorAdd& add) {
  const int64_t H = c.hidden, E = c.num_experts, I = c.moe_intermediate, Is = c.shared_intermediate;
  add(mp + "gate.weight", {E, H}, get(L.w_router));
  std::vector<float> gu = get(L.moe.gate_up), down = get(L.moe.down);
  if (c.family == ModelFamily::qwen3_5 && !c.per_key_head_gdn_proj()) {  // Qwen3-Next releases: per expert
    add(target_moe_fused_name(mp), {E, 2 * I, H}, std::move(gu));
    add(mp + "experts.down_proj", {E, H, I}, std::move(down));
  } else {
    auto rows = [](const std::vector<float>& v, int64_t r0, int64_t n, int64_t cols) {
      return std::vector<float>(v.begin() + r0 * cols, v.begin() + (r0 + n) * cols);
    };
    for (int64_t e = 0; e < E; ++e) {
      const std::string ep = mp + "experts." + std::to_string(e) + ".";
      add(ep + "gate_proj.weight", {I, H}, rows(gu, e * 2 * I, I, H));
      add(ep + "up_proj.weight", {I, H}, rows(gu, e * 2 * I + I, I, H));
      add(ep + "down_proj.weight", {H, I}, rows(down, e * H, H, I));
    }
  }
  if (Is > 0) {
    const std::vector<float> sgu = get(L.moe.shared_gate_up);
    const std::string sp = mp + "shared_expert.";
    add(sp + "gate_proj.weight", {Is, H}, std::vector<float>(sgu.begin(), sgu.begin() + Is * H));
    add(sp + "up_proj.weight", {Is, H}, std::vector<float>(sgu.begin() + Is * H, sgu.end()));
    add(sp + "down_proj.weight", {H, Is}, get(L.moe.shared_down));
    add(mp + "shared_expert_gate.weight", {1, H}, get(L.moe.shared_gate));
  }
}

void moe_scratch_plan(const TargetModel& m, int64_t T, Arena& a, MoeScratch& s) {
  if (!m.cfg.is_moe()) return;
  const MoeShape shape = target_moe_shape(m);
  s.ids = a.alloc(DType::i32, T, shape.top_k);
  s.weights = a.alloc(DType::f32, T, shape.top_k);
  const int64_t bytes = m.ops->moe_workspace_bytes(T, shape);
  if (bytes > 0) s.workspace = a.alloc(DType::u8, 1, bytes);
}

void target_moe(const TargetModel& m, const MoeScratch& s, const TargetLayer& L, const Tensor& n, const Tensor& h,
                int64_t T) {
  const MoeShape shape = target_moe_shape(m);
  const Tensor x = n.rows_view(0, T), ids = s.ids.rows_view(0, T), weights = s.weights.rows_view(0, T);
  m.ops->moe_route(x, L.w_router, shape, ids, weights, s.workspace);
  m.ops->moe_experts(x, ids, weights, L.moe, shape, h.rows_view(0, T), s.workspace);
}

}  // namespace df
