// lm_head_loss_launch (kernels/train/lm_head_loss.cu) against the CPU oracle CpuTrainOps::lm_head_loss on the same
// bf16-representable inputs: CE and KL over awkward rows / H / V / chunk sizes and strided rows, no active
// row, labels at 0 and V − 1, argmax ties, logits in the thousands, a bad label, repeat bit-identity and an
// undersized workspace. Outputs and workspace are poisoned with NaN first. Skips itself without a GPU.
#include <gtest/gtest.h>

#ifndef DF_HAVE_CUDA
TEST(LmHeadLossCuda, SkippedWithoutCudaBuild) {
  GTEST_SKIP() << "built without CUDA: GPU lm_head loss tests skipped";
}
#else
#include <cuda_runtime.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/gemm/gemm.cuh"
#include "kernels/train_launchers.cuh"
#include "ops/cpu/cpu_train_ops.h"
#include "ops/cuda/cuda_ops.h"

using namespace df;

namespace {

// Error terms of the tolerances (|gpu − cpu| ≤ bound, derived per element below):
//  - kU: fp32 unit roundoff. Both sides multiply the same bf16 values exactly and sum in fp32 in different
//    orders: a sum of n terms is within n·kU·Σ|terms| of the exact one on the CPU; the GPU's tensor cores
//    may truncate instead of round, so allow it 2·n·kU. Logits of row r therefore differ by at most
//    dz = 3·H·kU·max_v Σ_h |x_h·W_vh|, and dhidden's V-term GEMM contributes 3·V·kU·Σ_v |g_v·W_vh|.
//  - kUb: bf16 rounding (8 significant bits, round to nearest): the GPU stores dlogits g and dhidden in bf16.
//  - kRed: the GPU's fp32 softmax reductions, ≈ 45 sequential-or-tree additions per row (V/8192 per thread,
//    then 10 + 3 tree levels at V = 248,320), 45·kU ≈ 2.7e-6 relative on Σ exp, plus the fast exp/log
//    (ex2.approx: 2^-22 relative; lg2.approx on Σ ∈ [1, V]: 2^-21 relative of log Σ ≤ 12.4): under 1e-5.
constexpr double kU = 1.0 / (1 << 24);
constexpr double kUb = 1.0 / 256.0;
constexpr double kRed = 1e-5;

struct LossInputs {
  int64_t rows = 0, H = 0, V = 0;
  std::vector<float> hid, tgt, W;  // [rows, H], [rows, H], [V, H], all bf16-representable
  std::vector<int32_t> labels;
  std::vector<uint8_t> active;
};

struct LossOutputs {
  std::vector<float> loss, p_label, dh;  // dh [rows, H]
  std::vector<int32_t> argmax;
  int64_t guards_clobbered = 0;  // dhidden row padding written by the GPU
};

std::vector<float> bf16_uniform(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = bf16_round(d(rng));
  return v;
}

// Random inputs: about 3/4 of the rows active, labels uniform with rows 1 and 2 at 0 and V − 1; the KL's
// target rows are the draft rows plus noise, so the KL is neither 0 nor dominated by one term.
LossInputs make_inputs(int64_t rows, int64_t H, int64_t V, float x_scale, float w_scale, uint32_t seed) {
  std::mt19937 rng(seed);
  LossInputs in;
  in.rows = rows, in.H = H, in.V = V;
  in.hid = bf16_uniform(rng, size_t(rows * H), -x_scale, x_scale);
  in.W = bf16_uniform(rng, size_t(V * H), -w_scale, w_scale);
  std::vector<float> noise = bf16_uniform(rng, size_t(rows * H), -x_scale / 2, x_scale / 2);
  in.tgt.resize(in.hid.size());
  for (size_t i = 0; i < in.tgt.size(); ++i) in.tgt[i] = bf16_round(in.hid[i] + noise[i]);
  std::uniform_int_distribution<int32_t> lab(0, int32_t(V - 1));
  std::bernoulli_distribution act(0.75);
  for (int64_t r = 0; r < rows; ++r) {
    in.labels.push_back(r == 1 ? 0 : r == 2 ? int32_t(V - 1) : lab(rng));
    in.active.push_back(rows == 1 || r == 1 || r == 2 || act(rng) ? 1 : 0);
  }
  return in;
}

Tensor host_view(const void* p, DType dt, int64_t rows, int64_t cols) {
  return tensor_make(const_cast<void*>(p), dt, Device::cpu, rows, cols);
}

LossOutputs run_cpu(const LossInputs& in, LmLossKind kind) {
  const int64_t R = in.rows, H = in.H, V = in.V;
  LossOutputs o;
  o.loss.resize(size_t(R)), o.p_label.resize(size_t(R)), o.argmax.resize(size_t(R)),
      o.dh.resize(size_t(R * H));
  CpuTrainOps cpu(64);
  cpu.lm_head_loss(host_view(in.hid.data(), DType::f32, R, H), host_view(in.W.data(), DType::f32, V, H),
                   host_view(in.labels.data(), DType::i32, 1, R),
                   host_view(in.active.data(), DType::u8, 1, R),
                   kind == LmLossKind::kl ? host_view(in.tgt.data(), DType::f32, R, H) : Tensor{}, kind,
                   host_view(o.loss.data(), DType::f32, 1, R), host_view(o.p_label.data(), DType::f32, 1, R),
                   host_view(o.argmax.data(), DType::i32, 1, R), host_view(o.dh.data(), DType::f32, R, H));
  return o;
}

// Per active row: what the tolerances need, from logits computed in double from the same bf16 inputs.
struct RowBounds {
  double dz_d = 0, dz_t = 0;  // bound on |z_gpu − z_cpu| for the draft and the target logits
  double z_max = 0;
  std::vector<double> z;  // exact draft logits
  double loss_tol = 0, p_tol = 0;
  std::vector<double> dh_tol;  // [H]
};

RowBounds row_bounds(const LossInputs& in, LmLossKind kind, int64_t r, double loss_ref) {
  const int64_t H = in.H, V = in.V;
  const bool kl = kind == LmLossKind::kl;
  RowBounds b;
  b.z.assign(size_t(V), 0.0);
  std::vector<double> y(kl ? size_t(V) : 0);
  double a_d = 0, a_t = 0;
  for (int64_t v = 0; v < V; ++v) {
    double s = 0, sa = 0, t = 0, ta = 0;
    for (int64_t h = 0; h < H; ++h) {
      const double w = in.W[size_t(v * H + h)], x = in.hid[size_t(r * H + h)];
      s += x * w, sa += std::fabs(x * w);
      if (kl) {
        const double xt = in.tgt[size_t(r * H + h)];
        t += xt * w, ta += std::fabs(xt * w);
      }
    }
    b.z[size_t(v)] = s;
    a_d = std::max(a_d, sa);
    if (kl) y[size_t(v)] = t, a_t = std::max(a_t, ta);
  }
  b.dz_d = 3.0 * double(H) * kU * a_d;
  b.dz_t = 3.0 * double(H) * kU * a_t;
  b.z_max = *std::max_element(b.z.begin(), b.z.end());
  auto log_sum = [&](const std::vector<double>& l, double m) {
    double s = 0;
    for (double x : l) s += std::exp(x - m);
    return std::log(s);
  };
  const double ls_d = log_sum(b.z, b.z_max), y_max = kl ? *std::max_element(y.begin(), y.end()) : 0.0;
  const double ls_t = kl ? log_sum(y, y_max) : 0.0;
  const int32_t lab = in.labels[size_t(r)];
  // Per v: g = ∂loss/∂z, pp = p_d + p_t, sat = p_d(1 − p_d) + p_t(1 − p_t). Logits that move by Δz ≤ dz
  // move p_v by p_v·(Δz_v − E_p[Δz]) = p_v·Σ_u p_u(Δz_v − Δz_u), at most 2·dz·p_v(1 − p_v) to first order
  // (a saturated softmax hardly moves); 10 % over 2·dz and 2·dz²·p_v cover the higher orders.
  std::vector<double> g(static_cast<size_t>(V)), pp(static_cast<size_t>(V)), sat(static_cast<size_t>(V));
  double kl_val = 0, sens_d = 0, sens_t = 0, e_abs = 0;
  for (int64_t v = 0; v < V; ++v) {
    const double lpd = b.z[size_t(v)] - b.z_max - ls_d, pd = std::exp(lpd);
    const double lpt = kl ? y[size_t(v)] - y_max - ls_t : 0.0, pt = kl ? std::exp(lpt) : 0.0;
    g[size_t(v)] = kl ? pd - pt : pd - (v == lab ? 1.0 : 0.0);
    pp[size_t(v)] = pd + pt;
    sat[size_t(v)] = pd * (1 - pd) + pt * (1 - pt);
    if (kl) {
      kl_val += pt * (lpt - lpd);
      sens_d += std::fabs(pd - pt);
      e_abs += pt * std::fabs(y[size_t(v)] - b.z[size_t(v)]);
    }
  }
  const double p_lab = std::exp(b.z[size_t(lab)] - b.z_max - ls_d), dz = std::max(b.dz_d, b.dz_t);
  if (kl) {
    // ∂KL/∂z_v = p_d − p_t and ∂KL/∂y_v = p_t·(log p_t − log p_d − KL): first order, 10 % for the rest.
    for (int64_t v = 0; v < V; ++v) {
      const double lpd = b.z[size_t(v)] - b.z_max - ls_d, lpt = y[size_t(v)] - y_max - ls_t;
      sens_t += std::exp(lpt) * std::fabs(lpt - lpd - kl_val);
    }
    const double mag = 1 + e_abs + std::fabs(y_max - b.z_max) + std::fabs(ls_d) + std::fabs(ls_t);
    b.loss_tol = 1.1 * (sens_d * b.dz_d + sens_t * b.dz_t) + kRed * mag;
  } else {
    // lse − z_label moves by E_p[Δz] − Δz_label = Σ_u p_u(Δz_u − Δz_label), at most (1 − p_label)·2·dz.
    b.loss_tol = 2.2 * (1 - p_lab) * b.dz_d + 2 * b.dz_d * b.dz_d + kRed * (1.0 + std::fabs(loss_ref));
  }
  // p_label: the same first-order move, p(1 − p)·2·dz, plus the fast exp on an argument of size |log p|;
  // FLT_MIN because the GPU flushes subnormal results to zero.
  b.p_tol = p_lab * ((1 - p_lab) * 2.2 * b.dz_d + 2 * b.dz_d * b.dz_d +
                     kRed * (2.0 + std::fabs(std::log(std::max(p_lab, 1e-300))))) +
            FLT_MIN;
  // dhidden_h = Σ_v g_v·W_vh: g rounded to bf16 (kUb·|g_v|), g moved by the logits (sat above, and kRed·p
  // for the GPU's reductions), the V-term sums of both sides (3·V·kU·Σ|g·W|), and the bf16 output
  // (kUb·|dh|, added at the comparison).
  b.dh_tol.assign(size_t(H), 0.0);
  for (int64_t h = 0; h < H; ++h) {
    double b1 = 0, b2 = 0, b3 = 0;
    for (int64_t v = 0; v < V; ++v) {
      const double w = std::fabs(double(in.W[size_t(v * H + h)]));
      b1 += std::fabs(g[size_t(v)]) * w;
      b2 += sat[size_t(v)] * w;
      b3 += pp[size_t(v)] * w;
    }
    b.dh_tol[size_t(h)] =
        1.01 * (kUb + 3.0 * double(V) * kU) * b1 + 2.2 * dz * b2 + (kRed + 2 * dz * dz) * b3;
  }
  return b;
}

// Worst error of one output over the rows, as a fraction of its tolerance, for the report line.
struct Worst {
  double err = 0, tol = 0, ratio = -1;
  int64_t row = -1, col = -1;
  double got = 0, want = 0;
  void see(double e, double t, int64_t r, int64_t c, double g, double w) {
    const double q = std::isnan(g) ? INFINITY : t > 0 ? e / t : (e > 0 ? INFINITY : 0);
    if (q <= ratio) return;
    ratio = q, err = e, tol = t, row = r, col = c, got = g, want = w;
  }
};

int64_t compare(const LossInputs& in, LmLossKind kind, const LossOutputs& gpu, const LossOutputs& cpu,
                const std::string& what) {
  const int64_t R = in.rows, H = in.H, V = in.V;
  int64_t bad = 0;
  auto fail = [&](const std::string& msg) {
    if (bad++ < 8) ADD_FAILURE() << what << ": " << msg;
  };
  Worst wl, wp, wd;
  for (int64_t r = 0; r < R; ++r) {
    const size_t ur = size_t(r);
    if (!in.active[ur]) {
      if (gpu.loss[ur] != 0.0f || gpu.p_label[ur] != 0.0f || gpu.argmax[ur] != -1)
        fail("inactive row " + std::to_string(r) + ": loss " + std::to_string(gpu.loss[ur]) + " p_label " +
             std::to_string(gpu.p_label[ur]) + " argmax " + std::to_string(gpu.argmax[ur]) + ", want 0 0 -1");
      for (int64_t h = 0; h < H; ++h)
        if (gpu.dh[size_t(r * H + h)] != 0.0f)
          fail("inactive row " + std::to_string(r) + " dhidden[" + std::to_string(h) +
               "] = " + std::to_string(gpu.dh[size_t(r * H + h)]) + ", want 0");
      continue;
    }
    const RowBounds b = row_bounds(in, kind, r, cpu.loss[ur]);
    const double el = std::fabs(double(gpu.loss[ur]) - cpu.loss[ur]);
    wl.see(el, b.loss_tol, r, -1, gpu.loss[ur], cpu.loss[ur]);
    if (!(el <= b.loss_tol))
      fail("row " + std::to_string(r) + " loss " + std::to_string(gpu.loss[ur]) + " want " +
           std::to_string(cpu.loss[ur]) + " (tol " + std::to_string(b.loss_tol) + ")");
    const double ep = std::fabs(double(gpu.p_label[ur]) - cpu.p_label[ur]);
    wp.see(ep, b.p_tol, r, -1, gpu.p_label[ur], cpu.p_label[ur]);
    if (!(ep <= b.p_tol))
      fail("row " + std::to_string(r) + " p_label " + std::to_string(gpu.p_label[ur]) + " want " +
           std::to_string(cpu.p_label[ur]) + " (tol " + std::to_string(b.p_tol) + ")");
    // The GPU's pick must be a maximum up to the logits' error: z[a] ≥ max z − dz (exact ties: own test).
    const int32_t a = gpu.argmax[ur];
    if (a < 0 || a >= V || !(b.z[size_t(a)] >= b.z_max - b.dz_d))
      fail("row " + std::to_string(r) + " argmax " + std::to_string(a) + " (cpu " +
           std::to_string(cpu.argmax[ur]) + ") is not a maximum: z " +
           (a >= 0 && a < V ? std::to_string(b.z[size_t(a)]) : "-") + " vs max " + std::to_string(b.z_max) +
           " (dz " + std::to_string(b.dz_d) + ")");
    for (int64_t h = 0; h < H; ++h) {
      const double got = gpu.dh[size_t(r * H + h)], want = cpu.dh[size_t(r * H + h)];
      const double tol = b.dh_tol[size_t(h)] + 1.01 * kUb * std::fabs(want), e = std::fabs(got - want);
      wd.see(e, tol, r, h, got, want);
      if (!(e <= tol))
        fail("dhidden[" + std::to_string(r) + ", " + std::to_string(h) + "] of [" + std::to_string(R) + ", " +
             std::to_string(H) + "] = " + std::to_string(got) + " want " + std::to_string(want) + " (tol " +
             std::to_string(tol) + ")");
    }
  }
  if (gpu.guards_clobbered) fail(std::to_string(gpu.guards_clobbered) + " dhidden padding elements written");
  for (const auto& [name, w] : {std::pair{"loss", &wl}, {"p_label", &wp}, {"dhidden", &wd}})
    if (w->row >= 0)
      std::printf("[ maxerr ] %-44s %-8s |err| %.2e = %.2f of tol at row %lld col %lld (gpu %.6g cpu %.6g)\n",
                  what.c_str(), name, w->err, w->ratio, (long long)w->row, (long long)w->col, w->got,
                  w->want);
  return bad;
}

std::string case_name(LmLossKind kind, int64_t rows, int64_t H, int64_t V, int64_t chunk) {
  return std::string(kind == LmLossKind::kl ? "kl" : "ce") + " rows " + std::to_string(rows) + " H " +
         std::to_string(H) + " V " + std::to_string(V) + " chunk " + std::to_string(chunk);
}

class LmHeadLossCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports 0): GPU test skipped";
    gpu_ = std::make_unique<CudaOps>(0);
    gemm_ = gemm_init();
  }
  void TearDown() override {
    if (gemm_) gemm_free(gemm_);
  }

  // Device memory freed at scope exit, filled with `poison` bytes (0xff: NaN for f32 and bf16).
  struct Buf {
    CudaOps* ops;
    void* p;
    // On the ops' stream, which does not wait for the legacy default stream a plain cudaMemset would use.
    Buf(CudaOps* o, size_t bytes, int poison) : ops(o), p(o->alloc_bytes(std::max<size_t>(bytes, 1))) {
      EXPECT_EQ(cudaMemsetAsync(p, poison, std::max<size_t>(bytes, 1), o->stream()), cudaSuccess);
    }
    Buf(const Buf&) = delete;
    ~Buf() { ops->free_bytes(p); }
    template <class T>
    T* as() const {
      return static_cast<T*>(p);
    }
  };

  // The launcher on the GPU; hidden, target and dhidden rows have stride H + pad.
  LossOutputs run_gpu(const LossInputs& in, LmLossKind kind, int64_t chunk, int64_t pad,
                      size_t ws_short = 0) {
    const int64_t R = in.rows, H = in.H, V = in.V, ld = H + pad;
    const bool kl = kind == LmLossKind::kl;
    CudaOps* g = gpu_.get();
    Buf hid(g, size_t(R * ld) * 2, 0xff), tgt(g, size_t(R * ld) * 2, 0xff), W(g, size_t(V * H) * 2, 0xff);
    Buf lab(g, size_t(R) * 4, 0), act(g, size_t(R), 0), loss(g, size_t(R) * 4, 0xff),
        pl(g, size_t(R) * 4, 0xff);
    Buf am(g, size_t(R) * 4, 0x7f), dh(g, size_t(R * ld) * 2, 0xff);
    const size_t ws_bytes = lm_head_loss_workspace_bytes(R, H, V, chunk, kl);
    Buf ws(g, ws_bytes, 0xff);
    auto dev = [](const Buf& b, DType dt, int64_t rows, int64_t cols) {
      return tensor_make(b.p, dt, Device::cuda, rows, cols);
    };
    g->upload_f32(dev(hid, DType::bf16, R, ld).cols_view(0, H), in.hid.data());
    g->upload_f32(dev(tgt, DType::bf16, R, ld).cols_view(0, H), in.tgt.data());
    g->upload_f32(dev(W, DType::bf16, V, H), in.W.data());
    g->upload_raw(dev(lab, DType::i32, 1, R), in.labels.data());
    g->upload_raw(dev(act, DType::u8, 1, R), in.active.data());
    // Odd chunks run with the host-known active count (the GEMMs stop there), even ones without: both paths.
    int64_t max_active = -1;
    if (chunk % 2 == 1) max_active = std::count(in.active.begin(), in.active.end(), uint8_t(1));
    lm_head_loss_launch(gemm_, hid.as<bf16>(), ld, W.as<bf16>(), H, lab.as<int32_t>(), act.as<uint8_t>(),
                        kl ? tgt.as<bf16>() : nullptr, ld, kl, loss.as<float>(), pl.as<float>(),
                        am.as<int32_t>(), dh.as<bf16>(), ld, R, H, V, chunk, max_active, ws.p,
                        ws_bytes - ws_short, g->stream());
    EXPECT_EQ(cudaStreamSynchronize(g->stream()), cudaSuccess);
    LossOutputs o;
    o.loss.resize(size_t(R)), o.p_label.resize(size_t(R)), o.argmax.resize(size_t(R));
    g->download_f32(dev(loss, DType::f32, 1, R), o.loss.data());
    g->download_f32(dev(pl, DType::f32, 1, R), o.p_label.data());
    g->download_raw(dev(am, DType::i32, 1, R), o.argmax.data());
    std::vector<float> full(size_t(R * ld));
    g->download_f32(dev(dh, DType::bf16, R, ld), full.data());
    for (int64_t r = 0; r < R; ++r) {
      o.dh.insert(o.dh.end(), full.begin() + r * ld, full.begin() + r * ld + H);
      for (int64_t c = H; c < ld; ++c) o.guards_clobbered += !std::isnan(full[size_t(r * ld + c)]);
    }
    return o;
  }

  void check_case(const LossInputs& in, LmLossKind kind, int64_t chunk, int64_t pad) {
    const std::string what = case_name(kind, in.rows, in.H, in.V, chunk) + (pad ? " strided" : "");
    EXPECT_EQ(compare(in, kind, run_gpu(in, kind, chunk, pad), run_cpu(in, kind), what), 0);
  }

  std::unique_ptr<CudaOps> gpu_;
  GemmContext* gemm_ = nullptr;
};

}  // namespace

// rows 1/7/130, H 5/64/130, V 65/1000/32003 (1 and 4 CTAs per row) and 70001 (8 CTAs, uneven slices),
// chunk 1/3/64 and larger than rows, 2500 rows (3 per thread of the compaction scan); odd strides take the
// element-wise gather, multiples of 8 the vector one.
TEST_F(LmHeadLossCuda, MatchesCpuOnAwkwardShapes) {
  struct Shape {
    int64_t rows, H, V, chunk, pad;
  };
  const Shape shapes[] = {{1, 5, 65, 1, 0},        {7, 5, 65, 64, 3},     {7, 64, 1000, 3, 0},
                          {130, 130, 1000, 64, 3}, {130, 64, 1000, 1, 8}, {7, 130, 32003, 3, 0},
                          {130, 64, 32003, 64, 0}, {7, 64, 70001, 3, 8},  {130, 5, 65, 200, 0},
                          {2500, 8, 65, 1000, 0}};
  uint32_t seed = 1;
  for (const Shape& s : shapes) {
    const LossInputs in = make_inputs(s.rows, s.H, s.V, 1.0f, 1.0f, seed++);
    for (LmLossKind kind : {LmLossKind::ce, LmLossKind::kl}) check_case(in, kind, s.chunk, s.pad);
  }
}

TEST_F(LmHeadLossCuda, NoActiveRowWritesZerosAndMinusOne) {
  LossInputs in = make_inputs(7, 64, 1000, 1.0f, 1.0f, 11);
  std::fill(in.active.begin(), in.active.end(), 0);
  for (LmLossKind kind : {LmLossKind::ce, LmLossKind::kl})
    EXPECT_EQ(compare(in, kind, run_gpu(in, kind, 3, 8), run_cpu(in, kind), case_name(kind, 7, 64, 1000, 3)),
              0);
}

TEST_F(LmHeadLossCuda, LabelsAtBothEndsOfTheVocabulary) {
  for (int64_t V : {int64_t(65), int64_t(32003)}) {
    LossInputs in = make_inputs(7, 64, V, 1.0f, 1.0f, 12);
    for (int64_t r = 0; r < in.rows; ++r)
      in.labels[size_t(r)] = r % 2 ? int32_t(V - 1) : 0, in.active[size_t(r)] = 1;
    for (LmLossKind kind : {LmLossKind::ce, LmLossKind::kl}) check_case(in, kind, 3, 0);
  }
}

// Three all-ones lm_head rows against positive rows of bf16 values in [0.5, 1]: their logit is a sum of 64
// multiples of 2^-8 below 64, exact in fp32 in any order, so the tie is exact on both backends and the lowest
// id must win. The ids sit in different threads and, at V = 70001, in different CTAs of the row's cluster.
TEST_F(LmHeadLossCuda, ArgmaxTiesGoToTheLowestId) {
  for (int64_t V : {int64_t(1000), int64_t(70001)}) {
    const int64_t H = 64;
    LossInputs in = make_inputs(7, H, V, 1.0f, 1.0f, 13);
    for (float& x : in.hid) x = bf16_round(std::fabs(x) * 0.5f + 0.5f);
    in.tgt = in.hid;
    const int64_t dups[] = {V / 2 + 1, 3, V - 1};
    for (int64_t v : dups) std::fill_n(in.W.begin() + v * H, H, 1.0f);
    std::fill(in.active.begin(), in.active.end(), 1);
    for (LmLossKind kind : {LmLossKind::ce, LmLossKind::kl}) {
      const LossOutputs gpu = run_gpu(in, kind, 3, 0), cpu = run_cpu(in, kind);
      for (int64_t r = 0; r < in.rows; ++r) {
        EXPECT_EQ(cpu.argmax[size_t(r)], 3) << "CPU oracle, row " << r << " V " << V;
        EXPECT_EQ(gpu.argmax[size_t(r)], 3)
            << "row " << r << " V " << V << ": tie of ids 3, " << V / 2 + 1 << ", " << V - 1;
      }
      EXPECT_EQ(compare(in, kind, gpu, cpu, case_name(kind, 7, H, V, 3) + " ties"), 0);
    }
  }
}

// Logits in the thousands (|x| ≤ 64, |W| ≤ 4, H 130): exp of them would overflow fp32 many times over.
TEST_F(LmHeadLossCuda, HugeLogitsStayFinite) {
  const LossInputs in = make_inputs(7, 130, 1000, 64.0f, 4.0f, 14);
  for (LmLossKind kind : {LmLossKind::ce, LmLossKind::kl}) {
    const LossOutputs gpu = run_gpu(in, kind, 3, 0);
    for (int64_t r = 0; r < in.rows; ++r) EXPECT_TRUE(std::isfinite(gpu.loss[size_t(r)])) << "row " << r;
    EXPECT_EQ(compare(in, kind, gpu, run_cpu(in, kind), case_name(kind, 7, 130, 1000, 3) + " huge"), 0);
  }
}

// Documented in lm_head_loss.cu: the device cannot raise, so a label outside the vocabulary shows as NaN.
TEST_F(LmHeadLossCuda, LabelOutsideTheVocabularyGivesNaN) {
  LossInputs in = make_inputs(7, 64, 1000, 1.0f, 1.0f, 15);
  in.active[3] = 1;
  in.labels[3] = 1000;
  const LossOutputs gpu = run_gpu(in, LmLossKind::ce, 3, 0);
  EXPECT_TRUE(std::isnan(gpu.loss[3])) << gpu.loss[3];
  EXPECT_TRUE(std::isnan(gpu.p_label[3])) << gpu.p_label[3];
  for (int64_t r = 0; r < in.rows; ++r)
    if (r != 3 && in.active[size_t(r)]) EXPECT_TRUE(std::isfinite(gpu.loss[size_t(r)])) << "row " << r;
}

// Same inputs and chunk, same bits (train_ops.h, Determinism).
TEST_F(LmHeadLossCuda, RepeatIsBitIdentical) {
  const LossInputs in = make_inputs(130, 64, 32003, 1.0f, 1.0f, 16);
  for (LmLossKind kind : {LmLossKind::ce, LmLossKind::kl}) {
    const LossOutputs a = run_gpu(in, kind, 64, 0), b = run_gpu(in, kind, 64, 0);
    EXPECT_EQ(std::memcmp(a.loss.data(), b.loss.data(), a.loss.size() * 4), 0);
    EXPECT_EQ(std::memcmp(a.p_label.data(), b.p_label.data(), a.p_label.size() * 4), 0);
    EXPECT_EQ(a.argmax, b.argmax);
    EXPECT_EQ(std::memcmp(a.dh.data(), b.dh.data(), a.dh.size() * 4), 0);
  }
}

TEST_F(LmHeadLossCuda, UndersizedWorkspaceIsAnError) {
  const LossInputs in = make_inputs(7, 64, 1000, 1.0f, 1.0f, 17);
  try {
    run_gpu(in, LmLossKind::ce, 3, 0, 1);
    ADD_FAILURE() << "a workspace one byte short was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("lm_head_loss_workspace_bytes"), std::string::npos) << e.what();
  }
}

#endif  // DF_HAVE_CUDA
