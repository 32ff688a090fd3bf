// DSpark's Markov head on the device (kernels/train/dspark_markov.cu), the part of dspark_head.cu's loss and
// proposals that turns a row's draft hidden state z and previous token into u, the vector W2 reads
// (ops/dspark_head.h has the math of each head type): internal to those two files.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/train/dspark_head.cuh"

namespace df {

// W1[p][c], or NaN for a token outside [0, V) (the device cannot raise an error without a sync; the CPU
// backend rejects such a token, and the NaN reaches the loss).
__device__ __forceinline__ bf16 w1_at(const bf16* w1, int32_t p, int V, int R, int c) {
  return p >= 0 && p < V ? w1[int64_t(p) * R + c] : __float2bfloat16(__int_as_float(0x7fc00000));
}

// The forward over every row of the training shape (N = nb·B): the input rows (L.cat), the projection
// (L.pre), the gates (L.gate, and for the RNN L.cand, L.uo and each row's incoming state L.sp) and u (L.u,
// bf16 [N, L.ldr]), from y [N, H] and the previous tokens prev [N].
void dspark_markov_fwd(GemmContext* gemm, const DSparkHeadShape& d, const DSparkLayout& L, const bf16* y,
                       int64_t ld_y, const DSparkHeadWeightPtrs& w, const int32_t* prev, void* ws,
                       cudaStream_t stream);

// The backward of the gated and RNN heads from du (L.du, ∂/∂u [N, R]): ∂pre (L.dpre_f, L.dpre_b), the
// projection's weight and bias gradients (dw = beta·dw + ∂, beta 0 or 1), din = ∂pre·(G or J) (L.din,
// [N, L.ldc] f32: the input row's gradient, the RNN's state columns consumed here) and, for the gated head,
// ∂e = du·g into L.de. The vanilla head has none: its ∂e is du.
void dspark_markov_bwd(GemmContext* gemm, const DSparkHeadShape& d, const DSparkLayout& L,
                       const DSparkHeadWeightPtrs& w, const DSparkHeadGradPtrs& dw, float beta, void* ws,
                       cudaStream_t stream);

// One proposal slot (d.nb = 1): u (L.u, bf16 [R]) from the slot's hidden state yk [H] and the previous token
// at prev (on the device). The RNN's state lives in L.s and L.cat's first R columns; first_slot starts it at
// 0.
void dspark_markov_slot(GemmContext* gemm, const DSparkHeadShape& d, const DSparkProposeLayout& L,
                        const bf16* yk, const DSparkHeadWeightPtrs& w, const int32_t* prev, bool first_slot,
                        void* ws, cudaStream_t stream);

// out[c] = beta·out[c] + Σ_r x[r, c] (x [rows, cols], row stride ld; beta 0 or 1) in a fixed order: row chunks
// (column_partial_chunks) summed into part (L.part) and the chunks' sums added in order. The bias gradients.
void dspark_colsum_launch(const float* x, int64_t ld, int64_t rows, int cols, float* out, float beta,
                          float* part, cudaStream_t stream);

}  // namespace df
