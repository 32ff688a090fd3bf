// Row-wise e4m3 quantisation for the FP8 target (weights at load, each linear layer's input per token): the
// codes and f32 scales the FP8 GEMM (gemm.cuh gemm_fp8_launch) multiplies, bit-identical to the CPU oracle's
// CpuOps::fp8_round_rows: the same IEEE scale, reciprocal and product (core/fp8.h e4m3_quantize), rounded by
// the hardware's cvt.rn.satfinite.e4m3x2.f32, which tests/unit/test_fp8.cpp shows is core/fp8.h's rounding.
#include "kernels/primitives/cuda_check.cuh"
#include "kernels/primitives/device_math.cuh"
#include "kernels/gemm/fp8_rows.cuh"
#include "kernels/launchers.cuh"

namespace df {

namespace {

constexpr int kQuantThreads = 256;

// What a quantiser kernel reads as its bf16 rows. Chunk i of row r is its elements 8i .. 8i + 7 (load8: rows
// 16-byte aligned, cols a multiple of 8), element i one value (load1); back(r) is where code · scale goes
// (null: nowhere).
struct BfRows {  // x itself; with write_back x's rows become code · scale
  bf16* x;
  int64_t ld;
  bool write_back;
  __device__ uint4 load8(int64_t r, int64_t i) const { return reinterpret_cast<const uint4*>(x + r * ld)[i]; }
  __device__ float load1(int64_t r, int64_t i) const { return __bfloat162float(x[r * ld + i]); }
  __device__ bf16* back(int64_t r) const { return write_back ? x + r * ld : nullptr; }
};
struct SwigluRows {  // swiglu(gate, up) rounded to bf16 exactly as swiglu_launch stores it, never stored
  const bf16* g;
  int64_t ldg;
  const bf16* u;
  int64_t ldu;
  __device__ uint4 load8(int64_t r, int64_t i) const {
    float gv[8], uv[8];
    bf16x8_unpack(reinterpret_cast<const uint4*>(g + r * ldg)[i], gv);
    bf16x8_unpack(reinterpret_cast<const uint4*>(u + r * ldu)[i], uv);
#pragma unroll
    for (int j = 0; j < 8; ++j) gv[j] = swiglu_f32(gv[j], uv[j]);
    return bf16x8_pack(gv);
  }
  __device__ float load1(int64_t r, int64_t i) const {
    return bf16_rn(swiglu_f32(__bfloat162float(g[r * ldg + i]), __bfloat162float(u[r * ldu + i])));
  }
  __device__ bf16* back(int64_t) const {
    return nullptr;
  }
};

// One block per row, the row's chunks held in registers (R per thread, cols at most blockDim.x · 8 · R): the
// amax over them, then every chunk quantised from the same registers. Threads past the row's end load nothing
// and hold zeros, which leave the amax as it is.
template <class Src, int R>
__global__ void __launch_bounds__(kQuantThreads)
    fp8_quantize_rows_reg_kernel(Src src, uint8_t* q, int64_t ldq, float* scale, int64_t cols) {
  const int64_t row = blockIdx.x, n = cols / 8;
  uint4 raw[R];
#pragma unroll
  for (int k = 0; k < R; ++k) {
    const int64_t i = threadIdx.x + int64_t(k) * blockDim.x;
    raw[k] = i < n ? src.load8(row, i) : make_uint4(0, 0, 0, 0);
  }
  fp8_quantize_held_row(raw, n, reinterpret_cast<uint2*>(q + row * ldq), scale + row,
                        reinterpret_cast<uint4*>(src.back(row)));
}

// Any row: the amax pass, then the quantise pass reading the row again (from cache: the first pass just
// brought it in). VEC: eight elements per step as above; otherwise one at a time (any alignment).
template <class Src, bool VEC>
__global__ void fp8_quantize_rows_kernel(Src src, uint8_t* q, int64_t ldq, float* scale, int64_t cols) {
  const int64_t row = blockIdx.x, n = VEC ? cols / 8 : cols;
  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    if constexpr (VEC)
      amax = abs_max8(src.load8(row, i), amax);
    else
      amax = fmaxf(amax, fabsf(src.load1(row, i)));
  }
  const float s = row_scale(block_max(amax)), inv = ieee_rcp(s);
  if (threadIdx.x == 0) scale[row] = s;
  uint8_t* qr = q + row * ldq;
  bf16* back = src.back(row);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    if constexpr (VEC) {
      uint4* b8 = back ? reinterpret_cast<uint4*>(back) + i : nullptr;
      reinterpret_cast<uint2*>(qr)[i] = quantize8(src.load8(row, i), inv, s, b8);
    } else {
      const uint32_t code = e4m3x2(src.load1(row, i), 0.0f, inv) & 0xffu;
      qr[i] = static_cast<uint8_t>(code);
      if (back) back[i] = __float2bfloat16_rn(e4m3x2_dequant(code, s).x);
    }
  }
}

template <class Src, int R>
void launch_reg(unsigned rows, int threads, const Src& src, uint8_t* q, int64_t ldq, float* scale,
                int64_t cols, cudaStream_t stream) {
  fp8_quantize_rows_reg_kernel<Src, R><<<rows, threads, 0, stream>>>(src, q, ldq, scale, cols);
}

// Rows of up to kQuantThreads · 8 · R elements stay in registers between the amax and the quantise pass (one
// read of the source); these R cover the Qwen widths with few idle slots (the 27B's 5120 and 6144 take R = 3,
// its down_proj's 17408 R = 9). Wider rows take the two-pass loop, whose second pass hits L2.
template <class Src>
struct RegVariant {
  int r;
  void (*launch)(unsigned, int, const Src&, uint8_t*, int64_t, float*, int64_t, cudaStream_t);
};
template <class Src>
constexpr RegVariant<Src> kRegVariants[] = {
    {1, launch_reg<Src, 1>}, {2, launch_reg<Src, 2>}, {3, launch_reg<Src, 3>},   {4, launch_reg<Src, 4>},
    {6, launch_reg<Src, 6>}, {9, launch_reg<Src, 9>}, {12, launch_reg<Src, 12>}, {16, launch_reg<Src, 16>}};

// vec: the source's rows allow 16-byte chunk loads (and q 8-byte stores).
template <class Src>
void quantize_rows_run(const Src& src, bool vec, uint8_t* q, int64_t ldq, float* scale, int64_t rows,
                       int64_t cols, cudaStream_t stream) {
  if (rows == 0) return;
  DF_CHECK(rows <= 0x7fffffff, "fp8_quantize_rows: %lld rows exceed the grid", (long long)rows);
  vec = vec && cols % 8 == 0 && ldq % 8 == 0 && reinterpret_cast<uintptr_t>(q) % 8 == 0;
  const int64_t chunks = cols / 8, per_thread = (chunks + kQuantThreads - 1) / kQuantThreads;
  const RegVariant<Src>* reg = nullptr;
  for (const RegVariant<Src>& v : kRegVariants<Src>)
    if (!reg && v.r >= per_thread) reg = &v;
  if (vec && chunks > 0 && reg) {
    // As few threads (whole warps) as hold the row at R chunks each, so only the last warp has idle slots.
    const int64_t need = (chunks + reg->r - 1) / reg->r;
    reg->launch(unsigned(rows), int((need + 31) / 32 * 32), src, q, ldq, scale, cols, stream);
  } else if (vec) {
    fp8_quantize_rows_kernel<Src, true>
        <<<unsigned(rows), kQuantThreads, 0, stream>>>(src, q, ldq, scale, cols);
  } else {
    fp8_quantize_rows_kernel<Src, false>
        <<<unsigned(rows), kQuantThreads, 0, stream>>>(src, q, ldq, scale, cols);
  }
  DF_CUDA_CHECK_LAUNCH("fp8_quantize_rows_kernel");
}

bool rows16(const void* p, int64_t ld) {  // 16-byte chunk loads: base and row pitch aligned
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && ld % 8 == 0;
}

}  // namespace

void fp8_quantize_rows_launch(bf16* x, int64_t ldx, uint8_t* q, int64_t ldq, float* scale, int64_t rows,
                              int64_t cols, bool write_back, cudaStream_t stream) {
  quantize_rows_run(BfRows{x, ldx, write_back}, rows16(x, ldx), q, ldq, scale, rows, cols, stream);
}

void swiglu_fp8_launch(const bf16* gate, int64_t ld_gate, const bf16* up, int64_t ld_up, uint8_t* q,
                       int64_t ldq, float* scale, int64_t rows, int64_t cols, cudaStream_t stream) {
  quantize_rows_run(SwigluRows{gate, ld_gate, up, ld_up}, rows16(gate, ld_gate) && rows16(up, ld_up), q, ldq,
                    scale, rows, cols, stream);
}

}  // namespace df
