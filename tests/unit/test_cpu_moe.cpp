// The CPU mixture-of-experts ops (ops.h moe_route, moe_experts) against plain double-precision references on
// awkward shapes: odd expert counts, top-1 to top-8, one expert per token up to all of them, an expert no token
// picks, a shared expert with its sigmoid gate, and routing ties, which must follow torch.topk's order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/rng.h"
#include "core/torch_topk.h"
#include "ops/cpu/cpu_ops.h"

using namespace df;

namespace {

Tensor host(std::vector<float>& v, int64_t rows, int64_t cols) {
  v.resize(size_t(rows * cols));
  return Tensor{v.data(), DType::f32, Device::cpu, rows, cols, cols};
}

Tensor host_i32(std::vector<int32_t>& v, int64_t rows, int64_t cols) {
  v.resize(size_t(rows * cols));
  return Tensor{v.data(), DType::i32, Device::cpu, rows, cols, cols};
}

std::vector<float> normal(size_t n, uint64_t stream, float std) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std * rng_normal_at(17, stream, i);
  return v;
}

// Softmax over E logits in double, the top k by descending probability (no ties in these draws), renormalised.
void reference_route(const std::vector<float>& x, const std::vector<float>& router, int64_t T, int64_t H, int64_t E,
                     int64_t k, bool renorm, std::vector<int32_t>& ids, std::vector<double>& w) {
  ids.assign(size_t(T * k), 0);
  w.assign(size_t(T * k), 0.0);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> l(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e)
      for (int64_t i = 0; i < H; ++i) l[size_t(e)] += double(x[size_t(t * H + i)]) * router[size_t(e * H + i)];
    const double mx = *std::max_element(l.begin(), l.end());
    double sum = 0;
    for (double& v : l) sum += v = std::exp(v - mx);
    std::vector<int64_t> order(static_cast<size_t>(E));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return l[size_t(a)] > l[size_t(b)]; });
    double top = 0;
    for (int64_t j = 0; j < k; ++j) top += l[size_t(order[size_t(j)])] / sum;
    for (int64_t j = 0; j < k; ++j) {
      ids[size_t(t * k + j)] = int32_t(order[size_t(j)]);
      w[size_t(t * k + j)] = l[size_t(order[size_t(j)])] / sum / (renorm ? top : 1.0);
    }
  }
}

// One SwiGLU expert in double: down(silu(gate x) · up x), gate_up rows [gate I | up I] and down [H, I].
std::vector<double> reference_expert(const float* x, const float* gate_up, const float* down, int64_t H, int64_t I) {
  std::vector<double> a(static_cast<size_t>(I)), y(static_cast<size_t>(H));
  for (int64_t i = 0; i < I; ++i) {
    double g = 0, u = 0;
    for (int64_t c = 0; c < H; ++c) {
      g += double(x[c]) * gate_up[size_t(i * H + c)];
      u += double(x[c]) * gate_up[size_t((I + i) * H + c)];
    }
    a[size_t(i)] = g / (1.0 + std::exp(-g)) * u;
  }
  for (int64_t c = 0; c < H; ++c)
    for (int64_t i = 0; i < I; ++i) y[size_t(c)] += a[size_t(i)] * down[size_t(c * I + i)];
  return y;
}

struct Case {
  int64_t T, H, E, k, I, Is;
  bool renorm;
};

class CpuMoeTest : public ::testing::TestWithParam<Case> {};

TEST_P(CpuMoeTest, RouteAndExpertsMatchReference) {
  const Case p = GetParam();
  CpuOps ops;
  const MoeShape shape{int(p.E), int(p.k), int(p.I), int(p.Is), p.renorm};
  std::vector<float> xv = normal(size_t(p.T * p.H), 1, 1.0f), rv = normal(size_t(p.E * p.H), 2, 1.0f);
  std::vector<float> guv = normal(size_t(p.E * 2 * p.I * p.H), 3, 0.3f), dv = normal(size_t(p.E * p.H * p.I), 4, 0.3f);
  std::vector<float> sguv = normal(size_t(2 * p.Is * p.H), 5, 0.3f), sdv = normal(size_t(p.H * p.Is), 6, 0.3f);
  std::vector<float> sgv = normal(size_t(p.H), 7, 0.5f), outv = normal(size_t(p.T * p.H), 8, 1.0f);
  const std::vector<float> out0 = outv;
  std::vector<int32_t> idv;
  std::vector<float> wv;
  const Tensor x = host(xv, p.T, p.H), router = host(rv, p.E, p.H), ids = host_i32(idv, p.T, p.k),
               weights = host(wv, p.T, p.k), out = host(outv, p.T, p.H);
  MoeWeights w;
  w.gate_up = host(guv, p.E * 2 * p.I, p.H);
  w.down = host(dv, p.E * p.H, p.I);
  if (p.Is > 0) {
    w.shared_gate_up = host(sguv, 2 * p.Is, p.H);
    w.shared_down = host(sdv, p.H, p.Is);
    w.shared_gate = host(sgv, 1, p.H);
  }
  ops.moe_route(x, router, shape, ids, weights, Tensor{});
  std::vector<int32_t> want_ids;
  std::vector<double> want_w;
  reference_route(xv, rv, p.T, p.H, p.E, p.k, p.renorm, want_ids, want_w);
  EXPECT_EQ(idv, want_ids);
  for (size_t i = 0; i < wv.size(); ++i) EXPECT_NEAR(wv[i], want_w[i], 1e-6) << "slot " << i;

  ops.moe_experts(x, ids, weights, w, shape, out, Tensor{});
  double worst = 0;
  for (int64_t t = 0; t < p.T; ++t) {
    std::vector<double> want(size_t(p.H), 0.0);
    for (int64_t j = 0; j < p.k; ++j) {
      const int64_t e = want_ids[size_t(t * p.k + j)];
      const std::vector<double> y = reference_expert(&xv[size_t(t * p.H)], &guv[size_t(e * 2 * p.I * p.H)],
                                                     &dv[size_t(e * p.H * p.I)], p.H, p.I);
      for (int64_t c = 0; c < p.H; ++c) want[size_t(c)] += want_w[size_t(t * p.k + j)] * y[size_t(c)];
    }
    if (p.Is > 0) {
      double g = 0;
      for (int64_t c = 0; c < p.H; ++c) g += double(xv[size_t(t * p.H + c)]) * sgv[size_t(c)];
      const std::vector<double> y = reference_expert(&xv[size_t(t * p.H)], sguv.data(), sdv.data(), p.H, p.Is);
      for (int64_t c = 0; c < p.H; ++c) want[size_t(c)] += y[size_t(c)] / (1.0 + std::exp(-g));
    }
    for (int64_t c = 0; c < p.H; ++c) {
      const double got = outv[size_t(t * p.H + c)] - double(out0[size_t(t * p.H + c)]);
      worst = std::max(worst, std::abs(got - want[size_t(c)]) / (1.0 + std::abs(want[size_t(c)])));
    }
  }
  // fp32 sums of at most max(H, I) terms per GEMM and k + 1 expert outputs per token: ~1e-6 relative.
  EXPECT_LT(worst, 2e-5);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuMoeTest,
                         ::testing::Values(Case{1, 19, 1, 1, 7, 0, true},     // one expert, one token
                                           Case{7, 19, 5, 2, 7, 0, false},    // qwen3_moe-like, no renorm
                                           Case{33, 19, 9, 8, 5, 11, true},   // top-8 of 9 with a shared expert
                                           Case{40, 24, 7, 1, 13, 6, true},   // top-1 of 7
                                           Case{65, 16, 130, 2, 3, 4, true},  // k·64 <= E: torch's partial sort
                                           Case{3, 8, 5, 5, 4, 0, false}));   // every expert for every token

// FP8 experts (MoeShape::fp8): every expert GEMM's input, x and the SwiGLU output, routed and shared, is
// rounded to e4m3 per token (group 0) or per token per `group` columns (a partial last group where it does
// not divide), and the shared expert's gate reads x unrounded. The reference rounds the same float inputs
// with cpu_fp8_round and computes the rest in double, so it differs only where float and double SwiGLU
// outputs straddle an e4m3 rounding boundary, which these seeds do not hit; dropping any one rounding moves
// the result by ~1e-2.
TEST(CpuMoe, Fp8RoundsEveryExpertInput) {
  const int64_t T = 21, H = 19, E = 6, k = 3, I = 9, Is = 7;
  for (int group : {0, 4}) {
    SCOPED_TRACE("group " + std::to_string(group));
    CpuOps ops;
    MoeShape shape{int(E), int(k), int(I), int(Is), true, int(H), true, group};
    std::vector<float> xv = normal(size_t(T * H), 11, 1.0f), guv = normal(size_t(E * 2 * I * H), 12, 0.3f),
                       dv = normal(size_t(E * H * I), 13, 0.3f), sguv = normal(size_t(2 * Is * H), 14, 0.3f),
                       sdv = normal(size_t(H * Is), 15, 0.3f), sgv = normal(size_t(H), 16, 0.5f), outv, fp32v;
    std::vector<int32_t> idv(size_t(T * k));
    std::vector<float> wv(size_t(T * k));
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < k; ++j) {
        idv[size_t(t * k + j)] = int32_t((t + 2 * j) % E);
        wv[size_t(t * k + j)] = 0.2f + 0.1f * float(j);
      }
    MoeWeights w;
    w.gate_up = host(guv, E * 2 * I, H);
    w.down = host(dv, E * H, I);
    w.shared_gate_up = host(sguv, 2 * Is, H);
    w.shared_down = host(sdv, H, Is);
    w.shared_gate = host(sgv, 1, H);
    const Tensor x = host(xv, T, H), ids = host_i32(idv, T, k), weights = host(wv, T, k);
    const Tensor out = host(outv, T, H), fp32 = host(fp32v, T, H);
    std::fill(outv.begin(), outv.end(), 0.0f);
    std::fill(fp32v.begin(), fp32v.end(), 0.0f);
    ops.moe_experts(x, ids, weights, w, shape, out, Tensor{});
    MoeShape plain = shape;
    plain.fp8 = false;
    ops.moe_experts(x, ids, weights, w, plain, fp32, Tensor{});

    std::vector<float> xr = xv;
    cpu_fp8_round(xr.data(), T, H, H, group);
    // One expert on a rounded input row: the SwiGLU in double, rounded to float, then to e4m3 as the op does.
    auto expert = [&](const float* xrow, const float* gu, const float* down, int64_t width) {
      std::vector<float> a(static_cast<size_t>(width));
      for (int64_t i = 0; i < width; ++i) {
        double g = 0, u = 0;
        for (int64_t c = 0; c < H; ++c) {
          g += double(xrow[c]) * gu[size_t(i * H + c)];
          u += double(xrow[c]) * gu[size_t((width + i) * H + c)];
        }
        a[size_t(i)] = float(g / (1.0 + std::exp(-g)) * u);
      }
      cpu_fp8_round(a.data(), 1, width, width, group);
      std::vector<double> y(static_cast<size_t>(H));
      for (int64_t c = 0; c < H; ++c)
        for (int64_t i = 0; i < width; ++i)
          y[size_t(c)] += double(a[size_t(i)]) * down[size_t(c * width + i)];
      return y;
    };
    double worst = 0, moved = 0;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> want(size_t(H), 0.0);
      for (int64_t j = 0; j < k; ++j) {
        const int64_t e = idv[size_t(t * k + j)];
        const std::vector<double> y =
            expert(&xr[size_t(t * H)], &guv[size_t(e * 2 * I * H)], &dv[size_t(e * H * I)], I);
        for (int64_t c = 0; c < H; ++c) want[size_t(c)] += double(wv[size_t(t * k + j)]) * y[size_t(c)];
      }
      double g = 0;
      for (int64_t c = 0; c < H; ++c) g += double(xv[size_t(t * H + c)]) * sgv[size_t(c)];
      const std::vector<double> y = expert(&xr[size_t(t * H)], sguv.data(), sdv.data(), Is);
      for (int64_t c = 0; c < H; ++c) want[size_t(c)] += y[size_t(c)] / (1.0 + std::exp(-g));
      for (int64_t c = 0; c < H; ++c) {
        const size_t i = size_t(t * H + c);
        worst = std::max(worst, std::abs(outv[i] - want[size_t(c)]) / (1.0 + std::abs(want[size_t(c)])));
        moved = std::max(moved, std::abs(double(outv[i]) - fp32v[i]));
      }
    }
    EXPECT_LT(worst, 2e-5);
    EXPECT_GT(moved, 1e-3) << "FP8 rounding had no effect";
  }
}

// An expert that no token picks contributes nothing and costs nothing; a zero weight slot contributes nothing.
TEST(CpuMoe, UnpickedExpertIsSkipped) {
  CpuOps ops;
  const int64_t T = 4, H = 6, E = 3, k = 1, I = 5;
  const MoeShape shape{int(E), int(k), int(I), 0, true};
  std::vector<float> xv = normal(size_t(T * H), 1, 1.0f), guv = normal(size_t(E * 2 * I * H), 2, 0.5f),
                     dv = normal(size_t(E * H * I), 3, 0.5f), outv(size_t(T * H), 0.0f), wv(size_t(T * k), 1.0f);
  std::vector<int32_t> idv = {0, 2, 0, 2};  // expert 1 unpicked: NaN weights there must never be read
  for (int64_t r = 2 * I; r < 4 * I; ++r)
    for (int64_t c = 0; c < H; ++c) guv[size_t(r * H + c)] = std::nanf("");
  MoeWeights w;
  w.gate_up = host(guv, E * 2 * I, H);
  w.down = host(dv, E * H, I);
  ops.moe_experts(host(xv, T, H), host_i32(idv, T, k), host(wv, T, k), w, shape, host(outv, T, H), Tensor{});
  for (float v : outv) EXPECT_TRUE(std::isfinite(v));
  const std::vector<double> y = reference_expert(&xv[H], &guv[size_t(2 * 2 * I * H)], &dv[size_t(2 * H * I)], H, I);
  for (int64_t c = 0; c < H; ++c) EXPECT_NEAR(outv[size_t(H + c)], y[size_t(c)], 1e-5);
}

// Two experts with identical router rows tie on every token. A tie inside the top k keeps both with equal weights;
// a tie at the k-th place keeps exactly one of the pair, below the expert chosen first. Which one is torch.topk's
// choice (cpu_topk_torch_order); the golden case qwen3moe_tiny holds that against transformers.
TEST(CpuMoe, RoutingTies) {
  CpuOps ops;
  const int64_t T = 64, H = 12, E = 5, k = 2;
  std::vector<float> xv = normal(size_t(T * H), 1, 1.0f), rv = normal(size_t(E * H), 2, 1.0f);
  std::copy_n(&rv[size_t(1 * H)], H, &rv[size_t(3 * H)]);  // experts 1 and 3 always tie
  std::vector<int32_t> idv;
  std::vector<float> wv;
  const MoeShape shape{int(E), int(k), 4, 0, false};
  ops.moe_route(host(xv, T, H), host(rv, E, H), shape, host_i32(idv, T, k), host(wv, T, k), Tensor{});
  int inside = 0, boundary = 0;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* id = &idv[size_t(t * k)];
    const float* w = &wv[size_t(t * k)];
    const bool has1 = id[0] == 1 || id[1] == 1, has3 = id[0] == 3 || id[1] == 3;
    if (has1 && has3) {
      ++inside;
      EXPECT_EQ(w[0], w[1]) << "token " << t;
    } else if (has1 || has3) {
      ++boundary;
      EXPECT_TRUE(id[1] == 1 || id[1] == 3) << "token " << t << ": the tied expert must come second";
      EXPECT_GT(w[0], w[1]) << "token " << t;
    }
  }
  EXPECT_GT(inside, 0) << "the draw produced no tie inside the top k; change the seed";
  EXPECT_GT(boundary, 0) << "the draw produced no tie at the k-th place; change the seed";
}

// torch.topk's order on a few hand-made rows with ties: the k largest come first, descending, and a NaN counts as
// the largest value (aten TopKImpl.h); equal values stay a set whose order this test does not assume.
TEST(CpuMoe, TopkOrder) {
  auto run = [](std::vector<double> v, int64_t k) {
    std::vector<std::pair<double, int64_t>> q;
    for (size_t i = 0; i < v.size(); ++i) q.push_back({v[i], int64_t(i)});
    cpu_topk_torch_order(q, k);
    return std::vector<std::pair<double, int64_t>>(q.begin(), q.begin() + k);
  };
  auto top = run({0.1, 0.4, 0.2, 0.3, 0.0}, 3);
  EXPECT_EQ(top[0].second, 1);
  EXPECT_EQ(top[1].second, 3);
  EXPECT_EQ(top[2].second, 2);
  top = run({0.5, std::nan(""), 0.9}, 2);
  EXPECT_EQ(top[0].second, 1);
  EXPECT_EQ(top[1].second, 2);
  std::vector<double> many(200, 0.25);  // k·64 <= n: the partial-sort branch
  many[150] = 0.75;
  top = run(many, 2);
  EXPECT_EQ(top[0].second, 150);
  EXPECT_EQ(top[1].first, 0.25);
}

// core/torch_topk.h, the order the CUDA router computes, is libstdc++'s: on rows drawn from a few values
// (ties everywhere), with NaNs, at every n and k that choose between partial_sort, nth_element + insertion
// sort and nth_element + introsort (k − 1 > 16), it leaves the same k (value, index) pairs as
// cpu_topk_torch_order; and topk_unique, the router's shortcut for rows without a tie, gives that answer
// wherever it accepts a row.
TEST(CpuMoe, PortableTopkOrderIsTheStdlibs) {
  int64_t rows = 0, unique_rows = 0;
  for (int n : {1, 2, 3, 4, 5, 7, 9, 16, 17, 33, 64, 65, 128, 200, 256, 257, 512, 700})
    for (int k : {1, 2, 3, 8, 10, 17, 18, 40, 100, 256, 700}) {
      if (k > n) continue;
      for (int levels : {2, 5, 1000, 1 << 24}) {
        for (uint64_t draw = 0; draw < 4; ++draw) {
          std::vector<std::pair<double, int64_t>> want(static_cast<size_t>(n));
          std::vector<TopkPair> got(static_cast<size_t>(n));
          const uint64_t stream = uint64_t(n) * 1000003u + uint64_t(k) * 101u + uint64_t(levels) * 7u + draw;
          for (int i = 0; i < n; ++i) {
            const float u = rng_uniform_at(5, stream, uint64_t(i));
            float v = float(int(u * float(levels))) / float(levels);
            if (draw == 3 && i % 37 == 5) v = std::nanf("");
            want[size_t(i)] = {double(v), i};
            got[size_t(i)] = TopkPair{v, i};
          }
          std::vector<TopkPair> top(static_cast<size_t>(k + 1));
          const bool unique = k <= 16 && topk_unique(
                                             n, k, [&](int e) { return got[size_t(e)].v; }, top.data());
          cpu_topk_torch_order(want, k);
          topk_torch_order(got.data(), n, k);
          for (int j = 0; j < k; ++j) {
            ASSERT_EQ(got[size_t(j)].i, want[size_t(j)].second)
                << "n " << n << " k " << k << " levels " << levels << " draw " << draw << ": slot " << j;
            if (unique)
              ASSERT_EQ(top[size_t(j)].i, want[size_t(j)].second)
                  << "topk_unique, n " << n << " k " << k << " levels " << levels << ": slot " << j;
          }
          ++rows;
          unique_rows += unique;
        }
      }
    }
  EXPECT_GT(rows, 400);
  EXPECT_GT(unique_rows, 100);  // the rows of 2^24 levels, nearly all distinct: where the shortcut applies
  // topk_unique refuses exactly the rows whose top k is not one set in one order: a tie inside the k or at
  // the cut, or a NaN; a tie below the cut does not matter.
  auto unique = [](std::vector<float> v, int k) {
    std::vector<TopkPair> top(static_cast<size_t>(k + 1));
    return topk_unique(
        int(v.size()), k, [&](int e) { return v[size_t(e)]; }, top.data());
  };
  EXPECT_FALSE(unique({0.1f, 0.5f, 0.5f, 0.2f}, 1));
  EXPECT_FALSE(unique({0.1f, 0.5f, 0.5f, 0.2f}, 2));
  EXPECT_FALSE(unique({0.9f, 0.5f, 0.4f, 0.4f}, 3));
  EXPECT_TRUE(unique({0.9f, 0.3f, 0.3f}, 1));
  EXPECT_TRUE(unique({0.2f, 0.9f, 0.3f}, 3));
  EXPECT_FALSE(unique({0.2f, std::nanf(""), 0.3f}, 1));
}

TEST(CpuMoe, BadInputIsAnError) {
  CpuOps ops;
  std::vector<float> xv(12), rv(12), wv(2), gv(48), dv(48), ov(12);
  std::vector<int32_t> idv = {0, 9};
  MoeWeights w;
  w.gate_up = host(gv, 2 * 2 * 2, 3);  // E 2, I 2
  w.down = host(dv, 2 * 3, 2);
  const MoeShape shape{2, 1, 2, 0, true};
  EXPECT_THROW(ops.moe_route(host(xv, 4, 3), host(rv, 4, 3), MoeShape{4, 5, 2, 0, true}, host_i32(idv, 4, 5),
                             host(wv, 4, 5), Tensor{}),
               Error);  // top_k above the expert count
  EXPECT_THROW(ops.moe_experts(host(xv, 2, 3), host_i32(idv, 2, 1), host(wv, 2, 1), w, shape, host(ov, 2, 3),
                               Tensor{}),
               Error);  // expert id 9 of 2
}

}  // namespace
