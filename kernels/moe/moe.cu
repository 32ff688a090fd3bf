// The MoE MLP on the device. Grouped GEMM: cuBLAS 13.1 (this toolkit) has no cuBLASLt grouped mode with group
// sizes read on the device, and cublasGemmGroupedBatchedEx takes them from the host, which would cost a
// stream sync per layer. So each expert's pairs are padded to whole tiles of `rows` rows, and the tiles run
// as one cuBLASLt pointer-array batched GEMM whose A/B/C addresses a kernel writes: the batch count is the
// host's upper bound on the tiles (moe_plan_tiles), and bound tiles past the real ones recompute tile 0's
// rows into their own scratch rows, which nothing reads. The routing weights are applied in the combine,
// which also adds the shared expert and the residual in one pass.
#include <algorithm>

#include "core/torch_topk.h"
#include "kernels/gemm/gemm.cuh"
#include "kernels/launchers.cuh"
#include "kernels/moe/moe.cuh"
#include "kernels/primitives/cuda_check.cuh"
#include "kernels/primitives/device_math.cuh"

namespace df {

namespace {

using bf16 = __nv_bfloat16;

// ---- kernels ---------------------------------------------------------------------------------------------

// Top-k sizes the router's shortcut handles in a per-thread array (topk_unique); larger k always takes the
// full ordering.
constexpr int kRouteFastK = 16;

// One thread per token: softmax of its logits in fp32 (exp in double, rounded to float, so the probabilities
// are those of the CPU's expf up to its last-bit error), the top k in torch.topk's order, the k weights. A
// row whose top k is unique (no tie, no NaN: nearly all) takes topk_unique's single pass; the others write
// their (p, e) pairs and reorder them as torch does (topk_torch_order).
__global__ void moe_route_kernel(const float* logits, int64_t ldl, TopkPair* pairs, int64_t T, int E, int k,
                                 bool renorm, int32_t* ids, int64_t ld_ids, float* w, int64_t ld_w) {
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= T) return;
  const float* l = logits + t * ldl;
  float mx = l[0];
  for (int e = 1; e < E; ++e)
    if (mx < l[e]) mx = l[e];  // std::max_element's rule
  float sum = 0.0f;
  for (int e = 0; e < E; ++e) sum += float(exp(double(l[e] - mx)));
  auto prob = [&](int e) { return __fdiv_rn(float(exp(double(l[e] - mx))), sum); };
  TopkPair fast[kRouteFastK + 1];
  const TopkPair* top = fast;
  if (k > kRouteFastK || !topk_unique(E, k, prob, fast)) {
    TopkPair* q = pairs + t * E;
    for (int e = 0; e < E; ++e) q[e] = TopkPair{prob(e), e};
    topk_torch_order(q, E, k);
    top = q;
  }
  float top_sum = 0.0f;
  for (int j = 0; j < k; ++j) top_sum += top[j].v;
  for (int j = 0; j < k; ++j) {
    ids[t * ld_ids + j] = top[j].i;
    w[t * ld_w + j] = renorm ? __fdiv_rn(top[j].v, top_sum) : top[j].v;
  }
}

// Block c: how many of chunk c's pairs picked each expert, hist[c, e].
__global__ void moe_hist_kernel(const int32_t* ids, int64_t ld_ids, int64_t T, int k, int E, int32_t* hist) {
  extern __shared__ int32_t cnt[];
  for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
  __syncthreads();
  const int64_t t0 = int64_t(blockIdx.x) * kMoeChunkTokens, t1 = min(T, t0 + kMoeChunkTokens);
  const int64_t n = (t1 - t0) * k;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int e = ids[(t0 + i / k) * ld_ids + i % k];
    if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) hist[int64_t(blockIdx.x) * E + e] = cnt[e];
}

// One block: per expert the exclusive prefix of hist over chunks (in place) and its padded row range start[e]
// .. start[e + 1], then the two grouped GEMMs' addresses per tile (a1 nullptr: none, the FP8 path) and each
// tile's expert (tile_expert nullptr: none). Tile i covers rows [i·rows, (i+1)·rows) of xs and gu; a tile
// past the last real one reads tile 0's rows with expert 0's weights and writes its own rows.
__global__ void moe_plan_kernel(int32_t* hist, int64_t chunks, int E, int rows, int64_t tiles, int32_t* start,
                                const bf16* xs, bf16* gu, bf16* ys, const bf16* gate_up, const bf16* down,
                                int64_t H, int I, const void** a1, const void** w1, void** c1,
                                const void** a2, const void** w2, void** c2, int32_t* tile_expert) {
  extern __shared__ int32_t s_start[];  // E + 1
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int32_t run = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      int32_t* h = hist + c * E + e;
      const int32_t v = *h;
      *h = run;
      run += v;
    }
    s_start[e + 1] = (run + rows - 1) / rows * rows;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    s_start[0] = 0;
    for (int e = 0; e < E; ++e) s_start[e + 1] += s_start[e];
  }
  __syncthreads();
  for (int e = threadIdx.x; e <= E; e += blockDim.x) start[e] = s_start[e];
  const int64_t used = s_start[E];
  for (int64_t i = threadIdx.x; i < tiles; i += blockDim.x) {
    const int64_t r0 = i * rows;
    int e = 0;
    if (r0 <
        used) {  // the expert whose rows hold r0: the last e with start[e] <= r0 (empty experts have none)
      int lo = 0, hi = E;  // s_start[lo] <= r0 < s_start[hi]
      while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (s_start[mid] <= r0)
          lo = mid;
        else
          hi = mid;
      }
      e = lo;
    }
    if (tile_expert) tile_expert[i] = e;
    if (!a1) continue;
    a1[i] = xs + (r0 < used ? r0 : 0) * H;
    w1[i] = gate_up + int64_t(e) * 2 * I * H;
    c1[i] = gu + r0 * 2 * I;
    a2[i] = gu + r0 * 2 * I;
    w2[i] = down + int64_t(e) * H * I;
    c2[i] = ys + r0 * H;
  }
}

// One warp per chunk, tokens in order: each pair's grouped row (expert e's next free row); lanes of one token
// that name the same expert take consecutive rows in slot order, as the CPU oracle's counting sort does.
__global__ void moe_place_kernel(const int32_t* ids, int64_t ld_ids, int64_t T, int k, int E,
                                 const int32_t* hist, const int32_t* start, int32_t* row_token,
                                 int32_t* pair_row) {
  extern __shared__ int32_t next[];  // E
  const int64_t c = blockIdx.x;
  const unsigned lane = threadIdx.x;
  for (int e = lane; e < E; e += 32) next[e] = start[e] + hist[c * E + e];
  __syncwarp();
  const int64_t t0 = c * kMoeChunkTokens, t1 = min(T, t0 + kMoeChunkTokens);
  for (int64_t t = t0; t < t1; ++t) {
    for (int j0 = 0; j0 < k; j0 += 32) {
      const int j = j0 + int(lane);
      const int e = j < k ? ids[t * ld_ids + j] : -1;
      const bool valid = e >= 0 && e < E;
      const unsigned same = __match_any_sync(0xffffffffu, valid ? e : -1);
      const int base = valid ? next[e] : 0;
      __syncwarp();
      if (valid && int(lane) == __ffs(same) - 1) next[e] = base + __popc(same);
      __syncwarp();
      if (j < k) {
        const int32_t p = valid ? base + __popc(same & ((1u << lane) - 1u)) : -1;
        pair_row[t * k + j] = p;
        if (valid) row_token[p] = int32_t(t);
      }
    }
  }
}

// xs[p] = x[row_token[p]] (zeros for padding) for the grouped rows p < start[E]; V bf16 per access.
template <int V>
__global__ void moe_gather_kernel(const bf16* x, int64_t ldx, const int32_t* row_token, const int32_t* start,
                                  int E, int64_t H, bf16* xs) {
  const int64_t used = start[E];
  for (int64_t p = blockIdx.y; p < used; p += gridDim.y) {
    const int32_t t = row_token[p];
    for (int64_t c = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * V; c < H;
         c += int64_t(gridDim.x) * blockDim.x * V) {
      float v[V];
      if (t >= 0)
        load_bf16<V>(x + t * ldx + c, v);
      else
        for (int i = 0; i < V; ++i) v[i] = 0.0f;
      store_bf16<V>(xs + p * H + c, v);
    }
  }
}

// In place on rows p < min(rows, *used) (used nullptr: all rows): gu[p, i] = silu(gu[p, i]) · gu[p, I + i].
__global__ void moe_swiglu_kernel(bf16* gu, int64_t ld, int64_t rows, int I, const int32_t* used) {
  const int64_t n = used ? min(rows, int64_t(*used)) : rows;
  for (int64_t p = blockIdx.y; p < n; p += gridDim.y) {
    bf16* r = gu + p * ld;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < I; i += gridDim.x * blockDim.x)
      r[i] = __float2bfloat16_rn(swiglu_f32(__bfloat162float(r[i]), __bfloat162float(r[I + i])));
  }
}

// Block t: out[t] = bf16(out[t] + Σ_j w[t, j]·ys[pair_row[t, j]] (ascending expert, then slot) + sigmoid(x[t]
// · sgate)·sy[t]), fp32 inside; sy nullptr: no shared expert. V columns per access.
template <int V>
__global__ void moe_combine_kernel(const bf16* x, int64_t ldx, const int32_t* ids, int64_t ld_ids,
                                   const float* w, int64_t ld_w, const int32_t* pair_row, int k, int E,
                                   const bf16* ys, int64_t H, const bf16* sy, const bf16* sgate, bf16* out,
                                   int64_t ldo) {
  extern __shared__ int32_t order[];  // k slots
  __shared__ int n_order;
  const int64_t t = blockIdx.x;
  const int32_t* id = ids + t * ld_ids;
  if (threadIdx.x == 0) {
    int n = 0;
    for (int j = 0; j < k; ++j) {
      const int e = id[j];
      if (e < 0 || e >= E) continue;
      int at = n++;
      for (; at > 0 && id[order[at - 1]] > e; --at) order[at] = order[at - 1];
      order[at] = j;
    }
    n_order = n;
  }
  float gate = 0.0f;
  if (sy) {
    float part = 0.0f;
    for (int64_t c = threadIdx.x; c < H; c += blockDim.x)
      part += __bfloat162float(x[t * ldx + c]) * __bfloat162float(sgate[c]);
    gate = sigmoid_f32(block_sum(part));
  }
  __syncthreads();
  const int n = n_order;
  for (int64_t c = int64_t(threadIdx.x) * V; c < H; c += int64_t(blockDim.x) * V) {
    float acc[V] = {};
    for (int s = 0; s < n; ++s) {
      const int j = order[s];
      const float wt = w[t * ld_w + j];
      float y[V];
      load_bf16<V>(ys + int64_t(pair_row[t * k + j]) * H + c, y);
      for (int i = 0; i < V; ++i) acc[i] += y[i] * wt;
    }
    if (sy) {
      float y[V];
      load_bf16<V>(sy + t * H + c, y);
      for (int i = 0; i < V; ++i) acc[i] += gate * y[i];
    }
    float o[V];
    load_bf16<V>(out + t * ldo + c, o);
    for (int i = 0; i < V; ++i) o[i] += acc[i];
    store_bf16<V>(out + t * ldo + c, o);
  }
}

// Grid rows for the per-row kernels: one block row per row up to the grid's limit, the rest strided.
unsigned row_grid(int64_t rows) {
  return unsigned(std::max<int64_t>(1, std::min<int64_t>(rows, 65535)));
}

}  // namespace

int moe_gemm_align(const void* xs, const void* gu, const void* gate_up, const void* down, int64_t rows,
                   const MoeDims& d) {
  const uint64_t H = uint64_t(d.H), I = uint64_t(d.I), r = uint64_t(rows), b = sizeof(bf16);
  return std::min({gemm_align_of(reinterpret_cast<uintptr_t>(xs)),
                   gemm_align_of(reinterpret_cast<uintptr_t>(gu)),
                   gemm_align_of(reinterpret_cast<uintptr_t>(gate_up)),
                   gemm_align_of(reinterpret_cast<uintptr_t>(down)), gemm_align_of(r * H * b),
                   gemm_align_of(r * 2 * I * b), gemm_align_of(2 * I * H * b), gemm_align_of(H * I * b)});
}

void moe_route_launch(GemmContext* gemm, const bf16* x, int64_t ldx, const bf16* router, int64_t ld_router,
                      int64_t T, const MoeDims& d, int32_t* ids, int64_t ld_ids, float* weights, int64_t ld_w,
                      void* ws, size_t ws_bytes, cudaStream_t stream) {
  if (T == 0) return;
  const MoeRouteLayout l = moe_route_layout(T, d);
  DF_CHECK(ws && ws_bytes >= l.bytes, "moe_route: workspace of %zu bytes, %zu needed for %lld tokens",
           ws ? ws_bytes : size_t(0), l.bytes, (long long)T);
  char* base = static_cast<char*>(ws);
  float* logits = reinterpret_cast<float*>(base + l.logits);
  gemm_launch(gemm, x, ldx, router, ld_router, logits, moe_logits_ld(d.E), true, T, d.E, d.H, 0.0f, stream);
  const unsigned blocks = unsigned((T + 127) / 128);
  moe_route_kernel<<<blocks, 128, 0, stream>>>(logits, moe_logits_ld(d.E),
                                               reinterpret_cast<TopkPair*>(base + l.pairs), T, d.E, d.k,
                                               d.renorm, ids, ld_ids, weights, ld_w);
  DF_CUDA_CHECK_LAUNCH("moe_route_kernel");
}

// The FP8 experts' input codes and scales of rows [rows, cols] of bf16 x (row stride ldx): per token, or per
// token per 128 columns (the dense FP8 linear layers' quantisers, kernels/launchers.cuh).
static void moe_fp8_quantize(bf16* x, int64_t ldx, uint8_t* q, float* scale, int64_t rows, int64_t cols,
                             int group, cudaStream_t stream) {
  if (group > 0)
    fp8_quantize_groups_launch(x, ldx, q, cols, scale, rows, cols, false, stream);
  else
    fp8_quantize_rows_launch(x, ldx, q, cols, scale, rows, cols, false, stream);
}

// The SwiGLU of gate | up rows gu [rows, 2·inter] into FP8 codes and scales: per token straight from gate and
// up (swiglu_fp8_launch), per 128 columns through the bf16 SwiGLU written over the gate half.
static void moe_fp8_swiglu(bf16* gu, int64_t rows, int64_t inter, const int32_t* used, uint8_t* q,
                           float* scale, int group, cudaStream_t stream) {
  if (group > 0) {
    const unsigned cols = unsigned(std::min<int64_t>((inter + 127) / 128, 65535));
    moe_swiglu_kernel<<<dim3(cols, row_grid(rows)), 128, 0, stream>>>(gu, 2 * inter, rows, int(inter), used);
    DF_CUDA_CHECK_LAUNCH("moe_swiglu_kernel");
    fp8_quantize_groups_launch(gu, 2 * inter, q, inter, scale, rows, inter, false, stream);
  } else {
    swiglu_fp8_launch(gu, 2 * inter, gu + inter, 2 * inter, q, inter, scale, rows, inter, stream);
  }
}

void moe_experts_launch(GemmContext* gemm, const bf16* x, int64_t ldx, const int32_t* ids, int64_t ld_ids,
                        const float* weights, int64_t ld_w, const void* gate_up_v, const void* down_v,
                        const void* shared_gate_up_v, const void* shared_down_v, const bf16* shared_gate,
                        const MoeFp8Scales& scales, bf16* out, int64_t ldo, int64_t T, const MoeDims& d,
                        void* ws, size_t ws_bytes, cudaStream_t stream) {
  if (T == 0) return;
  const MoeExpertsLayout l = moe_experts_layout(T, d);
  DF_CHECK(ws && ws_bytes >= l.bytes, "moe_experts: workspace of %zu bytes, %zu needed for %lld tokens",
           ws ? ws_bytes : size_t(0), l.bytes, (long long)T);
  DF_CHECK(size_t(d.E + 1) * sizeof(int32_t) <= 48 * 1024 && l.R < INT32_MAX,
           "moe_experts: %d experts or %lld grouped rows exceed the kernels' limits", d.E, (long long)l.R);
  DF_CHECK(!d.fp8 || (scales.gate_up && scales.down &&
                      (d.Is == 0 || (scales.shared_gate_up && scales.shared_down))),
           "moe_experts: FP8 experts need the scales of every expert weight");
  char* base = static_cast<char*>(ws);
  auto* hist = reinterpret_cast<int32_t*>(base + l.hist);
  auto* start = reinterpret_cast<int32_t*>(base + l.start);
  auto* row_token = reinterpret_cast<int32_t*>(base + l.row_token);
  auto* pair_row = reinterpret_cast<int32_t*>(base + l.pair_row);
  auto* xs = reinterpret_cast<bf16*>(base + l.xs);
  auto* gu = reinterpret_cast<bf16*>(base + l.gu);
  const auto* gate_up = static_cast<const bf16*>(gate_up_v);
  const auto* down = static_cast<const bf16*>(down_v);
  const int64_t H = d.H, I = d.I, tiles = l.tiles.tiles, rows = l.tiles.rows;
  const void** a1 = nullptr;
  const void** w1 = nullptr;
  void** c1 = nullptr;
  const void** a2 = nullptr;
  const void** w2 = nullptr;
  void** c2 = nullptr;
  if (!d.fp8) {
    auto** ptrs = reinterpret_cast<void**>(base + l.ptrs);
    a1 = const_cast<const void**>(ptrs);
    w1 = a1 + tiles;
    c1 = ptrs + 2 * tiles;
    a2 = a1 + 3 * tiles;
    w2 = a1 + 4 * tiles;
    c2 = ptrs + 5 * tiles;
  }
  auto* tile_expert = d.fp8 ? reinterpret_cast<int32_t*>(base + l.tile_expert) : nullptr;
  const size_t esmem = size_t(d.E + 1) * sizeof(int32_t);

  // Counting sort of the pairs by expert, tokens in order within an expert.
  moe_hist_kernel<<<unsigned(l.chunks), 256, esmem, stream>>>(ids, ld_ids, T, d.k, d.E, hist);
  DF_CUDA_CHECK_LAUNCH("moe_hist_kernel");
  moe_plan_kernel<<<1, 256, esmem, stream>>>(hist, l.chunks, d.E, int(rows), tiles, start, xs, gu, xs,
                                             gate_up, down, H, int(I), a1, w1, c1, a2, w2, c2, tile_expert);
  DF_CUDA_CHECK_LAUNCH("moe_plan_kernel");
  DF_CUDA_CHECK(cudaMemsetAsync(row_token, 0xff, size_t(l.R) * sizeof(int32_t), stream));
  moe_place_kernel<<<unsigned(l.chunks), 32, esmem, stream>>>(ids, ld_ids, T, d.k, d.E, hist, start,
                                                              row_token, pair_row);
  DF_CUDA_CHECK_LAUNCH("moe_place_kernel");

  const bool vec8 = H % 8 == 0 && ldx % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const dim3 gather_grid(unsigned((H + (vec8 ? 8 : 1) * 128 - 1) / ((vec8 ? 8 : 1) * 128)), row_grid(l.R));
  if (vec8)
    moe_gather_kernel<8><<<gather_grid, 128, 0, stream>>>(x, ldx, row_token, start, d.E, H, xs);
  else
    moe_gather_kernel<1><<<gather_grid, 128, 0, stream>>>(x, ldx, row_token, start, d.E, H, xs);
  DF_CUDA_CHECK_LAUNCH("moe_gather_kernel");

  bf16* sy = nullptr;
  if (d.fp8) {
    // The grouped rows' codes (rows past start[E] are quantised too, never read), the two grouped FP8 GEMMs
    // with the SwiGLU's codes between them; the down projections land over xs as in the bf16 path.
    auto* xq = reinterpret_cast<uint8_t*>(base + l.xq);
    auto* xq_scale = reinterpret_cast<float*>(base + l.xq_scale);
    auto* aq = reinterpret_cast<uint8_t*>(base + l.aq);
    auto* aq_scale = reinterpret_cast<float*>(base + l.aq_scale);
    const auto* w8_gu = static_cast<const uint8_t*>(gate_up_v);
    const auto* w8_down = static_cast<const uint8_t*>(down_v);
    moe_fp8_quantize(xs, H, xq, xq_scale, l.R, H, d.fp8_group, stream);
    moe_fp8_gemm_launch(xq, xq_scale, l.R, w8_gu, scales.gate_up, d.fp8_group, tile_expert, start + d.E,
                        int(rows), tiles, gu, 2 * I, 2 * I, H, stream);
    moe_fp8_swiglu(gu, l.R, I, start + d.E, aq, aq_scale, d.fp8_group, stream);
    moe_fp8_gemm_launch(aq, aq_scale, l.R, w8_down, scales.down, d.fp8_group, tile_expert, start + d.E,
                        int(rows), tiles, xs, H, H, I, stream);
    if (d.Is > 0) {
      const int64_t Is = d.Is, stiles = (T + 63) / 64;
      auto* sgu = reinterpret_cast<bf16*>(base + l.sgu);
      sy = reinterpret_cast<bf16*>(base + l.sy);
      moe_fp8_quantize(const_cast<bf16*>(x), ldx, xq, xq_scale, T, H, d.fp8_group, stream);
      moe_fp8_gemm_launch(xq, xq_scale, T, static_cast<const uint8_t*>(shared_gate_up_v),
                          scales.shared_gate_up, d.fp8_group, nullptr, nullptr, 64, stiles, sgu, 2 * Is,
                          2 * Is, H, stream);
      moe_fp8_swiglu(sgu, T, Is, nullptr, aq, aq_scale, d.fp8_group, stream);
      moe_fp8_gemm_launch(aq, aq_scale, T, static_cast<const uint8_t*>(shared_down_v), scales.shared_down,
                          d.fp8_group, nullptr, nullptr, 64, stiles, sy, H, H, Is, stream);
    }
  } else {
    // The experts' gate_up and down GEMMs over all tiles.
    const int align = moe_gemm_align(xs, gu, gate_up, down, rows, d);
    gemm_batched_launch(gemm, a1, H, w1, H, c1, 2 * I, rows, 2 * I, H, tiles, align, stream);
    const unsigned icols = unsigned(std::min<int64_t>((I + 127) / 128, 65535));
    moe_swiglu_kernel<<<dim3(icols, row_grid(l.R)), 128, 0, stream>>>(gu, 2 * I, l.R, int(I), start + d.E);
    DF_CUDA_CHECK_LAUNCH("moe_swiglu_kernel");
    gemm_batched_launch(gemm, a2, 2 * I, w2, I, c2, H, rows, H, I, tiles, align, stream);
    if (d.Is > 0) {
      const int64_t Is = d.Is;
      auto* sgu = reinterpret_cast<bf16*>(base + l.sgu);
      sy = reinterpret_cast<bf16*>(base + l.sy);
      const auto* shared_gate_up = static_cast<const bf16*>(shared_gate_up_v);
      const auto* shared_down = static_cast<const bf16*>(shared_down_v);
      gemm_launch(gemm, x, ldx, shared_gate_up, H, sgu, 2 * Is, false, T, 2 * Is, H, 0.0f, stream);
      moe_swiglu_kernel<<<dim3(unsigned(std::min<int64_t>((Is + 127) / 128, 65535)), row_grid(T)), 128, 0,
                          stream>>>(sgu, 2 * Is, T, int(Is), nullptr);
      DF_CUDA_CHECK_LAUNCH("moe_swiglu_kernel");
      gemm_launch(gemm, sgu, 2 * Is, shared_down, Is, sy, H, false, T, H, Is, 0.0f, stream);
    }
  }

  const bool out8 = vec8 && ldo % 8 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const size_t ksmem = size_t(d.k) * sizeof(int32_t);
  if (out8)
    moe_combine_kernel<8><<<unsigned(T), 128, ksmem, stream>>>(x, ldx, ids, ld_ids, weights, ld_w, pair_row,
                                                               d.k, d.E, xs, H, sy, shared_gate, out, ldo);
  else
    moe_combine_kernel<1><<<unsigned(T), 128, ksmem, stream>>>(x, ldx, ids, ld_ids, weights, ld_w, pair_row,
                                                               d.k, d.E, xs, H, sy, shared_gate, out, ldo);
  DF_CUDA_CHECK_LAUNCH("moe_combine_kernel");
}

}  // namespace df
