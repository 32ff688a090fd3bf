// The split-KV decode attention's plan (kernels/decode/decode_plan.h), which needs no GPU: for Qwen and odd
// GQA shapes, steps of 1 to 4096 tokens over caches up to 256 K tokens and devices of 1 to 188 SMs, a plan
// that says it fits must launch (threads within the kernel's launch bounds, shared memory within the
// device's, at least one stage, named barrier ids below 16), cover the cache with chunks that each hold keys,
// keep one CTA per SM where the grid allows, and write no more partials than the workspace the caller sized
// with attention_cached_workspace_bytes. On Hopper's 227 KB a block every plan fits; on devices with less
// (A100's 163 KB, the 99 KB of sm_86 / sm_89 / sm_120) the ones that do not fit go to the general kernel. A
// plan that broke one of these would fail only on a GPU, at launch, with wrong results or by writing past the
// workspace. The launchers' choices between the split-KV, transposed and general kernels
// (decode_attention_choose, gdn_decode_choose) are checked here too. A build without CUDA has no plan: one
// skipped test says so.
#include <gtest/gtest.h>

#ifndef DF_HAVE_CUDA
TEST(DecodeSplitPlan, SkippedWithoutCudaBuild) {
  GTEST_SKIP() << "built without CUDA: no split-KV decode kernels to plan";
}
#else
#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>

#include "kernels/decode/decode_plan.h"
#include "kernels/dispatch/dispatch.h"

using namespace df;

namespace {

struct Device {
  int sms;
  size_t smem;
  bool full;  // 227 KB a block (Hopper, B200): every plan must fit
};

}  // namespace

TEST(DecodeSplitPlan, EveryPlanLaunchesCoversTheCacheAndFitsItsWorkspace) {
  // Hopper's 227 KB a block at several SM counts (H100 SXM and H200, H100 PCIe, partitions of them); B200;
  // A100; an sm_89 board (L40S); an sm_120 board (RTX PRO 6000 Blackwell).
  const Device devices[] = {{132, 232448, true}, {114, 232448, true},  {66, 232448, true},
                            {16, 232448, true},  {7, 232448, true},    {1, 232448, true},
                            {148, 232448, true}, {108, 166912, false}, {142, 101376, false},
                            {188, 101376, false}};
  struct Shape {
    int hq, hkv, hd;
  };
  const Shape shapes[] = {{24, 4, 256},  {32, 8, 128}, {6, 1, 128},  {12, 2, 256}, {4, 4, 256},
                          {4, 4, 128},   {3, 1, 256},  {16, 2, 128}, {1, 1, 128},  {40, 8, 128},
                          {48, 16, 256}, {64, 4, 128}, {128, 1, 256}};
  int plans = 0, general = 0;
  for (const Device& d : devices)
    for (const Shape& sh : shapes)
      for (int64_t T : {1, 2, 3, 8, 16, 17, 33, 300, 4096})
        for (int64_t past : {0, 1, 63, 4095, 20000, 262144}) {
          if (!attention_split_shape(T, sh.hq, sh.hkv, sh.hd)) continue;
          const SplitPlan p = attention_split_plan(T, past, sh.hq, sh.hkv, sh.hd, d.sms, d.smem);
          const int64_t rows = T * (sh.hq / sh.hkv), keys = past + T;
          std::ostringstream where;
          where << "on " << d.sms << " SMs of " << d.smem << " B, " << sh.hq << "/" << sh.hkv << " x "
                << sh.hd << ", T " << T << ", past " << past << ": plan rows " << p.cta_rows << " x "
                << p.groups << ", tiles " << p.wtiles << ", halves " << p.halves << ", slices " << p.slices
                << ", wk " << p.wk << ", chunks " << p.chunks << " of " << p.chunk_len << ", stages "
                << p.stages << ", smem " << p.smem << (p.tr ? ", transposed" : "")
                << (p.fits ? "" : ", does not fit");
          SCOPED_TRACE(where.str());
          ++plans;
          if (d.full) ASSERT_TRUE(p.fits) << "a step off the split kernels on a 227 KB device";
          if (!p.fits) {
            ++general;
            continue;
          }
          // It launches.
          ASSERT_GE(p.threads(), 32);
          ASSERT_LE(p.threads(), attention_split_max_threads(p, sh.hd)) << "over the kernel's launch bounds";
          ASSERT_LE(p.threads(), 1024);
          ASSERT_LE(p.smem, d.smem) << "over the device's shared memory";
          ASSERT_GE(p.stages, 1);
          ASSERT_LE(p.stages, kSplitMaxStages) << "cp_async_wait_n waits for at most 5 groups";
          if (p.halves > 1)  // ids 1 + tile + wtiles·slice (attention_split_kernel), 1 + slice (transposed)
            ASSERT_LE(p.tr ? p.slices : p.wtiles * p.slices, 15) << "named barrier ids past 15";
          if (p.tr) {
            ASSERT_LE(rows, kSplitTrMaxRows);
            ASSERT_EQ(p.wtiles, 1);
            ASSERT_EQ(p.halves, kSplitTrParts);
            ASSERT_EQ(p.wk, 16);
          } else {
            ASSERT_LE(p.cta_rows, kSplitMaxRows);
            ASSERT_EQ(p.cta_rows % 16, 0);
            ASSERT_EQ(p.wtiles, (std::min<int64_t>(rows, p.cta_rows) + 15) / 16);
            ASSERT_EQ(p.wk, split_warp_keys(p.halves));
          }
          // Its grid covers every row and key, each chunk holding some.
          ASSERT_GE(int64_t(p.groups) * p.cta_rows, p.tr ? 0 : rows);
          ASSERT_LE(p.groups, 65535);
          ASSERT_GT(p.chunk_len, 0);
          ASSERT_EQ(p.chunk_len % (p.slices * p.wk), 0) << "chunks of whole stages";
          ASSERT_GE(int64_t(p.chunks) * p.chunk_len, keys);
          ASSERT_LT(int64_t(p.chunks - 1) * p.chunk_len, keys) << "a chunk with no key";
          // One CTA an SM where the kv heads' row groups leave room for it.
          const int64_t heads = int64_t(sh.hkv) * p.groups;
          if (heads <= d.sms) ASSERT_LE(heads * p.chunks, d.sms) << "a second wave of CTAs";
          // Its partials fit the workspace sized for the shape.
          const size_t part =
              sizeof(float) * size_t(sh.hkv) * size_t(p.chunks) * size_t(rows) * size_t(sh.hd + 2);
          ASSERT_LE(part, attention_split_workspace_bytes_for(T, sh.hq, sh.hkv, sh.hd, d.sms))
              << "partials past the workspace";
        }
  EXPECT_GT(plans, 5000);
  EXPECT_GT(general, 0)
      << "no plan on the 99 KB boards went to the general kernel: the fits rule is untested";
}

// The plans at the Qwen shapes after 4096 cached tokens on a 132-SM Hopper are the ones the kernels' comments
// describe: T 1 on the transposed kernel with pairs of warps (27B: 4 slices, two stages of 64 keys, 33 chunks a
// kv head; 8B: 6 slices, three stages of 96 keys, 15 chunks), and T 16 on the m16-tile kernel (27B: one group
// of 96 rows, pairs of warps a tile, one key slice, 33 chunks of four 32-key stages; 8B: 64 rows, one warp a
// tile, two key slices, 15 chunks of nine 32-key stages in a ring of six).
TEST(DecodeSplitPlan, QwenShapesTakeTheDocumentedPlans) {
  struct Want {
    int64_t T;
    int hq, hkv, hd;
    bool tr;
    int cta_rows, halves, slices, stages, chunk_len, chunks;
  };
  for (const Want& w :
       {Want{1, 24, 4, 256, true, 16, 2, 4, 2, 128, 33}, Want{1, 32, 8, 128, true, 16, 2, 6, 3, 288, 15},
        Want{16, 24, 4, 256, false, 96, 2, 1, 4, 128, 33},
        Want{16, 32, 8, 128, false, 64, 1, 2, 6, 288, 15}}) {
    const SplitPlan p = attention_split_plan(w.T, 4096, w.hq, w.hkv, w.hd, 132, 232448);
    SCOPED_TRACE(std::to_string(w.hq) + "/" + std::to_string(w.hkv) + " x " + std::to_string(w.hd) + ", T " +
                 std::to_string(w.T));
    EXPECT_TRUE(p.fits);
    EXPECT_EQ(p.tr, w.tr);
    EXPECT_EQ(p.cta_rows, w.cta_rows);
    EXPECT_EQ(p.groups, 1);
    EXPECT_EQ(p.halves, w.halves);
    EXPECT_EQ(p.slices, w.slices);
    EXPECT_EQ(p.stages, w.stages);
    EXPECT_EQ(p.chunk_len, w.chunk_len);
    EXPECT_EQ(p.chunks, w.chunks);
  }
}

// The launchers' choices: the split-KV kernels where the shape, the alignment and the device's shared memory
// allow; the general kernel otherwise and wherever the registry's decode=general sends decoding; the DeltaNet
// step on 16-column slices where its layout is vectorizable, 32-column slices otherwise.
TEST(DecodeSplitPlan, LaunchersChooseByShapeDeviceAndRegistry) {
  DeviceCaps hopper;
  hopper.sms = 132;
  hopper.smem_optin = 232448;
  const DeviceCaps sm120 = device_caps_profile(hopper, "sm120");
  const KernelVariants plain;
  KernelVariants general;
  general.decode_general = true;
  auto kernel = [](const DeviceCaps& caps, const KernelVariants& v, int64_t T, int hd, bool aligned) {
    return decode_attention_choose(caps, v, T, 4096, 24, 4, hd, aligned).kernel;
  };
  EXPECT_EQ(kernel(hopper, plain, 1, 256, true), DecodeAttnKernel::split);
  EXPECT_EQ(kernel(hopper, plain, 16, 256, true), DecodeAttnKernel::split);
  EXPECT_EQ(kernel(hopper, general, 1, 256, true), DecodeAttnKernel::general) << "decode=general";
  EXPECT_EQ(kernel(hopper, plain, 1, 256, false), DecodeAttnKernel::general) << "unaligned rows";
  EXPECT_EQ(kernel(hopper, plain, 1, 64, true), DecodeAttnKernel::general) << "no split kernel at hd 64";
  // 99 KB a block: the 27B verify step's 6 Q tiles and pairs' score slots leave no room for a stage at hd
  // 256; a one-token step still fits.
  EXPECT_EQ(kernel(sm120, plain, 16, 256, true), DecodeAttnKernel::general);
  EXPECT_EQ(kernel(sm120, plain, 1, 256, true), DecodeAttnKernel::split);
  const DecodeAttnChoice c = decode_attention_choose(hopper, plain, 1, 4096, 24, 4, 256, true);
  EXPECT_TRUE(c.plan.fits && c.plan.tr);

  EXPECT_EQ(gdn_decode_choose(plain, true, 128), GdnDecodeKernel::quad);
  EXPECT_EQ(gdn_decode_choose(plain, false, 128), GdnDecodeKernel::slice32) << "unaligned or dv % 4";
  EXPECT_EQ(gdn_decode_choose(general, true, 128), GdnDecodeKernel::general) << "decode=general";
}
#endif
