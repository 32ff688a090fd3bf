// CpuTrainOps: the drafter's training ops in fp32 on the host, double accumulators in every reduction, the
// target's CpuOps math where it is the same (GEMM, RMSNorm, RoPE angles, embedding, SwiGLU). Parameter-gradient
// reductions run column-parallel (each thread owns whole columns) to stay deterministic.
#include "ops/cpu/cpu_train_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/rng.h"

namespace df {

namespace {

// dst = beta · dst + v; beta 0 never reads dst (an optimizer step's first backward writes over whatever the
// last step left there, NaN included).
inline void cpu_beta_add(float& dst, float beta, float v) {
  dst = beta == 0.0f ? v : beta * dst + v;
}

// Below ~32k multiply-adds a parallel region costs more than it saves (and on an oversubscribed host a
// barrier can cost milliseconds), so small ops run on the calling thread.
inline bool cpu_parallel_worth(int64_t work) { return work >= (int64_t(1) << 15); }

// The key rows query offset k of block (s0, a) may see, as two ranges: context rows [c0, c1) and block rows
// [b0, b1) (absolute rows of k/v).
struct KeyRanges {
  int64_t c0, c1, b0, b1;
};

inline KeyRanges key_ranges(int64_t T, int64_t j, int k, int64_t s0, int64_t a, const DFlashAttnShape& s) {
  KeyRanges r;
  int64_t lo = s.window > 0 ? std::max<int64_t>(0, a + k - (s.window - 1)) : 0;
  r.c0 = s0 + std::min(lo, a);
  r.c1 = s0 + a;
  r.b0 = T + j * s.block;
  r.b1 = r.b0 + (s.window > 0 ? k + 1 : s.block);
  return r;
}

inline double dot(const float* a, const float* b, int n) {
  double acc = 0;
  for (int i = 0; i < n; ++i) acc += double(a[i]) * b[i];
  return acc;
}

// Scores of one query row against its visible keys (context range then block range) into sc.
inline int attn_scores(const Tensor& k, const float* qh, int g, const KeyRanges& kr, const DFlashAttnShape& s,
                       std::vector<double>& sc) {
  int n = 0;
  for (int pass = 0; pass < 2; ++pass) {
    int64_t r0 = pass == 0 ? kr.c0 : kr.b0, r1 = pass == 0 ? kr.c1 : kr.b1;
    for (int64_t t = r0; t < r1; ++t) sc[n++] = s.scale * dot(qh, cpu_row(k, t) + g * s.hd, s.hd);
  }
  return n;
}

inline int64_t key_row(const KeyRanges& kr, int i) {
  int64_t nc = kr.c1 - kr.c0;
  return i < nc ? kr.c0 + i : kr.b0 + (i - nc);
}

void check_attn(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& blocks,
                const DFlashAttnShape& s) {
  DF_CHECK(s.hq > 0 && s.hkv > 0 && s.hq % s.hkv == 0 && s.hd > 0 && s.block > 0,
           "%s: bad head shape hq %d hkv %d hd %d block %d", op, s.hq, s.hkv, s.hd, s.block);
  DF_CHECK(s.window == 0 || s.window >= s.block, "%s: sliding window %d smaller than the block %d", op, s.window,
           s.block);
  int64_t nb = blocks.rows;
  cpu_check_i32(op, "blocks", blocks, nb, 2);
  cpu_check_f32(op, "q", q, nb * s.block, int64_t(s.hq) * s.hd);
  cpu_check_f32(op, "k", k, -1, int64_t(s.hkv) * s.hd);
  cpu_check_f32(op, "v", v, k.rows, int64_t(s.hkv) * s.hd);
  DF_CHECK(k.rows >= nb * s.block, "%s: k has %lld rows, fewer than the %lld block rows", op, (long long)k.rows,
           (long long)(nb * s.block));
  int64_t T = k.rows - nb * s.block;
  const int32_t* b = blocks.ptr<int32_t>();
  for (int64_t j = 0; j < nb; ++j)
    DF_CHECK(b[2 * j + 1] < 0 || (b[2 * j] >= 0 && b[2 * j] + b[2 * j + 1] <= T),
             "%s: block %lld (start %d, anchor %d) reaches past the %lld context rows", op, (long long)j, b[2 * j],
             b[2 * j + 1], (long long)T);
}

}  // namespace

float cpu_noise_normal(uint64_t seed, uint64_t i) {
  return rng_normal_at(seed, kRngStreamTrainNoise, i);
}

// ---- memory ---------------------------------------------------------------------------------------------

void* CpuTrainOps::alloc_bytes(size_t bytes) {
  void* p = ops_.alloc_bytes(bytes);
  std::memset(p, 0, bytes);
  return p;
}

void CpuTrainOps::free_bytes(void* p) {
  ops_.free_bytes(p);
}

void CpuTrainOps::upload_raw(const Tensor& dst, const void* host) {
  ops_.upload_raw(dst, host);
}

void CpuTrainOps::download_raw(const Tensor& src, void* host) {
  DF_CHECK(src.contiguous(), "download_raw: source %s must be contiguous", src.shape_str().c_str());
  if (src.nbytes() > 0) std::memcpy(host, src.data, src.nbytes());
}

void CpuTrainOps::copy(const Tensor& src, const Tensor& dst) {
  cpu_check_f32("copy", "src", src, -1, -1);
  cpu_check_f32("copy", "dst", dst, src.rows, src.cols);
#pragma omp parallel for schedule(static) if(cpu_parallel_worth(src.numel()))
  for (int64_t r = 0; r < src.rows; ++r)
    std::memcpy(cpu_row(dst, r), cpu_row(src, r), src.cols * sizeof(float));
}

void CpuTrainOps::fill(const Tensor& dst, float value) {
  cpu_check_f32("fill", "dst", dst, -1, -1);
#pragma omp parallel for schedule(static) if(cpu_parallel_worth(dst.numel()))
  for (int64_t r = 0; r < dst.rows; ++r) std::fill_n(cpu_row(dst, r), dst.cols, value);
}

// ---- dense ----------------------------------------------------------------------------------------------

void CpuTrainOps::gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, float alpha,
                       float beta) {
  const int64_t m = trans_a ? a.cols : a.rows, kk = trans_a ? a.rows : a.cols;
  const int64_t n = trans_b ? b.rows : b.cols;
  cpu_check_f32("gemm", "a", a, -1, -1);
  cpu_check_f32("gemm", "b", b, trans_b ? n : kk, trans_b ? kk : n);
  cpu_check_f32("gemm", "c", c, m, n);
  // A single-row view may carry any stride; BLAS wants leading dimensions >= max(1, row length).
  auto ld = [](const Tensor& t) { return std::max({t.stride, t.cols, int64_t(1)}); };
  cpu_gemm(trans_a, trans_b, m, n, kk, alpha, a.ptr<float>(), ld(a), b.ptr<float>(), ld(b), beta,
           c.ptr<float>(), ld(c));
}

// Exactly what the CUDA backend's out-of-place GEMM replaces: c_in copied into out, then the GEMM in place.
void CpuTrainOps::gemm_add(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c_in,
                           const Tensor& out, float alpha, float beta) {
  cpu_check_f32("gemm_add", "c_in", c_in, out.rows, out.cols);
  if (c_in.data == out.data && (c_in.stride == out.stride || out.rows <= 1)) {
    gemm(a, trans_a, b, trans_b, out, alpha, beta);
    return;
  }
  DF_CHECK(!tensor_spans_overlap(c_in, out), "gemm_add: c_in %s overlaps out %s without being it",
           c_in.shape_str().c_str(), out.shape_str().c_str());
  copy(c_in, out);
  gemm(a, trans_a, b, trans_b, out, alpha, beta);
}

void CpuTrainOps::embedding(const Tensor& ids, const Tensor& table, const Tensor& out) {
  ops_.embedding(ids, table, out);
}

void CpuTrainOps::scale_rows(const Tensor& x, const Tensor& s) {
  cpu_check_f32("scale_rows", "s", s, 1, x.rows);
#pragma omp parallel for schedule(static) if(cpu_parallel_worth(x.numel()))
  for (int64_t r = 0; r < x.rows; ++r) {
    float f = s.ptr<float>()[r];
    float* xr = cpu_row(x, r);
    for (int64_t c = 0; c < x.cols; ++c) xr[c] *= f;
  }
}

void CpuTrainOps::add_gaussian_noise(const Tensor& x, float std, uint64_t seed) {
  cpu_check_f32("add_gaussian_noise", "x", x, -1, -1);
#pragma omp parallel for schedule(static) if(cpu_parallel_worth(x.numel()))
  for (int64_t r = 0; r < x.rows; ++r)
    for (int64_t c = 0; c < x.cols; ++c)
      cpu_row(x, r)[c] += std * cpu_noise_normal(seed, uint64_t(r * x.cols + c));
}

// ---- normalisation and RoPE -----------------------------------------------------------------------------

void CpuTrainOps::rmsnorm_fwd(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& rstd, float eps) {
  const int64_t n = x.cols;
  cpu_check_f32("rmsnorm_fwd", "w", w, 1, n);
  cpu_check_f32("rmsnorm_fwd", "y", y, x.rows, n);
  cpu_check_f32("rmsnorm_fwd", "rstd", rstd, 1, x.rows);
  const float* wv = w.ptr<float>();
#pragma omp parallel for schedule(static) if(cpu_parallel_worth(x.numel()))
  for (int64_t r = 0; r < x.rows; ++r)
    rstd.ptr<float>()[r] = cpu_norm_row(cpu_row(x, r), wv, cpu_row(y, r), n, eps, NormKind::plain);
}

void CpuTrainOps::rmsnorm_bwd(const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dy,
                              const Tensor& dx, const Tensor& dw, float beta_dx, float beta_dw) {
  const int64_t n = x.cols, rows = x.rows;
  cpu_check_f32("rmsnorm_bwd", "dy", dy, rows, n);
  cpu_check_f32("rmsnorm_bwd", "dx", dx, rows, n);
  cpu_check_f32("rmsnorm_bwd", "dw", dw, 1, n);
  const float* wv = w.ptr<float>();
  const float* rs = rstd.ptr<float>();
  // dx = rstd · (ĝ − x̂ · mean(ĝ · x̂)) with ĝ = dy · w, x̂ = x · rstd.
#pragma omp parallel for schedule(static) if(cpu_parallel_worth(x.numel()))
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = cpu_row(x, r), *dyr = cpu_row(dy, r);
    double m = 0;
    for (int64_t i = 0; i < n; ++i) m += double(dyr[i]) * wv[i] * (double(xr[i]) * rs[r]);
    m /= double(n);
    float* dxr = cpu_row(dx, r);
    for (int64_t i = 0; i < n; ++i) {
      double xh = double(xr[i]) * rs[r];
      double g = rs[r] * (double(dyr[i]) * wv[i] - xh * m);
      dxr[i] = float(beta_dx == 0.0f ? g : beta_dx * dxr[i] + g);
    }
  }
#pragma omp parallel for schedule(static) if(cpu_parallel_worth(x.numel()))
  for (int64_t i = 0; i < n; ++i) {
    double acc = 0;
    for (int64_t r = 0; r < rows; ++r) acc += double(cpu_row(dy, r)[i]) * (double(cpu_row(x, r)[i]) * rs[r]);
    cpu_beta_add(dw.ptr<float>()[i], beta_dw, float(acc));
  }
}

void CpuTrainOps::qk_norm_rope_fwd(const Tensor& x, const Tensor& w, const Tensor& pos, const Tensor& y,
                                   const Tensor& rstd, int heads, int hd, float theta, float eps) {
  DF_CHECK(hd % 2 == 0, "qk_norm_rope_fwd: head dim %d must be even for rotate-half RoPE", hd);
  cpu_check_f32("qk_norm_rope_fwd", "x", x, -1, int64_t(heads) * hd);
  cpu_check_f32("qk_norm_rope_fwd", "w", w, 1, hd);
  cpu_check_f32("qk_norm_rope_fwd", "y", y, x.rows, x.cols);
  cpu_check_f32("qk_norm_rope_fwd", "rstd", rstd, x.rows, heads);
  cpu_check_i32("qk_norm_rope_fwd", "pos", pos, 1, x.rows);
  const int half = hd / 2;
  const std::vector<float> inv_freq = cpu_rope_inv_freq(hd, theta);
#pragma omp parallel for schedule(static) if(cpu_parallel_worth(x.numel()))
  for (int64_t r = 0; r < x.rows; ++r) {
    std::vector<float> cs(half), sn(half);
    cpu_rope_cos_sin(pos.ptr<int32_t>()[r], inv_freq, cs.data(), sn.data());
    for (int h = 0; h < heads; ++h) {
      float* yh = cpu_row(y, r) + h * hd;
      cpu_row(rstd, r)[h] =
          cpu_norm_row(cpu_row(x, r) + h * hd, w.ptr<float>(), yh, hd, eps, NormKind::plain);
      cpu_rope_rotate(yh, half, cs.data(), sn.data());
    }
  }
}

void CpuTrainOps::qk_norm_rope_bwd(const Tensor& x, const Tensor& w, const Tensor& pos, const Tensor& rstd,
                                   const Tensor& dy, const Tensor& dx, const Tensor& dw, int heads, int hd,
                                   float theta, float beta_dw) {
  cpu_check_f32("qk_norm_rope_bwd", "dy", dy, x.rows, x.cols);
  cpu_check_f32("qk_norm_rope_bwd", "dx", dx, x.rows, x.cols);
  cpu_check_f32("qk_norm_rope_bwd", "dw", dw, 1, hd);
  const int half = hd / 2;
  const float* wv = w.ptr<float>();
  const std::vector<float> inv_freq = cpu_rope_inv_freq(hd, theta);
  // Per-row partial sums of ∂/∂w, added in row order afterwards (deterministic for any thread count).
  std::vector<double> dw_rows(size_t(x.rows * hd), 0.0);
#pragma omp parallel for schedule(static) if(cpu_parallel_worth(x.numel()))
  for (int64_t r = 0; r < x.rows; ++r) {
    std::vector<float> dz(hd), cs(half), sn(half);
    cpu_rope_cos_sin(pos.ptr<int32_t>()[r], inv_freq, cs.data(), sn.data());
    for (float& v : sn) v = -v;  // the transpose of the rotation: by −angle
    double* dwr = &dw_rows[size_t(r * hd)];
    for (int h = 0; h < heads; ++h) {
      // dz = RoPEᵀ dy, then the RMSNorm backward of this head.
      std::copy_n(cpu_row(dy, r) + h * hd, hd, dz.begin());
      cpu_rope_rotate(dz.data(), half, cs.data(), sn.data());
      const float* xh = cpu_row(x, r) + h * hd;
      const double rs = cpu_row(rstd, r)[h];
      double m = 0;
      for (int i = 0; i < hd; ++i) {
        const double xhat = xh[i] * rs;
        m += dz[size_t(i)] * wv[i] * xhat;
        dwr[i] += dz[size_t(i)] * xhat;
      }
      m /= hd;
      float* dxh = cpu_row(dx, r) + h * hd;
      for (int i = 0; i < hd; ++i) dxh[i] = float(rs * (dz[size_t(i)] * wv[i] - xh[i] * rs * m));
    }
  }
  for (int i = 0; i < hd; ++i) {
    double acc = 0;
    for (int64_t r = 0; r < x.rows; ++r) acc += dw_rows[size_t(r * hd + i)];
    cpu_beta_add(dw.ptr<float>()[i], beta_dw, float(acc));
  }
}

// ---- attention ------------------------------------------------------------------------------------------

void CpuTrainOps::dflash_attention_fwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& blocks,
                                       const Tensor& out, const Tensor& lse, const DFlashAttnShape& s) {
  check_attn("dflash_attention_fwd", q, k, v, blocks, s);
  cpu_check_f32("dflash_attention_fwd", "out", out, q.rows, q.cols);
  cpu_check_f32("dflash_attention_fwd", "lse", lse, q.rows, s.hq);
  const int64_t nb = blocks.rows, T = k.rows - nb * s.block;
  const int32_t* b = blocks.ptr<int32_t>();
  const int group = s.hq / s.hkv;
#pragma omp parallel for collapse(2) schedule(dynamic) if(cpu_parallel_worth(q.numel() * (T + s.block)))
  for (int64_t j = 0; j < nb; ++j)
    for (int h = 0; h < s.hq; ++h) {
      std::vector<double> sc(size_t(T + s.block)), acc(s.hd);
      const int g = h / group;
      for (int kq = 0; kq < s.block; ++kq) {
        const int64_t qr = j * s.block + kq;
        float* oh = cpu_row(out, qr) + h * s.hd;
        if (b[2 * j + 1] < 0) {
          std::fill_n(oh, s.hd, 0.0f);
          cpu_row(lse, qr)[h] = -std::numeric_limits<float>::infinity();
          continue;
        }
        KeyRanges kr = key_ranges(T, j, kq, b[2 * j], b[2 * j + 1], s);
        int n = attn_scores(k, cpu_row(q, qr) + h * s.hd, g, kr, s, sc);
        double mx = *std::max_element(sc.begin(), sc.begin() + n), sum = 0;
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int i = 0; i < n; ++i) {
          double p = std::exp(sc[i] - mx);
          sum += p;
          const float* vr = cpu_row(v, key_row(kr, i)) + g * s.hd;
          for (int d = 0; d < s.hd; ++d) acc[d] += p * vr[d];
        }
        for (int d = 0; d < s.hd; ++d) oh[d] = float(acc[d] / sum);
        cpu_row(lse, qr)[h] = float(mx + std::log(sum));
      }
    }
}

void CpuTrainOps::dflash_attention_bwd(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& blocks,
                                       const Tensor& out, const Tensor& lse, const Tensor& dout, const Tensor& dq,
                                       const Tensor& dk, const Tensor& dv, const DFlashAttnShape& s) {
  check_attn("dflash_attention_bwd", q, k, v, blocks, s);
  cpu_check_f32("dflash_attention_bwd", "dout", dout, q.rows, q.cols);
  cpu_check_f32("dflash_attention_bwd", "dq", dq, q.rows, q.cols);
  cpu_check_f32("dflash_attention_bwd", "dk", dk, k.rows, k.cols);
  cpu_check_f32("dflash_attention_bwd", "dv", dv, v.rows, v.cols);
  fill(dq, 0.0f);
  fill(dk, 0.0f);
  fill(dv, 0.0f);
  const int64_t nb = blocks.rows, T = k.rows - nb * s.block;
  const int32_t* b = blocks.ptr<int32_t>();
  const int group = s.hq / s.hkv;
  // Work items (kv head, sequence) write disjoint dk/dv rows and dq columns, so they run in parallel without
  // atomics and each accumulates in a fixed order. Blocks of one sequence share its context keys.
  std::vector<int64_t> starts;
  for (int64_t j = 0; j < nb; ++j)
    if (b[2 * j + 1] >= 0 && std::find(starts.begin(), starts.end(), b[2 * j]) == starts.end())
      starts.push_back(b[2 * j]);
  const int64_t items = int64_t(starts.size()) * s.hkv;
#pragma omp parallel for schedule(dynamic) if(cpu_parallel_worth(q.numel() * (T + s.block)))
  for (int64_t it = 0; it < items; ++it) {
    const int g = int(it % s.hkv);
    const int64_t s0 = starts[size_t(it / s.hkv)];
    std::vector<double> sc(size_t(T + s.block)), dqa(s.hd);
    for (int64_t j = 0; j < nb; ++j) {
      if (b[2 * j + 1] < 0 || b[2 * j] != s0) continue;
      for (int h = g * group; h < (g + 1) * group; ++h)
        for (int kq = 0; kq < s.block; ++kq) {
          const int64_t qr = j * s.block + kq;
          KeyRanges kr = key_ranges(T, j, kq, s0, b[2 * j + 1], s);
          const float *qh = cpu_row(q, qr) + h * s.hd, *doh = cpu_row(dout, qr) + h * s.hd;
          int n = attn_scores(k, qh, g, kr, s, sc);
          const double L = cpu_row(lse, qr)[h], D = dot(doh, cpu_row(out, qr) + h * s.hd, s.hd);
          std::fill(dqa.begin(), dqa.end(), 0.0);
          for (int i = 0; i < n; ++i) {
            const int64_t kr_i = key_row(kr, i);
            const double p = std::exp(sc[i] - L);
            const float* vr = cpu_row(v, kr_i) + g * s.hd;
            const double ds = p * (dot(doh, vr, s.hd) - D) * s.scale;
            const float* kk = cpu_row(k, kr_i) + g * s.hd;
            float *dkr = cpu_row(dk, kr_i) + g * s.hd, *dvr = cpu_row(dv, kr_i) + g * s.hd;
            for (int d = 0; d < s.hd; ++d) {
              dqa[d] += ds * kk[d];
              dkr[d] += float(ds * qh[d]);
              dvr[d] += float(p * doh[d]);
            }
          }
          float* dqh = cpu_row(dq, qr) + h * s.hd;
          for (int d = 0; d < s.hd; ++d) dqh[d] = float(dqa[d]);
        }
    }
  }
}

// ---- MLP ------------------------------------------------------------------------------------------------

void CpuTrainOps::swiglu_fwd(const Tensor& gate, const Tensor& up, const Tensor& out) {
  ops_.swiglu(gate, up, out);
}

void CpuTrainOps::swiglu_bwd(const Tensor& gate, const Tensor& up, const Tensor& dout, const Tensor& dgate,
                             const Tensor& dup) {
  cpu_check_f32("swiglu_bwd", "dout", dout, gate.rows, gate.cols);
  cpu_check_f32("swiglu_bwd", "dgate", dgate, gate.rows, gate.cols);
  cpu_check_f32("swiglu_bwd", "dup", dup, gate.rows, gate.cols);
#pragma omp parallel for schedule(static) if(cpu_parallel_worth(gate.numel()))
  for (int64_t r = 0; r < gate.rows; ++r)
    for (int64_t c = 0; c < gate.cols; ++c) {
      const double g = cpu_row(gate, r)[c], sg = 1.0 / (1.0 + std::exp(-g)), d = cpu_row(dout, r)[c];
      cpu_row(dgate, r)[c] = float(d * cpu_row(up, r)[c] * sg * (1.0 + g * (1.0 - sg)));
      cpu_row(dup, r)[c] = float(d * g * sg);
    }
}

// ---- loss -----------------------------------------------------------------------------------------------

void CpuTrainOps::lm_head_loss(const Tensor& hidden, const Tensor& lm_head, const Tensor& labels,
                               const Tensor& active, const Tensor& target_hidden, LmLossKind kind,
                               const Tensor& loss, const Tensor& p_label, const Tensor& argmax,
                               const Tensor& dhidden, int64_t max_active) {
  const int64_t rows = hidden.rows, H = hidden.cols, V = lm_head.rows;
  cpu_check_f32("lm_head_loss", "lm_head", lm_head, V, H);
  cpu_check_i32("lm_head_loss", "labels", labels, 1, rows);
  DF_CHECK(active.dtype == DType::u8 && active.rows == 1 && active.cols == rows,
           "lm_head_loss: active must be u8 [1, %lld], got %s", (long long)rows, active.shape_str().c_str());
  if (kind == LmLossKind::kl) cpu_check_f32("lm_head_loss", "target_hidden", target_hidden, rows, H);
  cpu_check_f32("lm_head_loss", "loss", loss, 1, rows);
  cpu_check_f32("lm_head_loss", "p_label", p_label, 1, rows);
  cpu_check_i32("lm_head_loss", "argmax", argmax, 1, rows);
  cpu_check_f32("lm_head_loss", "dhidden", dhidden, rows, H);
  std::vector<int64_t> act;
  for (int64_t r = 0; r < rows; ++r) {
    if (active.ptr<uint8_t>()[r]) {
      act.push_back(r);
      int32_t lab = labels.ptr<int32_t>()[r];
      DF_CHECK(lab >= 0 && lab < V, "lm_head_loss: label %d of row %lld outside the vocabulary of %lld", lab,
               (long long)r, (long long)V);
    }
    loss.ptr<float>()[r] = 0.0f;
    p_label.ptr<float>()[r] = 0.0f;
    argmax.ptr<int32_t>()[r] = -1;
    std::fill_n(cpu_row(dhidden, r), H, 0.0f);
  }
  const int64_t chunk = std::max(1, loss_chunk_rows_);
  std::vector<float> hid(chunk * H), tgt(kind == LmLossKind::kl ? chunk * H : 0), logit(chunk * V),
      tlogit(kind == LmLossKind::kl ? chunk * V : 0), dh(chunk * H);
  for (size_t c0 = 0; c0 < act.size(); c0 += size_t(chunk)) {
    const int64_t n = std::min<int64_t>(chunk, int64_t(act.size() - c0));
    for (int64_t i = 0; i < n; ++i) {
      std::memcpy(&hid[i * H], cpu_row(hidden, act[c0 + i]), H * sizeof(float));
      if (kind == LmLossKind::kl)
        std::memcpy(&tgt[i * H], cpu_row(target_hidden, act[c0 + i]), H * sizeof(float));
    }
    Tensor lt = tensor_make(logit.data(), DType::f32, Device::cpu, n, V);
    gemm(tensor_make(hid.data(), DType::f32, Device::cpu, n, H), false, lm_head, true, lt, 1.0f, 0.0f);
    if (kind == LmLossKind::kl)
      gemm(tensor_make(tgt.data(), DType::f32, Device::cpu, n, H), false, lm_head, true,
           tensor_make(tlogit.data(), DType::f32, Device::cpu, n, V), 1.0f, 0.0f);
    // Softmax in double per row; the logits buffer is overwritten by ∂loss/∂logits.
#pragma omp parallel for schedule(static) if(cpu_parallel_worth(n * V))
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = act[c0 + i];
      float* z = &logit[i * V];
      const int32_t lab = labels.ptr<int32_t>()[r];
      int64_t am = 0;
      for (int64_t t = 1; t < V; ++t)
        if (z[t] > z[am]) am = t;
      double sum = 0;
      for (int64_t t = 0; t < V; ++t) sum += std::exp(double(z[t]) - z[am]);
      const double lse = z[am] + std::log(sum);
      argmax.ptr<int32_t>()[r] = int32_t(am);
      p_label.ptr<float>()[r] = float(std::exp(z[lab] - lse));
      if (kind == LmLossKind::ce) {
        loss.ptr<float>()[r] = float(lse - z[lab]);
        for (int64_t t = 0; t < V; ++t) z[t] = float(std::exp(z[t] - lse) - (t == lab ? 1.0 : 0.0));
      } else {
        const float* y = &tlogit[i * V];
        double ymax = *std::max_element(y, y + V), ysum = 0;
        for (int64_t t = 0; t < V; ++t) ysum += std::exp(double(y[t]) - ymax);
        const double tlse = ymax + std::log(ysum);
        double kl = 0;
        for (int64_t t = 0; t < V; ++t) {
          const double lpt = y[t] - tlse, lpd = z[t] - lse, pt = std::exp(lpt);
          kl += pt * (lpt - lpd);
          z[t] = float(std::exp(lpd) - pt);
        }
        loss.ptr<float>()[r] = float(kl);
      }
    }
    Tensor dht = tensor_make(dh.data(), DType::f32, Device::cpu, n, H);
    gemm(lt, false, lm_head, false, dht, 1.0f, 0.0f);
    for (int64_t i = 0; i < n; ++i) std::memcpy(cpu_row(dhidden, act[c0 + i]), &dh[i * H], H * sizeof(float));
  }
}

// ---- optimizer ------------------------------------------------------------------------------------------

double CpuTrainOps::sum_squares(const Tensor& x) {
  cpu_check_f32("sum_squares", "x", x, -1, -1);
  DF_CHECK(x.contiguous(), "sum_squares: %s must be a contiguous flat buffer", x.shape_str().c_str());
  // Fixed slices summed in slice order: the result does not depend on the thread count.
  constexpr int64_t kSlice = 1 << 16;
  const int64_t n = x.numel(), slices = (n + kSlice - 1) / kSlice;
  std::vector<double> part(size_t(slices), 0.0);
  const float* p = x.ptr<float>();
#pragma omp parallel for schedule(static) if(cpu_parallel_worth(n))
  for (int64_t s = 0; s < slices; ++s) {
    double acc = 0;
    for (int64_t i = s * kSlice; i < std::min(n, (s + 1) * kSlice); ++i) acc += double(p[i]) * p[i];
    part[size_t(s)] = acc;
  }
  double total = 0;
  for (double v : part) total += v;
  return total;
}

void CpuTrainOps::adamw(const Tensor& p, const Tensor& g, const Tensor& m, const Tensor& v, const Tensor& p_lp,
                        const AdamW& hp) {
  DF_CHECK(p_lp.empty(), "adamw: the CPU backend trains in f32 and keeps no bf16 weight shadow");
  const int64_t n = p.numel();
  for (const Tensor* t : {&p, &g, &m, &v}) {
    cpu_check_f32("adamw", "buffer", *t, -1, -1);
    DF_CHECK(t->contiguous() && t->numel() == n, "adamw: buffer %s must be contiguous with %lld elements",
             t->shape_str().c_str(), (long long)n);
  }
  DF_CHECK(hp.step_t >= 1 && hp.n_decay >= 0 && hp.n_decay <= n, "adamw: step_t %lld / n_decay %lld out of range",
           (long long)hp.step_t, (long long)hp.n_decay);
  const double bc1 = 1.0 - std::pow(double(hp.beta1), double(hp.step_t));
  const double bc2 = 1.0 - std::pow(double(hp.beta2), double(hp.step_t));
  float *pp = p.ptr<float>(), *mm = m.ptr<float>(), *vv = v.ptr<float>();
  const float* gg = g.ptr<float>();
#pragma omp parallel for schedule(static) if(cpu_parallel_worth(n))
  for (int64_t i = 0; i < n; ++i) {
    const float gi = gg[i] * hp.grad_scale;
    mm[i] = hp.beta1 * mm[i] + (1.0f - hp.beta1) * gi;
    vv[i] = hp.beta2 * vv[i] + (1.0f - hp.beta2) * gi * gi;
    const double upd = (mm[i] / bc1) / (std::sqrt(vv[i] / bc2) + hp.eps);
    const double decay = i < hp.n_decay ? double(hp.weight_decay) * pp[i] : 0.0;
    pp[i] = float(pp[i] - hp.lr * (upd + decay));
  }
}

}  // namespace df
