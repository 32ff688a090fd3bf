// The FP8 target on CUDA (target.dtype = "fp8"): the row quantiser against core/fp8.h and
// CpuOps::fp8_round_rows bit for bit (every bf16 value included), the fused swiglu and rmsnorm quantisers
// against the op then the quantiser, the cuBLASLt FP8 GEMM against an exact host product of its codes and
// scales, a tiny FP8 forward against the CPU FP8 emulation per tap, and FP8 vs bf16 taps on a few 27B-shaped
// layers (the error FP8 costs, printed and bounded). Every failure prints the worst element, its index and
// both values. Skips itself without a device or a CUDA build.
#include <gtest/gtest.h>

#ifndef DF_HAVE_CUDA
TEST(Fp8CudaTest, SkippedWithoutCudaBuild) {
  GTEST_SKIP() << "built without CUDA: FP8 GPU tests skipped";
}
#else
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "core/fp8.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/cuda/cuda_ops.h"
#include "tests/gpu/cuda_arena_test.h"
#include "tests/unit/target_test_util.h"

using namespace df;

namespace {

class Fp8CudaTest : public CudaArenaTest {};

// The host reference of one row's quantisation: core/fp8.h, exactly as CpuOps::fp8_round_rows computes it.
void host_quantize_row(const float* x, int64_t K, uint8_t* q, float* scale) {
  float amax = 0.0f;
  for (int64_t c = 0; c < K; ++c) amax = std::max(amax, std::fabs(x[c]));
  *scale = e4m3_scale(amax);
  const float inv = e4m3_inv_scale(*scale);
  for (int64_t c = 0; c < K; ++c) q[c] = e4m3_quantize(x[c], inv);
}

bool same(float a, float b) {  // bit-for-bit tests meet NaN codes: any NaN equals any NaN
  return a == b || (std::isnan(a) && std::isnan(b));
}

// fp8_quantize_rows on the [M, K] rows x (bf16 values) against core/fp8.h and CpuOps::fp8_round_rows, bit for
// bit: each scale, each code, code · scale against the CPU op, and x afterwards (code · scale in bf16 with
// write_back, x untouched without). x and the codes are views of wider buffers (strided rows on both sides).
void expect_quantised_as_core(CudaOps& gpu, Arena a, const std::vector<float>& x, int64_t M, int64_t K,
                              bool write_back) {
  SCOPED_TRACE(testing::Message() << "M " << M << " K " << K << (write_back ? " write_back" : ""));
  const int64_t pad = 16;
  Tensor xg = a.alloc(DType::bf16, M, K + pad).cols_view(0, K);
  Tensor qg = a.alloc(DType::f8_e4m3, M, K + pad).cols_view(0, K);
  Tensor sg = a.alloc(DType::f32, 1, M);
  gpu.upload_f32(xg, x.data());
  gpu.fp8_quantize_rows(xg, qg, sg, write_back);
  std::vector<uint8_t> q(size_t(M * (K + pad)));
  std::vector<float> s(static_cast<size_t>(M)), back(size_t(M * K));
  gpu.download_raw(Tensor{qg.data, DType::u8, Device::cuda, M, K + pad, K + pad}, q.data());
  gpu.download_f32(sg, s.data());
  gpu.download_f32(xg, back.data());
  // The CPU op itself on the same rows: its output must be each GPU code times the GPU scale.
  std::vector<float> rounded = x;
  CpuOps cpu;
  cpu.fp8_round_rows(tensor_make(rounded.data(), DType::f32, Device::cpu, M, K));
  std::vector<uint8_t> wq(static_cast<size_t>(K));
  int64_t bad = 0;
  for (int64_t r = 0; r < M; ++r) {
    float ws = 0;
    host_quantize_row(&x[size_t(r * K)], K, wq.data(), &ws);
    if (s[size_t(r)] != ws && bad++ < 5)
      ADD_FAILURE() << "row " << r << ": scale " << s[size_t(r)] << " (GPU) vs " << ws << " (core/fp8.h)";
    for (int64_t c = 0; c < K; ++c) {
      const size_t i = size_t(r * K + c);
      const uint8_t g = q[size_t(r * (K + pad) + c)];
      const float deq = e4m3_to_f32(g) * s[size_t(r)], want_back = write_back ? bf16_round(deq) : x[i];
      if ((g != wq[size_t(c)] || !same(deq, rounded[i]) || !same(back[i], want_back)) && bad++ < 5)
        ADD_FAILURE() << "[" << r << ", " << c << "] x " << std::hexfloat << x[i] << ": GPU code 0x"
                      << std::hex << int(g) << " vs core/fp8.h 0x" << int(wq[size_t(c)])
                      << "; GPU code·scale " << deq << " vs CpuOps::fp8_round_rows " << rounded[i]
                      << "; x afterwards " << back[i] << " (want " << want_back << ")" << std::defaultfloat;
    }
  }
  EXPECT_EQ(bad, 0) << "elements or scales that differ";
}

TEST_F(Fp8CudaTest, QuantiseMatchesCoreFp8BitForBit) {
  // Magnitudes from 2^-100 to 2^100 (bf16 and the scale stay normal f32), zero rows, unit rows.
  const std::vector<int> exps = {0, -1000, 7, -20, 100, -100, 3, -1000, -6};
  // The kernel's paths: K 37 (rows not 16-byte aligned) the scalar loop; K 16 to 17408 rows held in registers
  // (8 elements x R per thread: R 1, 3 for 5120, 9 for down_proj's 17408); K 40000 the 8-wide two-pass loop.
  for (int64_t M : {1, 7, 300})
    for (int64_t K : {16, 37, 48, 5120, 17408, 40000})
      for (bool write_back : {false, true})
        expect_quantised_as_core(*gpu_, arena_, bf16_rows(M, K, exps, uint32_t(M * 131 + K)), M, K, write_back);
}

// The hardware conversion against core/fp8.h on every bf16 input it can meet: rows whose amax is 448 (scale
// 1, reciprocal 1, so each code is the conversion of the bf16 value itself) holding every bf16 with |x| <=
// 448, ties and subnormal codes included, and NaNs of both signs; rows whose amax is 448 · 2^-126 (scale
// 2^-126, the smallest normal) holding every bf16 below it, f32 subnormals included, which the product scales
// into the e4m3 range (a flush-to-zero multiply would zero them); a row holding an infinity (scale inf, codes
// 0 and NaN). Over each of the kernel's three paths.
TEST_F(Fp8CudaTest, QuantiseEveryBf16ValueMatchesCoreFp8) {
  struct Group {
    float amax;
    std::vector<float> values;
  };
  std::vector<Group> groups(3);
  groups[0].amax = 448.0f;
  groups[1].amax = 448.0f * std::ldexp(1.0f, -126);
  for (uint32_t b = 0; b <= 0x43e0u; ++b)
    for (uint32_t sign : {0u, 0x8000u}) {
      groups[0].values.push_back(bf16_to_f32(uint16_t(b | sign)));
      if (bf16_to_f32(uint16_t(b)) <= groups[1].amax)
        groups[1].values.push_back(bf16_to_f32(uint16_t(b | sign)));
    }
  for (uint32_t nan : {0x7fc0u, 0xffc0u, 0x7f81u, 0xffffu})
    groups[0].values.push_back(bf16_to_f32(uint16_t(nan)));
  const float inf = std::numeric_limits<float>::infinity();
  groups[2] = {inf, {1.0f, -2.0f, 0.0f, -0.0f, -inf, std::ldexp(1.0f, -130)}};
  for (int64_t K : {37, 4096, 40000}) {
    // Each row: its group's amax first, then the group's next K - 1 values (zeros past the group's end).
    std::vector<float> x;
    for (const Group& g : groups)
      for (size_t next = 0; next < g.values.size();) {
        x.push_back(g.amax);
        for (int64_t c = 1; c < K; ++c) x.push_back(next < g.values.size() ? g.values[next++] : 0.0f);
      }
    for (bool write_back : {false, true})
      expect_quantised_as_core(*gpu_, arena_, x, int64_t(x.size()) / K, K, write_back);
  }
}

// Two GPU quantisations of the same [M, K] rows (codes f8 views, any row pitch), bit for bit: ref from the
// unfused ops, got from the fused one. Prints the first differing scales and codes with their rows' values.
void expect_same_codes(CudaOps& gpu, const Tensor& q_ref, const Tensor& s_ref, const Tensor& q,
                       const Tensor& s, const Tensor& values, const char* fused) {
  const int64_t M = q.rows, K = q.cols;
  std::vector<uint8_t> c_ref(size_t(M * q_ref.stride)), c(size_t(M * q.stride));
  std::vector<float> h_ref(static_cast<size_t>(M)), h(static_cast<size_t>(M)), v(size_t(M * K));
  gpu.download_raw(Tensor{q_ref.data, DType::u8, Device::cuda, M, q_ref.stride, q_ref.stride}, c_ref.data());
  gpu.download_raw(Tensor{q.data, DType::u8, Device::cuda, M, q.stride, q.stride}, c.data());
  gpu.download_f32(s_ref, h_ref.data());
  gpu.download_f32(s, h.data());
  gpu.download_f32(values, v.data());
  int64_t bad = 0;
  for (int64_t r = 0; r < M; ++r) {
    if (h_ref[size_t(r)] != h[size_t(r)] && bad++ < 5)
      ADD_FAILURE() << "row " << r << ": scale " << h[size_t(r)] << " (" << fused << ") vs "
                    << h_ref[size_t(r)] << " (unfused)";
    for (int64_t col = 0; col < K; ++col) {
      const uint8_t want = c_ref[size_t(r * q_ref.stride + col)], got = c[size_t(r * q.stride + col)];
      if (got != want && bad++ < 5)
        ADD_FAILURE() << "[" << r << ", " << col << "] value " << v[size_t(r * K + col)] << ": " << fused
                      << " code 0x" << std::hex << int(got) << " vs unfused 0x" << int(want) << std::dec;
    }
  }
  EXPECT_EQ(bad, 0) << "codes or scales that differ";
}

// swiglu_fp8 (the down projection's input codes straight from gate and up) against swiglu into bf16 then
// fp8_quantize_rows, bit for bit, on the forward's layout (gate and up the two halves of one [M, 2I] buffer),
// over the kernel's paths: I 37 scalar, 16 to 17408 in registers, 40000 two-pass.
TEST_F(Fp8CudaTest, SwigluFp8MatchesSwigluThenQuantise) {
  for (int64_t M : {1, 7, 300})
    for (int64_t I : {16, 37, 48, 5120, 17408, 40000}) {
      SCOPED_TRACE(testing::Message() << "M " << M << " I " << I);
      Arena a = arena_;
      Tensor gu = a.alloc(DType::bf16, M, 2 * I), act = a.alloc(DType::bf16, M, I);
      Tensor q1 = a.alloc(DType::f8_e4m3, M, I), q2 = a.alloc(DType::f8_e4m3, M, I);
      Tensor s1 = a.alloc(DType::f32, 1, M), s2 = a.alloc(DType::f32, 1, M);
      gpu_->upload_f32(gu, bf16_rows(M, 2 * I, {2, -1, 0, -1000, 9}, uint32_t(M + 7 * I)).data());
      const Tensor g = gu.cols_view(0, I), u = gu.cols_view(I, I);
      gpu_->swiglu(g, u, act);
      gpu_->fp8_quantize_rows(act, q1, s1, false);
      gpu_->swiglu_fp8(g, u, q2, s2);
      expect_same_codes(*gpu_, q1, s1, q2, s2, act, "swiglu_fp8");
    }
}

// rmsnorm_fp8 (a norm whose output feeds an FP8 GEMM) against rmsnorm then fp8_quantize_rows, bit for bit in
// the codes, the scales and out (the norm, or code · scale with write_back), both norm kinds, codes a view of
// wider rows as in the forward; K 37 and 40000 take the unfused fallback, the others the register kernel.
TEST_F(Fp8CudaTest, RmsnormFp8MatchesRmsnormThenQuantise) {
  for (int64_t M : {1, 7, 300})
    for (int64_t K : {16, 37, 48, 5120, 6144, 40000})
      for (NormKind kind : {NormKind::plain, NormKind::zero_centred})
        for (bool write_back : {false, true}) {
          SCOPED_TRACE(testing::Message()
                       << "M " << M << " K " << K << " zero_centred " << (kind == NormKind::zero_centred)
                       << " write_back " << write_back);
          Arena a = arena_;
          Tensor x = a.alloc(DType::bf16, M, K), w = a.alloc(DType::f32, 1, K);
          Tensor o1 = a.alloc(DType::bf16, M, K), o2 = a.alloc(DType::bf16, M, K);
          Tensor q1 = a.alloc(DType::f8_e4m3, M, K + 32).cols_view(0, K);
          Tensor q2 = a.alloc(DType::f8_e4m3, M, K + 32).cols_view(0, K);
          Tensor s1 = a.alloc(DType::f32, 1, M), s2 = a.alloc(DType::f32, 1, M);
          gpu_->upload_f32(x, bf16_rows(M, K, {0, 3, -4, -1000, 20}, uint32_t(M * 3 + K)).data());
          gpu_->upload_f32(w, bf16_rows(1, K, {-2}, uint32_t(K)).data());
          gpu_->rmsnorm(x, w, o1, 1e-6f, kind);
          gpu_->fp8_quantize_rows(o1, q1, s1, write_back);
          gpu_->rmsnorm_fp8(x, w, o2, 1e-6f, kind, q2, s2, write_back);
          expect_same_codes(*gpu_, q1, s1, q2, s2, o1, "rmsnorm_fp8");
          std::vector<float> h1(size_t(M * K)), h2(size_t(M * K));
          gpu_->download_f32(o1, h1.data());
          gpu_->download_f32(o2, h2.data());
          int64_t bad = 0;
          for (size_t i = 0; i < h1.size(); ++i)
            if (!same(h1[i], h2[i]) && bad++ < 5)
              ADD_FAILURE() << "out [" << i / size_t(K) << ", " << i % size_t(K) << "]: rmsnorm_fp8 " << h2[i]
                            << " vs rmsnorm + fp8_quantize_rows " << h1[i];
          EXPECT_EQ(bad, 0) << "out elements that differ";
        }
}

TEST_F(Fp8CudaTest, GemmMatchesExactProductOfCodesAndScales) {
  struct Shape {
    int64_t M, N, K;
    float beta;
  };
  // Odd M (one token, 7, 33, 300), N and K multiples of 16 as the target's loader demands (16 to the 27B's
  // hidden size), and the residual-add form (beta 1) the output projections use.
  for (const Shape sh : {Shape{1, 48, 16, 0.0f}, Shape{7, 48, 48, 1.0f}, Shape{300, 144, 5120, 0.0f},
                         Shape{300, 80, 5120, 1.0f}, Shape{33, 5120, 64, 1.0f}}) {
    const int64_t M = sh.M, N = sh.N, K = sh.K;
    SCOPED_TRACE(testing::Message() << "M " << M << " N " << N << " K " << K << " beta " << sh.beta);
    Arena a = arena_;
    const int64_t ldx = K + 32, ldc = N + 16;  // x codes and c are views of wider buffers, as in the forward
    const std::vector<float> xh = bf16_rows(M, K, {0, 2, -3, -1000}, 11),
                             wh = bf16_rows(N, K, {-4, -6, -2}, 12);
    std::vector<float> ch = bf16_rows(M, N, {1}, 13);
    Tensor x = a.alloc(DType::bf16, M, K), w = a.alloc(DType::bf16, N, K);
    Tensor x8 = a.alloc(DType::f8_e4m3, M, ldx).cols_view(0, K), sx = a.alloc(DType::f32, 1, M);
    Tensor w8 = a.alloc(DType::f8_e4m3, N, K), sw = a.alloc(DType::f32, 1, N);
    Tensor c = a.alloc(DType::bf16, M, ldc).cols_view(0, N);
    gpu_->upload_f32(x, xh.data());
    gpu_->upload_f32(w, wh.data());
    gpu_->upload_f32(c, ch.data());
    gpu_->fp8_quantize_rows(x, x8, sx, false);
    gpu_->fp8_quantize_rows(w, w8, sw, false);
    gpu_->gemm_fp8(x8, sx, w8, sw, c, sh.beta);
    std::vector<uint8_t> qx(size_t(M * ldx)), qw(size_t(N * K));
    std::vector<float> sxh(static_cast<size_t>(M)), swh(static_cast<size_t>(N)), got(size_t(M * N));
    gpu_->download_raw(Tensor{x8.data, DType::u8, Device::cuda, M, ldx, ldx}, qx.data());
    gpu_->download_raw(Tensor{w8.data, DType::u8, Device::cuda, N, K, K}, qw.data());
    gpu_->download_f32(sx, sxh.data());
    gpu_->download_f32(sw, swh.data());
    gpu_->download_f32(c, got.data());
    // Reference in double from the downloaded codes and scales, so only the GEMM is under test: the code
    // products are exact (4-bit significands). For K = 5120 the bound (fp8_gemm_mismatches) is about 1.4 % of
    // a typical |c|, while a lost 16-wide K slice, a wrong scale or a mis-strided operand moves c by far more.
    std::string why;
    const int64_t bad = fp8_gemm_mismatches(
        got, ch, sh.beta, M, N, K,
        [&](int64_t m, int64_t n, int64_t k) {
          return double(e4m3_to_f32(qx[size_t(m * ldx + k)])) * e4m3_to_f32(qw[size_t(n * K + k)]) *
                 (double(sxh[size_t(m)]) * swh[size_t(n)]);
        },
        &why);
    EXPECT_EQ(bad, 0) << why;
  }
}

// A hybrid config whose every projection input is a multiple of 16 (the FP8 GEMMs' rule): hidden 32, q 2·16,
// DeltaNet value dim 2·16, intermediate 48.
QwenConfig tiny_hybrid16() {
  return gated_hybrid(32, 48, 16, 16, 16, "tiny_hybrid16", 4, 37);
}

struct TapError {
  double rel_rms = 0, max_abs = 0, got = 0, want = 0;
  int64_t worst = -1;
};

TapError tap_error(const std::vector<float>& got, const std::vector<float>& want) {
  TapError e;
  e.rel_rms = rel_rms(got, want);
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = std::fabs(double(got[i]) - want[i]);
    if (!(d <= e.max_abs))
      e.max_abs = std::isfinite(d) ? d : 1e30, e.worst = int64_t(i), e.got = got[i], e.want = want[i];
  }
  return e;
}

// The FP8 CUDA forward against the CPU FP8 emulation (same weights: fill_normal draws the same values on
// both), within kFp8CudaAgreement (target_test_util.h) of the FP8 rounding error (CPU FP8 vs CPU fp32, measured
// here). And the FP8 rounding must have happened: the CUDA FP8 taps at least 0.3x of that error from the fp32
// ones.
constexpr double kFp8AgreementFactor = kFp8CudaAgreement;
constexpr double kFp8PresenceFactor = 0.3;

TEST_F(Fp8CudaTest, TinyForwardMatchesCpuFp8Emulation) {
  const QwenConfig c = tiny_hybrid16();
  CpuOps cpu(CpuGdnMode::recurrent);
  TargetLoadOptions fp8;
  fp8.fp8 = true;
  auto cpu32 = target_random(c, 7, cpu, {});
  auto cpu8 = target_random(c, 7, cpu, fp8);
  auto gpu8 = target_random(c, 7, *gpu_, fp8);
  ASSERT_TRUE(gpu8->fp8_codes) << "CudaOps must hold an FP8 target as codes";
  ASSERT_FALSE(cpu8->fp8_codes);
  const std::vector<int32_t> ids = random_ids(150, c.vocab, 5);
  const std::vector<int32_t> lengths = {70, 1, 79};
  const FwdResult a = run_model(*cpu32, cpu, ids, lengths, c.layers, true);
  const FwdResult b = run_model(*cpu8, cpu, ids, lengths, c.layers, true);
  const FwdResult g = run_model(*gpu8, *gpu_, ids, lengths, c.layers, true);
  for (int l = 0; l <= c.layers; ++l) {
    const bool fin = l == c.layers;
    const std::vector<float>& want = fin ? b.final_norm : b.taps[size_t(l)];
    const std::vector<float>& got = fin ? g.final_norm : g.taps[size_t(l)];
    const double fp8_err = rel_rms(want, fin ? a.final_norm : a.taps[size_t(l)]);
    const TapError e = tap_error(got, want);
    std::printf("tap %s: CUDA FP8 vs CPU FP8 rel rms %.3e max abs %.3e; CPU FP8 vs CPU fp32 rel rms %.3e\n",
                fin ? "final norm" : std::to_string(l).c_str(), e.rel_rms, e.max_abs, fp8_err);
    EXPECT_LE(e.rel_rms, kFp8AgreementFactor * fp8_err)
        << "tap " << (fin ? "final norm" : std::to_string(l)) << ": worst at token " << e.worst / c.hidden
        << " col " << e.worst % c.hidden << ": CUDA " << e.got << " vs CPU FP8 " << e.want;
    EXPECT_GE(rel_rms(got, fin ? a.final_norm : a.taps[size_t(l)]), kFp8PresenceFactor * fp8_err)
        << "tap " << (fin ? "final norm" : std::to_string(l)) << ": the CUDA FP8 taps equal the fp32 ones";
  }
}

// The fidelity figure on the real shapes: FP8 vs bf16 taps of the CUDA forward on the first layers of
// a Qwen3.6-27B-shaped random model (three DeltaNet layers, one gated attention layer). Bound, as in
// tests/unit/test_fp8_target.cpp: e4m3 keeps 3 mantissa bits, a uniform relative rounding error of RMS
// 2^-4/√3 ≈ 3.6 % per operand, ≈ 5 % on a product, which a dot product over K random-signed terms keeps as a
// relative error; each of a layer's two sub-layers adds that to the residual stream, so after L layers the
// taps sit at most ~5 %·√(2L) away (14 % after 4). Twice that, 2 · 0.05 · √(2L), bounds it; unquantised
// operands give ~0 (then the FP8 path is not running: checked below as a floor of 1e-3) and wrong scales
// O(1).
TEST_F(Fp8CudaTest, Fp8VsBf16TapsOn27bShapes) {
  nlohmann::json types = {"linear_attention", "linear_attention", "linear_attention", "full_attention"};
  nlohmann::json j = {
      {"model_type", "qwen3_5_text"}, {"hidden_size", 5120},           {"num_hidden_layers", 4},
      {"layer_types", types},         {"intermediate_size", 17408},    {"vocab_size", 248320},
      {"num_attention_heads", 24},    {"num_key_value_heads", 4},      {"head_dim", 256},
      {"attn_output_gate", true},     {"partial_rotary_factor", 0.25}, {"rope_theta", 1e7},
      {"rms_norm_eps", 1e-6},         {"linear_num_key_heads", 16},    {"linear_num_value_heads", 48},
      {"linear_key_head_dim", 128},   {"linear_value_head_dim", 128},  {"linear_conv_kernel_dim", 4},
      {"tie_word_embeddings", false}};
  const QwenConfig c = qwen_config_from_json(j, "Qwen3.6-27B shapes, 4 layers");
  TargetLoadOptions fp8;
  fp8.fp8 = true;
  const std::vector<int32_t> lengths = {300, 212};
  const std::vector<int32_t> ids = random_ids(512, c.vocab, 9);
  FwdResult bf, f8;
  {
    auto m = target_random(c, 3, *gpu_, {});
    bf = run_model(*m, *gpu_, ids, lengths, c.layers, false);
  }
  {
    auto m = target_random(c, 3, *gpu_, fp8);
    f8 = run_model(*m, *gpu_, ids, lengths, c.layers, false);
  }
  for (int l = 0; l < c.layers; ++l) {
    const TapError e = tap_error(f8.taps[size_t(l)], bf.taps[size_t(l)]);
    const double bound = 2 * 0.05 * std::sqrt(2.0 * (l + 1));
    std::printf(
        "27B shapes, layer %d (%s): FP8 vs bf16 rel rms %.3e, max abs %.3e at token %lld col %lld "
        "(%.4g vs %.4g); bound %.3f\n",
        l, c.layer_types[size_t(l)] == LayerKind::full_attention ? "attention" : "DeltaNet", e.rel_rms,
        e.max_abs, (long long)(e.worst / c.hidden), (long long)(e.worst % c.hidden), e.got, e.want, bound);
    EXPECT_LE(e.rel_rms, bound) << "layer " << l << ": worst at token " << e.worst / c.hidden << " col "
                                << e.worst % c.hidden << ": FP8 " << e.got << " vs bf16 " << e.want;
    EXPECT_GE(e.rel_rms, 1e-3) << "layer " << l
                               << ": FP8 taps equal the bf16 ones: the FP8 GEMMs did not run";
  }
}

}  // namespace
#endif
