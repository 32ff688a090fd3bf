// CpuOps: every op of ops.h in plain fp32 on the host. Norm and softmax reductions follow MODELS.md
// literally so this file can serve as the numerical definition the CUDA kernels are tested against.
#include "ops/cpu/cpu_ops.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "core/dtype.h"
#include "core/fp8.h"
#include "core/rng.h"
#include "core/rope_freq.h"
#include "ops/cpu/cpu_gdn.h"

#ifdef DF_HAVE_CBLAS
#include <cblas.h>
#endif

namespace df {

void cpu_check_f32(const char* op, const char* what, const Tensor& t, int64_t rows, int64_t cols) {
  DF_CHECK(t.device == Device::cpu, "%s: %s must live in host memory for the CPU backend", op, what);
  DF_CHECK(t.dtype == DType::f32, "%s: %s must be f32 on the CPU backend, got %s", op, what, t.shape_str().c_str());
  DF_CHECK((rows < 0 || t.rows == rows) && (cols < 0 || t.cols == cols), "%s: %s is %s, expected [%lld, %lld]", op,
           what, t.shape_str().c_str(), (long long)rows, (long long)cols);
  DF_CHECK(t.stride >= t.cols || t.rows <= 1, "%s: %s has row stride %lld < cols", op, what, (long long)t.stride);
  DF_CHECK(t.data != nullptr || t.numel() == 0, "%s: %s has no memory", op, what);
}

void cpu_check_i32(const char* op, const char* what, const Tensor& t, int64_t rows, int64_t cols) {
  DF_CHECK(t.device == Device::cpu && t.dtype == DType::i32 && t.rows == rows && t.cols == cols,
           "%s: %s must be host i32 [%lld, %lld], got %s", op, what, (long long)rows, (long long)cols,
           t.shape_str().c_str());
}

void cpu_check_layout(const char* op, const SeqLayout& seqs, int64_t tokens) {
  const auto& cu = seqs.cu_host;
  DF_CHECK(seqs.num_seqs >= 0 && cu.size() == size_t(seqs.num_seqs) + 1,
           "%s: SeqLayout has %zu host offsets for %d sequences (want num_seqs + 1)", op, cu.size(), seqs.num_seqs);
  DF_CHECK(cu[0] == 0 && cu.back() == tokens, "%s: SeqLayout offsets span [%d, %d] but the tensors have %lld tokens",
           op, cu[0], cu.back(), (long long)tokens);
  for (int s = 0; s < seqs.num_seqs; ++s)
    DF_CHECK(cu[s + 1] >= cu[s], "%s: SeqLayout offsets decrease at sequence %d", op, s);
}

namespace {

// Multiplier of the normalised value: w for Qwen3, (1 + w) for the zero-centred Qwen3.5 norms.
inline float norm_scale(const float* w, int64_t i, NormKind kind) {
  return kind == NormKind::plain ? w[i] : 1.0f + w[i];
}

// rsqrt(mean(x²) + eps); the sum of squares in double so the oracle's own rounding stays negligible.
inline float rms_inv(const float* x, int64_t n, float eps) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  return float(1.0 / std::sqrt(ss / double(n) + double(eps)));
}

// First token of the sequence each token belongs to (for causal windows and conv history).
std::vector<int64_t> seq_starts(const SeqLayout& seqs, int64_t tokens) {
  std::vector<int64_t> start(static_cast<size_t>(tokens));
  for (int s = 0; s < seqs.num_seqs; ++s)
    for (int64_t t = seqs.cu_host[s]; t < seqs.cu_host[s + 1]; ++t) start[size_t(t)] = seqs.cu_host[s];
  return start;
}

void check_host(const char* op, const Tensor& t) {
  DF_CHECK(t.device == Device::cpu, "%s: tensor %s must live in host memory for the CPU backend", op,
           t.shape_str().c_str());
  DF_CHECK(t.data != nullptr || t.numel() == 0, "%s: tensor %s has no memory", op, t.shape_str().c_str());
}

float load_float(const char* row, DType dt, int64_t i) {
  switch (dt) {
    case DType::f32: return reinterpret_cast<const float*>(row)[i];
    case DType::bf16: return bf16_to_f32(reinterpret_cast<const uint16_t*>(row)[i]);
    case DType::f16: return f16_to_f32(reinterpret_cast<const uint16_t*>(row)[i]);
    default: DF_FAIL("load_float: %s is not a float dtype", dtype_name(dt));
  }
}

void store_float(char* row, DType dt, int64_t i, float v) {
  switch (dt) {
    case DType::f32: reinterpret_cast<float*>(row)[i] = v; return;
    case DType::bf16: reinterpret_cast<uint16_t*>(row)[i] = f32_to_bf16(v); return;
    default: DF_FAIL("store_float: cannot store into %s on the CPU backend (f32 or bf16 only)", dtype_name(dt));
  }
}

}  // namespace

float cpu_norm_row(const float* x, const float* w, float* out, int64_t n, float eps, NormKind kind) {
  const float r = rms_inv(x, n, eps);  // each element is read before it is written, so out may equal x
  for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * r) * norm_scale(w, i, kind);
  return r;
}

std::vector<float> cpu_rope_inv_freq(int rot_dim, float theta) {
  std::vector<float> inv_freq(static_cast<size_t>(rot_dim / 2));
  for (int j = 0; j < rot_dim / 2; ++j) inv_freq[size_t(j)] = rope_inv_freq(j, rot_dim, theta);
  return inv_freq;
}

void cpu_rope_cos_sin(int32_t pos, const std::vector<float>& inv_freq, float* cs, float* sn) {
  for (size_t j = 0; j < inv_freq.size(); ++j) {
    const float ang = float(pos) * inv_freq[j];
    cs[j] = float(std::cos(double(ang)));
    sn[j] = float(std::sin(double(ang)));
  }
}

// ---- GEMM ---------------------------------------------------------------------------------------------

bool cpu_gemm_uses_blas() {
#ifdef DF_HAVE_CBLAS
  return true;
#else
  return false;
#endif
}

void cpu_gemm_loop(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* w, int64_t ldw,
                   float beta, float* c, int64_t ldc) {
  // Blocks of kMb rows of a by kNb rows of w; each task packs its w block transposed (kKb x kNb, 64 KiB) so
  // the inner loop is a contiguous fixed-width axpy the compiler vectorises. Each c element is summed in
  // the same k order whatever the thread count, so results are reproducible.
  constexpr int64_t kMb = 32, kNb = 64, kKb = 256;
  const int64_t mblocks = (m + kMb - 1) / kMb, nblocks = (n + kNb - 1) / kNb;
#pragma omp parallel
  {
    std::vector<float> wt(static_cast<size_t>(kKb * kNb));
    float acc[kNb];
#pragma omp for collapse(2) schedule(static)
    for (int64_t ib = 0; ib < mblocks; ++ib) {
      for (int64_t jb = 0; jb < nblocks; ++jb) {
        const int64_t i0 = ib * kMb, i1 = std::min(m, i0 + kMb);
        const int64_t j0 = jb * kNb, nb = std::min(n - j0, kNb);
        for (int64_t i = i0; i < i1; ++i) {
          float* cr = c + i * ldc + j0;
          for (int64_t jj = 0; jj < nb; ++jj) cr[jj] = beta == 0.0f ? 0.0f : beta * cr[jj];
        }
        for (int64_t k0 = 0; k0 < k; k0 += kKb) {
          const int64_t kb = std::min(k - k0, kKb);
          std::fill(wt.begin(), wt.end(), 0.0f);
          for (int64_t jj = 0; jj < nb; ++jj) {
            const float* wr = w + (j0 + jj) * ldw + k0;
            for (int64_t kk = 0; kk < kb; ++kk) wt[size_t(kk * kNb + jj)] = wr[kk];
          }
          for (int64_t i = i0; i < i1; ++i) {
            float* cr = c + i * ldc + j0;
            const float* ar = a + i * lda + k0;
            for (int64_t jj = 0; jj < kNb; ++jj) acc[jj] = jj < nb ? cr[jj] : 0.0f;
            for (int64_t kk = 0; kk < kb; ++kk) {
              const float av = ar[kk];
              const float* wr = wt.data() + kk * kNb;
#pragma omp simd
              for (int64_t jj = 0; jj < kNb; ++jj) acc[jj] += av * wr[jj];
            }
            for (int64_t jj = 0; jj < nb; ++jj) cr[jj] = acc[jj];
          }
        }
      }
    }
  }
}

void cpu_gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // No product: c = beta · c, zeros for beta 0 without reading c (BLAS implementations differ on whether
    // they touch c at all when k is 0).
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
#ifdef DF_HAVE_CBLAS
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, int(m),
              int(n), int(k), alpha, a, int(lda), b, int(ldb), beta, c, int(ldc));
#else
  if (!trans_a && trans_b && alpha == 1.0f) return cpu_gemm_loop(m, n, k, a, lda, b, ldb, beta, c, ldc);
#pragma omp parallel for schedule(static) if (m * n * k >= (int64_t(1) << 15))
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p)
        acc +=
            double(trans_a ? a[p * lda + i] : a[i * lda + p]) * (trans_b ? b[j * ldb + p] : b[p * ldb + j]);
      c[i * ldc + j] = float(alpha * acc + (beta == 0.0f ? 0.0 : double(beta) * c[i * ldc + j]));
    }
  }
#endif
}

void CpuOps::gemm(const Tensor& a, const Tensor& w, const Tensor& c, float beta) {
  cpu_check_f32("gemm", "a", a, -1, -1);
  cpu_check_f32("gemm", "w", w, -1, a.cols);
  cpu_check_f32("gemm", "c", c, a.rows, w.rows);
  const int64_t m = a.rows, n = w.rows, k = a.cols;
  // A single-row view may carry any stride; BLAS wants leading dimensions >= max(1, row length).
  const int64_t lda = std::max({a.stride, k, int64_t(1)}), ldw = std::max({w.stride, k, int64_t(1)});
  const int64_t ldc = std::max(c.stride, n);
  cpu_gemm(false, true, m, n, k, 1.0f, a.ptr<float>(), lda, w.ptr<float>(), ldw, beta, c.ptr<float>(), ldc);
}

// ---- memory -------------------------------------------------------------------------------------------

void* CpuOps::alloc_bytes(size_t bytes) {
  const size_t align = 256;
  const size_t rounded = std::max(align, (bytes + align - 1) / align * align);
  void* p = std::aligned_alloc(align, rounded);
  DF_CHECK(p != nullptr, "CpuOps::alloc_bytes: out of host memory allocating %zu bytes", bytes);
  return p;
}

void CpuOps::free_bytes(void* p) { std::free(p); }

void CpuOps::upload_f32(const Tensor& dst, const float* host) {
  check_host("upload_f32", dst);
  for (int64_t r = 0; r < dst.rows; ++r) {
    char* row = dst.row_bytes(r);
    const float* src = host + r * dst.cols;
    if (dst.dtype == DType::f32) {
      std::memcpy(row, src, size_t(dst.cols) * 4);
    } else {
      for (int64_t i = 0; i < dst.cols; ++i) store_float(row, dst.dtype, i, src[i]);
    }
  }
}

void CpuOps::fill_normal(const Tensor& dst, uint64_t seed, uint64_t stream, float mean, float std) {
  check_host("fill_normal", dst);
  DF_CHECK(dst.dtype == DType::f32 || dst.dtype == DType::bf16, "fill_normal: destination %s must be f32 or bf16",
           dst.shape_str().c_str());
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < dst.rows; ++r) {
    char* row = dst.row_bytes(r);
    for (int64_t c = 0; c < dst.cols; ++c)
      store_float(row, dst.dtype, c, mean + std * rng_normal_at(seed, stream, uint64_t(r * dst.cols + c)));
  }
}

void CpuOps::upload_raw(const Tensor& dst, const void* host) {
  check_host("upload_raw", dst);
  const size_t row_bytes = size_t(dst.cols) * dtype_size(dst.dtype);
  for (int64_t r = 0; r < dst.rows; ++r)
    std::memcpy(dst.row_bytes(r), static_cast<const char*>(host) + size_t(r) * row_bytes, row_bytes);
}

void CpuOps::download_raw(const Tensor& src, void* host) {
  check_host("download_raw", src);
  const size_t row_bytes = size_t(src.cols) * dtype_size(src.dtype);
  for (int64_t r = 0; r < src.rows; ++r)
    std::memcpy(static_cast<char*>(host) + size_t(r) * row_bytes, src.row_bytes(r), row_bytes);
}

void CpuOps::download_f32(const Tensor& src, float* host) {
  check_host("download_f32", src);
  for (int64_t r = 0; r < src.rows; ++r) {
    const char* row = src.row_bytes(r);
    float* dst = host + r * src.cols;
    if (src.dtype == DType::f32) {
      std::memcpy(dst, row, size_t(src.cols) * 4);
    } else {
      for (int64_t i = 0; i < src.cols; ++i) dst[i] = load_float(row, src.dtype, i);
    }
  }
}

void CpuOps::copy(const Tensor& src, const Tensor& dst) {
  check_host("copy", src);
  check_host("copy", dst);
  DF_CHECK(src.rows == dst.rows && src.cols == dst.cols, "copy: shapes differ, src %s vs dst %s",
           src.shape_str().c_str(), dst.shape_str().c_str());
  for (int64_t r = 0; r < src.rows; ++r) {
    if (src.dtype == dst.dtype) {
      std::memmove(dst.row_bytes(r), src.row_bytes(r), size_t(src.cols) * dtype_size(src.dtype));
    } else {
      for (int64_t i = 0; i < src.cols; ++i)
        store_float(dst.row_bytes(r), dst.dtype, i, load_float(src.row_bytes(r), src.dtype, i));
    }
  }
}

// ---- elementwise and norms ----------------------------------------------------------------------------

void CpuOps::embedding(const Tensor& ids, const Tensor& table, const Tensor& out) {
  DF_CHECK(ids.dtype == DType::i32 && ids.rows == 1 && ids.device == Device::cpu,
           "embedding: ids must be host i32 [1, T], got %s", ids.shape_str().c_str());
  cpu_check_f32("embedding", "table", table, -1, -1);
  cpu_check_f32("embedding", "out", out, ids.cols, table.cols);
  const int32_t* id = ids.ptr<int32_t>();
  // Checked here although the caller validates too: a bad id would otherwise read outside the table.
  for (int64_t t = 0; t < ids.cols; ++t)
    DF_CHECK(id[t] >= 0 && id[t] < table.rows, "embedding: token id %d at %lld outside vocab %lld", id[t],
             (long long)t, (long long)table.rows);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < ids.cols; ++t) std::memcpy(cpu_row(out, t), cpu_row(table, id[t]), size_t(table.cols) * 4);
}

void CpuOps::rmsnorm(const Tensor& x, const Tensor& w, const Tensor& out, float eps, NormKind kind) {
  cpu_check_f32("rmsnorm", "x", x, -1, -1);
  cpu_check_f32("rmsnorm", "w", w, 1, x.cols);
  cpu_check_f32("rmsnorm", "out", out, x.rows, x.cols);
  const float* wp = w.ptr<float>();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < x.rows; ++t) cpu_norm_row(cpu_row(x, t), wp, cpu_row(out, t), x.cols, eps, kind);
}

void CpuOps::add_rmsnorm(const Tensor& residual, const Tensor& delta, const Tensor& w, const Tensor& out, float eps,
                         NormKind kind) {
  cpu_check_f32("add_rmsnorm", "residual", residual, -1, -1);
  cpu_check_f32("add_rmsnorm", "delta", delta, residual.rows, residual.cols);
  cpu_check_f32("add_rmsnorm", "w", w, 1, residual.cols);
  cpu_check_f32("add_rmsnorm", "out", out, residual.rows, residual.cols);
  const float* wp = w.ptr<float>();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < residual.rows; ++t) {
    float* r = cpu_row(residual, t);
    const float* d = cpu_row(delta, t);
    for (int64_t i = 0; i < residual.cols; ++i) r[i] += d[i];
    cpu_norm_row(r, wp, cpu_row(out, t), residual.cols, eps, kind);
  }
}

void CpuOps::qk_norm_rope(const Tensor& x, const Tensor& w, const Tensor& pos, int heads, int hd, int rot_dim,
                          float theta, float eps, NormKind kind) {
  DF_CHECK(heads > 0 && hd > 0 && rot_dim >= 0 && rot_dim <= hd && rot_dim % 2 == 0,
           "qk_norm_rope: need heads, hd > 0 and an even rot_dim in [0, hd], got heads %d hd %d rot_dim %d", heads,
           hd, rot_dim);
  cpu_check_f32("qk_norm_rope", "x", x, -1, int64_t(heads) * hd);
  cpu_check_f32("qk_norm_rope", "w", w, 1, hd);
  DF_CHECK(pos.dtype == DType::i32 && pos.device == Device::cpu && pos.rows == 1 && pos.cols == x.rows,
           "qk_norm_rope: pos must be host i32 [1, %lld], got %s", (long long)x.rows, pos.shape_str().c_str());
  const int half = rot_dim / 2;
  const std::vector<float> inv_freq = cpu_rope_inv_freq(rot_dim, theta);
  const float* wp = w.ptr<float>();
  const int32_t* pp = pos.ptr<int32_t>();
#pragma omp parallel
  {
    std::vector<float> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < x.rows; ++t) {
      cpu_rope_cos_sin(pp[t], inv_freq, cs.data(), sn.data());
      for (int h = 0; h < heads; ++h) {
        float* v = cpu_row(x, t) + int64_t(h) * hd;
        cpu_norm_row(v, wp, v, hd, eps, kind);
        cpu_rope_rotate(v, half, cs.data(), sn.data());
      }
    }
  }
}

void CpuOps::sigmoid_gate(const Tensor& o, const Tensor& gate) {
  cpu_check_f32("sigmoid_gate", "o", o, -1, -1);
  cpu_check_f32("sigmoid_gate", "gate", gate, o.rows, o.cols);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < o.rows; ++t) {
    float* op = cpu_row(o, t);
    const float* g = cpu_row(gate, t);
    for (int64_t i = 0; i < o.cols; ++i) op[i] *= cpu_sigmoid(g[i]);
  }
}

void CpuOps::swiglu(const Tensor& gate, const Tensor& up, const Tensor& out) {
  cpu_check_f32("swiglu", "gate", gate, -1, -1);
  cpu_check_f32("swiglu", "up", up, gate.rows, gate.cols);
  cpu_check_f32("swiglu", "out", out, gate.rows, gate.cols);
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < gate.rows; ++t) {
    const float* g = cpu_row(gate, t);
    const float* u = cpu_row(up, t);
    float* op = cpu_row(out, t);
    for (int64_t i = 0; i < gate.cols; ++i) op[i] = cpu_silu(g[i]) * u[i];
  }
}

void cpu_fp8_round(float* x, int64_t rows, int64_t cols, int64_t stride, int64_t group) {
  const int64_t g = group > 0 ? group : std::max<int64_t>(cols, 1);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c0 = 0; c0 < cols; c0 += g) {
      float* v = x + r * stride + c0;
      const int64_t n = std::min(g, cols - c0);
      float amax = 0.0f;
      for (int64_t c = 0; c < n; ++c) amax = std::max(amax, std::fabs(v[c]));
      if (!(amax > 0.0f)) continue;  // zeros stay zeros; a NaN group stays NaN
      const float scale = e4m3_scale(amax), inv = e4m3_inv_scale(scale);
      for (int64_t c = 0; c < n; ++c) v[c] = e4m3_to_f32(e4m3_quantize(v[c], inv)) * scale;
    }
  }
}

void CpuOps::fp8_round_rows(const Tensor& x, int64_t group) {
  cpu_check_f32("fp8_round_rows", "x", x, -1, -1);
  DF_CHECK(group >= 0, "fp8_round_rows %s: group %lld must be 0 (whole rows) or positive",
           x.shape_str().c_str(), (long long)group);
  cpu_fp8_round(x.ptr<float>(), x.rows, x.cols, x.stride, group);
}

void CpuOps::gated_rmsnorm(const Tensor& o, const Tensor& z, const Tensor& w, const Tensor& out, int heads, int dv,
                           float eps) {
  DF_CHECK(heads > 0 && dv > 0, "gated_rmsnorm: heads %d and dv %d must be positive", heads, dv);
  cpu_check_f32("gated_rmsnorm", "o", o, -1, int64_t(heads) * dv);
  cpu_check_f32("gated_rmsnorm", "z", z, o.rows, o.cols);
  cpu_check_f32("gated_rmsnorm", "w", w, 1, dv);
  cpu_check_f32("gated_rmsnorm", "out", out, o.rows, o.cols);
  const float* wp = w.ptr<float>();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < o.rows; ++t) {
    for (int h = 0; h < heads; ++h) {
      const float* op = cpu_row(o, t) + int64_t(h) * dv;
      const float* zp = cpu_row(z, t) + int64_t(h) * dv;
      float* outp = cpu_row(out, t) + int64_t(h) * dv;
      const float r = rms_inv(op, dv, eps);
      for (int i = 0; i < dv; ++i) outp[i] = (wp[i] * (op[i] * r)) * cpu_silu(zp[i]);
    }
  }
}

// ---- sequence ops -------------------------------------------------------------------------------------

namespace {

// Softmax attention of one query row of head h over key rows [j0, j1]: the inner loop of both causal forms.
// p holds ≥ j1 − j0 + 1 scores, acc hd floats.
void attend_row(const float* qr, const Tensor& k, const Tensor& v, int64_t j0, int64_t j1, int kvh, int hd,
                float scale, float* p, float* acc, float* orow) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = j0; j <= j1; ++j) {
    const float* kr = cpu_row(k, j) + int64_t(kvh) * hd;
    float d = 0.0f;
#pragma omp simd reduction(+ : d)
    for (int e = 0; e < hd; ++e) d += qr[e] * kr[e];
    d *= scale;
    p[j - j0] = d;
    mx = std::max(mx, d);
  }
  float sum = 0.0f;
  std::fill(acc, acc + hd, 0.0f);
  for (int64_t j = j0; j <= j1; ++j) {
    const float e = std::exp(p[j - j0] - mx);
    sum += e;
    const float* vr = cpu_row(v, j) + int64_t(kvh) * hd;
#pragma omp simd
    for (int i = 0; i < hd; ++i) acc[i] += e * vr[i];
  }
  const float inv = 1.0f / sum;
  for (int i = 0; i < hd; ++i) orow[i] = acc[i] * inv;
}

}  // namespace

void CpuOps::attention_causal(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                              const SeqLayout& seqs, int hq, int hkv, int hd, float scale, const Tensor* gate) {
  DF_CHECK(hq > 0 && hkv > 0 && hd > 0 && hq % hkv == 0,
           "attention_causal: q heads %d must be a positive multiple of kv heads %d (hd %d)", hq, hkv, hd);
  cpu_check_f32("attention_causal", "q", q, -1, int64_t(hq) * hd);
  cpu_check_f32("attention_causal", "k", k, q.rows, int64_t(hkv) * hd);
  cpu_check_f32("attention_causal", "v", v, q.rows, int64_t(hkv) * hd);
  cpu_check_f32("attention_causal", "out", out, q.rows, int64_t(hq) * hd);
  cpu_check_layout("attention_causal", seqs, q.rows);
  if (gate) cpu_check_f32("attention_causal", "gate", *gate, q.rows, int64_t(hq) * hd);
  const std::vector<int64_t> start = seq_starts(seqs, q.rows);
  int64_t max_len = 0;
  for (int s = 0; s < seqs.num_seqs; ++s) max_len = std::max<int64_t>(max_len, seqs.cu_host[s + 1] - seqs.cu_host[s]);
  const int group = hq / hkv;
  const int64_t tokens = q.rows;
#pragma omp parallel
  {
    std::vector<float> p(size_t(std::max<int64_t>(max_len, 1))), acc(static_cast<size_t>(hd));
    // Work per (token, head) grows with the position, hence dynamic scheduling.
#pragma omp for schedule(dynamic, 8)
    for (int64_t idx = 0; idx < tokens * hq; ++idx) {
      const int64_t t = idx / hq;
      const int h = int(idx % hq);
      attend_row(cpu_row(q, t) + int64_t(h) * hd, k, v, start[size_t(t)], t, h / group, hd, scale, p.data(),
                 acc.data(), cpu_row(out, t) + int64_t(h) * hd);
    }
  }
  if (gate) sigmoid_gate(out, *gate);
}

void CpuOps::attention_cached(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, int64_t past,
                              int hq, int hkv, int hd, float scale, const Tensor* gate) {
  DF_CHECK(hq > 0 && hkv > 0 && hd > 0 && hq % hkv == 0,
           "attention_cached: q heads %d must be a positive multiple of kv heads %d (hd %d)", hq, hkv, hd);
  cpu_check_f32("attention_cached", "q", q, -1, int64_t(hq) * hd);
  cpu_check_f32("attention_cached", "k", k, -1, int64_t(hkv) * hd);
  cpu_check_f32("attention_cached", "v", v, k.rows, int64_t(hkv) * hd);
  cpu_check_f32("attention_cached", "out", out, q.rows, int64_t(hq) * hd);
  DF_CHECK(past >= 0 && past + q.rows <= k.rows,
           "attention_cached: %lld cached + %lld new tokens exceed the %lld cache rows given", (long long)past,
           (long long)q.rows, (long long)k.rows);
  if (gate) cpu_check_f32("attention_cached", "gate", *gate, q.rows, int64_t(hq) * hd);
  const int group = hq / hkv;
  const int64_t tokens = q.rows;
#pragma omp parallel
  {
    std::vector<float> p(size_t(past + tokens)), acc(static_cast<size_t>(hd));
#pragma omp for schedule(static)
    for (int64_t idx = 0; idx < tokens * hq; ++idx) {
      const int64_t t = idx / hq;
      const int h = int(idx % hq);
      attend_row(cpu_row(q, t) + int64_t(h) * hd, k, v, 0, past + t, h / group, hd, scale, p.data(), acc.data(),
                 cpu_row(out, t) + int64_t(h) * hd);
    }
  }
  if (gate) sigmoid_gate(out, *gate);
}

void CpuOps::conv1d_silu(const Tensor& x, const Tensor& w, const Tensor& out, const SeqLayout& seqs) {
  cpu_check_f32("conv1d_silu", "x", x, -1, -1);
  cpu_check_f32("conv1d_silu", "w", w, x.cols, -1);
  cpu_check_f32("conv1d_silu", "out", out, x.rows, x.cols);
  cpu_check_layout("conv1d_silu", seqs, x.rows);
  DF_CHECK(x.data != out.data || x.numel() == 0,
           "conv1d_silu: out must not alias x (later rows read earlier inputs); use a separate buffer");
  const int64_t C = x.cols, K = w.cols;
  // Tap-major copy of the weights so the channel loop below reads both operands contiguously.
  std::vector<float> wt(static_cast<size_t>(K * C));
  for (int64_t c = 0; c < C; ++c)
    for (int64_t j = 0; j < K; ++j) wt[size_t(j * C + c)] = cpu_row(w, c)[j];
  const std::vector<int64_t> start = seq_starts(seqs, x.rows);
#pragma omp parallel
  {
    std::vector<float> acc(static_cast<size_t>(C));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < x.rows; ++t) {
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < K; ++j) {
        const int64_t src = t - K + 1 + j;
        if (src < start[size_t(t)]) continue;
        const float* xr = cpu_row(x, src);
        const float* wr = wt.data() + j * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) acc[size_t(c)] += wr[c] * xr[c];
      }
      float* orow = cpu_row(out, t);
      for (int64_t c = 0; c < C; ++c) orow[c] = cpu_silu(acc[size_t(c)]);
    }
  }
}

void CpuOps::gdn_prefill(const Tensor& qkv, const Tensor& a, const Tensor& b, const Tensor& A_log,
                         const Tensor& dt_bias, const Tensor& out, const SeqLayout& seqs,
                         const GdnShape& shape, const Tensor& /*workspace*/) {
  if (gdn_mode_ == CpuGdnMode::recurrent) {
    cpu_gdn_recurrent(qkv, a, b, A_log, dt_bias, out, seqs, shape);
  } else {
    cpu_gdn_chunked(qkv, a, b, A_log, dt_bias, out, seqs, shape, kCpuGdnChunk);
  }
}

void CpuOps::gdn_decode(const Tensor& qkv, const Tensor& a, const Tensor& b, const Tensor& A_log,
                        const Tensor& dt_bias, const Tensor& out, const Tensor& state, const Tensor& states,
                        const GdnShape& shape) {
  cpu_gdn_decode(qkv, a, b, A_log, dt_bias, out, state, states, shape);
}

}  // namespace df
