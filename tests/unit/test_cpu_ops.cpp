// CpuOps against naive double-precision formulas written here from MODELS.md, on awkward sizes, strided
// views with NaN guards, and packed batches (outputs of a packed run must equal per-sequence runs exactly).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "cpu_test_util.h"
#include "ops/cpu/cpu_ops.h"

using namespace df;
using namespace df::test;

namespace {

double ref_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double ref_silu(double x) { return x * ref_sigmoid(x); }

// Normalised row in double: x · rsqrt(mean(x²) + eps) · (w or 1 + w).
std::vector<double> ref_norm(const float* x, const float* w, int64_t n, double eps, NormKind kind) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const double r = 1.0 / std::sqrt(ss / double(n) + eps);
  std::vector<double> y(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) y[size_t(i)] = x[i] * r * (kind == NormKind::plain ? w[i] : 1.0 + w[i]);
  return y;
}

std::string tag(const char* what, std::initializer_list<int64_t> sizes) {
  std::string s = what;
  for (int64_t v : sizes) s += " " + std::to_string(v);
  return s;
}

}  // namespace

// ---- memory -------------------------------------------------------------------------------------------

TEST(CpuOps, UploadDownloadCopyHonourStridesAndBf16) {
  CpuOps ops;
  EXPECT_EQ(ops.act_dtype(), DType::f32);
  void* p = ops.alloc_bytes(1000);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 256, 0u);
  ops.free_bytes(p);

  std::mt19937 rng(1);
  Mat m(7, 19, 5, 3);
  std::vector<float> src(7 * 19);
  std::uniform_real_distribution<float> d(-3, 3);
  for (float& v : src) v = d(rng);
  ops.upload_f32(m.t, src.data());
  EXPECT_EQ(m.guards_clobbered(), 0);
  std::vector<float> back(src.size());
  ops.download_f32(m.t, back.data());
  EXPECT_EQ(back, src);

  // f32 -> bf16 rounds to nearest even; bf16 -> f32 is exact.
  std::vector<uint16_t> hb(7 * 19);
  Tensor tb = tensor_make(hb.data(), DType::bf16, Device::cpu, 7, 19);
  ops.copy(m.t, tb);
  Mat m2(7, 19, 2, 1);
  ops.copy(tb, m2.t);
  std::vector<float> got = m2.host();
  for (size_t i = 0; i < src.size(); ++i) ASSERT_EQ(got[i], bf16_round(src[i])) << i;
  ops.upload_f32(tb, src.data());
  ops.download_f32(tb, back.data());
  for (size_t i = 0; i < src.size(); ++i) ASSERT_EQ(back[i], bf16_round(src[i])) << i;

  std::vector<int32_t> ids = {5, -1, 7}, ids_dev(3);
  ops.upload_raw(tensor_make(ids_dev.data(), DType::i32, Device::cpu, 1, 3), ids.data());
  EXPECT_EQ(ids_dev, ids);
  EXPECT_THROW(ops.copy(m.t, m2.t.rows_view(0, 6)), Error);
}

// ---- gemm ---------------------------------------------------------------------------------------------

// Sums of K ≤ 513 products of values in [-1, 1] in fp32 (BLAS and the loop in different orders): the
// rounding error grows like u·√K·|partial sums|, observed ≤ 2e-5. atol 1e-4 leaves 5x margin while a wrong
// index or a dropped K block moves results by O(0.1).
TEST(CpuOps, GemmBlasAndLoopMatchDoubleReference) {
  CpuOps ops;
  std::mt19937 rng(2);
  const int64_t shapes[][3] = {{1, 1, 1}, {3, 7, 19}, {65, 33, 200}, {19, 65, 7}, {70, 130, 300}, {2, 200, 513}};
  for (const auto& s : shapes) {
    const int64_t M = s[0], N = s[1], K = s[2];
    for (float beta : {0.0f, 0.5f}) {
      Mat a(M, K, 3, 1), w(N, K, 2, 2), c0(M, N, 4, 4);
      a.fill_uniform(rng);
      w.fill_uniform(rng);
      if (beta != 0.0f) c0.fill_uniform(rng);  // with beta 0, c holds NaN and must not be read
      std::vector<double> want(size_t(M * N));
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double acc = beta != 0.0f ? double(beta) * c0.at(i, j) : 0.0;
          for (int64_t k = 0; k < K; ++k) acc += double(a.at(i, k)) * w.at(j, k);
          want[size_t(i * N + j)] = acc;
        }
      Mat c1 = c0, c2 = c0;
      c1.t.data = c1.buf.data() + 4;  // copies must point at their own buffers
      c2.t.data = c2.buf.data() + 4;
      ops.gemm(a.t, w.t, c1.t, beta);
      cpu_gemm_loop(M, N, K, a.t.ptr<float>(), a.t.stride, w.t.ptr<float>(), w.t.stride, beta, c2.t.ptr<float>(),
                    c2.t.stride);
      count_mismatch(c1.host(), want, 1e-4, 1e-4, tag(cpu_gemm_uses_blas() ? "gemm(blas)" : "gemm(loop)", {M, N, K}));
      count_mismatch(c2.host(), want, 1e-4, 1e-4, tag("cpu_gemm_loop", {M, N, K}));
      EXPECT_EQ(c1.guards_clobbered(), 0);
      EXPECT_EQ(c2.guards_clobbered(), 0);
    }
  }
  Mat a(3, 4), w(5, 3), c(3, 5);
  EXPECT_THROW(ops.gemm(a.t, w.t, c.t, 0.0f), Error);
}

// ---- per-row ops --------------------------------------------------------------------------------------

TEST(CpuOps, EmbeddingCopiesRows) {
  CpuOps ops;
  std::mt19937 rng(3);
  Mat table(11, 24);
  table.fill_uniform(rng);
  std::vector<int32_t> ids = {0, 10, 3, 3, 7};
  Tensor tid = tensor_make(ids.data(), DType::i32, Device::cpu, 1, 5);
  Mat out(5, 24, 3, 2);
  ops.embedding(tid, table.t, out.t);
  for (int t = 0; t < 5; ++t)
    for (int c = 0; c < 24; ++c) ASSERT_EQ(out.at(t, c), table.at(ids[size_t(t)], c));
  EXPECT_EQ(out.guards_clobbered(), 0);
  ids[1] = 11;
  EXPECT_THROW(ops.embedding(tid, table.t, out.t), Error);
}

// Normalising a row costs a handful of fp32 roundings per element (|x·r| is O(√n) at most): rtol 2e-6
// with atol 1e-6 is well above that and far below any formula error (eps or 1 + w mix-ups are O(1e-3+)).
TEST(CpuOps, RmsnormPlainAndZeroCentred) {
  CpuOps ops;
  std::mt19937 rng(4);
  for (NormKind kind : {NormKind::plain, NormKind::zero_centred}) {
    for (int64_t cols : {1, 3, 24, 65, 200}) {
      for (int64_t rows : {1, 7, 19}) {
        Mat x(rows, cols, 3, 2), w(1, cols), out(rows, cols, 1, 1);
        x.fill_uniform(rng, -2, 2);
        w.fill_uniform(rng, -0.5, 1.5);
        std::vector<double> want;
        for (int64_t r = 0; r < rows; ++r) {
          auto y = ref_norm(&x.at(r, 0), w.t.ptr<float>(), cols, 1e-6, kind);
          want.insert(want.end(), y.begin(), y.end());
        }
        ops.rmsnorm(x.t, w.t, out.t, 1e-6f, kind);
        count_mismatch(out.host(), want, 1e-6, 2e-6, tag("rmsnorm", {int(kind), rows, cols}));
        EXPECT_EQ(out.guards_clobbered(), 0);
        ops.rmsnorm(x.t, w.t, x.t, 1e-6f, kind);  // in place
        count_mismatch(x.host(), want, 1e-6, 2e-6, tag("rmsnorm in place", {int(kind), rows, cols}));
      }
    }
  }
  Mat x(3, 8), w(1, 7), out(3, 8);
  EXPECT_THROW(ops.rmsnorm(x.t, w.t, out.t, 1e-6f, NormKind::plain), Error);
}

TEST(CpuOps, AddRmsnormUpdatesResidualThenNorms) {
  CpuOps ops;
  std::mt19937 rng(5);
  for (int64_t cols : {3, 65}) {
    Mat res(7, cols, 2, 1), delta(7, cols, 5, 5), w(1, cols), out(7, cols);
    res.fill_uniform(rng);
    delta.fill_uniform(rng);
    w.fill_uniform(rng);
    std::vector<float> sum(size_t(7 * cols));
    for (int64_t r = 0; r < 7; ++r)
      for (int64_t c = 0; c < cols; ++c) sum[size_t(r * cols + c)] = res.at(r, c) + delta.at(r, c);
    std::vector<double> want;
    for (int64_t r = 0; r < 7; ++r) {
      auto y = ref_norm(&sum[size_t(r * cols)], w.t.ptr<float>(), cols, 1e-6, NormKind::zero_centred);
      want.insert(want.end(), y.begin(), y.end());
    }
    ops.add_rmsnorm(res.t, delta.t, w.t, out.t, 1e-6f, NormKind::zero_centred);
    EXPECT_EQ(res.host(), sum);  // the fp32 add is exact to specify
    count_mismatch(out.host(), want, 1e-6, 2e-6, tag("add_rmsnorm", {cols}));
    EXPECT_EQ(res.guards_clobbered(), 0);
  }
}

// After the norm the values are O(1..√hd); RoPE adds the angle rounding of the fp32 product pos·inv_freq
// (≤ ulp(200)/2 ≈ 8e-6 rad at our positions) plus fp32 inv_freq rounding (≤ 200·6e-8): a few 1e-5 at most,
// observed 1.6e-6. A swapped pair, wrong half, sign or frequency exponent errs by O(0.1) (a flipped sin sign
// was seen to fail with errors of 2..7).
TEST(CpuOps, QkNormRopeRotateHalfPartial) {
  CpuOps ops;
  std::mt19937 rng(6);
  struct Case { int heads, hd, rot; float theta; NormKind kind; std::vector<int> lens; };
  const Case cases[] = {{1, 8, 8, 1e6f, NormKind::plain, {1}},
                        {3, 24, 6, 1e7f, NormKind::zero_centred, {3, 7}},
                        {5, 32, 32, 1e6f, NormKind::plain, {19, 1, 65}},
                        {2, 32, 8, 1e7f, NormKind::zero_centred, {200}},
                        {3, 8, 0, 1e4f, NormKind::plain, {2, 5}}};
  for (const Case& cs : cases) {
    auto pk = packed_make(cs.lens);
    const int64_t T = pk->seqs.tokens, W = int64_t(cs.heads) * cs.hd;
    Mat x(T, W, 7, 3), w(1, cs.hd);
    x.fill_uniform(rng, -2, 2);
    w.fill_uniform(rng, -0.3, 1.3);
    std::vector<double> want(size_t(T * W));
    const int half = cs.rot / 2;
    for (int64_t t = 0; t < T; ++t) {
      for (int h = 0; h < cs.heads; ++h) {
        auto y = ref_norm(&x.at(t, int64_t(h) * cs.hd), w.t.ptr<float>(), cs.hd, 1e-6, cs.kind);
        std::vector<double> r = y;
        for (int j = 0; j < half; ++j) {
          const double ang = pk->pos[size_t(t)] * std::pow(double(cs.theta), -2.0 * j / cs.rot);
          r[size_t(j)] = y[size_t(j)] * std::cos(ang) - y[size_t(j + half)] * std::sin(ang);
          r[size_t(j + half)] = y[size_t(j + half)] * std::cos(ang) + y[size_t(j)] * std::sin(ang);
        }
        for (int i = 0; i < cs.hd; ++i) want[size_t(t * W + h * cs.hd + i)] = r[size_t(i)];
      }
    }
    ops.qk_norm_rope(x.t, w.t, pk->seqs.pos, cs.heads, cs.hd, cs.rot, cs.theta, 1e-6f, cs.kind);
    count_mismatch(x.host(), want, 5e-5, 1e-5, tag("qk_norm_rope", {cs.heads, cs.hd, cs.rot, T}));
    EXPECT_EQ(x.guards_clobbered(), 0);
  }
  Mat x(2, 16), w(1, 8);
  std::vector<int32_t> pos = {0, 1};
  Tensor tp = tensor_make(pos.data(), DType::i32, Device::cpu, 1, 2);
  EXPECT_THROW(ops.qk_norm_rope(x.t, w.t, tp, 2, 8, 5, 1e6f, 1e-6f, NormKind::plain), Error);  // odd rot
}

TEST(CpuOps, SigmoidGateAndSwiglu) {
  CpuOps ops;
  std::mt19937 rng(7);
  for (int64_t cols : {1, 19, 65}) {
    Mat o(7, cols, 4, 2), g(7, cols, cols, 0), u(7, cols, 1, 0), out(7, cols, 2, 2);
    o.fill_uniform(rng, -3, 3);
    g.fill_uniform(rng, -8, 8);
    u.fill_uniform(rng, -3, 3);
    std::vector<double> want_gate, want_glu;
    for (int64_t r = 0; r < 7; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        want_gate.push_back(o.at(r, c) * ref_sigmoid(g.at(r, c)));
        want_glu.push_back(ref_silu(g.at(r, c)) * u.at(r, c));
      }
    // One exp, one divide and one multiply in fp32: a few ulp.
    ops.swiglu(g.t, u.t, out.t);
    count_mismatch(out.host(), want_glu, 1e-6, 1e-6, tag("swiglu", {cols}));
    ops.sigmoid_gate(o.t, g.t);
    count_mismatch(o.host(), want_gate, 1e-6, 1e-6, tag("sigmoid_gate", {cols}));
    EXPECT_EQ(o.guards_clobbered() + out.guards_clobbered(), 0);
  }
}

// As for rmsnorm plus one silu: a few fp32 roundings per element.
TEST(CpuOps, GatedRmsnormPerValueHead) {
  CpuOps ops;
  std::mt19937 rng(8);
  for (int heads : {1, 3}) {
    for (int dv : {8, 24, 32}) {
      const int64_t T = 19, W = int64_t(heads) * dv;
      Mat o(T, W, 2, 1), z(T, W, W, 0), w(1, dv), out(T, W, 3, 0);
      o.fill_uniform(rng, -2, 2);
      z.fill_uniform(rng, -4, 4);
      w.fill_uniform(rng, 0.5, 1.5);
      std::vector<double> want(size_t(T * W));
      for (int64_t t = 0; t < T; ++t)
        for (int h = 0; h < heads; ++h) {
          auto y = ref_norm(&o.at(t, int64_t(h) * dv), w.t.ptr<float>(), dv, 1e-6, NormKind::plain);
          for (int i = 0; i < dv; ++i) want[size_t(t * W + h * dv + i)] = y[size_t(i)] * ref_silu(z.at(t, h * dv + i));
        }
      ops.gated_rmsnorm(o.t, z.t, w.t, out.t, heads, dv, 1e-6f);
      count_mismatch(out.host(), want, 1e-6, 3e-6, tag("gated_rmsnorm", {heads, dv}));
      EXPECT_EQ(out.guards_clobbered(), 0);
    }
  }
}

// ---- sequence ops -------------------------------------------------------------------------------------

// Softmax-weighted means of values in [-1, 1] over ≤ 200 keys, computed in fp32 with max subtraction:
// errors are a few ulp of O(1) numbers (≈1e-6); a leak across a sequence boundary, a wrong kv head or a
// missing max shift is O(1e-2) or NaN.
TEST(CpuOps, AttentionCausalGqaPackedMatchesReferenceAndSingleRuns) {
  CpuOps ops;
  std::mt19937 rng(9);
  struct Case { int hq, hkv, hd; std::vector<int> lens; };
  const Case cases[] = {{1, 1, 8, {1}},          {3, 3, 8, {3, 7}},   {6, 2, 24, {19, 1, 65}},
                        {5, 1, 32, {200}},       {8, 2, 32, {7, 65, 3}}, {3, 1, 24, {1, 1, 1}}};
  for (const Case& cs : cases) {
    auto pk = packed_make(cs.lens);
    const int64_t T = pk->seqs.tokens, QW = int64_t(cs.hq) * cs.hd, KW = int64_t(cs.hkv) * cs.hd;
    // q, k, v as column views of one fused projection, as the model uses them.
    Mat qkv(T, QW + 2 * KW);
    qkv.fill_uniform(rng, -1.5, 1.5);
    Tensor q = qkv.t.cols_view(0, QW), k = qkv.t.cols_view(QW, KW), v = qkv.t.cols_view(QW + KW, KW);
    Mat out(T, QW, 5, 2);
    const double scale = 1.0 / std::sqrt(double(cs.hd));
    std::vector<double> want(size_t(T * QW));
    const int group = cs.hq / cs.hkv;
    for (size_t s = 0; s + 1 < pk->cu.size(); ++s) {
      for (int64_t t = pk->cu[s]; t < pk->cu[s + 1]; ++t) {
        for (int h = 0; h < cs.hq; ++h) {
          const int kvh = h / group;
          std::vector<double> sc;
          double mx = -1e300;
          for (int64_t j = pk->cu[s]; j <= t; ++j) {
            double d = 0;
            for (int e = 0; e < cs.hd; ++e) d += double(qkv.at(t, h * cs.hd + e)) * qkv.at(j, QW + kvh * cs.hd + e);
            sc.push_back(d * scale);
            mx = std::max(mx, d * scale);
          }
          double sum = 0;
          for (double& x : sc) sum += (x = std::exp(x - mx));
          for (int e = 0; e < cs.hd; ++e) {
            double acc = 0;
            for (int64_t j = pk->cu[s]; j <= t; ++j)
              acc += sc[size_t(j - pk->cu[s])] * qkv.at(j, QW + KW + kvh * cs.hd + e);
            want[size_t(t * QW + h * cs.hd + e)] = acc / sum;
          }
        }
      }
    }
    ops.attention_causal(q, k, v, out.t, pk->seqs, cs.hq, cs.hkv, cs.hd, float(scale));
    const std::vector<float> packed = out.host();
    count_mismatch(packed, want, 2e-6, 1e-5, tag("attention", {cs.hq, cs.hkv, cs.hd, T}));
    EXPECT_EQ(out.guards_clobbered(), 0);
    // Each sequence alone must give bit-identical rows: nothing crosses a boundary.
    for (size_t s = 0; s + 1 < pk->cu.size(); ++s) {
      const int64_t t0 = pk->cu[s], n = pk->cu[s + 1] - t0;
      auto one = packed_make({int(n)});
      Mat o1(n, QW);
      ops.attention_causal(q.rows_view(t0, n), k.rows_view(t0, n), v.rows_view(t0, n), o1.t, one->seqs, cs.hq,
                           cs.hkv, cs.hd, float(scale));
      const std::vector<float> alone = o1.host();
      ASSERT_EQ(0, std::memcmp(alone.data(), &packed[size_t(t0 * QW)], alone.size() * 4)) << "sequence " << s;
    }
    // With a gate (strided, inside a wider buffer) the result must be exactly attention then sigmoid_gate.
    Mat gate(T, QW, 3, 2), gated(T, QW);
    gate.fill_uniform(rng, -4.0f, 4.0f);
    ops.attention_causal(q, k, v, gated.t, pk->seqs, cs.hq, cs.hkv, cs.hd, float(scale), &gate.t);
    ops.sigmoid_gate(out.t, gate.t);
    const std::vector<float> fused = gated.host(), separate = out.host();
    EXPECT_EQ(0, std::memcmp(fused.data(), separate.data(), fused.size() * 4)) << tag("gated", {cs.hq, cs.hd, T});
    EXPECT_NE(0, std::memcmp(fused.data(), packed.data(), fused.size() * 4)) << "the gate changed nothing";
  }
  auto pk = packed_make({2, 2});
  Mat q(4, 24), k(4, 16), out(4, 24);
  EXPECT_THROW(ops.attention_causal(q.t, k.t, k.t, out.t, pk->seqs, 3, 2, 8, 1.0f), Error);  // 3 % 2 != 0
  auto short_layout = packed_make({2, 1});
  Mat k2(4, 8);
  EXPECT_THROW(ops.attention_causal(q.t, k2.t, k2.t, out.t, short_layout->seqs, 3, 1, 8, 1.0f), Error);
  Mat narrow_gate(4, 23);
  ops.attention_causal(q.t, k2.t, k2.t, out.t, pk->seqs, 3, 1, 8, 1.0f);  // valid without the gate
  EXPECT_THROW(ops.attention_causal(q.t, k2.t, k2.t, out.t, pk->seqs, 3, 1, 8, 1.0f, &narrow_gate.t), Error);
}

// K ≤ 4 products then a silu, in fp32: a few ulp.
TEST(CpuOps, Conv1dSiluCausalPerSequence) {
  CpuOps ops;
  std::mt19937 rng(10);
  struct Case { int64_t C, K; std::vector<int> lens; };
  const Case cases[] = {{1, 4, {1}}, {3, 4, {3, 7}}, {24, 4, {19, 1, 65}}, {65, 1, {7, 2}}, {8, 6, {200, 3}}};
  for (const Case& cs : cases) {
    auto pk = packed_make(cs.lens);
    const int64_t T = pk->seqs.tokens;
    Mat x(T, cs.C, 3, 1), w(cs.C, cs.K), out(T, cs.C, 2, 2);
    x.fill_uniform(rng, -2, 2);
    w.fill_uniform(rng);
    std::vector<double> want(size_t(T * cs.C));
    for (size_t s = 0; s + 1 < pk->cu.size(); ++s)
      for (int64_t t = pk->cu[s]; t < pk->cu[s + 1]; ++t)
        for (int64_t c = 0; c < cs.C; ++c) {
          double acc = 0;
          for (int64_t j = 0; j < cs.K; ++j) {
            const int64_t src = t - cs.K + 1 + j;
            if (src >= pk->cu[s]) acc += double(w.at(c, j)) * x.at(src, c);
          }
          want[size_t(t * cs.C + c)] = ref_silu(acc);
        }
    ops.conv1d_silu(x.t, w.t, out.t, pk->seqs);
    count_mismatch(out.host(), want, 1e-6, 2e-6, tag("conv1d_silu", {cs.C, cs.K, T}));
    EXPECT_EQ(out.guards_clobbered(), 0);
  }
  auto pk = packed_make({3});
  Mat x(3, 4), w(4, 4);
  EXPECT_THROW(ops.conv1d_silu(x.t, w.t, x.t, pk->seqs), Error);  // in place is refused
}

// K = 0 leaves c = beta · c (an empty sum); BLAS must not reject the degenerate leading dimension.
TEST(CpuOps, GemmEmptyInnerDimension) {
  CpuOps ops;
  Mat a(3, 0), w(5, 0), c(3, 5);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 5; ++j) c.at(i, j) = float(i + j);
  ops.gemm(a.t, w.t, c.t, 2.0f);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(c.at(i, j), 2.0f * float(i + j));
}
