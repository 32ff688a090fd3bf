// The target's mixture-of-experts MLP (Qwen3-MoE, Qwen3.5/3.6-MoE; MODELS.md "Mixture-of-experts MLP"): where its
// weights sit in the model block, how they are read from and written to Hugging Face checkpoints (the fused
// `experts.gate_up_proj` / `experts.down_proj` tensors of the Qwen3.5 releases and the per-expert
// `experts.{e}.gate_proj.weight` ... of the Qwen3 releases), and the layer's forward as two ops (Ops::moe_route,
// Ops::moe_experts) shared by the batched forward and the incremental decoder.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/target.h"

namespace df {

// The layer shape the MoE ops take, from the model's config and FP8 mode (MoeShape::fp8).
MoeShape target_moe_shape(const TargetModel& m);

// Carves one MoE layer's router and experts out of the model's arena: the router and the shared expert's gate
// in act dtype; the expert projections in act dtype, or, where the model holds FP8 codes
// (TargetModel::fp8_codes), as e4m3 codes with their scales (ops.h MoeWeights).
void target_moe_layout(const TargetModel& m, TargetLayer& L, Arena& a, DType act);

// The expert projections of an MoE layer with their scales (empty unless FP8 codes), named for messages.
struct MoeProjection {
  const char* name;
  const Tensor* w;
  const Tensor* s;
};
std::vector<MoeProjection> target_moe_projections(const TargetLayer& L);

// Fills dst with the checkpoint tensor `name` of Hugging Face shape `shape` (the loader's weight source).
using MoeTensorFill = std::function<void(const Tensor& dst, const std::string& name, const std::vector<int64_t>& shape)>;
// Fills rows [r0, r0 + n) of expert projection w (scales s) with the checkpoint tensor `name` of Hugging Face
// shape `shape` (2-D, or the fused [E, rows, cols] of all experts): the loader's projection path, which
// quantises or keeps a checkpoint's FP8 blocks as the model's dtype wants.
using MoeProjFill = std::function<void(const Tensor& w, const Tensor& s, int64_t r0, int64_t n,
                                       const std::string& name, const std::vector<int64_t>& shape)>;
// Fills one MoE layer whose tensors are named under `mp` ("model.layers.3.mlp."): fused_experts reads the experts
// as the two fused tensors, else one gate/up/down triple per expert.
void target_moe_fill(const QwenConfig& c, const TargetLayer& L, const std::string& mp, bool fused_experts,
                     const MoeTensorFill& fill, const MoeProjFill& proj);
// The Hugging Face name of the fused gate/up tensor under `mp`: its presence tells a checkpoint's expert naming.
std::string target_moe_fused_name(const std::string& mp);

// Adds a tensor to a checkpoint being written (name, Hugging Face shape, values in row-major order).
using MoeTensorAdd = std::function<void(const std::string& name, std::vector<int64_t> shape, std::vector<float> v)>;
// Writes one MoE layer in the naming the model type's releases use (per expert for qwen3_moe and qwen3_next,
// fused for qwen3_5_moe); get copies a model tensor to the host.
void target_moe_save(const QwenConfig& c, const TargetLayer& L, const std::string& mp,
                     const std::function<std::vector<float>(const Tensor&)>& get, const MoeTensorAdd& add);

// The routing buffers of a forward over up to T rows: ids i32 [T, top_k], weights f32 [T, top_k] and the
// backend's MoE workspace (Ops::moe_workspace_bytes). Nothing for a dense model.
struct MoeScratch {
  Tensor ids, weights, workspace;
};
void moe_scratch_plan(const TargetModel& m, int64_t T, Arena& a, MoeScratch& s);

// One MoE layer's MLP on the first T rows: h += moe(n) (router, top-k, experts, gated shared expert).
void target_moe(const TargetModel& m, const MoeScratch& s, const TargetLayer& L, const Tensor& n, const Tensor& h,
                int64_t T);

}  // namespace df
