// The incremental-decoding ops of the CPU backend on awkward shapes, against the prefill ops they continue:
// attention_cached of the last rows over a cache equals attention_causal of the whole sequence, and
// gdn_decode run in pieces, each continuing from the state the previous piece saved, equals the recurrence
// over the whole sequence. Strided views with NaN guards catch reads and writes outside the views. (The CUDA
// versions are a later step; a GPU test would hold them to these same CPU results.)
#include <gtest/gtest.h>

#include "cpu_test_util.h"
#include "ops/cpu/cpu_gdn.h"
#include "ops/cpu/cpu_ops.h"

using namespace df;
using namespace df::test;

TEST(DecodeOps, AttentionCachedEqualsCausalRows) {
  CpuOps ops;
  std::mt19937 rng(3);
  const int hq = 6, hkv = 2, hd = 12;
  const int64_t L = 37, past = 30, T = L - past;
  for (bool gated : {false, true}) {
    Mat q(L, hq * hd, 5, 2), k(L, hkv * hd, 3, 1), v(L, hkv * hd, 4, 0), gate(L, hq * hd, 2, 1);
    q.fill_uniform(rng);
    k.fill_uniform(rng);
    v.fill_uniform(rng);
    gate.fill_uniform(rng, -3, 3);
    Mat full(L, hq * hd, 3, 1), part(T, hq * hd, 7, 3);
    auto one = packed_make({int(L)});
    const float scale = 0.29f;
    ops.attention_causal(q.t, k.t, v.t, full.t, one->seqs, hq, hkv, hd, scale, gated ? &gate.t : nullptr);
    Tensor gate_rows = gate.t.rows_view(past, T);
    ops.attention_cached(q.t.rows_view(past, T), k.t, v.t, part.t, past, hq, hkv, hd, scale,
                         gated ? &gate_rows : nullptr);
    // The same per-row loop over the same keys in the same order: identical bits.
    const std::vector<float> got = part.host(), all = full.host();
    for (int64_t i = 0; i < T * hq * hd; ++i)
      ASSERT_EQ(got[size_t(i)], all[size_t(past * hq * hd + i)])
          << "element " << i << (gated ? " gated" : "");
    EXPECT_EQ(part.guards_clobbered(), 0);
  }
  Mat small(T, hq * hd);
  EXPECT_THROW(ops.attention_cached(small.t, small.t.cols_view(0, hkv * hd), small.t.cols_view(0, hkv * hd),
                                    small.t, 1, hq, hkv, hd, 1.0f),
               Error);  // 1 cached + 7 new rows need 8 cache rows
}

TEST(DecodeOps, GdnDecodeContinuesTheRecurrence) {
  std::mt19937 rng(5);
  const GdnShape s{2, 6, 8, 5};  // 3 value heads per key head, dk ≠ dv
  const int64_t T = 23, qkv_cols = 2 * s.nk * s.dk + s.nv * s.dv, sdim = int64_t(s.nv) * s.dk * s.dv;
  Mat qkv(T, qkv_cols, 3, 1), a(T, s.nv, 2, 0), b(T, s.nv, 1, 1), A_log(1, s.nv), dt(1, s.nv);
  qkv.fill_uniform(rng);
  a.fill_uniform(rng, -2, 2);
  b.fill_uniform(rng, -2, 2);
  A_log.fill_uniform(rng, -1, 1);
  dt.fill_uniform(rng, -1, 1);
  Mat want(T, s.nv * s.dv);
  auto one = packed_make({int(T)});
  cpu_gdn_recurrent(qkv.t, a.t, b.t, A_log.t, dt.t, want.t, one->seqs, s);
  // Pieces of 1, 9, 6 and 7 tokens; each saves the states of its last 1..n tokens and the next starts from
  // the last of them.
  Mat state(1, sdim), got(T, s.nv * s.dv, 4, 2);
  for (int64_t i = 0; i < sdim; ++i) state.at(0, i) = 0.0f;
  int64_t t0 = 0;
  int saved = 1;
  for (int64_t n : {1, 9, 6, 7}) {
    Mat states(saved, sdim, 2, 1);
    cpu_gdn_decode(qkv.t.rows_view(t0, n), a.t.rows_view(t0, n), b.t.rows_view(t0, n), A_log.t, dt.t,
                   got.t.rows_view(t0, n), state.t, states.t, s);
    EXPECT_EQ(states.guards_clobbered(), 0);
    for (int64_t i = 0; i < sdim; ++i) state.at(0, i) = states.at(saved - 1, i);
    t0 += n;
    saved = std::min<int>(int(n), 3);  // the next piece keeps 1..3 states
  }
  // Token-by-token recurrence on both sides, the gates computed alike: identical bits.
  const std::vector<float> g = got.host(), w = want.host();
  for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], w[i]) << "element " << i;
  EXPECT_EQ(got.guards_clobbered(), 0);
  Mat too_many(T + 1, sdim);
  EXPECT_THROW(cpu_gdn_decode(qkv.t, a.t, b.t, A_log.t, dt.t, got.t, state.t, too_many.t, s), Error);
}
