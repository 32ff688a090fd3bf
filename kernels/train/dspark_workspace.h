// The device scratch of DSpark's head on the GPU (kernels/train/dspark_head.cu): its shape and where each
// buffer lives. Plain C++ with no CUDA header, as train_workspace.h beside it, so a planner built without
// CUDA can count the same bytes the launcher checks for.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/train/train_workspace.h"

namespace df {

// The Markov head's type (ops/dspark_head.h DrafterMarkovHead), none when markov_rank is 0.
enum class DSparkMarkov : int { none, vanilla, gated, rnn };

struct DSparkHeadShape {
  int64_t nb = 0;  // blocks (training); 1 for a proposal
  int B = 0, H = 0, V = 0, R = 0;
  DSparkMarkov markov = DSparkMarkov::none;
  bool confidence = false;         // enable_confidence_head
  bool confidence_markov = false;  // confidence_head_with_markov: its input is [z ; W1[prev]]

  // The Markov head's input row: gated [z ; e] (H + R), rnn [s ; e ; z] (2R + H), vanilla none (u = e).
  int cat_width() const {
    return markov == DSparkMarkov::gated ? H + R : markov == DSparkMarkov::rnn ? 2 * R + H : 0;
  }
  int e_col() const { return markov == DSparkMarkov::gated ? H : R; }        // e's first column in it
  int z_col() const { return markov == DSparkMarkov::gated ? 0 : 2 * R; }    // z's first column in it
  int pre_width() const { return markov == DSparkMarkov::rnn ? 3 * R : R; }  // the projection's outputs
  int confidence_in() const { return H + (confidence_markov ? R : 0); }
};

// Training over nb blocks (N = nb·B rows): the Markov head's forward state (input rows, gates, u), one chunk
// of draft and target logits f32 with the bf16 draft-logit gradient, the chunk's distinct target rows
// gathered (dspark_target_plan) with each row's index among them, the confidence logits and each row's L1,
// the backward's buffers, the W1 gradient's sort keys (previous token and row, one u64 each, padded as
// token_sort_keys pads them), the fixed-order column sums' partials and the statistics rows. Byte offsets,
// 256-byte aligned; logits and
// input rows padded to a multiple of 8 elements (16-byte aligned rows for the vector loads and cuBLASLt). Two
// f32 logit arrays a chunk, as Domino's: the chunk is half of chunk_rows.
struct DSparkLayout {
  int64_t N = 0, chunk = 0, ldv = 0, ldc = 0, ldr = 0, ldh = 0;
  size_t cat = 0, u = 0, pre = 0, gate = 0, cand = 0, uo = 0, sp = 0, conf = 0, l1 = 0;  // forward
  size_t dl = 0, tl = 0, gd = 0;                                                         // a chunk of logits
  size_t tidx = 0, tlist = 0, tg = 0;  // the target rows: index a row, lists, one chunk's rows gathered
  size_t dz = 0, du = 0, de = 0, dpre_f = 0, dpre_b = 0, din = 0, ds = 0, dconf = 0;  // backward
  int64_t n_sort = 0;                                                                 // keys sorted
  size_t keys = 0;                                                                    // W1's gradient
  size_t part = 0;                                                                    // column sums
  HeadStatOffsets stat;                                                               // statistics rows
  size_t bytes = 0;
};

inline DSparkLayout dspark_head_layout(const DSparkHeadShape& d, int64_t chunk_rows) {
  DSparkLayout L;
  L.N = d.nb * d.B;
  L.chunk = chunk_rows / 2 < L.N ? chunk_rows / 2 : L.N;
  if (L.chunk < 1) L.chunk = 1;
  L.ldv = round_up(d.V, 8);
  L.ldc = round_up(d.cat_width(), 8);
  L.ldr = round_up(d.R, 8);
  L.ldh = round_up(d.H, 8);
  WorkspaceCarver ws;
  auto take = [&](int64_t bytes) { return ws.take(bytes); };
  const int64_t N = L.N, R = d.R, P = d.pre_width(), f4 = 4, b2 = 2;
  const bool markov = d.markov != DSparkMarkov::none, rnn = d.markov == DSparkMarkov::rnn;
  if (markov) {
    L.cat = take(N * L.ldc * b2);
    L.u = take(N * L.ldr * b2);
    L.pre = take(N * P * f4);
    L.gate = take(N * R * f4);
    if (rnn) {
      L.cand = take(N * R * f4);
      L.uo = take(N * R * f4);
      L.sp = take(N * R * f4);  // row (j, k): the state s_{k−1} it reads
    }
  }
  L.conf = take(N * f4);
  L.l1 = take(N * f4);
  L.dl = take(L.chunk * L.ldv * f4);
  L.tl = take(L.chunk * L.ldv * f4);
  L.gd = take(L.chunk * L.ldv * b2);
  L.tidx = take(N * 4);
  L.tlist = take(N * 4);
  L.tg = take(L.chunk * L.ldh * b2);
  L.dz = take(N * int64_t(d.H) * f4);
  L.dconf = take(N * f4);
  if (markov) {
    L.du = take(N * R * f4);
    L.de = take(N * R * f4);
    L.dpre_f = take(N * P * f4);
    L.dpre_b = take(N * P * b2);
    L.din = take(N * L.ldc * f4);
    L.ds = take(d.nb * R * f4);
    L.n_sort = token_sort_keys(N);
    L.keys = take(L.n_sort * 8);
  }
  // The fixed-order column sums (dspark_colsum_launch, the confidence weight's): one row-chunk partial per
  // column of the widest, the projection's bias (P), the confidence weight (C) or its bias (1).
  const auto partials = [&](int64_t cols) { return column_partial_chunks(N, cols) * cols; };
  L.part = take(std::max({d.markov == DSparkMarkov::gated || rnn ? partials(P) : 0,
                          partials(d.confidence_in()), partials(1)}) *
                f4);
  L.stat = head_stat_offsets_take(ws, N);
  L.bytes = ws.off;
  return L;
}

// The target logits of a chunk, made once per distinct target row: chunk c's rows (block-major rows
// [c·chunk, (c + 1)·chunk)) read the target's final hidden state at target_rows[r], and neighbouring anchors'
// blocks overlap (512 anchors of 16 rows in 4,096 positions read each position twice on average), so a chunk
// holds most of its target rows twice. list[start[c], start[c + 1]) is chunk c's distinct target rows in
// increasing order, local[r] row r's index in its chunk's list.
struct DSparkTargetPlan {
  std::vector<int32_t> local, list;
  std::vector<int64_t> start;
};

inline DSparkTargetPlan dspark_target_plan(const int32_t* target_rows, int64_t N, int64_t chunk) {
  DSparkTargetPlan p;
  p.local.resize(size_t(N));
  p.list.reserve(size_t(N));
  p.start.push_back(0);
  for (int64_t p0 = 0; p0 < N; p0 += chunk) {
    const int64_t p1 = std::min(N, p0 + chunk);
    const auto first = p.list.end() - p.list.begin();
    p.list.insert(p.list.end(), target_rows + p0, target_rows + p1);
    std::sort(p.list.begin() + first, p.list.end());
    p.list.erase(std::unique(p.list.begin() + first, p.list.end()), p.list.end());
    for (int64_t r = p0; r < p1; ++r)
      p.local[size_t(r)] = int32_t(std::lower_bound(p.list.begin() + first, p.list.end(), target_rows[r]) -
                                   (p.list.begin() + first));
    p.start.push_back(int64_t(p.list.size()));
  }
  return p;
}

// One block's greedy proposals: the B rows of lm_head·z, one biased logits row, one Markov input row with its
// projection, state and u, the B tokens and B − 1 confidence logits.
struct DSparkProposeLayout {
  int64_t ldv = 0, ldc = 0, ldr = 0;
  size_t base = 0, fin = 0, cat = 0, pre = 0, s = 0, u = 0, tok = 0, conf = 0, bytes = 0;
};

inline DSparkProposeLayout dspark_propose_layout(const DSparkHeadShape& d) {
  DSparkProposeLayout L;
  L.ldv = round_up(d.V, 8);
  L.ldc = round_up(d.cat_width(), 8);
  L.ldr = round_up(d.R, 8);
  WorkspaceCarver ws;
  auto take = [&](int64_t bytes) { return ws.take(bytes); };
  L.base = take(d.B * L.ldv * 4);
  L.fin = take(L.ldv * 4);
  L.cat = take(L.ldc * 2);
  L.pre = take(int64_t(d.pre_width()) * 4);
  L.s = take(int64_t(d.R) * 4);
  L.u = take(L.ldr * 2);
  L.tok = take(d.B * 4);
  L.conf = take(d.B * 4);
  L.bytes = ws.off;
  return L;
}

inline size_t dspark_head_workspace_bytes(const DSparkHeadShape& d, int64_t chunk_rows) {
  return dspark_head_layout(d, chunk_rows).bytes;
}

}  // namespace df
