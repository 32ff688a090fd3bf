// DSpark's Markov head on the device (dspark_markov.cuh): the gathers of W1[prev] into the head's input rows,
// the gated head's gate, the RNN's recurrence (slot k of every block at once, one projection GEMM a slot
// through the one cuBLASLt entry point), their backward, and the bias reductions. All in a fixed order: the
// same bits every run.
#include "kernels/gemm/gemm.cuh"
#include "kernels/launchers.cuh"
#include "kernels/primitives/cuda_check.cuh"
#include "kernels/train/dspark_markov.cuh"
#include "kernels/train/head_launch.cuh"

namespace df {

using namespace head_launch;

// ---- kernels ----

// Row r of the Markov head's input, e = W1[prev[r]] (R values): into cat (row stride ldc) at column e_col
// with y's row at column z_col (z_col < 0: none), and into u (row stride ldu) when set (vanilla: u = e).
// Rows whose slot r mod B is 0 get zeros in cat's first zero_cols columns (the RNN's state s_{−1} = 0).
__global__ void dspark_gather_kernel(const bf16* y, int64_t ld_y, const bf16* w1, const int32_t* prev, int V,
                                     int H, int R, int B, bf16* cat, int64_t ldc, int e_col, int z_col,
                                     int zero_cols, bf16* u, int64_t ldu) {
  const int64_t r = blockIdx.x;
  const int32_t p = prev[r];
  if (cat) {
    bf16* o = cat + r * ldc;
    for (int c = threadIdx.x; c < R; c += blockDim.x) o[e_col + c] = w1_at(w1, p, V, R, c);
    if (z_col >= 0)
      for (int c = threadIdx.x; c < H; c += blockDim.x) o[z_col + c] = y[r * ld_y + c];
    if (r % B == 0)
      for (int c = threadIdx.x; c < zero_cols; c += blockDim.x) o[c] = __float2bfloat16(0.0f);
  }
  if (u)
    for (int c = threadIdx.x; c < R; c += blockDim.x) u[r * ldu + c] = w1_at(w1, p, V, R, c);
}

// The gated head over rows [rows, R]: g = σ(pre + b), u = g ⊙ e with e in cat at e_col; g kept when set.
__global__ void dspark_gate_fwd_kernel(const float* pre, const float* bias, const bf16* cat, int64_t ldc,
                                       int e_col, float* g, bf16* u, int64_t ldu, int64_t rows, int R) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * R) return;
  const int64_t r = i / R;
  const int c = int(i % R);
  const float gv = sigmoid_f(pre[i] + bias[c]);
  if (g) g[i] = gv;
  u[r * ldu + c] = __float2bfloat16(gv * __bfloat162float(cat[r * ldc + e_col + c]));
}

// One RNN slot for nb rows: pre row j (stride ld_pre) holds J·[s ; e ; z] as [r | c | o] (R each), bias added
// here; sp (stride ld_s) the state the row reads. s = σ(r)·s_prev + (1 − σ(r))·tanh(c), u = tanh(o). Writes u
// bf16 (stride ld_u), the new state to sp_next (stride ld_s; may be sp: each element is read, then written,
// by one thread) and as bf16 to cat_next's first R columns (stride ld_cat) when set, and σ(r), tanh(c),
// tanh(o) to gate, cand, uo (stride ld_s) when set.
__global__ void dspark_rnn_fwd_kernel(const float* pre, int64_t ld_pre, const float* bias, const float* sp,
                                      float* sp_next, int64_t ld_s, float* gate, float* cand, float* uo,
                                      bf16* u, int64_t ld_u, bf16* cat_next, int64_t ld_cat, int64_t nb,
                                      int R) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= nb * R) return;
  const int64_t j = i / R;
  const int c = int(i % R);
  const float* p = pre + j * ld_pre;
  const float g = sigmoid_f(p[c] + bias[c]);
  const float cv = tanhf(p[R + c] + bias[R + c]);
  const float o = tanhf(p[2 * R + c] + bias[2 * R + c]);
  const int64_t at = j * ld_s + c;
  const float s = g * sp[at] + (1.0f - g) * cv;
  if (gate) {
    gate[at] = g;
    cand[at] = cv;
    uo[at] = o;
  }
  u[j * ld_u + c] = __float2bfloat16(o);
  if (sp_next) sp_next[at] = s;
  if (cat_next) cat_next[j * ld_cat + c] = __float2bfloat16(s);
}

// The gated head's backward over [rows, R]: with g = σ(pre), u = g ⊙ e: ∂pre = du·e·g(1 − g) (f32 and bf16),
// ∂e = du·g into de.
__global__ void dspark_gate_bwd_kernel(const float* du, const float* g, const bf16* cat, int64_t ldc,
                                       int e_col, float* dpre_f, bf16* dpre_b, float* de, int64_t rows,
                                       int R) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= rows * R) return;
  const int64_t r = i / R;
  const int c = int(i % R);
  const float gv = g[i], e = __bfloat162float(cat[r * ldc + e_col + c]);
  const float dp = du[i] * e * gv * (1.0f - gv);
  dpre_f[i] = dp;
  dpre_b[i] = __float2bfloat16(dp);
  de[i] = du[i] * gv;
}

// One RNN slot's backward for nb rows (all arrays' rows j at stride ld_s, pre-shaped ones at ld_pre): from ds
// (∂/∂s_k, [nb, R]) and du: ∂r = ds·(s_prev − c)·g(1 − g), ∂c = ds·(1 − g)(1 − c²), ∂o = du·(1 − o²).
__global__ void dspark_rnn_bwd_kernel(const float* ds, const float* du, const float* sp, const float* gate,
                                      const float* cand, const float* uo, int64_t ld_s, float* dpre_f,
                                      bf16* dpre_b, int64_t ld_pre, int64_t nb, int R) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= nb * R) return;
  const int64_t j = i / R;
  const int c = int(i % R);
  const int64_t at = j * ld_s + c;
  const float g = gate[at], cv = cand[at], o = uo[at], d = ds[i];
  const float dr = d * (sp[at] - cv) * g * (1.0f - g), dc = d * (1.0f - g) * (1.0f - cv * cv),
              dout = du[at] * (1.0f - o * o);
  float* pf = dpre_f + j * ld_pre;
  bf16* pb = dpre_b + j * ld_pre;
  pf[c] = dr;
  pf[R + c] = dc;
  pf[2 * R + c] = dout;
  pb[c] = __float2bfloat16(dr);
  pb[R + c] = __float2bfloat16(dc);
  pb[2 * R + c] = __float2bfloat16(dout);
}

// ds ← ds·g + din's first R columns (∂/∂s_{k−1} from slot k: through the gate's carry and through J).
__global__ void dspark_rnn_carry_kernel(float* ds, const float* gate, int64_t ld_s, const float* din,
                                        int64_t ld_din, int64_t nb, int R) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= nb * R) return;
  const int64_t j = i / R;
  const int c = int(i % R);
  ds[i] = ds[i] * gate[j * ld_s + c] + din[j * ld_din + c];
}

// part[k·cols + c] = Σ x[r, c] over chunk k's rows [k·per, (k + 1)·per) in row order (one thread a column of
// one chunk): the first pass of a fixed-order column sum, column_sum_launch the second.
__global__ void dspark_colsum_partial_kernel(const float* x, int64_t ld, int64_t rows, int cols, int64_t per,
                                             float* part) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const int64_t r0 = blockIdx.y * per, r1 = min(rows, r0 + per);
  float s = 0.0f;
  for (int64_t r = r0; r < r1; ++r) s += x[r * ld + c];
  part[int64_t(blockIdx.y) * cols + c] = s;
}

// ---- launchers ----

void dspark_markov_fwd(GemmContext* gemm, const DSparkHeadShape& d, const DSparkLayout& L, const bf16* y,
                       int64_t ld_y, const DSparkHeadWeightPtrs& w, const int32_t* prev, void* ws,
                       cudaStream_t stream) {
  const int64_t nb = d.nb, N = L.N;
  const int B = d.B, H = d.H, R = d.R, W = d.cat_width(), P = d.pre_width();
  bf16* cat = at<bf16>(ws, L.cat);
  bf16* u = at<bf16>(ws, L.u);
  const bool vanilla = d.markov == DSparkMarkov::vanilla, rnn = d.markov == DSparkMarkov::rnn;
  dspark_gather_kernel<<<unsigned(N), kThreads, 0, stream>>>(
      y, ld_y, w.markov_w1, prev, d.V, H, R, B, vanilla ? nullptr : cat, L.ldc, d.e_col(),
      vanilla ? -1 : d.z_col(), rnn ? R : 0, vanilla ? u : nullptr, L.ldr);
  DF_CUDA_CHECK_LAUNCH("dspark_gather_kernel");
  if (vanilla) return;
  float* pre = at<float>(ws, L.pre);
  float* gate = at<float>(ws, L.gate);
  if (d.markov == DSparkMarkov::gated) {
    gemm_launch_ex(gemm, cat, L.ldc, false, w.gate_w, W, true, pre, P, true, N, P, W, 1.0f, 0.0f, stream);
    dspark_gate_fwd_kernel<<<grid_of(N * R), kThreads, 0, stream>>>(pre, w.gate_b, cat, L.ldc, d.e_col(),
                                                                    gate, u, L.ldr, N, R);
    DF_CUDA_CHECK_LAUNCH("dspark_gate_fwd_kernel");
    return;
  }
  // RNN: slot k of every block at once, rows j·B + k (stride B rows), the state carried in sp.
  float* sp = at<float>(ws, L.sp);
  float* cand = at<float>(ws, L.cand);
  float* uo = at<float>(ws, L.uo);
  zero(sp, size_t(N * R) * 4, stream);
  const int64_t ld_s = int64_t(B) * R;
  for (int k = 0; k < B; ++k) {
    gemm_launch_ex(gemm, cat + k * L.ldc, B * L.ldc, false, w.joint_w, W, true, pre + int64_t(k) * P, B * P,
                   true, nb, P, W, 1.0f, 0.0f, stream);
    const bool next = k + 1 < B;
    dspark_rnn_fwd_kernel<<<grid_of(nb * R), kThreads, 0, stream>>>(
        pre + int64_t(k) * P, B * P, w.joint_b, sp + int64_t(k) * R, next ? sp + int64_t(k + 1) * R : nullptr,
        ld_s, gate + int64_t(k) * R, cand + int64_t(k) * R, uo + int64_t(k) * R, u + k * L.ldr, B * L.ldr,
        next ? cat + (k + 1) * L.ldc : nullptr, B * L.ldc, nb, R);
    DF_CUDA_CHECK_LAUNCH("dspark_rnn_fwd_kernel");
  }
}

void dspark_markov_bwd(GemmContext* gemm, const DSparkHeadShape& d, const DSparkLayout& L,
                       const DSparkHeadWeightPtrs& w, const DSparkHeadGradPtrs& dw, float beta, void* ws,
                       cudaStream_t stream) {
  const int64_t nb = d.nb, N = L.N;
  const int B = d.B, R = d.R, W = d.cat_width(), P = d.pre_width();
  const bf16* cat = at<bf16>(ws, L.cat);
  const float* du = at<float>(ws, L.du);
  const float* gate = at<float>(ws, L.gate);
  float* dpre_f = at<float>(ws, L.dpre_f);
  bf16* dpre_b = at<bf16>(ws, L.dpre_b);
  float* din = at<float>(ws, L.din);
  const bool gated = d.markov == DSparkMarkov::gated;
  if (gated) {
    dspark_gate_bwd_kernel<<<grid_of(N * R), kThreads, 0, stream>>>(du, gate, cat, L.ldc, d.e_col(), dpre_f,
                                                                    dpre_b, at<float>(ws, L.de), N, R);
    DF_CUDA_CHECK_LAUNCH("dspark_gate_bwd_kernel");
    gemm_launch_ex(gemm, dpre_b, P, false, w.gate_w, W, false, din, L.ldc, true, N, W, P, 1.0f, 0.0f, stream);
  } else {
    const float* sp = at<float>(ws, L.sp);
    const float* cand = at<float>(ws, L.cand);
    const float* uo = at<float>(ws, L.uo);
    float* ds = at<float>(ws, L.ds);
    const int64_t ld_s = int64_t(B) * R;
    zero(ds, size_t(nb * R) * 4, stream);
    for (int k = B - 1; k >= 0; --k) {
      const int64_t kr = int64_t(k) * R;
      dspark_rnn_bwd_kernel<<<grid_of(nb * R), kThreads, 0, stream>>>(
          ds, du + kr, sp + kr, gate + kr, cand + kr, uo + kr, ld_s, dpre_f + int64_t(k) * P,
          dpre_b + int64_t(k) * P, B * P, nb, R);
      DF_CUDA_CHECK_LAUNCH("dspark_rnn_bwd_kernel");
      gemm_launch_ex(gemm, dpre_b + int64_t(k) * P, B * P, false, w.joint_w, W, false, din + k * L.ldc,
                     B * L.ldc, true, nb, W, P, 1.0f, 0.0f, stream);
      if (k == 0) break;
      dspark_rnn_carry_kernel<<<grid_of(nb * R), kThreads, 0, stream>>>(ds, gate + kr, ld_s, din + k * L.ldc,
                                                                        B * L.ldc, nb, R);
      DF_CUDA_CHECK_LAUNCH("dspark_rnn_carry_kernel");
    }
  }
  float* dW = gated ? dw.gate_w : dw.joint_w;
  float* db = gated ? dw.gate_b : dw.joint_b;
  gemm_launch_ex(gemm, dpre_b, P, true, cat, L.ldc, false, dW, W, true, P, W, N, 1.0f, beta, stream);
  dspark_colsum_launch(dpre_f, P, N, P, db, beta, at<float>(ws, L.part), stream);
}

void dspark_markov_slot(GemmContext* gemm, const DSparkHeadShape& d, const DSparkProposeLayout& L,
                        const bf16* yk, const DSparkHeadWeightPtrs& w, const int32_t* prev, bool first_slot,
                        void* ws, cudaStream_t stream) {
  const int H = d.H, R = d.R, W = d.cat_width(), P = d.pre_width();
  bf16* cat = at<bf16>(ws, L.cat);
  bf16* u = at<bf16>(ws, L.u);
  float* pre = at<float>(ws, L.pre);
  float* s = at<float>(ws, L.s);
  const bool vanilla = d.markov == DSparkMarkov::vanilla, rnn = d.markov == DSparkMarkov::rnn;
  if (rnn && first_slot) {
    zero(s, size_t(R) * 4, stream);
    zero(cat, size_t(R) * 2, stream);
  }
  dspark_gather_kernel<<<1, kThreads, 0, stream>>>(yk, H, w.markov_w1, prev, d.V, H, R, 1,
                                                   vanilla ? nullptr : cat, L.ldc, d.e_col(),
                                                   vanilla ? -1 : d.z_col(), 0, vanilla ? u : nullptr, L.ldr);
  DF_CUDA_CHECK_LAUNCH("dspark_gather_kernel");
  if (vanilla) return;
  gemm_launch_ex(gemm, cat, L.ldc, false, rnn ? w.joint_w : w.gate_w, W, true, pre, P, true, 1, P, W, 1.0f,
                 0.0f, stream);
  if (rnn) {
    dspark_rnn_fwd_kernel<<<grid_of(R), kThreads, 0, stream>>>(pre, P, w.joint_b, s, s, R, nullptr, nullptr,
                                                               nullptr, u, L.ldr, cat, L.ldc, 1, R);
    DF_CUDA_CHECK_LAUNCH("dspark_rnn_fwd_kernel");
  } else {
    dspark_gate_fwd_kernel<<<grid_of(R), kThreads, 0, stream>>>(pre, w.gate_b, cat, L.ldc, d.e_col(), nullptr,
                                                                u, L.ldr, 1, R);
    DF_CUDA_CHECK_LAUNCH("dspark_gate_fwd_kernel");
  }
}

void dspark_colsum_launch(const float* x, int64_t ld, int64_t rows, int cols, float* out, float beta,
                          float* part, cudaStream_t stream) {
  const int64_t chunks = column_partial_chunks(rows, cols), per = (rows + chunks - 1) / chunks;
  dspark_colsum_partial_kernel<<<dim3(grid_of(cols), unsigned(chunks)), kThreads, 0, stream>>>(x, ld, rows,
                                                                                               cols, per, part);
  DF_CUDA_CHECK_LAUNCH("dspark_colsum_partial_kernel");
  column_sum_launch(part, chunks, cols, out, beta, stream);
}

}  // namespace df
