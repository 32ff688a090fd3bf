// Causal GQA attention on Hopper (sm_90a) for head dims 128 and 256, warp-specialized: a producer warpgroup
// streams K and V tiles by TMA into a ring of shared-memory stages (full / empty mbarriers per stage, K and V
// apart), and two consumer warpgroups, each owning 64 of the block's 128 query rows, run the flash loop on
// wgmma with the registers the producer gave up (setmaxnreg). Inside a consumer, S_j = Q·K_jᵀ and
// O += P_{j−1}·V_{j−1} are issued together and the softmax of S_j runs while the second is in flight; between
// the consumers, named barriers make them take turns at issuing, so one's softmax overlaps the other's MMAs.
// P feeds the second MMA from registers (the S accumulator is the A-fragment layout); operands in shared
// memory use the 128-byte swizzle (kernels/primitives/wgmma.cuh). An optional output gate is applied in the epilogue, as
// in attention.cu. The launcher reports whether it ran so the caller can fall back to the portable kernel.
#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/primitives/cuda_check.cuh"
#include "kernels/primitives/device_math.cuh"
#include "kernels/dispatch/dispatch.h"
#include "kernels/launchers.cuh"
#include "kernels/primitives/mma.cuh"
#include "kernels/primitives/tma.cuh"
#include "kernels/primitives/wgmma.cuh"

namespace df {

// HD head dim, KEYS keys per K/V tile, STAGES K/V tiles in flight.
template <int HD, int KEYS, int STAGES>
struct WsAttnCfg {
  static constexpr int kRows = 128;               // query rows per block, 64 per consumer warpgroup
  static constexpr int kThreads = 384;            // the producer warpgroup, then the 2 consumers
  static constexpr int kQBytes = 64 * HD * 2;     // one consumer's Q rows
  static constexpr int kKvBytes = KEYS * HD * 2;  // one K or V tile
  static constexpr int kBarOffset = 2 * kQBytes + 2 * STAGES * kKvBytes;
  // Q full, then per stage K full, V full, K empty, V empty, then Q empty and the item slot (the dynamic
  // schedule's hand-over); slack to align the base to 1024 bytes.
  static constexpr int kSmem = kBarOffset + 8 * (3 + 4 * STAGES) + 1024;
  // Registers per thread (65,536 per SM, one block): 128 · 24 + 256 · 240 = 64,512.
  static constexpr int kProducerRegs = 24, kConsumerRegs = 240;
  static_assert(KEYS == 64 || KEYS == 80 || KEYS == 128, "S = Q·Kᵀ has wgmma wrappers for these widths");
  static_assert(kSmem <= 227 * 1024, "over the shared memory one block may have");
};

// ---- kernels ----
template <int N>
__device__ __forceinline__ void regs_release() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void regs_claim() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// desc moved `bytes` further in shared memory. The start address is the descriptor's low 14 bits in 16-byte
// units, and every tile here lies below 228 KB (< 2^18 bytes), so the add never carries out of that field and
// the other fields stay as they were: one 32-bit add per MMA instead of rebuilding the descriptor (five
// instructions, 21 MMAs per tile at hd 256, on the consumer warps' issue slots).
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (bytes >> 4), hi = static_cast<uint32_t>(desc >> 32);
  return static_cast<uint64_t>(hi) << 32 | lo;
}

// DYN: the dynamic schedule (next_item); the static one (zigzag rounds) serves launches captured into a graph
// before their stream has a counter (item_counter).
template <int HD, int KEYS, int STAGES, bool DYN>
__global__ void __launch_bounds__(384, 1)
    attention_causal_ws_kernel(const __grid_constant__ CUtensorMap tm_q,
                               const __grid_constant__ CUtensorMap tm_k,
                               const __grid_constant__ CUtensorMap tm_v, bf16* out, int64_t ld_out,
                               const bf16* gate, int64_t ld_gate, const int32_t* cu, int hq, int hkv,
                               float scale_log2, int heads_first, int tiles, int items, int* next_item) {
#ifdef DF_WGMMA_BODY
  using Cfg = WsAttnCfg<HD, KEYS, STAGES>;
  constexpr int kKv = Cfg::kKvBytes;
  extern __shared__ __align__(16) unsigned char attn_ws_smem[];
  const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(attn_ws_smem));
  const uint32_t pad = ((raw + 1023u) & ~1023u) - raw;  // swizzled tiles need 1024-byte aligned bases
  unsigned char* base = attn_ws_smem + pad;
  const uint32_t base_s = raw + pad;
  // Consumer w's Q at w · kQBytes; stage st's K at k_off(st), its V kKv further.
  auto k_off = [](int st) { return 2 * Cfg::kQBytes + 2 * st * kKv; };
  const uint32_t bar_q = base_s + Cfg::kBarOffset;
  auto full_k = [&](int st) { return bar_q + 8 + 32 * st; };
  auto full_v = [&](int st) { return bar_q + 16 + 32 * st; };
  auto empty_k = [&](int st) { return bar_q + 24 + 32 * st; };
  auto empty_v = [&](int st) { return bar_q + 32 + 32 * st; };

  const uint32_t empty_q = bar_q + 8 + 32 * STAGES;
  volatile int* item_slot = reinterpret_cast<volatile int*>(base + Cfg::kBarOffset + 16 + 32 * STAGES);

  // Work items in launch order: a sequence's query tiles from the longest (most causal work), each tile's heads one
  // after another when heads_first (item = (seq · tiles + tile) · hq + head), else each head's tiles (item = (seq · hq
  // + head) · tiles + tile). The grid has one CTA an SM; a CTA takes items blockIdx.x, + gridDim.x, ...: rounds of
  // gridDim.x items, every other round in reverse (zigzag), so that the CTA that took a round's longest item takes the
  // next round's shortest. Both roles walk the same items and count the key tiles and the items with rows they have
  // passed (kt, qi): the stage ring and the Q buffer carry on from item to item, and the producer loads the next item's
  // Q and first tiles while the consumers finish and store the last one. Dynamic schedule (next_item, a zeroed
  // counter): CTA b takes item b first, then the producer takes the next one in launch order with an atomic add (list
  // scheduling, as one CTA an item gets from the hardware, without the start and end of a CTA per item) and hands it to
  // the consumers in item_slot, written before the Q barrier's arrival (release) and read after its wait (acquire); −1
  // ends the walk.
  struct Item {
    int head, seq, start, len, q0, ntiles;
  };
  auto item_at = [&](int it) {
    Item w;
    const int tile = heads_first ? it / hq % tiles : it % tiles;
    w.head = heads_first ? it % hq : it / tiles % hq;
    w.seq = it / (tiles * hq);
    w.start = cu[w.seq], w.len = cu[w.seq + 1] - w.start;
    w.q0 = (tiles - 1 - tile) * Cfg::kRows;
    w.ntiles = (min(w.q0 + Cfg::kRows, w.len) + KEYS - 1) / KEYS;  // key tiles the block's rows see
    return w;
  };
  auto item_of_round = [&](int r) {
    return r * int(gridDim.x) + (r & 1 ? int(gridDim.x) - 1 - int(blockIdx.x) : int(blockIdx.x));
  };
  const int rounds = (items + int(gridDim.x) - 1) / int(gridDim.x);

  if (threadIdx.x == 0) {
    mbar_init(bar_q, 1);
    for (int st = 0; st < STAGES; ++st) {
      mbar_init(full_k(st), 1);
      mbar_init(full_v(st), 1);
      mbar_init(empty_k(st), 8);  // one arrival per consumer warp
      mbar_init(empty_v(st), 8);
    }
    mbar_init(empty_q, 8);
    DF_SM90_ASM("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  // Producer: one thread issues every copy; a stage's K or V is refilled once both consumers released that
  // half of the tile STAGES before (parity of that round). (Issuing K and V from two threads, so that a wait
  // for V_j does not hold back K_{j+1}, runs no faster.)
  if (threadIdx.x < 128) {
    regs_release<Cfg::kProducerRegs>();
    if (threadIdx.x != 0) return;
    int kt = 0, qi = 0;  // key tiles loaded, items with rows
    for (int r = 0;; ++r) {
      int it;
      if constexpr (DYN) {
        it = r == 0 ? int(blockIdx.x) : int(gridDim.x) + atomicAdd(next_item, 1);
        if (it >= items) break;
      } else {
        if (r >= rounds) break;
        it = item_of_round(r);
        if (it >= items) continue;
      }
      const Item w = item_at(it);
      if (w.q0 >= w.len) continue;
      const int kv_col = w.head / (hq / hkv) * HD;
      auto refill = [&](int g, int j, bool k_half) {  // ring tile g holds the item's key tile j
        const int st = g % STAGES;
        const uint32_t full = k_half ? full_k(st) : full_v(st);
        if (g >= STAGES) mbar_wait(k_half ? empty_k(st) : empty_v(st), (g / STAGES + 1) & 1);
        mbar_arrive_expect(full, kKv);
        tma_load_tile<HD, KEYS>(base_s + k_off(st) + (k_half ? 0 : kKv), k_half ? &tm_k : &tm_v, kv_col,
                                w.start + j * KEYS, full);
      };
      if (qi > 0) mbar_wait(empty_q, (qi - 1) & 1);  // the consumers' last S of the item before
      if constexpr (DYN) *item_slot = it;
      mbar_arrive_expect(bar_q, 2 * Cfg::kQBytes);
      tma_load_tile<HD, 64>(base_s, &tm_q, w.head * HD, w.start + w.q0, bar_q);
      tma_load_tile<HD, 64>(base_s + Cfg::kQBytes, &tm_q, w.head * HD, w.start + w.q0 + 64, bar_q);
      for (int j = 0; j < w.ntiles; ++j) {
        refill(kt + j, j, true);
        refill(kt + j, j, false);
      }
      kt += w.ntiles;
      ++qi;
    }
    if constexpr (DYN) {  // the end of the walk, as an item of its own
      if (qi > 0) mbar_wait(empty_q, (qi - 1) & 1);
      *item_slot = -1;
      mbar_arrive(bar_q);
    }
    return;
  }

  regs_claim<Cfg::kConsumerRegs>();
  const int cw = (threadIdx.x >> 7) - 1;  // consumer warpgroup 0 or 1
  const int warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;
  const int g = lane >> 2, t4 = lane & 3;
  int wg_row0 = 0, row_a = 0, row_b = 0;  // the item's: set at its start

  // Turns at issuing MMAs: consumer w waits at named barrier 1 + w, issues, then lets the other go. Each
  // takes ntiles + 1 turns an item (its tiles' S, the last P·V, empty turns for tiles it skips), consumer 1
  // not passing on its last, so every barrier phase gets exactly one wait (128 threads) and one arrival
  // (128); consumer 1 lets consumer 0 go first at each item's start.
  int turns = 0, turn = 0;
  auto turn_begin = [&] { named_bar_sync(1 + cw, 256); };
  auto turn_end = [&] {
    if (cw == 0 || turn + 1 < turns) named_bar_arrive(2 - cw, 256);
    ++turn;
  };

  // A warp's arrival on an empty barrier: all its lanes are past the wgmma wait that ends their reads.
  auto release = [&](uint32_t bar) {
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);
  };

  float o[HD / 2];
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // set again at each item's start
  float s[KEYS / 2];
  uint32_t p[KEYS / 16][4];
  const unsigned char* qs = base + cw * Cfg::kQBytes;

  // S = Q·K_stᵀ over HD / 16 k-steps: column block (64 columns, rows × 128 bytes), then 16 columns in it.
  const uint64_t desc_q0 = wgmma_desc(qs, 16, 1024);
  auto issue_qk = [&](int st) {
    // Opaque here, so ptxas cannot hoist the HD / 16 Q descriptors out of the loop (it spilled at hd 256).
    uint64_t desc_q = desc_q0;
    asm volatile("" : "+l"(desc_q));
    const uint64_t desc_k = wgmma_desc(base + k_off(st), 16, 1024);
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      const int in_block = (kk & 3) * 32;
      wgmma_ss<KEYS>(s, desc_advance(desc_q, (kk >> 2) * (64 * 128) + in_block),
                     desc_advance(desc_k, (kk >> 2) * (KEYS * 128) + in_block), kk > 0);
    }
  };
  // O += P·V_st, 16 keys per k-step: V's rows of a k-step are 2 swizzle atoms (2048 bytes), its HD columns
  // HD / 64 column blocks KEYS × 128 bytes apart.
  auto issue_pv = [&](int st) {
    const uint64_t desc_v = wgmma_desc(base + k_off(st) + kKv, KEYS * 128, 1024);
#pragma unroll
    for (int kk = 0; kk < KEYS / 16; ++kk) {
      wgmma_rs_tb<HD>(o, p[kk], desc_advance(desc_v, kk * 2048));
    }
  };
  auto fence_p = [&] {
#pragma unroll
    for (int kk = 0; kk < KEYS / 16; ++kk) wgmma_fence_regs(p[kk]);
  };
  // Softmax of tile j's scores in s: the causal mask where the tile reaches past the
  // warpgroup's first row (keys past len are past every valid row), the tile's max of the raw scores (scale >
  // 0, so the max commutes with the scale, folded into the exponent's FFMA), s turned into probabilities, l
  // updated; corr is the factor O must take. s[i] holds row (i & 2 ? row_b : row_a), key
  // k0 + 8 (i / 4) + 2 t4 + (i & 1). Tile 0 holds key 0, seen by every row, so m is finite after it.
  //
  // Lazy rescaling: m is the reference the exponents are taken against, not necessarily the running max. A
  // warp moves its rows' m up to their running max (O and l then take corr = 2^(m_old − m_new)) only when
  // some row's scaled tile max passes its m by more than kSlack (8); the vote keeps the rows of a warp
  // together, so O's HD / 2 multiplies are skipped by the whole warp or run for it. Why that is exact enough:
  // (1) every exponent s·scale − m stays ≤ slack (8), so P ≤ 2^8 and l, O grow at most 256-fold over the
  // exact-max values, far inside fp32's range; (2) bf16 and fp32 rounding are relative, so P in [2^-8, 2^8]
  // carries the same relative error into O and l as P in [2^-16, 1]; (3) O and l are summed against the same
  // m, so O / l at the end is the exact-max result up to that rounding. m_new is m + move · max(tile max − m,
  // 0), arithmetic rather than a select: a select made ptxas spill registers at hd 256.
  constexpr float kSlack = 8.0f;
  auto softmax = [&](int j, float(&corr)[2]) {
    const int k0 = j * KEYS;
    if (k0 + KEYS - 1 > wg_row0) {
#pragma unroll
      for (int i = 0; i < KEYS / 2; ++i) {
        const int col = k0 + 8 * (i >> 2) + 2 * t4 + (i & 1);
        if (col > (i & 2 ? row_b : row_a)) s[i] = -INFINITY;
      }
    }
    // Max and sum as two chains per row (even and odd i): half the latency of one dependent chain.
    float mx[2] = {-INFINITY, -INFINITY}, mx_odd[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int i = 0; i < KEYS / 2; ++i) {
      float& acc = i & 1 ? mx_odd[(i >> 1) & 1] : mx[(i >> 1) & 1];
      acc = fmaxf(acc, s[i]);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mx[h] = fmaxf(mx[h], mx_odd[h]);
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      mx[h] *= scale_log2;
    }
    const bool grows = mx[0] > m[0] + kSlack || mx[1] > m[1] + kSlack;
    const float move = __any_sync(0xffffffffu, grows) ? 1.0f : 0.0f;
    float neg_m[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_new = j == 0 ? mx[h] : fmaf(move, fmaxf(mx[h] - m[h], 0.0f), m[h]);
      corr[h] = exp2f(m[h] - m_new);
      m[h] = m_new;
      neg_m[h] = -m_new;
      l[h] *= corr[h];
    }
    float l_odd[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < KEYS / 2; ++i) {
      const float e = exp2f(fmaf(s[i], scale_log2, neg_m[(i >> 1) & 1]));
      s[i] = e;
      (i & 1 ? l_odd[(i >> 1) & 1] : l[(i >> 1) & 1]) += e;
    }
    l[0] += l_odd[0];
    l[1] += l_odd[1];
  };
  // P as bf16 A fragments, one per 16 keys.
  auto pack_p = [&] {
#pragma unroll
    for (int kk = 0; kk < KEYS / 16; ++kk) {
      p[kk][0] = pack_bf16x2(s[8 * kk + 0], s[8 * kk + 1]);
      p[kk][1] = pack_bf16x2(s[8 * kk + 2], s[8 * kk + 3]);
      p[kk][2] = pack_bf16x2(s[8 * kk + 4], s[8 * kk + 5]);
      p[kk][3] = pack_bf16x2(s[8 * kk + 6], s[8 * kk + 7]);
    }
  };

  int kt = 0, qi = 0;  // key tiles passed, items with rows (as the producer counts them)
  for (int r = 0;; ++r) {
    int it;
    if constexpr (DYN) {
      mbar_wait(bar_q, qi & 1);  // the item's Q is in (waited again below: the same phase, at once)
      it = *item_slot;
      if (it < 0) break;
    } else {
      if (r >= rounds) break;
      it = item_of_round(r);
      if (it >= items) continue;
    }
    const Item w = item_at(it);
    if (w.q0 >= w.len) continue;
    const int ntiles = w.ntiles;
    wg_row0 = w.q0 + cw * 64;
    row_a = wg_row0 + warp * 16 + g, row_b = row_a + 8;
    // Tiles this warpgroup computes: up to the key of its last valid row, none without a valid row (its rows
    // are then not stored). It still waits for and releases the item's later tiles, as the producer counts
    // on.
    const int n_mine = wg_row0 < w.len ? (min(wg_row0 + 64, w.len) + KEYS - 1) / KEYS : 0;
    turns = ntiles + 1, turn = 0;
    if (cw == 1) named_bar_arrive(1, 256);  // consumer 0 goes first
#pragma unroll
    for (int i = 0; i < HD / 2; ++i) o[i] = 0.0f;
    m[0] = m[1] = -INFINITY, l[0] = l[1] = 0.0f;
    auto stage = [&](int j) { return (kt + j) % STAGES; };
    auto parity = [&](int j) { return uint32_t((kt + j) / STAGES) & 1u; };

    if (n_mine > 0) {
      float corr[2];
      mbar_wait(bar_q, qi & 1);
      mbar_wait(full_k(stage(0)), parity(0));
      turn_begin();
      wgmma_fence();
      issue_qk(stage(0));
      wgmma_commit();
      turn_end();
      wgmma_wait<0>();
      wgmma_fence_regs(s);
      release(empty_k(stage(0)));
      softmax(0, corr);  // O is still zero: nothing to rescale
      pack_p();

      for (int j = 1; j < n_mine; ++j) {
        const int st = stage(j), pst = stage(j - 1);
        mbar_wait(full_k(st), parity(j));
        mbar_wait(full_v(pst), parity(j - 1));
        turn_begin();
        wgmma_fence();  // s, o and p were last written by ordinary instructions
        issue_qk(st);
        wgmma_commit();
        issue_pv(pst);
        wgmma_commit();
        turn_end();
        wgmma_wait<1>();  // S_j is done (groups complete in order); P_{j−1}·V_{j−1} may still run
        wgmma_fence_regs(s);
        release(empty_k(st));
        softmax(j, corr);
        wgmma_wait<0>();
        wgmma_fence_regs(o);
        fence_p();
        release(empty_v(pst));
        if (corr[0] != 1.0f || corr[1] != 1.0f) {
#pragma unroll
          for (int i = 0; i < HD / 2; ++i) o[i] *= corr[(i >> 1) & 1];
        }
        pack_p();
      }
      release(empty_q);  // every S of the item is done: Q may take the next item's rows

      const int last = stage(n_mine - 1);
      mbar_wait(full_v(last), parity(n_mine - 1));
      turn_begin();
      wgmma_fence();
      issue_pv(last);
      wgmma_commit();
      turn_end();
      wgmma_wait<0>();
      wgmma_fence_regs(o);
      fence_p();
      release(empty_v(last));
    } else {
      release(empty_q);  // rows past len: this warpgroup never reads Q
    }
    for (int j = n_mine; j < ntiles; ++j) {  // tiles past this warpgroup's rows: let the producer reuse them
      turn_begin();
      turn_end();
      mbar_wait(full_k(stage(j)), parity(j));
      release(empty_k(stage(j)));
      mbar_wait(full_v(stage(j)), parity(j));
      release(empty_v(stage(j)));
    }
    while (turn < turns) {
      turn_begin();
      turn_end();
    }

    // Per warp, o is the HD / 8 m16n8 C fragments attn_store_rows takes, back to back.
    attn_store_rows<HD>(reinterpret_cast<const float(&)[HD / 8][4]>(o), l, out, ld_out, gate, ld_gate,
                        w.start, w.len, row_a, w.head, HD);
    kt += ntiles;
    ++qi;
  }
#endif
}

// ---- launchers ----
// Whether taking a tile's heads together (true) rather than a head's tiles (false) ends sooner on the zigzag
// rounds of the static schedule, in the model of benchmarks/schedule_model.py attention (every sequence taken
// as max_len long, an item costing its key tiles, each CTA's items adding up); the model picks the faster
// order measured at 24/4 (tiles) and 32/8 (heads). Cached per shape (a few thousand items a shape).
static bool heads_first_modelled(int64_t tiles, int hq, int num_seqs, int ctas, int keys) {
  static std::mutex mu;
  static std::map<std::tuple<int64_t, int, int, int, int>, bool> cache;
  const auto key = std::make_tuple(tiles, hq, num_seqs, ctas, keys);
  std::lock_guard<std::mutex> lock(mu);
  if (auto found = cache.find(key); found != cache.end()) return found->second;
  const int64_t len = tiles * 128, items = tiles * hq * num_seqs;
  auto work = [&](int64_t it, bool heads) {  // the item's key tiles, as item_at orders them
    const int64_t tile = heads ? it / hq % tiles : it % tiles, q0 = (tiles - 1 - tile) * 128;
    return double((std::min(q0 + 128, len) + keys - 1) / keys);
  };
  auto makespan = [&](bool heads) {
    std::vector<double> total(size_t(ctas), 0.0);
    for (int64_t it = 0; it < items; ++it) {
      const int64_t r = it / ctas, c = it % ctas;
      total[size_t(r & 1 ? ctas - 1 - c : c)] += work(it, heads);
    }
    return *std::max_element(total.begin(), total.end());
  };
  const bool heads = makespan(true) <= makespan(false);
  cache[key] = heads;
  return heads;
}

template <int HD, int KEYS, int STAGES>
static void attention_causal_ws_run(const bf16* q, int64_t ld_q, const bf16* k, int64_t ld_k, const bf16* v,
                                    int64_t ld_v, bf16* out, int64_t ld_out, const bf16* gate,
                                    int64_t ld_gate, const int32_t* cu, int num_seqs, int64_t tokens,
                                    int max_len, int hq, int hkv, float scale, int* next_item,
                                    cudaStream_t stream) {
  using Cfg = WsAttnCfg<HD, KEYS, STAGES>;
  const bool dyn = next_item != nullptr;
  const auto kernel = dyn ? attention_causal_ws_kernel<HD, KEYS, STAGES, true>
                          : attention_causal_ws_kernel<HD, KEYS, STAGES, false>;
  kernel_smem_opt_in(reinterpret_cast<const void*>(kernel), Cfg::kSmem, "attention_causal_ws_kernel");
  const CUtensorMap tq = tensor_map_bf16(q, tokens, (int64_t)hq * HD, ld_q, 64);
  const CUtensorMap tk = tensor_map_bf16(k, tokens, (int64_t)hkv * HD, ld_k, KEYS);
  const CUtensorMap tv = tensor_map_bf16(v, tokens, (int64_t)hkv * HD, ld_v, KEYS);
  // Heads next to each other in launch order share K and V (GQA), so the blocks resident together reuse
  // them from L2. The grid is one CTA an SM, each walking items (from the counter, or in zigzag rounds: the
  // kernel says how), so that one item's store and the next item's Q and first key tiles overlap instead of
  // a CTA's start waiting for the last one's end. Item order: the dynamic schedule takes each head's query
  // tiles in turn, longest first (within 2 % of the fastest order at both Qwen attention shapes on the H100
  // and the H200); the zigzag rounds take the order heads_first_modelled says ends sooner.
  const int64_t tiles = (max_len + Cfg::kRows - 1) / Cfg::kRows, items = tiles * hq * num_seqs;
  if (items == 0) return;  // attention_causal_sm90_launch keeps items below 2^31
  const int ctas = int(std::min<int64_t>(items, device_caps().sms));
  const bool heads_first = !dyn && heads_first_modelled(tiles, hq, num_seqs, ctas, KEYS);
  kernel<<<unsigned(ctas), Cfg::kThreads, Cfg::kSmem, stream>>>(tq, tk, tv, out, ld_out, gate, ld_gate, cu, hq,
                                                                  hkv, scale * 1.4426950408889634f,
                                                                  heads_first ? 1 : 0, int(tiles), int(items),
                                                                  next_item);
  DF_CUDA_CHECK_LAUNCH("attention_causal_ws_kernel");
}

// The dynamic schedule's item counter for `stream` on the current device (4 bytes each, kept for the
// process), zeroed on the stream before the launch that uses it, so launches on one stream take turns with it
// and launches on two streams never share one. nullptr while the stream is being captured into a graph and
// has no counter yet (cudaMalloc is not allowed then): the launch keeps the static schedule.
static int* item_counter(cudaStream_t stream) {
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, int*> counters;
  int dev = 0;
  DF_CUDA_CHECK(cudaGetDevice(&dev));
  int* c = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto found = counters.find({dev, stream});
    if (found != counters.end()) {
      c = found->second;
    } else {
      cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
      DF_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
      if (capturing != cudaStreamCaptureStatusNone) return nullptr;
      DF_CUDA_CHECK(cudaMalloc(&c, sizeof(int)));
      counters[{dev, stream}] = c;
    }
  }
  DF_CUDA_CHECK(cudaMemsetAsync(c, 0, sizeof(int), stream));
  return c;
}

bool attention_causal_sm90_launch(const bf16* q, int64_t ld_q, const bf16* k, int64_t ld_k, const bf16* v,
                                  int64_t ld_v, bf16* out, int64_t ld_out, const bf16* gate, int64_t ld_gate,
                                  const int32_t* cu, int num_seqs, int64_t tokens, int max_len, int hq,
                                  int hkv, int hd, float scale, cudaStream_t stream) {
  auto al16 = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  // scale > 0: the kernels take the running max over unscaled scores (the portable kernel takes any scale).
  const int64_t items = (int64_t(max_len) + 127) / 128 * hq * num_seqs;  // the kernel's 32-bit item index
  const bool shape_ok = (hd == 128 || hd == 256) && ld_q % 8 == 0 && ld_k % 8 == 0 && ld_v % 8 == 0 &&
                        ld_out % 2 == 0 && al16(q) && al16(k) && al16(v) &&
                        reinterpret_cast<uintptr_t>(out) % 4 == 0 && scale > 0.0f && items <= INT32_MAX;
  // Key tiles: hd 256 80 keys (as FlashAttention-3), hd 128 128 keys, 2 stages each: faster than 64-key
  // tiles at hd 256 and than 64 keys in 4 stages or 3 stages at hd 128.
  using Cfg256 = WsAttnCfg<256, 80, 2>;
  using Cfg128 = WsAttnCfg<128, 128, 2>;
  const size_t smem = hd == 256 ? Cfg256::kSmem : Cfg128::kSmem;
  if (attention_kernel_choose(device_caps(), kernel_variants(), shape_ok, smem) != AttentionKernel::sm90_ws)
    return false;
  int* next_item = item_counter(stream);
  if (hd == 256)
    attention_causal_ws_run<256, 80, 2>(q, ld_q, k, ld_k, v, ld_v, out, ld_out, gate, ld_gate, cu, num_seqs,
                                        tokens, max_len, hq, hkv, scale, next_item, stream);
  else
    attention_causal_ws_run<128, 128, 2>(q, ld_q, k, ld_k, v, ld_v, out, ld_out, gate, ld_gate, cu, num_seqs,
                                         tokens, max_len, hq, hkv, scale, next_item, stream);
  return true;
}

}  // namespace df
