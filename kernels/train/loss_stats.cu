// The drafter's row weights and step statistics on the device (train_ops.h loss_row_stats): offset decay,
// streak factor, Σ w·loss, Σ w, per-offset accuracy and τ, added into a small f64 block the host reads once
// per optimizer step. The CPU oracle is ops/cpu/cpu_train_stats.cpp (ops/loss_rows.cpp's functions).
#include "kernels/primitives/cuda_check.cuh"
#include "kernels/train/loss_slots.h"
#include "kernels/train_launchers.cuh"

namespace df {

// One thread block: the work is nb·B rows of bookkeeping (microseconds), and a single block reduces in a
// fixed order without a second pass, so the sums are the same bits on every run.
constexpr int kStatsThreads = 256;

// ---- kernels ----
// Thread t walks blocks t, t + 256, ... in order (each block's streak prefix is sequential in k, as in
// loss_apply_streak); its Σ w·loss and Σ w partials meet in a fixed tree. Counts are integers, added with
// shared-memory atomics (exact in any order). Row math in double where the host uses double (exp of the
// offset decay, the streak prefix and pow), rounded to f32 where the host rounds.
__global__ void __launch_bounds__(kStatsThreads)
    loss_row_stats_kernel(const int32_t* __restrict__ labels, const uint8_t* __restrict__ active,
                          const float* __restrict__ loss, const float* __restrict__ p_label,
                          const int32_t* __restrict__ argmax, LossRowDims d, float* row_w, double* stats) {
  extern __shared__ unsigned long long cnt[];  // correct[B−1], count[B−1], Σ(1 + lead), blocks with a label
  __shared__ double red_l[kStatsThreads], red_w[kStatsThreads];
  const int B = d.block, nk = B - 1;
  for (int i = threadIdx.x; i < 2 * nk + 2; i += blockDim.x) cnt[i] = 0;
  __syncthreads();
  double ls = 0, ws = 0;
  for (int64_t j = threadIdx.x; j < d.nb; j += blockDim.x) {
    double prefix = 1.0;
    bool any = false, streak = true;
    unsigned long long lead = 0;
    for (int k = 0; k < B; ++k) {
      const int64_t r = j * B + k;
      const bool act = k > 0 && active[r] != 0;
      float w;
      if (d.weights_given) {
        w = row_w[r];
      } else {
        w = act ? static_cast<float>(exp(-static_cast<double>(k - 1) / static_cast<double>(d.gamma))) : 0.0f;
        if (d.streak && k > 0) {
          w = static_cast<float>(static_cast<double>(w) * prefix);
          if (act) prefix *= pow(static_cast<double>(p_label[r]), static_cast<double>(d.streak_alpha));
        }
        row_w[r] = w;
      }
      ls += static_cast<double>(w) * loss[r];
      ws += w;
      if (k == 0) continue;
      const bool ok = act && argmax[r] == labels[r];
      if (act) {
        any = true;
        atomicAdd(&cnt[nk + k - 1], 1ull);
        if (ok) atomicAdd(&cnt[k - 1], 1ull);
      }
      if (streak && ok)
        ++lead;
      else
        streak = false;
    }
    if (any) {
      atomicAdd(&cnt[2 * nk], 1ull + lead);
      atomicAdd(&cnt[2 * nk + 1], 1ull);
    }
  }
  red_l[threadIdx.x] = ls;
  red_w[threadIdx.x] = ws;
  __syncthreads();
  for (int s = kStatsThreads / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      red_l[threadIdx.x] += red_l[threadIdx.x + s];
      red_w[threadIdx.x] += red_w[threadIdx.x + s];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    stats[LossStatsSlots::kLossSum] += red_l[0];
    stats[LossStatsSlots::kWeightSum] += red_w[0];
    stats[LossStatsSlots::kTauSum] += static_cast<double>(cnt[2 * nk]);
    stats[LossStatsSlots::kTauBlocks] += static_cast<double>(cnt[2 * nk + 1]);
    for (int k = 1; k < B; ++k) {
      stats[LossStatsSlots::kFixed + k - 1] += static_cast<double>(cnt[k - 1]);  // LossStatsSlots::correct
      stats[LossStatsSlots::kFixed + nk + k - 1] += static_cast<double>(cnt[nk + k - 1]);  // ::count
    }
  }
}

// ---- launchers ----
void loss_row_stats_launch(const int32_t* labels, const uint8_t* active, const float* loss,
                           const float* p_label, const int32_t* argmax, const LossRowDims& d, float* row_w,
                           double* stats, cudaStream_t stream) {
  DF_CHECK(d.block >= 2 && d.nb >= 0, "loss_row_stats: block %d must be ≥ 2 and nb %lld ≥ 0", d.block,
           (long long)d.nb);
  if (d.nb == 0) return;
  const size_t smem = size_t(2 * (d.block - 1) + 2) * sizeof(unsigned long long);
  loss_row_stats_kernel<<<1, kStatsThreads, smem, stream>>>(labels, active, loss, p_label, argmax, d, row_w,
                                                            stats);
  DF_CUDA_CHECK_LAUNCH("loss_row_stats_kernel");
}

}  // namespace df
