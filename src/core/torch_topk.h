// torch.topk's order (largest, sorted) of routing probabilities, written out so a CUDA thread computes the
// very order the CPU oracle gets from libstdc++ (ops/cpu/cpu_ops.h cpu_topk_torch_order): aten's TopKImpl.h
// runs std::partial_sort when k·64 <= n, else std::nth_element for the k-th and std::sort of the k − 1 before
// it, and equal probabilities (two experts with the same router row) end wherever those algorithms put them.
// The steps below are libstdc++'s (bits/stl_algo.h, bits/stl_heap.h: introselect, unguarded partition around
// a median of three, insertion sort, heap select, heap sort) on (value, index) pairs; test_cpu_moe
// (PortableTopkOrderIsTheStdlibs) checks them against the standard library on rows full of ties.
#pragma once
#include <cstdint>

#include "core/host_device.h"

namespace df {

struct TopkPair {
  float v;
  int32_t i;
};

// torch's "greater" for topk(largest): a NaN ranks above every number.
DF_HOST_DEVICE inline bool topk_greater(const TopkPair& x, const TopkPair& y) {
  const bool xn = x.v != x.v, yn = y.v != y.v;
  return (xn && !yn) || x.v > y.v;
}

DF_HOST_DEVICE inline void topk_swap(TopkPair* a, TopkPair* b) {
  const TopkPair t = *a;
  *a = *b;
  *b = t;
}

// floor(log2(n)) for n >= 1 (std::__lg).
DF_HOST_DEVICE inline int topk_lg(int n) {
  int r = 0;
  while (n > 1) n >>= 1, ++r;
  return r;
}

DF_HOST_DEVICE inline void topk_move_median_to_first(TopkPair* result, TopkPair* a, TopkPair* b,
                                                     TopkPair* c) {
  if (topk_greater(*a, *b)) {
    if (topk_greater(*b, *c))
      topk_swap(result, b);
    else if (topk_greater(*a, *c))
      topk_swap(result, c);
    else
      topk_swap(result, a);
  } else if (topk_greater(*a, *c)) {
    topk_swap(result, a);
  } else if (topk_greater(*b, *c)) {
    topk_swap(result, c);
  } else {
    topk_swap(result, b);
  }
}

DF_HOST_DEVICE inline TopkPair* topk_unguarded_partition(TopkPair* first, TopkPair* last,
                                                         const TopkPair* pivot) {
  while (true) {
    while (topk_greater(*first, *pivot)) ++first;
    --last;
    while (topk_greater(*pivot, *last)) --last;
    if (!(first < last)) return first;
    topk_swap(first, last);
    ++first;
  }
}

DF_HOST_DEVICE inline TopkPair* topk_partition_pivot(TopkPair* first, TopkPair* last) {
  TopkPair* mid = first + (last - first) / 2;
  topk_move_median_to_first(first, first + 1, mid, last - 1);
  return topk_unguarded_partition(first + 1, last, first);
}

DF_HOST_DEVICE inline void topk_unguarded_linear_insert(TopkPair* last) {
  const TopkPair val = *last;
  TopkPair* next = last - 1;
  while (topk_greater(val, *next)) {
    *last = *next;
    last = next;
    --next;
  }
  *last = val;
}

DF_HOST_DEVICE inline void topk_insertion_sort(TopkPair* first, TopkPair* last) {
  if (first == last) return;
  for (TopkPair* i = first + 1; i != last; ++i) {
    if (topk_greater(*i, *first)) {
      const TopkPair val = *i;
      for (TopkPair* p = i; p != first; --p) *p = *(p - 1);
      *first = val;
    } else {
      topk_unguarded_linear_insert(i);
    }
  }
}

DF_HOST_DEVICE inline void topk_push_heap(TopkPair* first, int hole, int top, TopkPair value) {
  int parent = (hole - 1) / 2;
  while (hole > top && topk_greater(first[parent], value)) {
    first[hole] = first[parent];
    hole = parent;
    parent = (hole - 1) / 2;
  }
  first[hole] = value;
}

DF_HOST_DEVICE inline void topk_adjust_heap(TopkPair* first, int hole, int len, TopkPair value) {
  const int top = hole;
  int child = hole;
  while (child < (len - 1) / 2) {
    child = 2 * (child + 1);
    if (topk_greater(first[child], first[child - 1])) child--;
    first[hole] = first[child];
    hole = child;
  }
  if ((len & 1) == 0 && child == (len - 2) / 2) {
    child = 2 * (child + 1);
    first[hole] = first[child - 1];
    hole = child - 1;
  }
  topk_push_heap(first, hole, top, value);
}

DF_HOST_DEVICE inline void topk_pop_heap(TopkPair* first, TopkPair* last, TopkPair* result) {
  const TopkPair value = *result;
  *result = *first;
  topk_adjust_heap(first, 0, int(last - first), value);
}

DF_HOST_DEVICE inline void topk_make_heap(TopkPair* first, TopkPair* last) {
  const int len = int(last - first);
  if (len < 2) return;
  for (int parent = (len - 2) / 2;; --parent) {
    topk_adjust_heap(first, parent, len, first[parent]);
    if (parent == 0) return;
  }
}

DF_HOST_DEVICE inline void topk_heap_select(TopkPair* first, TopkPair* middle, TopkPair* last) {
  topk_make_heap(first, middle);
  for (TopkPair* i = middle; i < last; ++i)
    if (topk_greater(*i, *first)) topk_pop_heap(first, middle, i);
}

DF_HOST_DEVICE inline void topk_sort_heap(TopkPair* first, TopkPair* last) {
  while (last - first > 1) {
    --last;
    topk_pop_heap(first, last, last);
  }
}

// std::partial_sort.
DF_HOST_DEVICE inline void topk_partial_sort(TopkPair* first, TopkPair* middle, TopkPair* last) {
  topk_heap_select(first, middle, last);
  topk_sort_heap(first, middle);
}

// std::sort: introsort (whose recursion on the right part is a loop here, processing the same ranges in the
// same order) then the final insertion sort.
DF_HOST_DEVICE inline void topk_sort(TopkPair* first, TopkPair* last) {
  constexpr int kThreshold = 16;
  if (first == last) return;
  // Each level of the recursion: its range [lo, hi) as offsets from first and the depth left. Only a level
  // with depth to spare pushes another, so at most 2·lg(n) + 1 are open at once: 32 slots for any n < 65536
  // (the router sorts fewer than its 4096 experts).
  int lo[32], hi[32], depth[32];
  int sp = 0;
  lo[0] = 0, hi[0] = int(last - first), depth[0] = 2 * topk_lg(hi[0]);
  while (sp >= 0) {
    const int f = lo[sp], l = hi[sp];
    int d = depth[sp];
    // Resume this level's loop: libstdc++ recurses into [cut, l) and then continues with l = cut.
    if (l - f > kThreshold) {
      if (d == 0) {
        topk_partial_sort(first + f, first + l, first + l);
        --sp;
        continue;
      }
      --d;
      const int cut = int(topk_partition_pivot(first + f, first + l) - first);
      hi[sp] = cut, depth[sp] = d;
      ++sp;
      lo[sp] = cut, hi[sp] = l, depth[sp] = d;
      continue;
    }
    --sp;
  }
  if (last - first > kThreshold) {
    topk_insertion_sort(first, first + kThreshold);
    for (TopkPair* i = first + kThreshold; i != last; ++i) topk_unguarded_linear_insert(i);
  } else {
    topk_insertion_sort(first, last);
  }
}

// std::nth_element.
DF_HOST_DEVICE inline void topk_nth_element(TopkPair* first, TopkPair* nth, TopkPair* last) {
  if (first == last || nth == last) return;
  int depth = 2 * topk_lg(int(last - first));
  while (last - first > 3) {
    if (depth == 0) {
      topk_heap_select(first, nth + 1, last);
      topk_swap(first, nth);
      return;
    }
    --depth;
    TopkPair* cut = topk_partition_pivot(first, last);
    if (cut <= nth)
      first = cut;
    else
      last = cut;
  }
  topk_insertion_sort(first, last);
}

// The k largest of value(0) .. value(n − 1) into top[0, k), descending, when that result is unique: no NaN,
// the k values distinct and the k-th strictly above every other value. Any correct top-k then gives it,
// torch's included, so a router can skip topk_torch_order's reordering for all rows but those with a tie;
// returns false (top then undefined) for those. top holds k + 1 pairs, 1 <= k <= n.
template <class Value>
DF_HOST_DEVICE inline bool topk_unique(int n, int k, Value value, TopkPair* top) {
  const int keep = k < n ? k + 1 : k;  // the k and the best of the rest, which must fall strictly below them
  int m = 0;
  for (int e = 0; e < n; ++e) {
    const float v = value(e);
    if (v != v) return false;
    if (m == keep && !(v > top[m - 1].v)) continue;
    int at = m < keep ? m++ : m - 1;
    for (; at > 0 && top[at - 1].v < v; --at) top[at] = top[at - 1];
    top[at] = TopkPair{v, e};
  }
  for (int j = 0; j + 1 < keep; ++j)
    if (!(top[j].v > top[j + 1].v)) return false;
  return true;
}

// The first k of q[0, n) become torch.topk(largest, sorted)'s k, in its order (1 <= k <= n).
DF_HOST_DEVICE inline void topk_torch_order(TopkPair* q, int n, int k) {
  if (int64_t(k) * 64 <= n) {
    topk_partial_sort(q, q + k, q + n);
  } else {
    topk_nth_element(q, q + k - 1, q + n);
    topk_sort(q, q + k - 1);
  }
}

}  // namespace df
