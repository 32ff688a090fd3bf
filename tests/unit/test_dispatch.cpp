// The kernel dispatch rules (kernels/dispatch/dispatch.h) without a GPU: the registry's parsing and its
// errors, the test profiles' clamping, and each op's choice from the capabilities, the shape and the registry.
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "core/error.h"
#include "kernels/dispatch/dispatch.h"
#include "kernels/gdn/gdn_workspace.h"

using namespace df;

namespace {

// An H100 SXM as device_caps reads it from an sm_90a build.
DeviceCaps h100() {
  DeviceCaps c;
  c.cc_major = 9, c.cc_minor = 0, c.sms = 132, c.smem_optin = 232448, c.max_cluster = 8;
  c.tma = true, c.wgmma = true;
  return c;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST(KernelVariants, ParsesItemsAndDefaults) {
  const KernelVariants none = kernel_variants_parse("");
  EXPECT_FALSE(none.attention_portable || none.attention_portable_k32 || none.dflash_attention_portable ||
               none.gdn_recurrent || none.gemm_heuristic || none.gemm_log);
  const KernelVariants v = kernel_variants_parse(" attention=portable, gemm=log ,,gdn=recurrent");
  EXPECT_TRUE(v.attention_portable);
  EXPECT_TRUE(v.gemm_log);
  EXPECT_TRUE(v.gdn_recurrent);
  EXPECT_FALSE(v.dflash_attention_portable);
  EXPECT_FALSE(v.attention_portable_k32);
  EXPECT_FALSE(v.gemm_heuristic);
  for (const KernelVariantItem& item : kKernelVariantItems) {
    const KernelVariants one = kernel_variants_parse(std::string(item.op) + "=" + item.value);
    EXPECT_TRUE(one.*item.flag) << item.op << "=" << item.value;
    EXPECT_TRUE(kernel_variants_with(none, item.flag, true).*item.flag) << item.op << "=" << item.value;
    EXPECT_FALSE(kernel_variants_with(one, item.flag, false).*item.flag) << item.op << "=" << item.value;
  }
}

TEST(KernelVariants, UnknownItemNamesItAndTheAcceptedOnes) {
  const std::string m = error_of([] { kernel_variants_parse("attention=portable,attention=mma"); });
  EXPECT_NE(m.find("DFLASH_KERNEL_VARIANTS"), std::string::npos) << m;
  EXPECT_NE(m.find("\"attention=mma\""), std::string::npos) << m;
  EXPECT_NE(m.find("dflash_attention=portable"), std::string::npos) << m;
  EXPECT_NE(m.find("gemm=heuristic"), std::string::npos) << m;
  const std::string m2 = error_of([] { kernel_variants_parse("portable", "test spec"); });
  EXPECT_NE(m2.find("test spec"), std::string::npos) << m2;
  EXPECT_NE(m2.find("\"portable\""), std::string::npos) << m2;
}

TEST(DeviceCaps, ProfilesClampToTheOtherDevice) {
  const DeviceCaps real = h100();
  const DeviceCaps same = device_caps_profile(real, "");
  EXPECT_EQ(same.cc_major, 9);
  EXPECT_TRUE(same.wgmma);
  EXPECT_EQ(same.profile, "");

  const DeviceCaps b = device_caps_profile(real, "sm120");
  EXPECT_EQ(b.cc_major, 12);
  EXPECT_EQ(b.cc_minor, 0);
  EXPECT_EQ(b.sms, 132) << "the kernels still run on the real device's SMs";
  EXPECT_EQ(b.smem_optin, size_t(101376));
  EXPECT_EQ(b.max_cluster, 8);
  EXPECT_TRUE(b.tma);
  EXPECT_FALSE(b.wgmma);
  EXPECT_EQ(b.profile, "sm120");

  const DeviceCaps dc = device_caps_profile(real, "sm100");
  EXPECT_EQ(dc.smem_optin, size_t(232448));
  EXPECT_FALSE(dc.wgmma);
  EXPECT_TRUE(dc.tma);

  const DeviceCaps ada = device_caps_profile(real, "sm89");
  EXPECT_EQ(ada.cc_major, 8);
  EXPECT_EQ(ada.cc_minor, 9);
  EXPECT_EQ(ada.max_cluster, 1);
  EXPECT_FALSE(ada.tma);
  EXPECT_FALSE(ada.wgmma);

  const DeviceCaps ampere = device_caps_profile(real, "sm80");
  EXPECT_EQ(ampere.smem_optin, size_t(166912));
  EXPECT_FALSE(ampere.tma);

  // A profile never grants what the real device lacks.
  DeviceCaps small = ada;
  small.profile.clear();
  const DeviceCaps up = device_caps_profile(small, "sm100");
  EXPECT_EQ(up.smem_optin, size_t(101376));
  EXPECT_EQ(up.max_cluster, 1);
  EXPECT_FALSE(up.tma);
}

TEST(DeviceCaps, UnknownProfileIsAClearError) {
  const std::string m = error_of([] { device_caps_profile(h100(), "sm70"); });
  EXPECT_NE(m.find("DFLASH_GPU_PROFILE=sm70"), std::string::npos) << m;
  EXPECT_NE(m.find("sm120, sm100, sm89 or sm80"), std::string::npos) << m;
}

TEST(KernelChoice, PrefillAttention) {
  const DeviceCaps hopper = h100();
  const KernelVariants defaults;
  KernelVariants portable;
  portable.attention_portable = true;
  EXPECT_EQ(attention_kernel_choose(hopper, defaults, true, 200000), AttentionKernel::sm90_ws);
  EXPECT_EQ(attention_kernel_choose(hopper, defaults, false, 200000), AttentionKernel::portable);
  EXPECT_EQ(attention_kernel_choose(hopper, defaults, true, 240000), AttentionKernel::portable)
      << "more shared memory than a block may have";
  EXPECT_EQ(attention_kernel_choose(hopper, portable, true, 200000), AttentionKernel::portable);
  for (const char* p : {"sm120", "sm100", "sm89", "sm80"})
    EXPECT_EQ(attention_kernel_choose(device_caps_profile(hopper, p), defaults, true, 200000),
              AttentionKernel::portable)
        << p;
}

// Ours or cuDNN's prefill attention: the registry forces either side (the portable forms count as ours), a
// call cuDNN cannot serve and a call under a CUDA graph capture stay ours, a measured class keeps its pick,
// an unmeasured one is measured.
TEST(KernelChoice, PrefillAttentionOursOrCudnn) {
  const KernelVariants defaults;
  KernelVariants native, cudnn, portable, k32;
  native.attention_native = cudnn.attention_cudnn = portable.attention_portable = k32.attention_portable_k32 =
      true;
  using I = AttentionImpl;
  EXPECT_EQ(attention_impl_choose(defaults, true, false, -1), I::measure);
  EXPECT_EQ(attention_impl_choose(defaults, true, true, -1), I::ours) << "no timing during a capture";
  EXPECT_EQ(attention_impl_choose(defaults, true, true, 1), I::ours) << "cuDNN's workspace cannot grow then";
  EXPECT_EQ(attention_impl_choose(cudnn, true, true, -1), I::cudnn) << "forced";
  EXPECT_EQ(attention_impl_choose(defaults, true, false, 0), I::ours);
  EXPECT_EQ(attention_impl_choose(defaults, true, false, 1), I::cudnn);
  EXPECT_EQ(attention_impl_choose(defaults, false, false, -1), I::ours) << "cuDNN cannot serve the call";
  EXPECT_EQ(attention_impl_choose(defaults, false, false, 1), I::ours);
  for (const KernelVariants& v : {native, portable, k32}) {
    EXPECT_EQ(attention_impl_choose(v, true, false, -1), I::ours);
    EXPECT_EQ(attention_impl_choose(v, true, false, 1), I::ours);
  }
  EXPECT_EQ(attention_impl_choose(cudnn, true, false, -1), I::cudnn);
  EXPECT_EQ(attention_impl_choose(cudnn, true, false, 0), I::cudnn);
  EXPECT_EQ(attention_impl_choose(cudnn, false, false, 0), I::cudnn)
      << "forced: the launcher says why it cannot";
}

TEST(KernelChoice, PowerOfTwoBuckets) {
  EXPECT_EQ(pow2_bucket(1, 1), 1);
  EXPECT_EQ(pow2_bucket(3, 1), 4);
  EXPECT_EQ(pow2_bucket(8, 1), 8);
  EXPECT_EQ(pow2_bucket(9, 1), 16);
  EXPECT_EQ(pow2_bucket(1, 64), 64);
  EXPECT_EQ(pow2_bucket(64, 64), 64);
  EXPECT_EQ(pow2_bucket(257, 64), 512);
  EXPECT_EQ(pow2_bucket(32768, 64), 32768);
}

// The portable prefill attention's tiles: every head dim the op takes (padded to 16..256) gets a form that
// fits the shared memory of every device profile; the 64-key form stays wherever it fits (Hopper, sm_100,
// sm_80).
TEST(KernelChoice, PortableAttentionFitsEveryDevice) {
  const DeviceCaps hopper = h100();
  const KernelVariants defaults;
  EXPECT_EQ(attention_portable_smem(256, 64), size_t(135168))
      << "the 64-key form at hd 256: more than the 101376 of sm120";
  EXPECT_EQ(attention_portable_smem(256, 32), size_t(101376));
  EXPECT_EQ(attention_portable_smem(128, 64), size_t(52224));
  for (const char* p : {"", "sm120", "sm100", "sm89", "sm80"}) {
    const DeviceCaps caps = device_caps_profile(hopper, p);
    for (int hd_pad : {16, 32, 64, 128, 256}) {
      const int keys = attention_portable_keys_choose(caps, defaults, hd_pad);
      EXPECT_LE(attention_portable_smem(hd_pad, keys), caps.smem_optin) << p << " hd " << hd_pad;
      const bool small = std::string(p) == "sm120" || std::string(p) == "sm89";
      EXPECT_EQ(keys, small && hd_pad == 256 ? 32 : 64) << p << " hd " << hd_pad;
    }
  }
  KernelVariants k32;
  k32.attention_portable_k32 = true;
  for (int hd_pad : {16, 128, 256}) EXPECT_EQ(attention_portable_keys_choose(hopper, k32, hd_pad), 32);
  EXPECT_EQ(attention_kernel_choose(hopper, k32, true, 200000), AttentionKernel::portable)
      << "attention=portable_k32 forces the portable kernel as attention=portable does";
}

TEST(KernelChoice, DFlashAttentionGdnAndLmRow) {
  const DeviceCaps hopper = h100();
  const KernelVariants defaults;
  KernelVariants forced;
  forced.dflash_attention_portable = true;
  forced.gdn_recurrent = true;
  EXPECT_EQ(dflash_attention_kernel_choose(hopper, defaults, true), DFlashAttnKernel::wgmma);
  EXPECT_EQ(dflash_attention_kernel_choose(hopper, defaults, false), DFlashAttnKernel::portable);
  EXPECT_EQ(dflash_attention_kernel_choose(hopper, forced, true), DFlashAttnKernel::portable);
  EXPECT_EQ(dflash_attention_kernel_choose(device_caps_profile(hopper, "sm100"), defaults, true),
            DFlashAttnKernel::portable);
  KernelVariants small;
  small.dflash_attention_small = true;
  EXPECT_EQ(dflash_attention_kernel_choose(hopper, small, true), DFlashAttnKernel::portable)
      << "the small form is a form of the portable kernels";

  EXPECT_EQ(gdn_prefill_kernel_choose(defaults, true), GdnPrefillKernel::chunked);
  EXPECT_EQ(gdn_prefill_kernel_choose(defaults, false), GdnPrefillKernel::recurrent);
  EXPECT_EQ(gdn_prefill_kernel_choose(forced, true), GdnPrefillKernel::recurrent);

  EXPECT_EQ(lm_row_ctas_choose(hopper, 8), 8);
  EXPECT_EQ(lm_row_ctas_choose(hopper, 5), 5);
  EXPECT_EQ(lm_row_ctas_choose(hopper, 0), 1);
  EXPECT_EQ(lm_row_ctas_choose(device_caps_profile(hopper, "sm89"), 8), 1);
}

// The DeltaNet state pass: two stages wherever they fit the device's shared memory a block, one stage (which
// fits every device) elsewhere or when the registry asks for it. Tile widths 32, 64 and 128, with and without
// the fused norm: the 27B layer (128, norm) needs 196864 bytes in two stages, 99584 in one.
TEST(KernelChoice, GdnStatePassFitsEveryDevice) {
  const DeviceCaps hopper = h100();
  const KernelVariants defaults;
  const KernelVariants forced = kernel_variants_with(defaults, &KernelVariants::gdn_one_stage, true);
  EXPECT_EQ(gdn_state_smem_bytes(128, true, 2), size_t(196864));
  EXPECT_EQ(gdn_state_smem_bytes(128, true, 1), size_t(99584));
  EXPECT_EQ(gdn_state_smem_bytes(128, false, 2), size_t(159744));
  EXPECT_EQ(gdn_state_smem_bytes(64, true, 2), size_t(113920));
  EXPECT_EQ(gdn_state_smem_bytes(64, false, 2), size_t(94208));
  using K = GdnStateKernel;
  struct Case {
    int d;
    bool norm;
    K sm90, sm100, sm80, sm120, sm89;
  };
  const Case cases[] = {
      {128, true, K::two_stage, K::two_stage, K::one_stage, K::one_stage, K::one_stage},
      {128, false, K::two_stage, K::two_stage, K::two_stage, K::one_stage, K::one_stage},
      {64, true, K::two_stage, K::two_stage, K::two_stage, K::one_stage, K::one_stage},
      {64, false, K::two_stage, K::two_stage, K::two_stage, K::two_stage, K::two_stage},
      {32, true, K::two_stage, K::two_stage, K::two_stage, K::two_stage, K::two_stage},
      {32, false, K::two_stage, K::two_stage, K::two_stage, K::two_stage, K::two_stage},
  };
  for (const Case& c : cases) {
    const std::string what = "tile " + std::to_string(c.d) + (c.norm ? " norm" : "");
    const size_t two = gdn_state_smem_bytes(c.d, c.norm, 2);
    EXPECT_LE(gdn_state_smem_bytes(c.d, c.norm, 1), kSmemOptinLeast) << what;
    EXPECT_LT(gdn_state_smem_bytes(c.d, c.norm, 1), two) << what;
    EXPECT_EQ(gdn_state_kernel_choose(hopper, defaults, two), c.sm90) << what;
    EXPECT_EQ(gdn_state_kernel_choose(device_caps_profile(hopper, "sm100"), defaults, two), c.sm100) << what;
    EXPECT_EQ(gdn_state_kernel_choose(device_caps_profile(hopper, "sm80"), defaults, two), c.sm80) << what;
    EXPECT_EQ(gdn_state_kernel_choose(device_caps_profile(hopper, "sm120"), defaults, two), c.sm120) << what;
    EXPECT_EQ(gdn_state_kernel_choose(device_caps_profile(hopper, "sm89"), defaults, two), c.sm89) << what;
    EXPECT_EQ(gdn_state_kernel_choose(hopper, forced, two), K::one_stage) << what;
  }
}

TEST(KernelChoice, DFlashAttentionPortableForm) {
  // What the large forms of the portable passes ask (dflash_attention.cu, dflash_attention_kv.cu): the
  // forward at head dim 256, the dq pass at 128 and 256, the dk/dv pass at 128 and 256, and the dk/dv pass
  // at 64.
  const size_t fwd256 = 168960, dq128 = 104448, dq256 = 202752, kv128 = 153136, kv256 = 216624, kv64 = 87600;
  const DeviceCaps hopper = h100();
  const KernelVariants defaults;
  KernelVariants small;
  small.dflash_attention_small = true;
  for (const size_t bytes : {fwd256, dq128, dq256, kv128, kv256, kv64}) {
    SCOPED_TRACE(bytes);
    EXPECT_EQ(dflash_attention_form_choose(hopper, defaults, bytes), DFlashAttnForm::large);
    EXPECT_EQ(dflash_attention_form_choose(device_caps_profile(hopper, "sm100"), defaults, bytes),
              DFlashAttnForm::large);
    EXPECT_EQ(dflash_attention_form_choose(hopper, small, bytes), DFlashAttnForm::small);
    for (const char* p : {"sm120", "sm89"})
      EXPECT_EQ(dflash_attention_form_choose(device_caps_profile(hopper, p), defaults, bytes),
                bytes > 101376 ? DFlashAttnForm::small : DFlashAttnForm::large)
          << p;
  }
  EXPECT_EQ(dflash_attention_form_choose(device_caps_profile(hopper, "sm120"), defaults, 101376),
            DFlashAttnForm::large)
      << "exactly the opt-in limit fits";
  // A100: 166912 bytes hold the dk/dv pass at 128 but not the forward at 256.
  const DeviceCaps a100 = device_caps_profile(hopper, "sm80");
  EXPECT_EQ(dflash_attention_form_choose(a100, defaults, kv128), DFlashAttnForm::large);
  EXPECT_EQ(dflash_attention_form_choose(a100, defaults, fwd256), DFlashAttnForm::small);
  EXPECT_EQ(dflash_attention_form_choose(a100, defaults, dq256), DFlashAttnForm::small);

  // The dk/dv pass's clusters: 4 CTAs where the device launches them, none where it has no clusters.
  EXPECT_EQ(dflash_attention_kv_ranks_choose(hopper), 4);
  EXPECT_EQ(dflash_attention_kv_ranks_choose(device_caps_profile(hopper, "sm120")), 4);
  EXPECT_EQ(dflash_attention_kv_ranks_choose(device_caps_profile(hopper, "sm100")), 4);
  EXPECT_EQ(dflash_attention_kv_ranks_choose(device_caps_profile(hopper, "sm89")), 1);
  EXPECT_EQ(dflash_attention_kv_ranks_choose(a100), 1);
  DeviceCaps two = hopper;
  two.max_cluster = 2;
  EXPECT_EQ(dflash_attention_kv_ranks_choose(two), 1) << "a cluster of 4 that the device cannot launch";
}
