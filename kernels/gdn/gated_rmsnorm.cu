// The Gated DeltaNet output norm: RMSNorm per (token, value head) over dv, not zero-centred, times silu(z):
// w·x̂·silu(z) in fp32, rounded once at the store (device_math.cuh's rounding policy; Qwen3_5RMSNormGated
// rounds w·bf16(x̂) to bf16 first, FLA's fused gated norm rounds once as here). Memory-bound: the vector
// kernel (dv ≤ 128) reads each row once into registers, several rows per lane in flight; a warp-per-row
// kernel covers every other shape.
#include "kernels/primitives/cuda_check.cuh"
#include "kernels/primitives/device_math.cuh"
#include "kernels/launchers.cuh"

namespace df {

// Vector kernel: 16 lanes per (token, head) row, 8 values (16 bytes) per lane, so a warp covers two rows
// per step and kGnRows steps; all 2·kGnRows rows' o and z loads are issued before the first is used.
constexpr int kGnRows = 4;
constexpr int kGnThreads = 256;

// ---- kernels ----
// Sums of squares are taken in exactly the order of gated_rmsnorm_kernel<4> (lane l of that kernel holds
// values 4l..4l+3 and butterflies over 32 lanes): here each 8-value lane keeps its two 4-value halves apart,
// butterflies them over 16 lanes (the 32-lane tree's first four levels) and adds them last (its final
// level), so both kernels give bit-identical outputs.
__global__ void __launch_bounds__(kGnThreads)
    gated_rmsnorm_vec_kernel(const bf16* __restrict__ o, int64_t ld_o, const bf16* __restrict__ z,
                             int64_t ld_z, const float* __restrict__ w, bf16* __restrict__ out,
                             int64_t ld_out, int64_t T, int heads, int dv, float eps) {
  const int lane = threadIdx.x & 31;
  const int64_t first = ((int64_t)blockIdx.x * (kGnThreads / 32) + threadIdx.x / 32) * (2 * kGnRows);
  if (first >= T * heads) return;  // the whole warp leaves together, so the shuffles below see 32 lanes
  const int e0 = (lane & 15) * 8;
  const bool col = e0 < dv;  // dv % 8 == 0 here: a lane inside the row has all 8 values
  float wr[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) wr[j] = col ? w[e0 + j] : 0.0f;

  // Rows first + 2s + (lane ≥ 16) for s < kGnRows, as (token, head) walked without a division per row.
  int64_t t = first / heads;
  int h = static_cast<int>(first % heads) + (lane >> 4);
  while (h >= heads) h -= heads, ++t;
  int64_t rt[kGnRows];
  int rh[kGnRows];
  uint4 ro[kGnRows], rz[kGnRows];
#pragma unroll
  for (int s = 0; s < kGnRows; ++s) {
    rt[s] = t;
    rh[s] = h;
    const bool ok = col && t < T;
    ro[s] =
        ok ? *reinterpret_cast<const uint4*>(o + t * ld_o + (int64_t)h * dv + e0) : make_uint4(0, 0, 0, 0);
    rz[s] =
        ok ? *reinterpret_cast<const uint4*>(z + t * ld_z + (int64_t)h * dv + e0) : make_uint4(0, 0, 0, 0);
    h += 2;
    while (h >= heads) h -= heads, ++t;
  }
#pragma unroll
  for (int s = 0; s < kGnRows; ++s) {
    float v[8], zv[8];
    const bf16* oe = reinterpret_cast<const bf16*>(&ro[s]);
    const bf16* ze = reinterpret_cast<const bf16*>(&rz[s]);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = __bfloat162float(oe[j]), zv[j] = __bfloat162float(ze[j]);
    float lo = 0.0f, hi = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) lo += v[j] * v[j];
#pragma unroll
    for (int j = 4; j < 8; ++j) hi += v[j] * v[j];
#pragma unroll
    for (int m = 8; m > 0; m >>= 1) {
      lo += __shfl_xor_sync(0xffffffffu, lo, m);
      hi += __shfl_xor_sync(0xffffffffu, hi, m);
    }
    float r = rsqrtf((lo + hi) / static_cast<float>(dv) + eps);
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = gated_rmsnorm_apply(v[j], r, wr[j], zv[j]);
    if (col && rt[s] < T) store_bf16<8>(out + rt[s] * ld_out + (int64_t)rh[s] * dv + e0, v);
  }
}

// Any dv and stride: one warp per (token, head), two passes over the row.
template <int V>
__global__ void gated_rmsnorm_kernel(const bf16* o, int64_t ld_o, const bf16* z, int64_t ld_z, const float* w,
                                     bf16* out, int64_t ld_out, int64_t T, int heads, int dv, float eps) {
  int64_t item = blockIdx.x * (int64_t)(blockDim.x / 32) + threadIdx.x / 32;
  if (item >= T * heads) return;
  int lane = threadIdx.x & 31;
  int64_t t = item / heads;
  int h = static_cast<int>(item % heads);
  const bf16* orow = o + t * ld_o + (int64_t)h * dv;
  const bf16* zrow = z + t * ld_z + (int64_t)h * dv;
  bf16* yrow = out + t * ld_out + (int64_t)h * dv;
  float ss = 0.0f;
  for (int i = lane * V; i < dv; i += 32 * V) {
    float v[V];
    load_bf16<V>(orow + i, v);
#pragma unroll
    for (int j = 0; j < V; ++j) ss += v[j] * v[j];
  }
  float r = rsqrtf(warp_sum(ss) / static_cast<float>(dv) + eps);
  for (int i = lane * V; i < dv; i += 32 * V) {
    float v[V], zv[V];
    load_bf16<V>(orow + i, v);
    load_bf16<V>(zrow + i, zv);
#pragma unroll
    for (int j = 0; j < V; ++j) v[j] = gated_rmsnorm_apply(v[j], r, w[i + j], zv[j]);
    store_bf16<V>(yrow + i, v);
  }
}

// ---- launchers ----
void gated_rmsnorm_launch(const bf16* o, int64_t ld_o, const bf16* z, int64_t ld_z, const float* w, bf16* out,
                          int64_t ld_out, int64_t T, int heads, int dv, float eps, cudaStream_t stream) {
  int64_t items = T * heads;
  if (items == 0) return;
  auto al = [](const void* p, uintptr_t n) { return reinterpret_cast<uintptr_t>(p) % n == 0; };
  if (dv % 8 == 0 && dv <= 128 && ld_o % 8 == 0 && ld_z % 8 == 0 && ld_out % 8 == 0 && al(o, 16) &&
      al(z, 16) && al(out, 16)) {
    const int64_t per_block = int64_t(kGnThreads / 32) * 2 * kGnRows;
    gated_rmsnorm_vec_kernel<<<static_cast<unsigned>((items + per_block - 1) / per_block), kGnThreads, 0,
                               stream>>>(o, ld_o, z, ld_z, w, out, ld_out, T, heads, dv, eps);
    DF_CUDA_CHECK_LAUNCH("gated_rmsnorm_vec_kernel");
    return;
  }
  bool vec =
      dv % 4 == 0 && ld_o % 4 == 0 && ld_z % 4 == 0 && ld_out % 4 == 0 && al(o, 8) && al(z, 8) && al(out, 8);
  unsigned blocks = static_cast<unsigned>((items + 7) / 8);
  if (vec)
    gated_rmsnorm_kernel<4><<<blocks, 256, 0, stream>>>(o, ld_o, z, ld_z, w, out, ld_out, T, heads, dv, eps);
  else
    gated_rmsnorm_kernel<1><<<blocks, 256, 0, stream>>>(o, ld_o, z, ld_z, w, out, ld_out, T, heads, dv, eps);
  DF_CUDA_CHECK_LAUNCH("gated_rmsnorm_kernel");
}

}  // namespace df
