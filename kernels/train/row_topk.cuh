// The exact top-K (K ≤ 64) of a logits row read in slices by a cluster of CTAs (row_slice.cuh), in the
// oracle's order: value descending, ties to the lower id (ops/dflash2_selector.cpp), NaN ranked nowhere.
//
// Each warp keeps a sorted list of the best elements it has seen, spread over its lanes; an element enters
// the warp's list only when it beats the list's K-th entry, which the warp tests with one compare per element
// and one ballot per 32. The CTA's warps also share the largest K-th value any of them holds: an element
// below it has K better elements in that warp's list, so it cannot be among the row's K best and every warp
// skips it (the lists then stay supersets of the row's top-K, and most of the vocabulary is rejected by one
// compare). The CTA's warp lists, then the cluster's CTA lists, are merged by rank: each entry counts the
// entries of the other lists ranked before it (a binary search in each sorted list) and lands at that place
// if it is below K. The result does not depend on the order the elements arrive in.
#pragma once
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/train/row_slice.cuh"

namespace df::row_topk {

constexpr int kMaxK = 64;                         // two entries a lane
constexpr int kWarps = row_slice::kThreads / 32;  // warp lists a CTA merges
constexpr unsigned kFull = 0xffffffffu;

// (a, ia) ranks before (b, ib).
__device__ __forceinline__ bool better(float a, int32_t ia, float b, int32_t ib) {
  return a > b || (a == b && ia < ib);
}

// An int that orders as the float does (for atomicMax; −0 below +0, which compare equal as floats).
__device__ __forceinline__ int order_key(float x) {
  const int i = __float_as_int(x);
  return i >= 0 ? i : i ^ 0x7fffffff;
}
__device__ __forceinline__ float from_order_key(int k) {
  return __int_as_float(k >= 0 ? k : k ^ 0x7fffffff);
}

// A warp's list, descending: entry e in lane e % 32, slot e / 32; entries not yet filled are (−inf, INT_MAX),
// which every element ranks before. (tv, tid): entry K − 1, the bar an element must beat, in every lane.
struct WarpList {
  float v[2];
  int32_t id[2];
  float tv;
  int32_t tid;
};

__device__ __forceinline__ void list_init(WarpList& s) {
  s.v[0] = s.v[1] = s.tv = -INFINITY;
  s.id[0] = s.id[1] = s.tid = INT_MAX;
}

// Inserts (x, xid), the same in every lane and ranked before entry K − 1, at its place; the last entry drops.
__device__ __forceinline__ void list_insert(WarpList& s, int K, float x, int32_t xid) {
  const int lane = threadIdx.x % 32;
  const unsigned b0 = __ballot_sync(kFull, better(x, xid, s.v[0], s.id[0]));
  const unsigned b1 = __ballot_sync(kFull, better(x, xid, s.v[1], s.id[1]));
  const int p = b0 ? __ffs(int(b0)) - 1 : 31 + __ffs(int(b1));  // the first entry x ranks before
  const float u0 = __shfl_up_sync(kFull, s.v[0], 1), u1 = __shfl_up_sync(kFull, s.v[1], 1);
  const int32_t j0 = __shfl_up_sync(kFull, s.id[0], 1), j1 = __shfl_up_sync(kFull, s.id[1], 1);
  const float c = __shfl_sync(kFull, s.v[0], 31);  // entry 31 moves to entry 32
  const int32_t ci = __shfl_sync(kFull, s.id[0], 31);
  const int e1 = 32 + lane;
  if (e1 > p) {
    s.v[1] = lane == 0 ? c : u1;
    s.id[1] = lane == 0 ? ci : j1;
  } else if (e1 == p) {
    s.v[1] = x;
    s.id[1] = xid;
  }
  if (lane > p) {
    s.v[0] = u0;
    s.id[0] = j0;
  } else if (lane == p) {
    s.v[0] = x;
    s.id[0] = xid;
  }
  const int k = K - 1;
  s.tv = __shfl_sync(kFull, k < 32 ? s.v[0] : s.v[1], k % 32);
  s.tid = __shfl_sync(kFull, k < 32 ? s.id[0] : s.id[1], k % 32);
}

// Offers the warp's 32 elements (x, id) (one a lane; id INT_MAX with x = −inf for none) to its list; `lo` is
// the CTA's shared bar (see the top), *bar where the warp raises it. Called by every lane of the warp.
__device__ __forceinline__ void list_offer(WarpList& s, int K, float x, int32_t id, float lo, int* bar) {
  unsigned m = __ballot_sync(kFull, x >= lo && better(x, id, s.tv, s.tid));
  if (!m) return;
  do {
    const int src = __ffs(int(m)) - 1;
    m &= m - 1;
    const float xv = __shfl_sync(kFull, x, src);
    const int32_t xi = __shfl_sync(kFull, id, src);
    if (better(xv, xi, s.tv, s.tid)) list_insert(s, K, xv, xi);
  } while (m);
  if (threadIdx.x % 32 == 0 && s.tid != INT_MAX) atomicMax(bar, order_key(s.tv));
}

// The warp's K entries to lv/li [K].
__device__ __forceinline__ void list_store(const WarpList& s, int K, float* lv, int32_t* li) {
  const int lane = threadIdx.x % 32;
  if (lane < K) lv[lane] = s.v[0], li[lane] = s.id[0];
  if (32 + lane < K) lv[32 + lane] = s.v[1], li[32 + lane] = s.id[1];
}

// The K best of L sorted lists lv/li [L·K] (list l at l·K) into out_v/out_id [K], descending. Equal entries
// (only unfilled ones) rank by list. Needs the block; the caller syncs before reading the output.
__device__ __forceinline__ void merge_lists(const float* lv, const int32_t* li, int L, int K, float* out_v,
                                            int32_t* out_id) {
  for (int e = threadIdx.x; e < L * K; e += blockDim.x) {
    const int l = e / K;
    const float v = lv[e];
    const int32_t id = li[e];
    int rank = e % K;
    for (int o = 0; o < L && rank < K; ++o) {
      if (o == l) continue;
      int lo = 0, hi = K;  // entries [0, lo) of list o rank before (v, id)
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        const float w = lv[o * K + mid];
        const int32_t wi = li[o * K + mid];
        const bool before = better(w, wi, v, id) || (o < l && w == v && wi == id);
        if (before)
          lo = mid + 1;
        else
          hi = mid;
      }
      rank += lo;
    }
    if (rank < K) out_v[rank] = v, out_id[rank] = id;
  }
}

// The shared memory of a CTA's part: the warp lists (reused for the cluster's CTA lists), the CTA's list
// that the cluster's rank 0 reads, and the shared bar.
struct Scratch {
  float wl_v[kWarps * kMaxK];
  int32_t wl_id[kWarps * kMaxK];
  float part_v[kMaxK];
  int32_t part_id[kMaxK];
  int bar;
};
static_assert(row_slice::kMaxCluster <= kWarps, "the warp-list buffer holds the cluster's CTA lists");

// Before the slice pass; the caller syncs the block before any list_offer.
__device__ __forceinline__ void scratch_init(Scratch& sh) {
  if (threadIdx.x == 0) sh.bar = order_key(-INFINITY);
}

// The bar to pass to list_offer: the largest K-th value a warp of the CTA has published so far.
__device__ __forceinline__ float bar_of(const Scratch& sh) {
  return from_order_key(*reinterpret_cast<const volatile int*>(&sh.bar));
}

// After the slice pass: the warps' lists merged into the CTA's list (sh.part_*). Needs the block.
__device__ __forceinline__ void cta_merge(const WarpList& s, int K, Scratch& sh) {
  const int warp = threadIdx.x / 32;
  list_store(s, K, sh.wl_v + warp * K, sh.wl_id + warp * K);
  __syncthreads();
  merge_lists(sh.wl_v, sh.wl_id, kWarps, K, sh.part_v, sh.part_id);
}

// In the cluster's rank 0, after a cluster barrier that follows every CTA's cta_merge: the row's top-K into
// out_v/out_id [K] (shared), valid in the whole CTA on return. The CTAs must not leave before a second
// barrier (rank 0 reads their lists).
__device__ __forceinline__ void cluster_merge(int K, int ctas, Scratch& sh, float* out_v, int32_t* out_id) {
  for (int e = threadIdx.x; e < ctas * K; e += blockDim.x) {
    const int o = e / K, j = e % K;
    sh.wl_v[e] = row_slice::row_partial(sh.part_v, o, ctas)[j];
    sh.wl_id[e] = row_slice::row_partial(sh.part_id, o, ctas)[j];
  }
  __syncthreads();
  merge_lists(sh.wl_v, sh.wl_id, ctas, K, out_v, out_id);
  __syncthreads();
}

}  // namespace df::row_topk
