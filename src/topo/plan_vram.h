// VRAM planner: bytes each role needs on its GPU (target: frozen bf16 backbone + forward activations at the
// token budget + send buffers; drafter: weights, fp32 master/grads/Adam, frozen embedding and lm_head,
// batch staging, training activations and op scratch), so a config that cannot fit fails in seconds, not
// after a queue wait. Used by `dflash_mpi plan vram` and by training at start-up (plan_vram_check).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/config.h"
#include "model/drafter.h"
#include "model/qwen_config.h"

namespace df {

struct VramItem {
  std::string name;
  double bytes = 0;
  std::string detail;  // the formula with its numbers, so a reader can redo the arithmetic
};

struct VramRole {
  std::string role;  // "target" | "drafter"
  std::vector<VramItem> items;
  double total = 0;
};

struct VramAssumptions {
  int targets = 7;      // targets feeding each drafter: it queues hs_queue_depth payloads per target (host)
  int64_t seq_len = 0;  // typical sequence length; 0: one sequence fills data.token_budget
  int64_t lm_chunk = 1024;  // rows of [chunk, V] fp32 logits alive at once (CudaTrainOps' default)
};

struct VramPlan {
  VramRole target, drafter;
  double gpu_bytes = 0;
  std::string gpu_source;  // "--gpu-mem", "NVML <name>", "default (no GPU seen)"
  int target_layers_run = 0;
  int64_t drafter_params = 0;  // trainable elements (Σ rows·cols of the parameter table)
  int64_t drafter_flat = 0;    // flat buffer length the optimizer allocates (entries 64-aligned)
  int64_t anchors = 0;         // anchor blocks a drafter micro-batch samples (before the block-row cap)
  int64_t max_blocks = 0;      // blocks the drafter workspace is planned for (drafter_limits_from_run)
  double payload_bytes = 0;    // one target->drafter batch at the token budget (what crosses the wire)
  // The target's weights alone; above the GPU no budget or queue depth helps, and target_too_big says why
  // (the bytes, the GPU, what would help). refused: a setting the run refuses for this target (FP8 for an MoE
  // target), which the verdict and plan_vram_check name.
  double target_weight_bytes = 0;
  std::string target_too_big;
  std::string refused;
  VramAssumptions assume;
  std::vector<std::string> notes;
};

// Parameters of target decoder layer `layer` (norms, mixer, MLP; an MoE layer with every expert).
double plan_vram_target_layer_params(const QwenConfig& t, int layer);

// The drafter rank of a CUDA drafter: every device allocation it makes (DrafterModel's flat buffers,
// DrafterMemory's frozen tables and staging, the activation workspace, CudaTrainOps' op scratch, the cuBLASLt
// workspace and GEMM tuning output) from the same formulas the code allocates with, plus the runtime reserve;
// the receive queue is listed at 0 (host memory). tied: the target ties its embedding and lm_head.
// tests/gpu/test_plan_vram_cuda.cpp holds it to the measured allocations.
VramRole plan_vram_drafter(const Config& cfg, const DrafterConfig& dc, bool tied,
                           const VramAssumptions& assume);

// Every component of both roles. gpu_bytes is what the plan is judged against (plan_vram_gpu_bytes).
VramPlan plan_vram_compute(const Config& cfg, const QwenConfig& target, double gpu_bytes,
                           const std::string& gpu_source, const VramAssumptions& assume = {});

// Throws df::Error naming the role(s) that do not fit, by how much, and what to change.
void plan_vram_check(const VramPlan& plan);

// Both tables (component, bytes, GiB), the GPU size and the verdict line.
std::string plan_vram_format(const VramPlan& plan);

// GPU memory to plan against: `gib` > 0 (from --gpu-mem) wins, else GPU 0's total from NVML, else 80 GiB.
// `source` says which.
double plan_vram_gpu_bytes(double gib, std::string& source);

}  // namespace df
