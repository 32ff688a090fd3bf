// Launchers of the mixture-of-experts MLP on the device (ops.h moe_route / moe_experts): routing, grouping
// the (token, expert) pairs by expert, the expert GEMMs as one grouped GEMM (gemm.cuh gemm_batched_launch)
// and the weighted combine fused with the residual add. Nothing is read back to the host: every size a launch
// needs is an upper bound the host computes from T and the layer's shape (moe_workspace.h moe_plan_tiles).
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/moe/moe_workspace.h"

namespace df {

struct GemmContext;

// The alignment in bytes of every address the experts' grouped GEMMs read or write (gemm_batched_launch's
// `align`): the tiles' addresses are buffer bases plus whole tiles or whole experts, so it is the smallest
// power of two dividing the bases xs [R, H], gu [R, 2I], gate_up and down and those strides in bytes.
int moe_gemm_align(const void* xs, const void* gu, const void* gate_up, const void* down, int64_t rows,
                   const MoeDims& d);

// Routing of T tokens: logits = x · routerᵀ in f32 (cuBLASLt), p = softmax(logits) in fp32, the top k of each
// token in torch.topk's order (core/torch_topk.h, ties as the CPU oracle breaks them), renormalised when
// d.renorm. x bf16 [T, H] (row stride ldx), router bf16 [E, H]; ids i32 [T, k], weights f32 [T, k] with row
// strides ld_ids, ld_w. ws: moe_workspace_bytes(T, d) bytes of device scratch, overwritten.
void moe_route_launch(GemmContext* gemm, const __nv_bfloat16* x, int64_t ldx, const __nv_bfloat16* router,
                      int64_t ld_router, int64_t T, const MoeDims& d, int32_t* ids, int64_t ld_ids,
                      float* weights, int64_t ld_w, void* ws, size_t ws_bytes, cudaStream_t stream);

// out += Σ_j weights[t, j] · expert_{ids[t, j]}(x[t]) + sigmoid(x[t] · shared_gate) · shared(x[t]), the
// routed terms summed in fp32 in ascending expert order, then the shared expert, then added to out and
// rounded once. Pairs are grouped by expert with a deterministic counting sort (tokens in order within an
// expert), gathered into tiles, and each expert's gate_up and down GEMMs run as the tiles of two grouped
// GEMMs. ids outside [0, E) are skipped (moe_route_launch writes none). gate_up bf16 [E·2I, H], down bf16
// [E·H, I] (expert e at rows e·2I and e·H, contiguous); shared_gate_up [2·Is, H], shared_down [H, Is],
// shared_gate [1, H] (contiguous), ignored when d.Is is 0. out bf16 [T, H] (row stride ldo). ws as for
// moe_route_launch.
// FP8 experts (d.fp8): gate_up, down, shared_gate_up and shared_down are e4m3 codes (the same rows) and these
// their scales: per output row (d.fp8_group 0) or 128x128 blocks [rows / 128, fp8_block_scale_ld(cols)]
// (128).
struct MoeFp8Scales {
  const float *gate_up = nullptr, *down = nullptr, *shared_gate_up = nullptr, *shared_down = nullptr;
};
void moe_experts_launch(GemmContext* gemm, const __nv_bfloat16* x, int64_t ldx, const int32_t* ids,
                        int64_t ld_ids, const float* weights, int64_t ld_w, const void* gate_up,
                        const void* down, const void* shared_gate_up, const void* shared_down,
                        const __nv_bfloat16* shared_gate, const MoeFp8Scales& scales, __nv_bfloat16* out,
                        int64_t ldo, int64_t T, const MoeDims& d, void* ws, size_t ws_bytes,
                        cudaStream_t stream);

// The FP8 experts' grouped GEMM (d.fp8; moe_fp8_gemm.cu): for tile i < tiles, rows [i·rows, (i+1)·rows) below
// min(m_total, *used) (used nullptr: m_total) of c bf16 [·, N] (row stride ldc) = a · w_eᵀ with e =
// tile_expert[i] (nullptr: 0), a e4m3 codes [m_total, K] contiguous with scales sa (moe_fp8_scales(m_total,
// K, group)), w e4m3 codes [E·N, K] contiguous with scales sw (per row, or 128x128 blocks with row stride
// fp8_block_scale_ld(K)); fp32 accumulation, group 128 scaling each 128-column K group's partial sum. K a
// multiple of 16; rows at most 64 or a multiple of 64. Refuses GPUs before sm_89.
void moe_fp8_gemm_launch(const uint8_t* a, const float* sa, int64_t m_total, const uint8_t* w,
                         const float* sw, int group, const int32_t* tile_expert, const int32_t* used,
                         int rows, int64_t tiles, __nv_bfloat16* c, int64_t ldc, int64_t N, int64_t K,
                         cudaStream_t stream);

}  // namespace df
