// The scatters of the drafter heads' token-indexed gradients (DSpark's W1 in dspark_head.cu, DFlash2's two
// codebooks in dflash2_selector.cu): out[token] += Σ of rows by token, summed in entry order so the bits
// never depend on float atomics or on the schedule. The entries are u64 keys token << 32 | entry, unique, so
// an unstable sort leaves one order: a bitonic sort (its scratch is the keys themselves, padded to a power
// of two: token_sort_keys in train_workspace.h, so the VRAM planner counts it in plain C++), the stages
// inside a tile of kSortTile keys run in shared memory, the longer strides as one launch each; then the CTA
// at the first entry of each token sums that token's rows.
#include <algorithm>

#include "kernels/primitives/cuda_check.cuh"
#include "kernels/train_launchers.cuh"

namespace df {

namespace {

constexpr int kSortTile = 2048;  // keys a CTA sorts in shared memory (16 KB)
constexpr int kSortThreads = 1024;
constexpr int kThreads = 256;

// Whether the pair (i, i ^ j) with i below its partner swaps in stage (k, j) of the ascending sort.
__device__ __forceinline__ bool bitonic_swaps(uint64_t a, uint64_t b, int64_t i, int64_t k) {
  return (a > b) == ((i & k) == 0);
}

}  // namespace

// ---- kernels ----

// One stage (k, j) over all n keys: a thread a key, the lower of each pair swaps.
__global__ void token_sort_stage_kernel(uint64_t* keys, int64_t n, int64_t k, int64_t j) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, p = i ^ j;
  if (i >= n || p <= i) return;
  const uint64_t a = keys[i], b = keys[p];
  if (bitonic_swaps(a, b, i, k)) {
    keys[i] = b;
    keys[p] = a;
  }
}

// Tile blockIdx.x of T keys in shared memory: for k = k0, 2·k0, .. ≤ k1, the stages j < T of k (the whole
// sort of the tile from k0 = 2 to k1 = T; the tail of one longer k otherwise).
__global__ void __launch_bounds__(kSortThreads)
    token_sort_tile_kernel(uint64_t* keys, int64_t k0, int64_t k1, int T) {
  __shared__ uint64_t s[kSortTile];
  const int64_t base = blockIdx.x * int64_t(T);
  for (int t = threadIdx.x; t < T; t += blockDim.x) s[t] = keys[base + t];
  __syncthreads();
  for (int64_t k = k0; k <= k1; k *= 2)
    for (int j = int(min(k / 2, int64_t(T / 2))); j > 0; j /= 2) {
      for (int t = threadIdx.x; t < T / 2; t += blockDim.x) {
        const int i = 2 * t - (t & (j - 1)), p = i + j;  // the t-th pair
        const uint64_t a = s[i], b = s[p];
        if (bitonic_swaps(a, b, base + i, k)) {
          s[i] = b;
          s[p] = a;
        }
      }
      __syncthreads();
    }
  for (int t = threadIdx.x; t < T; t += blockDim.x) keys[base + t] = s[t];
}

// The CTA at sorted entry blockIdx.x, when it is its token's first: out[token, c] += Σ over the token's
// entries e in order of coef[e]·src[(e / per)·R + c] (coef null: 1). Tokens ≥ V (sentinels, padding) have
// none.
__global__ void token_row_sum_kernel(const uint64_t* keys, int64_t M, uint32_t V, const float* coef,
                                     const float* src, int per, int R, float* out) {
  const int64_t i = blockIdx.x;
  const uint32_t tok = uint32_t(keys[i] >> 32);
  if ((i > 0 && uint32_t(keys[i - 1] >> 32) == tok) || tok >= V) return;
  for (int c = threadIdx.x; c < R; c += blockDim.x) {
    float s = 0.0f;
    for (int64_t f = i; f < M && uint32_t(keys[f] >> 32) == tok; ++f) {
      const uint32_t e = uint32_t(keys[f]);
      s += (coef ? coef[e] : 1.0f) * src[int64_t(e / uint32_t(per)) * R + c];
    }
    out[int64_t(tok) * R + c] += s;
  }
}

// ---- launchers ----

void token_sort_launch(uint64_t* keys, int64_t n, cudaStream_t stream) {
  DF_CHECK(n >= 1 && (n & (n - 1)) == 0 && keys, "token_sort_launch: %lld keys (a power of two) at %p",
           (long long)n, static_cast<void*>(keys));
  const int T = int(std::min<int64_t>(n, kSortTile));
  const unsigned tiles = unsigned(n / T);
  token_sort_tile_kernel<<<tiles, kSortThreads, 0, stream>>>(keys, 2, T, T);
  DF_CUDA_CHECK_LAUNCH("token_sort_tile_kernel");
  for (int64_t k = 2 * int64_t(T); k <= n; k *= 2) {
    for (int64_t j = k / 2; j >= T; j /= 2) {
      const unsigned grid = unsigned((n + kThreads - 1) / kThreads);
      token_sort_stage_kernel<<<grid, kThreads, 0, stream>>>(keys, n, k, j);
      DF_CUDA_CHECK_LAUNCH("token_sort_stage_kernel");
    }
    token_sort_tile_kernel<<<tiles, kSortThreads, 0, stream>>>(keys, k, k, T);
    DF_CUDA_CHECK_LAUNCH("token_sort_tile_kernel");
  }
}

void token_row_sum_launch(const uint64_t* keys, int64_t M, int64_t V, const float* coef, const float* src,
                          int per, int R, float* out, cudaStream_t stream) {
  DF_CHECK(M >= 0 && M <= int64_t(UINT32_MAX) && V >= 0 && V < int64_t(UINT32_MAX) && per >= 1 && R >= 1,
           "token_row_sum_launch: %lld entries, V %lld, %d entries a row, %d columns", (long long)M,
           (long long)V, per, R);
  if (M == 0) return;
  token_row_sum_kernel<<<unsigned(M), std::min(R, kThreads), 0, stream>>>(keys, M, uint32_t(V), coef, src,
                                                                          per, R, out);
  DF_CUDA_CHECK_LAUNCH("token_row_sum_kernel");
}

}  // namespace df
