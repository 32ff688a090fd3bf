// The portable prefill attention's 32-key form (attention_portable_keys_choose: what the 99 KB GPUs, sm_86,
// sm_89 and sm_120, run at head dim 256) forced through the kernel-variant registry on whatever GPU is here,
// against the CPU fp32 oracle over awkward shapes, next to the 64-key form on the same inputs. Shares the
// fixture of test_cuda_ops.cpp; skips itself without a GPU or a CUDA build.
#include <gtest/gtest.h>

#ifndef DF_HAVE_CUDA
TEST(AttentionPortableTest, SkippedWithoutCudaBuild) {
  GTEST_SKIP() << "built without CUDA: GPU op tests skipped";
}
#else
#include <cmath>

#include "kernels/dispatch/dispatch.h"
#include "tests/gpu/cuda_ops_test_util.h"

// Lengths at the 32-key tile seams and the 64- and 128-row block seams (a block whose last warps have no
// valid row, a row whose last key tile holds one key), and a 1000-token sequence (32 key tiles) beside a
// short one. Head dims 8 and 40 and 96 leave zero-padded columns (padded to 16, 64, 128); 256 takes 128-row
// blocks.
TEST_F(CudaOpsTest, AttentionPortable32KeyFormMatchesCpu) {
  struct Case {
    int hq, hkv, hd;
  };
  const VariantsRestore restore;
  const KernelVariants k32 =
      kernel_variants_with(restore.saved, &KernelVariants::attention_portable_k32, true);
  const KernelVariants k64 = kernel_variants_with(
      kernel_variants_with(restore.saved, &KernelVariants::attention_portable_k32, false),
      &KernelVariants::attention_portable, true);
  const std::vector<std::vector<int32_t> > batches = {
      {1}, {31, 32, 33, 1, 63, 64, 65, 95, 97, 127, 128, 129, 160}, {1000, 129}};
  for (const auto& lens : batches)
    for (Case c :
         {Case{4, 2, 8}, {6, 2, 32}, {3, 1, 40}, {4, 1, 96}, {4, 1, 128}, {3, 3, 256}, {6, 2, 256}}) {
      const ArenaMarks marks(cpu_arena_, gpu_arena_);
      Layouts L = layouts(lens);
      const int64_t T = L.cpu.tokens, qc = int64_t(c.hq) * c.hd, kc = int64_t(c.hkv) * c.hd;
      const std::string what = name_of("attention 32-key form T hq hkv hd", {T, c.hq, c.hkv, c.hd}) +
                               " seqs " + std::to_string(lens.size());
      // q and the gate strided inside wider buffers (the gated q_proj output; an even gate stride is read
      // as bf16 pairs in the epilogue), k/v contiguous.
      Pair q = rand(T, qc, -2, 2, DType::bf16, qc);
      Pair k = rand(T, kc, -2, 2), v = rand(T, kc, -1, 1);
      Pair g = rand(T, qc, -4, 4, DType::bf16, qc + 2);
      Pair o = out(T, qc), og = out(T, qc), o64 = out(T, qc);
      const float scale = 1.0f / std::sqrt(float(c.hd));
      cpu_.attention_causal(q.cpu, k.cpu, v.cpu, o.cpu, L.cpu, c.hq, c.hkv, c.hd, scale);
      cpu_.attention_causal(q.cpu, k.cpu, v.cpu, og.cpu, L.cpu, c.hq, c.hkv, c.hd, scale, &g.cpu);
      cpu_.attention_causal(q.cpu, k.cpu, v.cpu, o64.cpu, L.cpu, c.hq, c.hkv, c.hd, scale);

      kernel_variants_set(k32);
      gpu_->attention_causal(q.gpu, k.gpu, v.gpu, o.gpu, L.gpu, c.hq, c.hkv, c.hd, scale);
      gpu_->attention_causal(q.gpu, k.gpu, v.gpu, og.gpu, L.gpu, c.hq, c.hkv, c.hd, scale, &g.gpu);
      kernel_variants_set(k64);
      gpu_->attention_causal(q.gpu, k.gpu, v.gpu, o64.gpu, L.gpu, c.hq, c.hkv, c.hd, scale);

      // The tolerances of AttentionCausalGqaPackedVarlen (test_cuda_ops.cpp), the same rounding argument: the
      // outputs are convex combinations of v (|v| ≤ 1), P is rounded to bf16 relative to the running max of
      // whichever tile it is in, the output once more; the gate's sigmoid < 1 and one more rounding.
      check(o, 2 * kBf16Ulp + 1e-4, kBf16Ulp, what);
      check(og, 3 * kBf16Ulp + 1e-4, 2 * kBf16Ulp, what + " gated");
      check(o64, 2 * kBf16Ulp + 1e-4, kBf16Ulp, what + " [64-key form where it fits]");

      // Where this device runs the 64-key form at this head dim, the long sequence's rows take their running
      // max at other tile seams in the two forms, so P rounds differently somewhere: identical outputs would
      // mean attention=portable_k32 did not reach the launcher.
      int pad = 16;
      while (pad < c.hd) pad *= 2;
      if (lens.size() == 2 && attention_portable_keys_choose(device_caps(), k64, pad) == 64) {
        const std::vector<float> a = down_gpu(o.gpu), b = down_gpu(o64.gpu);
        int64_t differ = 0;
        for (size_t i = 0; i < a.size(); ++i) differ += a[i] != b[i];
        EXPECT_GT(differ, 0) << what << ": the 32-key and 64-key forms gave the same bits in all " << a.size()
                             << " elements";
      }
    }
}
#endif
