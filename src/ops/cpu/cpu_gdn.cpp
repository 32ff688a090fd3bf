// The Gated DeltaNet on the CPU (MODELS.md "Gated DeltaNet"): gates, l2norm and GVA head mapping shared by
// the sequential recurrence and the chunked UT/WY form, each run per (sequence, value head) in parallel.
#include "ops/cpu/cpu_gdn.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/cpu_ops.h"

namespace df {
namespace {

// Per-token inputs after the gates and normalisation, laid out so each head's rows are contiguous.
struct GdnPrepared {
  std::vector<float> q, k;     // [T, nk·dk]: l2norm(q)·dk^−½ and l2norm(k)
  std::vector<float> beta, g;  // [T, nv]: sigmoid(b) and −exp(A_log)·softplus(a + dt_bias)
};

// torch.nn.functional.softplus with its default threshold 20 (linear above it).
inline float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// x · rsqrt(Σx² + 1e−6) · scale; the sum of squares in double keeps the oracle's own rounding negligible.
inline void l2norm_into(const float* x, float* y, int n, float scale) {
  double ss = 0.0;
  for (int i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  const float r = float(1.0 / std::sqrt(ss + 1e-6));
  for (int i = 0; i < n; ++i) y[i] = (x[i] * r) * scale;
}

void gdn_check(const char* op, const Tensor& qkv, const Tensor& a, const Tensor& b, const Tensor& A_log,
               const Tensor& dt_bias, const Tensor& out, const SeqLayout& seqs, const GdnShape& s) {
  DF_CHECK(s.nk > 0 && s.nv > 0 && s.dk > 0 && s.dv > 0 && s.nv % s.nk == 0,
           "%s: GdnShape nk %d nv %d dk %d dv %d: all must be positive and nv a multiple of nk", op, s.nk, s.nv,
           s.dk, s.dv);
  const int64_t T = qkv.rows;
  cpu_check_f32(op, "qkv", qkv, -1, 2 * int64_t(s.nk) * s.dk + int64_t(s.nv) * s.dv);
  cpu_check_f32(op, "a", a, T, s.nv);
  cpu_check_f32(op, "b", b, T, s.nv);
  cpu_check_f32(op, "A_log", A_log, 1, s.nv);
  cpu_check_f32(op, "dt_bias", dt_bias, 1, s.nv);
  cpu_check_f32(op, "out", out, T, int64_t(s.nv) * s.dv);
  cpu_check_layout(op, seqs, T);
}

GdnPrepared gdn_prepare(const Tensor& qkv, const Tensor& a, const Tensor& b, const Tensor& A_log,
                        const Tensor& dt_bias, const GdnShape& s) {
  const int64_t T = qkv.rows, kw = int64_t(s.nk) * s.dk;
  GdnPrepared p;
  p.q.resize(size_t(T * kw));
  p.k.resize(size_t(T * kw));
  p.beta.resize(size_t(T * s.nv));
  p.g.resize(size_t(T * s.nv));
  const float qscale = float(1.0 / std::sqrt(double(s.dk)));
  const float* al = A_log.ptr<float>();
  const float* db = dt_bias.ptr<float>();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < T; ++t) {
    const float* row = cpu_row(qkv, t);
    for (int h = 0; h < s.nk; ++h) {
      l2norm_into(row + int64_t(h) * s.dk, &p.q[size_t(t * kw + int64_t(h) * s.dk)], s.dk, qscale);
      l2norm_into(row + kw + int64_t(h) * s.dk, &p.k[size_t(t * kw + int64_t(h) * s.dk)], s.dk, 1.0f);
    }
    const float* ar = cpu_row(a, t);
    const float* br = cpu_row(b, t);
    for (int h = 0; h < s.nv; ++h) {
      p.beta[size_t(t * s.nv + h)] = cpu_sigmoid(br[h]);
      p.g[size_t(t * s.nv + h)] = -std::exp(al[h]) * softplus(ar[h] + db[h]);
    }
  }
  return p;
}

// Runs fn(seq_begin, seq_end, value_head) for every pair in parallel; sequences differ in length, hence
// dynamic scheduling.
template <class Fn>
void gdn_for_each_head(const SeqLayout& seqs, int nv, Fn fn) {
  const int64_t pairs = int64_t(seqs.num_seqs) * nv;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t idx = 0; idx < pairs; ++idx) {
    const int s = int(idx / nv), h = int(idx % nv);
    fn(int64_t(seqs.cu_host[size_t(s)]), int64_t(seqs.cu_host[size_t(s) + 1]), h);
  }
}

// One token of the recurrence on value head state S [dk, dv]: S = exp(g)·S; u = Sᵀk; S += k·(β·(v − u))ᵀ;
// o = Sᵀq. u is dv floats of scratch.
void gdn_token(float* S, const float* q, const float* k, const float* v, float decay, float beta, int dk, int dv,
               float* u, float* o) {
  for (int64_t i = 0; i < int64_t(dk) * dv; ++i) S[i] *= decay;
  std::fill(u, u + dv, 0.0f);
  for (int e = 0; e < dk; ++e) {
    const float* Se = S + int64_t(e) * dv;
#pragma omp simd
    for (int j = 0; j < dv; ++j) u[j] += k[e] * Se[j];
  }
  for (int j = 0; j < dv; ++j) u[j] = beta * (v[j] - u[j]);
  for (int e = 0; e < dk; ++e) {
    float* Se = S + int64_t(e) * dv;
#pragma omp simd
    for (int j = 0; j < dv; ++j) Se[j] += k[e] * u[j];
  }
  std::fill(o, o + dv, 0.0f);
  for (int e = 0; e < dk; ++e) {
    const float* Se = S + int64_t(e) * dv;
#pragma omp simd
    for (int j = 0; j < dv; ++j) o[j] += q[e] * Se[j];
  }
}

}  // namespace

void cpu_gdn_recurrent(const Tensor& qkv, const Tensor& a, const Tensor& b, const Tensor& A_log,
                       const Tensor& dt_bias, const Tensor& out, const SeqLayout& seqs, const GdnShape& shape) {
  gdn_check("gdn_recurrent", qkv, a, b, A_log, dt_bias, out, seqs, shape);
  const GdnPrepared p = gdn_prepare(qkv, a, b, A_log, dt_bias, shape);
  const int dk = shape.dk, dv = shape.dv, nv = shape.nv, group = shape.nv / shape.nk;
  const int64_t kw = int64_t(shape.nk) * dk, voff = 2 * kw;
  gdn_for_each_head(seqs, nv, [&](int64_t t0, int64_t t1, int h) {
    const int64_t kh = h / group;
    std::vector<float> S(size_t(dk) * dv, 0.0f), u(static_cast<size_t>(dv));
    for (int64_t t = t0; t < t1; ++t)
      gdn_token(S.data(), &p.q[size_t(t * kw + kh * dk)], &p.k[size_t(t * kw + kh * dk)],
                cpu_row(qkv, t) + voff + int64_t(h) * dv, std::exp(p.g[size_t(t * nv + h)]),
                p.beta[size_t(t * nv + h)], dk, dv, u.data(), cpu_row(out, t) + int64_t(h) * dv);
  });
}

void cpu_gdn_decode(const Tensor& qkv, const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias,
                    const Tensor& out, const Tensor& state, const Tensor& states, const GdnShape& shape) {
  const int64_t T = qkv.rows, sdim = int64_t(shape.nv) * shape.dk * shape.dv;
  SeqLayout one;  // one sequence of T tokens: gdn_check's layout check and the head loop need no backend tensors
  one.cu_host = {0, int32_t(T)};
  one.tokens = T;
  one.num_seqs = 1;
  one.max_len = int(T);
  gdn_check("gdn_decode", qkv, a, b, A_log, dt_bias, out, one, shape);
  cpu_check_f32("gdn_decode", "state", state, 1, sdim);
  cpu_check_f32("gdn_decode", "states", states, -1, sdim);
  DF_CHECK(states.rows >= 1 && states.rows <= T, "gdn_decode: states has %lld rows; it needs 1..%lld (the tokens)",
           (long long)states.rows, (long long)T);
  const GdnPrepared p = gdn_prepare(qkv, a, b, A_log, dt_bias, shape);
  const int dk = shape.dk, dv = shape.dv, nv = shape.nv, group = shape.nv / shape.nk;
  const int64_t kw = int64_t(shape.nk) * dk, voff = 2 * kw, hs = int64_t(dk) * dv, first_saved = T - states.rows;
  gdn_for_each_head(one, nv, [&](int64_t t0, int64_t t1, int h) {
    const int64_t kh = h / group;
    const float* S0 = cpu_row(state, 0) + h * hs;
    std::vector<float> S(S0, S0 + hs), u(static_cast<size_t>(dv));
    for (int64_t t = t0; t < t1; ++t) {
      gdn_token(S.data(), &p.q[size_t(t * kw + kh * dk)], &p.k[size_t(t * kw + kh * dk)],
                cpu_row(qkv, t) + voff + int64_t(h) * dv, std::exp(p.g[size_t(t * nv + h)]),
                p.beta[size_t(t * nv + h)], dk, dv, u.data(), cpu_row(out, t) + int64_t(h) * dv);
      if (t >= first_saved) std::copy(S.begin(), S.end(), cpu_row(states, t - first_saved) + h * hs);
    }
  });
}

void cpu_gdn_chunked(const Tensor& qkv, const Tensor& a, const Tensor& b, const Tensor& A_log,
                     const Tensor& dt_bias, const Tensor& out, const SeqLayout& seqs, const GdnShape& shape,
                     int chunk) {
  gdn_check("gdn_chunked", qkv, a, b, A_log, dt_bias, out, seqs, shape);
  DF_CHECK(chunk > 0, "gdn_chunked: chunk length %d must be positive", chunk);
  const GdnPrepared p = gdn_prepare(qkv, a, b, A_log, dt_bias, shape);
  const int dk = shape.dk, dv = shape.dv, nv = shape.nv, group = shape.nv / shape.nk;
  const int64_t kw = int64_t(shape.nk) * dk, voff = 2 * kw;
  gdn_for_each_head(seqs, nv, [&](int64_t t0, int64_t t1, int h) {
    const int64_t kh = h / group;
    const size_t C = size_t(chunk);
    std::vector<float> S(size_t(dk) * dv, 0.0f), gam(C), decay(C * C), U(C * dv), W(C * dk);
    for (int64_t c0 = t0; c0 < t1; c0 += chunk) {
      const int n = int(std::min<int64_t>(chunk, t1 - c0));
      auto kr = [&](int i) { return &p.k[size_t((c0 + i) * kw + kh * dk)]; };
      auto qr = [&](int i) { return &p.q[size_t((c0 + i) * kw + kh * dk)]; };
      float run = 0.0f;
      for (int i = 0; i < n; ++i) gam[size_t(i)] = run += p.g[size_t((c0 + i) * nv + h)];
      // Γ_ij = exp(γ_i − γ_j) ≤ 1 for j ≤ i, shared by the solve and the output. Formed from the difference
      // (not exp(γ_i)·exp(−γ_j)) because exp(−γ_j) overflows under strong decay.
      for (int i = 0; i < n; ++i)
        for (int j = 0; j <= i; ++j) decay[size_t(i) * C + size_t(j)] = std::exp(gam[size_t(i)] - gam[size_t(j)]);
      // Forward substitution of (I + strictly_lower((β·K)Kᵀ ⊙ Γ)) [U | W] = [β·V | β·exp(γ)·K], row by row:
      // row i only needs the finished rows j < i.
      for (int i = 0; i < n; ++i) {
        const float beta = p.beta[size_t((c0 + i) * nv + h)];
        const float* v = cpu_row(qkv, c0 + i) + voff + int64_t(h) * dv;
        const float* ki = kr(i);
        float* Ui = &U[size_t(i) * dv];
        float* Wi = &W[size_t(i) * dk];
        const float wscale = beta * std::exp(gam[size_t(i)]);
        for (int j = 0; j < dv; ++j) Ui[j] = beta * v[j];
        for (int e = 0; e < dk; ++e) Wi[e] = wscale * ki[e];
        for (int j = 0; j < i; ++j) {
          const float* kj = kr(j);
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int e = 0; e < dk; ++e) dot += ki[e] * kj[e];
          const float aij = beta * dot * decay[size_t(i) * C + size_t(j)];
          const float* Uj = &U[size_t(j) * dv];
          const float* Wj = &W[size_t(j) * dk];
#pragma omp simd
          for (int x = 0; x < dv; ++x) Ui[x] -= aij * Uj[x];
#pragma omp simd
          for (int e = 0; e < dk; ++e) Wi[e] -= aij * Wj[e];
        }
      }
      // V' = U − W·S, kept in U.
      for (int i = 0; i < n; ++i) {
        float* Ui = &U[size_t(i) * dv];
        const float* Wi = &W[size_t(i) * dk];
        for (int e = 0; e < dk; ++e) {
          const float* Se = &S[size_t(e) * dv];
#pragma omp simd
          for (int x = 0; x < dv; ++x) Ui[x] -= Wi[e] * Se[x];
        }
      }
      // O = (Q ⊙ exp(γ))·S + lower_incl_diag(QKᵀ ⊙ Γ)·V'.
      for (int i = 0; i < n; ++i) {
        const float* qi = qr(i);
        float* o = cpu_row(out, c0 + i) + int64_t(h) * dv;
        const float qdecay = std::exp(gam[size_t(i)]);
        std::fill(o, o + dv, 0.0f);
        for (int e = 0; e < dk; ++e) {
          const float* Se = &S[size_t(e) * dv];
          const float qe = qi[e] * qdecay;
#pragma omp simd
          for (int x = 0; x < dv; ++x) o[x] += qe * Se[x];
        }
        for (int j = 0; j <= i; ++j) {
          const float* kj = kr(j);
          float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
          for (int e = 0; e < dk; ++e) dot += qi[e] * kj[e];
          const float coef = dot * decay[size_t(i) * C + size_t(j)];
          const float* Uj = &U[size_t(j) * dv];
#pragma omp simd
          for (int x = 0; x < dv; ++x) o[x] += coef * Uj[x];
        }
      }
      // S = exp(γ_last)·S + (K ⊙ exp(γ_last − γ))ᵀ·V'.
      const float glast = gam[size_t(n - 1)];
      const float sdecay = std::exp(glast);
      for (float& x : S) x *= sdecay;
      for (int j = 0; j < n; ++j) {
        const float* kj = kr(j);
        const float* Uj = &U[size_t(j) * dv];
        const float d = std::exp(glast - gam[size_t(j)]);
        for (int e = 0; e < dk; ++e) {
          float* Se = &S[size_t(e) * dv];
          const float ke = kj[e] * d;
#pragma omp simd
          for (int x = 0; x < dv; ++x) Se[x] += ke * Uj[x];
        }
      }
    }
  });
}

}  // namespace df
