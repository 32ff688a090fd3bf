// MoE layers of the target: weights (layout, checkpoint names in both release namings, writing) and the forward.
#include "model/target_moe.h"

#include <algorithm>

namespace df {

MoeShape target_moe_shape(const QwenConfig& c) {
  return MoeShape{c.num_experts,         c.experts_per_tok, c.moe_intermediate,
                  c.shared_intermediate, c.norm_topk_prob,  c.hidden};
}

void target_moe_layout(const QwenConfig& c, TargetLayer& L, Arena& a, DType dt) {
  const int64_t H = c.hidden, E = c.num_experts, I = c.moe_intermediate, Is = c.shared_intermediate;
  L.w_router = a.alloc(dt, E, H);
  L.moe.gate_up = a.alloc(dt, E * 2 * I, H);
  L.moe.down = a.alloc(dt, E * H, I);
  if (Is > 0) {
    L.moe.shared_gate_up = a.alloc(dt, 2 * Is, H);
    L.moe.shared_down = a.alloc(dt, H, Is);
    L.moe.shared_gate = a.alloc(dt, 1, H);
  }
}

std::string target_moe_fused_name(const std::string& mp) { return mp + "experts.gate_up_proj"; }

void target_moe_fill(const QwenConfig& c, const TargetLayer& L, const std::string& mp, bool fused_experts,
                     const MoeTensorFill& fill) {
  const int64_t H = c.hidden, E = c.num_experts, I = c.moe_intermediate, Is = c.shared_intermediate;
  fill(L.w_router, mp + "gate.weight", {E, H});
  if (fused_experts) {  // [E, 2I, H] and [E, H, I] are already our row order
    fill(L.moe.gate_up, target_moe_fused_name(mp), {E, 2 * I, H});
    fill(L.moe.down, mp + "experts.down_proj", {E, H, I});
  } else {
    for (int64_t e = 0; e < E; ++e) {
      const std::string ep = mp + "experts." + std::to_string(e) + ".";
      fill(L.moe.gate_up.rows_view(e * 2 * I, I), ep + "gate_proj.weight", {I, H});
      fill(L.moe.gate_up.rows_view(e * 2 * I + I, I), ep + "up_proj.weight", {I, H});
      fill(L.moe.down.rows_view(e * H, H), ep + "down_proj.weight", {H, I});
    }
  }
  if (Is > 0) {
    const std::string sp = mp + "shared_expert.";
    fill(L.moe.shared_gate_up.rows_view(0, Is), sp + "gate_proj.weight", {Is, H});
    fill(L.moe.shared_gate_up.rows_view(Is, Is), sp + "up_proj.weight", {Is, H});
    fill(L.moe.shared_down, sp + "down_proj.weight", {H, Is});
    fill(L.moe.shared_gate, mp + "shared_expert_gate.weight", {1, H});
  }
}

void target_moe_save(const QwenConfig& c, const TargetLayer& L, const std::string& mp,
                     const std::function<std::vector<float>(const Tensor&)>& get, const MoeTensorAdd& add) {
  const int64_t H = c.hidden, E = c.num_experts, I = c.moe_intermediate, Is = c.shared_intermediate;
  add(mp + "gate.weight", {E, H}, get(L.w_router));
  std::vector<float> gu = get(L.moe.gate_up), down = get(L.moe.down);
  if (c.family == ModelFamily::qwen3_5) {
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
  const MoeShape shape = target_moe_shape(m.cfg);
  s.ids = a.alloc(DType::i32, T, shape.top_k);
  s.weights = a.alloc(DType::f32, T, shape.top_k);
  const int64_t bytes = m.ops->moe_workspace_bytes(T, shape);
  if (bytes > 0) s.workspace = a.alloc(DType::u8, 1, bytes);
}

void target_moe(const TargetModel& m, const MoeScratch& s, const TargetLayer& L, const Tensor& n, const Tensor& h,
                int64_t T) {
  const MoeShape shape = target_moe_shape(m.cfg);
  const Tensor x = n.rows_view(0, T), ids = s.ids.rows_view(0, T), weights = s.weights.rows_view(0, T);
  m.ops->moe_route(x, L.w_router, shape, ids, weights, s.workspace);
  m.ops->moe_experts(x, ids, weights, L.moe, shape, h.rows_view(0, T), s.workspace);
}

}  // namespace df
