// The fast decoding kernels as decode.cu's launchers call them (internal to decode.cu, decode_fast.cu and
// decode_gdn.cu): split-KV attention over a cache on tensor cores for hd 128 / 256 (decode_fast.cu), and the
// DeltaNet decode by state slices (decode_gdn.cu); then the device helper every DeltaNet decode kernel reads
// its q / k rows with.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/decode/decode_plan.h"
#include "kernels/launchers.cuh"

namespace df {

// attention_cached_launch's fast path for a step decode_attention_choose sent to the split-KV kernels (plan
// p): 16-byte aligned q, k, v rows, workspace of attention_split_workspace_bytes_for on the current device.
void attention_split_run(const SplitPlan& p, const bf16* q, int64_t ld_q, const bf16* k, int64_t ld_k,
                         const bf16* v, int64_t ld_v, bf16* out, int64_t ld_out, const bf16* gate,
                         int64_t ld_gate, int64_t T, int64_t past, int hq, int hkv, int hd, float scale,
                         void* workspace, cudaStream_t stream);
// gdn_decode_launch's kernel (quad or slice32, gdn_decode_choose) once its arguments are checked (1 <= saved
// <= T, 0 < dk <= kDecodeMaxHeadDim).
void gdn_decode_slice_run(GdnDecodeKernel kernel, const bf16* qkv, int64_t ld_qkv, const bf16* a,
                          int64_t ld_a, const bf16* b, int64_t ld_b, const float* A_log, const float* dt_bias,
                          bf16* out, int64_t ld_out, const float* state, float* states, int64_t ld_states,
                          int64_t saved, int64_t T, int nk, int nv, int dk, int dv, cudaStream_t stream);

// Element e of one token's q and k head rows for key head kh, 0 from dk up: where a qkv row keeps them (the
// nk q heads, then the nk k heads, each dk wide), for gdn_decode_kernel and the two slice kernels.
__device__ __forceinline__ void gdn_load_qk(const bf16* row, int nk, int kh, int dk, int e, float& q,
                                            float& k) {
  q = e < dk ? __bfloat162float(row[(int64_t)kh * dk + e]) : 0.0f;
  k = e < dk ? __bfloat162float(row[(int64_t)nk * dk + (int64_t)kh * dk + e]) : 0.0f;
}

}  // namespace df
