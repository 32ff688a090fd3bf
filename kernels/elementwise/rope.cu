// Per-head QK RMSNorm followed by rotate-half RoPE on the first rot_dim dims, in fp32 with one rounding at
// the store (device_math.cuh's rounding policy; HF rounds the norm output, cos/sin and each RoPE term to
// bf16). The angle pos·inv_freq is formed in fp32 like HF, then sin/cos in double: fast-math sinf is wrong by
// far more than a bf16 ulp at angles of thousands of radians. Two kernels with bit-identical results: a
// register kernel for the Qwen head shapes (memory-bound, each element read once) and a shared-memory kernel
// for everything else; both also run the drafter's training forward (the same math, rstd saved, y separate
// from x). The training backward is here too, on the same angles.
#include <algorithm>

#include "core/rope_freq.h"
#include "kernels/primitives/cuda_check.cuh"
#include "kernels/primitives/device_math.cuh"
#include "kernels/launchers.cuh"

namespace df {

constexpr int kRopeWarps = 4;
constexpr int kRopeMaxHd = 512;

// Register kernel geometry: a head is held by a group of kRopeGroup adjacent lanes, lane q of the group
// holding the 16-byte chunks q, q + 4, q + 8, ... of the head. The launcher packs tokens into a block until
// it has about kRopeRegThreads threads; a block holds at most kRopeRegMaxThreads (heads ≤ 128).
constexpr int kRopeGroup = 4;
constexpr int kRopeRegThreads = 128;
constexpr int kRopeRegMaxThreads = 512;
// The backward register kernel holds x and w·RoPEᵀ·dy (12 registers per 8 dims; 96 at head dim 256), more
// than the 128 registers a 512-thread block leaves: its blocks hold at most 256 threads (heads ≤ 64).
constexpr int kRopeBwdRegMaxThreads = 256;
// dw partial kernel geometry: a thread sums 2V columns (V adjacent dims of each rotated half, so that both
// partners' dy are loaded once), with the loads of kRopeDwHeads heads of a token in flight at V ≤ 2 and
// proportionally fewer heads at V 4 and 8 (the same registers: about 210); kRopeDwThreads threads a block.
// The fixed chunking leaves chunks · hd / 2V threads (16,384 at hd 128 and 256: 4 warps an SM), so the bytes
// in flight must come from each thread: 32 heads x 4 loads x 4 bytes at hd 128.
constexpr int kRopeDwHeads = 32;
constexpr int kRopeDwThreads = 128;

// ---- kernels ----
// The cos/sin of angle j at position p: every RoPE kernel here builds its table from it, in two steps (the
// frequency, core/rope_freq.h, then the angle) so that a kernel visiting many positions forms the frequency
// once.
__device__ __forceinline__ void rope_cos_sin_at(float p, float inv_freq, float* cos_j, float* sin_j) {
  double s, c;
  sincos(static_cast<double>(p * inv_freq), &s, &c);
  *cos_j = static_cast<float>(c);
  *sin_j = static_cast<float>(s);
}
__device__ __forceinline__ void rope_cos_sin(float p, int j, int rot_dim, float theta, float* cos_j,
                                             float* sin_j) {
  rope_cos_sin_at(p, rope_inv_freq(j, rot_dim, theta), cos_j, sin_j);
}

// One rotated element: v·cos + partner·sin with the products and the sum pinned (no contraction), so the
// register and the shared-memory kernels agree bit for bit.
__device__ __forceinline__ float rope_rotate(float v, float partner, float c, float s) {
  return __fadd_rn(__fmul_rn(v, c), __fmul_rn(partner, s));
}

// The cos/sin table of a token at position pos for RoPE over rot_dim dims (rot_dim / 2 angles), built by the
// whole block in shared memory before any of its warps reads it.
__device__ __forceinline__ void rope_token_table(float* cos_t, float* sin_t, int32_t pos, int rot_dim,
                                                 float theta) {
  const float p = static_cast<float>(pos);
  for (int j = threadIdx.x; j < rot_dim / 2; j += blockDim.x) rope_cos_sin(p, j, rot_dim, theta, &cos_t[j], &sin_t[j]);
  __syncthreads();
}

// One block per token: the token's cos/sin table (rot_dim/2 angles, shared by all its heads) is built once in
// shared memory, then each warp normalises and rotates heads; a head goes through shared memory because RoPE
// pairs dim i with i + rot/2. Lane l sums the squares of dims l, l + 32, ... and warp_sum adds the lanes: the
// register kernel reproduces exactly this order. Reads x, writes y (y == x for the in-place inference call).
// rstd != nullptr (the training forward) also saves r per token and head.
__global__ void __launch_bounds__(32 * kRopeWarps)
    qk_norm_rope_kernel(const bf16* x, int64_t ld_x, bf16* y, int64_t ld_y, float* rstd, int64_t ld_rstd,
                        const float* w, const int32_t* pos, int heads, int hd, int rot_dim, float theta,
                        float eps, bool zero_centred) {
  __shared__ float buf[kRopeWarps][kRopeMaxHd];
  __shared__ float cos_t[kRopeMaxHd / 2], sin_t[kRopeMaxHd / 2];
  const int64_t t = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, half = rot_dim / 2;
  rope_token_table(cos_t, sin_t, pos[t], rot_dim, theta);
  float* nb = buf[warp];
  for (int h = warp; h < heads; h += kRopeWarps) {
    const bf16* row = x + t * ld_x + (int64_t)h * hd;
    bf16* out = y + t * ld_y + (int64_t)h * hd;
    float ss = 0.0f;
    for (int i = lane; i < hd; i += 32) {
      float v = __bfloat162float(row[i]);
      nb[i] = v;
      ss += v * v;
    }
    float r = rsqrtf(warp_sum(ss) / static_cast<float>(hd) + eps);
    if (rstd && lane == 0) rstd[t * ld_rstd + h] = r;
    for (int i = lane; i < hd; i += 32) nb[i] = rmsnorm_apply(nb[i], r, w[i], zero_centred);
    __syncwarp();
    for (int i = lane; i < hd; i += 32) {
      float v = nb[i];
      if (i < rot_dim) {
        int j = i < half ? i : i - half;
        v = rope_rotate(v, i < half ? -nb[i + half] : nb[i - half], cos_t[j], sin_t[j]);
      }
      out[i] = __float2bfloat16(v);
    }
    __syncwarp();  // nb is reused by this warp's next head
  }
}

// Training backward, one block per token and a warp per head like the forward: dz = RoPEᵀ·dy (rotation by
// −angle) in shared memory, then the RMSNorm backward dx = r·(dz·w − x̂·mean(dz·w·x̂)), x̂ = x·r.
__global__ void __launch_bounds__(32 * kRopeWarps)
    qk_norm_rope_bwd_dx_kernel(const bf16* x, int64_t ld_x, const float* w, const int32_t* pos,
                               const float* rstd, int64_t ld_rstd, const bf16* dy, int64_t ld_dy, bf16* dx,
                               int64_t ld_dx, int heads, int hd, float theta) {
  __shared__ float buf[kRopeWarps][kRopeMaxHd];
  __shared__ float cos_t[kRopeMaxHd / 2], sin_t[kRopeMaxHd / 2];
  const int64_t t = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, half = hd / 2;
  rope_token_table(cos_t, sin_t, pos[t], hd, theta);
  float* dz = buf[warp];
  for (int h = warp; h < heads; h += kRopeWarps) {
    const bf16* dyh = dy + t * ld_dy + (int64_t)h * hd;
    for (int i = lane; i < half; i += 32) {
      const float a = __bfloat162float(dyh[i]), b = __bfloat162float(dyh[i + half]);
      dz[i] = a * cos_t[i] + b * sin_t[i];
      dz[i + half] = b * cos_t[i] - a * sin_t[i];
    }
    __syncwarp();
    const bf16* xh = x + t * ld_x + (int64_t)h * hd;
    const float r = rstd[t * ld_rstd + h];
    float acc = 0.0f;
    for (int i = lane; i < hd; i += 32) acc += dz[i] * w[i] * __bfloat162float(xh[i]);
    const float m = warp_sum(acc) * r / static_cast<float>(hd);
    bf16* dxh = dx + t * ld_dx + (int64_t)h * hd;
    for (int i = lane; i < hd; i += 32) {
      const float xv = __bfloat162float(xh[i]);
      dxh[i] = __float2bfloat16(r * (dz[i] * w[i] - xv * r * m));
    }
    __syncwarp();  // dz is reused by this warp's next head
  }
}

// RoPEᵀ of the pair (a, b) = (dy_j, dy_{j+half}) at angle (c, s): dz_j = a·c + b·s, dz_{j+half} = b·c − a·s,
// each in one written-out form (an fma of one product and the other rounded), as is each dw term below
// (fma(dz, x·rstd, acc)), so that every kernel using them gets the same bits: left to the compiler a
// contraction of b·c − a·s may pick either product to fuse, differently in each kernel.
__device__ __forceinline__ float rope_dz_lo(float a, float b, float c, float s) {
  return __fmaf_rn(a, c, __fmul_rn(b, s));
}
__device__ __forceinline__ float rope_dz_hi(float a, float b, float c, float s) {
  return __fmaf_rn(b, c, -__fmul_rn(a, s));
}

// Partial ∂/∂w of token chunk k: each head dim i sums dz_i·x̂_i over the chunk's tokens in order and, inside
// a token, over heads in order, into partial[k·hd + i] (column_sum_launch adds the chunks); 2V columns per
// thread: dims [V·g, V·g + V) and their RoPE partners half further on, with 2V-byte loads (a warp reads
// 32·V·2 contiguous bytes of each half-head row). Any V gives the same fp32 chain per column, with the same
// rope_cos_sin and the same expressions (so the same contractions). Thread (chunk k, group g)
// is flattened over the grid: with half / V = 32 a warp is one chunk. The loads of U heads are issued before
// their terms are added: one thread per chain leaves few threads, and the bytes in flight must come from
// each.
template <int V, int U>
__global__ void __launch_bounds__(kRopeDwThreads)
    qk_norm_rope_bwd_dw_vec_kernel(const bf16* x, int64_t ld_x, const int32_t* __restrict__ pos,
                                   const float* __restrict__ rstd, int64_t ld_rstd, const bf16* dy,
                                   int64_t ld_dy, int64_t T, int heads, int hd, float theta, int64_t R,
                                   int64_t chunks, float* partial) {
  const int half = hd / 2, groups = half / V;
  const int64_t tid = blockIdx.x * (int64_t)blockDim.x + threadIdx.x, k = tid / groups;
  if (k >= chunks) return;
  const int j0 = static_cast<int>(tid % groups) * V;
  const int64_t t1 = T < (k + 1) * R ? T : (k + 1) * R;
  float inv_freq[V], acc_lo[V] = {}, acc_hi[V] = {};
#pragma unroll
  for (int j = 0; j < V; ++j) inv_freq[j] = rope_inv_freq(j0 + j, hd, theta);
  for (int64_t t = k * R; t < t1; ++t) {
    const bf16* xt = x + t * ld_x + j0;
    const bf16* dyt = dy + t * ld_dy + j0;
    float c[V], s[V];
    for (int h0 = 0; h0 < heads; h0 += U) {
      bf16_bits_t<V> xl[U], xh[U], al[U], bh[U];
      float rs[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (h0 + u >= heads) break;
        const int64_t o = int64_t(h0 + u) * hd;
        xl[u] = load_bf16_bits<V>(xt + o);
        xh[u] = load_bf16_bits<V>(xt + o + half);
        al[u] = load_bf16_bits<V>(dyt + o);
        bh[u] = load_bf16_bits<V>(dyt + o + half);
        rs[u] = rstd[t * ld_rstd + h0 + u];
      }
      if (h0 == 0) {  // the token's angles, while its first heads' loads are in flight
        const float p = static_cast<float>(pos[t]);
#pragma unroll
        for (int j = 0; j < V; ++j) rope_cos_sin_at(p, inv_freq[j], &c[j], &s[j]);
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (h0 + u >= heads) break;
        float vl[V], vh[V], a[V], b[V];
        unpack_bf16<V>(xl[u], vl);
        unpack_bf16<V>(xh[u], vh);
        unpack_bf16<V>(al[u], a);
        unpack_bf16<V>(bh[u], b);
#pragma unroll
        for (int j = 0; j < V; ++j) {
          acc_lo[j] = __fmaf_rn(rope_dz_lo(a[j], b[j], c[j], s[j]), __fmul_rn(vl[j], rs[u]), acc_lo[j]);
          acc_hi[j] = __fmaf_rn(rope_dz_hi(a[j], b[j], c[j], s[j]), __fmul_rn(vh[j], rs[u]), acc_hi[j]);
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < V; ++j) {
    partial[k * hd + j0 + j] = acc_lo[j];
    partial[k * hd + half + j0 + j] = acc_hi[j];
  }
}

// The register kernels' layout (qk_norm_rope_reg_kernel, qk_norm_rope_bwd_dx_reg_kernel): a block holds
// tokens_per_block token slots of heads · kRopeGroup threads, rounded up to whole warps; thread → (slot, head
// h, group lane q), token t = t0 + slot, active unless the slot lies past the block's tokens or past T.
struct RopeRegLane {
  int slot, h, q;
  int64_t t0, t;
  bool active;
};
__device__ __forceinline__ RopeRegLane rope_reg_lane(int heads, int tokens_per_block, int64_t T) {
  RopeRegLane l;
  const int per_token = heads * kRopeGroup;
  l.slot = threadIdx.x / per_token;
  l.h = (threadIdx.x % per_token) / kRopeGroup;
  l.q = threadIdx.x % kRopeGroup;
  l.t0 = int64_t(blockIdx.x) * tokens_per_block;
  l.t = l.t0 + l.slot;
  l.active = l.slot < tokens_per_block && l.t < T;
  return l;
}

// The block's cos/sin table in shared memory: per token slot s, HALF cos then HALF sin at table[s · STRIDE].
template <int HALF, int STRIDE>
__device__ __forceinline__ void rope_table_fill(float* table, const int32_t* pos, int64_t t0, int64_t T,
                                                int tokens_per_block, int rot_dim, float theta) {
  for (int e = threadIdx.x; e < tokens_per_block * HALF; e += blockDim.x) {
    const int s = e / HALF, j = e % HALF;
    if (t0 + s < T)
      rope_cos_sin(static_cast<float>(pos[t0 + s]), j, rot_dim, theta, &table[s * STRIDE + j],
                   &table[s * STRIDE + HALF + j]);
  }
}

// The training backward for HD in {64, 128, 256} (rot_dim = hd): the layout of qk_norm_rope_reg_kernel (a
// group of kRopeGroup lanes per head, lane q holding chunks q, q + 4, ...; chunk k's RoPE partner k + HD/64
// in the same lane), x and dy read once with 16-byte loads, x held as raw bf16 and dy turned into w·RoPEᵀ·dy
// in fp32 until dx is stored with 16-byte stores. The math of qk_norm_rope_bwd_dx_kernel but for the order of
// the fp32 sum behind m (per-lane partials, then the group's two shuffles). Every thread reaches the
// shuffles: the inactive ones (the block rounded up to whole warps, tokens past T) hold zeros and read token
// slot 0's table.
template <int HD>
__global__ void __launch_bounds__(kRopeBwdRegMaxThreads)
    qk_norm_rope_bwd_dx_reg_kernel(const bf16* x, int64_t ld_x, const float* __restrict__ w,
                                   const int32_t* __restrict__ pos, const float* __restrict__ rstd,
                                   int64_t ld_rstd, const bf16* dy, int64_t ld_dy, bf16* dx, int64_t ld_dx,
                                   int64_t T, int heads, int hd, int tokens_per_block, float theta) {
  constexpr int K = HD / 32;   // chunks per lane
  constexpr int KH = HD / 64;  // chunks per lane in the first half; the partner of chunk k is k + KH
  constexpr int HALF = HD / 2;
  extern __shared__ float4 rope_table_raw[];  // per token slot: HALF cos then HALF sin
  float* table = reinterpret_cast<float*>(rope_table_raw);
  const RopeRegLane l = rope_reg_lane(heads, tokens_per_block, T);
  const int slot = l.slot, h = l.h, q = l.q;
  const int64_t t = l.t;
  const bool active = l.active;
  const int64_t off = int64_t(h) * HD;
  uint4 ux[K], ud[K];
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int e = (q + kRopeGroup * k) * 8;
    ux[k] = active ? *reinterpret_cast<const uint4*>(x + t * ld_x + off + e) : make_uint4(0, 0, 0, 0);
    ud[k] = active ? *reinterpret_cast<const uint4*>(dy + t * ld_dy + off + e) : make_uint4(0, 0, 0, 0);
  }
  const float r = active ? rstd[t * ld_rstd + h] : 0.0f;
  rope_table_fill<HALF, HD>(table, pos, l.t0, T, tokens_per_block, hd, theta);
  __syncthreads();  // the table is complete
  const float* cos_t = table + (active ? slot : 0) * HD;
  const float* sin_t = cos_t + HALF;
  // Eight fp32 from p (16-byte aligned).
  auto eight = [](const float* p, float(&v)[8]) {
    const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  };
  // dzw = w·RoPEᵀ·dy, the only form of dy both the mean and dx use: it replaces the raw dy in registers.
  float dzw[K][8];
  float acc = 0.0f;
#pragma unroll
  for (int k = 0; k < KH; ++k) {
    const int j0 = (q + kRopeGroup * k) * 8;
    float a[8], b[8], cs[8], sn[8], w_lo[8], w_hi[8], v_lo[8], v_hi[8];
    bf16x8_unpack(ud[k], a);
    bf16x8_unpack(ud[k + KH], b);
    eight(cos_t + j0, cs);
    eight(sin_t + j0, sn);
    eight(w + j0, w_lo);
    eight(w + HALF + j0, w_hi);
    bf16x8_unpack(ux[k], v_lo);
    bf16x8_unpack(ux[k + KH], v_hi);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float dz_lo = a[j] * cs[j] + b[j] * sn[j], dz_hi = b[j] * cs[j] - a[j] * sn[j];
      dzw[k][j] = dz_lo * w_lo[j];
      dzw[k + KH][j] = dz_hi * w_hi[j];
      acc += dzw[k][j] * v_lo[j];
      acc += dzw[k + KH][j] * v_hi[j];
    }
  }
  acc += __shfl_xor_sync(0xffffffffu, acc, 1);
  acc += __shfl_xor_sync(0xffffffffu, acc, 2);
  const float m = acc * r / static_cast<float>(hd);
  if (!active) return;
  uint4* dxh = reinterpret_cast<uint4*>(dx + t * ld_dx + off);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    float v[8], g[8];
    bf16x8_unpack(ux[k], v);
#pragma unroll
    for (int j = 0; j < 8; ++j) g[j] = r * (dzw[k][j] - v[j] * r * m);
    dxh[q + kRopeGroup * k] = bf16x8_pack(g);
  }
}

// Register kernel for HD in {64, 128, 256} and ROT a multiple of 64: every chunk a lane holds and its RoPE
// partner (ROT/2 dims = ROT/64 of the lane's chunks further on) sit in the same lane, so nothing but the sum
// of squares crosses lanes. All loads are issued before the cos/sin table is built, and the head's raw bf16
// stay in registers until the store. Sum of squares in the order of qk_norm_rope_kernel: its lane l = 8·q + j
// sums dims l, l + 32, ... = element j of chunks q, q + 4, ..., which is a[j] of group lane q here; its
// warp_sum steps xor 16 and xor 8 become shuffles with group lanes q^2 and q^1, steps xor 4, 2, 1 pair the
// a[j]. hd and rot_dim also come at run time so the divisions compile to the fallback's instructions. Reads
// x, writes y (y == x in place for inference); rstd != nullptr (the training forward) also saves r per token
// and head.
template <int HD, int ROT>
__global__ void __launch_bounds__(kRopeRegMaxThreads)
    qk_norm_rope_reg_kernel(const bf16* x, int64_t ld_x, bf16* y, int64_t ld_y, float* rstd, int64_t ld_rstd,
                            const float* __restrict__ w, const int32_t* __restrict__ pos, int64_t T,
                            int heads, int hd, int rot_dim, int tokens_per_block, float theta, float eps,
                            bool zero_centred) {
  constexpr int K = HD / 32;    // chunks per lane
  constexpr int KH = ROT / 64;  // chunks per lane in the first rotated half; the partner of chunk k is k + KH
  constexpr int HALF = ROT / 2;
  extern __shared__ float4 rope_table_raw[];  // per token slot: HALF cos then HALF sin
  float* table = reinterpret_cast<float*>(rope_table_raw);
  const RopeRegLane l = rope_reg_lane(heads, tokens_per_block, T);
  const int slot = l.slot, h = l.h, q = l.q;
  const int64_t t = l.t;
  const bool active = l.active;
  const bf16* row = x + t * ld_x + int64_t(h) * HD;
  uint4 u[K];
#pragma unroll
  for (int k = 0; k < K; ++k)
    u[k] = active ? *reinterpret_cast<const uint4*>(row + (q + kRopeGroup * k) * 8) : make_uint4(0, 0, 0, 0);
  rope_table_fill<HALF, ROT>(table, pos, l.t0, T, tokens_per_block, rot_dim, theta);
  float a[8] = {};
#pragma unroll
  for (int k = 0; k < K; ++k) {
    float v[8];
    bf16x8_unpack(u[k], v);
#pragma unroll
    for (int j = 0; j < 8; ++j) a[j] += v[j] * v[j];
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) a[j] += __shfl_xor_sync(0xffffffffu, a[j], 2);
#pragma unroll
  for (int j = 0; j < 8; ++j) a[j] += __shfl_xor_sync(0xffffffffu, a[j], 1);
#pragma unroll
  for (int o = 4; o > 0; o >>= 1)
#pragma unroll
    for (int j = 0; j < o; ++j) a[j] = a[j] + a[j + o];
  const float r = rsqrtf(a[0] / static_cast<float>(hd) + eps);
  __syncthreads();  // the table is complete
  if (!active) return;
  if (rstd && q == 0) rstd[t * ld_rstd + h] = r;
  float n[K][8];  // the fp32 norm output RoPE reads, as nb in the fallback
#pragma unroll
  for (int k = 0; k < K; ++k) rmsnorm_apply8_f32(u[k], w + 8 * (q + kRopeGroup * k), r, zero_centred, n[k]);
  const float* cos_t = table + slot * ROT;
  const float* sin_t = cos_t + HALF;
#pragma unroll
  for (int k = 0; k < KH; ++k) {
    // Angle of the chunk's first dim; its partner chunk k + KH uses the same angles.
    const int j0 = (q + kRopeGroup * k) * 8;
    const float4 c0 = *reinterpret_cast<const float4*>(cos_t + j0),
                 c1 = *reinterpret_cast<const float4*>(cos_t + j0 + 4);
    const float4 s0 = *reinterpret_cast<const float4*>(sin_t + j0),
                 s1 = *reinterpret_cast<const float4*>(sin_t + j0 + 4);
    const float cs[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
    const float sn[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
    float y_lo[8], y_hi[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      y_lo[j] = rope_rotate(n[k][j], -n[k + KH][j], cs[j], sn[j]);
      y_hi[j] = rope_rotate(n[k + KH][j], n[k][j], cs[j], sn[j]);
    }
    u[k] = bf16x8_pack(y_lo);
    u[k + KH] = bf16x8_pack(y_hi);
  }
#pragma unroll
  for (int k = 2 * KH; k < K; ++k) u[k] = bf16x8_pack(n[k]);  // the dims past rot_dim: the norm alone
  bf16* out = y + t * ld_y + int64_t(h) * HD;
#pragma unroll
  for (int k = 0; k < K; ++k) *reinterpret_cast<uint4*>(out + (q + kRopeGroup * k) * 8) = u[k];
}

// ---- launchers ----
// The register kernels' grid (RopeRegLane): kRopeRegThreads threads' worth of token slots a block, at least
// one and at most T, the block rounded up to whole warps; a cos/sin table of rot_dim floats a slot.
struct RopeRegGrid {
  int tokens_per_block;
  unsigned threads, blocks;
  size_t smem;
};
static RopeRegGrid rope_reg_grid(int64_t T, int heads, int rot_dim) {
  const int per_token = heads * kRopeGroup;
  RopeRegGrid g;
  g.tokens_per_block = static_cast<int>(std::min<int64_t>(std::max(1, kRopeRegThreads / per_token), T));
  g.threads = static_cast<unsigned>((g.tokens_per_block * per_token + 31) / 32 * 32);
  g.blocks = static_cast<unsigned>((T + g.tokens_per_block - 1) / g.tokens_per_block);
  g.smem = size_t(g.tokens_per_block) * rot_dim * sizeof(float);
  return g;
}
using RopeRegKernel = decltype(&qk_norm_rope_reg_kernel<128, 128>);

// The register kernel instantiated for (hd, rot_dim), or nullptr: Qwen3 (128, 128), Qwen3.5/3.6 (256, 64)
// and the neighbouring shapes.
static RopeRegKernel rope_reg_kernel_for(int hd, int rot_dim) {
  struct Variant {
    int hd, rot;
    RopeRegKernel fn;
  };
  static constexpr Variant kVariants[] = {
      {64, 64, qk_norm_rope_reg_kernel<64, 64>},     {128, 64, qk_norm_rope_reg_kernel<128, 64>},
      {128, 128, qk_norm_rope_reg_kernel<128, 128>}, {256, 64, qk_norm_rope_reg_kernel<256, 64>},
      {256, 128, qk_norm_rope_reg_kernel<256, 128>}, {256, 256, qk_norm_rope_reg_kernel<256, 256>}};
  for (const Variant& v : kVariants)
    if (v.hd == hd && v.rot == rot_dim) return v.fn;
  return nullptr;
}

using RopeBwdRegKernel = decltype(&qk_norm_rope_bwd_dx_reg_kernel<128>);

// The backward register kernel for head dim hd, or nullptr.
static RopeBwdRegKernel rope_bwd_reg_kernel_for(int hd) {
  switch (hd) {
    case 64:
      return qk_norm_rope_bwd_dx_reg_kernel<64>;
    case 128:
      return qk_norm_rope_bwd_dx_reg_kernel<128>;
    case 256:
      return qk_norm_rope_bwd_dx_reg_kernel<256>;
    default:
      return nullptr;
  }
}

void qk_norm_rope_launch(bf16* x, int64_t ld_x, const float* w, const int32_t* pos, int64_t T, int heads,
                         int hd, int rot_dim, float theta, float eps, bool zero_centred,
                         cudaStream_t stream) {
  if (T == 0 || heads == 0) return;
  if (hd > kRopeMaxHd || rot_dim > hd || rot_dim % 2 != 0)
    cuda_throw("qk_norm_rope_launch", "head_dim must be <= 512 and rot_dim even and <= head_dim", __FILE__,
               __LINE__);
  auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const RopeRegKernel reg = rope_reg_kernel_for(hd, rot_dim);
  const int per_token = heads * kRopeGroup;
  if (reg && al(x) && ld_x % 8 == 0 && al(w) && per_token <= kRopeRegMaxThreads) {
    const RopeRegGrid g = rope_reg_grid(T, heads, rot_dim);
    reg<<<g.blocks, g.threads, g.smem, stream>>>(x, ld_x, x, ld_x, nullptr, 0, w, pos, T, heads, hd, rot_dim,
                                                 g.tokens_per_block, theta, eps, zero_centred);
    DF_CUDA_CHECK_LAUNCH("qk_norm_rope_reg_kernel");
    return;
  }
  qk_norm_rope_kernel<<<static_cast<unsigned>(T), 32 * kRopeWarps, 0, stream>>>(
      x, ld_x, x, ld_x, nullptr, 0, w, pos, heads, hd, rot_dim, theta, eps, zero_centred);
  DF_CUDA_CHECK_LAUNCH("qk_norm_rope_kernel");
}

static void rope_train_check(int hd, const char* who) {
  if (hd <= 0 || hd > kRopeMaxHd || hd % 2 != 0)
    cuda_throw(who, "head_dim must be even and in [2, 512]", __FILE__, __LINE__);
}

void qk_norm_rope_fwd_launch(const bf16* x, int64_t ld_x, const float* w, const int32_t* pos, bf16* y,
                             int64_t ld_y, float* rstd, int64_t ld_rstd, int64_t T, int heads, int hd,
                             float theta, float eps, cudaStream_t stream) {
  if (T == 0 || heads == 0) return;
  rope_train_check(hd, "qk_norm_rope_fwd_launch");
  // The register kernel where the shapes allow (bit-identical to the shared-memory one).
  auto al = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const RopeRegKernel reg = rope_reg_kernel_for(hd, hd);
  if (reg && al(x) && al(y) && al(w) && ld_x % 8 == 0 && ld_y % 8 == 0 &&
      heads * kRopeGroup <= kRopeRegMaxThreads) {
    const RopeRegGrid g = rope_reg_grid(T, heads, hd);
    reg<<<g.blocks, g.threads, g.smem, stream>>>(x, ld_x, y, ld_y, rstd, ld_rstd, w, pos, T, heads, hd, hd,
                                                 g.tokens_per_block, theta, eps, false);
    DF_CUDA_CHECK_LAUNCH("qk_norm_rope_reg_kernel (training forward)");
    return;
  }
  qk_norm_rope_kernel<<<static_cast<unsigned>(T), 32 * kRopeWarps, 0, stream>>>(
      x, ld_x, y, ld_y, rstd, ld_rstd, w, pos, heads, hd, hd, theta, eps, false);
  DF_CUDA_CHECK_LAUNCH("qk_norm_rope_kernel (training forward)");
}

void qk_norm_rope_bwd_launch(const bf16* x, int64_t ld_x, const float* w, const int32_t* pos,
                             const float* rstd, int64_t ld_rstd, const bf16* dy, int64_t ld_dy, bf16* dx,
                             int64_t ld_dx, float* dw, float beta_dw, int64_t T, int heads, int hd,
                             float theta, void* ws, size_t ws_bytes, cudaStream_t stream) {
  if (T == 0 || heads == 0) {
    // No rows: ∂/∂w is 0, but a step's first write (beta_dw 0) must still replace the stale dw.
    if (beta_dw != 1.0f) column_sum_launch(nullptr, 0, hd, dw, beta_dw, stream);
    return;
  }
  rope_train_check(hd, "qk_norm_rope_bwd_launch");
  if (ws_bytes < qk_norm_rope_bwd_workspace_bytes(T, hd))
    cuda_throw("qk_norm_rope_bwd_launch", "workspace smaller than qk_norm_rope_bwd_workspace_bytes", __FILE__,
               __LINE__);
  auto al = [](const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  const RopeBwdRegKernel reg = rope_bwd_reg_kernel_for(hd);
  const int per_token = heads * kRopeGroup;
  if (reg && al(x, 16) && al(dy, 16) && al(dx, 16) && al(w, 16) && ld_x % 8 == 0 && ld_dy % 8 == 0 &&
      ld_dx % 8 == 0 && per_token <= kRopeBwdRegMaxThreads) {
    const RopeRegGrid g = rope_reg_grid(T, heads, hd);
    reg<<<g.blocks, g.threads, g.smem, stream>>>(x, ld_x, w, pos, rstd, ld_rstd, dy, ld_dy, dx, ld_dx, T,
                                                 heads, hd, g.tokens_per_block, theta);
    DF_CUDA_CHECK_LAUNCH("qk_norm_rope_bwd_dx_reg_kernel");
  } else {
    qk_norm_rope_bwd_dx_kernel<<<static_cast<unsigned>(T), 32 * kRopeWarps, 0, stream>>>(
        x, ld_x, w, pos, rstd, ld_rstd, dy, ld_dy, dx, ld_dx, heads, hd, theta);
    DF_CUDA_CHECK_LAUNCH("qk_norm_rope_bwd_dx_kernel");
  }
  const int64_t chunks = column_partial_chunks(T, hd), R = (T + chunks - 1) / chunks;
  float* partial = static_cast<float*>(ws);
  // V adjacent dims per half: the widest that the layout allows and that still gives a chunk a warp of
  // threads (half / V ≥ 32), so hd 64, 128, 256 take V = 1, 2, 4; any even hd works with V = 1.
  const int half = hd / 2;
  auto fits = [&](int v) {
    return half % v == 0 && half / v >= 32 && ld_x % v == 0 && ld_dy % v == 0 && al(x, 2 * v) && al(dy, 2 * v);
  };
  const int v = fits(8) ? 8 : fits(4) ? 4 : fits(2) ? 2 : 1;
  const int64_t threads = chunks * (half / v);
  const unsigned blocks = static_cast<unsigned>((threads + kRopeDwThreads - 1) / kRopeDwThreads);
  const auto kernel = v == 8   ? qk_norm_rope_bwd_dw_vec_kernel<8, kRopeDwHeads / 4>
                      : v == 4 ? qk_norm_rope_bwd_dw_vec_kernel<4, kRopeDwHeads / 2>
                      : v == 2 ? qk_norm_rope_bwd_dw_vec_kernel<2, kRopeDwHeads>
                               : qk_norm_rope_bwd_dw_vec_kernel<1, kRopeDwHeads>;
  kernel<<<blocks, kRopeDwThreads, 0, stream>>>(x, ld_x, pos, rstd, ld_rstd, dy, ld_dy, T, heads, hd, theta, R,
                                                chunks, partial);
  DF_CUDA_CHECK_LAUNCH("qk_norm_rope_bwd_dw_vec_kernel");
  column_sum_launch(partial, chunks, hd, dw, beta_dw, stream);
}

}  // namespace df
