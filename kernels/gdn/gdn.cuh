// What the two Gated DeltaNet prefill files share (kernels/gdn/gdn_chunk.cu: the chunk kernel, everything that does
// not depend on the state; kernels/gdn/gdn.cu: the state kernel and the launchers): the prefill's arguments, the
// tile copies and the chunk kernel's entry point. Internal to those two files; gdn.cu describes the scheme.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/gdn/gdn_workspace.h"
#include "kernels/launchers.cuh"

namespace df {

// Causal conv taps of the fused form (every Qwen3.5/3.6 model has 4); other sizes run the separate conv.
constexpr int kGdnConvTaps = 4;

// One prefill's pointers and sizes, passed by value to both kernels. The fused forms' fields are null otherwise.
struct GdnArgs {
  const bf16* qkv;  // [T, q | k | v] rows: after the conv, or (conv fused) before it
  int64_t ld_qkv;
  const float* conv_w;  // conv fused: the conv weights [2·nk·dk + nv·dv, kGdnConvTaps]
  bf16* qk;             // conv fused: the conv'd q | k rows [T, 2·nk·dk], chunk kernel → state kernel
  int64_t ld_qk;
  const bf16 *a, *b;
  int64_t ld_a, ld_b;
  const float *A_log, *dt_bias;
  const bf16* z;  // norm fused: the gated norm's gate [T, nv·dv], its weight [dv] and eps
  int64_t ld_z;
  const float* norm_w;
  float eps;
  bf16* out;
  int64_t ld_out;
  const int32_t* cu;
  int nk, nv, dk, dv;
  bf16 *ws_w, *ws_u, *ws_p;
  float4* ws_s;
};

// ---- kernels ----

template <int NT>
__device__ __forceinline__ void gdn_warp_zero(float (&acc)[NT][4]) {
#pragma unroll
  for (int n = 0; n < NT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
}

// Rows r in [lo, hi) of X [ROWS][ldx] from row r − lo of src (row stride ld), its first n (a multiple of 8)
// bf16 columns; the other rows and the columns [n, D) are zero. Asynchronous (cp.async, 16 bytes each,
// zero-filled where out of range) so every copy of a tile is in flight at once; gdn_stage_wait completes them.
template <int D, int NTHR, int ROWS = kGdnChunk>
__device__ __forceinline__ void gdn_stage(bf16* X, int ldx, const bf16* src, int64_t ld, int lo, int hi, int n) {
  for (int i = threadIdx.x; i < ROWS * (D / 8); i += NTHR) {
    int r = i / (D / 8), d = (i % (D / 8)) * 8;
    bool in = r >= lo && r < hi && d < n;
    uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(X + r * ldx + d));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst),
                 "l"(in ? src + (int64_t)(r - lo) * ld + d : src), "r"(in ? 16 : 0));
  }
}

__device__ __forceinline__ void gdn_stage_wait() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// ---- launchers ----

// The chunk kernel of one prefill (gdn_chunk.cu), a CTA per (sequence, chunk, key head), for the head tile
// width D (gdn_prefill_tile_dim) with or without the conv fused; p's workspace pointers are set. Built for D
// in {32, 64, 128} and both CONV.
template <int D, bool CONV>
void gdn_chunk_run(const GdnArgs& p, int num_seqs, int max_len, cudaStream_t stream);

}  // namespace df
