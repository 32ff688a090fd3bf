// DFlash2's in-block convolution on the device (train_ops.h dflash2_conv_fwd/bwd; ops/dflash2_conv.h is the
// math, ops/cpu/cpu_dflash2.cpp the oracle). Its coefficient GEMM (x·kernel_projectionᵀ) is the caller's,
// through the one cuBLASLt entry point; here one elementwise kernel makes out = resid + conv_s(u) (taps, base
// + dynamic coefficient and the residual in one read of each input), and the backward is one kernel a row for
// ∂/∂u (lanes over channels) and ∂/∂coeff (a thread a tap and group: a group's channel sum needs no atomics)
// plus fixed-order row-chunk partials for ∂/∂base.
#include <initializer_list>
#include <utility>

#include "kernels/launchers.cuh"
#include "kernels/primitives/cuda_check.cuh"
#include "kernels/primitives/device_math.cuh"
#include "kernels/train/head_launch.cuh"
#include "kernels/train_launchers.cuh"

namespace df {

using namespace head_launch;

// ---- kernels: the convolution ----

// The kernels take VEC consecutive channels a thread (8: 16-byte accesses, when H, the group, the strides
// and the pointers allow; else 1), one CTA a row, 32-bit index math inside the row.
constexpr int kConvThreads = 128;

// out[r, h] = resid[r, h] + Σ_{t < taps, t ≤ r mod B} (base[s·taps + t, h] + coeff[r, (s·taps + t)·G + h/gs])
// · u[r − t, h]; resid may be null. A vector's channels share one group (VEC divides gs).
template <int VEC>
__global__ void __launch_bounds__(kConvThreads)
    dflash2_conv_fwd_kernel(const bf16* u, int64_t ld_u, const float* base, const bf16* coeff, int64_t ld_c,
                            const bf16* resid, int64_t ld_r, bf16* out, int64_t ld_o, Dflash2ConvShape d,
                            int side) {
  const int64_t r = blockIdx.x;
  const int k = int(r % d.B), G = d.H / d.gs, taps = min(d.taps, k + 1);
  const float* b = base + int64_t(side) * d.taps * d.H;
  const bf16* c = coeff + r * ld_c + int64_t(side) * d.taps * G;
  for (int h = threadIdx.x * VEC; h < d.H; h += blockDim.x * VEC) {
    float s[VEC], x[VEC];
    if (resid)
      load_bf16<VEC>(resid + r * ld_r + h, s);
    else
#pragma unroll
      for (int v = 0; v < VEC; ++v) s[v] = 0.0f;
    const int g = h / d.gs;
    for (int t = 0; t < taps; ++t) {
      load_bf16<VEC>(u + (r - t) * ld_u + h, x);
      const float cf = __bfloat162float(c[t * G + g]);
#pragma unroll
      for (int v = 0; v < VEC; ++v) s[v] += (b[t * d.H + h + v] + cf) * x[v];
    }
    store_bf16<VEC>(out + r * ld_o + h, s);
  }
}

// Row r: du[r, h] = Σ_{t: k + t < B} dout[r + t, h]·(base[t, h] + coeff[r + t, t, g]) (lanes over channels),
// then dcoeff[r, side tap t, g] = Σ_{h ∈ g} dout[r, h]·u[r − t, h] (0 for t > k; a thread a (tap, group),
// its channels in order, neighbouring groups in neighbouring lanes).
template <int VEC>
__global__ void __launch_bounds__(kConvThreads)
    dflash2_conv_bwd_kernel(const bf16* u, int64_t ld_u, const float* base, const bf16* coeff, int64_t ld_c,
                            const bf16* dout, int64_t ld_do, bf16* du, int64_t ld_du, bf16* dcoeff,
                            int64_t ld_dc, Dflash2ConvShape d, int side) {
  const int64_t r = blockIdx.x;
  const int k = int(r % d.B), G = d.H / d.gs, taps = min(d.taps, d.B - k);
  const int64_t col0 = int64_t(side) * d.taps * G;
  const float* b = base + int64_t(side) * d.taps * d.H;
  for (int h = threadIdx.x * VEC; h < d.H; h += blockDim.x * VEC) {
    float s[VEC], x[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) s[v] = 0.0f;
    const int g = h / d.gs;
    for (int t = 0; t < taps; ++t) {
      load_bf16<VEC>(dout + (r + t) * ld_do + h, x);
      const float cf = __bfloat162float(coeff[(r + t) * ld_c + col0 + t * G + g]);
#pragma unroll
      for (int v = 0; v < VEC; ++v) s[v] += x[v] * (b[t * d.H + h + v] + cf);
    }
    store_bf16<VEC>(du + r * ld_du + h, s);
  }
  for (int e = threadIdx.x; e < d.taps * G; e += blockDim.x) {
    const int t = e / G, g = e % G;
    float s = 0.0f;
    if (t <= k)
      for (int h = g * d.gs; h < (g + 1) * d.gs; h += VEC) {
        float x[VEC], y[VEC];
        load_bf16<VEC>(dout + r * ld_do + h, x);
        load_bf16<VEC>(u + (r - t) * ld_u + h, y);
#pragma unroll
        for (int v = 0; v < VEC; ++v) s += x[v] * y[v];
      }
    dcoeff[r * ld_dc + col0 + e] = __float2bfloat16(s);
  }
}

// Row chunk q (blockIdx.y) of the ∂/∂base reduction, VEC channels a thread: part[q, t·H + h] = Σ_{r in chunk,
// r mod B ≥ t} dout[r, h]·u[r − t, h].
template <int VEC>
__global__ void __launch_bounds__(kConvThreads)
    dflash2_conv_dbase_partial_kernel(const bf16* u, int64_t ld_u, const bf16* dout, int64_t ld_do,
                                      float* part, int64_t rows, int64_t chunk_rows, Dflash2ConvShape d) {
  const int h = (blockIdx.x * blockDim.x + threadIdx.x) * VEC;
  if (h >= d.H) return;
  const int64_t q = blockIdx.y, r0 = q * chunk_rows, r1 = min(rows, r0 + chunk_rows);
  const int k0 = int(r0 % d.B);
  for (int t = 0; t < d.taps; ++t) {
    float s[VEC], x[VEC], y[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) s[v] = 0.0f;
    int k = k0;
    for (int64_t r = r0; r < r1; ++r) {
      if (k >= t) {
        load_bf16<VEC>(dout + r * ld_do + h, x);
        load_bf16<VEC>(u + (r - t) * ld_u + h, y);
#pragma unroll
        for (int v = 0; v < VEC; ++v) s[v] += x[v] * y[v];
      }
      if (++k == d.B) k = 0;
    }
    float* o = part + (q * d.taps + t) * d.H + h;
#pragma unroll
    for (int v = 0; v < VEC; ++v) o[v] = s[v];
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

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// 8 channels a thread where every row of the vector-accessed bf16 operands starts 16-byte aligned and a
// group holds whole vectors; 1 otherwise.
int conv_vec(const Dflash2ConvShape& d, std::initializer_list<std::pair<const void*, int64_t>> rows) {
  bool ok = d.H % 8 == 0 && d.gs % 8 == 0;
  for (const auto& [p, ld] : rows) ok = ok && (!p || (aligned16(p) && ld % 8 == 0));
  return ok ? 8 : 1;
}

}  // namespace

void dflash2_conv_fwd_launch(const Dflash2ConvShape& d, int side, const bf16* u, int64_t ld_u,
                             const float* base, const bf16* coeff, int64_t ld_c, const bf16* resid,
                             int64_t ld_r, bf16* out, int64_t ld_o, int64_t rows, cudaStream_t stream) {
  const char* op = "dflash2_conv_fwd_launch";
  check_conv(op, d, side, rows);
  DF_CHECK(u && base && coeff && out, "%s: null pointer argument", op);
  if (rows == 0) return;
  if (conv_vec(d, {{u, ld_u}, {resid, ld_r}, {out, ld_o}}) == 8)
    dflash2_conv_fwd_kernel<8><<<unsigned(rows), kConvThreads, 0, stream>>>(u, ld_u, base, coeff, ld_c, resid,
                                                                            ld_r, out, ld_o, d, side);
  else
    dflash2_conv_fwd_kernel<1><<<unsigned(rows), kConvThreads, 0, stream>>>(u, ld_u, base, coeff, ld_c, resid,
                                                                            ld_r, out, ld_o, d, side);
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
  const int64_t chunks = dflash2_conv_dbase_chunks(rows), per = (rows + chunks - 1) / chunks;
  float* part = static_cast<float*>(ws);
  if (conv_vec(d, {{u, ld_u}, {dout, ld_do}, {du, ld_du}}) == 8) {
    dflash2_conv_bwd_kernel<8><<<unsigned(rows), kConvThreads, 0, stream>>>(
        u, ld_u, base, coeff, ld_c, dout, ld_do, du, ld_du, dcoeff, ld_dc, d, side);
    DF_CUDA_CHECK_LAUNCH("dflash2_conv_bwd_kernel");
    const dim3 grid(unsigned((d.H / 8 + kConvThreads - 1) / kConvThreads), unsigned(chunks));
    dflash2_conv_dbase_partial_kernel<8><<<grid, kConvThreads, 0, stream>>>(u, ld_u, dout, ld_do, part, rows,
                                                                           per, d);
  } else {
    dflash2_conv_bwd_kernel<1><<<unsigned(rows), kConvThreads, 0, stream>>>(
        u, ld_u, base, coeff, ld_c, dout, ld_do, du, ld_du, dcoeff, ld_dc, d, side);
    DF_CUDA_CHECK_LAUNCH("dflash2_conv_bwd_kernel");
    const dim3 grid(unsigned((d.H + kConvThreads - 1) / kConvThreads), unsigned(chunks));
    dflash2_conv_dbase_partial_kernel<1><<<grid, kConvThreads, 0, stream>>>(u, ld_u, dout, ld_do, part, rows,
                                                                           per, d);
  }
  DF_CUDA_CHECK_LAUNCH("dflash2_conv_dbase_partial_kernel");
  column_sum_launch(part, chunks, cols, db, beta_dbase, stream);
}

}  // namespace df
