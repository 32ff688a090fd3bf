// DFlash2's in-block convolution on the device (train_ops.h dflash2_conv_fwd/bwd; ops/dflash2_conv.h is the
// math, ops/cpu/cpu_dflash2.cpp the oracle). Its coefficient GEMM (x·kernel_projectionᵀ) is the caller's,
// through the one cuBLASLt entry point; here one elementwise kernel makes out = resid + conv_s(u) (taps, base
// + dynamic coefficient and the residual in one read of each input), and the backward is one kernel per (row,
// group) for ∂/∂u and ∂/∂coeff (a group's channel sum needs no atomics) plus fixed-order row-chunk partials
// for ∂/∂base.
#include "kernels/launchers.cuh"
#include "kernels/primitives/cuda_check.cuh"
#include "kernels/train/head_launch.cuh"
#include "kernels/train_launchers.cuh"

namespace df {

using namespace head_launch;

// ---- kernels: the convolution ----

// out[r, h] = resid[r, h] + Σ_{t < taps, t ≤ r mod B} (base[s·taps + t, h] + coeff[r, (s·taps + t)·G + h/gs])
// · u[r − t, h], one thread per element; resid may be null.
__global__ void dflash2_conv_fwd_kernel(const bf16* u, int64_t ld_u, const float* base, const bf16* coeff,
                                        int64_t ld_c, const bf16* resid, int64_t ld_r, bf16* out,
                                        int64_t ld_o, int64_t rows, Dflash2ConvShape d, int side) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * d.H) return;
  const int64_t r = i / d.H;
  const int h = int(i % d.H), k = int(r % d.B), G = d.H / d.gs;
  const float* b = base + int64_t(side) * d.taps * d.H;
  const bf16* c = coeff + r * ld_c + int64_t(side) * d.taps * G + h / d.gs;
  float s = resid ? __bfloat162float(resid[r * ld_r + h]) : 0.0f;
  for (int t = 0; t < d.taps && t <= k; ++t)
    s += (b[int64_t(t) * d.H + h] + __bfloat162float(c[int64_t(t) * G])) *
         __bfloat162float(u[(r - t) * ld_u + h]);
  out[r * ld_o + h] = __float2bfloat16(s);
}

// One thread per (row r, group g): dcoeff[r, side tap t, g] = Σ_{h ∈ g} dout[r, h]·u[r − t, h] (0 for t > k)
// and du[r, h] = Σ_{t: k + t < B} dout[r + t, h]·(base[t, h] + coeff[r + t, t, g]) for the group's channels.
__global__ void dflash2_conv_bwd_kernel(const bf16* u, int64_t ld_u, const float* base, const bf16* coeff,
                                        int64_t ld_c, const bf16* dout, int64_t ld_do, bf16* du,
                                        int64_t ld_du, bf16* dcoeff, int64_t ld_dc, int64_t rows,
                                        Dflash2ConvShape d, int side) {
  const int G = d.H / d.gs;
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * G) return;
  const int64_t r = i / G;
  const int g = int(i % G), k = int(r % d.B), h0 = g * d.gs;
  const int64_t col0 = int64_t(side) * d.taps * G + g;
  const float* b = base + int64_t(side) * d.taps * d.H;
  for (int t = 0; t < d.taps; ++t) {
    float s = 0.0f;
    if (t <= k)
      for (int h = h0; h < h0 + d.gs; ++h)
        s += __bfloat162float(dout[r * ld_do + h]) * __bfloat162float(u[(r - t) * ld_u + h]);
    dcoeff[r * ld_dc + col0 + int64_t(t) * G] = __float2bfloat16(s);
  }
  for (int h = h0; h < h0 + d.gs; ++h) {
    float s = 0.0f;
    for (int t = 0; t < d.taps && k + t < d.B; ++t)
      s += __bfloat162float(dout[(r + t) * ld_do + h]) *
           (b[int64_t(t) * d.H + h] + __bfloat162float(coeff[(r + t) * ld_c + col0 + int64_t(t) * G]));
    du[r * ld_du + h] = __float2bfloat16(s);
  }
}

// Row chunk q of the ∂/∂base reduction: part[q, t·H + h] = Σ_{r in chunk, r mod B ≥ t} dout[r, h]·u[r − t,
// h].
__global__ void dflash2_conv_dbase_partial_kernel(const bf16* u, int64_t ld_u, const bf16* dout,
                                                  int64_t ld_do, float* part, int64_t rows,
                                                  int64_t chunk_rows, Dflash2ConvShape d) {
  const int h = blockIdx.x * blockDim.x + threadIdx.x;
  if (h >= d.H) return;
  const int64_t q = blockIdx.y, r0 = q * chunk_rows, r1 = min(rows, r0 + chunk_rows);
  for (int t = 0; t < d.taps; ++t) {
    float s = 0.0f;
    for (int64_t r = r0; r < r1; ++r)
      if (int(r % d.B) >= t)
        s += __bfloat162float(dout[r * ld_do + h]) * __bfloat162float(u[(r - t) * ld_u + h]);
    part[(q * d.taps + t) * d.H + h] = s;
  }
}

// ---- launchers ----

namespace {

void check_conv(const char* op, const Dflash2ConvShape& d, int side, int64_t rows) {
  DF_CHECK(d.H >= 1 && d.B >= 1 && d.taps >= 1 && d.taps <= d.B && d.gs >= 1 && d.H % d.gs == 0 &&
               (side == 0 || side == 1) && rows >= 0 && rows % d.B == 0,
           "%s: bad shape H %d B %d taps %d group %d side %d rows %lld (rows whole blocks, taps in [1, B], "
           "the group dividing H)",
           op, d.H, d.B, d.taps, d.gs, side, (long long)rows);
}

}  // namespace

void dflash2_conv_fwd_launch(const Dflash2ConvShape& d, int side, const bf16* u, int64_t ld_u,
                             const float* base, const bf16* coeff, int64_t ld_c, const bf16* resid,
                             int64_t ld_r, bf16* out, int64_t ld_o, int64_t rows, cudaStream_t stream) {
  const char* op = "dflash2_conv_fwd_launch";
  check_conv(op, d, side, rows);
  DF_CHECK(u && base && coeff && out, "%s: null pointer argument", op);
  if (rows == 0) return;
  dflash2_conv_fwd_kernel<<<grid_of(rows * d.H), kThreads, 0, stream>>>(u, ld_u, base, coeff, ld_c, resid,
                                                                        ld_r, out, ld_o, rows, d, side);
  DF_CUDA_CHECK_LAUNCH("dflash2_conv_fwd_kernel");
}

void dflash2_conv_bwd_launch(const Dflash2ConvShape& d, int side, const bf16* u, int64_t ld_u,
                             const float* base, const bf16* coeff, int64_t ld_c, const bf16* dout,
                             int64_t ld_do, bf16* du, int64_t ld_du, bf16* dcoeff, int64_t ld_dc,
                             float* dbase, float beta_dbase, int64_t rows, void* ws, size_t ws_bytes,
                             cudaStream_t stream) {
  const char* op = "dflash2_conv_bwd_launch";
  check_conv(op, d, side, rows);
  DF_CHECK(u && base && coeff && dout && du && dcoeff && dbase, "%s: null pointer argument", op);
  float* db = dbase + int64_t(side) * d.taps * d.H;
  const int64_t cols = int64_t(d.taps) * d.H;
  if (rows == 0) {
    column_sum_launch(nullptr, 0, cols, db, beta_dbase, stream);
    return;
  }
  check_ws(op, ws, ws_bytes, dflash2_conv_bwd_workspace_bytes(rows, d.H, d.taps));
  const int G = d.H / d.gs;
  dflash2_conv_bwd_kernel<<<grid_of(rows * G), kThreads, 0, stream>>>(
      u, ld_u, base, coeff, ld_c, dout, ld_do, du, ld_du, dcoeff, ld_dc, rows, d, side);
  DF_CUDA_CHECK_LAUNCH("dflash2_conv_bwd_kernel");
  const int64_t chunks = column_partial_chunks(rows, cols), per = (rows + chunks - 1) / chunks;
  float* part = static_cast<float*>(ws);
  dflash2_conv_dbase_partial_kernel<<<dim3(grid_of(d.H), unsigned(chunks)), kThreads, 0, stream>>>(
      u, ld_u, dout, ld_do, part, rows, per, d);
  DF_CUDA_CHECK_LAUNCH("dflash2_conv_dbase_partial_kernel");
  column_sum_launch(part, chunks, cols, db, beta_dbase, stream);
}

}  // namespace df
