// The one cuBLASLt entry point of the program: c = a · wᵀ + beta · c for row-major bf16 a [M, K] and
// w [N, K] (Linear weights), fp32 accumulation, bf16 or f32 c, and its FP8 (e4m3, row-scaled) form. Holds
// the handle, one workspace, a scratch output for timing beta != 0 shapes, a plan per exact shape and the
// fastest of the heuristic's candidates per M bucket (timed on the bucket's first call, which therefore
// synchronises the stream once; later M of the bucket reuse it after cublasLtMatmulAlgoCheck): the per-call
// cost is a map lookup.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace df {

struct GemmContext;

GemmContext* gemm_init();
void gemm_free(GemmContext* ctx);

// The general form, for training: c [M, N] = alpha · op(a) · op(b) + beta · c, row-major bf16 a and b,
// op(a) [M, K] (a stored [K, M] when trans_a), op(b) [K, N] (b stored [N, K] when trans_b). Covers
// y = x·Wᵀ (false, true), dX = dY·W (false, false) and dW = beta·dW + dYᵀ·X (true, false, f32 c). beta 0
// never reads c; K = 0 gives c = beta·c (zeros for beta 0) without cuBLASLt.
void gemm_launch_ex(GemmContext* ctx, const void* a, int64_t lda, bool trans_a, const void* b, int64_t ldb,
                    bool trans_b, void* c, int64_t ldc, bool c_f32, int64_t M, int64_t N, int64_t K, float alpha,
                    float beta, cudaStream_t stream);

// gemm_launch_ex with the addend read from c_in: c = alpha · op(a) · op(b) + beta · c_in, c_in [M, N] of c's
// dtype with row stride ld_c_in, c itself or not overlapping it. cuBLASLt reads c_in as its C and writes c as
// its D, so a residual add needs no copy of the stream into c first (a c_in of another row stride than c's is
// copied into c, then added in place). Tuning never touches c_in: with beta != 0 it times into the scratch.
void gemm_launch_addend(GemmContext* ctx, const void* a, int64_t lda, bool trans_a, const void* b,
                        int64_t ldb, bool trans_b, const void* c_in, int64_t ld_c_in, void* c, int64_t ldc,
                        bool c_f32, int64_t M, int64_t N, int64_t K, float alpha, float beta,
                        cudaStream_t stream);

// c = a · wᵀ + beta · c (the forward's Linear): gemm_launch_ex(a, false, w, true, alpha 1).
// lda/ldw/ldc are row strides in elements; c_f32 selects an f32 output instead of bf16.
void gemm_launch(GemmContext* ctx, const void* a, int64_t lda, const void* w, int64_t ldw, void* c, int64_t ldc,
                 bool c_f32, int64_t M, int64_t N, int64_t K, float beta, cudaStream_t stream);

// Largest power of two (≤ 256) dividing v, an address or a byte stride: cuBLASLt picks vectorised kernels
// from the alignment of its operands (gemm_batched_launch's `align` is built from it).
int gemm_align_of(uint64_t v);

// A grouped GEMM of equal-size groups, for the MoE experts: c_i [M, N] = a_i [M, K] · w_iᵀ for i < batch,
// bf16 operands and output, fp32 accumulation, where a_i, w_i and c_i are read from the device arrays a, w
// and c (cuBLASLt's pointer-array batch), so a kernel on the stream can choose them without the host reading
// anything back. Every address in them is `align` bytes aligned (a power of two; the caller knows it from how
// it built them). Row strides are shared by all groups. Planned and tuned as gemm_launch is, the batch count
// bucketed like M.
void gemm_batched_launch(GemmContext* ctx, const void* const* a, int64_t lda, const void* const* w,
                         int64_t ldw, void* const* c, int64_t ldc, int64_t M, int64_t N, int64_t K,
                         int64_t batch, int align, cudaStream_t stream);

// The FP8 linear layer: c [M, N] (bf16) = (scale_x ⊙ x) · (scale_w ⊙ w)ᵀ + beta · c, x e4m3 codes [M, K] with
// one f32 scale per row (token), w e4m3 codes [N, K] with one per row (output channel), fp32 accumulation of
// the exact code products and both scales applied to the accumulator (cuBLASLt outer-vector scaling, sm_90,
// cuBLAS >= 12.9). K, ldx, ldw must be multiples of 16 and x, w 16-byte aligned. beta 0, or 1 for the
// residual add, which rounds the product to bf16 before adding c, as the HF peer's bf16 Linear + add does.
void gemm_fp8_launch(GemmContext* ctx, const uint8_t* x, int64_t ldx, const float* scale_x, const uint8_t* w,
                     int64_t ldw, const float* scale_w, void* c, int64_t ldc, int64_t M, int64_t N, int64_t K,
                     float beta, cudaStream_t stream);

// The block-scaled FP8 linear layer of a 128x128 block checkpoint: as gemm_fp8_launch, but x's scales are one
// per token per 128 columns, scale_x f32 laid out as core/fp8.h fp8_group_scale_index says
// (fp8_quantize_groups_launch writes them so), and w's one per 128x128 block, scale_w f32 [ceil(N/128),
// fp8_block_scale_ld(K) of ops/ops.h] row-major (the checkpoint's weight_scale_inv, rows padded):
// cuBLASLt's VEC128_32F x BLK128x128_32F modes (sm_90, cuBLAS >= 12.9), fp32 accumulation. The last M % 4 rows
// run as a 4-row GEMM of a zero-padded copy in the scratch (cuBLASLt refuses other row counts); beta 0 or 1.
void gemm_fp8_block_launch(GemmContext* ctx, const uint8_t* x, int64_t ldx, const float* scale_x,
                           const uint8_t* w, int64_t ldw, const float* scale_w, void* c, int64_t ldc,
                           int64_t M, int64_t N, int64_t K, float beta, cudaStream_t stream);
// The M (token count) whose tuned algorithm serves `m`: m rounded up to a multiple of a quarter of its power
// of two, at least 64. Every M in (bucket − step, bucket] shares one timing.
int64_t gemm_m_bucket(int64_t m);

// What the cache has done since gemm_init: every new exact shape counts once in tuned, reused, rejected or
// untimed (a call that finds its plan counts nowhere), so the counts show whether anything grows per call.
struct GemmStats {
  int64_t plans = 0;     // exact shapes cached now
  int64_t buckets = 0;   // tuned algorithms kept, one per (N, K, strides, dtype, alignment, M bucket)
  int64_t tuned = 0;     // shapes whose candidates were timed: the first of their bucket
  int64_t reused = 0;    // shapes that took their bucket's algorithm (cublasLtMatmulAlgoCheck accepted it)
  int64_t rejected = 0;  // shapes whose bucket's algorithm the check refused: heuristic's first pick
  int64_t untimed = 0;   // heuristic's first pick with no bucket entry yet and no timing possible or wanted
};
GemmStats gemm_stats(const GemmContext* ctx);

}  // namespace df
