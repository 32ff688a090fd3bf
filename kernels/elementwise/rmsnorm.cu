// Row RMSNorm, plain (Qwen3) and zero-centred (Qwen3.5/3.6), with the residual add of the pre-norm block
// fused in, and the drafter's training forward (saved rstd) and backward. Memory-bound: the register kernel
// reads each row from global memory once, all of a thread's 16-byte loads in flight before the reduction; a
// two-pass kernel covers every other shape and alignment.
#include <algorithm>

#include "kernels/primitives/cuda_check.cuh"
#include "kernels/primitives/device_math.cuh"
#include "kernels/gemm/fp8_rows.cuh"
#include "kernels/launchers.cuh"

namespace df {

// Register kernel geometry: 8 bf16 (16 bytes) per chunk, up to kRegMaxChunks chunks per thread. The launcher
// aims at kRegThreads threads per row (5120 cols: 128 threads x 5 chunks, 10 KB of loads in flight per block,
// several blocks per SM) and grows the block to kRegMaxThreads for wider rows.
constexpr int kRegMaxChunks = 8;
constexpr int kRegThreads = 128;
constexpr int kRegMaxThreads = 512;
// The backward holds x, dy and dx (24 registers a chunk): 8 chunks spill under the 128 registers that 512
// threads leave, 7 do not (rows up to 28,672 columns).
constexpr int kRegBwdMaxChunks = 7;
// dw partial kernel geometry: kDwVec adjacent columns per thread (2 where the layout rules that out), loads
// of kDwRows rows in flight per thread, kDwThreads threads per block. The fixed chunking leaves about 256
// such blocks whatever the shape (8192 x 4096: 32 chunks x 8 blocks), two per SM, so the bytes in flight must
// come from each thread: 32 rows x 2 x 8 bytes (183 registers at V = 4; two blocks still fit an SM).
constexpr int kDwVec = 4;
constexpr int kDwRows = 32;
constexpr int kDwThreads = 128;

// ---- kernels ----
// One block per row; thread t holds chunks t, t + blockDim, ... (NC of them, coalesced across the block) as
// raw bf16 in registers from the load to the output. With delta != nullptr, residual += delta first, rounded
// to bf16 and written back; the norm then sees the rounded residual, as in rmsnorm_kernel. With rstd !=
// nullptr (the training forward) r is saved per row as well. Numerics are those of rmsnorm_kernel except the
// order of the fp32 sum of squares (per-thread partials over its chunks, then the block tree), so results can
// differ from it in the last bits of r. FP8: the output rows are also quantised to e4m3 as
// fp8_quantize_rows_launch of out would (codes at q, scale at qscale[row]) from the registers, and with
// write_back out then holds code · scale instead. A template argument so that the plain norm keeps its
// register count (occupancy) without the quantiser's.
template <int NC, bool FP8>
__global__ void __launch_bounds__(kRegMaxThreads)
    rmsnorm_reg_kernel(bf16* x, int64_t ld_x, const bf16* __restrict__ delta, int64_t ld_delta,
                       const float* __restrict__ w, bf16* out, int64_t ld_out, float* rstd, int64_t cols,
                       float eps, bool zero_centred, uint8_t* q, int64_t ldq, float* qscale,
                       bool write_back) {
  const int64_t row = blockIdx.x;
  const int n = static_cast<int>(cols / 8);
  bf16* xr = x + row * ld_x;
  uint4 u[NC];
#pragma unroll
  for (int k = 0; k < NC; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    u[k] = i < n ? *reinterpret_cast<const uint4*>(xr + i * 8) : make_uint4(0, 0, 0, 0);
  }
  if (delta) {
    const bf16* dr = delta + row * ld_delta;
    uint4 du[NC];
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      du[k] = i < n ? *reinterpret_cast<const uint4*>(dr + i * 8) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int k = 0; k < NC; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      float v[8], d[8];
      bf16x8_unpack(u[k], v);
      bf16x8_unpack(du[k], d);
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = v[j] + d[j];
      u[k] = bf16x8_pack(v);  // the bf16 rounding of the residual stream
      if (i < n) *reinterpret_cast<uint4*>(xr + i * 8) = u[k];
    }
  }
  float ss = 0.0f;  // chunks past the row are zeros and add nothing
#pragma unroll
  for (int k = 0; k < NC; ++k) {
    float v[8];
    bf16x8_unpack(u[k], v);
#pragma unroll
    for (int j = 0; j < 8; ++j) ss += v[j] * v[j];
  }
  const float r = rsqrtf(block_sum(ss) / static_cast<float>(cols) + eps);
  if (rstd && threadIdx.x == 0) rstd[row] = r;
  uint4* orow = reinterpret_cast<uint4*>(out + row * ld_out);
#pragma unroll
  for (int k = 0; k < NC; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i >= n) continue;
    u[k] = rmsnorm_apply8(u[k], w + 8 * i, r, zero_centred);
    if (!FP8 || !write_back) orow[i] = u[k];
  }
  if constexpr (FP8)
    fp8_quantize_held_row(u, n, reinterpret_cast<uint2*>(q + row * ldq), qscale + row,
                          write_back ? orow : nullptr);
}

// Two passes over the row (the second read hits L1/L2), V elements per access (8 or 1): rows too wide for
// the register kernel, or whose layout or weight pointer rules out its 16-byte accesses. With delta as above.
// With rstd != nullptr it is the training forward: r saved per row and out = w·x·r in fp32, rounded once
// (the backward differentiates that, not the inference path's bf16(x̂) before the weight).
template <int V>
__global__ void rmsnorm_kernel(bf16* x, int64_t ld_x, const bf16* delta, int64_t ld_delta, const float* w,
                               bf16* out, int64_t ld_out, float* rstd, int64_t cols, float eps,
                               bool zero_centred) {
  const int64_t row = blockIdx.x, n = cols / V;
  bf16* xr = x + row * ld_x;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float v[V];
    load_bf16<V>(xr + i * V, v);
    if (delta) {
      float d[V];
      load_bf16<V>(delta + row * ld_delta + i * V, d);
#pragma unroll
      for (int j = 0; j < V; ++j) v[j] = bf16_rn(v[j] + d[j]);
      store_bf16<V>(xr + i * V, v);
    }
#pragma unroll
    for (int j = 0; j < V; ++j) ss += v[j] * v[j];
  }
  const float r = rsqrtf(block_sum(ss) / static_cast<float>(cols) + eps);
  if (rstd && threadIdx.x == 0) rstd[row] = r;
  bf16* orow = out + row * ld_out;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    float v[V];
    load_bf16<V>(xr + i * V, v);
#pragma unroll
    for (int j = 0; j < V; ++j)
      v[j] = rstd ? w[i * V + j] * (v[j] * r) : rmsnorm_apply(v[j], r, w[i * V + j], zero_centred);
    store_bf16<V>(orow + i * V, v);
  }
}

// One block per row of the backward: m = mean(dy·w·x̂), then dx = beta_dx·dx + r·(dy·w − x̂·m).
__global__ void rmsnorm_bwd_dx_kernel(const bf16* x, int64_t ld_x, const float* w, const float* rstd,
                                      const bf16* dy, int64_t ld_dy, bf16* dx, int64_t ld_dx, int64_t cols,
                                      float beta_dx) {
  const int64_t row = blockIdx.x;
  const bf16 *xr = x + row * ld_x, *dyr = dy + row * ld_dy;
  bf16* dxr = dx + row * ld_dx;
  const float r = rstd[row];
  float acc = 0.0f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
    acc += __bfloat162float(dyr[i]) * w[i] * __bfloat162float(xr[i]);
  const float m = block_sum(acc) * r / static_cast<float>(cols);
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) {
    const float xh = __bfloat162float(xr[i]) * r;
    const float g = r * (__bfloat162float(dyr[i]) * w[i] - xh * m);
    dxr[i] = __float2bfloat16(beta_dx == 0.0f ? g : beta_dx * __bfloat162float(dxr[i]) + g);
  }
}

// Partial ∂/∂w of row chunk blockIdx.y (rows [k·R, (k + 1)·R)), one column per thread summed in row order:
// partial[k·cols + c]. column_sum_launch adds the chunks in order.
__global__ void rmsnorm_bwd_dw_kernel(const bf16* x, int64_t ld_x, const float* rstd, const bf16* dy,
                                      int64_t ld_dy, int64_t rows, int64_t cols, int64_t R, float* partial) {
  const int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, k = blockIdx.y;
  if (c >= cols) return;
  const int64_t r1 = rows < (k + 1) * R ? rows : (k + 1) * R;
  float acc = 0.0f;
  for (int64_t r = k * R; r < r1; ++r)
    acc += __bfloat162float(dy[r * ld_dy + c]) * (__bfloat162float(x[r * ld_x + c]) * rstd[r]);
  partial[k * cols + c] = acc;
}

// The backward for the register forward's shapes: the row's x and dy (and dx when beta_dx != 0) read once
// with 16-byte loads, all in flight before the reduction and held as raw bf16 in registers until dx is stored
// with 16-byte stores; the layout of rmsnorm_reg_kernel. The math of rmsnorm_bwd_dx_kernel but for the order
// of the fp32 sum behind m (per-thread partials over its chunks, then the block tree). beta_dx == 0 never
// reads dx.
template <int NC>
__global__ void __launch_bounds__(kRegMaxThreads)
    rmsnorm_bwd_dx_reg_kernel(const bf16* x, int64_t ld_x, const float* __restrict__ w,
                              const float* __restrict__ rstd, const bf16* dy, int64_t ld_dy, bf16* dx,
                              int64_t ld_dx, int64_t cols, float beta_dx) {
  const int64_t row = blockIdx.x;
  const int n = static_cast<int>(cols / 8);
  const uint4* xr = reinterpret_cast<const uint4*>(x + row * ld_x);
  const uint4* dyr = reinterpret_cast<const uint4*>(dy + row * ld_dy);
  uint4* dxr = reinterpret_cast<uint4*>(dx + row * ld_dx);
  const bool accumulate = beta_dx != 0.0f;
  uint4 ux[NC], ud[NC], uo[NC];
#pragma unroll
  for (int k = 0; k < NC; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    ux[k] = i < n ? xr[i] : make_uint4(0, 0, 0, 0);
    ud[k] = i < n ? dyr[i] : make_uint4(0, 0, 0, 0);
    uo[k] = accumulate && i < n ? dxr[i] : make_uint4(0, 0, 0, 0);
  }
  const float r = rstd[row];
  // w: 8 fp32 per chunk, shared by every row, so served from L1/L2 in both loops.
  auto weights = [&](int i, float(&wv)[8]) {
    const float4 w0 = reinterpret_cast<const float4*>(w + 8 * i)[0],
                 w1 = reinterpret_cast<const float4*>(w + 8 * i)[1];
    wv[0] = w0.x, wv[1] = w0.y, wv[2] = w0.z, wv[3] = w0.w, wv[4] = w1.x, wv[5] = w1.y, wv[6] = w1.z,
    wv[7] = w1.w;
  };
  float acc = 0.0f;
#pragma unroll
  for (int k = 0; k < NC; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i >= n) continue;
    float v[8], d[8], wv[8];
    bf16x8_unpack(ux[k], v);
    bf16x8_unpack(ud[k], d);
    weights(i, wv);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc += d[j] * wv[j] * v[j];
  }
  const float m = block_sum(acc) * r / static_cast<float>(cols);
#pragma unroll
  for (int k = 0; k < NC; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i >= n) continue;
    float v[8], d[8], o[8], wv[8], g[8];
    bf16x8_unpack(ux[k], v);
    bf16x8_unpack(ud[k], d);
    bf16x8_unpack(uo[k], o);
    weights(i, wv);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float xh = v[j] * r;
      g[j] = r * (d[j] * wv[j] - xh * m);
      if (accumulate) g[j] = beta_dx * o[j] + g[j];
    }
    dxr[i] = bf16x8_pack(g);
  }
}

// rmsnorm_bwd_dw_kernel's partials, bit for bit, with V adjacent columns per thread (2V-byte loads: a warp
// reads 64·V contiguous bytes of a row of x and of dy): each column is the same fp32 chain over the chunk's
// rows in ascending order. With only chunks·cols / V threads, the U rows' loads of a step are all issued
// before their terms are added, so that enough bytes are in flight to keep HBM busy.
template <int V, int U>
__global__ void __launch_bounds__(kDwThreads)
    rmsnorm_bwd_dw_vec_kernel(const bf16* x, int64_t ld_x, const float* __restrict__ rstd, const bf16* dy,
                              int64_t ld_dy, int64_t rows, int64_t cols, int64_t R, float* partial) {
  const int64_t c0 = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) * V, k = blockIdx.y;
  if (c0 >= cols) return;
  const int64_t r1 = rows < (k + 1) * R ? rows : (k + 1) * R;
  float acc[V] = {};
  for (int64_t r0 = k * R; r0 < r1; r0 += U) {
    bf16_bits_t<V> ux[U], ud[U];
    float rs[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (r0 + u >= r1) break;
      ux[u] = load_bf16_bits<V>(x + (r0 + u) * ld_x + c0);
      ud[u] = load_bf16_bits<V>(dy + (r0 + u) * ld_dy + c0);
      rs[u] = rstd[r0 + u];
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (r0 + u >= r1) break;
      float v[V], d[V];
      unpack_bf16<V>(ux[u], v);
      unpack_bf16<V>(ud[u], d);
#pragma unroll
      for (int j = 0; j < V; ++j) acc[j] += d[j] * (v[j] * rs[u]);
    }
  }
#pragma unroll
  for (int j = 0; j < V; ++j) partial[k * cols + c0 + j] = acc[j];
}

// ---- launchers ----
// The register kernels' block for a row of `chunks` 16-byte chunks (at most max_nc · kRegMaxThreads):
// the fewest chunks per thread that keeps the block at kRegThreads, then the block trimmed to a whole number
// of warps that still covers the row (block_sum needs whole warps).
struct RegGeometry {
  int nc;
  unsigned threads;
};
static RegGeometry reg_geometry(int64_t chunks, int max_nc) {
  const int nc = static_cast<int>(std::clamp<int64_t>((chunks + kRegThreads - 1) / kRegThreads, 1, max_nc));
  return {nc, static_cast<unsigned>(((chunks + nc - 1) / nc + 31) / 32 * 32)};
}

// q: the FP8 rows of out too (rmsnorm_fp8_launch), fused into the register kernel where it runs, else
// fp8_quantize_rows_launch on out afterwards.
static void rmsnorm_run(bf16* x, int64_t ld_x, const bf16* delta, int64_t ld_delta, const float* w, bf16* out,
                        int64_t ld_out, float* rstd, int64_t rows, int64_t cols, float eps, bool zero_centred,
                        cudaStream_t stream, uint8_t* q = nullptr, int64_t ldq = 0, float* qscale = nullptr,
                        bool write_back = false) {
  if (rows == 0 || cols == 0) return;
  auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  bool vec = cols % 8 == 0 && ld_x % 8 == 0 && ld_out % 8 == 0 && al(x) && al(out) &&
             (!delta || (ld_delta % 8 == 0 && al(delta)));
  const int64_t chunks = cols / 8;
  const bool q_vec = !q || (ldq % 8 == 0 && reinterpret_cast<uintptr_t>(q) % 8 == 0);
  // The training forward (rstd) runs here too: w·x·r with the products rounded in fp32 is rmsnorm_apply's
  // (x·r)·w, zero_centred false.
  if (vec && q_vec && al(w) &&
      chunks <= int64_t(kRegMaxChunks) * kRegMaxThreads) {
    const RegGeometry g = reg_geometry(chunks, kRegMaxChunks);
    using Kernel = decltype(&rmsnorm_reg_kernel<1, false>);
    constexpr Kernel by_chunks[2][kRegMaxChunks] = {
        {rmsnorm_reg_kernel<1, false>, rmsnorm_reg_kernel<2, false>, rmsnorm_reg_kernel<3, false>,
         rmsnorm_reg_kernel<4, false>, rmsnorm_reg_kernel<5, false>, rmsnorm_reg_kernel<6, false>,
         rmsnorm_reg_kernel<7, false>, rmsnorm_reg_kernel<8, false>},
        {rmsnorm_reg_kernel<1, true>, rmsnorm_reg_kernel<2, true>, rmsnorm_reg_kernel<3, true>,
         rmsnorm_reg_kernel<4, true>, rmsnorm_reg_kernel<5, true>, rmsnorm_reg_kernel<6, true>,
         rmsnorm_reg_kernel<7, true>, rmsnorm_reg_kernel<8, true>}};
    by_chunks[q != nullptr][g.nc - 1]<<<static_cast<unsigned>(rows), g.threads, 0, stream>>>(
        x, ld_x, delta, ld_delta, w, out, ld_out, rstd, cols, eps, zero_centred, q, ldq, qscale, write_back);
    DF_CUDA_CHECK_LAUNCH("rmsnorm_reg_kernel");
    return;
  }
  int64_t per_thread_items = vec ? chunks : cols;
  unsigned threads = per_thread_items >= 512 ? 256 : (per_thread_items >= 128 ? 128 : 32);
  if (vec)
    rmsnorm_kernel<8><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
        x, ld_x, delta, ld_delta, w, out, ld_out, rstd, cols, eps, zero_centred);
  else
    rmsnorm_kernel<1><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
        x, ld_x, delta, ld_delta, w, out, ld_out, rstd, cols, eps, zero_centred);
  DF_CUDA_CHECK_LAUNCH("rmsnorm_kernel");
  if (q) fp8_quantize_rows_launch(out, ld_out, q, ldq, qscale, rows, cols, write_back, stream);
}

void rmsnorm_launch(const bf16* x, int64_t ld_x, const float* w, bf16* out, int64_t ld_out, int64_t rows,
                    int64_t cols, float eps, bool zero_centred, cudaStream_t stream) {
  // x is only written when a delta is given; the kernel takes one pointer type for both uses.
  rmsnorm_run(const_cast<bf16*>(x), ld_x, nullptr, 0, w, out, ld_out, nullptr, rows, cols, eps, zero_centred,
              stream);
}

void rmsnorm_fp8_launch(const bf16* x, int64_t ld_x, const float* w, bf16* out, int64_t ld_out, uint8_t* q,
                        int64_t ldq, float* scale, bool write_back, int64_t rows, int64_t cols, float eps,
                        bool zero_centred, cudaStream_t stream) {
  rmsnorm_run(const_cast<bf16*>(x), ld_x, nullptr, 0, w, out, ld_out, nullptr, rows, cols, eps, zero_centred,
              stream, q, ldq, scale, write_back);
}

void add_rmsnorm_launch(bf16* residual, int64_t ld_res, const bf16* delta, int64_t ld_delta, const float* w,
                        bf16* out, int64_t ld_out, int64_t rows, int64_t cols, float eps, bool zero_centred,
                        cudaStream_t stream) {
  rmsnorm_run(residual, ld_res, delta, ld_delta, w, out, ld_out, nullptr, rows, cols, eps, zero_centred,
              stream);
}

void rmsnorm_fwd_launch(const bf16* x, int64_t ld_x, const float* w, bf16* y, int64_t ld_y, float* rstd,
                        int64_t rows, int64_t cols, float eps, cudaStream_t stream) {
  rmsnorm_run(const_cast<bf16*>(x), ld_x, nullptr, 0, w, y, ld_y, rstd, rows, cols, eps, false, stream);
}

void rmsnorm_bwd_launch(const bf16* x, int64_t ld_x, const float* w, const float* rstd, const bf16* dy,
                        int64_t ld_dy, bf16* dx, int64_t ld_dx, float* dw, float beta_dx, float beta_dw,
                        int64_t rows, int64_t cols, void* ws, size_t ws_bytes, cudaStream_t stream) {
  if (cols == 0) return;
  if (rows == 0) {
    // No rows: ∂/∂w is 0, but a step's first write (beta_dw 0) must still replace the stale dw.
    if (beta_dw != 1.0f) column_sum_launch(nullptr, 0, cols, dw, beta_dw, stream);
    return;
  }
  const size_t need = rmsnorm_bwd_workspace_bytes(rows, cols);
  if (ws_bytes < need)
    cuda_throw("rmsnorm_bwd_launch", "workspace smaller than rmsnorm_bwd_workspace_bytes", __FILE__,
               __LINE__);
  auto al = [](const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  const int64_t row_chunks = cols / 8;
  const bool vec = cols % 8 == 0 && ld_x % 8 == 0 && ld_dy % 8 == 0 && ld_dx % 8 == 0 && al(x, 16) &&
                   al(dy, 16) && al(dx, 16) && al(w, 16);
  if (vec && row_chunks <= int64_t(kRegBwdMaxChunks) * kRegMaxThreads) {
    const RegGeometry g = reg_geometry(row_chunks, kRegBwdMaxChunks);
    using Kernel = decltype(&rmsnorm_bwd_dx_reg_kernel<1>);
    constexpr Kernel by_chunks[kRegBwdMaxChunks] = {
        rmsnorm_bwd_dx_reg_kernel<1>, rmsnorm_bwd_dx_reg_kernel<2>, rmsnorm_bwd_dx_reg_kernel<3>,
        rmsnorm_bwd_dx_reg_kernel<4>, rmsnorm_bwd_dx_reg_kernel<5>, rmsnorm_bwd_dx_reg_kernel<6>,
        rmsnorm_bwd_dx_reg_kernel<7>};
    by_chunks[g.nc - 1]<<<static_cast<unsigned>(rows), g.threads, 0, stream>>>(x, ld_x, w, rstd, dy, ld_dy,
                                                                               dx, ld_dx, cols, beta_dx);
    DF_CUDA_CHECK_LAUNCH("rmsnorm_bwd_dx_reg_kernel");
  } else {
    const unsigned threads = cols >= 1024 ? 256 : (cols >= 128 ? 128 : 32);
    rmsnorm_bwd_dx_kernel<<<static_cast<unsigned>(rows), threads, 0, stream>>>(x, ld_x, w, rstd, dy, ld_dy,
                                                                               dx, ld_dx, cols, beta_dx);
    DF_CUDA_CHECK_LAUNCH("rmsnorm_bwd_dx_kernel");
  }
  const int64_t chunks = column_partial_chunks(rows, cols), R = (rows + chunks - 1) / chunks;
  float* partial = static_cast<float*>(ws);
  // The widest column group the layout allows, up to V = DW_V (see kDwVec).
  auto fits = [&](int v) {
    return cols % v == 0 && ld_x % v == 0 && ld_dy % v == 0 && al(x, 2 * v) && al(dy, 2 * v);
  };
  const int v = fits(kDwVec) ? kDwVec : fits(2) ? 2 : 1;
  if (v > 1) {
    const dim3 grid(static_cast<unsigned>((cols / v + kDwThreads - 1) / kDwThreads),
                    static_cast<unsigned>(chunks));
    if (v == kDwVec)
      rmsnorm_bwd_dw_vec_kernel<kDwVec, kDwRows>
          <<<grid, kDwThreads, 0, stream>>>(x, ld_x, rstd, dy, ld_dy, rows, cols, R, partial);
    else
      rmsnorm_bwd_dw_vec_kernel<2, kDwRows>
          <<<grid, kDwThreads, 0, stream>>>(x, ld_x, rstd, dy, ld_dy, rows, cols, R, partial);
    DF_CUDA_CHECK_LAUNCH("rmsnorm_bwd_dw_vec_kernel");
  } else {
    const dim3 grid(static_cast<unsigned>((cols + 255) / 256), static_cast<unsigned>(chunks));
    rmsnorm_bwd_dw_kernel<<<grid, 256, 0, stream>>>(x, ld_x, rstd, dy, ld_dy, rows, cols, R, partial);
    DF_CUDA_CHECK_LAUNCH("rmsnorm_bwd_dw_kernel");
  }
  column_sum_launch(partial, chunks, cols, dw, beta_dw, stream);
}

}  // namespace df
