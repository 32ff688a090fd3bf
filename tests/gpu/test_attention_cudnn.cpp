// Prefill attention on cuDNN's fused attention (kernels/attention/cudnn_sdpa.cu), forced through the
// registry's attention=cudnn, against the CPU fp32 oracle on awkward shapes: GQA ratios 3 and 5, head dims
// 128 and 256, sequences of 1, 63 and 257 tokens alone and packed (with batches that are not a power of two,
// so the plan's padding sequences are exercised), ungated and gated; then the measured choice between ours
// and cuDNN, and the forced form's refusal of a layout cuDNN cannot take. Shares the fixture of
// test_cuda_ops.cpp; skips itself without a GPU, a CUDA build or a usable cuDNN.
#include <gtest/gtest.h>

#ifndef DF_HAVE_CUDA
TEST(AttentionCudnnTest, SkippedWithoutCudaBuild) {
  GTEST_SKIP() << "built without CUDA: GPU op tests skipped";
}
#else
#include <cmath>

#include "kernels/launchers.cuh"
#include "tests/gpu/cuda_ops_test_util.h"

namespace {

struct Case {
  int hq, hkv, hd;
};
constexpr Case kCases[] = {{3, 1, 128}, {5, 1, 128}, {6, 2, 128}, {3, 1, 256}, {10, 2, 256}};
const std::vector<std::vector<int32_t> > kCudnnBatches = {{1}, {63}, {257}, {63, 1, 257, 2, 129}};

}  // namespace

class AttentionCudnnTest : public CudaOpsTest {
 protected:
  // Attention of case c over q, k, v (and the gate g) on both backends into o (og), each GPU output checked
  // against the oracle. cuDNN's P is bf16 before P·V and its output is rounded once, as in our kernels: the
  // tolerances of AttentionCausalGqaPackedVarlen (test_cuda_ops.cpp) and the same rounding argument (outputs
  // are convex combinations of v, |v| ≤ 1; the gate's sigmoid < 1 and one more rounding).
  void run_and_check(Case c, const Layouts& L, const Pair& q, const Pair& k, const Pair& v, const Pair& g,
                     const Pair& o, const Pair& og, const std::string& what) {
    const float scale = 1.0f / std::sqrt(float(c.hd));
    cpu_.attention_causal(q.cpu, k.cpu, v.cpu, o.cpu, L.cpu, c.hq, c.hkv, c.hd, scale);
    cpu_.attention_causal(q.cpu, k.cpu, v.cpu, og.cpu, L.cpu, c.hq, c.hkv, c.hd, scale, &g.cpu);
    gpu_->attention_causal(q.gpu, k.gpu, v.gpu, o.gpu, L.gpu, c.hq, c.hkv, c.hd, scale);
    gpu_->attention_causal(q.gpu, k.gpu, v.gpu, og.gpu, L.gpu, c.hq, c.hkv, c.hd, scale, &g.gpu);
    check(o, 2 * kBf16Ulp + 1e-4, kBf16Ulp, what);
    check(og, 3 * kBf16Ulp + 1e-4, 2 * kBf16Ulp, what + " gated");
  }
};

// The gate runs as the separate sigmoid_gate pass after cuDNN, so the gated output must be exactly those
// bits.
TEST_F(AttentionCudnnTest, CudnnMatchesCpu) {
  std::string why;
  if (!attention_cudnn_available(&why)) GTEST_SKIP() << "cuDNN attention not available: " << why;
  const VariantsRestore restore;
  kernel_variants_set(kernel_variants_with(restore.saved, &KernelVariants::attention_cudnn, true));
  for (const auto& lens : kCudnnBatches)
    for (Case c : kCases) {
      const ArenaMarks marks(cpu_arena_, gpu_arena_);
      Layouts L = layouts(lens);
      const int64_t T = L.cpu.tokens, qc = int64_t(c.hq) * c.hd, kc = int64_t(c.hkv) * c.hd;
      const std::string what = name_of("cudnn attention T hq hkv hd", {T, c.hq, c.hkv, c.hd}) + " seqs " +
                               std::to_string(lens.size());
      // q and the gate strided inside wider buffers (the [q | gate] projection), k/v contiguous.
      Pair q = rand(T, qc, -2, 2, DType::bf16, qc);
      Pair k = rand(T, kc, -2, 2), v = rand(T, kc, -1, 1);
      Pair g = rand(T, qc, -4, 4, DType::bf16, qc);
      Pair o = out(T, qc), og = out(T, qc);
      run_and_check(c, L, q, k, v, g, o, og, what);
      gpu_->sigmoid_gate(o.gpu, g.gpu);
      expect_same_bits(og.gpu, o.gpu, what, "gated cuDNN attention", "cuDNN attention then sigmoid_gate");
    }
}

// The default dispatch: the first call of a shape class times ours and cuDNN's and keeps the faster, later
// calls of the class reuse the pick; either way each call's output matches the oracle.
TEST_F(AttentionCudnnTest, MeasuredChoiceMatchesCpu) {
  std::string why;
  if (!attention_cudnn_available(&why)) GTEST_SKIP() << "cuDNN attention not available: " << why;
  const VariantsRestore restore;
  KernelVariants v = restore.saved;
  v.attention_cudnn = v.attention_native = v.attention_portable = v.attention_portable_k32 = false;
  kernel_variants_set(v);
  const std::vector<int32_t> lens = {257, 63, 1};
  for (Case c : {Case{5, 1, 128}, Case{6, 2, 256}}) {
    const ArenaMarks marks(cpu_arena_, gpu_arena_);
    Layouts L = layouts(lens);
    const int64_t T = L.cpu.tokens, qc = int64_t(c.hq) * c.hd, kc = int64_t(c.hkv) * c.hd;
    Pair q = rand(T, qc, -2, 2), k = rand(T, kc, -2, 2), vv = rand(T, kc, -1, 1), g = rand(T, qc, -4, 4);
    for (int call = 0; call < 2; ++call) {
      Pair o = out(T, qc), og = out(T, qc);
      run_and_check(c, L, q, k, vv, g, o, og,
                    name_of("measured attention T hq hkv hd call", {T, c.hq, c.hkv, c.hd, call}));
    }
  }
}

// attention=cudnn on an output cuDNN cannot write (rows 4-byte aligned, a stride that is not a multiple of 8,
// which our kernels take) is refused with the reason, not run on the other implementation.
TEST_F(AttentionCudnnTest, ForcedRefusesAnUnfitLayout) {
  const VariantsRestore restore;
  kernel_variants_set(kernel_variants_with(restore.saved, &KernelVariants::attention_cudnn, true));
  const ArenaMarks marks(cpu_arena_, gpu_arena_);
  Layouts L = layouts({65});
  const int64_t T = L.cpu.tokens, qc = 2 * 128, kc = 128;
  Pair q = rand(T, qc, -2, 2), k = rand(T, kc, -2, 2), v = rand(T, kc, -1, 1);
  Pair o = out(T, qc, DType::bf16, 2);
  try {
    gpu_->attention_causal(q.gpu, k.gpu, v.gpu, o.gpu, L.gpu, 2, 1, 128, 0.1f);
    ADD_FAILURE() << "attention=cudnn ran on an output of row stride " << o.gpu.stride;
  } catch (const std::exception& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("attention=cudnn, but cuDNN cannot serve this call"), std::string::npos) << m;
  }
}
#endif
