// Launchers of every kernel family except the GEMM (gemm.cuh): raw device pointers, sizes, row strides in
// elements and a stream. Each launcher checks its launch and throws df::Error on failure. bf16 activations,
// f32 parameter vectors; the arithmetic inside is fp32 wherever the Hugging Face reference upcasts.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "kernels/gdn/gdn_workspace.h"
#include "kernels/train/train_workspace.h"

namespace df {

using bf16 = __nv_bfloat16;

// ---- primitives/arch_check.cu -------------------------------------------------------------------------
// Throws df::Error naming the GPU when this build has no code that runs on it (compiled for other archs, or
// the GPU is older than the oldest built arch).
void cuda_check_device_supported(int device);

// ---- embedding.cu -------------------------------------------------------------------------------------
// out[t, :] = table[ids[t], :]
void embedding_launch(const int32_t* ids, const bf16* table, int64_t ld_table, bf16* out, int64_t ld_out, int64_t T,
                      int64_t H, cudaStream_t stream);

// ---- fp8_quant.cu --------------------------------------------------------------------------------------
// Each row of x [rows, cols] to e4m3 codes q [rows, cols] on its own scale[r] = amax(|row|)/448 (core/fp8.h
// e4m3_scale: 1 for an all-zero row), x · (1/scale) rounded as core/fp8.h does (RNE, satfinite), so the codes
// equal the CPU oracle's bit for bit. write_back: the row is then replaced by bf16(code · scale), the value
// the FP8 GEMM multiplies, for a bf16 GEMM that must see the same quantised input (the DeltaNet b / a rows).
void fp8_quantize_rows_launch(bf16* x, int64_t ldx, uint8_t* q, int64_t ldq, float* scale, int64_t rows,
                              int64_t cols, bool write_back, cudaStream_t stream);
// The same for the rows of swiglu(gate, up) without storing them: the codes and scales swiglu_launch into a
// bf16 tensor then fp8_quantize_rows_launch of it give, bit for bit (the down projection's FP8 input).
void swiglu_fp8_launch(const bf16* gate, int64_t ld_gate, const bf16* up, int64_t ld_up, uint8_t* q,
                       int64_t ldq, float* scale, int64_t rows, int64_t cols, cudaStream_t stream);

// ---- fp8_group_quant.cu --------------------------------------------------------------------------------
// Each row of x [rows, cols] to e4m3 codes q [rows, cols], every 128 columns (the last run partial) on its own
// scale amax/448 (1 when all zero), rounded as core/fp8.h does: CpuOps::fp8_round_rows(x, 128) bit for bit.
// scale f32, fp8_group_scales_size(rows, groups) of them, element (r, g) at core/fp8.h fp8_group_scale_index:
// cuBLASLt's token-contiguous VEC128 layout for the first rows rounded down to 4, a 4-row tail for the rest.
// write_back: x's values are then replaced by bf16(code · scale), as fp8_quantize_rows_launch does.
void fp8_quantize_groups_launch(bf16* x, int64_t ldx, uint8_t* q, int64_t ldq, float* scale, int64_t rows,
                                int64_t cols, bool write_back, cudaStream_t stream);

// ---- elementwise.cu -----------------------------------------------------------------------------------
// o = o · sigmoid(gate), both [rows, cols]
void sigmoid_gate_launch(bf16* o, int64_t ld_o, const bf16* gate, int64_t ld_gate, int64_t rows, int64_t cols,
                         cudaStream_t stream);
// out = silu(gate) · up
void swiglu_launch(const bf16* gate, int64_t ld_gate, const bf16* up, int64_t ld_up, bf16* out, int64_t ld_out,
                   int64_t rows, int64_t cols, cudaStream_t stream);
// The training ops below (swiglu_bwd, scale_rows, add_gaussian_noise, fill) run 16-byte accesses where the
// view allows (columns and row strides whole 16-byte chunks, addresses 16-byte aligned) and one element per
// thread otherwise, with the same bits.
// Training SwiGLU backward of out = silu(gate)·up: dgate = dout·up·σ(g)·(1 + g·(1 − σ(g))), dup =
// dout·silu(g), fp32 inside, each output rounded to bf16 once.
void swiglu_bwd_launch(const bf16* gate, int64_t ld_gate, const bf16* up, int64_t ld_up, const bf16* dout,
                       int64_t ld_dout, bf16* dgate, int64_t ld_dgate, bf16* dup, int64_t ld_dup,
                       int64_t rows, int64_t cols, cudaStream_t stream);
// x[r, :] = bf16(x[r, :] · s[r]), s f32 [rows].
void scale_rows_launch(bf16* x, int64_t ld_x, const float* s, int64_t rows, int64_t cols,
                       cudaStream_t stream);
// x = bf16(x + std · rng_normal_at(seed, kRngStreamTrainNoise, r·cols + c)): the CPU backend's draws.
void add_gaussian_noise_launch(bf16* x, int64_t ld_x, int64_t rows, int64_t cols, float std, uint64_t seed,
                               cudaStream_t stream);
// dst = value on a bf16 (false) or f32 (true) view.
void fill_launch(void* dst, bool dst_f32, int64_t ld, int64_t rows, int64_t cols, float value,
                 cudaStream_t stream);
// dst[c] = beta·dst[c] + Σ_k partial[k·cols + c] over k = 0 .. chunks − 1 in that order: the second,
// fixed-order pass of the parameter-gradient reductions (rmsnorm_bwd, qk_norm_rope_bwd), so dw never depends
// on float atomics. beta 0 writes without reading dst (a step's first backward); chunks 0 gives beta·dst.
void column_sum_launch(const float* partial, int64_t chunks, int64_t cols, float* dst, float beta,
                       cudaStream_t stream);
// Row chunks of those reductions: column_partial_chunks (train_workspace.h).
// dst = src with dtype conversion; each of src/dst is bf16 (false) or f32 (true).
void cast_launch(const void* src, bool src_f32, int64_t ld_src, void* dst, bool dst_f32, int64_t ld_dst,
                 int64_t rows, int64_t cols, cudaStream_t stream);
// Deterministic uniform values in [lo, hi) from a counter hash of (seed, row, col): fills benchmark and test
// inputs on the device without a host round trip of gigabytes.
void fill_uniform_launch(void* dst, bool dst_f32, int64_t ld, int64_t rows, int64_t cols, float lo, float hi,
                         uint64_t seed, cudaStream_t stream);
// dst[r, c] = mean + std · rng_normal_at(seed, stream_id, r·cols + c): the same counter-based draws as the
// CPU backend (core/rng.h), for random model weights.
void fill_normal_launch(void* dst, bool dst_f32, int64_t ld, int64_t rows, int64_t cols, float mean, float std,
                        uint64_t seed, uint64_t stream_id, cudaStream_t stream);

// ---- rmsnorm.cu, gated_rmsnorm.cu --------------------------------------------------------------------
// out = norm(x) per row. zero_centred: (1 + w)·x̂ in fp32; else w·bf16(x̂) (Qwen3 casts before the weight).
void rmsnorm_launch(const bf16* x, int64_t ld_x, const float* w, bf16* out, int64_t ld_out, int64_t rows,
                    int64_t cols, float eps, bool zero_centred, cudaStream_t stream);
// rmsnorm_launch whose output also goes to an FP8 GEMM: its rows' e4m3 codes q and scales as
// fp8_quantize_rows_launch(out, ..., write_back) would give them, from the registers where the row fits
// there.
void rmsnorm_fp8_launch(const bf16* x, int64_t ld_x, const float* w, bf16* out, int64_t ld_out, uint8_t* q,
                        int64_t ldq, float* scale, bool write_back, int64_t rows, int64_t cols, float eps,
                        bool zero_centred, cudaStream_t stream);
// residual = bf16(residual + delta), then out = norm(residual).
void add_rmsnorm_launch(bf16* residual, int64_t ld_res, const bf16* delta, int64_t ld_delta, const float* w,
                        bf16* out, int64_t ld_out, int64_t rows, int64_t cols, float eps, bool zero_centred,
                        cudaStream_t stream);
// Training forward (fp32 inside, y rounded once): y = w·x·rstd with rstd = rsqrt(mean(x²) + eps) saved as f32
// [rows]; y may be x (each thread reads its elements before writing them).
void rmsnorm_fwd_launch(const bf16* x, int64_t ld_x, const float* w, bf16* y, int64_t ld_y, float* rstd,
                        int64_t rows, int64_t cols, float eps, cudaStream_t stream);
// dx = beta_dx·dx + rstd·(dy·w − x̂·mean(dy·w·x̂)), x̂ = x·rstd; dw = beta_dw·dw + Σ_rows dy·x̂ through per-chunk
// partials in ws (rmsnorm_bwd_workspace_bytes, train_workspace.h) and column_sum_launch (rows 0: dw =
// beta_dw·dw).
void rmsnorm_bwd_launch(const bf16* x, int64_t ld_x, const float* w, const float* rstd, const bf16* dy,
                        int64_t ld_dy, bf16* dx, int64_t ld_dx, float* dw, float beta_dx, float beta_dw,
                        int64_t rows, int64_t cols, void* ws, size_t ws_bytes, cudaStream_t stream);
// Per (value head, token) over dv: out = bf16(w·bf16(ô)) · silu(z) in fp32, not zero-centred.
void gated_rmsnorm_launch(const bf16* o, int64_t ld_o, const bf16* z, int64_t ld_z, const float* w, bf16* out,
                          int64_t ld_out, int64_t T, int heads, int dv, float eps, cudaStream_t stream);

// ---- rope.cu ------------------------------------------------------------------------------------------
// In place on x [T, heads·hd]: per-head RMSNorm (weight w [hd]) then rotate-half RoPE on dims [0, rot_dim).
void qk_norm_rope_launch(bf16* x, int64_t ld_x, const float* w, const int32_t* pos, int64_t T, int heads, int hd,
                         int rot_dim, float theta, float eps, bool zero_centred, cudaStream_t stream);

// Training forward (train_ops.h qk_norm_rope_fwd): y = rope(w·x·rstd) over all hd dims, fp32 inside with the
// fp32 angles of the inference kernel unrounded, y rounded once; rstd f32 [T, heads] (row stride ld_rstd).
void qk_norm_rope_fwd_launch(const bf16* x, int64_t ld_x, const float* w, const int32_t* pos, bf16* y,
                             int64_t ld_y, float* rstd, int64_t ld_rstd, int64_t T, int heads, int hd,
                             float theta, float eps, cudaStream_t stream);
// Its backward: dx overwritten, dw [hd] = beta_dw·dw + ∂/∂w through per-chunk partials in ws
// (qk_norm_rope_bwd_workspace_bytes, train_workspace.h) and column_sum_launch (T 0: dw = beta_dw·dw).
void qk_norm_rope_bwd_launch(const bf16* x, int64_t ld_x, const float* w, const int32_t* pos,
                             const float* rstd, int64_t ld_rstd, const bf16* dy, int64_t ld_dy, bf16* dx,
                             int64_t ld_dx, float* dw, float beta_dw, int64_t T, int heads, int hd,
                             float theta, void* ws, size_t ws_bytes, cudaStream_t stream);

// ---- adamw.cu -----------------------------------------------------------------------------------------
// One AdamW step over flat f32 buffers of n elements, the CPU backend's arithmetic operation for operation
// (fp32 moments, the update in double; bc1/bc2 = 1 − β^t from the host), so results are bit-identical to
// it; decoupled decay on [0, n_decay). p_lp: nullptr or a bf16 [n] shadow receiving bf16(p) in the same pass.
struct AdamWArgs {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
  double bc1, bc2;
  int64_t n_decay;
};
void adamw_launch(float* p, const float* g, float* m, float* v, bf16* p_lp, int64_t n, const AdamWArgs& a,
                  cudaStream_t stream);
// Σ x² over n floats in double in a fixed order (fixed grid: the same bits on every GPU), into *result
// (device memory); ws of sum_squares_workspace_bytes(n) bytes (train_workspace.h).
void sum_squares_launch(const float* x, int64_t n, double* result, void* ws, size_t ws_bytes,
                        cudaStream_t stream);

// ---- attention.cu -------------------------------------------------------------------------------------
// Causal GQA attention inside each packed sequence (cu [num_seqs + 1] offsets on the device, tokens = cu[num_seqs]).
// hd must be a multiple of 8 and ≤ 256; row strides multiples of 8. gate [tokens, hq·hd] (row stride ld_gate) or
// nullptr: out = bf16(bf16(attention) · bf16(sigmoid(gate))), bit-identical to sigmoid_gate_launch after the
// ungated call; fused into the epilogue when the gate rows can be read as bf16 pairs (4-byte aligned, even
// ld_gate), else run as that separate pass.
void attention_causal_launch(const bf16* q, int64_t ld_q, const bf16* k, int64_t ld_k, const bf16* v, int64_t ld_v,
                             bf16* out, int64_t ld_out, const bf16* gate, int64_t ld_gate, const int32_t* cu,
                             int num_seqs, int64_t tokens, int max_len, int hq, int hkv, int hd, float scale,
                             cudaStream_t stream);
// Whether attention_causal_launch can run on cuDNN's fused attention on the current device (this build found
// cuDNN 9, the loaded library is 9.6 or newer, a handle opens); else false with the reason in *why (may be
// nullptr). Where it can, and for head dims that are multiples of 64 with 16-byte aligned output rows, the
// first call of each shape class (heads, head dim, powers of two of the longest sequence and of the tokens)
// times this project's kernel and cuDNN's on the call's operands and keeps the faster for the process
// (kernels/dispatch/measured.h; the decision is logged once); calls on a stream being captured into a CUDA
// graph run this project's kernel; the registry's attention=native or attention=cudnn forces one side.
bool attention_cudnn_available(std::string* why);

// ---- decode.cu ----------------------------------------------------------------------------------------
// Incremental decoding of one sequence (ops.h attention_cached / gdn_decode). Head dims up to this work.
constexpr int kDecodeMaxHeadDim = 512;
// T new queries q [T, hq·hd] over the cache k, v [past + T, hkv·hd] (rows [past, past + T) are the new
// tokens'); query t sees cache rows [0, past + t]. fp32 scores and softmax, out = bf16(attention), then with a
// gate (nullptr: none) bf16(out · bf16(sigmoid(gate))) as attention_causal_launch. hd 128 / 256 with 16-byte
// aligned q, k, v rows run split-KV on tensor cores, whose per-chunk partials need `workspace` (device memory,
// overwritten; calls sharing it must be ordered on one stream) of at least attention_cached_workspace_bytes(T,
// hq, hkv, hd) (about 13 MB for the 27B's 16-token step; it grows with T); other shapes need none and run the
// general kernel.
size_t attention_cached_workspace_bytes(int64_t T, int hq, int hkv, int hd);
void attention_cached_launch(const bf16* q, int64_t ld_q, const bf16* k, int64_t ld_k, const bf16* v, int64_t ld_v,
                             bf16* out, int64_t ld_out, const bf16* gate, int64_t ld_gate, int64_t T, int64_t past,
                             int hq, int hkv, int hd, float scale, void* workspace, size_t workspace_bytes,
                             cudaStream_t stream);
// attention_causal_launch's general kernel (any head dim up to kDecodeMaxHeadDim, any strides): the decode
// kernel with each query seeing its own packed sequence's rows up to itself. Called by attention_causal_launch
// for shapes its tiled kernels are not built for; O(len²) key reads per head, so meant for small models.
void attention_causal_general_launch(const bf16* q, int64_t ld_q, const bf16* k, int64_t ld_k, const bf16* v,
                                     int64_t ld_v, bf16* out, int64_t ld_out, const bf16* gate, int64_t ld_gate,
                                     const int32_t* cu, int num_seqs, int64_t tokens, int hq, int hkv, int hd,
                                     float scale, cudaStream_t stream);
// gdn_prefill_launch's general path: the token recurrence of each packed sequence from a zero state (any head
// dims, dk up to kDecodeMaxHeadDim, any strides, no workspace).
void gdn_prefill_recurrent_launch(const bf16* qkv, int64_t ld_qkv, const bf16* a, int64_t ld_a, const bf16* b,
                                  int64_t ld_b, const float* A_log, const float* dt_bias, bf16* out, int64_t ld_out,
                                  const int32_t* cu, int num_seqs, int64_t T, int nk, int nv, int dk, int dv,
                                  cudaStream_t stream);
// The Gated DeltaNet recurrence over T tokens from `state` f32 [nv·dk·dv] (read only), gating and l2norm as
// gdn_prefill_launch; the state after token T − saved + r goes to row r of `states` (row stride ld_states).
void gdn_decode_launch(const bf16* qkv, int64_t ld_qkv, const bf16* a, int64_t ld_a, const bf16* b, int64_t ld_b,
                       const float* A_log, const float* dt_bias, bf16* out, int64_t ld_out, const float* state,
                       float* states, int64_t ld_states, int64_t saved, int64_t T, int nk, int nv, int dk, int dv,
                       cudaStream_t stream);

// ---- attention_sm90.cu --------------------------------------------------------------------------------
// The same attention on Hopper wgmma for hd 128 and 256. Returns false, doing nothing, where
// attention_kernel_choose (kernels/dispatch/dispatch.h) picks the portable kernel: no wgmma or TMA on the
// device, a shape or alignment that does not fit, scale <= 0, or the registry's attention=portable;
// attention_causal_launch calls it first. gate: nullptr or a bf16-pair-readable gate view (4-byte aligned,
// even ld_gate) applied in the epilogue.
bool attention_causal_sm90_launch(const bf16* q, int64_t ld_q, const bf16* k, int64_t ld_k, const bf16* v,
                                  int64_t ld_v, bf16* out, int64_t ld_out, const bf16* gate, int64_t ld_gate,
                                  const int32_t* cu, int num_seqs, int64_t tokens, int max_len, int hq, int hkv,
                                  int hd, float scale, cudaStream_t stream);

// ---- conv1d.cu ----------------------------------------------------------------------------------------
// out[t, c] = silu(Σ_j w[c, j] · x[t − K + 1 + j, c]) with zeros before each sequence start (pos = position
// of each token inside its sequence).
void conv1d_silu_launch(const bf16* x, int64_t ld_x, const float* w, int K, bf16* out, int64_t ld_out,
                        const int32_t* pos, int64_t T, int64_t C, cudaStream_t stream);

// ---- gdn.cu -------------------------------------------------------------------------------------------
// Gated DeltaNet chunked prefill, zero state at each sequence start. qkv [T, 2·nk·dk + nv·dv], a/b [T, nv],
// A_log/dt_bias [nv], out [T, nv·dv]; max_len = longest sequence. dk, dv ≤ 128. ws: caller-owned device
// scratch, 16-byte aligned, of at least gdn_prefill_workspace_bytes(T, nv, dk, dv) bytes (gdn_workspace.h),
// planned once for the largest batch so nothing is allocated per call; overwritten by the call.
void gdn_prefill_launch(const bf16* qkv, int64_t ld_qkv, const bf16* a, int64_t ld_a, const bf16* b,
                        int64_t ld_b, const float* A_log, const float* dt_bias, bf16* out, int64_t ld_out,
                        const int32_t* cu, int num_seqs, int64_t T, int max_len, int nk, int nv, int dk,
                        int dv, void* ws, size_t ws_bytes, cudaStream_t stream);
// The whole Gated DeltaNet mixer of a prefill from the fused projection's column views: x [T, 2·nk·dk + nv·dv]
// before the causal conv (conv_w [x cols, conv_k]), z [T, nv·dv] the norm's gate, a/b as above; out [T, nv·dv] =
// gated_rmsnorm(gdn_prefill(conv1d_silu(x)), z). Fused (the conv in the chunk kernel, the norm in the state
// kernel's epilogue) where conv_k is 4 and the layout allows; then only conv's last 2·nk·dk columns are
// written (the conv'd q | k rows), so out may be conv's first nv·dv columns. Otherwise the three separate
// launchers run with conv [T, x cols] and o [T, nv·dv] as their intermediates (out may again be conv's first
// columns, not o). ws as for gdn_prefill_launch.
void gdn_mixer_launch(const bf16* x, int64_t ld_x, const float* conv_w, int conv_k, const bf16* z, int64_t ld_z,
                      const bf16* a, int64_t ld_a, const bf16* b, int64_t ld_b, const float* A_log,
                      const float* dt_bias, const float* norm_w, float eps, bf16* out, int64_t ld_out,
                      const int32_t* cu, const int32_t* pos, int num_seqs, int64_t T, int max_len, int nk, int nv,
                      int dk, int dv, bf16* conv, int64_t ld_conv, bf16* o, int64_t ld_o, void* ws, size_t ws_bytes,
                      cudaStream_t stream);

}  // namespace df
