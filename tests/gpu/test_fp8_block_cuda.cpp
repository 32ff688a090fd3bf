// The block-scaled FP8 path of a 128x128 block checkpoint on CUDA: the per-token per-128-column quantiser
// against CpuOps::fp8_round_rows(x, 128) bit for bit, and cuBLASLt's VEC128 x BLK128x128 GEMM against an
// exact double product of its codes and scales, on widths that leave partial groups and blocks. Every failure
// prints the worst element, its index and both values. Skips itself without a device or a CUDA build.
#include <gtest/gtest.h>

#ifndef DF_HAVE_CUDA
TEST(Fp8BlockCudaTest, SkippedWithoutCudaBuild) {
  GTEST_SKIP() << "built without CUDA: block-scaled FP8 GPU tests skipped";
}
#else
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <vector>

#include "core/fp8.h"
#include "kernels/gemm/gemm.cuh"
#include "model/fp8_weights.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cuda/cuda_ops.h"
#include "tests/gpu/cuda_arena_test.h"
#include "tests/unit/target_test_util.h"

using namespace df;

namespace {

class Fp8BlockCudaTest : public CudaArenaTest {
 protected:
  // Rows whose 128-column groups span 2^-12 .. 2^0 (CudaArenaTest::bf16_rows).
  static std::vector<float> graded(int64_t M, int64_t K, const std::vector<int>& exps, uint32_t seed) {
    return bf16_rows(M, K, exps, seed, 3);
  }
};

int64_t groups_of(int64_t K) {
  return (K + 127) / 128;
}

}  // namespace

TEST_F(Fp8BlockCudaTest, GroupQuantiserMatchesCpuBitForBit) {
  CpuOps cpu;
  const std::vector<std::pair<int64_t, int64_t> > shapes = {
      {1, 16}, {5, 300}, {33, 336}, {300, 5120}, {2, 17408}};
  for (const auto& [M, K] : shapes) {
    SCOPED_TRACE(testing::Message() << "M " << M << " K " << K);
    Arena a = arena_;
    const std::vector<float> xh = graded(M, K, {0, 4, -6}, 21);
    const int64_t G = groups_of(K), ldq = K + 48;
    Tensor x = a.alloc(DType::bf16, M, K), q = a.alloc(DType::f8_e4m3, M, ldq).cols_view(0, K);
    Tensor s = a.alloc(DType::f32, 1, fp8_group_scales_size(M, G));
    gpu_->upload_f32(x, xh.data());
    gpu_->fp8_quantize_groups(x, q, s, true);
    std::vector<uint8_t> qh(size_t(M * ldq));
    std::vector<float> sh(size_t(s.cols));
    gpu_->download_raw(Tensor{q.data, DType::u8, Device::cuda, M, ldq, ldq}, qh.data());
    gpu_->download_f32(s, sh.data());
    std::vector<float> want = xh, back(size_t(M * K));
    cpu.fp8_round_rows(tensor_make(want.data(), DType::f32, Device::cpu, M, K), 128);
    gpu_->download_f32(x, back.data());  // written back: bf16(code · scale)
    int64_t bad_back = 0;
    for (size_t i = 0; i < back.size(); ++i) bad_back += back[i] != bf16_round(want[i]);
    EXPECT_EQ(bad_back, 0) << "elements of the written-back input differ from bf16(CPU rounding)";
    int64_t bad = 0, first = -1;
    for (int64_t r = 0; r < M; ++r)
      for (int64_t c = 0; c < K; ++c) {
        const float got = e4m3_to_f32(qh[size_t(r * ldq + c)]) * sh[size_t(fp8_group_scale_index(r, c / 128, M, G))];
        if (got != want[size_t(r * K + c)] && bad++ == 0) first = r * K + c;
      }
    EXPECT_EQ(bad, 0) << bad << " of " << M * K << " differ from CpuOps::fp8_round_rows(x, 128); first at ["
                      << first / K << ", " << first % K << "]: GPU code 0x" << std::hex
                      << int(qh[size_t(first / K * ldq + first % K)]) << std::dec << " x scale "
                      << sh[size_t(fp8_group_scale_index(first / K, (first % K) / 128, M, G))] << " vs CPU "
                      << want[size_t(std::max<int64_t>(first, 0))] << " (input "
                      << xh[size_t(std::max<int64_t>(first, 0))] << ")";
  }
}

// Weights quantised on the host in 128x128 blocks as a checkpoint stores them (model/fp8_weights.h), uploaded
// as they are; inputs quantised by the group quantiser. Reference in double from the very codes and scales,
// so only the GEMM is under test: the code products are exact, the GPU adds its accumulation and the bf16
// rounding of the output (2^-9 |c|, 2^-8 to cover a result at a binade's edge). fp32 accumulation in any
// order is within K · 2^-24 · Σ|terms|; Hopper's FP8 MMA keeps ~14 mantissa bits inside one 128-deep K block
// before the partial sum is scaled and promoted to fp32 (DeepSeek-V3 report, 3.3.2), 2^-14 · Σ|terms of the
// block| per block, which 2^-12 · Σ|terms| covers with room. A scale applied to the wrong block, a transposed
// scale grid or a lost K slice moves c by far more. Shapes: ceil(K/128) not a multiple of 4 (the padded scale
// rows matter), N not a multiple of 128 (a partial weight block), K not a multiple of 128 (a partial last
// group), beta 1 (residual).
TEST_F(Fp8BlockCudaTest, BlockGemmMatchesExactProductOfCodesAndScales) {
  struct Shape {
    int64_t M, N, K;
    float beta;
  };
  for (const Shape sh :
       {Shape{1, 128, 128, 0.0f}, Shape{7, 200, 336, 1.0f}, Shape{33, 384, 1040, 0.0f},
        Shape{300, 256, 5120, 0.0f}, Shape{300, 144, 5120, 1.0f}, Shape{64, 5120, 640, 1.0f}}) {
    const int64_t M = sh.M, N = sh.N, K = sh.K, G = groups_of(K), NB = (N + 127) / 128,
                  ld = fp8_block_scale_ld(K);
    SCOPED_TRACE(testing::Message() << "M " << M << " N " << N << " K " << K << " beta " << sh.beta);
    Arena a = arena_;
    const std::vector<float> xh = graded(M, K, {0, 2, -3}, 31), wf = graded(N, K, {-4, -6, -2}, 32);
    std::vector<uint8_t> wq(size_t(N * K));
    std::vector<float> ws(size_t(NB * G)), wpad(size_t(NB * ld), 0.0f);
    fp8_quantize(wf.data(), N, K, 128, 128, wq.data(), ws.data());
    for (int64_t b = 0; b < NB; ++b) std::copy_n(ws.begin() + b * G, G, wpad.begin() + b * ld);
    std::mt19937 g(33);
    std::normal_distribution<float> d;
    std::vector<float> ch(size_t(M * N));
    for (float& v : ch) v = bf16_round(d(g));
    const int64_t ldx = K + 32, ldc = N + 16;
    Tensor x = a.alloc(DType::bf16, M, K), x8 = a.alloc(DType::f8_e4m3, M, ldx).cols_view(0, K);
    Tensor sx = a.alloc(DType::f32, 1, fp8_group_scales_size(M, G)), w8 = a.alloc(DType::f8_e4m3, N, K),
           sw = a.alloc(DType::f32, NB, ld);
    Tensor c = a.alloc(DType::bf16, M, ldc).cols_view(0, N);
    gpu_->upload_f32(x, xh.data());
    gpu_->upload_raw(w8, wq.data());
    gpu_->upload_f32(sw, wpad.data());
    gpu_->upload_f32(c, ch.data());
    gpu_->fp8_quantize_groups(x, x8, sx, false);
    gpu_->gemm_fp8_block(x8, sx, w8, sw, c, sh.beta);
    std::vector<uint8_t> qx(size_t(M * ldx));
    std::vector<float> sxh(size_t(sx.cols)), got(size_t(M * N));
    gpu_->download_raw(Tensor{x8.data, DType::u8, Device::cuda, M, ldx, ldx}, qx.data());
    gpu_->download_f32(sx, sxh.data());
    gpu_->download_f32(c, got.data());
    std::string why;
    const int64_t bad = fp8_gemm_mismatches(
        got, ch, sh.beta, M, N, K,
        [&](int64_t m, int64_t n, int64_t k) {
          return double(e4m3_to_f32(qx[size_t(m * ldx + k)])) * e4m3_to_f32(wq[size_t(n * K + k)]) *
                 sxh[size_t(fp8_group_scale_index(m, k / 128, M, G))] * ws[size_t((n / 128) * G + k / 128)];
        },
        &why);
    EXPECT_EQ(bad, 0) << why
                      << ". HINT: if only shapes with ceil(K/128) % 4 != 0 fail, cuBLASLt reads the weight block "
                         "scales unpadded (fp8_block_scale_ld)";
  }
}

// Every fused projection in whole 128-row blocks (fp8_check_blocks): hidden 256, heads of 128, DeltaNet
// conv channels 2·128 + 2·128, intermediate 384.
QwenConfig block_hybrid128() {
  return gated_hybrid(256, 384, 128, 128, 128, "block_hybrid128");
}

// A block checkpoint as `model init --fp8` writes it, loaded with target.dtype = "fp8" on both backends and
// without FP8 on the CPU (its dequantised weights, inputs unrounded). Both FP8 forwards multiply the file's
// weights; they differ by CUDA's bf16 activations (2^-9 relative), which move an input across an e4m3
// rounding boundary now and then (~2 % of the codes by one step), and by the order of accumulation: well
// under the e4m3 input rounding itself (CPU FP8 vs CPU dequantised, ~5 % on tests/unit/test_fp8_block.cpp's
// model). So the CUDA taps must sit within 1x of that from the CPU FP8 ones, and at least 0.3x of it from the
// unrounded ones (the FP8 path ran). A wrong block scale, a mis-grouped q_proj head or a transposed scale
// grid is O(1).
TEST_F(Fp8BlockCudaTest, TinyBlockCheckpointForwardMatchesCpuOracle) {
  const QwenConfig c = block_hybrid128();
  CpuOps cpu(CpuGdnMode::recurrent);
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("df_fp8_block_cuda_" + std::to_string(::getpid()))).string();
  TargetLoadOptions with_head;
  with_head.need_lm_head = true;
  TargetSaveOptions save;
  save.fp8_block_n = save.fp8_block_k = 128;
  target_save_hf(*target_random(c, 9, cpu, with_head), dir, save);
  TargetLoadOptions fp8;
  fp8.fp8 = true;
  auto cpu32 = target_load(dir, cpu, {});
  auto cpu8 = target_load(dir, cpu, fp8);
  auto gpu8 = target_load(dir, *gpu_, fp8);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(gpu8->fp8_codes && gpu8->fp8_group == 128)
      << "CudaOps must hold the checkpoint's codes and blocks";
  ASSERT_EQ(cpu8->fp8_group, 128);
  const std::vector<int32_t> ids = random_ids(150, c.vocab, 5);
  const std::vector<int32_t> lengths = {70, 1, 79};
  const FwdResult a = run_model(*cpu32, cpu, ids, lengths, c.layers, true);
  const FwdResult b = run_model(*cpu8, cpu, ids, lengths, c.layers, true);
  const FwdResult g = run_model(*gpu8, *gpu_, ids, lengths, c.layers, true);
  for (int l = 0; l <= c.layers; ++l) {
    const bool fin = l == c.layers;
    const std::string tap = fin ? "final norm" : std::to_string(l);
    const std::vector<float>& want = fin ? b.final_norm : b.taps[size_t(l)];
    const std::vector<float>& got = fin ? g.final_norm : g.taps[size_t(l)];
    const std::vector<float>& plain = fin ? a.final_norm : a.taps[size_t(l)];
    const double fp8_err = rel_rms(want, plain), err = rel_rms(got, want);
    double worst = -1;
    int64_t wi = 0;
    for (size_t i = 0; i < want.size(); ++i)
      if (!(std::fabs(double(got[i]) - want[i]) <= worst))
        worst = std::fabs(double(got[i]) - want[i]), wi = int64_t(i);
    std::printf(
        "tap %s: CUDA FP8 vs CPU FP8 rel rms %.3e max abs %.3e; CPU FP8 vs CPU dequantised rel rms %.3e\n",
        tap.c_str(), err, worst, fp8_err);
    EXPECT_LE(err, kFp8CudaAgreement * fp8_err) << "tap " << tap << ": worst at token " << wi / c.hidden << " col "
                            << wi % c.hidden << ": CUDA " << got[size_t(wi)] << " vs CPU FP8 "
                            << want[size_t(wi)];
    EXPECT_GE(rel_rms(got, plain), 0.3 * fp8_err)
        << "tap " << tap << ": the CUDA FP8 taps equal the unrounded ones";
  }
}
#endif
