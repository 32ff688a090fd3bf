// Launchers of DSpark's head on the device (kernels/train/dspark_head.cu): train_ops.h dspark_head_loss and
// dspark_head_propose. Same conventions as train_launchers.cuh (raw device pointers, row strides in elements,
// a stream, launch checked, df::Error on failure); kept in their own header so that the other training
// kernels do not depend on them.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/train/dspark_workspace.h"

namespace df {

using bf16 = __nv_bfloat16;
struct GemmContext;

// train_ops.h dspark_head_loss and dspark_head_propose on the device (ops/dspark_head.h is the math, the CPU
// oracle ops/cpu/cpu_dspark.cpp). Matrices bf16 and contiguous (markov_w1, markov_w2 [V, R], gate_w [R, H+R],
// joint_w [3R, 2R+H], conf_w [1, C]), bias vectors f32 (gate_b [R], joint_b [3R], conf_b [1]); a part the
// head lacks is null. Gradients f32 and contiguous.
struct DSparkHeadWeightPtrs {
  const bf16 *markov_w1 = nullptr, *markov_w2 = nullptr, *gate_w = nullptr, *joint_w = nullptr,
             *conf_w = nullptr;
  const float *gate_b = nullptr, *joint_b = nullptr, *conf_b = nullptr;
};
struct DSparkHeadGradPtrs {
  float *markov_w1 = nullptr, *markov_w2 = nullptr, *gate_w = nullptr, *gate_b = nullptr, *joint_w = nullptr,
        *joint_b = nullptr, *conf_w = nullptr, *conf_b = nullptr;
};
// The weights of Σ w·CE, Σ w·L1 and Σ w·BCE (train.dspark_*_alpha).
struct DSparkLossWeights {
  float ce = 0, l1 = 0, confidence = 0;
};
// y [nb·B, H] bf16 (row stride ld_y), lm_head [V, H] bf16 (contiguous), target [target_count, H] bf16 (row
// stride ld_target) with target_rows i32 [nb·B] on the host, row r's target row in it (both null unless the
// L1 term or the confidence loss is on; a row outside target is an error); labels, prev i32 and row_w f32
// [nb·B] (ops/dspark_head.h dspark_block_rows). Writes argmax i32 [nb·B] (−1 where row_w is 0) and adds the
// step statistics to stats (LossStatsSlots f64) the way loss_row_stats does with given weights, slot k
// counted at block offset k + 1. With backward: dy bf16 [nb·B, H] (row stride ld_dy) overwritten; dw = ∂/∂w
// for beta_dw 0, dw + ∂/∂w otherwise (as the CPU backend). Logits exist for half of chunk_rows rows at a
// time. ws: dspark_head_workspace_bytes(...) bytes, 256-byte aligned.
void dspark_head_loss_launch(GemmContext* gemm, const DSparkHeadShape& d, const bf16* y, int64_t ld_y,
                             const bf16* lm_head, const bf16* target, int64_t ld_target, int64_t target_count,
                             const int32_t* target_rows, const DSparkHeadWeightPtrs& w, const int32_t* labels,
                             const int32_t* prev, const float* row_w, const DSparkLossWeights& alpha,
                             bool backward, float beta_dw, int32_t* argmax, bf16* dy, int64_t ld_dy,
                             const DSparkHeadGradPtrs& dw, double* stats, int64_t chunk_rows, void* ws,
                             size_t ws_bytes, cudaStream_t stream);
// One block's greedy proposals (ops/dspark_head.h dspark_block_propose): y [B, H] bf16 (row stride ld_y),
// lm_head [V, H] bf16; tokens i32 [B] in ws get `first` and the B − 1 proposals; returns where (the stream is
// not synchronised), and sets *confidence (when given) to the B − 1 confidence logits f32 in ws, or null
// without a confidence head. ws: dspark_propose_layout(d).bytes.
const int32_t* dspark_head_propose_launch(GemmContext* gemm, const DSparkHeadShape& d, const bf16* y,
                                          int64_t ld_y, const bf16* lm_head, const DSparkHeadWeightPtrs& w,
                                          int32_t first, float** confidence, void* ws, size_t ws_bytes,
                                          cudaStream_t stream);

}  // namespace df
