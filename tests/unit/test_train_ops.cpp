// Op-level checks of CpuTrainOps, the oracle the CUDA training kernels will be compared against: GEMM in all
// transpose combinations on strided views, each backward op against central differences in its own inputs,
// the chunked lm_head loss against an explicit full-vocabulary computation, noise and reduction determinism.
#include <gtest/gtest.h>

#include <omp.h>

#include <cmath>
#include <functional>

#include "test_drafter_util.h"

using namespace df;
using namespace df::testing;

namespace {

Tensor view(std::vector<float>& x, int64_t r, int64_t c) { return tensor_make(x.data(), DType::f32, Device::cpu, r, c); }

// Central difference of a scalar function of x along every element, compared to the analytic gradient.
// The functions below sum O(100) fp32 terms of order 1 (rounding ~1e-5 absolute); h = 1e-2 makes the quotient
// error ~1e-3 and the truncation O(h²) ~1e-4 for these smooth ops: atol 3e-3 + rtol 1e-2 covers both, and a
// wrong term in a backward is off by O(0.1–1).
void check_grad(std::vector<float>& x, const std::vector<float>& analytic, const std::function<double()>& f,
                const char* what) {
  const double h = 1e-2;
  for (size_t i = 0; i < x.size(); ++i) {
    const float saved = x[i];
    x[i] = float(saved + h);
    const double lp = f();
    x[i] = float(saved - h);
    const double lm = f();
    x[i] = saved;
    const double fd = (lp - lm) / (2 * h);
    ASSERT_FALSE(std::isnan(analytic[i])) << what << " element " << i;
    ASSERT_LE(std::fabs(fd - analytic[i]), 3e-3 + 1e-2 * std::fabs(fd))
        << what << " element " << i << ": fd " << fd << " analytic " << analytic[i];
  }
}

double weighted_sum(const std::vector<float>& y, const std::vector<float>& r) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += double(y[i]) * r[i];
  return s;
}

}  // namespace

TEST(TrainOps, GemmAllTransposesOnStridedViews) {
  CpuTrainOps ops;
  const int64_t M = 7, N = 19, K = 3;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      // Operands live in wider buffers (row stride 65) so the strided path is exercised.
      auto abuf = normal_vec(65 * 19, 1.0f, 1), bbuf = normal_vec(65 * 19, 1.0f, 2), cbuf = normal_vec(65 * 7, 1.0f, 3);
      Tensor a = view(abuf, ta ? K : M, 65).cols_view(1, ta ? M : K);
      Tensor b = view(bbuf, tb ? N : K, 65).cols_view(2, tb ? K : N);
      Tensor c = view(cbuf, M, 65).cols_view(3, N);
      std::vector<double> want(size_t(M * N));
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double acc = 0;
          for (int64_t p = 0; p < K; ++p) {
            const float av = ta ? a.ptr<float>()[p * 65 + i] : a.ptr<float>()[i * 65 + p];
            const float bv = tb ? b.ptr<float>()[j * 65 + p] : b.ptr<float>()[p * 65 + j];
            acc += double(av) * bv;
          }
          want[size_t(i * N + j)] = 0.5 * acc + 2.0 * c.ptr<float>()[i * 65 + j];
        }
      ops.gemm(a, ta, b, tb, c, 0.5f, 2.0f);
      // K = 3 products of N(0,1) values in fp32: rounding ~1e-6 relative; 1e-5 leaves margin.
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j)
          ASSERT_NEAR(c.ptr<float>()[i * 65 + j], want[size_t(i * N + j)], 1e-5 + 1e-5 * std::fabs(want[size_t(i * N + j)]))
              << "trans_a " << ta << " trans_b " << tb;
      EXPECT_EQ(cbuf[0], normal_vec(65 * 7, 1.0f, 3)[0]);  // the column before the view is untouched
    }
}

// gemm_add with c_in apart from out (other strides, other buffer): the bits of copy(c_in, out) then gemm;
// c_in is left as it was and out's old contents do not matter. c_in being out is gemm itself; c_in
// overlapping out without being it is refused.
TEST(TrainOps, GemmAddIsCopyThenGemm) {
  CpuTrainOps ops;
  const int64_t M = 7, N = 19, K = 5;
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb)
      for (float beta : {1.0f, 0.75f, 0.0f}) {
        auto abuf = normal_vec(65 * 19, 1.0f, 1), bbuf = normal_vec(65 * 19, 1.0f, 2);
        auto cin_buf = normal_vec(40 * 7, 1.0f, 3), out_buf = normal_vec(65 * 7, 1.0f, 4), ref_buf = out_buf;
        Tensor a = view(abuf, ta ? K : M, 65).cols_view(1, ta ? M : K);
        Tensor b = view(bbuf, tb ? N : K, 65).cols_view(2, tb ? K : N);
        Tensor c_in = view(cin_buf, M, 40).cols_view(5, N);
        Tensor out = view(out_buf, M, 65).cols_view(3, N), ref = view(ref_buf, M, 65).cols_view(3, N);
        const std::vector<float> cin_before = cin_buf;
        ops.gemm_add(a, ta, b, tb, c_in, out, -0.5f, beta);
        ops.copy(c_in, ref);
        ops.gemm(a, ta, b, tb, ref, -0.5f, beta);
        EXPECT_EQ(out_buf, ref_buf) << "trans_a " << ta << " trans_b " << tb << " beta " << beta;
        EXPECT_EQ(cin_buf, cin_before) << "c_in changed";
      }
  auto abuf = normal_vec(7 * 5, 1.0f, 1), bbuf = normal_vec(5 * 19, 1.0f, 2),
       cbuf = normal_vec(8 * 19, 1.0f, 3);
  auto ref_buf = cbuf;
  Tensor a = view(abuf, 7, 5), b = view(bbuf, 5, 19), c = view(cbuf, 8, 19).rows_view(0, 7);
  ops.gemm_add(a, false, b, false, c, c, 1.0f, 1.0f);
  ops.gemm(a, false, b, false, view(ref_buf, 8, 19).rows_view(0, 7), 1.0f, 1.0f);
  EXPECT_EQ(cbuf, ref_buf) << "c_in is out: gemm in place";
  EXPECT_THROW(ops.gemm_add(a, false, b, false, view(cbuf, 8, 19).rows_view(1, 7), c, 1.0f, 1.0f), Error)
      << "c_in one row below out overlaps it";
}

// The GEMM of an empty row range (K = 0, e.g. dW of a micro-batch without context rows) is c = beta·c: beta 0
// writes zeros over whatever c held (NaN here), beta 1 leaves c alone.
TEST(TrainOps, GemmWithEmptyInnerDimensionScalesC) {
  CpuTrainOps ops;
  const int64_t M = 5, N = 7;
  std::vector<float> a(1), b(1);
  for (int ta = 0; ta < 2; ++ta) {
    Tensor at = ta ? view(a, 0, M) : view(a, M, 0), bt = view(b, 0, N);
    std::vector<float> c(size_t(M * N), std::nanf(""));
    ops.gemm(at, ta, bt, false, view(c, M, N), 1.0f, 0.0f);
    for (float v : c) ASSERT_EQ(v, 0.0f) << "trans_a " << ta;
    std::vector<float> kept = normal_vec(M * N, 1.0f, 4), c1 = kept;
    ops.gemm(at, ta, bt, false, view(c1, M, N), 1.0f, 1.0f);
    EXPECT_EQ(c1, kept) << "trans_a " << ta;
  }
}

// beta_dw of the norm backwards: 0 writes ∂/∂w without reading dw (NaN here), 1 adds. The same ∂/∂w twice
// (write, then add) is exactly twice the first, since x + x is exact in fp32.
TEST(TrainOps, NormBackwardsWriteOrAddTheWeightGradient) {
  CpuTrainOps ops;
  const int64_t R = 4, heads = 2, hd = 8, C = heads * hd;
  auto x = normal_vec(R * C, 1.0f, 1), w = normal_vec(C, 0.5f, 2), dy = normal_vec(R * C, 1.0f, 3);
  std::vector<float> y(R * C), rstd(R * heads), dx(R * C);
  std::vector<int32_t> pos = {0, 3, 9, 40};
  Tensor pt = tensor_make(pos.data(), DType::i32, Device::cpu, 1, R);
  for (int which = 0; which < 2; ++which) {
    const int64_t n = which == 0 ? C : hd;
    std::vector<float> dw(size_t(n), std::nanf(""));
    auto bwd = [&](float beta_dw) {
      if (which == 0)
        ops.rmsnorm_bwd(view(x, R, C), view(w, 1, C), view(rstd, 1, R), view(dy, R, C), view(dx, R, C),
                        view(dw, 1, n), 0.0f, beta_dw);
      else
        ops.qk_norm_rope_bwd(view(x, R, C), view(w, 1, hd), pt, view(rstd, R, heads), view(dy, R, C),
                             view(dx, R, C), view(dw, 1, n), heads, hd, 1e4f, beta_dw);
    };
    if (which == 0)
      ops.rmsnorm_fwd(view(x, R, C), view(w, 1, C), view(y, R, C), view(rstd, 1, R), 1e-6f);
    else
      ops.qk_norm_rope_fwd(view(x, R, C), view(w, 1, hd), pt, view(y, R, C), view(rstd, R, heads), heads, hd,
                           1e4f, 1e-6f);
    bwd(0.0f);
    const std::vector<float> once = dw;
    for (float v : once) ASSERT_TRUE(std::isfinite(v)) << (which == 0 ? "rmsnorm_bwd" : "qk_norm_rope_bwd");
    bwd(1.0f);
    for (size_t i = 0; i < dw.size(); ++i) ASSERT_EQ(dw[i], 2.0f * once[i]) << "element " << i;
    // No rows: ∂/∂w is 0, so beta_dw 0 still writes zeros.
    std::fill(dw.begin(), dw.end(), std::nanf(""));
    if (which == 0)
      ops.rmsnorm_bwd(view(x, 0, C), view(w, 1, C), view(rstd, 1, 0), view(dy, 0, C), view(dx, 0, C),
                      view(dw, 1, n), 0.0f, 0.0f);
    else
      ops.qk_norm_rope_bwd(view(x, 0, C), view(w, 1, hd),
                           tensor_make(pos.data(), DType::i32, Device::cpu, 1, 0), view(rstd, 0, heads),
                           view(dy, 0, C), view(dx, 0, C), view(dw, 1, n), heads, hd, 1e4f, 0.0f);
    for (float v : dw)
      ASSERT_EQ(v, 0.0f) << (which == 0 ? "rmsnorm_bwd" : "qk_norm_rope_bwd") << " with no rows";
  }
}

TEST(TrainOps, RmsnormBackward) {
  CpuTrainOps ops;
  const int64_t R = 3, C = 19;
  auto x = normal_vec(R * C, 1.0f, 1), w = normal_vec(C, 0.5f, 2), r = normal_vec(R * C, 1.0f, 3);
  for (auto& v : w) v += 1.0f;
  // dw starts as NaN: beta_dw 0 (a step's first write) must not read it.
  std::vector<float> y(R * C), rstd(R), dx(R * C, 7.0f), dw(C, std::nanf(""));
  auto f = [&] {
    ops.rmsnorm_fwd(view(x, R, C), view(w, 1, C), view(y, R, C), view(rstd, 1, R), 1e-6f);
    return weighted_sum(y, r);
  };
  f();
  ops.rmsnorm_bwd(view(x, R, C), view(w, 1, C), view(rstd, 1, R), view(r, R, C), view(dx, R, C),
                  view(dw, 1, C), 0.0f, 0.0f);
  check_grad(x, dx, f, "rmsnorm dx");
  check_grad(w, dw, f, "rmsnorm dw");
}

TEST(TrainOps, QkNormRopeBackward) {
  CpuTrainOps ops;
  const int64_t R = 3, heads = 2, hd = 8, C = heads * hd;
  auto x = normal_vec(R * C, 1.0f, 1), w = normal_vec(hd, 0.3f, 2), r = normal_vec(R * C, 1.0f, 3);
  for (auto& v : w) v += 1.0f;
  std::vector<int32_t> pos = {0, 7, 65};
  Tensor pt = tensor_make(pos.data(), DType::i32, Device::cpu, 1, R);
  std::vector<float> y(R * C), rstd(R * heads), dx(R * C),
      dw(hd, std::nanf(""));  // beta_dw 0 must not read it
  auto f = [&] {
    ops.qk_norm_rope_fwd(view(x, R, C), view(w, 1, hd), pt, view(y, R, C), view(rstd, R, heads), heads, hd, 1e4f, 1e-6f);
    return weighted_sum(y, r);
  };
  f();
  ops.qk_norm_rope_bwd(view(x, R, C), view(w, 1, hd), pt, view(rstd, R, heads), view(r, R, C), view(dx, R, C),
                       view(dw, 1, hd), heads, hd, 1e4f, 0.0f);
  check_grad(x, dx, f, "qk_norm_rope dx");
  check_grad(w, dw, f, "qk_norm_rope dw");
}

TEST(TrainOps, SwigluBackward) {
  CpuTrainOps ops;
  const int64_t R = 3, C = 7;
  auto g = normal_vec(R * C, 2.0f, 1), u = normal_vec(R * C, 1.0f, 2), r = normal_vec(R * C, 1.0f, 3);
  std::vector<float> o(R * C), dg(R * C), du(R * C);
  auto f = [&] {
    ops.swiglu_fwd(view(g, R, C), view(u, R, C), view(o, R, C));
    return weighted_sum(o, r);
  };
  ops.swiglu_bwd(view(g, R, C), view(u, R, C), view(r, R, C), view(dg, R, C), view(du, R, C));
  check_grad(g, dg, f, "swiglu dgate");
  check_grad(u, du, f, "swiglu dup");
}

TEST(TrainOps, DflashAttentionBackwardBothLayerKinds) {
  CpuTrainOps ops;
  const int B = 3, hq = 2, hkv = 1, hd = 4;
  const int64_t T = 7, nb = 3, N = nb * B;
  std::vector<int32_t> blk = {0, 4, 0, -1, 4, 2};  // sequences [0, 4) and [4, 7); one padding block
  Tensor bt = tensor_make(blk.data(), DType::i32, Device::cpu, nb, 2);
  for (int window : {0, 3}) {
    auto q = normal_vec(N * hq * hd, 1.0f, 1), k = normal_vec((T + N) * hkv * hd, 1.0f, 2),
         v = normal_vec((T + N) * hkv * hd, 1.0f, 3), r = normal_vec(N * hq * hd, 1.0f, 4);
    std::vector<float> o(q.size()), lse(N * hq), dq(q.size()), dk(k.size()), dv(v.size());
    DFlashAttnShape s{hq, hkv, hd, B, window, 0.5f};
    auto f = [&] {
      ops.dflash_attention_fwd(view(q, N, hq * hd), view(k, T + N, hkv * hd), view(v, T + N, hkv * hd), bt,
                               view(o, N, hq * hd), view(lse, N, hq), s);
      return weighted_sum(o, r);
    };
    f();
    ops.dflash_attention_bwd(view(q, N, hq * hd), view(k, T + N, hkv * hd), view(v, T + N, hkv * hd), bt,
                             view(o, N, hq * hd), view(lse, N, hq), view(r, N, hq * hd), view(dq, N, hq * hd),
                             view(dk, T + N, hkv * hd), view(dv, T + N, hkv * hd), s);
    check_grad(q, dq, f, window ? "sliding dq" : "full dq");
    check_grad(k, dk, f, window ? "sliding dk" : "full dk");
    check_grad(v, dv, f, window ? "sliding dv" : "full dv");
  }
}

TEST(TrainOps, LmHeadLossMatchesFullVocabularyAndIgnoresChunking) {
  const int64_t R = 7, H = 5, V = 65;
  auto hid = normal_vec(R * H, 1.0f, 1), tgt = normal_vec(R * H, 1.0f, 2), W = normal_vec(V * H, 1.0f, 3);
  std::vector<int32_t> labels = {3, 64, 0, 17, 5, 9, 1};
  std::vector<uint8_t> active = {1, 1, 0, 1, 1, 1, 1};
  Tensor lt = tensor_make(labels.data(), DType::i32, Device::cpu, 1, R);
  Tensor at = tensor_make(active.data(), DType::u8, Device::cpu, 1, R);
  for (LmLossKind kind : {LmLossKind::ce, LmLossKind::kl}) {
    std::vector<std::vector<float>> dh_by_chunk;
    for (int chunk : {1, 3, 64, 3}) {
      CpuTrainOps ops(chunk);
      std::vector<float> loss(R), pl(R), dh(R * H);
      std::vector<int32_t> am(R);
      ops.lm_head_loss(view(hid, R, H), view(W, V, H), lt, at, view(tgt, R, H), kind, view(loss, 1, R), view(pl, 1, R),
                       tensor_make(am.data(), DType::i32, Device::cpu, 1, R), view(dh, R, H));
      for (int64_t r = 0; r < R; ++r) {
        if (!active[size_t(r)]) {
          EXPECT_EQ(loss[size_t(r)], 0.0f);
          EXPECT_EQ(am[size_t(r)], -1);
          continue;
        }
        std::vector<double> z(V), y(V);
        for (int64_t t = 0; t < V; ++t)
          for (int64_t c = 0; c < H; ++c) {
            z[size_t(t)] += double(hid[size_t(r * H + c)]) * W[size_t(t * H + c)];
            y[size_t(t)] += double(tgt[size_t(r * H + c)]) * W[size_t(t * H + c)];
          }
        double zs = 0, ys = 0;
        for (int64_t t = 0; t < V; ++t) {
          zs += std::exp(z[size_t(t)]);
          ys += std::exp(y[size_t(t)]);
        }
        double want = std::log(zs) - z[size_t(labels[size_t(r)])];
        if (kind == LmLossKind::kl) {
          want = 0;
          for (int64_t t = 0; t < V; ++t) {
            const double pt = std::exp(y[size_t(t)]) / ys;
            want += pt * (std::log(pt) - (z[size_t(t)] - std::log(zs)));
          }
        }
        // Logits of order 3 summed over 65 terms in fp32 vs double: ~1e-5 absolute.
        EXPECT_NEAR(loss[size_t(r)], want, 1e-4) << "row " << r;
        EXPECT_NEAR(pl[size_t(r)], std::exp(z[size_t(labels[size_t(r)])]) / zs, 1e-5);
        EXPECT_EQ(am[size_t(r)], int32_t(std::max_element(z.begin(), z.end()) - z.begin()));
      }
      dh_by_chunk.push_back(dh);
    }
    // The same chunk size gives the same bits (train_ops.h, Determinism).
    EXPECT_EQ(dh_by_chunk[1], dh_by_chunk[3]);
    // Another chunk size changes only the GEMMs' M, which may change OpenBLAS's kernel (AVX-512 hosts take
    // small-matrix kernels that sum in another order): the row's values agree to float rounding. dhidden is
    // Σ_t ∂L/∂z_t · W_t over 65 terms of O(1) with logits that are 5-term fp32 dots, so reassociation moves it
    // by a few ulp of its terms, ~1e-6; a row computed wrongly (another row's logits, a lost chunk) is off by O(1).
    float scale = 0;
    for (float x : dh_by_chunk[0]) scale = std::max(scale, std::fabs(x));
    for (size_t c = 1; c < 3; ++c)
      for (size_t i = 0; i < dh_by_chunk[0].size(); ++i)
        EXPECT_NEAR(dh_by_chunk[c][i], dh_by_chunk[0][i], 1e-5f * scale) << "element " << i << ", chunking " << c;
  }
}

TEST(TrainOps, NoiseIsDeterministicAndStandardNormal) {
  CpuTrainOps ops;
  std::vector<float> a(65 * 733, 0.0f), b(a.size(), 0.0f);
  ops.add_gaussian_noise(view(a, 65, 733), 2.0f, 42);
  ops.add_gaussian_noise(view(b, 65, 733), 2.0f, 42);
  EXPECT_EQ(a, b);
  double s = 0, ss = 0;
  for (float x : a) {
    s += x;
    ss += double(x) * x;
  }
  const double n = double(a.size()), mean = s / n, sd = std::sqrt(ss / n - mean * mean);
  // 47645 draws: the sample mean's std is 2/√n ≈ 0.009, the sample std's ≈ 0.0065; 5σ bounds.
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(sd, 2.0, 0.035);
  EXPECT_EQ(a[17], 2.0f * cpu_noise_normal(42, 17));
}

// Every reduction runs in a fixed order, so one thread and two threads give the same bits for a whole step.
// Sizes are chosen so the activations of every op pass the parallel threshold (32k elements).
TEST(TrainOps, StepIsIndependentOfTheThreadCount) {
  DrafterConfig c = tiny_drafter_config();
  c.hidden = 64;
  c.intermediate = 128;
  c.head_dim = 16;
  std::vector<std::vector<float>> grads;
  std::vector<double> losses;
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    CpuTrainOps ops;
    DrafterModel m(c, ops);
    drafter_init_params(m, 3);
    auto embed = normal_vec(size_t(c.vocab * c.hidden), 1.0f, 4), lm = normal_vec(size_t(c.vocab * c.hidden), 0.3f, 5);
    m.set_frozen(view(embed, c.vocab, c.hidden), view(lm, c.vocab, c.hidden));
    plan_workspace(m, 733, 2 * 80);
    DrafterBatch b;
    b.offsets = {0, 400, 733};
    Rng r(6);
    for (int t = 0; t < 733; ++t) {
      b.tokens.push_back(int32_t(r.below(36)));
      b.loss_mask.push_back(1);
    }
    auto taps = normal_vec(733 * size_t(c.hidden * c.num_taps()), 1.0f, 7);
    b.taps = view(taps, 733, c.hidden * c.num_taps());
    Rng ar(8);
    losses.push_back(drafter_forward_backward(m, b, anchors_sample_batch(b, 80, ar), {}).loss_sum);
    grads.emplace_back(m.grads.ptr<float>(), m.grads.ptr<float>() + m.table().total);
  }
  omp_set_num_threads(2);
  EXPECT_EQ(losses[0], losses[1]);
  EXPECT_EQ(grads[0], grads[1]);
}
