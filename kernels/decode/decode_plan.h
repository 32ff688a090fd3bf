// How the split-KV attention of incremental decoding (attention_split_run, kernels/decode/decode_fast.cu) splits one
// step over a device, as plain host code: the launcher asks for the current device's plan, and
// tests/unit/test_decode_plan.cpp checks on any machine that every plan fits its kernel's launch bounds, the
// device's shared memory and the partials' workspace.
#pragma once
#include <cstddef>
#include <cstdint>

namespace df {

// A step's rows (T new tokens × the hq / hkv query heads of a kv head) in `groups` groups of cta_rows; per
// group, wtiles m16 row tiles (1 on the transposed kernel), `halves` warps a tile (a key slice's warps on the
// transposed kernel), `slices` key slices of wk keys a stage; `chunks` per kv head of chunk_len keys, a ring
// of `stages` stages, `smem` bytes of dynamic shared memory a CTA. `fits`: at least one stage, and all of it,
// fit the device's shared memory (a device with less than Hopper's 227 KB a block may have no room for the
// verify step's Q tiles and a stage at hd 256; attention_cached_launch then takes the general kernel).
struct SplitPlan {
  int cta_rows = 0, groups = 0, wtiles = 0, halves = 0, wk = 0, slices = 0, chunks = 0, chunk_len = 0,
      stages = 0;
  bool tr = false;  // attention_split_tr_kernel rather than attention_split_kernel
  bool fits = false;
  size_t smem = 0;
  int threads() const { return 32 * wtiles * halves * slices; }
};

// Whether attention_split_run is built for the shape (hd 128 or 256, grid limits); hq a multiple of hkv.
bool attention_split_shape(int64_t T, int hq, int hkv, int hd);
// The plan of a step of T new tokens after `past` cached ones, for a shape attention_split_shape takes, on a
// device of `sms` SMs and `smem` bytes of opt-in shared memory a block; the A/B switches (DFLASH_SPLIT_*)
// read as a call reads them.
SplitPlan attention_split_plan(int64_t T, int64_t past, int hq, int hkv, int hd, int sms, size_t smem);
// The same on the current device: the plan attention_cached launches (a CUDA build only).
SplitPlan attention_split_plan_here(int64_t T, int64_t past, int hq, int hkv, int hd);
// The most threads a CTA of the kernel that runs plan p may have (its launch bounds).
int attention_split_max_threads(const SplitPlan& p, int hd);
// Bytes of the per-chunk partials of any step of T tokens on a device of `sms` SMs (what
// attention_split_workspace_bytes gives on the current device).
size_t attention_split_workspace_bytes_for(int64_t T, int hq, int hkv, int hd, int sms);

// Every environment variable the split-KV decode attention reads on a call: the plan's switches, the kernels'
// (DFLASH_SPLIT_COPY, DFLASH_SPLIT_MERGE) and DFLASH_DECODE's choice of the general kernels. test_decode_plan
// and bench_kernels decode unset them all before setting the ones a mode names.
inline constexpr const char* kDecodeSplitVars[] = {
    "DFLASH_DECODE",     "DFLASH_SPLIT_ROWS",   "DFLASH_SPLIT_T16", "DFLASH_SPLIT_PLAN",
    "DFLASH_SPLIT_WK",   "DFLASH_SPLIT_SLICES", "DFLASH_SPLIT_TR",  "DFLASH_SPLIT_TRWARPS",
    "DFLASH_SPLIT_COPY", "DFLASH_SPLIT_MERGE"};

}  // namespace df
