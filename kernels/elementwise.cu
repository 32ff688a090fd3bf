// Elementwise ops on 2-D strided views: output gate, SwiGLU (+ backward), row scaling, noise, casts, fills, and
// the fixed-order column sum of the dw reductions. Inference ops round intermediates to bf16 as torch does
// (sigmoid/silu return bf16 tensors); training ops compute in fp32 and round each output once.
#include <algorithm>

#include "core/rng.h"
#include "kernels/cuda_check.cuh"
#include "kernels/device_math.cuh"
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

// One thread per element of a [rows, cols] view, f(r, c) doing the work: grid.y strides over rows and grid.x
// over columns, so no thread divides by cols. For the training ops, a small share of a step next to the GEMMs
// and attention, so plain 2-byte accesses do.
template <class F>
__global__ void rows_map_kernel(int64_t rows, int64_t cols, F f) {
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    for (int64_t c = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; c < cols;
         c += (int64_t)gridDim.x * blockDim.x)
      f(r, c);
}

struct SwigluBwdOp {
  const bf16 *gate, *up, *dout;
  bf16 *dgate, *dup;
  int64_t ld_gate, ld_up, ld_dout, ld_dgate, ld_dup;
  __device__ void operator()(int64_t r, int64_t c) const {
    const float g = __bfloat162float(gate[r * ld_gate + c]), u = __bfloat162float(up[r * ld_up + c]);
    const float d = __bfloat162float(dout[r * ld_dout + c]), sg = sigmoid_f32(g);
    dgate[r * ld_dgate + c] = __float2bfloat16(d * u * sg * (1.0f + g * (1.0f - sg)));
    dup[r * ld_dup + c] = __float2bfloat16(d * g * sg);
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

struct GaussianNoiseOp {
  bf16* x;
  int64_t ld, cols;
  float std;
  uint64_t seed;
  __device__ void operator()(int64_t r, int64_t c) const {
    const float z = rng_normal_at(seed, kRngStreamTrainNoise, static_cast<uint64_t>(r * cols + c));
    x[r * ld + c] = __float2bfloat16(__bfloat162float(x[r * ld + c]) + std * z);
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
  if (rows == 0 || cols == 0) return;
  const dim3 grid(static_cast<unsigned>(std::min<int64_t>((cols + 255) / 256, 64)),
                  static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
  rows_map_kernel<<<grid, 256, 0, stream>>>(rows, cols, f);
  DF_CUDA_CHECK_LAUNCH("rows_map_kernel");
}

void swiglu_bwd_launch(const bf16* gate, int64_t ld_gate, const bf16* up, int64_t ld_up, const bf16* dout,
                       int64_t ld_dout, bf16* dgate, int64_t ld_dgate, bf16* dup, int64_t ld_dup,
                       int64_t rows, int64_t cols, cudaStream_t stream) {
  rows_map_launch(rows, cols,
                  SwigluBwdOp{gate, up, dout, dgate, dup, ld_gate, ld_up, ld_dout, ld_dgate, ld_dup}, stream);
}

void scale_rows_launch(bf16* x, int64_t ld_x, const float* s, int64_t rows, int64_t cols,
                       cudaStream_t stream) {
  rows_map_launch(rows, cols, ScaleRowsOp{x, ld_x, s}, stream);
}

void add_gaussian_noise_launch(bf16* x, int64_t ld_x, int64_t rows, int64_t cols, float std, uint64_t seed,
                               cudaStream_t stream) {
  rows_map_launch(rows, cols, GaussianNoiseOp{x, ld_x, cols, std, seed}, stream);
}

void fill_launch(void* dst, bool dst_f32, int64_t ld, int64_t rows, int64_t cols, float value,
                 cudaStream_t stream) {
  rows_map_launch(rows, cols, FillOp{dst, dst_f32, ld, value}, stream);
}

void column_sum_launch(const float* partial, int64_t chunks, int64_t cols, float* dst, float beta,
                       cudaStream_t stream) {
  if (cols == 0) return;
  column_sum_kernel<<<grid_for(cols), 256, 0, stream>>>(partial, chunks, cols, dst, beta);
  DF_CUDA_CHECK_LAUNCH("column_sum_kernel");
}

}  // namespace df
