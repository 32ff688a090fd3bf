// Block-scaled FP8 target weights, the layout of the official Qwen FP8 releases: an F8_E4M3 `<name>` plus
// `<name>_scale_inv` [ceil(N/bn), ceil(K/bk)] (F32 or BF16), w[n, k] = e4m3(q[n, k]) · scale_inv[n/bn, k/bk].
// Loading dequantises into host f32 one tensor at a time; quantising is for writing test checkpoints.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/safetensors.h"

namespace df {

// The name HF gives a weight's block scales: "...q_proj.weight" -> "...q_proj.weight_scale_inv".
std::string fp8_scale_name(const std::string& weight_name);

// Shape of the block scales of an [N, K] weight: [ceil(N/bn), ceil(K/bk)].
std::vector<int64_t> fp8_scale_shape(int64_t N, int64_t K, int block_n, int block_k);

// The codes of F8_E4M3 tensor q (2-D [N, K], or 3-D [E, N, K]: the fused experts, E matrices each in its own
// blocks; inside the mapped file) and its block scales, into `scale` [(E ·) ceil(N/bn), ceil(K/bk)] row-major
// f32, checked as fp8_dequantize checks them.
const uint8_t* fp8_block_codes(const SafetensorsIndex& st, const StTensor& q, int block_n, int block_k,
                               std::vector<float>& scale);

// Dequantises F8_E4M3 tensor q (2-D [N, K] or 3-D [E, N, K]) with its scales from `st` into out (all its
// values). Errors name the tensor, its file and the fix: a missing, mis-typed or mis-shaped scale, a NaN
// code, a tensor neither 2-D nor 3-D.
void fp8_dequantize(const SafetensorsIndex& st, const StTensor& q, int block_n, int block_k, float* out);

// Quantises w [N, K] per block: scale_inv = amax / 448 (1 for an all-zero block), q = e4m3(w / scale_inv).
// q gets N·K codes, scale_inv ceil(N/bn)·ceil(K/bk) floats (row-major over blocks).
void fp8_quantize(const float* w, int64_t N, int64_t K, int block_n, int block_k, uint8_t* q,
                  float* scale_inv);

// Whether a writer of FP8 checkpoints stores this HF target tensor as block-scaled FP8: the large projections
// of the decoder layers, MoE experts (per expert or fused) and shared expert included, as the official Qwen
// FP8 releases do (their modules_to_not_convert keeps embeddings, lm_head, norms, conv1d, A_log, dt_bias, the
// tiny in_proj_a / in_proj_b, the MoE router mlp.gate and mlp.shared_expert_gate in bf16).
bool fp8_quantized_weight(const std::string& name);

}  // namespace df
