// The one cuBLASLt entry point of the program: c = a · wᵀ + beta · c for row-major bf16 a [M, K] and
// w [N, K] (Linear weights), fp32 accumulation, bf16 or f32 c. Holds the handle, one workspace, a scratch
// output for timing beta != 0 shapes and a cache of the fastest of the heuristic's candidates per shape (timed
// on the shape's first call, which therefore synchronises the stream once): the per-call cost is a map lookup.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

namespace df {

struct GemmContext;

GemmContext* gemm_init();
void gemm_free(GemmContext* ctx);

// lda/ldw/ldc are row strides in elements; c_f32 selects an f32 output instead of bf16.
void gemm_launch(GemmContext* ctx, const void* a, int64_t lda, const void* w, int64_t ldw, void* c, int64_t ldc,
                 bool c_f32, int64_t M, int64_t N, int64_t K, float beta, cudaStream_t stream);

}  // namespace df
