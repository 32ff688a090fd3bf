// DFlash block attention kernels (kernels/attention/dflash_attention.cu) against the CPU fp32 oracle
// (CpuTrainOps) on the same bf16-representable inputs: odd GQA groups, head dims 16–256 and unaligned ones,
// padding blocks, anchors at 0 and closer than B, several sequences, window edges, shuffled blocks, no
// context, strided views. Outputs are poisoned with NaN first; rows no query sees must come back exactly 0.
// Every case runs on each kernel path in the same run: the default (wgmma at head dims 65..128 on a Hopper
// GPU of an sm_90a build), the portable mma.sync kernels (every other GPU) and, at head dims above 64, their
// small shared-memory form (what sm_120 and sm_89 run), the last two forced through the kernel-variant
// registry (kernels/dispatch/dispatch.h). Skips without a GPU.
#include <gtest/gtest.h>

#ifndef DF_HAVE_CUDA
TEST(DFlashAttentionCuda, SkippedWithoutCudaBuild) {
  GTEST_SKIP() << "built without CUDA: GPU tests skipped";
}
#else
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/dispatch/dispatch.h"
#include "kernels/train_launchers.cuh"
#include "ops/cpu/cpu_train_ops.h"
#include "ops/cuda/cuda_ops.h"

using namespace df;

namespace {

// One test shape: context lengths of the packed sequences, then blocks as (sequence, anchor or −1).
struct Shape {
  int hq, hkv, hd, B, W;
};
struct Case {
  const char* name;
  Shape s;
  std::vector<int> ctx;
  std::vector<std::pair<int, int> > blocks;
  int pad = 0;  // extra columns on every GPU row (strided views)
  bool shuffle = false;
};

// A host f32 matrix [rows, cols] with its GPU twin (bf16 or f32, row stride cols + pad).
struct Mat {
  int64_t rows = 0, cols = 0;
  std::vector<float> h;
  Tensor gpu;
};

class DFlashAttentionCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports 0): GPU test skipped";
    gpu_ = std::make_unique<CudaOps>(0);
  }
  void TearDown() override {
    for (void* p : allocs_) gpu_->free_bytes(p);
  }
  Mat mat(int64_t rows, int64_t cols, DType dt, int pad) {
    Mat m;
    m.rows = rows, m.cols = cols;
    m.h.assign(size_t(rows * cols), 0.0f);
    const int64_t ld = cols + pad;
    void* p = gpu_->alloc_bytes(std::max<size_t>(16, size_t(rows * ld) * dtype_size(dt)));
    allocs_.push_back(p);
    // NaN poison, on the ops' stream (non-blocking: a legacy-stream memset could land after the upload).
    EXPECT_EQ(cudaMemsetAsync(p, 0xff, size_t(rows * ld) * dtype_size(dt), gpu_->stream()), cudaSuccess);
    m.gpu = tensor_make(p, dt, Device::cuda, rows, ld).cols_view(0, cols);
    return m;
  }
  Mat rand(int64_t rows, int64_t cols, float lo, float hi, int pad) {
    Mat m = mat(rows, cols, DType::bf16, pad);
    std::uniform_real_distribution<float> d(lo, hi);
    for (float& x : m.h) x = bf16_round(d(rng_));
    if (rows > 0) gpu_->upload_f32(m.gpu, m.h.data());
    return m;
  }
  std::vector<float> down(const Mat& m) {
    std::vector<float> h(m.h.size());
    if (m.rows > 0) gpu_->download_f32(m.gpu, h.data());
    return h;
  }
  static Mat hmat(int64_t rows, int64_t cols) {  // host only: oracle inputs and outputs
    Mat m;
    m.rows = rows, m.cols = cols;
    m.h.assign(size_t(rows * cols), 0.0f);
    return m;
  }
  static Tensor host(Mat& m) { return tensor_make(m.h.data(), DType::f32, Device::cpu, m.rows, m.cols); }
  void run(const Case& c);

  std::mt19937 rng_{20261201};
  std::unique_ptr<CudaOps> gpu_;
  std::vector<void*> allocs_;
  CpuTrainOps cpu_;
};

// |got − want| ≤ atol + rtol·|want| element-wise (−inf must match −inf exactly; NaN always fails); prints the
// worst element with its row, column and both values so one GPU run says what is wrong.
void expect_close(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                  int64_t cols, double atol, double rtol) {
  int64_t bad = 0, worst_i = -1;
  double worst = -1, ref = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = got[i], w = want[i];
    if (std::isfinite(w)) ref = std::max(ref, std::fabs(w));
    double excess;
    if (std::isinf(w) || std::isinf(g) || std::isnan(g))
      excess = g == w ? -1.0 : INFINITY;
    else
      excess = std::fabs(g - w) - (atol + rtol * std::fabs(w));
    if (excess > 0) ++bad;
    if (excess > worst || worst_i < 0) worst = excess, worst_i = int64_t(i);
  }
  if (worst_i < 0) return;
  const double g = got[size_t(worst_i)], w = want[size_t(worst_i)];
  std::printf(
      "[ maxerr ] %-44s [%lld x %lld] worst (row %lld, col %lld) got %.6g want %.6g |err| %.3e, "
      "max|ref| %.3e\n",
      what.c_str(), (long long)(want.size() / size_t(cols)), (long long)cols, (long long)(worst_i / cols),
      (long long)(worst_i % cols), g, w, std::fabs(g - w), ref);
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << want.size() << " elements outside " << atol << " + "
                    << rtol << "·|want|; worst at row " << worst_i / cols << " col " << worst_i % cols
                    << ": got " << g << " want " << w;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

// bf16 keeps 8 significant bits: one rounding to nearest is a relative error ≤ 2^-9; kUlp = 2^-8 is used as
// the bound of one rounding with margin. Tolerances (|a−b| ≤ atol + rtol·|b|):
//  out: P is rounded to bf16 before P·V (each term off by ≤ 2^-9 relative, all weights ≥ 0, so the convex
//       combination moves by ≤ 2^-9·max|v|), then out is rounded to bf16: atol 2^-8·max|v|, rtol 2^-8.
//  lse: fp32 scores of bf16 inputs and ex2/lg2.approx, no bf16 rounding: 1e-4 absolute (|lse| ≲ 10).
//  dq, dk, dv: sums over up to thousands of (key, query) terms where the GPU rounds one factor (P, dS) to
//       bf16; independent roundings give an error ≈ 2^-9·rms(term)·√n, a small multiple of 2^-9 of the
//       tensor's typical magnitude, then the bf16 output rounding (≤ 2^-9·|b|): atol 2^-7·max|ref|, rtol
//       2^-7. A float64 model of exactly these roundings on the cases below stays within 0.33 of it. A lost
//       block, wrong mask edge or wrong key row moves elements by O(max|ref|) and fails.
constexpr double kUlp = 1.0 / 256.0;

}  // namespace

// The whole check of one case, on each kernel path: forward against the oracle, then the backward against the
// oracle fed the GPU's own out and lse (both are backward inputs, so only the backward's own rounding is
// measured), guard rows and run-to-run bit identity.
void DFlashAttentionCuda::run(const Case& c) {
  SCOPED_TRACE(c.name);
  std::vector<int64_t> start(c.ctx.size() + 1, 0);
  for (size_t s = 0; s < c.ctx.size(); ++s) start[s + 1] = start[s] + c.ctx[s];
  const int64_t T = start.back(), nb = int64_t(c.blocks.size()), qr = nb * c.s.B, kr = T + qr;
  std::vector<int32_t> blk;
  std::vector<std::pair<int, int> > order = c.blocks;
  if (c.shuffle) std::shuffle(order.begin(), order.end(), rng_);
  for (auto [s, a] : order) {
    blk.push_back(int32_t(start[size_t(s)]));
    blk.push_back(a);
  }
  const int64_t qc = int64_t(c.s.hq) * c.s.hd, kc = int64_t(c.s.hkv) * c.s.hd;
  Mat q = rand(qr, qc, -2, 2, c.pad), k = rand(kr, kc, -2, 2, c.pad), v = rand(kr, kc, -1, 1, c.pad);
  Mat dout = rand(qr, qc, -1, 1, c.pad);
  Mat out = mat(qr, qc, DType::bf16, c.pad), lse = mat(qr, c.s.hq, DType::f32, c.pad);
  Mat dq = mat(qr, qc, DType::bf16, c.pad), dk = mat(kr, kc, DType::bf16, c.pad),
      dv = mat(kr, kc, DType::bf16, c.pad);
  int32_t* dblk = static_cast<int32_t*>(gpu_->alloc_bytes(std::max<size_t>(8, blk.size() * 4)));
  allocs_.push_back(dblk);
  ASSERT_EQ(cudaMemcpyAsync(dblk, blk.data(), blk.size() * 4, cudaMemcpyHostToDevice, gpu_->stream()),
            cudaSuccess);

  DFlashAttnDims d;
  d.T = T, d.nb = nb, d.hq = c.s.hq, d.hkv = c.s.hkv, d.hd = c.s.hd, d.block = c.s.B, d.window = c.s.W;
  d.scale = 1.0f / std::sqrt(float(c.s.hd));
  const size_t ws_bytes = dflash_attention_bwd_workspace_bytes(d);
  void* ws = gpu_->alloc_bytes(std::max<size_t>(256, ws_bytes));
  allocs_.push_back(ws);
  const cudaStream_t st = gpu_->stream();
  auto ld = [](const Mat& m) { return m.gpu.stride; };
  auto bf = [](const Mat& m) { return m.gpu.ptr<bf16>(); };
  // Oracle forward; dq, dk, dv tolerances. dq = scale·Σ P(dP − D)·k: where the exact gradient is 0 (a query
  // that sees one key: P = 1, dP = D) the GPU's dP (an mma over hd terms) and D (rowsum(dO∘O) in another order)
  // still differ by fp32 accumulation order, ≤ hd·2⁻²³·|dO|·|v|, which |k|·scale carries into dq: that is the
  // floor of its absolute tolerance; dk = scale·Σ dS·q: the same floor with |q| in place of |k|.
  DFlashAttnShape s{c.s.hq, c.s.hkv, c.s.hd, c.s.B, c.s.W, d.scale};
  Tensor hb = tensor_make(blk.data(), DType::i32, Device::cpu, nb, 2);
  Mat c_out = hmat(qr, qc), c_lse = hmat(qr, c.s.hq);
  cpu_.dflash_attention_fwd(host(q), host(k), host(v), hb, host(c_out), host(c_lse), s);
  const double vmax = max_abs(v.h);
  const double fp32_order = double(c.s.hd) * std::ldexp(1.0, -23) * max_abs(dout.h) * vmax * max_abs(k.h) * d.scale;
  const double fp32_order_k = fp32_order / max_abs(k.h) * max_abs(q.h);

  auto bwd = [&] {
    dflash_attention_bwd_launch(bf(q), ld(q), bf(k), ld(k), bf(v), ld(v), dblk, bf(out), ld(out),
                                lse.gpu.ptr<float>(), ld(lse), bf(dout), ld(dout), bf(dq), ld(dq), bf(dk),
                                ld(dk), bf(dv), ld(dv), d, ws, ws_bytes, st);
  };
  // Each kernel path (the small form only where the padded head dim, 128 or 256, has one); the registry's
  // variants in force come back at the end.
  const KernelVariants saved = kernel_variants();
  for (const int form : {0, 1, 2}) {
    if (form == 2 && c.s.hd <= 64) continue;
    const char* path = form == 0 ? "default" : form == 1 ? "mma.sync" : "mma.sync small";
    SCOPED_TRACE(std::string("kernel path ") + path);
    const KernelVariants forced =
        kernel_variants_with(saved, &KernelVariants::dflash_attention_portable, form == 1);
    kernel_variants_set(kernel_variants_with(forced, &KernelVariants::dflash_attention_small, form == 2));
    // NaN poison again: a row the previous path wrote must not pass for this one.
    for (const Mat* m : {&out, &lse, &dq, &dk, &dv})
      EXPECT_EQ(cudaMemsetAsync(m->gpu.data, 0xff, size_t(m->rows * m->gpu.stride) * dtype_size(m->gpu.dtype), st),
                cudaSuccess);
    const std::string name = std::string(c.name) + " [" + path + "]";
    dflash_attention_fwd_launch(bf(q), ld(q), bf(k), ld(k), bf(v), ld(v), dblk, bf(out), ld(out),
                                lse.gpu.ptr<float>(), ld(lse), d, st);
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    const std::vector<float> g_out = down(out), g_lse = down(lse);
    expect_close(name + " out", g_out, c_out.h, qc, kUlp * vmax, kUlp);
    expect_close(name + " lse", g_lse, c_lse.h, c.s.hq, 1e-4, 1e-6);

    // The oracle backward fed this path's out and lse.
    Mat o_in = hmat(qr, qc), l_in = hmat(qr, c.s.hq);
    o_in.h = g_out, l_in.h = g_lse;
    Mat c_dq = hmat(qr, qc), c_dk = hmat(kr, kc), c_dv = hmat(kr, kc);
    cpu_.dflash_attention_bwd(host(q), host(k), host(v), hb, host(o_in), host(l_in), host(dout), host(c_dq),
                              host(c_dk), host(c_dv), s);
    bwd();
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    const std::vector<float> g_dq = down(dq), g_dk = down(dk), g_dv = down(dv);
    expect_close(name + " dq", g_dq, c_dq.h, qc, 2 * kUlp * max_abs(c_dq.h) + fp32_order, 2 * kUlp);
    expect_close(name + " dk", g_dk, c_dk.h, kc, 2 * kUlp * max_abs(c_dk.h) + fp32_order_k, 2 * kUlp);
    expect_close(name + " dv", g_dv, c_dv.h, kc, 2 * kUlp * max_abs(c_dv.h), 2 * kUlp);

    // Guard rows: a k/v row no query sees has an all-zero oracle row and must be exactly 0 on the GPU too.
    int64_t unseen = 0, dirty = 0;
    for (int64_t r = 0; r < kr; ++r) {
      bool zero = true;
      for (int64_t e = 0; e < kc && zero; ++e) zero = c_dv.h[size_t(r * kc + e)] == 0.0f;
      if (!zero) continue;
      ++unseen;
      for (int64_t e = 0; e < kc; ++e)
        dirty += g_dk[size_t(r * kc + e)] != 0.0f || g_dv[size_t(r * kc + e)] != 0.0f;
    }
    EXPECT_EQ(dirty, 0) << name << ": " << dirty << " nonzero dk/dv elements in the " << unseen
                        << " k/v rows no query sees";

    // Deterministic: a second backward gives the same bits.
    bwd();
    ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);
    EXPECT_TRUE(down(dq) == g_dq && down(dk) == g_dk && down(dv) == g_dv)
        << name << ": a second backward on the same inputs gave different bits";
  }
  kernel_variants_set(saved);
}

// Shapes as {hq, hkv, hd, B, W}, then the context lengths, then blocks as {sequence, anchor or −1}.
TEST_F(DFlashAttentionCuda, FullLayerGqaSeveralSequences) {
  // Anchors at 0, closer than B, at the sequence end; a padding block; the 27B group (4 q heads per kv head).
  run({"full hq8 hkv2 hd128 B16",
       {8, 2, 128, 16, 0},
       {100, 37, 70},
       {{0, 0}, {0, 5}, {0, 9}, {0, 64}, {0, 99}, {1, 36}, {1, 1}, {0, -1}, {2, 70}, {2, 3}}});
}

TEST_F(DFlashAttentionCuda, SlidingLayerWindowEdges) {
  run({"sliding W16 hq8 hkv2 hd128 B16",
       {8, 2, 128, 16, 16},
       {100, 37},
       {{0, 0}, {0, 15}, {0, 16}, {0, 17}, {0, 99}, {1, 36}, {1, 2}, {1, -1}}});
  run({"sliding W33 hq4 hkv4 hd64 B8",
       {4, 4, 64, 8, 33},
       {90, 200},
       {{0, 40}, {1, 199}, {1, 0}, {0, 89}, {1, 64}, {1, 65}, {0, 33}}});
  run({"sliding W larger than context", {4, 2, 64, 16, 1000}, {50}, {{0, 50}, {0, 10}, {0, 0}}});
}

TEST_F(DFlashAttentionCuda, OddGroupsAndBlockSizes) {
  run({"hq3 hkv1 hd64 B5 full", {3, 1, 64, 5, 0}, {23, 9}, {{0, 22}, {1, 4}, {0, 2}, {1, 9}, {0, -1}}});
  run({"hq3 hkv1 hd64 B5 W5", {3, 1, 64, 5, 5}, {23, 9}, {{0, 22}, {1, 4}, {0, 2}, {1, 9}}});
  run({"hq6 hkv2 hd256 B16 W17", {6, 2, 256, 16, 17}, {130, 20}, {{0, 129}, {1, 19}, {0, 70}, {1, 0}}});
  run({"hq6 hkv2 hd256 B16 full", {6, 2, 256, 16, 0}, {130, 20}, {{0, 129}, {1, 19}, {0, 70}, {0, -1}}});
}

TEST_F(DFlashAttentionCuda, WindowOfOneAndThree) {
  run({"W1 B1", {2, 1, 32, 1, 1}, {40}, {{0, 0}, {0, 7}, {0, 39}, {0, 40}}});
  run({"W3 B3", {2, 1, 32, 3, 3}, {40}, {{0, 0}, {0, 1}, {0, 2}, {0, 3}, {0, 39}, {0, -1}}});
  run({"W3 B2", {2, 2, 16, 2, 3}, {40, 5}, {{0, 1}, {1, 5}, {0, 38}, {1, 0}}});
}

TEST_F(DFlashAttentionCuda, HeadDimsPaddedAndUnaligned) {
  // hd 40 pads to 64 with 16-byte copies; hd 20 (and the odd row strides) take the element-copy path.
  run({"hd16", {4, 2, 16, 16, 0}, {80}, {{0, 80}, {0, 1}, {0, 40}}});
  run({"hd40 strided", {4, 2, 40, 16, 24}, {80}, {{0, 79}, {0, 3}, {0, 40}}, 8});
  run({"hd20 unaligned", {4, 1, 20, 7, 0}, {50, 13}, {{0, 49}, {1, 13}, {1, 6}, {0, -1}}, 3});
  run({"hd136 to 256", {2, 1, 136, 4, 0}, {70}, {{0, 69}, {0, 0}}});
}

TEST_F(DFlashAttentionCuda, ShuffledBlocksManyPerTileAndNoContext) {
  // 300 blocks of one sequence in shuffled order: many blocks share each context tile.
  Case many{"300 shuffled blocks B2", {2, 1, 32, 2, 0}, {200}, {}, 0, true};
  for (int i = 0; i < 300; ++i) many.blocks.push_back({0, i % 7 == 3 ? -1 : (i * 37) % 201});
  run(many);
  many.name = "300 shuffled blocks B2 W9";
  many.s.W = 9;
  run(many);
  // 1500 blocks of B 1: more than one round of the scan (1024 blocks per round).
  Case rounds{"1500 shuffled blocks B1", {2, 1, 16, 1, 0}, {300, 40}, {}, 0, true};
  for (int i = 0; i < 1500; ++i)
    rounds.blocks.push_back({i % 5 == 4 ? 1 : 0, i % 11 == 5 ? -1 : (i * 13) % (i % 5 == 4 ? 41 : 301)});
  run(rounds);
  rounds.name = "1500 shuffled blocks B1 W1", rounds.s.W = 1;
  run(rounds);
  run({"no context T=0", {4, 2, 64, 16, 0}, {0}, {{0, 0}, {0, 0}, {0, -1}}});
  run({"no context T=0 sliding", {4, 2, 64, 16, 16}, {0, 0}, {{1, 0}, {0, 0}}});
}

TEST_F(DFlashAttentionCuda, LargeGroupAndBlockPastOneTile) {
  // 16 q heads per kv head × B 16 = 256 query rows: four 64-row chunks per CTA. B 70: own block spans tiles.
  run({"group16 B16", {16, 1, 64, 16, 0}, {150}, {{0, 149}, {0, 65}, {0, 0}}});
  run({"B70 full", {2, 2, 32, 70, 0}, {100}, {{0, 100}, {0, 30}}});
  run({"B70 W80", {2, 2, 32, 70, 80}, {100}, {{0, 100}, {0, 30}}});
}

TEST_F(DFlashAttentionCuda, LongContextTilesSharedByManyBlocks) {
  // hd 128 (the backward keeps K in registers), 128-key tiles seen by up to 48 blocks: a tile's items are
  // split over the CTAs of its cluster in uneven shares; contexts that are not a multiple of the tile.
  Case c{"48 blocks hd128 full", {8, 2, 128, 16, 0}, {700, 150}, {}};
  for (int i = 0; i < 48; ++i)
    c.blocks.push_back(i % 3 == 2 ? std::pair{1, (i * 29) % 151} : std::pair{0, (i * 61) % 701});
  run(c);
  c.name = "48 blocks hd128 W300", c.s.W = 300;
  run(c);
}

TEST_F(DFlashAttentionCuda, HopperPathAwkwardShapes) {
  // The wgmma kernels serve head dims 65..128 as one zero-padded 128-column tile and 64-row query chunks:
  // hd 96 and 72, a group of 6 × B 16 = 96 rows (a second, part-empty chunk), 15 rows (one mostly empty
  // chunk), strided rows, no context, and more than one round of the dk/dv scan (1024 blocks per round).
  run({"hd96 group6 two chunks", {6, 1, 96, 16, 0}, {150, 40}, {{0, 149}, {1, 7}, {0, -1}, {0, 64}, {1, 40}}});
  run({"hd72 W20", {4, 2, 72, 16, 20}, {130}, {{0, 129}, {0, 19}, {0, 0}, {0, 70}}});
  run({"hd128 group3 B5 W7 strided", {3, 1, 128, 5, 7}, {90}, {{0, 89}, {0, 3}, {0, 6}, {0, -1}, {0, 50}}, 8});
  run({"hd128 no context", {8, 2, 128, 16, 16}, {0}, {{0, 0}, {0, 0}, {0, -1}}});
  Case rounds{"1100 shuffled blocks hd128 B2", {2, 1, 128, 2, 0}, {300}, {}, 0, true};
  for (int i = 0; i < 1100; ++i) rounds.blocks.push_back({0, i % 9 == 4 ? -1 : (i * 31) % 301});
  run(rounds);
  rounds.name = "1100 shuffled blocks hd128 B2 W40", rounds.s.W = 40;
  run(rounds);
}

TEST_F(DFlashAttentionCuda, SmallFormAwkwardShapes) {
  // The small form's tiles (run() forces it at head dims above 64): dq-pass K/V tiles of 16 keys (hd 256) and
  // 32 (hd 128), dk/dv key tiles of 32 (hd 256) and 64 keys (hd 128) with 16- and 32-row query chunks. A
  // group of 16 × B 16 (16 chunks a block), B 70 own rows spanning several tiles, contexts of 1 and of 33
  // keys, unaligned head dims padded to 128 and 256, and 300 blocks sharing each tile (the clusters' uneven
  // shares).
  run({"small hd256 group16 B16", {16, 1, 256, 16, 0}, {150}, {{0, 149}, {0, 33}, {0, 0}, {0, -1}}});
  run({"small hd256 B70 W75", {2, 2, 256, 70, 75}, {100, 1}, {{0, 100}, {0, 31}, {1, 1}, {1, 0}}});
  run({"small hd200 W33 strided", {4, 2, 200, 16, 33}, {33, 90}, {{0, 33}, {1, 89}, {1, 16}, {0, 1}}, 8});
  run({"small hd100 unaligned", {6, 2, 100, 5, 0}, {70, 17}, {{0, 69}, {1, 17}, {0, 32}, {1, -1}}, 3});
  run({"small hd128 no context", {8, 2, 128, 16, 16}, {0}, {{0, 0}, {0, 0}, {0, -1}}});
  Case many{"small 300 shuffled blocks hd256 B2", {2, 1, 256, 2, 0}, {200}, {}, 0, true};
  for (int i = 0; i < 300; ++i) many.blocks.push_back({0, i % 7 == 3 ? -1 : (i * 37) % 201});
  run(many);
  many.name = "small 300 shuffled blocks hd128 B2 W9", many.s.hd = 128, many.s.W = 9;
  run(many);
}

TEST_F(DFlashAttentionCuda, AllPaddingBlocksZeroEverything) {
  run({"all padding", {4, 2, 64, 16, 0}, {30}, {{0, -1}, {0, -1}}});
}

TEST_F(DFlashAttentionCuda, BadShapeOrWorkspaceIsAClearError) {
  DFlashAttnDims d;
  d.nb = 1, d.hq = 4, d.hkv = 3, d.hd = 64, d.block = 16;  // 4 q heads cannot share 3 kv heads
  auto message = [](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const cudaStream_t st = gpu_->stream();
  std::string m = message([&] {
    dflash_attention_fwd_launch(nullptr, 0, nullptr, 0, nullptr, 0, nullptr, nullptr, 0, nullptr, 0, d, st);
  });
  EXPECT_NE(m.find("hq 4 hkv 3"), std::string::npos) << m;
  EXPECT_NE(m.find("HINT"), std::string::npos) << m;
  d.hkv = 2;
  m = message([&] {
    dflash_attention_bwd_launch(nullptr, 0, nullptr, 0, nullptr, 0, nullptr, nullptr, 0, nullptr, 0, nullptr,
                                0, nullptr, 0, nullptr, 0, nullptr, 0, d, nullptr, 0, st);
  });
  EXPECT_NE(m.find("workspace"), std::string::npos) << m;
}

#endif  // DF_HAVE_CUDA
