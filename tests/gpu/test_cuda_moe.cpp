// The CUDA mixture-of-experts ops (kernels/moe/moe.cu) against the CPU fp32 oracle (ops/cpu/cpu_moe.cpp) on
// awkward shapes: top-1 and top-8, odd expert counts, an expert no token picks, all tokens on one expert, a
// routing tie, a shared expert, widths that are no multiple of 8 (the scalar paths), and enough tokens per
// expert for several grouped-GEMM tiles each. Shares the fixture of test_cuda_ops.cpp. Skips itself without a
// GPU or a CUDA build.
#include <gtest/gtest.h>

#ifndef DF_HAVE_CUDA
TEST(CudaMoeTest, SkippedWithoutCudaBuild) {
  GTEST_SKIP() << "built without CUDA: GPU MoE tests skipped";
}
#else
#include <cmath>
#include <numeric>

#include "kernels/moe/moe.cuh"
#include "tests/gpu/cuda_ops_test_util.h"

namespace {

struct MoeCase {
  int64_t T, H;
  int E, k, I, Is;
  bool renorm;
};

// The experts' weights on both backends: gate_up and down scaled so each expert's output is O(1).
struct MoePair {
  MoeWeights cpu, gpu;
};

class CudaMoeTest : public CudaOpsTest {
 protected:
  MoePair weights(const MoeCase& c) {
    const float su = 1.0f / std::sqrt(float(c.H)), sd = 1.0f / std::sqrt(float(c.I)),
                ss = c.Is > 0 ? 1.0f / std::sqrt(float(c.Is)) : 0.0f;
    MoePair w;
    Pair gu = rand(int64_t(c.E) * 2 * c.I, c.H, -2 * su, 2 * su),
         dn = rand(int64_t(c.E) * c.H, c.I, -2 * sd, 2 * sd);
    w.cpu.gate_up = gu.cpu, w.gpu.gate_up = gu.gpu, w.cpu.down = dn.cpu, w.gpu.down = dn.gpu;
    if (c.Is > 0) {
      Pair sgu = rand(2 * int64_t(c.Is), c.H, -2 * su, 2 * su), sdn = rand(c.H, c.Is, -2 * ss, 2 * ss),
           sg = rand(1, c.H, -2 * su, 2 * su);
      w.cpu.shared_gate_up = sgu.cpu, w.gpu.shared_gate_up = sgu.gpu;
      w.cpu.shared_down = sdn.cpu, w.gpu.shared_down = sdn.gpu;
      w.cpu.shared_gate = sg.cpu, w.gpu.shared_gate = sg.gpu;
    }
    return w;
  }
  Tensor workspace(int64_t T, const MoeShape& s) {
    return gpu_arena_.alloc(DType::u8, 1, gpu_->moe_workspace_bytes(T, s));
  }
  std::vector<int32_t> ids_of(const Tensor& ids) {
    std::vector<int32_t> v(size_t(ids.numel()));
    gpu_->download_raw(ids, v.data());
    return v;
  }
  // The softmax probabilities of x · routerᵀ in double from the host copies: where the two backends' top-k
  // differ, the experts swapped must be a near tie of these (their logits' fp32 sums run in different
  // orders).
  std::vector<double> probs(const std::vector<double>& x, const std::vector<double>& r, int64_t T, int64_t H,
                            int E) {
    std::vector<double> p(size_t(T * E));
    for (int64_t t = 0; t < T; ++t) {
      double mx = -1e300, sum = 0;
      for (int e = 0; e < E; ++e) {
        double l = 0;
        for (int64_t h = 0; h < H; ++h) l += x[size_t(t * H + h)] * r[size_t(e * H + h)];
        p[size_t(t * E + e)] = l;
        mx = std::max(mx, l);
      }
      for (int e = 0; e < E; ++e) sum += p[size_t(t * E + e)] = std::exp(p[size_t(t * E + e)] - mx);
      for (int e = 0; e < E; ++e) p[size_t(t * E + e)] /= sum;
    }
    return p;
  }

  // moe_route on both backends into ids and w (.cpu the oracle's routing, .gpu the GPU's): ids equal up to
  // near ties, weights within fp32 rounding.
  void route(const MoeCase& c, const Pair& x, const Pair& router, const MoeShape& s, const Tensor& ws,
             Pair& ids, Pair& w) {
    ids.cpu = cpu_arena_.alloc(DType::i32, c.T, c.k);
    ids.gpu = gpu_arena_.alloc(DType::i32, c.T, c.k);
    w = out(c.T, c.k, DType::f32);
    poison(ids.gpu.data, size_t(c.T * c.k) * 4);
    cpu_.moe_route(x.cpu, router.cpu, s, ids.cpu, w.cpu, Tensor{});
    gpu_->moe_route(x.gpu, router.gpu, s, ids.gpu, w.gpu, ws);
    const std::vector<int32_t> got = ids_of(ids.gpu);
    const int32_t* want = static_cast<const int32_t*>(ids.cpu.data);
    const std::vector<double> p = probs(down_cpu(x.cpu), down_cpu(router.cpu), c.T, c.H, c.E);
    const std::vector<float> gw = down_gpu(w.gpu);
    const std::vector<double> cw = down_cpu(w.cpu);
    int64_t near_ties = 0;
    for (int64_t t = 0; t < c.T; ++t)
      for (int j = 0; j < c.k; ++j) {
        const size_t i = size_t(t * c.k + j);
        if (got[i] == want[i]) {
          EXPECT_NEAR(gw[i], cw[i], 1e-5 + 1e-4 * std::fabs(cw[i])) << "token " << t << " slot " << j;
          continue;
        }
        ASSERT_TRUE(got[i] >= 0 && got[i] < c.E) << "token " << t << " slot " << j << ": expert " << got[i];
        const double gap = std::fabs(p[size_t(t * c.E + got[i])] - p[size_t(t * c.E + want[i])]);
        EXPECT_LT(gap, 1e-5) << "token " << t << " slot " << j << ": GPU picked expert " << got[i] << ", CPU "
                             << want[i] << ", probabilities " << gap << " apart: not a near tie";
        ++near_ties;
      }
    std::printf("[ moe    ] route T %lld E %d k %d: %lld slots differ at near ties\n", (long long)c.T, c.E,
                c.k, (long long)near_ties);
  }

  // moe_experts on both backends from the same (the GPU's) routing, added to the same random residual.
  void experts(const MoeCase& c, const Pair& x, const MoePair& mw, const MoeShape& s, const Tensor& ids_gpu,
               const Tensor& w_gpu, const Tensor& ws, const std::string& what) {
    Tensor ids_cpu = cpu_arena_.alloc(DType::i32, c.T, c.k), w_cpu = cpu_arena_.alloc(DType::f32, c.T, c.k);
    std::vector<int32_t> iv = ids_of(ids_gpu);
    std::copy(iv.begin(), iv.end(), static_cast<int32_t*>(ids_cpu.data));
    std::vector<float> wv = down_gpu(w_gpu);
    cpu_.upload_f32(w_cpu, wv.data());
    Pair o = rand(c.T, c.H, -1, 1);
    const std::vector<double> residual = down_cpu(o.cpu);
    cpu_.moe_experts(x.cpu, ids_cpu, w_cpu, mw.cpu, s, o.cpu, Tensor{});
    gpu_->moe_experts(x.gpu, ids_gpu, w_gpu, mw.gpu, s, o.gpu, ws);
    // The tolerance scales with what the experts added, S = max |Δout|: the GPU rounds gate | up, the SwiGLU
    // and each expert's output to bf16 where the CPU keeps fp32 (three relative 2^-9 errors of terms whose
    // weighted sum is S up to cancellation, so 4 · 2^-8 · S), and the residual sum once more (2^-8 relative).
    const std::vector<double> want = down_cpu(o.cpu);
    double S = 0;
    for (size_t i = 0; i < want.size(); ++i) S = std::max(S, std::fabs(want[i] - residual[i]));
    EXPECT_GT(S, 0.05) << what << ": the experts added almost nothing; the case checks little";
    check(o, 4 * kBf16Ulp * S, kBf16Ulp, what);
  }

  void run_case(const MoeCase& c) {
    ArenaMarks marks(cpu_arena_, gpu_arena_);
    const MoeShape s{c.E, c.k, c.I, c.Is, c.renorm, int(c.H)};
    Pair x = rand(c.T, c.H, -1, 1), router = rand(c.E, c.H, -1, 1);
    const MoePair mw = weights(c);
    const Tensor ws = workspace(c.T, s);
    Pair ids, w;
    route(c, x, router, s, ws, ids, w);
    experts(c, x, mw, s, ids.gpu, w.gpu, ws, name_of("moe T H E k I Is", {c.T, c.H, c.E, c.k, c.I, c.Is}));
  }
};

TEST_F(CudaMoeTest, RouteAndExpertsMatchCpu) {
  for (const MoeCase& c :
       {MoeCase{37, 48, 5, 2, 24, 0, false},     // qwen3moe_tiny's layer
        MoeCase{129, 32, 7, 1, 16, 0, true},     // top-1 of 7
        MoeCase{50, 40, 9, 8, 20, 24, true},     // top-8 of 9, a shared expert
        MoeCase{1, 64, 13, 3, 32, 16, true},     // one token (a decode step)
        MoeCase{33, 20, 11, 4, 12, 12, false},   // widths no multiple of 8: scalar paths
        MoeCase{700, 128, 64, 8, 64, 64, true},  // 87 pairs per expert: 32-row tiles
        MoeCase{2100, 64, 16, 8, 32, 0, true}})  // 1050 per expert: 128-row tiles, 17 chunks
    run_case(c);
}

// An expert whose router row is far below the others is never picked: its tiles do not exist and nothing of
// it reaches the output.
TEST_F(CudaMoeTest, UnpickedExpert) {
  ArenaMarks marks(cpu_arena_, gpu_arena_);
  const MoeCase c{300, 32, 7, 1, 16, 0, true};
  const MoeShape s{c.E, c.k, c.I, c.Is, c.renorm, int(c.H)};
  Pair x = rand(c.T, c.H, 0.1f, 1);  // positive rows, so a negative router row loses on every token
  std::vector<float> r(size_t(c.E * c.H));
  std::uniform_real_distribution<float> d(-0.5f, 0.5f);
  for (float& v : r) v = bf16_round(d(rng_));
  for (int64_t h = 0; h < c.H; ++h) r[size_t(6 * c.H + h)] = -8.0f;
  Pair router = out(c.E, c.H);
  cpu_.upload_f32(router.cpu, r.data());
  gpu_->upload_f32(router.gpu, r.data());
  const MoePair mw = weights(c);
  const Tensor ws = workspace(c.T, s);
  Pair ids, w;
  route(c, x, router, s, ws, ids, w);
  for (int32_t e : ids_of(ids.gpu)) EXPECT_NE(e, 6);
  experts(c, x, mw, s, ids.gpu, w.gpu, ws, "moe unpicked expert 6");
}

// Every token on expert 2 (plus, for k = 3, experts 0 and 4): one expert holds all T pairs, the others none;
// then the same ids with a duplicate inside each token (slots 0 and 1 both expert 2), which the counting sort
// must place in slot order.
TEST_F(CudaMoeTest, AllTokensOnOneExpert) {
  for (int k : {1, 3})
    for (bool duplicate : {false, true}) {
      if (duplicate && k == 1) continue;
      ArenaMarks marks(cpu_arena_, gpu_arena_);
      const MoeCase c{517, 40, 5, k, 24, 8, false};
      const MoeShape s{c.E, c.k, c.I, c.Is, c.renorm, int(c.H)};
      Pair x = rand(c.T, c.H, -1, 1);
      const MoePair mw = weights(c);
      const Tensor ws = workspace(c.T, s);
      std::vector<int32_t> iv(size_t(c.T * k));
      std::vector<float> wv(size_t(c.T * k));
      const int32_t picks[3] = {2, duplicate ? 2 : 0, 4};
      for (int64_t t = 0; t < c.T; ++t)
        for (int j = 0; j < k; ++j) {
          iv[size_t(t * k + j)] = picks[j];
          wv[size_t(t * k + j)] = 0.25f + 0.5f * float((t + j) % 3) / 3.0f;
        }
      Tensor ids = gpu_arena_.alloc(DType::i32, c.T, k), w = gpu_arena_.alloc(DType::f32, c.T, k);
      gpu_->upload_raw(ids, iv.data());
      gpu_->upload_f32(w, wv.data());
      experts(c, x, mw, s, ids, w, ws,
              duplicate ? "moe all on expert 2, duplicate slot" : "moe all on expert 2");
    }
}

// Experts 1 and 3 with the same router row tie on every token: at the k-th place the GPU keeps the one the
// CPU oracle keeps (torch.topk's order, core/torch_topk.h), inside the top k both with equal weights.
TEST_F(CudaMoeTest, RoutingTieAsCpu) {
  ArenaMarks marks(cpu_arena_, gpu_arena_);
  const MoeCase c{64, 16, 5, 2, 8, 0, false};
  const MoeShape s{c.E, c.k, c.I, c.Is, c.renorm, int(c.H)};
  Pair x = rand(c.T, c.H, -1, 1);
  std::vector<float> r(size_t(c.E * c.H));
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (float& v : r) v = bf16_round(d(rng_));
  std::copy_n(&r[size_t(1 * c.H)], c.H, &r[size_t(3 * c.H)]);
  Pair router = out(c.E, c.H);
  cpu_.upload_f32(router.cpu, r.data());
  gpu_->upload_f32(router.gpu, r.data());
  const Tensor ws = workspace(c.T, s);
  Pair ids, w;
  route(c, x, router, s, ws, ids, w);
  const std::vector<int32_t> got = ids_of(ids.gpu);
  int boundary = 0;
  for (int64_t t = 0; t < c.T; ++t) {
    const int32_t* g = &got[size_t(t * c.k)];
    const int32_t* want = static_cast<const int32_t*>(ids.cpu.data) + t * c.k;
    const bool has1 = g[0] == 1 || g[1] == 1, has3 = g[0] == 3 || g[1] == 3;
    if (has1 != has3) {
      ++boundary;
      EXPECT_EQ(g[1], want[1]) << "token " << t
                               << ": the tie at the k-th place went another way than on the CPU";
    }
  }
  EXPECT_GT(boundary, 0) << "the draw produced no tie at the k-th place; change the seed";
}

// gemm_batched_launch alone (gemm.cuh), the grouped GEMM under the experts: tiles of 16 rows with their A, B
// and C chosen through device pointer arrays (tiles sharing an expert's weights, tiles out of order, two
// tiles reading the same rows) against the CPU product of the same bf16 values; each output rounded to bf16
// once.
TEST_F(CudaMoeTest, PointerArrayGemmMatchesCpu) {
  ArenaMarks marks(cpu_arena_, gpu_arena_);
  const int64_t rows = 16, K = 40, N = 24, E = 3;
  const std::vector<int> tile_a = {0, 2, 1, 2},
                         tile_w = {1, 1, 0, 2};  // A tile and expert of each batch entry
  const int64_t tiles = int64_t(tile_a.size());
  Pair a = rand(3 * rows, K, -1, 1), w = rand(E * N, K, -1, 1);
  Tensor c = gpu_arena_.alloc(DType::bf16, tiles * rows, N);
  poison(c.data, size_t(tiles * rows * N) * 2);
  Tensor ptrs = gpu_arena_.alloc(DType::u8, 1, 3 * tiles * int64_t(sizeof(void*)));
  std::vector<const void*> host(size_t(3 * tiles));
  const auto* ab = static_cast<const __nv_bfloat16*>(a.gpu.data);
  const auto* wb = static_cast<const __nv_bfloat16*>(w.gpu.data);
  auto* cb = static_cast<__nv_bfloat16*>(c.data);
  for (int64_t i = 0; i < tiles; ++i) {
    host[size_t(i)] = ab + tile_a[size_t(i)] * rows * a.gpu.stride;
    host[size_t(tiles + i)] = wb + tile_w[size_t(i)] * N * w.gpu.stride;
    host[size_t(2 * tiles + i)] = cb + i * rows * N;
  }
  gpu_->upload_raw(ptrs, host.data());
  const void** p = static_cast<const void**>(ptrs.data);
  GemmContext* ctx = gemm_init();
  gemm_batched_launch(ctx, p, a.gpu.stride, p + tiles, w.gpu.stride,
                      static_cast<void**>(ptrs.data) + 2 * tiles, N, rows, N, K, tiles, 16, gpu_->stream());
  gpu_->synchronize();
  gemm_free(ctx);
  const std::vector<float> got = down_gpu(c);
  const std::vector<double> av = down_cpu(a.cpu), wv = down_cpu(w.cpu);
  std::vector<double> want(got.size());
  for (int64_t i = 0; i < tiles; ++i)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (int64_t q = 0; q < K; ++q)
          acc += av[size_t((tile_a[size_t(i)] * rows + r) * K + q)] *
                 wv[size_t((tile_w[size_t(i)] * N + n) * K + q)];
        want[size_t((i * rows + r) * N + n)] = acc;
      }
  // fp32 accumulation of 40 exact products, then one bf16 rounding.
  EXPECT_EQ(count_mismatch(got, want, 1e-5, kBf16Ulp, "pointer-array GEMM"), 0);
}

// A workspace smaller than a call needs is refused with the size needed, before anything runs: the routing's
// logits of 100 tokens do not fit 1 KiB, the experts' grouped rows of 100 tokens not a workspace planned for
// 10 (moe_workspace_bytes grows with the tokens), and a MoeShape without its hidden size sizes nothing.
TEST_F(CudaMoeTest, SmallWorkspaceIsAnError) {
  ArenaMarks marks(cpu_arena_, gpu_arena_);
  const MoeCase c{100, 32, 8, 2, 16, 0, true};
  const MoeShape s{c.E, c.k, c.I, c.Is, c.renorm, int(c.H)};
  Pair x = rand(c.T, c.H, -1, 1), router = rand(c.E, c.H, -1, 1), o = rand(c.T, c.H, -1, 1);
  const MoePair mw = weights(c);
  Tensor ids = gpu_arena_.alloc(DType::i32, c.T, c.k), w = gpu_arena_.alloc(DType::f32, c.T, c.k);
  EXPECT_LT(gpu_->moe_workspace_bytes(10, s), gpu_->moe_workspace_bytes(c.T, s));
  EXPECT_THROW(gpu_->moe_route(x.gpu, router.gpu, s, ids, w, gpu_arena_.alloc(DType::u8, 1, 1024)), Error);
  gpu_->moe_route(x.gpu, router.gpu, s, ids, w, workspace(c.T, s));
  const Tensor small = workspace(10, s);
  EXPECT_THROW(gpu_->moe_experts(x.gpu, ids, w, mw.gpu, s, o.gpu, small), Error);
  EXPECT_THROW(gpu_->moe_workspace_bytes(c.T, MoeShape{c.E, c.k, c.I, c.Is, c.renorm}), Error);
}

// The tile plan's bound holds for any routing: the worst case is every expert with one pair past a whole
// tile.
TEST(MoeTiles, BoundCoversWorstRouting) {
  for (int64_t T : {1, 2, 16, 100, 4096, 32768})
    for (int E : {1, 5, 64, 256})
      for (int k : {1, 2, 8}) {
        if (k > E) continue;
        const MoeDims d{64, E, k, 32, 0, true};
        const MoeTiles t = moe_plan_tiles(T, d);
        ASSERT_TRUE(t.rows == 16 || t.rows == 32 || t.rows == 64 || t.rows == 128);
        // Pairs spread so that as many experts as possible hold count ≡ 1 (mod rows): the most padding.
        const int64_t pairs = T * k;
        int64_t worst = 0, left = pairs;
        for (int e = 0; e < E && left > 0; ++e) {
          const int64_t n = e == E - 1 ? left : std::min<int64_t>(left, 1);
          worst += (n + t.rows - 1) / t.rows;
          left -= n;
        }
        EXPECT_LE(worst, t.tiles) << "T " << T << " E " << E << " k " << k;
        EXPECT_LE(t.tiles * t.rows, pairs + int64_t(std::min<int64_t>(E, pairs)) * t.rows);
      }
}

}  // namespace
#endif
