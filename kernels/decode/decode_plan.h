// Which kernels run a step of incremental decoding, and how the split-KV attention (attention_split_run,
// kernels/decode/decode_fast.cu) splits a step over a device, as plain host code (decode_plan.cu): the
// launchers ask here with the current device's DeviceCaps and the registry's KernelVariants
// (kernels/dispatch/dispatch.h), and tests/unit/test_decode_plan.cpp checks on any machine that every plan
// fits its kernel's launch bounds, the device's shared memory and the partials' workspace. The device is an
// input (its SM count and opt-in shared memory a block), so a plan can be made for a device other than the
// one present (a test profile's).
#pragma once
#include <cstddef>
#include <cstdint>

#include "kernels/dispatch/dispatch.h"

namespace df {

// The split kernels' build limits, shared by the kernels (launch bounds, ring sizes) and the plan.
constexpr int kSplitMaxRows = 128;  // query rows a CTA of attention_split_kernel
constexpr int kSplitMaxWarps = 8;   // warps a CTA of attention_split_kernel with one warp a row tile
constexpr int kSplitMaxStages = 6;  // ring stages a CTA (cp_async_wait_n waits for at most 5 groups)
constexpr int kSplitTrMaxRows = 8;  // rows a kv head of the steps the transposed kernel takes (its MMAs' N)
constexpr int kSplitTrParts = 2;    // warps a key slice of the transposed kernel, each half of the head dim
constexpr int kGdnQuadCols = 16;    // state columns a CTA of the DeltaNet decode's 16-column slice kernel

// Warps a CTA of attention_split_kernel may have: with pairs of warps a tile (halves 2), sized so their
// registers fit one CTA an SM (hd 256: 12 warps of up to 168 registers; hd 128: 16 of up to 128).
constexpr int split_max_warps(int hd, int halves) {
  return halves == 1 ? kSplitMaxWarps : hd == 256 ? 12 : 16;
}
// Keys a warp of attention_split_kernel takes a stage: one 16-key k-step of P·V, two on the pairs path, whose
// per-stage costs (the scores' exchange, the barriers, the rescale of acc) then come once per 32 keys.
constexpr int split_warp_keys(int halves) { return halves == 2 ? 32 : 16; }
// Warps a CTA of attention_split_tr_kernel may have (its launch bounds).
constexpr int split_tr_max_warps(int hd) { return hd == 256 ? 8 : 16; }

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
// device of `sms` SMs and `smem` bytes of opt-in shared memory a block.
SplitPlan attention_split_plan(int64_t T, int64_t past, int hq, int hkv, int hd, int sms, size_t smem);
// The most threads a CTA of the kernel that runs plan p may have (its launch bounds).
int attention_split_max_threads(const SplitPlan& p, int hd);
// Bytes of the per-chunk partials of any step of T tokens on a device of `sms` SMs (what
// attention_split_workspace_bytes gives on the current device).
size_t attention_split_workspace_bytes_for(int64_t T, int hq, int hkv, int hd, int sms);

// A decode attention step's kernels: the split-KV ones as `plan` says, or the general warp-per-row kernel.
enum class DecodeAttnKernel { split, general };
struct DecodeAttnChoice {
  DecodeAttnKernel kernel = DecodeAttnKernel::general;
  SplitPlan plan;  // of DecodeAttnKernel::split
};
// attention_cached_launch's choice for T new tokens after `past` cached ones: the split-KV kernels where the
// shape suits them (attention_split_shape; `aligned`: 16-byte aligned q, k, v rows and row strides) and their
// plan fits the device's shared memory; the general kernel otherwise, and everywhere under decode=general.
DecodeAttnChoice decode_attention_choose(const DeviceCaps& caps, const KernelVariants& v, int64_t T,
                                         int64_t past, int hq, int hkv, int hd, bool aligned);

// The DeltaNet decode step's kernel (gdn_decode_launch): 16-column state slices, four columns a thread, where
// dv is a multiple of 4 and the state rows are 16-byte aligned (`vec`); 32-column slices, a column a lane,
// otherwise; the general warp-per-column recurrence under decode=general.
enum class GdnDecodeKernel { quad, slice32, general };
GdnDecodeKernel gdn_decode_choose(const KernelVariants& v, bool vec, int dv);

}  // namespace df
