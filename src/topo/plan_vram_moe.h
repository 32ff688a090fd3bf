// What a mixture-of-experts target adds to the VRAM plan (topo/plan_vram.h): its routed experts, router and
// shared expert as weight lines of their own, the routing buffers of one MoE layer's grouped forward at the
// token budget, and the verdict for a target whose weights alone exceed one GPU, which MoE sizes reach first.
// Split out so the planner's dense arithmetic stays one readable list.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"
#include "model/qwen_config.h"
#include "topo/plan_vram.h"

namespace df {

// The MoE weights of decoder layers 0..layers-1, in parameters (all zero for a dense target).
struct MoeParamCount {
  int layers = 0;      // MoE layers among them
  double experts = 0;  // every routed expert's gate, up and down: layers · E · 3·H·I
  double router = 0;   // layers · E · H
  double shared = 0;   // the shared expert's gate, up and down and its gate row: layers · (3·H·Is + H)
  double total() const { return experts + router + shared; }
};
MoeParamCount plan_vram_moe_params(const QwenConfig& t, int layers);

// The weight lines of those parameters at 2 B each (bf16).
std::vector<VramItem> plan_vram_moe_weights(const QwenConfig& t, const MoeParamCount& n);

// The same with target.dtype = "fp8" (model/target_moe.h target_moe_layout): the routed and shared experts'
// gate, up and down as 1 B e4m3 codes with a 4 B scale per row, or per 128x128 block (blocks: a block
// checkpoint's own, rows padded to fp8_block_scale_ld); the router and the shared expert's gate stay bf16.
std::vector<VramItem> plan_vram_moe_fp8_weights(const QwenConfig& t, const MoeParamCount& n, bool blocks);

// The routing buffers one MoE layer's forward over T tokens holds (reused layer to layer): router
// probabilities, the top-k ids and weights, the per-expert counts and offsets with the row maps of the
// grouping, the grouped expert rows and the shared expert's rows. Routing is dropless: the T·k (token,
// expert) rows are sorted by expert into one buffer, so its size is the same for every routing, the worst
// case (all T tokens choosing the same k experts, one expert then holding T rows) included; no capacity
// factor, no token dropped. The lines follow Ops::moe_route / moe_experts' data flow; a backend with its own
// moe_workspace_bytes is what they give way to.
// fp8: the FP8 experts' input codes and scales instead of the grouped GEMMs' pointer arrays (blocks: a scale
// per 128 columns).
std::vector<VramItem> plan_vram_moe_routing(const QwenConfig& t, int64_t T, bool fp8, bool blocks);

// Why the target cannot run when its weights alone (p.target_weight_bytes) exceed one GPU (p.gpu_bytes): the
// bytes, the GPU, that no budget or split helps since a target rank holds the whole model on one GPU, and
// what would. MoE targets are where this happens first (a Qwen3.5-122B-A10B in bf16).
std::string plan_vram_target_too_big(const Config& cfg, const QwenConfig& t, const VramPlan& p);

}  // namespace df
