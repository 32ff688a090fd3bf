// The one place that picks each op's kernel: from what the device has (DeviceCaps, read once per device, or
// a test profile that makes it act as another GPU) and, for tests and benchmarks only, what the one registry
// DFLASH_KERNEL_VARIANTS forces (KernelVariants, read once). Launchers ask here; nothing else in kernels/
// reads the environment. Plain C++ (no CUDA headers), so the unit tests check the rules without a GPU.
#pragma once
#include <algorithm>
#include <cstddef>
#include <string>

#include "kernels/primitives/kernel_error.h"

namespace df {

// What kernel choice depends on, for one device.
struct DeviceCaps {
  int cc_major = 0, cc_minor = 0;  // compute capability
  int sms = 0;
  size_t smem_optin = 0;   // shared memory a block may opt in to (cudaDevAttrMaxSharedMemoryPerBlockOptin)
  int max_cluster = 1;     // CTAs a cluster may hold at most; 1: no cluster launch (before compute 9.0)
  bool tma = false;        // bulk tensor copies: compute 9.0 or later with the driver's tensor-map encoder
  bool wgmma = false;      // warpgroup MMA: compute 9.0 exactly, and this build has sm_90a code
  std::string profile;     // the test profile in force ("" : the device as it is)
};

// The shared memory a block may opt in to on the GPUs with the least of it that the kernels are built for
// (sm_89 and sm_120, 99 KB): what every kernel's smallest form must fit.
inline constexpr size_t kSmemOptinLeast = 101376;

// The device as a test profile (`sm120`, `sm100`, `sm89`, `sm80`) would have it: its compute capability,
// and its shared memory, cluster size, TMA and wgmma each clamped to what both it and `real` have (the
// kernels still run on `real`). The SM count stays real's. An unknown name throws, listing the known ones.
inline DeviceCaps device_caps_profile(const DeviceCaps& real, const std::string& profile) {
  struct Profile {
    const char* name;
    int major, minor;
    size_t smem_optin;
    int max_cluster;
    bool tma, wgmma;
  };
  // RTX PRO 6000 / RTX 50 (99 KB a block, TMA, no wgmma), B200 / B300 (227 KB, TMA, no wgmma), Ada (99 KB,
  // no clusters, no TMA), A100 (163 KB, no clusters, no TMA): CUDA C programming guide, compute capabilities.
  static constexpr Profile kProfiles[] = {
      {"sm120", 12, 0, kSmemOptinLeast, 8, true, false},
      {"sm100", 10, 0, 232448, 8, true, false},
      {"sm89", 8, 9, kSmemOptinLeast, 1, false, false},
      {"sm80", 8, 0, 166912, 1, false, false},
  };
  if (profile.empty()) return real;
  for (const Profile& p : kProfiles) {
    if (profile != p.name) continue;
    DeviceCaps c = real;
    c.cc_major = p.major, c.cc_minor = p.minor;
    c.smem_optin = std::min(real.smem_optin, p.smem_optin);
    c.max_cluster = std::min(real.max_cluster, p.max_cluster);
    c.tma = real.tma && p.tma;
    c.wgmma = real.wgmma && p.wgmma;
    c.profile = profile;
    return c;
  }
  kernel_throw(__FILE__, __LINE__,
               "DFLASH_GPU_PROFILE=" + profile +
                   " is not a known GPU profile; HINT: use sm120, sm100, sm89 or sm80, or leave it unset for the "
                   "device as it is");
}

// Kernel forms that tests and benchmarks force to exercise a path the device would not take (the portable
// kernels on a Hopper GPU) or to measure against the default. Never needed in a normal run.
struct KernelVariants {
  bool attention_portable = false;        // attention=portable: prefill attention on the mma.sync kernel
  bool attention_portable_k32 = false;    // attention=portable_k32: the same with its 32-key (99 KB) tiles
  bool attention_native = false;  // attention=native: prefill attention on this project's kernel, never cuDNN
  bool attention_cudnn = false;   // attention=cudnn: prefill attention on cuDNN's fused attention, untimed
  bool dflash_attention_portable = false;  // dflash_attention=portable: DFlash attention on mma.sync kernels
  bool dflash_attention_small = false;     // dflash_attention=small: those in their small-smem form
  bool gdn_recurrent = false;  // gdn=recurrent: DeltaNet prefill as the fp32 token recurrence, not chunked
  bool gdn_one_stage = false;  // gdn=one_stage: the DeltaNet state pass in its one-stage (99 KB) form
  bool gemm_heuristic = false;  // gemm=heuristic: cuBLASLt's first heuristic pick, no timing of candidates
  bool gemm_log = false;        // gemm=log: print each GEMM shape's decision (tuned, reused, refused)
  bool decode_general = false;  // decode=general: incremental decoding on the general warp-per-row kernels
};

// One accepted `op=value` item of the registry and the flag it sets.
struct KernelVariantItem {
  const char* op;
  const char* value;
  bool KernelVariants::*flag;
};
inline constexpr KernelVariantItem kKernelVariantItems[] = {
    {"attention", "portable", &KernelVariants::attention_portable},
    {"attention", "portable_k32", &KernelVariants::attention_portable_k32},
    {"attention", "native", &KernelVariants::attention_native},
    {"attention", "cudnn", &KernelVariants::attention_cudnn},
    {"dflash_attention", "portable", &KernelVariants::dflash_attention_portable},
    {"dflash_attention", "small", &KernelVariants::dflash_attention_small},
    {"gdn", "recurrent", &KernelVariants::gdn_recurrent},
    {"gdn", "one_stage", &KernelVariants::gdn_one_stage},
    {"gemm", "heuristic", &KernelVariants::gemm_heuristic},
    {"gemm", "log", &KernelVariants::gemm_log},
    {"decode", "general", &KernelVariants::decode_general},
};

// Parses "op=value,op=value" (spaces around items ignored; empty: the defaults). An unknown item throws,
// naming it, where it came from (`source`) and every accepted item.
inline KernelVariants kernel_variants_parse(const std::string& spec,
                                            const char* source = "DFLASH_KERNEL_VARIANTS") {
  KernelVariants v;
  auto trim = [](const std::string& t) {
    const size_t a = t.find_first_not_of(' '), b = t.find_last_not_of(' ');
    return a == std::string::npos ? std::string() : t.substr(a, b - a + 1);
  };
  for (size_t at = 0; at <= spec.size();) {
    const size_t end = std::min(spec.find(',', at), spec.size());
    const std::string item = trim(spec.substr(at, end - at));
    at = end + 1;
    if (item.empty()) continue;
    bool* flag = nullptr;
    for (const KernelVariantItem& k : kKernelVariantItems)
      if (item == std::string(k.op) + "=" + k.value) flag = &(v.*k.flag);
    if (flag == nullptr) {
      std::string known;
      for (const KernelVariantItem& k : kKernelVariantItems)
        known += std::string(known.empty() ? "" : ", ") + k.op + "=" + k.value;
      kernel_throw(__FILE__, __LINE__,
                   std::string(source) + ": unknown kernel variant \"" + item + "\" in \"" + spec +
                       "\"; HINT: a comma-separated list of " + known +
                       " (a test and benchmark hook: leave it unset in normal runs)");
    }
    *flag = true;
  }
  return v;
}

// The variants in force: DFLASH_KERNEL_VARIANTS, parsed at the first call, unless kernel_variants_set
// replaced them since.
const KernelVariants& kernel_variants();
// Tests and benchmarks that run several forms in one process: the variants in force from now on.
void kernel_variants_set(const KernelVariants& v);
// `v` with `flag` set to `on`: what a test or benchmark passes to kernel_variants_set to force one form.
inline KernelVariants kernel_variants_with(KernelVariants v, bool KernelVariants::*flag, bool on) {
  v.*flag = on;
  return v;
}

// Lets `kernel` (a __global__ function) launch with `bytes` of dynamic shared memory on the current device, or
// throws naming `what`, the bytes and the limit of the device (of its test profile under DFLASH_GPU_PROFILE)
// when it may not: every launch that asks for more than the 48 KB default goes through here.
void kernel_smem_opt_in(const void* kernel, size_t bytes, const char* what);

// The current device's capabilities, read at the first call on each device, under the test profile
// DFLASH_GPU_PROFILE when it is set (device_caps_profile). Defined with the kernels (CUDA builds only).
const DeviceCaps& device_caps();

// One line naming what dispatch sees: "compute 9.0, 132 SMs, 227 KB shared memory a block, clusters of 8,
// TMA, wgmma", and under a test profile "DFLASH_GPU_PROFILE=sm120: " before it. Benchmarks print it so a
// figure says which paths it measured.
std::string device_caps_summary(const DeviceCaps& c);

// ---- the choices -------------------------------------------------------------------------------------
// (Incremental decoding's choices need the split-KV plan: decode_attention_choose and gdn_decode_choose in
// kernels/decode/decode_plan.h.)

// Prefill attention (attention_causal_launch): the warp-specialized wgmma kernel where the device has wgmma
// and TMA, the shape suits it (`sm90_shape`: head dim 128 or 256, 16-byte aligned rows) and its shared memory
// fits; the portable mma.sync kernel (every GPU) otherwise.
enum class AttentionKernel { sm90_ws, portable };
inline AttentionKernel attention_kernel_choose(const DeviceCaps& caps, const KernelVariants& v, bool sm90_shape,
                                               size_t sm90_smem) {
  const bool forced = v.attention_portable || v.attention_portable_k32;
  const bool sm90 = !forced && caps.wgmma && caps.tma && sm90_shape && sm90_smem <= caps.smem_optin;
  return sm90 ? AttentionKernel::sm90_ws : AttentionKernel::portable;
}

// Prefill attention between this project's kernels (attention_kernel_choose's pick) and cuDNN's fused flash
// attention, which measured faster on some devices and shapes: the registry's attention=native and the
// portable forms keep ours, attention=cudnn takes cuDNN (the launcher refuses it where cuDNN cannot serve the
// call); otherwise ours where cuDNN cannot serve the call (`cudnn_ok`: built, loaded, the layout fits) and on
// a stream being captured into a CUDA graph (timing would synchronise it, and cuDNN's workspace could not
// grow), else the measured choice for the call's shape class (`measured`: -1 not measured yet, 0 ours, 1
// cuDNN), a class not measured yet being measured now.
enum class AttentionImpl { ours, cudnn, measure };
inline AttentionImpl attention_impl_choose(const KernelVariants& v, bool cudnn_ok, bool capturing,
                                           int measured) {
  if (v.attention_cudnn) return AttentionImpl::cudnn;
  if (v.attention_native || v.attention_portable || v.attention_portable_k32 || !cudnn_ok || capturing)
    return AttentionImpl::ours;
  if (measured >= 0) return measured == 1 ? AttentionImpl::cudnn : AttentionImpl::ours;
  return AttentionImpl::measure;
}

// The smallest power of two >= max(n, least): the buckets of cuDNN's attention plans (sequences a batch,
// longest sequence) and of the measured choice's shape classes, so a run whose batches vary builds and
// measures a few times per power of two rather than at every distinct size.
constexpr int64_t pow2_bucket(int64_t n, int64_t least) {
  int64_t b = least;
  while (b < n) b *= 2;
  return b;
}

// The portable prefill attention's block (kernels/attention/attention.cu) for a head dim padded to `hd_pad`
// (16..256): its query rows, 16 a warp. At hd 256 the 251-register warps allow one block an SM either way, so
// 128 rows halve the K/V tile traffic per FLOP; smaller heads keep 64 rows and several blocks an SM.
constexpr int attention_portable_rows(int hd_pad) {
  return hd_pad >= 256 ? 128 : 64;
}
// Its dynamic shared memory in bytes with `keys`-key tiles: the Q tile, one K and one V tile, bf16 rows
// padded by 16 bytes.
constexpr size_t attention_portable_smem(int hd_pad, int keys) {
  return 2 * size_t(attention_portable_rows(hd_pad) + 2 * keys) * size_t(hd_pad + 8);
}

// The portable prefill attention's keys per K/V tile: 64, or 32 where the 64-key form's shared memory is more
// than a block may have (hd 256: 135168 bytes, past the 101376 of sm_86, sm_89 and sm_120) or where the
// registry's attention=portable_k32 asks for it. The 32-key form keeps the 128 rows at hd 256 (8 warps; 64
// rows would leave 4 warps an SM to hide the ldmatrix and mma.sync latency) and fits in exactly 101376 bytes;
// it pays two barriers per 32 keys instead of per 64.
inline int attention_portable_keys_choose(const DeviceCaps& caps, const KernelVariants& v, int hd_pad) {
  return v.attention_portable_k32 || attention_portable_smem(hd_pad, 64) > caps.smem_optin ? 32 : 64;
}

// DFlash attention forward and backward: the wgmma kernels (K/V streamed by TMA) where the device has wgmma
// and TMA and the shape suits them (`wgmma_shape`: head dim 65..128, 16-byte copies, 32-bit row indices);
// the portable mma.sync kernels otherwise (and where the registry forces them or their small form).
enum class DFlashAttnKernel { wgmma, portable };
inline DFlashAttnKernel dflash_attention_kernel_choose(const DeviceCaps& caps, const KernelVariants& v,
                                                       bool wgmma_shape) {
  const bool forced = v.dflash_attention_portable || v.dflash_attention_small;
  const bool wg = !forced && caps.wgmma && caps.tma && wgmma_shape;
  return wg ? DFlashAttnKernel::wgmma : DFlashAttnKernel::portable;
}

// The shared-memory form of one portable DFlash attention pass at one head dim: the large form where what it
// asks (`large_smem`) fits the device's opt-in shared memory (Hopper, B200 / B300, A100 up to head dim 128);
// the small form, built to fit the 101376 bytes of sm_120 and sm_89, otherwise or where the registry forces
// it.
enum class DFlashAttnForm { large, small };
inline DFlashAttnForm dflash_attention_form_choose(const DeviceCaps& caps, const KernelVariants& v,
                                                   size_t large_smem) {
  return v.dflash_attention_small || large_smem > caps.smem_optin ? DFlashAttnForm::small
                                                                  : DFlashAttnForm::large;
}

// CTAs of the cluster that shares one key tile of the portable dk/dv pass: 4 where the device launches such
// clusters; 1 (a plain launch, one CTA walking every block that sees its tile) on GPUs without clusters.
inline int dflash_attention_kv_ranks_choose(const DeviceCaps& caps) {
  return caps.max_cluster >= 4 ? 4 : 1;
}

// DeltaNet prefill: the chunked kernels where the layout suits them (`chunked_layout`), the fp32 token
// recurrence otherwise.
enum class GdnPrefillKernel { chunked, recurrent };
inline GdnPrefillKernel gdn_prefill_kernel_choose(const KernelVariants& v, bool chunked_layout) {
  return chunked_layout && !v.gdn_recurrent ? GdnPrefillKernel::chunked : GdnPrefillKernel::recurrent;
}

// The DeltaNet prefill's state pass (gdn_state_kernel, after the chunk kernel): two pipeline stages (the next
// chunk's tiles copied while this one is computed) where they fit the device's shared memory a block
// (`two_stage_smem`: their bytes, gdn_state_smem_bytes); one stage otherwise, each tile refilled for the next
// chunk as soon as this one has read it, in about half the bytes (what 99 KB devices take at head dim 128).
enum class GdnStateKernel { two_stage, one_stage };
inline GdnStateKernel gdn_state_kernel_choose(const DeviceCaps& caps, const KernelVariants& v,
                                              size_t two_stage_smem) {
  const bool two = !v.gdn_one_stage && two_stage_smem <= caps.smem_optin;
  return two ? GdnStateKernel::two_stage : GdnStateKernel::one_stage;
}

// The lm_head loss row kernel's CTAs a row (one cluster): `want`, at most what the device launches as one
// cluster (1: no cluster launch).
inline int lm_row_ctas_choose(const DeviceCaps& caps, int want) {
  return std::max(1, std::min(want, caps.max_cluster));
}

}  // namespace df
