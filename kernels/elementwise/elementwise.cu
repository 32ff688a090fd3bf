// Elementwise ops on 2-D strided views: output gate, SwiGLU (+ backward), row scaling, noise, casts, fills, and
// the fixed-order column sum of the dw reductions. Inference ops round intermediates to bf16 as torch does
// (sigmoid/silu return bf16 tensors); training ops compute in fp32 and round each output once.
#include <algorithm>

#include "core/rng.h"
#include "kernels/primitives/cuda_check.cuh"
#include "kernels/primitives/device_math.cuh"
#include "kernels/launchers.cuh"

namespace df {

namespace {

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

unsigned grid_for(int64_t n) {
  int64_t b = (n + 255) / 256;
  return static_cast<unsigned>(b < 65535 * 16 ? (b > 0 ? b : 1) : 65535 * 16);
}

}  // namespace

// ---- kernels ----
// VEC elements per thread along a row; op(x, y) returns the new value from the two inputs.
template <int VEC, class Op>
__global__ void binary_kernel(const bf16* x, int64_t ld_x, const bf16* y, int64_t ld_y, bf16* out, int64_t ld_out,
                              int64_t rows, int64_t cols, Op op) {
  int64_t per_row = cols / VEC;
  int64_t n = rows * per_row;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / per_row, c = (i % per_row) * VEC;
    const bf16* xp = x + r * ld_x + c;
    const bf16* yp = y + r * ld_y + c;
    bf16* op_ = out + r * ld_out + c;
    if constexpr (VEC == 8) {
      uint4 xv = *reinterpret_cast<const uint4*>(xp), yv = *reinterpret_cast<const uint4*>(yp), ov;
      const bf16* xe = reinterpret_cast<const bf16*>(&xv);
      const bf16* ye = reinterpret_cast<const bf16*>(&yv);
      bf16* oe = reinterpret_cast<bf16*>(&ov);
#pragma unroll
      for (int j = 0; j < 8; ++j) oe[j] = __float2bfloat16(op(__bfloat162float(xe[j]), __bfloat162float(ye[j])));
      *reinterpret_cast<uint4*>(op_) = ov;
    } else {
      op_[0] = __float2bfloat16(op(__bfloat162float(xp[0]), __bfloat162float(yp[0])));
    }
  }
}

__global__ void cast_kernel(const void* src, bool src_f32, int64_t ld_src, void* dst, bool dst_f32, int64_t ld_dst,
                            int64_t rows, int64_t cols) {
  int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / cols, c = i % cols;
    float v = src_f32 ? static_cast<const float*>(src)[r * ld_src + c]
                      : __bfloat162float(static_cast<const bf16*>(src)[r * ld_src + c]);
    if (dst_f32)
      static_cast<float*>(dst)[r * ld_dst + c] = v;
    else
      static_cast<bf16*>(dst)[r * ld_dst + c] = __float2bfloat16(v);
  }
}

// splitmix64 finaliser: a well-mixed 64-bit hash of the element index.
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_uniform_kernel(void* dst, bool dst_f32, int64_t ld, int64_t rows, int64_t cols, float lo, float hi,
                                    uint64_t seed) {
  int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / cols, c = i % cols;
    float u = static_cast<float>(mix64(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(i)) >> 40) * (1.0f / 16777216.0f);
    float v = lo + (hi - lo) * u;
    if (dst_f32)
      static_cast<float*>(dst)[r * ld + c] = v;
    else
      static_cast<bf16*>(dst)[r * ld + c] = __float2bfloat16(v);
  }
}

__global__ void fill_normal_kernel(void* dst, bool dst_f32, int64_t ld, int64_t rows, int64_t cols, float mean,
                                   float std, uint64_t seed, uint64_t stream_id) {
  int64_t n = rows * cols;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / cols, c = i % cols;
    float v = mean + std * rng_normal_at(seed, stream_id, static_cast<uint64_t>(i));
    if (dst_f32)
      static_cast<float*>(dst)[r * ld + c] = v;
    else
      static_cast<bf16*>(dst)[r * ld + c] = __float2bfloat16(v);
  }
}

// One training element each, in fp32 and rounded once by the caller: the one expression of each op that both
// kernel forms below use, so the 16-byte form gives the bits of the one-element form.
__device__ __forceinline__ void swiglu_bwd_f32(float g, float u, float d, float* dg, float* du) {
  const float sg = sigmoid_f32(g);
  *dg = d * u * sg * (1.0f + g * (1.0f - sg));
  *du = d * g * sg;
}
__device__ __forceinline__ float noise_add_f32(float x, float std, float z) {
  return x + std * z;
}

// One thread per element of a [rows, cols] view, f(r, c) doing the work: grid.y strides over rows and grid.x
// over columns, so no thread divides by cols. The training ops' form for shapes the 16-byte form below
// refuses (odd columns, strides or addresses).
template <class F>
__global__ void rows_map_kernel(int64_t rows, int64_t cols, F f) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < cols;
         c += (int64_t)gridDim.x * blockDim.x)
      f(r, c);
}

// One thread per 16-byte chunk of a [rows, cols] view, per_row chunks a row, f(r, v) doing chunk v of row r
// (8 bf16 or 4 f32 elements), grid-stride over the flat chunk index i = r·per_row + v. The grid is what fits
// on the device at once (rows_vec_launch), so one flat grid covers a single huge row (the flat gradient
// buffers) as well as many short ones; i advances by the grid's thread count, carried into (r, v) with at
// most one wrap per step, so the loop never divides and rows·cols may pass 2^31.
template <class F>
__global__ void rows_vec_kernel(int64_t rows, int64_t per_row, F f) {
  const int64_t step = int64_t(gridDim.x) * blockDim.x,
                first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t dr = step / per_row, dv = step - dr * per_row;
  int64_t r = first / per_row, v = first - r * per_row;
  while (r < rows) {
    f(r, v);
    r += dr;
    v += dv;
    if (v >= per_row) {
      v -= per_row;
      ++r;
    }
  }
}

__device__ __forceinline__ uint4 load16(const bf16* p) {
  return *reinterpret_cast<const uint4*>(p);
}
__device__ __forceinline__ void store16(bf16* p, uint4 v) {
  *reinterpret_cast<uint4*>(p) = v;
}
__device__ __forceinline__ float bf16_at(const uint4& v, int j) {
  return __bfloat162float(reinterpret_cast<const bf16*>(&v)[j]);
}
__device__ __forceinline__ void set_bf16_at(uint4& v, int j, float x) {
  reinterpret_cast<bf16*>(&v)[j] = __float2bfloat16(x);
}

struct SwigluBwdOp {
  const bf16 *gate, *up, *dout;
  bf16 *dgate, *dup;
  int64_t ld_gate, ld_up, ld_dout, ld_dgate, ld_dup;
  __device__ void operator()(int64_t r, int64_t c) const {
    float dg, du;
    swiglu_bwd_f32(__bfloat162float(gate[r * ld_gate + c]), __bfloat162float(up[r * ld_up + c]),
                   __bfloat162float(dout[r * ld_dout + c]), &dg, &du);
    dgate[r * ld_dgate + c] = __float2bfloat16(dg);
    dup[r * ld_dup + c] = __float2bfloat16(du);
  }
};
// Chunk v: the three 16-byte loads issued before the math.
struct SwigluBwdVecOp {
  SwigluBwdOp e;
  __device__ void operator()(int64_t r, int64_t v) const {
    const int64_t c = v * 8;
    const uint4 g = load16(e.gate + r * e.ld_gate + c), u = load16(e.up + r * e.ld_up + c),
                d = load16(e.dout + r * e.ld_dout + c);
    uint4 dg, du;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float dgj, duj;
      swiglu_bwd_f32(bf16_at(g, j), bf16_at(u, j), bf16_at(d, j), &dgj, &duj);
      set_bf16_at(dg, j, dgj);
      set_bf16_at(du, j, duj);
    }
    store16(e.dgate + r * e.ld_dgate + c, dg);
    store16(e.dup + r * e.ld_dup + c, du);
  }
};

struct ScaleRowsOp {
  bf16* x;
  int64_t ld;
  const float* s;
  __device__ void operator()(int64_t r, int64_t c) const {
    x[r * ld + c] = __float2bfloat16(__bfloat162float(x[r * ld + c]) * s[r]);
  }
};
struct ScaleRowsVecOp {
  ScaleRowsOp e;
  __device__ void operator()(int64_t r, int64_t v) const {
    bf16* p = e.x + r * e.ld + v * 8;
    uint4 x = load16(p);
    const float s = e.s[r];
#pragma unroll
    for (int j = 0; j < 8; ++j) set_bf16_at(x, j, bf16_at(x, j) * s);
    store16(p, x);
  }
};

struct GaussianNoiseOp {
  bf16* x;
  int64_t ld, cols;
  float std;
  uint64_t seed;
  __device__ void operator()(int64_t r, int64_t c) const {
    const float z = rng_normal_at(seed, kRngStreamTrainNoise, static_cast<uint64_t>(r * cols + c));
    x[r * ld + c] = __float2bfloat16(noise_add_f32(__bfloat162float(x[r * ld + c]), std, z));
  }
};
// The draw of element (r, c) keeps its index r·cols + c, whatever chunk it falls in.
struct GaussianNoiseVecOp {
  GaussianNoiseOp e;
  __device__ void operator()(int64_t r, int64_t v) const {
    const int64_t c = v * 8;
    bf16* p = e.x + r * e.ld + c;
    uint4 x = load16(p);
    const uint64_t i0 = static_cast<uint64_t>(r * e.cols + c);
#pragma unroll
    for (int j = 0; j < 8; ++j)
      set_bf16_at(x, j,
                  noise_add_f32(bf16_at(x, j), e.std, rng_normal_at(e.seed, kRngStreamTrainNoise, i0 + j)));
    store16(p, x);
  }
};

struct FillOp {
  void* dst;
  bool f32;
  int64_t ld;
  float value;
  __device__ void operator()(int64_t r, int64_t c) const {
    if (f32)
      static_cast<float*>(dst)[r * ld + c] = value;
    else
      static_cast<bf16*>(dst)[r * ld + c] = __float2bfloat16(value);
  }
};
// Chunk v holds 4 f32 or 8 bf16 elements (v·4 or v·8 of the row).
struct FillVecOp {
  FillOp e;
  __device__ void operator()(int64_t r, int64_t v) const {
    uint4 w;
    if (e.f32) {
      w = make_uint4(__float_as_uint(e.value), __float_as_uint(e.value), __float_as_uint(e.value),
                     __float_as_uint(e.value));
      *reinterpret_cast<uint4*>(static_cast<float*>(e.dst) + r * e.ld + v * 4) = w;
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) set_bf16_at(w, j, e.value);
      store16(static_cast<bf16*>(e.dst) + r * e.ld + v * 8, w);
    }
  }
};

// dst[c] = beta·dst[c] + Σ_k partial[k·cols + c], k ascending: the same bits whatever the grid that made the
// partials. beta 0 never reads dst.
__global__ void column_sum_kernel(const float* partial, int64_t chunks, int64_t cols, float* dst,
                                  float beta) {
  for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < cols;
       c += (int64_t)gridDim.x * blockDim.x) {
    float acc = 0.0f;
    for (int64_t k = 0; k < chunks; ++k) acc += partial[k * cols + c];
    dst[c] = beta == 0.0f ? acc : beta * dst[c] + acc;
  }
}

struct SigmoidGateOp {
  __device__ float operator()(float o, float g) const { return sigmoid_gate_f32(o, g); }
};
struct SwigluOp {
  __device__ float operator()(float g, float u) const { return swiglu_f32(g, u); }
};

// ---- launchers ----
template <class Op>
static void binary_launch(const bf16* x, int64_t ld_x, const bf16* y, int64_t ld_y, bf16* out, int64_t ld_out,
                          int64_t rows, int64_t cols, Op op, cudaStream_t stream, const char* name) {
  if (rows == 0 || cols == 0) return;
  bool vec = cols % 8 == 0 && ld_x % 8 == 0 && ld_y % 8 == 0 && ld_out % 8 == 0 && aligned16(x) && aligned16(y) &&
             aligned16(out);
  if (vec)
    binary_kernel<8><<<grid_for(rows * cols / 8), 256, 0, stream>>>(x, ld_x, y, ld_y, out, ld_out, rows, cols, op);
  else
    binary_kernel<1><<<grid_for(rows * cols), 256, 0, stream>>>(x, ld_x, y, ld_y, out, ld_out, rows, cols, op);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) cuda_throw(name, cudaGetErrorString(e), __FILE__, __LINE__);
}

void sigmoid_gate_launch(bf16* o, int64_t ld_o, const bf16* gate, int64_t ld_gate, int64_t rows, int64_t cols,
                         cudaStream_t stream) {
  binary_launch(o, ld_o, gate, ld_gate, o, ld_o, rows, cols, SigmoidGateOp{}, stream, "launch of sigmoid_gate");
}

void swiglu_launch(const bf16* gate, int64_t ld_gate, const bf16* up, int64_t ld_up, bf16* out, int64_t ld_out,
                   int64_t rows, int64_t cols, cudaStream_t stream) {
  binary_launch(gate, ld_gate, up, ld_up, out, ld_out, rows, cols, SwigluOp{}, stream, "launch of swiglu");
}

void cast_launch(const void* src, bool src_f32, int64_t ld_src, void* dst, bool dst_f32, int64_t ld_dst,
                 int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  cast_kernel<<<grid_for(rows * cols), 256, 0, stream>>>(src, src_f32, ld_src, dst, dst_f32, ld_dst, rows, cols);
  DF_CUDA_CHECK_LAUNCH("cast_kernel");
}

void fill_uniform_launch(void* dst, bool dst_f32, int64_t ld, int64_t rows, int64_t cols, float lo, float hi,
                         uint64_t seed, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  fill_uniform_kernel<<<grid_for(rows * cols), 256, 0, stream>>>(dst, dst_f32, ld, rows, cols, lo, hi, seed);
  DF_CUDA_CHECK_LAUNCH("fill_uniform_kernel");
}

void fill_normal_launch(void* dst, bool dst_f32, int64_t ld, int64_t rows, int64_t cols, float mean, float std,
                        uint64_t seed, uint64_t stream_id, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  fill_normal_kernel<<<grid_for(rows * cols), 256, 0, stream>>>(dst, dst_f32, ld, rows, cols, mean, std, seed,
                                                                stream_id);
  DF_CUDA_CHECK_LAUNCH("fill_normal_kernel");
}

template <class F>
static void rows_map_launch(int64_t rows, int64_t cols, F f, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((cols + 255) / 256, 64)),
                  static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
  rows_map_kernel<<<grid, 256, 0, stream>>>(rows, cols, f);
  DF_CUDA_CHECK_LAUNCH("rows_map_kernel");
}

// Whether the 16-byte form can take a view of `per` elements a chunk: whole chunks in every row and every row
// start 16-byte aligned (a single row's stride is never used).
static bool rows_vec_fits(const void* p, int64_t ld, int64_t rows, int64_t cols, int per) {
  return cols % per == 0 && (rows == 1 || ld % per == 0) && aligned16(p);
}

// As many 256-thread blocks as are resident on the device at once (fewer for a small view): the grid-stride
// loop then runs in one wave with no tail of late blocks. The occupancy is asked once per kernel (the same
// on every GPU of a run); the SM count of the current device, asked once per device.
template <class F>
static void rows_vec_launch(int64_t rows, int64_t per_row, F f, cudaStream_t stream) {
  static const int per_sm = [] {
    int n = 0;
    DF_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, rows_vec_kernel<F>, 256, 0));
    return std::max(n, 1);
  }();
  const int64_t grid = std::min<int64_t>((rows * per_row + 255) / 256, int64_t(device_sm_count()) * per_sm);
  rows_vec_kernel<<<static_cast<unsigned>(grid), 256, 0, stream>>>(rows, per_row, f);
  DF_CUDA_CHECK_LAUNCH("rows_vec_kernel");
}

void swiglu_bwd_launch(const bf16* gate, int64_t ld_gate, const bf16* up, int64_t ld_up, const bf16* dout,
                       int64_t ld_dout, bf16* dgate, int64_t ld_dgate, bf16* dup, int64_t ld_dup,
                       int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const SwigluBwdOp e{gate, up, dout, dgate, dup, ld_gate, ld_up, ld_dout, ld_dgate, ld_dup};
  const bool vec = rows_vec_fits(gate, ld_gate, rows, cols, 8) && rows_vec_fits(up, ld_up, rows, cols, 8) &&
                   rows_vec_fits(dout, ld_dout, rows, cols, 8) &&
                   rows_vec_fits(dgate, ld_dgate, rows, cols, 8) && rows_vec_fits(dup, ld_dup, rows, cols, 8);
  if (vec)
    rows_vec_launch(rows, cols / 8, SwigluBwdVecOp{e}, stream);
  else
    rows_map_launch(rows, cols, e, stream);
}

void scale_rows_launch(bf16* x, int64_t ld_x, const float* s, int64_t rows, int64_t cols,
                       cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const ScaleRowsOp e{x, ld_x, s};
  if (rows_vec_fits(x, ld_x, rows, cols, 8))
    rows_vec_launch(rows, cols / 8, ScaleRowsVecOp{e}, stream);
  else
    rows_map_launch(rows, cols, e, stream);
}

void add_gaussian_noise_launch(bf16* x, int64_t ld_x, int64_t rows, int64_t cols, float std, uint64_t seed,
                               cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const GaussianNoiseOp e{x, ld_x, cols, std, seed};
  if (rows_vec_fits(x, ld_x, rows, cols, 8))
    rows_vec_launch(rows, cols / 8, GaussianNoiseVecOp{e}, stream);
  else
    rows_map_launch(rows, cols, e, stream);
}

void fill_launch(void* dst, bool dst_f32, int64_t ld, int64_t rows, int64_t cols, float value,
                 cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const FillOp e{dst, dst_f32, ld, value};
  const int per = dst_f32 ? 4 : 8;
  if (rows_vec_fits(dst, ld, rows, cols, per))
    rows_vec_launch(rows, cols / per, FillVecOp{e}, stream);
  else
    rows_map_launch(rows, cols, e, stream);
}

void column_sum_launch(const float* partial, int64_t chunks, int64_t cols, float* dst, float beta,
                       cudaStream_t stream) {
  if (cols == 0) return;
  column_sum_kernel<<<grid_for(cols), 256, 0, stream>>>(partial, chunks, cols, dst, beta);
  DF_CUDA_CHECK_LAUNCH("column_sum_kernel");
}

}  // namespace df
