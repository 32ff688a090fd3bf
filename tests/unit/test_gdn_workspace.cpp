// The CUDA Gated DeltaNet workspace arithmetic (kernels/gdn/gdn_workspace.h), which the launcher checks against
// and the VRAM planner counts: hand-computed sizes, the tile widths the kernels are built for, offsets that
// keep the float4 row scalars aligned, and a size that never shrinks as the batch grows.
#include <gtest/gtest.h>

#include "kernels/gdn/gdn_workspace.h"

using namespace df;

TEST(GdnWorkspace, TileDimRoundsUpTo32_64_128) {
  EXPECT_EQ(gdn_prefill_tile_dim(8, 8), 32);
  EXPECT_EQ(gdn_prefill_tile_dim(16, 40), 64);  // the larger of dk and dv decides
  EXPECT_EQ(gdn_prefill_tile_dim(64, 32), 64);
  EXPECT_EQ(gdn_prefill_tile_dim(72, 8), 128);
  EXPECT_EQ(gdn_prefill_tile_dim(128, 128), 128);
}

// Byte counts are exact integers, so equality is the right test.
TEST(GdnWorkspace, BytesMatchHandArithmetic) {
  // Qwen3.6-27B at the 32K budget: 48 value heads, dk = dv = 128 -> per (token, head) W, U 2·2·128 B + scores
  // 2·64 B + scalars 16 B = 656 B; 32768 · 48 · 656 = 1,031,798,784 B.
  EXPECT_EQ(gdn_prefill_workspace_bytes(32768, 48, 128, 128), size_t(1031798784));
  // 7 tokens, 3 heads, dk 16 / dv 40 (D 64): 21 rows x (2·2·64 + 128 + 16) = 21 x 400.
  const GdnWorkspaceLayout l = gdn_prefill_workspace_layout(7, 3, 16, 40);
  EXPECT_EQ(l.w, 0u);
  EXPECT_EQ(l.u, 21u * 128);
  EXPECT_EQ(l.scores, 21u * 256);
  EXPECT_EQ(l.scalars, 21u * 384);
  EXPECT_EQ(l.total, 21u * 400);
  EXPECT_EQ(gdn_prefill_workspace_bytes(0, 48, 128, 128), 0u);
}

TEST(GdnWorkspace, OffsetsStay16ByteAlignedAndSizeGrowsWithTokens) {
  for (int64_t T : {1, 3, 7, 19, 65, 733})
    for (int nv : {1, 3, 48})
      for (auto [dk, dv] : {std::pair{8, 8}, {16, 40}, {128, 128}, {72, 24}}) {
        const GdnWorkspaceLayout l = gdn_prefill_workspace_layout(T, nv, dk, dv);
        for (size_t off : {l.u, l.scores, l.scalars})
          EXPECT_EQ(off % 16, 0u) << "T " << T << " nv " << nv << " dk " << dk << " dv " << dv;
        EXPECT_LT(l.u, l.scores);
        EXPECT_LT(l.scalars, l.total);
        // A workspace planned for a larger batch serves every smaller one.
        EXPECT_LT(l.total, gdn_prefill_workspace_bytes(T + 1, nv, dk, dv));
      }
}
