// Every CUDA op against the CPU fp32 reference backend (CpuOps) on identical bf16-representable inputs,
// over awkward sizes, packed multi-sequence batches, strided views and head dims 8/32/128/256. Outputs are
// poisoned with NaN before each GPU op, so an unwritten element fails. Skips itself without a GPU, and
// reduces to one skipped test in a build without CUDA (DF_ENABLE_CUDA=OFF or no nvcc).
// The DeltaNet side (conv1d, gated RMSNorm, GDN prefill and decode) is in test_cuda_ops_gdn.cpp.
#include <gtest/gtest.h>

#ifndef DF_HAVE_CUDA
TEST(CudaOpsTest, SkippedWithoutCudaBuild) { GTEST_SKIP() << "built without CUDA: GPU op tests skipped"; }
#else
#include <cstdlib>

#include "kernels/dispatch/dispatch.h"
#include "tests/gpu/cuda_ops_test_util.h"

TEST_F(CudaOpsTest, CopyCastsAndUploadRoundsToNearestEven) {
  Pair a = rand(65, 19, -3, 3, DType::f32, 5);
  Pair b = out(65, 19, DType::bf16, 3);
  gpu_->copy(a.gpu, b.gpu);
  cpu_.copy(a.cpu, b.cpu);
  check(b, 0.0, kBf16Ulp, "copy f32->bf16 strided");  // one rounding of the same values
  Pair c = out(65, 19, DType::f32);
  gpu_->copy(b.gpu, c.gpu);
  cpu_.copy(b.cpu, c.cpu);
  check(c, 0.0, kBf16Ulp, "copy bf16->f32");
}

TEST_F(CudaOpsTest, GemmBf16AndF32OutputsWithBeta) {
  for (auto [M, N, K] : {std::tuple{1, 7, 19}, {7, 65, 64}, {65, 300, 136}, {300, 129, 512}}) {
    Pair a = rand(M, K, -1, 1, DType::bf16, 8), w = rand(N, K, -1, 1);
    Pair c = out(M, N);
    gpu_->gemm(a.gpu, w.gpu, c.gpu, 0.0f);
    cpu_.gemm(a.cpu, w.cpu, c.cpu, 0.0f);
    // Products of bf16 are exact in fp32 and both sides accumulate in fp32; the GPU result is then rounded
    // once to bf16 (rtol one ulp), and atol covers cancellation: sums of K terms of size ≤ 1 differ in order.
    check(c, 1e-5 * K, kBf16Ulp, name_of("gemm bf16 M N K", {M, N, K}));
    Pair cf = rand(M, N, -1, 1, DType::f32);
    gpu_->gemm(a.gpu, w.gpu, cf.gpu, 1.0f);
    cpu_.gemm(a.cpu, w.cpu, cf.cpu, 1.0f);
    check(cf, 1e-5 * K, 1e-5, name_of("gemm f32 beta=1 M N K", {M, N, K}));  // fp32 end to end
    // The target's residual step: bf16 c accumulated in place through a strided view. Each pad is a new
    // row stride, so a new shape whose first call tunes into the scratch (grown by pad 5, reused by the
    // smaller pad 1); had the tuning written c, c would hold extra products. One rounding of
    // fp32(a·w) + c to bf16: rtol one ulp, atol as above.
    for (int64_t pad : {5, 1}) {
      Pair cb = rand(M, N, -1, 1, DType::bf16, pad);
      gpu_->gemm(a.gpu, w.gpu, cb.gpu, 1.0f);
      cpu_.gemm(a.cpu, w.cpu, cb.cpu, 1.0f);
      check(cb, 1e-5 * K, kBf16Ulp, name_of("gemm bf16 beta=1 in place M N K pad", {M, N, K, pad}));
    }
  }
}

// Pure arithmetic (no device): the buckets the tuned-algorithm table is keyed by.
TEST(GemmBucketTest, QuarterOfPowerOfTwoAtLeast64) {
  for (auto [m, want] : {std::pair<int64_t, int64_t>{1, 64}, {7, 64}, {64, 64}, {65, 128}, {100, 128}, {129, 192},
                         {256, 256}, {257, 320}, {1000, 1024}, {1023, 1024}, {1024, 1024}, {1025, 1280}, {4097, 5120}})
    EXPECT_EQ(gemm_m_bucket(m), want) << "M " << m;
  std::set<int64_t> seen;
  int64_t prev = 0;
  for (int64_t m = 1; m <= 70000; ++m) {
    const int64_t b = gemm_m_bucket(m);
    // The bucket's timing was made at some M of it: every M must lie within one step of the bucket's top.
    ASSERT_TRUE(b >= m && b - m < std::max<int64_t>(64, m / 4) && b >= prev) << "M " << m << " bucket " << b;
    prev = b;
    if (m >= 64 && m <= 16384) seen.insert(b);
  }
  EXPECT_EQ(seen.size(), 28u) << "the count gemm_m_bucket's comment quotes for 64..16384";
}

// Training's token count T changes from batch to batch: one weight shape (N, K) meets many M. The first M of
// each bucket is timed; the others take its algorithm after cublasLtMatmulAlgoCheck. Every M is checked
// against the CPU, in an order that reuses an algorithm at a smaller M (7 then 1) and at larger ones (1000
// then 1023, 1024), and a second pass over the same M must find every plan cached (no growth per call).
TEST_F(CudaOpsTest, GemmReusesTunedAlgorithmAcrossMInBucket) {
  // Its own context so the counts start at zero; the fixture's stream orders it with the uploads/downloads.
  GemmContext* ctx = gemm_init();
  const int64_t N = 320, K = 1032;
  const std::vector<int64_t> ms = {7, 1, 100, 129, 1000, 1023, 1024, 4097};
  std::set<int64_t> buckets;
  for (int64_t m : ms) buckets.insert(gemm_m_bucket(m));
  Pair w = rand(N, K, -1, 1);
  GemmStats first;
  for (int pass = 0; pass < 2; ++pass) {
    for (int64_t M : ms) {
      Pair a = rand(M, K, -1, 1);
      Pair c = out(M, N);
      gemm_launch(ctx, a.gpu.data, a.gpu.stride, w.gpu.data, w.gpu.stride, c.gpu.data, c.gpu.stride, false, M, N, K,
                  0.0f, gpu_->stream());
      cpu_.gemm(a.cpu, w.cpu, c.cpu, 0.0f);
      // Tolerances as in GemmBf16AndF32OutputsWithBeta: one bf16 rounding, atol for summation order over K.
      check(c, 1e-5 * K, kBf16Ulp, name_of("gemm bucket bf16 M N K pass", {M, N, K, pass}));
      Pair cf = rand(M, N, -1, 1, DType::f32);
      gemm_launch(ctx, a.gpu.data, a.gpu.stride, w.gpu.data, w.gpu.stride, cf.gpu.data, cf.gpu.stride, true, M, N,
                  K, 1.0f, gpu_->stream());
      cpu_.gemm(a.cpu, w.cpu, cf.cpu, 1.0f);
      check(cf, 1e-5 * K, 1e-5, name_of("gemm bucket f32 beta=1 M N K pass", {M, N, K, pass}));  // fp32 throughout
    }
    const GemmStats s = gemm_stats(ctx);
    std::printf("[ gemm   ] pass %d: plans %lld buckets %lld tuned %lld reused %lld rejected %lld untimed %lld\n", pass,
                (long long)s.plans, (long long)s.buckets, (long long)s.tuned, (long long)s.reused,
                (long long)s.rejected, (long long)s.untimed);
    if (pass == 0) {
      first = s;
      const int64_t shapes = 2 * int64_t(ms.size());  // bf16 and f32 outputs are separate shapes
      EXPECT_EQ(s.plans, shapes);
      EXPECT_EQ(s.tuned + s.reused + s.rejected + s.untimed, shapes) << "every new shape takes exactly one path";
      EXPECT_EQ(s.buckets, s.tuned);
      EXPECT_LE(s.tuned, 2 * int64_t(buckets.size())) << "a bucket was timed twice";
      if (!kernel_variants().gemm_heuristic)
        EXPECT_GT(s.reused, 0) << "no M ran on an algorithm tuned at another M: the reuse path went untested";
    } else {
      EXPECT_TRUE(s.plans == first.plans && s.buckets == first.buckets && s.tuned == first.tuned &&
                  s.reused == first.reused && s.rejected == first.rejected && s.untimed == first.untimed)
          << "the second pass over the same shapes changed the cache";
    }
  }
  gemm_free(ctx);
}

TEST_F(CudaOpsTest, EmbeddingGathersRowsExactly) {
  for (int64_t T : {1, 7, 65, 300}) {
    Pair table = rand(1000, 72, -1, 1);
    std::vector<int32_t> ids(static_cast<size_t>(T));
    for (auto& i : ids) i = int32_t(rng_() % 1000);
    Tensor ic = cpu_arena_.alloc(DType::i32, 1, T), ig = gpu_arena_.alloc(DType::i32, 1, T);
    cpu_.upload_raw(ic, ids.data());
    gpu_->upload_raw(ig, ids.data());
    Pair o = out(T, 72, DType::bf16, 8);
    cpu_.embedding(ic, table.cpu, o.cpu);
    gpu_->embedding(ig, table.gpu, o.gpu);
    check(o, 0.0, 0.0, name_of("embedding T", {T}));
  }
}

// Shapes for both kernels. Rows of a multiple of 8 cols with a pitch of a multiple of 8 (pad 0 or 8) take
// the register kernel: 8 cols = 1 chunk in a warp, 72 = 9 chunks in a warp, 1000 = 125 chunks in a 128-thread
// block, 4096 = 128 x 4, 5120 = 128 x 5. The two-pass kernel takes cols 7, pad 4 (pitch not a multiple of 8)
// and cols 40000 (past the 32768 the register kernel holds).
TEST_F(CudaOpsTest, RmsnormAndAddRmsnormBothKinds) {
  for (int64_t T : {1, 3, 300})
    for (int64_t H : {7, 8, 72, 1000, 4096, 5120, 40000})
      for (int64_t pad : {0, 4, 8})
        for (NormKind kind : {NormKind::plain, NormKind::zero_centred}) {
          if (T * H > 2'000'000 || (pad != 0 && H < 1000)) continue;  // host arena and run time
          const size_t cmark = cpu_arena_.mark(), gmark = gpu_arena_.mark();
          const std::string what =
              name_of(kind == NormKind::plain ? "plain T H pad" : "zero T H pad", {T, H, pad});
          Pair x = rand(T, H, -2, 2, DType::bf16, pad), w = rand(1, H, -0.5f, 1.5f, DType::f32);
          Pair o = out(T, H, DType::bf16, pad);
          cpu_.rmsnorm(x.cpu, w.cpu, o.cpu, 1e-6f, kind);
          gpu_->rmsnorm(x.gpu, w.gpu, o.gpu, 1e-6f, kind);
          // fp32 inside and one rounding at the store, both kinds (Qwen3RMSNorm itself rounds x̂ first).
          check(o, 1e-5, kBf16Ulp + 1e-4, what + " rmsnorm");
          Pair d = rand(T, H, -2, 2, DType::bf16, 8);
          Pair o2 = out(T, H);
          cpu_.add_rmsnorm(x.cpu, d.cpu, w.cpu, o2.cpu, 1e-6f, kind);
          gpu_->add_rmsnorm(x.gpu, d.gpu, w.gpu, o2.gpu, 1e-6f, kind);
          // The GPU residual stream is bf16 (one rounding, atol for sums that cancel to ~0); the norm then
          // sees the rounded residual: one more ulp on top of the one above.
          check(x, 1e-6, kBf16Ulp, what + " add_rmsnorm residual");
          check(o2, 4 * kBf16Ulp, 2 * kBf16Ulp + 1e-4, what + " add_rmsnorm out");
          cpu_arena_.reset(cmark);
          gpu_arena_.reset(gmark);
        }
}

// The register kernel against the two-pass kernel on the same values (the latter forced by a row pitch that
// is not a multiple of 8). The sums of squares run in different orders, so r may differ in its last fp32 bits
// and the one bf16 rounding after it may land one ulp (≤ 2^-7 relative = 2 kBf16Ulp) apart. The residual
// write of add_rmsnorm is the same single rounding in both kernels, so it must match exactly.
TEST_F(CudaOpsTest, RmsnormRegisterKernelMatchesTwoPass) {
  for (int64_t T : {1, 3, 300})
    for (int64_t H : {8, 1000, 5120})
      for (NormKind kind : {NormKind::plain, NormKind::zero_centred}) {
        const size_t cmark = cpu_arena_.mark(), gmark = gpu_arena_.mark();
        const std::string what = name_of(kind == NormKind::plain ? "plain T H" : "zero T H", {T, H});
        Pair x = rand(T, H, -2, 2), x4 = out(T, H, DType::bf16, 4), w = rand(1, H, -0.5f, 1.5f, DType::f32);
        Pair d = rand(T, H, -2, 2);
        std::vector<float> hx = down_gpu(x.gpu);
        gpu_->upload_f32(x4.gpu, hx.data());
        Pair y = out(T, H), y4 = out(T, H);
        gpu_->add_rmsnorm(x.gpu, d.gpu, w.gpu, y.gpu, 1e-6f, kind);
        gpu_->add_rmsnorm(x4.gpu, d.gpu, w.gpu, y4.gpu, 1e-6f, kind);
        std::vector<float> a = down_gpu(y.gpu), b = down_gpu(y4.gpu), ra = down_gpu(x.gpu),
                           rb = down_gpu(x4.gpu);
        int64_t bad = 0, bad_res = 0;
        for (size_t i = 0; i < a.size(); ++i) {
          bad += !(std::fabs(a[i] - b[i]) <= 2 * kBf16Ulp * std::fabs(b[i]) + 1e-6);  // NaN counts as bad
          bad_res += std::isnan(ra[i]) || ra[i] != rb[i];
        }
        EXPECT_EQ(bad, 0) << what << ": register and two-pass outputs differ in " << bad << " of "
                          << a.size();
        EXPECT_EQ(bad_res, 0) << what << ": residuals differ in " << bad_res << " of " << ra.size();
        cpu_arena_.reset(cmark);
        gpu_arena_.reset(gmark);
      }
}

TEST_F(CudaOpsTest, QkNormRopePartialAndFull) {
  struct Case { int heads, hd, rot; NormKind kind; float theta; };
  for (const auto& lens : kBatches)
    for (Case c : {Case{3, 8, 8, NormKind::plain, 1e6f}, {2, 32, 8, NormKind::zero_centred, 1e7f},
                   {4, 128, 128, NormKind::plain, 1e6f}, {2, 256, 64, NormKind::zero_centred, 1e7f}}) {
      Layouts L = layouts(lens);
      int64_t T = L.cpu.tokens;
      Pair x = rand(T, int64_t(c.heads) * c.hd, -2, 2, DType::bf16, c.hd);  // strided like q inside [q | gate]
      Pair w = rand(1, c.hd, -0.3f, 1.3f, DType::f32);
      cpu_.qk_norm_rope(x.cpu, w.cpu, L.cpu.pos, c.heads, c.hd, c.rot, c.theta, 1e-6f, c.kind);
      gpu_->qk_norm_rope(x.gpu, w.gpu, L.gpu.pos, c.heads, c.hd, c.rot, c.theta, 1e-6f, c.kind);
      // fp32 norm and rotation, one rounding at the store (HF rounds the norm output, cos, sin and each
      // term). inv_freq may differ by an fp32 ulp (pow in another form): < 3e-5 rad at position 300, on
      // values up to |x̂|·|w| ≈ 4, so 1e-3 absolute covers it and fp32 noise.
      check(x, 1e-3, kBf16Ulp, name_of("qk_norm_rope T heads hd rot", {T, c.heads, c.hd, c.rot}));
    }
}

// The register kernel (16-byte aligned rows, hd 64/128/256, rot a multiple of 64) against the shared-memory
// kernel it replaces, forced by a row pitch of 4 mod 8 elements: same input, bit-identical output required.
// Positions up to 20000 exercise the cos/sin table at large angles; few heads pack several tokens per block.
TEST_F(CudaOpsTest, QkNormRopeRegisterKernelMatchesFallbackBitForBit) {
  struct Case { int heads, hd, rot; NormKind kind; float theta; };
  const std::vector<std::vector<int32_t>> batches = {{1}, {7}, {65, 3}, {20000}};
  for (const auto& lens : batches)
    for (Case c : {Case{24, 256, 64, NormKind::zero_centred, 1e7f}, {32, 128, 128, NormKind::plain, 1e6f},
                   {1, 256, 256, NormKind::plain, 1e6f}, {3, 64, 64, NormKind::zero_centred, 1e4f},
                   {5, 128, 64, NormKind::plain, 1e6f}, {7, 256, 128, NormKind::zero_centred, 1e7f}}) {
      Layouts L = layouts(lens);
      const int64_t T = L.gpu.tokens, cols = int64_t(c.heads) * c.hd;
      if (T * cols > (int64_t(24) << 20)) continue;  // the 20000-token batch only for the narrow cases
      Pair x = rand(T, cols, -3, 3, DType::bf16, 8), w = rand(1, c.hd, -0.3f, 1.3f, DType::f32);
      Tensor x4 = out(T, cols, DType::bf16, 4).gpu;
      std::vector<float> h = down_gpu(x.gpu);
      gpu_->upload_f32(x4, h.data());
      gpu_->qk_norm_rope(x.gpu, w.gpu, L.gpu.pos, c.heads, c.hd, c.rot, c.theta, 1e-6f, c.kind);
      gpu_->qk_norm_rope(x4, w.gpu, L.gpu.pos, c.heads, c.hd, c.rot, c.theta, 1e-6f, c.kind);
      std::vector<float> a = down_gpu(x.gpu), b = down_gpu(x4);
      int64_t bad = 0, changed = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        bad += std::isnan(a[i]) || a[i] != b[i];
        changed += a[i] != h[i];
      }
      const std::string what = name_of("qk_norm_rope T heads hd rot", {T, c.heads, c.hd, c.rot});
      EXPECT_EQ(bad, 0) << what << ": register and fallback kernels differ in " << bad << " of " << a.size();
      EXPECT_GT(changed, 0) << what << ": output equals the input, the op did not run";
    }
}

TEST_F(CudaOpsTest, AttentionCausalGqaPackedVarlen) {
  struct Case { int hq, hkv, hd; };
  // Plus one batch long enough for every K/V stage of the wgmma kernels to be refilled many times (a 1000-token
  // sequence is 16 key tiles) next to a short one, and lengths around the wgmma kernels' 64-row warpgroups,
  // 128-row blocks and 64-, 80- and 128-key tiles (a block whose second warpgroup has no valid row, or whose
  // first warpgroup's rows end a key tile before the block's).
  std::vector<std::vector<int32_t>> batches = kBatches;
  batches.push_back({1000, 129});
  batches.push_back({63, 127, 129, 64, 65, 1, 81, 160, 193});
  for (const auto& lens : batches)
    for (Case c : {Case{4, 2, 8}, {6, 2, 32}, {4, 1, 128}, {6, 1, 256}, {3, 3, 128}, {6, 2, 256}}) {
      const ArenaMarks marks(cpu_arena_, gpu_arena_);  // each case's tensors are freed at its end
      Layouts L = layouts(lens);
      int64_t T = L.cpu.tokens;
      // q strided inside a wider buffer (the gated q_proj output), k/v contiguous.
      Pair q = rand(T, int64_t(c.hq) * c.hd, -2, 2, DType::bf16, int64_t(c.hq) * c.hd);
      Pair k = rand(T, int64_t(c.hkv) * c.hd, -2, 2), v = rand(T, int64_t(c.hkv) * c.hd, -1, 1);
      Pair o = out(T, int64_t(c.hq) * c.hd);
      float scale = 1.0f / std::sqrt(float(c.hd));
      cpu_.attention_causal(q.cpu, k.cpu, v.cpu, o.cpu, L.cpu, c.hq, c.hkv, c.hd, scale);
      gpu_->attention_causal(q.gpu, k.gpu, v.gpu, o.gpu, L.gpu, c.hq, c.hkv, c.hd, scale);
      // Outputs are convex combinations of v (|v| ≤ 1). The GPU rounds P to bf16 before P·V (≤ 1 ulp on
      // each weight, so ≤ 1 ulp of max|v| on the sum) and the output once more: atol 2 ulps of 1.
      check(o, 2 * kBf16Ulp + 1e-4, kBf16Ulp,
            name_of("attention T hq hkv hd", {T, c.hq, c.hkv, c.hd}) + " seqs " + std::to_string(lens.size()));

      // Gated: the gate is a strided view inside a wider buffer, as the gate half of [q | gate]. An even row
      // stride is read as bf16 pairs in the epilogue (fused); an odd one takes the separate sigmoid_gate pass.
      for (int64_t gate_pad : {int64_t(c.hq) * c.hd + 2, int64_t(3)}) {
        const std::string what = name_of("gated attention T hq hd gate_pad", {T, c.hq, c.hd, gate_pad}) +
                                 " seqs " + std::to_string(lens.size());
        Pair g = rand(T, int64_t(c.hq) * c.hd, -4, 4, DType::bf16, gate_pad);
        Pair og = out(T, int64_t(c.hq) * c.hd);
        cpu_.attention_causal(q.cpu, k.cpu, v.cpu, og.cpu, L.cpu, c.hq, c.hkv, c.hd, scale, &g.cpu);
        gpu_->attention_causal(q.gpu, k.gpu, v.gpu, og.gpu, L.gpu, c.hq, c.hkv, c.hd, scale, &g.gpu);
        // The ungated error (≤ 2 ulps of 1 + 1e-4 absolute, 1 ulp of |o| ≤ 1) shrinks with the factor
        // sigmoid < 1; the GPU then rounds the product of the stored output and sigmoid (2 ulps of the result).
        check(og, 3 * kBf16Ulp + 1e-4, 2 * kBf16Ulp, what);
        // The fused epilogue must give exactly the bits of attention followed by sigmoid_gate.
        gpu_->sigmoid_gate(o.gpu, g.gpu);
        expect_same_bits(og.gpu, o.gpu, what, "fused gate", "attention then sigmoid_gate");
        gpu_->attention_causal(q.gpu, k.gpu, v.gpu, o.gpu, L.gpu, c.hq, c.hkv, c.hd, scale);  // ungated again
      }
    }
}

// Scores that grow along each sequence: q in [0, 1], key t of its sequence in (1 + t / 32) · [-0.5, 1], so
// the scaled scores climb about 7 (hd 256, 80-key tiles) and 8 (hd 128, 128-key tiles) log2 units per key
// tile, with noise of the same order. A row's max then passes the one the wgmma kernel's exponents are taken
// against by more than its lazy-rescaling slack (8) on some tiles and by less on others (a Python model of
// these inputs, rows 300, 500, 900 and 999 of the 1000-token sequence, per row: 19 rescales and 13 skipped
// growths at hd 256, 15 and 2 at hd 128), so the rescale of O is both taken and skipped on these rows; with the
// random scores of the test above the max settles within the slack in the first tile and it is never taken.
TEST_F(CudaOpsTest, AttentionCausalGrowingScoresMatchCpu) {
  struct Case { int hq, hkv, hd; };
  for (const auto& lens : {std::vector<int32_t>{1000, 129}, {63, 127, 129, 64, 65, 1, 81, 160, 193}})
    for (Case c : {Case{4, 1, 128}, {3, 3, 128}, {6, 2, 256}}) {
      const ArenaMarks marks(cpu_arena_, gpu_arena_);
      Layouts L = layouts(lens);
      const int64_t T = L.cpu.tokens, qc = int64_t(c.hq) * c.hd, kc = int64_t(c.hkv) * c.hd;
      Pair q = rand(T, qc, 0, 1), v = rand(T, kc, -1, 1);
      std::uniform_real_distribution<float> d(-0.5f, 1.0f);
      std::vector<float> h(size_t(T * kc));
      size_t at = 0;
      for (int32_t len : lens)
        for (int32_t t = 0; t < len; ++t)
          for (int64_t j = 0; j < kc; ++j) h[at++] = bf16_round(d(rng_) * (1.0f + float(t) / 32.0f));
      Pair k = out(T, kc);
      cpu_.upload_f32(k.cpu, h.data());
      gpu_->upload_f32(k.gpu, h.data());
      Pair o = out(T, qc);
      const float scale = 1.0f / std::sqrt(float(c.hd));
      cpu_.attention_causal(q.cpu, k.cpu, v.cpu, o.cpu, L.cpu, c.hq, c.hkv, c.hd, scale);
      gpu_->attention_causal(q.gpu, k.gpu, v.gpu, o.gpu, L.gpu, c.hq, c.hkv, c.hd, scale);
      // As the test above: outputs are convex combinations of v (|v| ≤ 1) and P is rounded to bf16 relative
      // to its size, whatever max it is taken against. The scores (up to ~1000 before scaling) carry fp32
      // rounding of ~1e-4 in the exponent, far below bf16's 2^-8.
      check(o, 2 * kBf16Ulp + 1e-4, kBf16Ulp,
            name_of("attention growing scores T hq hkv hd", {T, c.hq, c.hkv, c.hd}) + " seqs " +
                std::to_string(lens.size()));
    }
}

// The wgmma kernel's static schedule (zigzag rounds in the order heads_first_modelled picks) serves a launch
// captured into a CUDA graph on a stream that has no item counter yet (none can be allocated during a
// capture): a fresh backend's first attention, captured and replayed, must match the CPU as the dynamic
// schedule does (the same tolerance as above). Elsewhere it runs the portable kernel, captured the same way.
TEST_F(CudaOpsTest, AttentionCausalCapturedOnAFreshStreamMatchesCpu) {
  struct Case { int hq, hkv, hd; };
  for (Case c : {Case{4, 1, 128}, {6, 2, 256}}) {
    const ArenaMarks marks(cpu_arena_, gpu_arena_);
    const std::vector<int32_t> lens = {1000, 129, 1, 300};
    Layouts L = layouts(lens);
    const int64_t T = L.cpu.tokens, qc = int64_t(c.hq) * c.hd, kc = int64_t(c.hkv) * c.hd;
    Pair q = rand(T, qc, -2, 2), k = rand(T, kc, -2, 2), v = rand(T, kc, -1, 1);
    Pair o = out(T, qc);
    const float scale = 1.0f / std::sqrt(float(c.hd));
    cpu_.attention_causal(q.cpu, k.cpu, v.cpu, o.cpu, L.cpu, c.hq, c.hkv, c.hd, scale);
    ASSERT_EQ(cudaStreamSynchronize(gpu_->stream()), cudaSuccess);  // inputs and poison in place
    CudaOps fresh(0);                                             // its own stream, no counter yet
    const cudaStream_t st = fresh.stream();
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    ASSERT_EQ(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed), cudaSuccess);
    fresh.attention_causal(q.gpu, k.gpu, v.gpu, o.gpu, L.gpu, c.hq, c.hkv, c.hd, scale);
    ASSERT_EQ(cudaStreamEndCapture(st, &graph), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    ASSERT_EQ(cudaGraphLaunch(exec, st), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    EXPECT_EQ(cudaGraphExecDestroy(exec), cudaSuccess);
    EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
    check(o, 2 * kBf16Ulp + 1e-4, kBf16Ulp, name_of("captured attention T hq hkv hd", {T, c.hq, c.hkv, c.hd}));
  }
}

// The forward's layout (target_forward.cpp, layer_full): q, gate, k and v are column views of one fused
// projection [T, lead | q | gate | k | v], the output a view of a wider workspace. Head dims the sm90 kernel
// is not built for (it takes 128 and 256 only) run the portable tiled kernel with its epilogue loading each
// row's gate before storing it; hd 24 and 40 leave zero-padded columns whose gate is not read. Hd 128 and 256
// run the wgmma kernel on the same strided views (TMA boxes inside a wider row). A lead of
// 4 columns (q 8-byte aligned) or an output at column 1 (2-byte aligned) is beyond the tiled kernels' 16-byte
// copies and bf16-pair stores: the general kernel runs instead of a misaligned access.
TEST_F(CudaOpsTest, AttentionGateInsideFusedProjection) {
  struct Case { int hq, hkv, hd; int64_t lead, out_col; };
  for (const auto& lens : kBatches)
    for (Case c : {Case{3, 1, 32, 0, 0}, {5, 1, 16, 0, 0}, {4, 2, 40, 0, 0}, {6, 3, 24, 0, 0}, {2, 1, 64, 0, 0},
                   {3, 1, 32, 4, 0}, {3, 1, 32, 0, 1}, {4, 2, 128, 0, 0}, {3, 1, 256, 0, 0}}) {
      const ArenaMarks marks(cpu_arena_, gpu_arena_);
      Layouts L = layouts(lens);
      const int64_t T = L.cpu.tokens, qc = int64_t(c.hq) * c.hd, kc = int64_t(c.hkv) * c.hd;
      const int64_t P = c.lead + 2 * qc + 2 * kc;
      // One range for the whole projection: |v| ≤ 1 keeps the tolerance argument of the test above.
      Pair proj = rand(T, P, -1, 1, DType::bf16, (8 - P % 8) % 8);  // row pitch a multiple of 8, as the GEMM's
      auto cols = [&](int64_t c0, int64_t n) { return Pair{proj.cpu.cols_view(c0, n), proj.gpu.cols_view(c0, n)}; };
      Pair q = cols(c.lead, qc), g = cols(c.lead + qc, qc), k = cols(c.lead + 2 * qc, kc);
      Pair v = cols(c.lead + 2 * qc + kc, kc);
      const std::vector<float> proj_before = down_gpu(proj.gpu);
      Pair mix = out(T, qc + 8), plain = out(T, qc + 8);
      Pair o{mix.cpu.cols_view(c.out_col, qc), mix.gpu.cols_view(c.out_col, qc)};
      Pair ou{plain.cpu.cols_view(c.out_col, qc), plain.gpu.cols_view(c.out_col, qc)};
      const float scale = 1.0f / std::sqrt(float(c.hd));
      cpu_.attention_causal(q.cpu, k.cpu, v.cpu, o.cpu, L.cpu, c.hq, c.hkv, c.hd, scale, &g.cpu);
      gpu_->attention_causal(q.gpu, k.gpu, v.gpu, o.gpu, L.gpu, c.hq, c.hkv, c.hd, scale, &g.gpu);
      const std::string what = name_of("gated attention in [T, lead|q|gate|k|v] T hq hkv hd lead out_col",
                                       {T, c.hq, c.hkv, c.hd, c.lead, c.out_col}) +
                               " seqs " + std::to_string(lens.size()) + " (element i is row i / " +
                               std::to_string(qc) + ", column i % " + std::to_string(qc) + ")";
      check(o, 3 * kBf16Ulp + 1e-4, 2 * kBf16Ulp, what);  // as the gated case above (≤ the general kernel's)
      // Fused gate bits = attention then sigmoid_gate, and the projection (gate included) left untouched.
      gpu_->attention_causal(q.gpu, k.gpu, v.gpu, ou.gpu, L.gpu, c.hq, c.hkv, c.hd, scale);
      gpu_->sigmoid_gate(ou.gpu, g.gpu);
      expect_same_bits(o.gpu, ou.gpu, what, "fused gate", "attention then sigmoid_gate");
      const std::vector<float> proj_after = down_gpu(proj.gpu);
      int64_t touched = 0;
      for (size_t i = 0; i < proj_after.size(); ++i) touched += proj_after[i] != proj_before[i];
      EXPECT_EQ(touched, 0) << what << ": attention wrote " << touched << " elements of its input projection";
    }
}

TEST_F(CudaOpsTest, SigmoidGateAndSwiglu) {
  for (int64_t T : {1, 7, 65, 300})
    for (int64_t C : {3, 64, 1000}) {
      Pair o = rand(T, C, -2, 2), g = rand(T, C, -4, 4, DType::bf16, C);
      cpu_.sigmoid_gate(o.cpu, g.cpu);
      gpu_->sigmoid_gate(o.gpu, g.gpu);
      // o · sigmoid(g) in fp32, one rounding (torch would round sigmoid first); 1e-5 for __expf.
      check(o, 1e-6, kBf16Ulp + 1e-5, name_of("sigmoid_gate T C", {T, C}));
      Pair up = rand(T, C, -2, 2), y = out(T, C);
      cpu_.swiglu(g.cpu, up.cpu, y.cpu);
      gpu_->swiglu(g.gpu, up.gpu, y.gpu);
      check(y, 1e-6, kBf16Ulp + 1e-5, name_of("swiglu T C", {T, C}));  // fp32 silu · up, one rounding
    }
}

// The 16-byte kernels claim the very bits of the narrower fallback kernels (same fp32 expressions, and for
// gated_rmsnorm the same summation tree): run both on the same values, the fallback forced by a row pitch
// that is not a multiple of 8, and require equality, not a tolerance.
TEST_F(CudaOpsTest, VectorKernelsMatchFallbacksBitForBit) {
  auto same = [&](const Tensor& a, const Tensor& b, const std::string& what) {
    expect_same_bits(a, b, what, "vector kernel", "fallback kernel");
  };
  auto padded_copy = [&](const Pair& p, int64_t pad) {
    Tensor t = out(p.gpu.rows, p.gpu.cols, DType::bf16, pad).gpu;
    std::vector<float> h = down_gpu(p.gpu);
    gpu_->upload_f32(t, h.data());
    return t;
  };
  for (const auto& lens : kBatches) {
    Layouts L = layouts(lens);
    int64_t T = L.cpu.tokens, C = 264;
    Pair x = rand(T, C, -2, 2, DType::bf16, 8), w = rand(C, 4, -1, 1, DType::f32);
    Pair y = out(T, C), y4 = out(T, C, DType::bf16, 4);
    gpu_->conv1d_silu(x.gpu, w.gpu, y.gpu, L.gpu);
    gpu_->conv1d_silu(padded_copy(x, 4), w.gpu, y4.gpu, L.gpu);
    same(y.gpu, y4.gpu, name_of("conv1d_silu T C", {T, C}));
  }
  for (int64_t T : {1, 7, 65})
    for (auto [heads, dv] : {std::pair{3, 32}, {5, 128}}) {
      const int64_t cols = int64_t(heads) * dv;
      Pair o = rand(T, cols, -2, 2), z = rand(T, cols, -3, 3, DType::bf16, 16),
           w = rand(1, dv, 0.5f, 1.5f, DType::f32);
      Pair y = out(T, cols), y4 = out(T, cols, DType::bf16, 4);
      gpu_->gated_rmsnorm(o.gpu, z.gpu, w.gpu, y.gpu, heads, dv, 1e-6f);
      gpu_->gated_rmsnorm(padded_copy(o, 4), z.gpu, w.gpu, y4.gpu, heads, dv, 1e-6f);
      same(y.gpu, y4.gpu, name_of("gated_rmsnorm T heads dv", {T, heads, dv}));
    }
}

// Shapes the tiled attention kernels are not built for (head dims not a multiple of 8 or above 256, an odd row
// stride) run the general kernel (decode.cu): packed causal sequences, GQA, with and without the gate.
TEST_F(CudaOpsTest, AttentionCausalGeneralKernelMatchesCpu) {
  struct Case { int hq, hkv, hd; int64_t pad; };
  for (const auto& lens : {std::vector<int32_t>{1}, {7}, {1, 7, 65, 300}, {64, 64, 3}})
    for (Case c : {Case{3, 1, 6, 0}, {4, 2, 12, 0}, {5, 1, 20, 0}, {2, 1, 300, 0}, {2, 2, 512, 0}, {4, 2, 32, 3}}) {
      const ArenaMarks marks(cpu_arena_, gpu_arena_);
      Layouts L = layouts(lens);
      const int64_t T = L.cpu.tokens, qc = int64_t(c.hq) * c.hd, kc = int64_t(c.hkv) * c.hd;
      Pair q = rand(T, qc, -2, 2, DType::bf16, c.pad), k = rand(T, kc, -2, 2, DType::bf16, c.pad);
      Pair v = rand(T, kc, -1, 1, DType::bf16, c.pad), o = out(T, qc, DType::bf16, c.pad);
      const float scale = 1.0f / std::sqrt(float(c.hd));
      cpu_.attention_causal(q.cpu, k.cpu, v.cpu, o.cpu, L.cpu, c.hq, c.hkv, c.hd, scale);
      gpu_->attention_causal(q.gpu, k.gpu, v.gpu, o.gpu, L.gpu, c.hq, c.hkv, c.hd, scale);
      const std::string what = name_of("attention general T hq hkv hd pad", {T, c.hq, c.hkv, c.hd, c.pad}) +
                               " seqs " + std::to_string(lens.size());
      // As attention_cached: fp32 inside, one rounding of the output (1 ulp); the gate adds two (3 ulps).
      check(o, 1e-4, kBf16Ulp, what);
      Pair g = rand(T, qc, -4, 4, DType::bf16, 3), og = out(T, qc);
      cpu_.attention_causal(q.cpu, k.cpu, v.cpu, og.cpu, L.cpu, c.hq, c.hkv, c.hd, scale, &g.cpu);
      gpu_->attention_causal(q.gpu, k.gpu, v.gpu, og.gpu, L.gpu, c.hq, c.hkv, c.hd, scale, &g.gpu);
      check(og, 1e-4, 3 * kBf16Ulp, "gated " + what);
    }
}

// attention_cached against CpuOps for one case: T new queries over a cache of past + T rows, a strided q (the
// gated q_proj half) and out, with and without the output gate. `kind` names the path in the report.
class CudaOpsCachedTest : public CudaOpsTest {
 protected:
  void cached_case(int hq, int hkv, int hd, int64_t past, int64_t T, const char* kind) {
    const ArenaMarks marks(cpu_arena_, gpu_arena_);  // each case's tensors are freed at its end
    const int64_t qc = int64_t(hq) * hd, kc = int64_t(hkv) * hd;
    Pair q = rand(T, qc, -2, 2, DType::bf16, qc);
    Pair k = rand(past + T, kc, -2, 2, DType::bf16, 8), v = rand(past + T, kc, -1, 1);
    Pair o = out(T, qc, DType::bf16, 3);
    const float scale = 1.0f / std::sqrt(float(hd));
    cpu_.attention_cached(q.cpu, k.cpu, v.cpu, o.cpu, past, hq, hkv, hd, scale);
    gpu_->attention_cached(q.gpu, k.gpu, v.gpu, o.gpu, past, hq, hkv, hd, scale);
    const std::string what = std::string(kind) + name_of(" hq hkv hd past T", {hq, hkv, hd, past, T});
    // fp32 scores, softmax and P·V on both sides (the sum orders differ: 1e-4 absolute on |o| <= 1), then one
    // bf16 rounding of the output (1 ulp relative).
    check(o, 1e-4, kBf16Ulp, what);
    Pair g = rand(T, qc, -4, 4, DType::bf16, 5);
    Pair og = out(T, qc);
    cpu_.attention_cached(q.cpu, k.cpu, v.cpu, og.cpu, past, hq, hkv, hd, scale, &g.cpu);
    gpu_->attention_cached(q.gpu, k.gpu, v.gpu, og.gpu, past, hq, hkv, hd, scale, &g.gpu);
    // The GPU rounds the output, the sigmoid and the product (as attention_causal + sigmoid_gate), each up to
    // 2^-8 relative at the bottom of a binade: 3 ulps of the result (the H200 showed up to 2.4).
    check(og, 1e-4, 3 * kBf16Ulp, "gated " + what);
  }
};

// Incremental decoding on the general kernel's shapes: any head dim up to 512 (lanes stride over dims), GQA.
TEST_F(CudaOpsCachedTest, AttentionCachedMatchesCpu) {
  struct Case { int hq, hkv, hd; };
  for (Case c : {Case{3, 1, 32}, {8, 2, 128}, {4, 4, 256}, {6, 3, 40}, {2, 1, 512}, {5, 1, 6}, {4, 2, 16}})
    for (int64_t past : {0, 1, 37, 300})
      for (int64_t T : {1, 5, 16}) cached_case(c.hq, c.hkv, c.hd, past, T, "attention_cached");
  Pair q = rand(4, 64, -1, 1), k = rand(6, 32, -1, 1), v = rand(6, 32, -1, 1), o = out(4, 64);
  EXPECT_THROW(gpu_->attention_cached(q.gpu, k.gpu, v.gpu, o.gpu, 3, 4, 2, 16, 0.25f), Error);  // 3 + 4 > 6 rows
  EXPECT_THROW(gpu_->attention_cached(q.gpu, k.gpu, v.gpu, o.gpu, 2, 4, 3, 16, 0.25f), Error);  // 4 % 3 heads
}

// The split-KV tensor-core path of attention_cached (hd 128 / 256): step sizes around its 16-row tiles
// (T·group 1 .. 128, so 1..8 tiles and the 8 / 4 / 2 / 1 key-slice warps per tile whose partials are merged
// in shared memory), past one CTA's 128 rows (T 33 × group 6) and a prompt-sized step (T 300: row groups
// whose early groups see none of the later chunks' keys), short caches where the plan splits the rows into
// many groups to keep the partials small (past 63 at T 16: 16-row groups), caches that end inside, on and
// just past a stage of 16 / 32 / 64 / 128 keys and span many chunks (4095), long caches whose chunks take
// several stages of the ring (20000, short steps), GQA groups 1, 3, 6 and 8, with and without the gate; steps
// of 3 or more tiles (T 16, 17, 33 at most groups) take the pairs of warps that split the head dim. P·V keeps
// P to 16 mantissa bits (bf16 hi + lo), so the same fp32 bound as the general kernel holds.
TEST_F(CudaOpsCachedTest, AttentionCachedSplitKvMatchesCpu) {
  struct Case { int hq, hkv, hd; };
  for (Case c : {Case{6, 1, 128}, {12, 2, 256}, {6, 2, 256}, {3, 1, 128}, {4, 4, 256}, {8, 1, 128}})
    for (int64_t past : {0, 1, 63, 127, 4095, 20000})
      for (int64_t T : {1, 3, 5, 16, 17, 33, 300}) {
        if ((T >= 33 && c.hq / c.hkv != 6) || (past == 20000 && T > 3)) continue;
        cached_case(c.hq, c.hkv, c.hd, past, T, "split-KV attention_cached");
      }
}

// Short steps on the split-KV path (T·group <= 8 rows a kv head: the transposed kernel, rows as the MMAs' N
// side, its keys split over several pairs of warps): GQA groups 1, 2, 3, 4, 6 and 8, T 1..3 (so the last row
// sees 0..2 keys past the cache and padding rows are masked), caches shorter than one key stage (past 0, 1,
// 5), ending mid-stage and mid-chunk (37, 129, 1000, 4095) and long ones (20000 at the Qwen shapes), with and
// without the gate; T 8 at group 1 (eight rows, each its own token): each agrees with the CPU.
TEST_F(CudaOpsCachedTest, AttentionCachedShortStepsMatchCpu) {
  struct Case { int hq, hkv, hd; };
  for (Case c : {Case{24, 4, 256},
                 {32, 8, 128},
                 {6, 1, 128},
                 {12, 2, 256},
                 {4, 4, 256},
                 {4, 4, 128},
                 {3, 1, 256},
                 {16, 2, 128},
                 {2, 1, 256},
                 {1, 1, 128}})
    for (int64_t past : {0, 1, 5, 37, 129, 1000, 4095, 20000})
      for (int64_t T : {1, 2, 3, 8}) {
        const bool qwen = (c.hq == 24 && c.hkv == 4) || (c.hq == 32 && c.hkv == 8);
        if (T * (c.hq / c.hkv) > 8 || (past == 20000 && !(qwen && T == 1)) || (T == 8) != (c.hq == 1)) continue;
        cached_case(c.hq, c.hkv, c.hd, past, T, "short-step attention_cached");
      }
}

// Verify-sized steps on the m16-tile kernel, whose plan takes pairs of warps a tile at hd 256 (3 to 6 tiles: two
// warps a tile, each half of the head dim in Q·Kᵀ and half the output columns in P·V, 32 keys a warp a stage)
// and one warp a tile at hd 128: 27B and 8B steps (6 and 4 tiles, one and two key slices), group 3 (3 tiles at
// T 16, two slices; 51 rows at T 17) and group 8 (8 tiles at T 16, one warp a tile at both head dims: pairs
// at hd 256 would pass its 12 warps), T 5 .. 17 over caches that end mid-stage (63, 4095) and none (0); each
// agrees with the CPU.
TEST_F(CudaOpsCachedTest, AttentionCachedVerifyStepsMatchCpu) {
  struct Case {
    int hq, hkv, hd;
  };
  for (Case c : {Case{24, 4, 256}, {32, 8, 128}, {6, 2, 256}, {8, 1, 128}, {8, 1, 256}})
    for (int64_t past : {0, 63, 4095})
      for (int64_t T : {5, 16, 17}) {
        if (past == 4095 && T != 16) continue;
        cached_case(c.hq, c.hkv, c.hd, past, T, "verify-step attention_cached");
      }
}

// The split-KV plan's key slices: the count with the fewest stages a chunk, then the fewest keys, among those
// whose two stages fit. On a 132-SM Hopper at T 1 that is 4 pairs of warps over 4 K keys at 24 / 4 heads and
// 3 past 4400 keys, 8 pairs at 32 / 8 heads of hd 128, and 4 pairs in three stages over 20 K keys with one kv
// head. They agree with the CPU at short steps, where a step has one row tile and the slices are many.
TEST_F(CudaOpsCachedTest, AttentionCachedSplitPlanSlicesMatchCpu) {
  struct Case {
    int hq, hkv, hd;
  };
  for (Case c : {Case{24, 4, 256}, {32, 8, 128}, {6, 2, 256}, {8, 1, 256}})
    for (int64_t past : {0, 4095, 4400, 20000})
      for (int64_t T : {1, 2, 5}) {
        if (past == 20000 && (T != 1 || c.hkv != 1)) continue;
        cached_case(c.hq, c.hkv, c.hd, past, T, "split-KV");
      }
}

// The registry's decode=general (kernel_variants_set) sends decoding to the general kernels, the path of the
// steps whose split plan does not fit a device: both paths agree with the CPU on a 27B-like step, and the
// choice is made per call.
TEST_F(CudaOpsTest, DecodeGeneralVariantMatchesCpu) {
  const int hq = 12, hkv = 2, hd = 256;
  const int64_t T = 16, past = 300, qc = int64_t(hq) * hd, kc = int64_t(hkv) * hd;
  Pair q = rand(T, qc, -2, 2), k = rand(past + T, kc, -2, 2), v = rand(past + T, kc, -1, 1);
  Pair g = rand(T, qc, -4, 4);
  const float scale = 1.0f / std::sqrt(float(hd));
  const KernelVariants saved = kernel_variants();
  for (bool general : {true, false}) {
    KernelVariants forced = saved;
    forced.decode_general = general;
    kernel_variants_set(forced);
    Pair o = out(T, qc);
    cpu_.attention_cached(q.cpu, k.cpu, v.cpu, o.cpu, past, hq, hkv, hd, scale, &g.cpu);
    gpu_->attention_cached(q.gpu, k.gpu, v.gpu, o.gpu, past, hq, hkv, hd, scale, &g.gpu);
    check(o, 1e-4, 3 * kBf16Ulp, general ? "attention_cached decode=general" : "attention_cached split");
  }
  kernel_variants_set(saved);
}

TEST_F(CudaOpsTest, BadShapesThrowNamingTheOp) {
  Pair q = rand(4, 24, -1, 1), o = out(4, 24);
  Layouts L = layouts({4});
  // head_dim 12 runs (the general kernel); past kDecodeMaxHeadDim no kernel does.
  Pair q600 = rand(4, 600, -1, 1), o600 = out(4, 600);
  EXPECT_THROW(gpu_->attention_causal(q600.gpu, q600.gpu, q600.gpu, o600.gpu, L.gpu, 1, 1, 600, 1.0f), Error);
  EXPECT_THROW(gpu_->attention_causal(q.gpu, q.gpu, q.gpu, o.gpu, L.gpu, 3, 2, 8, 1.0f), Error);  // 3 % 2 heads
  Pair q16 = rand(4, 16, -1, 1), o16 = out(4, 16), narrow_gate = rand(4, 8, -1, 1);
  EXPECT_THROW(gpu_->attention_causal(q16.gpu, q16.gpu, q16.gpu, o16.gpu, L.gpu, 2, 2, 8, 1.0f, &narrow_gate.gpu),
               Error);
  Pair w = rand(5, 23, -1, 1);
  try {
    gpu_->gemm(q.gpu, w.gpu, o.gpu, 0.0f);
    ADD_FAILURE() << "gemm with mismatched K did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gemm"), std::string::npos) << e.what();
  }
}

#endif  // DF_HAVE_CUDA
