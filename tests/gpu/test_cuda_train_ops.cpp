// Every CudaTrainOps op except DFlash attention and the lm_head loss (their kernels have their own tests)
// against CpuTrainOps, the fp32 oracle, run on the same bf16-representable inputs so that only the GPU's
// output rounding and accumulation order remain. Awkward sizes, strided GPU views, NaN-poisoned outputs; each
// failure prints the worst element with its (row, col), the shape and both values. Skips without a GPU.
#include <gtest/gtest.h>

#ifndef DF_HAVE_CUDA
TEST(CudaTrainOpsTest, SkippedWithoutCudaBuild) {
  GTEST_SKIP() << "built without CUDA: GPU training-op tests skipped";
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
#include <vector>

#include "core/dtype.h"
#include "core/rng.h"
#include "ops/cpu/cpu_train_ops.h"
#include "ops/cuda/cuda_train_ops.h"

using namespace df;

namespace {

// bf16 keeps 8 significant bits: rounding to nearest moves a value by at most 2^-8 of itself. One such
// rounding of every GPU output (the CPU keeps f32) is the floor of each tolerance below.
constexpr double kBf16Rel = 1.0 / 256.0;
// One f32 rounding (unit roundoff). A sequential f32 sum of n terms is off by at most (n − 1)·kF32·Σ|terms|,
// the bound the reduction tolerances use, with Σ|terms| computed from the inputs.
constexpr double kF32 = 1.0 / 16777216.0;

std::string shape_name(const char* op, std::initializer_list<int64_t> sizes) {
  std::string s = op;
  for (int64_t v : sizes) s += " " + std::to_string(v);
  return s;
}

// |got − want| ≤ atol + rtol·|want| + mag_rel·mag[i] (mag: a per-element magnitude the rounding error scales
// with, e.g. Σ|terms| of a reduction; may be empty). Reports the element with the worst error/tolerance
// ratio.
void expect_close(const std::vector<float>& got, const std::vector<float>& want, int64_t rows, int64_t cols,
                  double atol, double rtol, const std::string& what, const std::vector<double>& mag = {},
                  double mag_rel = 0.0) {
  ASSERT_EQ(got.size(), size_t(rows * cols)) << what;
  ASSERT_EQ(want.size(), got.size()) << what;
  int64_t bad = 0, worst = -1;
  double worst_ratio = -1.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - double(want[i]));
    const double tol = atol + rtol * std::fabs(double(want[i])) + (mag.empty() ? 0.0 : mag_rel * mag[i]);
    const bool ok = std::isfinite(got[i]) && err <= tol;
    const double ratio = std::isfinite(got[i]) ? err / std::max(tol, 1e-300) : INFINITY;
    if (!ok) ++bad;
    if (ratio > worst_ratio) worst_ratio = ratio, worst = int64_t(i);
  }
  if (worst < 0) return;
  const size_t w = size_t(worst);
  const double tol_w = atol + rtol * std::fabs(double(want[w])) + (mag.empty() ? 0.0 : mag_rel * mag[w]);
  std::printf("[ maxerr ] %-44s [%lld, %lld] worst (%lld, %lld): gpu %.9g cpu %.9g |err| %.3e tol %.3e\n",
              what.c_str(), (long long)rows, (long long)cols, (long long)(worst / cols),
              (long long)(worst % cols), got[w], want[w], std::fabs(double(got[w]) - double(want[w])), tol_w);
  EXPECT_EQ(bad, 0) << what << " [" << rows << ", " << cols << "]: " << bad << " of " << got.size()
                    << " elements outside |err| <= " << atol << " + " << rtol << "·|cpu|"
                    << (mag.empty() ? "" : " + mag_rel·mag") << "; worst at (" << worst / cols << ", "
                    << worst % cols << "): gpu " << got[w] << " cpu " << want[w] << " tol " << tol_w;
}

void expect_equal(const std::vector<float>& got, const std::vector<float>& want, int64_t rows, int64_t cols,
                  const std::string& what) {
  expect_close(got, want, rows, cols, 0.0, 0.0, what);
}

// The same bit patterns element by element (NaN poison and the sign of zero included), for the forms that
// claim identical bits.
void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, int64_t cols,
                      const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && bad++ == 0) first = int64_t(i);
  if (bad == 0) return;
  const size_t f = size_t(first);
  ADD_FAILURE() << what << ": " << bad << " of " << got.size() << " elements differ in their bits; first at ("
                << first / cols << ", " << first % cols << "): " << got[f] << " vs " << want[f];
}

// Error magnitudes of the RMSNorm backward per element (row-major [rows, cols]): dx_i = r·(dy_i·w_i − x̂_i·m)
// with m an f32 mean over the row (error ≤ cols·kF32·Σ|dy·w·x̂|/cols), dw_c an f32 sum over rows (error ≤
// (rows + 1)·kF32·Σ_r|dy·x̂|).
void rmsnorm_bwd_magnitudes(const std::vector<float>& x, const std::vector<float>& w,
                            const std::vector<float>& dy, const std::vector<float>& rs, int64_t rows,
                            int64_t cols, std::vector<double>& mag_dx, std::vector<double>& mag_dw) {
  mag_dx.assign(size_t(rows * cols), 0.0);
  mag_dw.assign(size_t(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    double sabs = 0;
    for (int64_t c = 0; c < cols; ++c)
      sabs += std::fabs(double(dy[r * cols + c]) * w[c] * x[r * cols + c] * rs[r]);
    for (int64_t c = 0; c < cols; ++c) {
      const double xh = std::fabs(double(x[r * cols + c]) * rs[r]);
      mag_dx[size_t(r * cols + c)] = rs[r] * (std::fabs(double(dy[r * cols + c]) * w[c]) + xh * sabs / cols);
      mag_dw[size_t(c)] += std::fabs(double(dy[r * cols + c])) * xh;
    }
  }
}

// The same for the QK-norm + RoPE backward (x, dy [rows, heads·hd], rs [rows, heads]): dz_i = RoPEᵀ·dy is
// bounded by |dy_i| + |dy_p| (p the RoPE partner); dx and dw follow the RMSNorm backward's bounds with that
// dz, dw summing rows·heads terms.
void qk_norm_rope_bwd_magnitudes(const std::vector<float>& x, const std::vector<float>& w,
                                 const std::vector<float>& dy, const std::vector<float>& rs, int64_t rows,
                                 int heads, int hd, std::vector<double>& mag_dx,
                                 std::vector<double>& mag_dw) {
  const int64_t cols = int64_t(heads) * hd;
  const int half = hd / 2;
  mag_dx.assign(size_t(rows * cols), 0.0);
  mag_dw.assign(size_t(hd), 0.0);
  std::vector<double> dz(static_cast<size_t>(hd));
  for (int64_t r = 0; r < rows; ++r)
    for (int h = 0; h < heads; ++h) {
      const int64_t o = r * cols + h * hd;
      const double rr = rs[r * heads + h];
      double sabs = 0;
      for (int i = 0; i < hd; ++i) {
        const int p = i < half ? i + half : i - half;
        dz[size_t(i)] = std::fabs(double(dy[o + i])) + std::fabs(double(dy[o + p]));
        sabs += dz[size_t(i)] * w[i] * std::fabs(double(x[o + i])) * rr;
      }
      for (int i = 0; i < hd; ++i) {
        const double xh = std::fabs(double(x[o + i])) * rr;
        mag_dx[size_t(o + i)] = rr * (dz[size_t(i)] * w[i] + xh * sabs / hd);
        mag_dw[size_t(i)] += dz[size_t(i)] * xh;
      }
    }
}

class CudaTrainOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports 0): GPU test skipped";
    gpu_ = std::make_unique<CudaTrainOps>(0);
  }
  void TearDown() override {
    if (!gpu_) return;
    for (void* p : gpu_mem_) gpu_->free_bytes(p);
  }

  // Uniform values rounded to bf16, so the CPU reads exactly what the GPU reads.
  std::vector<float> rnd(int64_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = bf16_round(d(rng_));
    return v;
  }
  // A host f32 tensor holding `vals` (owned by the fixture).
  Tensor cpu(int64_t rows, int64_t cols, const std::vector<float>& vals) {
    cpu_mem_.push_back(std::make_unique<std::vector<float> >(vals));
    cpu_mem_.back()->resize(size_t(rows * cols) + 1);
    return tensor_make(cpu_mem_.back()->data(), DType::f32, Device::cpu, rows, cols);
  }
  // A device tensor of dtype dt, a column view of a buffer pad columns wider (pad > 0: strided), everything
  // poisoned with all-ones bytes (NaN for f32/bf16) so unwritten elements fail; vals uploaded when given.
  Tensor dev(DType dt, int64_t rows, int64_t cols, int64_t pad = 0,
             const std::vector<float>* vals = nullptr) {
    const size_t bytes = size_t(std::max<int64_t>(1, rows * (cols + pad))) * dtype_size(dt);
    void* p = gpu_->alloc_bytes(bytes);
    gpu_mem_.push_back(p);
    EXPECT_EQ(cudaMemsetAsync(p, 0xff, bytes, gpu_->stream()), cudaSuccess);
    Tensor t = tensor_make(p, dt, Device::cuda, rows, cols + pad).cols_view(pad / 2, cols);
    if (vals) upload(t, *vals);
    return t;
  }
  // The whole buffer behind dev(dt, rows, cols, pad): the view and its padding columns.
  static Tensor padded(const Tensor& view, int64_t pad) {
    return tensor_make(static_cast<char*>(view.data) - (pad / 2) * dtype_size(view.dtype), view.dtype,
                       Device::cuda, view.rows, view.cols + pad);
  }
  void upload(const Tensor& t, const std::vector<float>& v) {
    if (t.dtype == DType::f32) return gpu_->upload_raw(t, v.data());
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
    gpu_->upload_raw(t, h.data());
  }
  Tensor dev_i32(const std::vector<int32_t>& v) {
    Tensor t = dev(DType::i32, 1, int64_t(v.size()));
    gpu_->upload_raw(t, v.data());
    return t;
  }
  std::vector<float> down(const Tensor& t) {
    std::vector<float> h(static_cast<size_t>(t.numel()));
    if (t.dtype == DType::f32) {
      gpu_->download_raw(t, h.data());
      return h;
    }
    std::vector<uint16_t> b(h.size());
    gpu_->download_raw(t, b.data());
    for (size_t i = 0; i < h.size(); ++i) h[i] = bf16_to_f32(b[i]);
    return h;
  }
  static std::vector<float> host(const Tensor& t) {
    std::vector<float> h(static_cast<size_t>(t.numel()));
    for (int64_t r = 0; r < t.rows; ++r)
      std::memcpy(&h[size_t(r * t.cols)], t.row_bytes(r), size_t(t.cols) * sizeof(float));
    return h;
  }

  std::mt19937 rng_{20261201};
  CpuTrainOps cpu_ops_;
  std::unique_ptr<CudaTrainOps> gpu_;
  std::vector<void*> gpu_mem_;
  std::vector<std::unique_ptr<std::vector<float> > > cpu_mem_;
};

// ---- memory
// -------------------------------------------------------------------------------------------------

TEST_F(CudaTrainOpsTest, AllocIsZeroFilledAndRawBytesRoundTrip) {
  // Dirty a block, free it and allocate again: the allocator tends to hand the same memory back.
  void* p = gpu_->alloc_bytes(1 << 20);
  ASSERT_EQ(cudaMemsetAsync(p, 0xab, 1 << 20, gpu_->stream()), cudaSuccess);
  gpu_->free_bytes(p);
  void* q = gpu_->alloc_bytes(1 << 20);
  std::vector<uint8_t> h(1 << 20, 1);
  ASSERT_EQ(cudaMemcpyAsync(h.data(), q, h.size(), cudaMemcpyDeviceToHost, gpu_->stream()), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(gpu_->stream()), cudaSuccess);
  gpu_->free_bytes(q);
  EXPECT_EQ(std::count(h.begin(), h.end(), uint8_t(0)), int64_t(h.size())) << "alloc_bytes must zero-fill";

  // Raw bytes of i32, u8 and bf16 through strided views come back exactly.
  for (int64_t rows : {1, 7, 19}) {
    std::vector<int32_t> iv(static_cast<size_t>(rows * 5));
    for (size_t i = 0; i < iv.size(); ++i) iv[i] = int32_t(i * 2654435761u);
    Tensor ti = dev(DType::i32, rows, 5, 3);
    gpu_->upload_raw(ti, iv.data());
    std::vector<int32_t> ib(iv.size());
    gpu_->download_raw(ti, ib.data());
    EXPECT_EQ(ib, iv) << "i32 round trip, rows " << rows;
    std::vector<uint8_t> uv(static_cast<size_t>(rows * 130));
    for (size_t i = 0; i < uv.size(); ++i) uv[i] = uint8_t(i * 7);
    Tensor tu = dev(DType::u8, rows, 130, 6);
    gpu_->upload_raw(tu, uv.data());
    std::vector<uint8_t> ub(uv.size());
    gpu_->download_raw(tu, ub.data());
    EXPECT_EQ(ub, uv) << "u8 round trip, rows " << rows;
  }
}

TEST_F(CudaTrainOpsTest, FillAndCopyAreExact) {
  for (int64_t rows : {1, 7, 733})
    for (int64_t cols : {5, 130, 1024}) {
      const std::string sz = " " + std::to_string(rows) + "x" + std::to_string(cols);
      // 1024 columns: an aligned strided view, which fill runs with 16-byte stores.
      const int64_t fpad = cols % 8 == 0 ? 16 : 4;
      Tensor f = dev(DType::f32, rows, cols, fpad), b = dev(DType::bf16, rows, cols, fpad);
      gpu_->fill(f, 0.3f);
      gpu_->fill(b, -1.7f);
      expect_equal(down(f), std::vector<float>(size_t(rows * cols), 0.3f), rows, cols, "fill f32" + sz);
      expect_equal(down(b), std::vector<float>(size_t(rows * cols), bf16_round(-1.7f)), rows, cols,
                   "fill bf16" + sz);

      // Not bf16-rounded: f32 -> bf16 must round to nearest even exactly like f32_to_bf16.
      std::uniform_real_distribution<float> d(-3.0f, 3.0f);
      std::vector<float> v(static_cast<size_t>(rows * cols));
      for (float& x : v) x = d(rng_);
      std::vector<float> vb(v.size());
      for (size_t i = 0; i < v.size(); ++i) vb[i] = bf16_round(v[i]);
      Tensor src = dev(DType::f32, rows, cols, 2, &v);
      Tensor to_b = dev(DType::bf16, rows, cols, 6), to_f = dev(DType::f32, rows, cols, 1);
      Tensor same_b = dev(DType::bf16, rows, cols, 0), same_f = dev(DType::f32, rows, cols, 8);
      gpu_->copy(src, to_b);
      gpu_->copy(to_b, to_f);
      gpu_->copy(to_b, same_b);
      gpu_->copy(src, same_f);
      expect_equal(down(to_b), vb, rows, cols, "copy f32->bf16" + sz);
      expect_equal(down(to_f), vb, rows, cols, "copy bf16->f32" + sz);
      expect_equal(down(same_b), vb, rows, cols, "copy bf16->bf16" + sz);
      expect_equal(down(same_f), v, rows, cols, "copy f32->f32" + sz);
    }
}

// ---- dense
// --------------------------------------------------------------------------------------------------

TEST_F(CudaTrainOpsTest, GemmAllTransposesAlphaBeta) {
  struct Shape {
    int64_t m, n, k;
  };
  for (Shape s : {Shape{1, 5, 7}, Shape{19, 130, 64}, Shape{733, 64, 130}, Shape{7, 1, 733}})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (DType cdt : {DType::f32, DType::bf16})
          for (float beta : {0.0f, 1.0f, 0.75f}) {
            const float alpha = beta == 0.75f ? -0.5f : 1.0f;
            const int64_t ar = ta ? s.k : s.m, ac = ta ? s.m : s.k, br = tb ? s.n : s.k, bc = tb ? s.k : s.n;
            std::vector<float> a = rnd(ar * ac, -1, 1), b = rnd(br * bc, -1, 1), c0 = rnd(s.m * s.n, -1, 1);
            Tensor ca = cpu(ar, ac, a), cb = cpu(br, bc, b), cc = cpu(s.m, s.n, c0);
            Tensor ga = dev(DType::bf16, ar, ac, 8, &a), gb = dev(DType::bf16, br, bc, 0, &b);
            Tensor gc = dev(cdt, s.m, s.n, cdt == DType::f32 ? 4 : 8, &c0);
            cpu_ops_.gemm(ca, ta, cb, tb, cc, alpha, beta);
            gpu_->gemm(ga, ta, gb, tb, gc, alpha, beta);
            // Both accumulate in f32 in different orders: with |a|, |b| ≤ 1 every partial sum is ≤ k, and the
            // k roundings of a k-term sum bound the difference by k·k·kF32 (plus alpha/beta's two roundings);
            // a bf16 c adds its output rounding.
            const double atol = double(s.k) * double(s.k) * kF32 + 4 * kF32;
            const double rtol = cdt == DType::bf16 ? kBf16Rel : 2 * kF32;
            expect_close(down(gc), host(cc), s.m, s.n, atol, rtol,
                         shape_name(cdt == DType::f32 ? "gemm f32c" : "gemm bf16c", {s.m, s.n, s.k, ta, tb}) +
                             " beta " + std::to_string(beta));
          }
}

// gemm_add: out = alpha·op(a)·op(b) + beta·c_in, against the CPU oracle (CpuTrainOps::gemm_add is copy then
// gemm) with GemmAllTransposesAlphaBeta's tolerance, in each of its forms: c_in a separate tensor of out's
// layout (cuBLASLt reads it as C and writes out as D), c_in of another row stride (copied into out, then the
// in-place GEMM), c_in aliasing out (the old in-place call: the same bits as gemm), and K = 0 (c_in copied).
// The separate form also bit for bit against a copy of c_in into out and the in-place GEMM: both run the one
// cached plan of that shape, alignment and strides, so only cuBLASLt's choice of C's pointer differs.
TEST_F(CudaTrainOpsTest, GemmAddendMatchesCpuAndCopyThenGemm) {
  struct Shape {
    int64_t m, n, k;
  };
  for (Shape s : {Shape{1, 5, 7}, Shape{19, 130, 64}, Shape{733, 64, 130}, Shape{7, 1, 733}})
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb)
        for (DType cdt : {DType::f32, DType::bf16})
          for (float beta : {1.0f, 0.75f, 0.0f}) {
            const float alpha = beta == 0.75f ? -0.5f : 1.0f;
            const int64_t ar = ta ? s.k : s.m, ac = ta ? s.m : s.k, br = tb ? s.n : s.k, bc = tb ? s.k : s.n;
            const int64_t pad = cdt == DType::f32 ? 4 : 8;
            std::vector<float> a = rnd(ar * ac, -1, 1), b = rnd(br * bc, -1, 1), c0 = rnd(s.m * s.n, -1, 1),
                               o0 = rnd(s.m * s.n, -1, 1);
            Tensor ca = cpu(ar, ac, a), cb = cpu(br, bc, b), cc = cpu(s.m, s.n, o0);
            cpu_ops_.gemm_add(ca, ta, cb, tb, cpu(s.m, s.n, c0), cc, alpha, beta);
            Tensor ga = dev(DType::bf16, ar, ac, 8, &a), gb = dev(DType::bf16, br, bc, 0, &b);
            Tensor gcin = dev(cdt, s.m, s.n, pad, &c0);
            Tensor gout = dev(cdt, s.m, s.n, pad, &o0), gwide = dev(cdt, s.m, s.n, pad, &o0),
                   galias = dev(cdt, s.m, s.n, pad, &c0), gold_alias = dev(cdt, s.m, s.n, pad, &c0);
            gpu_->gemm_add(ga, ta, gb, tb, gcin, gout, alpha, beta);
            gpu_->gemm_add(ga, ta, gb, tb, dev(cdt, s.m, s.n, pad + 8, &c0), gwide, alpha, beta);
            gpu_->gemm_add(ga, ta, gb, tb, galias, galias, alpha, beta);
            gpu_->gemm(ga, ta, gb, tb, gold_alias, alpha, beta);
            Tensor gold = dev(cdt, s.m, s.n, pad, &o0);
            gpu_->copy(gcin, gold);
            gpu_->gemm(ga, ta, gb, tb, gold, alpha, beta);
            const double atol = double(s.k) * double(s.k) * kF32 + 4 * kF32;
            const double rtol = cdt == DType::bf16 ? kBf16Rel : 2 * kF32;
            const std::string what =
                shape_name(cdt == DType::f32 ? "gemm_add f32c" : "gemm_add bf16c", {s.m, s.n, s.k, ta, tb}) +
                " beta " + std::to_string(beta);
            const std::vector<float> want = host(cc), got = down(gout);
            expect_close(got, want, s.m, s.n, atol, rtol, what + " c_in separate");
            expect_close(down(gwide), want, s.m, s.n, atol, rtol, what + " c_in of another stride");
            expect_close(down(galias), want, s.m, s.n, atol, rtol, what + " c_in is out");
            expect_same_bits(down(galias), down(gold_alias), s.n, what + " c_in is out vs gemm");
            expect_same_bits(got, down(gold), s.n, what + " c_in separate vs copy + in-place gemm");
            EXPECT_EQ(down(gcin), c0) << what << ": c_in must be left as it was";
          }
  // K = 0 with beta 1 is out = c_in (copied; nothing to multiply), on both backends.
  for (DType cdt : {DType::f32, DType::bf16}) {
    std::vector<float> c0 = rnd(19 * 130, -1, 1), o0 = rnd(19 * 130, -1, 1);
    Tensor cc = cpu(19, 130, o0);
    cpu_ops_.gemm_add(cpu(19, 0, {}), false, cpu(0, 130, {}), false, cpu(19, 130, c0), cc, 1.0f, 1.0f);
    Tensor gout = dev(cdt, 19, 130, 4, &o0);
    gpu_->gemm_add(dev(DType::bf16, 19, 0), false, dev(DType::bf16, 0, 130), false, dev(cdt, 19, 130, 4, &c0),
                   gout, 1.0f, 1.0f);
    const std::string what = cdt == DType::f32 ? "gemm_add K 0 f32c" : "gemm_add K 0 bf16c";
    expect_equal(host(cc), c0, 19, 130, what + " cpu");
    expect_equal(down(gout), c0, 19, 130, what + " gpu");
  }
}

// K = 0 (dW of an empty row range, a micro-batch without context rows): c = beta·c without cuBLASLt, so beta
// 0 (a step's first write) leaves zeros where c held NaN, beta 1 leaves c alone.
TEST_F(CudaTrainOpsTest, GemmWithEmptyInnerDimensionScalesC) {
  const int64_t m = 19, n = 130;
  for (int ta = 0; ta < 2; ++ta)
    for (DType cdt : {DType::f32, DType::bf16})
      for (float beta : {0.0f, 1.0f, 0.75f}) {
        const std::vector<float> c0 =
            beta == 0.0f ? std::vector<float>(size_t(m * n), NAN) : rnd(m * n, -1, 1);
        Tensor ca = cpu(ta ? 0 : m, ta ? m : 0, {}), cb = cpu(0, n, {}), cc = cpu(m, n, c0);
        Tensor ga = dev(DType::bf16, ta ? 0 : m, ta ? m : 0, 8), gb = dev(DType::bf16, 0, n, 0);
        Tensor gc = dev(cdt, m, n, 4, &c0);
        cpu_ops_.gemm(ca, ta, cb, false, cc, 1.0f, beta);
        gpu_->gemm(ga, ta, gb, false, gc, 1.0f, beta);
        // 0 and c are exact; 0.75·c is exact in f32 and rounded once more on a bf16 c.
        expect_close(down(gc), host(cc), m, n, 0.0, cdt == DType::bf16 ? kBf16Rel : 0.0,
                     shape_name(cdt == DType::f32 ? "gemm K=0 f32c" : "gemm K=0 bf16c", {m, n, ta}) +
                         " beta " + std::to_string(beta));
      }
}

TEST_F(CudaTrainOpsTest, EmbeddingScaleRowsAndNoise) {
  const int64_t V = 50;
  for (int64_t rows : {1, 7, 733})
    for (int64_t cols : {5, 130, 1024}) {
      // 1024 columns: aligned views (strided for scale_rows, contiguous for the noise), which both ops run
      // with 16-byte accesses; the other sizes take the one-element kernels.
      const bool vec = cols % 8 == 0;
      std::vector<float> table = rnd(V * cols, -1, 1);
      std::vector<int32_t> ids(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) ids[size_t(r)] = int32_t((r * 37 + 11) % V);
      std::vector<float> want(static_cast<size_t>(rows * cols));
      for (int64_t r = 0; r < rows; ++r)
        std::copy_n(&table[size_t(ids[size_t(r)] * cols)], cols, &want[size_t(r * cols)]);
      Tensor gt = dev(DType::bf16, V, cols, 6, &table), go = dev(DType::bf16, rows, cols, 2);
      gpu_->embedding(dev_i32(ids), gt, go);
      expect_equal(down(go), want, rows, cols, shape_name("embedding", {rows, cols}));

      // scale_rows: the f32 product of bf16 x and f32 s is exact enough on the CPU; the GPU rounds it once.
      std::vector<float> x = rnd(rows * cols, -2, 2), sv = rnd(rows, -3, 3);
      Tensor cx = cpu(rows, cols, x), gx = dev(DType::bf16, rows, cols, vec ? 16 : 4, &x);
      cpu_ops_.scale_rows(cx, cpu(1, rows, sv));
      gpu_->scale_rows(gx, dev(DType::f32, 1, rows, 0, &sv));
      expect_close(down(gx), host(cx), rows, cols, 0.0, kBf16Rel, shape_name("scale_rows", {rows, cols}));

      // Noise: the same draw per (row, col) of the logical tensor (not of its strided buffer). Host f32 and
      // device double Box–Muller (core/rng.h) agree to a few f32 ulps of the draw (|z| < 6, so 1e-5·std
      // covers 8 ulps); then one bf16 rounding of the sum.
      for (float stdv : {1.0f, 0.05f}) {
        std::vector<float> x0 =
            stdv == 1.0f ? std::vector<float>(size_t(rows * cols), 0.0f) : rnd(rows * cols, -1, 1);
        Tensor cn = cpu(rows, cols, x0), gn = dev(DType::bf16, rows, cols, vec ? 0 : 6, &x0);
        cpu_ops_.add_gaussian_noise(cn, stdv, 987654321ull);
        gpu_->add_gaussian_noise(gn, stdv, 987654321ull);
        expect_close(down(gn), host(cn), rows, cols, 1e-5 * stdv, kBf16Rel,
                     shape_name("add_gaussian_noise", {rows, cols}) + " std " + std::to_string(stdv));
      }
    }
  // The CPU's noise is core/rng.h's draw (one generator for both backends).
  EXPECT_EQ(cpu_noise_normal(5, 123), rng_normal_at(5, kRngStreamTrainNoise, 123));
}

// ---- normalisation and RoPE
// ---------------------------------------------------------------------------------

TEST_F(CudaTrainOpsTest, RmsnormForwardAndBackward) {
  const float eps = 1e-6f;
  for (int64_t rows : {1, 7, 19, 733})
    for (int64_t cols : {5, 64, 130, 1024}) {
      const int64_t pad = cols % 8 == 0 ? 16 : 3;  // one 16-byte-aligned strided layout, one unaligned
      std::vector<float> x = rnd(rows * cols, -2, 2), w = rnd(cols, 0.5f, 1.5f);
      Tensor cx = cpu(rows, cols, x), cw = cpu(1, cols, w), cy = cpu(rows, cols, {}), crs = cpu(1, rows, {});
      Tensor gx = dev(DType::bf16, rows, cols, pad, &x), gw = dev(DType::f32, 1, cols, 0, &w);
      Tensor gy = dev(DType::bf16, rows, cols, pad), grs = dev(DType::f32, 1, rows);
      cpu_ops_.rmsnorm_fwd(cx, cw, cy, crs, eps);
      gpu_->rmsnorm_fwd(gx, gw, gy, grs, eps);
      // rstd: an f32 sum of cols squares ((cols − 1)·kF32 relative, all terms positive) and rsqrtf (2 ulp);
      // y adds its bf16 output rounding.
      const double rs_rel = double(cols + 4) * kF32;
      expect_close(down(grs), host(crs), 1, rows, 0.0, rs_rel, shape_name("rmsnorm_fwd rstd", {rows, cols}));
      expect_close(down(gy), host(cy), rows, cols, 0.0, kBf16Rel + rs_rel,
                   shape_name("rmsnorm_fwd y", {rows, cols}));

      // Backward from the CPU's rstd (on both) so only the backward's own rounding is compared.
      std::vector<float> rs = host(crs), dy = rnd(rows * cols, -1, 1);
      std::vector<float> dx0 = rnd(rows * cols, -1, 1), dw0 = rnd(cols, -1, 1);
      std::vector<double> mag_dx, mag_dw;
      rmsnorm_bwd_magnitudes(x, w, dy, rs, rows, cols, mag_dx, mag_dw);
      for (float beta : {0.0f, 1.0f}) {
        // beta 0 for dx and dw: dw starts as NaN on both backends (a step's first write must not read it).
        const std::vector<float> dw_in = beta == 0.0f ? std::vector<float>(size_t(cols), NAN) : dw0;
        Tensor cdx = cpu(rows, cols, dx0), cdw = cpu(1, cols, dw_in);
        Tensor gdx = dev(DType::bf16, rows, cols, pad, &dx0), gdw = dev(DType::f32, 1, cols, 0, &dw_in);
        cpu_ops_.rmsnorm_bwd(cx, cw, cpu(1, rows, rs), cpu(rows, cols, dy), cdx, cdw, beta, beta);
        gpu_->rmsnorm_bwd(gx, gw, dev(DType::f32, 1, rows, 0, &rs), dev(DType::bf16, rows, cols, pad, &dy),
                          gdx, gdw, beta, beta);
        const std::string b = " beta " + std::to_string(int(beta));
        expect_close(down(gdx), host(cdx), rows, cols, 0.0, kBf16Rel,
                     shape_name("rmsnorm_bwd dx", {rows, cols}) + b, mag_dx, double(cols + 8) * kF32);
        expect_close(down(gdw), host(cdw), 1, cols, 0.0, 2 * kF32,
                     shape_name("rmsnorm_bwd dw", {rows, cols}) + b, mag_dw, double(rows + 8) * kF32);
      }
      // The same input gives the same bits: the dw reduction runs in a fixed order (no float atomics).
      Tensor grs_in = dev(DType::f32, 1, rows, 0, &rs), gdy = dev(DType::bf16, rows, cols, pad, &dy);
      std::vector<float> dw_runs[2];
      for (std::vector<float>& run : dw_runs) {
        Tensor gdx = dev(DType::bf16, rows, cols, pad), gdw = dev(DType::f32, 1, cols, 0, &dw0);
        gpu_->rmsnorm_bwd(gx, gw, grs_in, gdy, gdx, gdw, 0.0f, 1.0f);
        run = down(gdw);
      }
      expect_equal(dw_runs[1], dw_runs[0], 1, cols, shape_name("rmsnorm_bwd dw repeated", {rows, cols}));
    }
}

// No rows (hidden_norm's backward on a micro-batch without context rows): ∂/∂w is 0, and beta_dw 0 (a step's
// first write) must still replace dw, the NaN poison here, by zeros; beta_dw 1 leaves dw alone.
TEST_F(CudaTrainOpsTest, NormBackwardsWithoutRowsStillWriteTheWeightGradient) {
  const int heads = 2, hd = 64;
  const int64_t cols = 96;
  const std::vector<float> w = rnd(cols, 0.5f, 1.5f), w_hd = rnd(hd, 0.5f, 1.5f);
  for (float beta_dw : {0.0f, 1.0f}) {
    const std::string b = " beta_dw " + std::to_string(int(beta_dw));
    const std::vector<float> dw0 = rnd(cols, -1, 1), dw0_hd = rnd(hd, -1, 1);
    Tensor gdw = dev(DType::f32, 1, cols, 0, beta_dw == 0.0f ? nullptr : &dw0);
    gpu_->rmsnorm_bwd(dev(DType::bf16, 0, cols), dev(DType::f32, 1, cols, 0, &w), dev(DType::f32, 1, 0),
                      dev(DType::bf16, 0, cols), dev(DType::bf16, 0, cols), gdw, 0.0f, beta_dw);
    expect_equal(down(gdw), beta_dw == 0.0f ? std::vector<float>(size_t(cols), 0.0f) : dw0, 1, cols,
                 "rmsnorm_bwd without rows" + b);
    Tensor qdw = dev(DType::f32, 1, hd, 0, beta_dw == 0.0f ? nullptr : &dw0_hd);
    gpu_->qk_norm_rope_bwd(dev(DType::bf16, 0, int64_t(heads) * hd), dev(DType::f32, 1, hd, 0, &w_hd),
                           dev(DType::i32, 1, 0), dev(DType::f32, 0, heads),
                           dev(DType::bf16, 0, int64_t(heads) * hd), dev(DType::bf16, 0, int64_t(heads) * hd),
                           qdw, heads, hd, 1e6f, beta_dw);
    expect_equal(down(qdw), beta_dw == 0.0f ? std::vector<float>(size_t(hd), 0.0f) : dw0_hd, 1, hd,
                 "qk_norm_rope_bwd without rows" + b);
  }
}

TEST_F(CudaTrainOpsTest, QkNormRopeForwardAndBackward) {
  const int heads = 3;
  const float eps = 1e-6f, theta = 1e6f;
  for (int64_t rows : {1, 7, 19, 733})
    for (int hd : {16, 64, 128, 256}) {
      const int64_t cols = int64_t(heads) * hd, half = hd / 2;
      std::vector<float> x = rnd(rows * cols, -2, 2), w = rnd(hd, 0.5f, 1.5f);
      std::vector<int32_t> pos(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) pos[size_t(r)] = int32_t((r * 7919) % 40000);  // angles of 1e4+ rad
      std::vector<float> posf(pos.begin(), pos.end());
      Tensor cpos = tensor_make(pos.data(), DType::i32, Device::cpu, 1, rows), gpos = dev_i32(pos);
      Tensor cx = cpu(rows, cols, x), cw = cpu(1, hd, w), cy = cpu(rows, cols, {}),
             crs = cpu(rows, heads, {});
      // x as the q columns of a wider fused projection output: a strided view, as the drafter passes it.
      Tensor gx = dev(DType::bf16, rows, cols, 2 * hd, &x), gw = dev(DType::f32, 1, hd, 0, &w);
      Tensor gy = dev(DType::bf16, rows, cols, 8), grs = dev(DType::f32, rows, heads, 2);
      cpu_ops_.qk_norm_rope_fwd(cx, cw, cpos, cy, crs, heads, hd, theta, eps);
      gpu_->qk_norm_rope_fwd(gx, gw, gpos, gy, grs, heads, hd, theta, eps);
      const double rs_rel = double(hd + 4) * kF32;
      expect_close(down(grs), host(crs), rows, heads, 0.0, rs_rel,
                   shape_name("qk_norm_rope_fwd rstd", {rows, hd}));
      // y_i = z_i·cos ± z_p·sin with z = w·x·rstd: rstd's error and the f32 products and sum scale with
      // |z_i| + |z_p| (cos/sin agree: both are the f32 angle's double cos/sin rounded once); then bf16
      // output.
      std::vector<float> rs = host(crs);
      std::vector<double> mag_y(static_cast<size_t>(rows * cols));
      for (int64_t r = 0; r < rows; ++r)
        for (int h = 0; h < heads; ++h)
          for (int i = 0; i < hd; ++i) {
            const int p = i < half ? i + int(half) : i - int(half);
            mag_y[size_t(r * cols + h * hd + i)] =
                rs[r * heads + h] * (std::fabs(double(w[i]) * x[r * cols + h * hd + i]) +
                                     std::fabs(double(w[p]) * x[r * cols + h * hd + p]));
          }
      expect_close(down(gy), host(cy), rows, cols, 0.0, kBf16Rel,
                   shape_name("qk_norm_rope_fwd y", {rows, hd}), mag_y, rs_rel + 8 * kF32);

      // Backward from the CPU's rstd.
      std::vector<float> dy = rnd(rows * cols, -1, 1), dw0 = rnd(hd, -1, 1);
      std::vector<double> mag_dx, mag_dw;
      qk_norm_rope_bwd_magnitudes(x, w, dy, rs, rows, heads, hd, mag_dx, mag_dw);
      for (float beta_dw : {0.0f, 1.0f}) {
        // beta_dw 0: dw starts as NaN on both backends (a step's first write must not read it).
        const std::vector<float> dw_in = beta_dw == 0.0f ? std::vector<float>(size_t(hd), NAN) : dw0;
        Tensor cdx = cpu(rows, cols, {}), cdw = cpu(1, hd, dw_in);
        Tensor gdx = dev(DType::bf16, rows, cols, 2 * hd), gdw = dev(DType::f32, 1, hd, 0, &dw_in);
        cpu_ops_.qk_norm_rope_bwd(cx, cw, cpos, crs, cpu(rows, cols, dy), cdx, cdw, heads, hd, theta,
                                  beta_dw);
        gpu_->qk_norm_rope_bwd(gx, gw, gpos, dev(DType::f32, rows, heads, 2, &rs),
                               dev(DType::bf16, rows, cols, 4, &dy), gdx, gdw, heads, hd, theta, beta_dw);
        const std::string b = " beta_dw " + std::to_string(int(beta_dw));
        expect_close(down(gdx), host(cdx), rows, cols, 0.0, kBf16Rel,
                     shape_name("qk_norm_rope_bwd dx", {rows, hd}) + b, mag_dx, double(hd + 16) * kF32);
        expect_close(down(gdw), host(cdw), 1, hd, 0.0, 2 * kF32,
                     shape_name("qk_norm_rope_bwd dw", {rows, hd}) + b, mag_dw,
                     double(rows * heads + 16) * kF32);
      }
      Tensor grs_in = dev(DType::f32, rows, heads, 2, &rs), gdy = dev(DType::bf16, rows, cols, 4, &dy);
      std::vector<float> dw_runs[2];
      for (std::vector<float>& run : dw_runs) {
        Tensor gdx2 = dev(DType::bf16, rows, cols, 0), gdw2 = dev(DType::f32, 1, hd, 0, &dw0);
        gpu_->qk_norm_rope_bwd(gx, gw, gpos, grs_in, gdy, gdx2, gdw2, heads, hd, theta, 1.0f);
        run = down(gdw2);
      }
      expect_equal(dw_runs[1], dw_runs[0], 1, hd, shape_name("qk_norm_rope_bwd dw repeated", {rows, hd}));
    }
}

// The shapes on which the register norm kernels are held to the fallback kernels, backward and training
// forward: each case runs on its view as given and on the same values one element further into the buffer
// (kShift: never 16-byte aligned, so the fallback kernels run). RMSNorm: pad / 2 elements before each row (16
// keeps 16-byte alignment, 8 and 4 less).
constexpr int64_t kShift = 2;  // dev()'s view starts pad / 2 elements in: 2 more pad moves it by one element
struct RmsCase {
  int64_t rows, cols, pad;
};
constexpr RmsCase kRmsCases[] = {{1, 64, 0},    {7, 4096, 16}, {733, 4096, 16}, {19, 5120, 16},
                                 {2, 28672, 0}, {2, 28680, 0}, {300, 1000, 8},  {65, 130, 4},
                                 {37, 64, 3},   {5, 5, 0}};
// QK-norm + RoPE: pad of x, dy and dx (and y).
struct RopeCase {
  int64_t rows;
  int heads, hd;
  int64_t pad;
};
constexpr RopeCase kRopeCases[] = {{37, 32, 128, 16}, {733, 8, 128, 256}, {19, 4, 256, 512},
                                   {7, 24, 256, 0},   {300, 3, 64, 16},   {19, 2, 96, 0},
                                   {19, 5, 18, 0},    {7, 65, 128, 0},    {19, 8, 128, 3}};

// The register dx and vectorised dw kernels against the fallback ones (the shifted views), on shapes that
// take each path: rows of 16-byte chunks held 1, 4, 5 and 7 per thread (64, 4096, 5120, 28672 columns), one
// chunk past the register kernel (28680), row chunks of 23 rows (733 rows: a short last load group), views
// aligned to 8 or 4 bytes only (dw on 4- or 2-element loads, dx on the fallback kernel), unaligned views and
// odd columns (both fallbacks), beta_dx 0 into NaN-poisoned dx and beta_dx 1. dw must be the same bits: the
// same fp32 chains in the same order. dx may differ from the fallback kernel's before rounding by the order
// of m's f32 sum (the oracle's bound, twice) and the final fma's rounding (kF32 each), then each side's bf16
// rounding moves it by up to kBf16Rel of itself (kBf16Rel·(1 + kBf16Rel) of the other's rounded value); both
// are also held to the CPU oracle as in RmsnormForwardAndBackward.
TEST_F(CudaTrainOpsTest, RmsnormBackwardMatchesFallbackKernels) {
  for (RmsCase cs : kRmsCases) {
    const int64_t rows = cs.rows, cols = cs.cols, pad = cs.pad;
    std::vector<float> x = rnd(rows * cols, -2, 2), w = rnd(cols, 0.5f, 1.5f), dy = rnd(rows * cols, -1, 1);
    std::vector<float> dx0 = rnd(rows * cols, -1, 1), dw0 = rnd(cols, -1, 1);
    Tensor cx = cpu(rows, cols, x), cw = cpu(1, cols, w), crs = cpu(1, rows, {});
    cpu_ops_.rmsnorm_fwd(cx, cw, cpu(rows, cols, {}), crs, 1e-6f);
    const std::vector<float> rs = host(crs);
    std::vector<double> mag_dx, mag_dw;
    rmsnorm_bwd_magnitudes(x, w, dy, rs, rows, cols, mag_dx, mag_dw);
    Tensor gw = dev(DType::f32, 1, cols, 0, &w), grs = dev(DType::f32, 1, rows, 0, &rs);
    for (float beta : {0.0f, 1.0f}) {
      auto run = [&](int64_t p, std::vector<float>& dx, std::vector<float>& dw) {
        Tensor gx = dev(DType::bf16, rows, cols, p, &x), gdy = dev(DType::bf16, rows, cols, p, &dy);
        Tensor gdx = beta == 0.0f ? dev(DType::bf16, rows, cols, p) : dev(DType::bf16, rows, cols, p, &dx0);
        Tensor gdw = dev(DType::f32, 1, cols, 0, &dw0);
        gpu_->rmsnorm_bwd(gx, gw, grs, gdy, gdx, gdw, beta, 1.0f);
        dx = down(gdx);
        dw = down(gdw);
      };
      std::vector<float> dx_new, dw_new, dx_old, dw_old;
      run(pad, dx_new, dw_new);
      run(pad + kShift, dx_old, dw_old);
      Tensor cdx = cpu(rows, cols, dx0), cdw = cpu(1, cols, dw0);
      cpu_ops_.rmsnorm_bwd(cx, cw, crs, cpu(rows, cols, dy), cdx, cdw, beta, 1.0f);
      const std::string b = " pad " + std::to_string(pad) + " beta " + std::to_string(int(beta));
      expect_close(dx_new, host(cdx), rows, cols, 0.0, kBf16Rel,
                   shape_name("rmsnorm_bwd dx", {rows, cols}) + b, mag_dx, double(cols + 8) * kF32);
      expect_close(dw_new, host(cdw), 1, cols, 0.0, 2 * kF32, shape_name("rmsnorm_bwd dw", {rows, cols}) + b,
                   mag_dw, double(rows + 8) * kF32);
      expect_close(dx_new, dx_old, rows, cols, 0.0, 2 * kBf16Rel * (1 + kBf16Rel) + 4 * kF32,
                   shape_name("rmsnorm_bwd dx vs fallback", {rows, cols}) + b, mag_dx,
                   2 * double(cols + 8) * kF32);
      expect_equal(dw_new, dw_old, 1, cols, shape_name("rmsnorm_bwd dw == fallback", {rows, cols}) + b);
    }
  }
}

// The same for the QK-norm + RoPE backward: head dims 64, 128 and 256 on the register dx kernel (one token of
// 24 or 32 heads per block; 3, 4 and 8 heads with several tokens a block and token slots past T or past the
// block's warps idle), dw on 1-, 2- and 4-element loads with heads in one, several or a partial load group;
// hd 96 and 18 (odd half) and 65 heads (a block too large) on the fallback dx kernel, an unaligned x view.
// dw must be the same bits whatever its load width; dx is bounded as for RMSNorm.
TEST_F(CudaTrainOpsTest, QkNormRopeBackwardMatchesFallbackKernels) {
  const float theta = 1e6f;
  for (RopeCase cs : kRopeCases) {
    const int64_t rows = cs.rows, cols = int64_t(cs.heads) * cs.hd, pad = cs.pad;
    const int heads = cs.heads, hd = cs.hd;
    std::vector<float> x = rnd(rows * cols, -2, 2), w = rnd(hd, 0.5f, 1.5f), dy = rnd(rows * cols, -1, 1);
    std::vector<float> dw0 = rnd(hd, -1, 1);
    std::vector<int32_t> pos(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) pos[size_t(r)] = int32_t((r * 7919) % 40000);
    Tensor cpos = tensor_make(pos.data(), DType::i32, Device::cpu, 1, rows), gpos = dev_i32(pos);
    Tensor cx = cpu(rows, cols, x), cw = cpu(1, hd, w), crs = cpu(rows, heads, {});
    cpu_ops_.qk_norm_rope_fwd(cx, cw, cpos, cpu(rows, cols, {}), crs, heads, hd, theta, 1e-6f);
    const std::vector<float> rs = host(crs);
    std::vector<double> mag_dx, mag_dw;
    qk_norm_rope_bwd_magnitudes(x, w, dy, rs, rows, heads, hd, mag_dx, mag_dw);
    Tensor gw = dev(DType::f32, 1, hd, 0, &w), grs = dev(DType::f32, rows, heads, 2, &rs);
    auto run = [&](int64_t p, std::vector<float>& dx, std::vector<float>& dw) {
      Tensor gx = dev(DType::bf16, rows, cols, p, &x), gdy = dev(DType::bf16, rows, cols, p, &dy);
      Tensor gdx = dev(DType::bf16, rows, cols, p), gdw = dev(DType::f32, 1, hd, 0, &dw0);
      gpu_->qk_norm_rope_bwd(gx, gw, gpos, grs, gdy, gdx, gdw, heads, hd, theta, 1.0f);
      dx = down(gdx);
      dw = down(gdw);
    };
    std::vector<float> dx_new, dw_new, dx_old, dw_old;
    run(pad, dx_new, dw_new);
    run(pad + kShift, dx_old, dw_old);
    Tensor cdx = cpu(rows, cols, {}), cdw = cpu(1, hd, dw0);
    cpu_ops_.qk_norm_rope_bwd(cx, cw, cpos, crs, cpu(rows, cols, dy), cdx, cdw, heads, hd, theta, 1.0f);
    const std::string c = " heads " + std::to_string(heads) + " pad " + std::to_string(pad);
    expect_close(dx_new, host(cdx), rows, cols, 0.0, kBf16Rel,
                 shape_name("qk_norm_rope_bwd dx", {rows, hd}) + c, mag_dx, double(hd + 16) * kF32);
    expect_close(dw_new, host(cdw), 1, hd, 0.0, 2 * kF32, shape_name("qk_norm_rope_bwd dw", {rows, hd}) + c,
                 mag_dw, double(rows * heads + 16) * kF32);
    expect_close(dx_new, dx_old, rows, cols, 0.0, 2 * kBf16Rel * (1 + kBf16Rel) + 4 * kF32,
                 shape_name("qk_norm_rope_bwd dx vs fallback", {rows, hd}) + c, mag_dx,
                 2 * double(hd + 16) * kF32);
    expect_equal(dw_new, dw_old, 1, hd, shape_name("qk_norm_rope_bwd dw == fallback", {rows, hd}) + c);
  }
}

// The training forwards on the register kernels against the fallback ones (the shifted views: the two-pass
// RMSNorm, the shared-memory QK-norm + RoPE) on the backward tests' shapes, with strided and unaligned views.
// QK-norm + RoPE: the same bits, y and rstd (the register kernel sums the squares in the shared-memory
// kernel's order). RMSNorm: the register kernel sums the squares per thread then over the block, the two-pass
// kernel per strided chunk, so rstd may differ by the f32 sum's error on each side and y by that plus one
// bf16 rounding each.
TEST_F(CudaTrainOpsTest, TrainingForwardNormsMatchFallbackKernels) {
  const float eps = 1e-6f, theta = 1e6f;
  for (RmsCase cs : kRmsCases) {
    const int64_t rows = cs.rows, cols = cs.cols, pad = cs.pad;
    std::vector<float> x = rnd(rows * cols, -2, 2), w = rnd(cols, 0.5f, 1.5f);
    Tensor gw = dev(DType::f32, 1, cols, 0, &w);
    auto run = [&](int64_t p, std::vector<float>& y, std::vector<float>& rs) {
      Tensor gx = dev(DType::bf16, rows, cols, p, &x);
      Tensor gy = dev(DType::bf16, rows, cols, p), grs = dev(DType::f32, 1, rows);
      gpu_->rmsnorm_fwd(gx, gw, gy, grs, eps);
      y = down(gy);
      rs = down(grs);
    };
    std::vector<float> y_new, rs_new, y_old, rs_old;
    run(pad, y_new, rs_new);
    run(pad + kShift, y_old, rs_old);
    Tensor cy = cpu(rows, cols, {}), crs = cpu(1, rows, {});
    cpu_ops_.rmsnorm_fwd(cpu(rows, cols, x), cpu(1, cols, w), cy, crs, eps);
    const double rs_rel = double(cols + 4) * kF32;
    const std::string c = " pad " + std::to_string(pad);
    expect_close(rs_new, host(crs), 1, rows, 0.0, rs_rel, shape_name("rmsnorm_fwd rstd", {rows, cols}) + c);
    expect_close(y_new, host(cy), rows, cols, 0.0, kBf16Rel + rs_rel,
                 shape_name("rmsnorm_fwd y", {rows, cols}) + c);
    expect_close(rs_new, rs_old, 1, rows, 0.0, 2 * rs_rel,
                 shape_name("rmsnorm_fwd rstd vs fallback", {rows, cols}) + c);
    expect_close(y_new, y_old, rows, cols, 0.0, 2 * kBf16Rel * (1 + kBf16Rel) + 2 * rs_rel,
                 shape_name("rmsnorm_fwd y vs fallback", {rows, cols}) + c);
  }
  for (RopeCase cs : kRopeCases) {
    const int64_t rows = cs.rows, cols = int64_t(cs.heads) * cs.hd, pad = cs.pad;
    const int heads = cs.heads, hd = cs.hd;
    std::vector<float> x = rnd(rows * cols, -2, 2), w = rnd(hd, 0.5f, 1.5f);
    std::vector<int32_t> pos(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) pos[size_t(r)] = int32_t((r * 7919) % 40000);
    Tensor gw = dev(DType::f32, 1, hd, 0, &w), gpos = dev_i32(pos);
    auto run = [&](int64_t p, std::vector<float>& y, std::vector<float>& rs) {
      Tensor gx = dev(DType::bf16, rows, cols, p, &x);
      Tensor gy = dev(DType::bf16, rows, cols, p), grs = dev(DType::f32, rows, heads, 2);
      gpu_->qk_norm_rope_fwd(gx, gw, gpos, gy, grs, heads, hd, theta, eps);
      y = down(gy);
      rs = down(grs);
    };
    std::vector<float> y_new, rs_new, y_old, rs_old;
    run(pad, y_new, rs_new);
    run(pad + kShift, y_old, rs_old);
    const std::string c = " heads " + std::to_string(heads) + " pad " + std::to_string(pad);
    expect_same_bits(y_new, y_old, cols, shape_name("qk_norm_rope_fwd y == fallback", {rows, hd}) + c);
    expect_same_bits(rs_new, rs_old, heads, shape_name("qk_norm_rope_fwd rstd == fallback", {rows, hd}) + c);
  }
}

// ---- MLP
// ----------------------------------------------------------------------------------------------------

TEST_F(CudaTrainOpsTest, SwigluForwardAndBackward) {
  for (int64_t rows : {1, 19, 733})
    for (int64_t cols : {5, 130, 1024})
      // 1024 columns twice: views 8 bytes off alignment (pad 8: the one-element backward) and aligned
      // (pad 16: the 16-byte backward).
      for (int64_t pad : cols % 8 == 0 ? std::vector<int64_t>{8, 16} : std::vector<int64_t>{1}) {
        std::vector<float> g = rnd(rows * cols, -6, 6), u = rnd(rows * cols, -2, 2),
                           d = rnd(rows * cols, -1, 1);
        Tensor cg = cpu(rows, cols, g), cu = cpu(rows, cols, u), cd = cpu(rows, cols, d);
        Tensor gg = dev(DType::bf16, rows, cols, pad, &g), gu = dev(DType::bf16, rows, cols, pad, &u);
        Tensor gd = dev(DType::bf16, rows, cols, pad, &d);
        Tensor co = cpu(rows, cols, {}), go = dev(DType::bf16, rows, cols, pad);
        cpu_ops_.swiglu_fwd(cg, cu, co);
        gpu_->swiglu_fwd(gg, gu, go);
        // The forward rounds silu(g) to bf16 before the product (as torch does), then the product: two bf16
        // roundings; __expf and the fast division add at most 12 f32 ulps to silu.
        expect_close(down(go), host(co), rows, cols, 1e-7, 2 * kBf16Rel + 16 * kF32,
                     shape_name("swiglu_fwd", {rows, cols, pad}));

        Tensor cdg = cpu(rows, cols, {}), cdu = cpu(rows, cols, {});
        Tensor gdg = dev(DType::bf16, rows, cols, pad), gdu = dev(DType::bf16, rows, cols, pad);
        cpu_ops_.swiglu_bwd(cg, cu, cd, cdg, cdu);
        gpu_->swiglu_bwd(gg, gu, gd, gdg, gdu);
        // f32 with fast-math __expf (2 + 1.2·|g| ulps, ≤ 10 for |g| ≤ 6) and division against the CPU's
        // double: σ(g) to 12 f32 ulps. 1 + g·(1 − σ) cancels near g ≈ −1.28, so dgate's error scales with
        // |d·u·σ|·(1 + 2|g|) ≤ 2·mag, not with the result. One bf16 rounding of each output.
        std::vector<double> mag(static_cast<size_t>(rows * cols));
        for (size_t i = 0; i < mag.size(); ++i) {
          const double sg = 1.0 / (1.0 + std::exp(-double(g[i])));
          mag[i] = std::fabs(double(d[i]) * u[i] * sg) * (1.0 + std::fabs(double(g[i])));
        }
        expect_close(down(gdg), host(cdg), rows, cols, 0.0, kBf16Rel,
                     shape_name("swiglu_bwd dgate", {rows, cols, pad}), mag, 32 * kF32);
        expect_close(down(gdu), host(cdu), rows, cols, 0.0, kBf16Rel + 16 * kF32,
                     shape_name("swiglu_bwd dup", {rows, cols, pad}));
      }
}

// The 16-byte forms of swiglu_bwd, scale_rows, add_gaussian_noise and fill against the one-element kernels,
// bit for bit: each op runs on the view as given (the 16-byte form where its columns, stride and address
// allow) and on the same values one element further into its buffer (kShift: never 16-byte aligned, so the
// one-element kernel), and neither may write outside its view (the padding columns keep their NaN poison).
// Views: odd columns and a view 8 bytes off alignment (both runs then take the one-element kernel; f32 fill
// still aligned there), aligned strided and contiguous views, 733 rows of 1024 chunks (several whole rows per
// grid step), 3 rows of 400 000 chunks (more chunks in a row than the grid has threads) and 2049 rows of 3
// chunks.
TEST_F(CudaTrainOpsTest, TrainRowOpsSameBitsAsOneElementKernels) {
  struct View {
    int64_t rows, cols, pad;
  };
  for (View v : {View{1, 5, 0}, View{7, 130, 6}, View{19, 1024, 8}, View{19, 1024, 16}, View{733, 1024, 0},
                 View{733, 8192, 16}, View{3, 3200000, 0}, View{2049, 24, 16}}) {
    const int64_t rows = v.rows, cols = v.cols, n = rows * cols;
    const std::string sz =
        " " + std::to_string(rows) + "x" + std::to_string(cols) + " pad " + std::to_string(v.pad);
    const std::vector<float> g = rnd(n, -6, 6), u = rnd(n, -2, 2), d = rnd(n, -1, 1), s = rnd(rows, -3, 3);
    const char* names[] = {"swiglu_bwd dgate",   "swiglu_bwd dup", "scale_rows",
                           "add_gaussian_noise", "fill f32",       "fill bf16"};
    std::vector<float> out[2][6];
    for (int shifted = 0; shifted < 2; ++shifted) {
      const int64_t pad = v.pad + (shifted ? kShift : 0);
      Tensor gg = dev(DType::bf16, rows, cols, pad, &g), gu = dev(DType::bf16, rows, cols, pad, &u);
      Tensor gd = dev(DType::bf16, rows, cols, pad, &d);
      Tensor gdg = dev(DType::bf16, rows, cols, pad), gdu = dev(DType::bf16, rows, cols, pad);
      gpu_->swiglu_bwd(gg, gu, gd, gdg, gdu);
      Tensor gx = dev(DType::bf16, rows, cols, pad, &u);
      gpu_->scale_rows(gx, dev(DType::f32, 1, rows, 0, &s));
      Tensor gn = dev(DType::bf16, rows, cols, pad, &d);
      gpu_->add_gaussian_noise(gn, 0.05f, 987654321ull);
      Tensor ff = dev(DType::f32, rows, cols, pad), fb = dev(DType::bf16, rows, cols, pad);
      gpu_->fill(ff, 0.3f);
      gpu_->fill(fb, -1.7f);
      const Tensor* res[] = {&gdg, &gdu, &gx, &gn, &ff, &fb};
      for (int i = 0; i < 6; ++i) {
        out[shifted][i] = down(*res[i]);
        const std::vector<float> all = down(padded(*res[i], pad));
        int64_t written = 0;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols + pad; ++c)
            written += (c < pad / 2 || c >= pad / 2 + cols) && !std::isnan(all[size_t(r * (cols + pad) + c)]);
        EXPECT_EQ(written, 0) << names[i] << sz << (shifted ? " shifted" : "") << ": " << written
                              << " padding elements written";
      }
      for (void* p : gpu_mem_) gpu_->free_bytes(p);
      gpu_mem_.clear();
    }
    for (int i = 0; i < 6; ++i) expect_same_bits(out[0][i], out[1][i], cols, names[i] + sz);
  }
}

// More than 2^31 elements in one row (the size of the flat gradient buffer's index space): the 16-byte fill
// reaches the elements on both sides of 2^31 and the last ones.
TEST_F(CudaTrainOpsTest, FillPast2To31Elements) {
  const int64_t cols = (int64_t(1) << 31) + 64;
  Tensor b = dev(DType::bf16, 1, cols);
  gpu_->fill(b, 0.25f);
  for (int64_t c0 : {int64_t(0), (int64_t(1) << 31) - 64, cols - 64})
    expect_equal(down(b.cols_view(c0, 64)), std::vector<float>(64, 0.25f), 1, 64,
                 "fill bf16 [1, 2^31 + 64] from column " + std::to_string(c0));
}

// ---- optimizer
// ----------------------------------------------------------------------------------------------

TEST_F(CudaTrainOpsTest, SumSquaresMatchesCpuDoubleAndRepeats) {
  for (int64_t n : {int64_t(1), int64_t(7), int64_t(1000), (int64_t(1) << 20) + 3}) {
    std::uniform_real_distribution<float> d(-3.0f, 3.0f);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = d(rng_);
    const double want = cpu_ops_.sum_squares(cpu(1, n, v));
    Tensor g = dev(DType::f32, 1, n, 0, &v);
    const double got = gpu_->sum_squares(g), again = gpu_->sum_squares(g);
    // Both sum the exact double squares of floats in double, in different orders: n·2^-53 relative at most.
    const double tol = (double(n) + 2) * 0x1.0p-53 * want;
    std::printf("[ maxerr ] sum_squares n %-10lld gpu %.17g cpu %.17g |err| %.3e tol %.3e\n", (long long)n,
                got, want, std::fabs(got - want), tol);
    EXPECT_LE(std::fabs(got - want), tol) << "sum_squares n " << n << ": gpu " << got << " cpu " << want;
    EXPECT_EQ(std::memcmp(&got, &again, sizeof(double)), 0)
        << "sum_squares n " << n << " differs between calls";
  }
}

TEST_F(CudaTrainOpsTest, AdamwBitIdenticalToCpuWithShadow) {
  for (int64_t n : {1, 1000, 1000003}) {
    const int64_t n_decay = n * 3 / 5;
    std::vector<float> p = rnd(n, -1, 1), m(size_t(n), 0.0f), v(size_t(n), 0.0f);
    Tensor cp = cpu(1, n, p), cm = cpu(1, n, m), cv = cpu(1, n, v);
    Tensor gp = dev(DType::f32, 1, n, 0, &p), gm = dev(DType::f32, 1, n, 0, &m),
           gv = dev(DType::f32, 1, n, 0, &v);
    Tensor glp = dev(DType::bf16, 1, n);
    TrainOps::AdamW hp;
    hp.lr = 1e-3f;
    hp.weight_decay = 0.1f;
    hp.grad_scale = 0.5f;
    hp.n_decay = n_decay;
    for (int64_t step = 1; step <= 3; ++step) {
      hp.step_t = step;
      std::vector<float> g = rnd(n, -2, 2);
      if (n > 1) g[1] = 0.0f;  // m, v from zero gradients: the update's 0/(0 + eps) path
      cpu_ops_.adamw(cp, cpu(1, n, g), cm, cv, Tensor{}, hp);
      gpu_->adamw(gp, dev(DType::f32, 1, n, 0, &g), gm, gv, step == 2 ? Tensor{} : glp, hp);
      // The kernel performs the CPU's exact sequence of IEEE f32/double operations: the same bits, so
      // any difference is a formula change (the expected count of differing elements is 0).
      const std::string s = " n " + std::to_string(n) + " step " + std::to_string(step);
      expect_equal(down(gp), host(cp), 1, n, "adamw p" + s);
      expect_equal(down(gm), host(cm), 1, n, "adamw m" + s);
      expect_equal(down(gv), host(cv), 1, n, "adamw v" + s);
      if (step == 2) continue;  // no shadow this step; it still holds step 1's weights
      std::vector<float> pg = down(gp), shadow = down(glp);
      for (float& x : pg) x = bf16_round(x);
      expect_equal(shadow, pg, 1, n, "adamw shadow == bf16(p)" + s);
    }
  }
}

// ---- checks
// -------------------------------------------------------------------------------------------------

TEST_F(CudaTrainOpsTest, BadInputsNameTheOpAndTensor) {
  Tensor x32 = dev(DType::f32, 4, 8), w = dev(DType::f32, 1, 8), y = dev(DType::bf16, 4, 8),
         rs = dev(DType::f32, 1, 4);
  try {
    gpu_->rmsnorm_fwd(x32, w, y, rs, 1e-6f);
    ADD_FAILURE() << "rmsnorm_fwd accepted an f32 x";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rmsnorm_fwd"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'x'"), std::string::npos) << e.what();
  }
  Tensor a = dev(DType::bf16, 4, 8), b = dev(DType::bf16, 5, 8), c = dev(DType::f32, 4, 5);
  EXPECT_THROW(gpu_->gemm(a, false, b, false, c, 1.0f, 0.0f), Error) << "K mismatch (8 vs 5) must be refused";
  // gemm_add's c_in: out itself or apart from it; a view one row down overlaps without being it.
  Tensor w5 = dev(DType::bf16, 5, 8), c2 = dev(DType::f32, 5, 5);
  EXPECT_THROW(gpu_->gemm_add(a, false, w5, true, c2.rows_view(1, 4), c2.rows_view(0, 4), 1.0f, 1.0f), Error)
      << "c_in overlapping out without being it must be refused";
  EXPECT_THROW(gpu_->gemm_add(a, false, w5, true, dev(DType::bf16, 4, 5), c, 1.0f, 1.0f), Error)
      << "c_in of another dtype than out must be refused";
  Tensor big = dev(DType::f32, 1, 10), small = dev(DType::f32, 1, 9);
  EXPECT_THROW(gpu_->adamw(big, small, big, big, Tensor{}, TrainOps::AdamW{}), Error)
      << "g of another length";
}

}  // namespace
#endif
