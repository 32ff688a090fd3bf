// The drafter on the CUDA backend against the CPU fp32 oracle: loss_row_stats (kernels/train/loss_stats.cu) on
// awkward block counts and sizes, then whole drafter steps (bf16 activations, bf16 weight shadow, statistics
// on the device) on the tiny test drafter, and the shadow after AdamW. Prints the worst element of every
// comparison. Skips itself without a GPU; one skipped test in a build without CUDA.
#include <gtest/gtest.h>

#ifndef DF_HAVE_CUDA
TEST(CudaDrafter, SkippedWithoutCudaBuild) {
  GTEST_SKIP() << "built without CUDA: GPU drafter tests skipped";
}
#else
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_train_ops.h"
#include "tests/unit/test_drafter_util.h"
#include "train/optimizer.h"

using namespace df;
using namespace df::testing;

namespace {

// Device copies of host rows, freed with the owner.
class Dev {
 public:
  explicit Dev(TrainOps& ops) : ops_(ops) {}
  ~Dev() {
    for (void* p : mem_) ops_.free_bytes(p);
  }
  template <class T>
  Tensor up(const std::vector<T>& h, DType dt, int64_t rows, int64_t cols) {
    mem_.push_back(ops_.alloc_bytes(size_t(rows * cols) * dtype_size(dt)));
    Tensor t = tensor_make(mem_.back(), dt, Device::cuda, rows, cols);
    ops_.upload_raw(t, h.data());
    return t;
  }
  Tensor bf16(const std::vector<float>& h, int64_t rows, int64_t cols) {
    std::vector<uint16_t> b(h.size());
    for (size_t i = 0; i < h.size(); ++i) b[i] = f32_to_bf16(h[i]);
    return up(b, DType::bf16, rows, cols);
  }
  template <class T>
  std::vector<T> down(const Tensor& t) {
    std::vector<T> h(size_t(t.numel()) * dtype_size(t.dtype) / sizeof(T));
    ops_.download_raw(t, h.data());
    return h;
  }

 private:
  TrainOps& ops_;
  std::vector<void*> mem_;
};

// In place: the batch and the CPU model keep pointing at these vectors.
void round_to_bf16(std::vector<float>& v) {
  for (float& x : v) x = bf16_round(x);
}

// Worst |a−b| − (atol + rtol·|b|) over the elements, printed with its index and both values; true if none
// exceeds.
bool report(const std::string& what, const std::vector<double>& got, const std::vector<double>& want,
            double atol, double rtol) {
  size_t worst = 0;
  double excess = -1e300, maxerr = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - want[i]), e = err - (atol + rtol * std::fabs(want[i]));
    maxerr = std::max(maxerr, err);
    if (e > excess || std::isnan(got[i])) {
      excess = std::isnan(got[i]) ? 1e300 : e;
      worst = i;
    }
  }
  std::printf("[ maxerr ] %-44s n %zu max|err| %.3e worst at %zu: gpu %.9g cpu %.9g\n", what.c_str(),
              got.size(), maxerr, worst, got.empty() ? 0.0 : got[worst], want.empty() ? 0.0 : want[worst]);
  return excess <= 0;
}

class CudaDrafter : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports 0): GPU test skipped";
    gpu_ = std::make_unique<CudaTrainOps>(0);
  }
  CpuTrainOps cpu_;
  std::unique_ptr<CudaTrainOps> gpu_;
};

}  // namespace

// Weights: the kernel's double exp/pow against glibc's (each within 2 ulp of double) can move an f32 rounding
// by one ulp, and the streak prefix multiplies ≤ 15 such factors: |Δw| ≤ 16 ulp ≈ 1e-6 relative. Counts are
// integers: exact. Σ w·loss and Σ w: a tree of f64 partials against the host's sequential f64 sum, ≤ N·2^-52
// relative for N ≤ 12k rows, plus the f32 weight differences above: 2e-6 relative covers both.
TEST_F(CudaDrafter, LossRowStatsMatchesTheCpu) {
  struct Case {
    int64_t nb;
    int B;
  };
  for (Case c : {Case{1, 2}, Case{3, 5}, Case{37, 7}, Case{733, 16}})
    for (int mode = 0; mode < 3; ++mode) {  // 0 plain, 1 streak, 2 given weights
      const int64_t N = c.nb * c.B;
      Rng r(uint64_t(N * 3 + mode));
      const size_t n = static_cast<size_t>(N);
      std::vector<int32_t> labels(n), argmax(n);
      std::vector<uint8_t> active(n);
      std::vector<float> loss(n), p(n), w(n);
      for (int64_t i = 0; i < N; ++i) {
        active[size_t(i)] = i % c.B != 0 && r.below(4) != 0;
        labels[size_t(i)] = int32_t(r.below(9));
        argmax[size_t(i)] = r.below(2) ? labels[size_t(i)] : int32_t(r.below(9));
        loss[size_t(i)] = active[size_t(i)] ? float(4 * r.uniform()) : 0.0f;
        p[size_t(i)] = active[size_t(i)] ? float(r.uniform()) : 0.0f;
        w[size_t(i)] = mode == 2 ? float(r.uniform()) : -7.0f;
      }
      TrainOps::LossRowArgs a;
      a.block = c.B;
      a.gamma = 7.0f;
      a.streak = mode == 1;
      a.streak_alpha = 0.5f;
      a.weights_given = mode == 2;
      const int slots = LossStatsSlots::size(c.B);
      // Both backends start from the same non-zero block: the op adds.
      std::vector<double> st_cpu(size_t(slots), 1.0);
      std::vector<float> w_cpu = w;
      auto row = [](auto& v, DType dt) {
        return tensor_make(v.data(), dt, Device::cpu, 1, int64_t(v.size()));
      };
      cpu_.loss_row_stats(row(labels, DType::i32), row(active, DType::u8), row(loss, DType::f32),
                          row(p, DType::f32), row(argmax, DType::i32), a, row(w_cpu, DType::f32),
                          tensor_make(st_cpu.data(), DType::u8, Device::cpu, 1, slots * 8));
      Dev d(*gpu_);
      Tensor gw = d.up(w, DType::f32, 1, N),
             gst = d.up(std::vector<double>(size_t(slots), 1.0), DType::u8, 1, slots * 8);
      gpu_->loss_row_stats(d.up(labels, DType::i32, 1, N), d.up(active, DType::u8, 1, N),
                           d.up(loss, DType::f32, 1, N), d.up(p, DType::f32, 1, N),
                           d.up(argmax, DType::i32, 1, N), a, gw, gst);
      const std::string name = "loss_row_stats nb " + std::to_string(c.nb) + " B " + std::to_string(c.B) +
                               " mode " + std::to_string(mode);
      const std::vector<float> w_gpu = d.down<float>(gw);
      const std::vector<double> st_gpu = d.down<double>(gst);
      EXPECT_TRUE(report(name + " row_w", std::vector<double>(w_gpu.begin(), w_gpu.end()),
                         std::vector<double>(w_cpu.begin(), w_cpu.end()), 0, 1e-6));
      EXPECT_TRUE(report(name + " sums", {st_gpu[0], st_gpu[1]}, {st_cpu[0], st_cpu[1]}, 0, 2e-6));
      for (int i = 2; i < slots; ++i)
        EXPECT_EQ(st_gpu[size_t(i)], st_cpu[size_t(i)]) << name << " count slot " << i;
    }
}

// A whole drafter step, both losses, streak and noise: same init (counter-based), bf16-representable taps and
// tables. The GPU stores every activation in bf16 (2^-9 relative per store, ~40 stores deep through two
// layers and the loss) and multiplies bf16 weights: loss sums within 3e-2 relative; row weights depend on
// p_label through the streak and follow within the same bound. Counts of labelled rows are exact; argmax may
// flip on a near tie, so correct counts may differ by a few rows. Gradients: per tensor, cosine ≥ 0.98 and
// norm within 10% (bf16 rounding noise on a 2-layer network, far from a wrong formula, which gives cosines
// near 0 or norms off by a factor). The GPU runs the training path, its step's first backward writing the
// gradients over NaN (every element written, none read), against the oracle's zero-fill + accumulate; then a
// second GPU model whose gradients are zero-filled first (drafter_zero_grads: every backward adds) must give
// the same bits (the same GEMM plans serve beta 0 and 1, so beta 0's x and the fill's 0 + x differ at most in
// the sign of a zero).
TEST_F(CudaDrafter, StepMatchesTheCpuOracle) {
  for (int variant = 0; variant < 2; ++variant) {
    TinySetup host;  // the CPU model, batch and tables
    DrafterLossOptions o;
    o.kind = variant == 0 ? LmLossKind::ce : LmLossKind::kl;
    o.streak = variant == 1;
    o.noise_std = variant == 1 ? 0.05f : 0.0f;
    o.noise_seed = 11;
    const int64_t T = host.batch.offsets.back(), H = host.cfg.hidden, V = host.cfg.vocab;
    for (std::vector<float>* t : {&host.taps, &host.target_hidden, &host.embed, &host.lm_head})
      round_to_bf16(*t);
    DrafterModel gm(host.cfg, *gpu_);
    drafter_init_params(gm, 7);  // TinySetup's seed: identical master weights
    Dev d(*gpu_);
    gm.set_frozen(d.bf16(host.embed, V, H), d.bf16(host.lm_head, V, H));
    plan_workspace(gm, T, 4 * T);
    DrafterBatch gb = host.batch;
    gb.taps = d.bf16(host.taps, T, host.batch.taps.cols);
    gb.target_hidden = d.bf16(host.target_hidden, T, H);
    const std::vector<DrafterAnchor> an = {{0, 0}, {0, 4}, {0, 8}, {2, 1}, {0, -1}, {2, 6}, {2, 11}};
    drafter_zero_grads(*host.model);
    for (const DrafterParamEntry& e : gm.table().entries) gpu_->fill(gm.entry_view(gm.grads, e.name), NAN);
    drafter_begin_step(gm);
    const LossStats sc = drafter_forward_backward(*host.model, host.batch, an, o);
    const LossStats sg = drafter_forward_backward(gm, gb, an, o);
    const std::string v = variant == 0 ? "ce" : "kl+streak+noise";
    EXPECT_TRUE(report("step " + v + " loss_sum, weight_sum", {sg.loss_sum, sg.weight_sum},
                       {sc.loss_sum, sc.weight_sum}, 0, 3e-2));
    EXPECT_TRUE(report("step " + v + " row weights",
                       std::vector<double>(sg.row_weight.begin(), sg.row_weight.end()),
                       std::vector<double>(sc.row_weight.begin(), sc.row_weight.end()), 1e-3, 3e-2));
    EXPECT_EQ(sg.count, sc.count) << v;
    EXPECT_EQ(sg.tau_blocks, sc.tau_blocks) << v;
    for (size_t k = 0; k < sc.correct.size(); ++k)
      EXPECT_NEAR(double(sg.correct[k]), double(sc.correct[k]), 2) << v;
    const std::vector<float> g_gpu = d.down<float>(gm.grads);
    for (const DrafterParamEntry& e : host.model->table().entries) {
      double dot = 0, na = 0, nb = 0;
      for (int64_t i = 0; i < e.rows * e.cols; ++i) {
        const double a = g_gpu[size_t(e.offset + i)], b = host.grads()[e.offset + i];
        dot += a * b;
        na += a * a;
        nb += b * b;
      }
      const double cosine = dot / std::sqrt(std::max(na * nb, 1e-300)),
                   ratio = std::sqrt(na / std::max(nb, 1e-300));
      std::printf("[ grad   ] %-8s %-40s cosine %.5f norm gpu/cpu %.4f (cpu norm %.3e)\n", v.c_str(),
                  e.name.c_str(), cosine, ratio, std::sqrt(nb));
      EXPECT_GE(cosine, 0.98) << v << " " << e.name;
      EXPECT_NEAR(ratio, 1.0, 0.1) << v << " " << e.name;
    }
    DrafterModel gf(host.cfg, *gpu_);
    drafter_init_params(gf, 7);
    gf.set_frozen(gm.embed, gm.lm_head);
    plan_workspace(gf, T, 4 * T);
    drafter_zero_grads(gf);
    drafter_forward_backward(gf, gb, an, o);
    const std::vector<float> g_fill = d.down<float>(gf.grads);
    int64_t differ = 0, first = -1;
    for (size_t i = 0; i < g_fill.size(); ++i) {
      const float a = g_gpu[i] + 0.0f;  // −0 to +0, nothing else
      if (std::memcmp(&a, &g_fill[i], sizeof(float)) != 0 && differ++ == 0) first = int64_t(i);
    }
    EXPECT_EQ(differ, 0) << v << ": first write and zero-fill + accumulate differ in " << differ
                         << " elements, first " << first << ": " << (first >= 0 ? g_gpu[size_t(first)] : 0.0f)
                         << " vs " << (first >= 0 ? g_fill[size_t(first)] : 0.0f);
  }
}

// After AdamW the bf16 shadow is bf16(params) element for element (the GEMMs of the next step use it), and
// drafter_refresh_shadow gives the same after the master weights are written directly (a checkpoint load).
TEST_F(CudaDrafter, ShadowFollowsTheMasterWeights) {
  DrafterConfig c = tiny_drafter_config();
  DrafterModel m(c, *gpu_);
  drafter_init_params(m, 5);
  Dev d(*gpu_);
  std::vector<float> g(size_t(m.table().total));
  Rng r(3);
  for (float& x : g) x = float(r.normal());
  gpu_->upload_raw(m.grads, g.data());
  OptimConfig o;
  o.lr = 1e-2f;
  o.total_steps = 10;
  adamw_step(m, o, 0, 1.0);
  auto check = [&](const char* what) {
    const std::vector<float> p = d.down<float>(m.params);
    const std::vector<uint16_t> lp = d.down<uint16_t>(m.params_lp);
    int64_t bad = 0, first = -1;
    for (const DrafterParamEntry& e : m.table().entries)
      for (int64_t i = e.offset; i < e.offset + e.rows * e.cols; ++i)
        if (lp[size_t(i)] != f32_to_bf16(p[size_t(i)]) && bad++ == 0) first = i;
    EXPECT_EQ(bad, 0) << what << ": first at " << first << " params "
                      << (first >= 0 ? p[size_t(first)] : 0.0f) << " shadow "
                      << (first >= 0 ? bf16_to_f32(lp[size_t(first)]) : 0.0f);
  };
  check("after adamw");
  std::vector<float> p(size_t(m.table().total));
  for (float& x : p) x = float(r.normal());
  gpu_->upload_raw(m.params, p.data());
  drafter_refresh_shadow(m);
  check("after refresh");
}
#endif
