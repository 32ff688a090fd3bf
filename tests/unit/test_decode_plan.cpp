// The split-KV decode attention's plan (kernels/decode/decode_plan.h), which needs no GPU: for Qwen and odd GQA
// shapes, steps of 1 to 4096 tokens over caches up to 256 K tokens, devices of 1 to 142 SMs and every A/B
// switch that changes the plan, a plan that says it fits must launch (threads within the kernel's launch
// bounds, shared memory within the device's, at least one stage, named barrier ids below 16), cover the cache
// with chunks that each hold keys, keep one CTA per SM where the grid allows, and write no more partials than
// the workspace the caller sized with attention_split_workspace_bytes. On Hopper's 227 KB a block every plan
// fits; on devices with less (A100's 163 KB, the 99 KB of sm_86 / sm_89) the ones that do not fit go to the
// general kernel. A plan that broke one of these would fail only on a GPU, at launch, with wrong results or
// by writing past the workspace. A build without CUDA has no plan: one skipped test says so.
#include <gtest/gtest.h>

#ifndef DF_HAVE_CUDA
TEST(DecodeSplitPlan, SkippedWithoutCudaBuild) {
  GTEST_SKIP() << "built without CUDA: no split-KV decode kernels to plan";
}
#else
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

#include "kernels/decode/decode_plan.h"

using namespace df;

namespace {

struct Setting {
  const char *var, *value, *var2, *value2;
};

void select_setting(const Setting& s) {
  for (const char* v : kDecodeSplitVars) unsetenv(v);
  if (*s.var) setenv(s.var, s.value, 1);
  if (*s.var2) setenv(s.var2, s.value2, 1);
}

struct Device {
  int sms;
  size_t smem;
  bool hopper;  // 227 KB a block: every plan must fit
};

}  // namespace

TEST(DecodeSplitPlan, EveryPlanLaunchesCoversTheCacheAndFitsItsWorkspace) {
  const Setting settings[] = {{"", "", "", ""},
                              {"DFLASH_SPLIT_TRWARPS", "1", "", ""},
                              {"DFLASH_SPLIT_TRWARPS", "4", "", ""},
                              {"DFLASH_SPLIT_TRWARPS", "4", "DFLASH_SPLIT_SLICES", "8"},
                              {"DFLASH_SPLIT_TRWARPS", "1", "DFLASH_SPLIT_SLICES", "16"},
                              {"DFLASH_SPLIT_SLICES", "1", "", ""},
                              {"DFLASH_SPLIT_SLICES", "2", "", ""},
                              {"DFLASH_SPLIT_SLICES", "6", "", ""},
                              {"DFLASH_SPLIT_SLICES", "16", "", ""},
                              {"DFLASH_SPLIT_ROWS", "16", "", ""},
                              {"DFLASH_SPLIT_ROWS", "48", "", ""},
                              {"DFLASH_SPLIT_T16", "old", "", ""},
                              {"DFLASH_SPLIT_T16", "pairs", "", ""},
                              {"DFLASH_SPLIT_T16", "pairs", "DFLASH_SPLIT_WK", "16"},
                              {"DFLASH_SPLIT_PLAN", "halve", "", ""},
                              {"DFLASH_SPLIT_TR", "0", "", ""}};
  // Hopper's 227 KB a block at several SM counts (H100 SXM and H200, H100 PCIe, partitions of them); A100;
  // an sm_89 board (L40S).
  const Device devices[] = {{132, 232448, true},  {114, 232448, true}, {66, 232448, true},
                            {16, 232448, true},   {7, 232448, true},   {1, 232448, true},
                            {108, 166912, false}, {142, 101376, false}};
  struct Shape {
    int hq, hkv, hd;
  };
  const Shape shapes[] = {{24, 4, 256},  {32, 8, 128}, {6, 1, 128},  {12, 2, 256}, {4, 4, 256},
                          {4, 4, 128},   {3, 1, 256},  {16, 2, 128}, {1, 1, 128},  {40, 8, 128},
                          {48, 16, 256}, {64, 4, 128}, {128, 1, 256}};
  int plans = 0, general = 0;
  for (const Setting& s : settings) {
    select_setting(s);
    for (const Device& d : devices)
      for (const Shape& sh : shapes)
        for (int64_t T : {1, 2, 3, 8, 16, 17, 33, 300, 4096})
          for (int64_t past : {0, 1, 63, 4095, 20000, 262144}) {
            if (!attention_split_shape(T, sh.hq, sh.hkv, sh.hd)) continue;
            const SplitPlan p = attention_split_plan(T, past, sh.hq, sh.hkv, sh.hd, d.sms, d.smem);
            const int64_t rows = T * (sh.hq / sh.hkv), keys = past + T;
            std::ostringstream where;
            if (*s.var) where << s.var << "=" << s.value << " ";
            if (*s.var2) where << s.var2 << "=" << s.value2 << " ";
            where << (*s.var ? "" : "no switch ") << "on " << d.sms << " SMs, " << sh.hq << "/" << sh.hkv
                  << " x " << sh.hd << ", T " << T << ", past " << past << ": plan rows " << p.cta_rows
                  << " x " << p.groups << ", tiles " << p.wtiles << ", halves " << p.halves << ", slices "
                  << p.slices << ", wk " << p.wk << ", chunks " << p.chunks << " of " << p.chunk_len
                  << ", stages " << p.stages << ", smem " << p.smem << (p.tr ? ", transposed" : "")
                  << (p.fits ? "" : ", does not fit");
            SCOPED_TRACE(where.str());
            ++plans;
            if (d.hopper) ASSERT_TRUE(p.fits) << "a Hopper step off the split kernels";
            if (!p.fits) {
              ++general;
              continue;
            }
            // It launches.
            ASSERT_GE(p.threads(), 32);
            ASSERT_LE(p.threads(), attention_split_max_threads(p, sh.hd))
                << "over the kernel's launch bounds";
            ASSERT_LE(p.threads(), 1024);
            ASSERT_LE(p.smem, d.smem) << "over the device's shared memory";
            ASSERT_GE(p.stages, 1);
            ASSERT_LE(p.stages, 6) << "cp_async_wait_n waits for at most 5 groups";
            if (p.halves > 1)  // ids 1 + tile + wtiles·slice (attention_split_kernel), 1 + slice (transposed)
              ASSERT_LE(p.tr ? p.slices : p.wtiles * p.slices, 15) << "named barrier ids past 15";
            if (p.tr) {
              ASSERT_LE(rows, 8);
              ASSERT_EQ(p.wtiles, 1);
              ASSERT_EQ(p.wk, 16);
            } else {
              ASSERT_LE(p.cta_rows, 128);
              ASSERT_EQ(p.cta_rows % 16, 0);
              ASSERT_EQ(p.wtiles, (std::min<int64_t>(rows, p.cta_rows) + 15) / 16);
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
  }
  select_setting({"", "", "", ""});
  EXPECT_GT(plans, 10000);
  EXPECT_GT(general, 0) << "no plan on the 99 KB board went to the general kernel: the fits rule is untested";
}

// The plans at the Qwen shapes on a 132-SM Hopper are the ones the kernels' comments describe and
// benchmarks/RESULTS.md timed: T 1 on the transposed kernel with pairs of warps (27B: 4 slices, two stages
// of 64 keys, 33 chunks a kv head; 8B: 6 slices, three stages of 96 keys, 15 chunks), four warps a slice with
// the same stages, and T 16 on the m16-tile kernel (27B: one group of 96 rows, pairs of warps a tile, one key
// slice, 33 chunks of four 32-key stages).
TEST(DecodeSplitPlan, QwenShapesTakeTheDocumentedPlans) {
  struct Want {
    const char* trwarps;  // DFLASH_SPLIT_TRWARPS, "" unset
    int64_t T;
    int hq, hkv, hd;
    bool tr;
    int cta_rows, halves, slices, stages, chunk_len, chunks;
  };
  for (const Want& w : {Want{"", 1, 24, 4, 256, true, 16, 2, 4, 2, 128, 33},
                        Want{"", 1, 32, 8, 128, true, 16, 2, 6, 3, 288, 15},
                        Want{"4", 1, 24, 4, 256, true, 16, 4, 4, 2, 128, 33},
                        Want{"4", 1, 32, 8, 128, true, 16, 4, 6, 3, 288, 15},
                        Want{"", 16, 24, 4, 256, false, 96, 2, 1, 4, 128, 33}}) {
    select_setting({*w.trwarps ? "DFLASH_SPLIT_TRWARPS" : "", w.trwarps, "", ""});
    const SplitPlan p = attention_split_plan(w.T, 4096, w.hq, w.hkv, w.hd, 132, 232448);
    SCOPED_TRACE(std::to_string(w.hq) + "/" + std::to_string(w.hkv) + " x " + std::to_string(w.hd) + ", T " +
                 std::to_string(w.T) +
                 (*w.trwarps ? std::string(", DFLASH_SPLIT_TRWARPS=") + w.trwarps : ""));
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
  select_setting({"", "", "", ""});
}
#endif
