// Domino's head on the host: labels and weights of a block, the λ schedule, the exact forward and backward
// of one block (GRU over the gold tokens, correction MLP, both CE terms) and the greedy proposals of
// decoding. Sums run in double in a fixed order, so the result does not depend on how blocks are spread over
// threads.
#include "ops/domino_head.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "ops/head_math.h"

namespace df {

namespace {

// One GRU step (gate order r, z, n) from state hp [G] on input x [H]: the gates r, u, n and W_hn·hp (what
// the backward needs) and the new state h.
template <class T>
void gru_cell(const DominoHeadTensors<const T>& w, int H, int G, const double* x, const double* hp, double* r,
              double* u, double* n, double* hn, double* h) {
  for (int g = 0; g < G; ++g) {
    r[g] =
        head_sigmoid(head_dot(w.gru_ih + int64_t(g) * H, x, H) + head_dot(w.gru_hh + int64_t(g) * G, hp, G));
    u[g] = head_sigmoid(head_dot(w.gru_ih + int64_t(G + g) * H, x, H) +
                        head_dot(w.gru_hh + int64_t(G + g) * G, hp, G));
    hn[g] = head_dot(w.gru_hh + int64_t(2 * G + g) * G, hp, G);
    n[g] = std::tanh(head_dot(w.gru_ih + int64_t(2 * G + g) * H, x, H) + r[g] * hn[g]);
    h[g] = (1.0 - u[g]) * n[g] + u[g] * hp[g];
  }
}

// base = lm_head · zk [V].
template <class T>
void base_logits(const T* lm_head, int V, int H, const std::vector<double>& zk, std::vector<double>& base) {
  for (int v = 0; v < V; ++v) base[size_t(v)] = head_dot(lm_head + int64_t(v) * H, zk.data(), H);
}

// The correction of a slot: f = [zk ; h], m = P0·f, a = silu(m), fin += P1·a (f, m, a kept for the backward).
template <class T>
void add_correction(const DominoHeadTensors<const T>& w, const DominoHeadDims& d,
                    const std::vector<double>& zk, const double* h, std::vector<double>& f,
                    std::vector<double>& m, std::vector<double>& a, std::vector<double>& fin) {
  const int H = d.hidden, G = d.gru_hidden, E = d.emb_dim, F = H + G;
  std::copy(zk.begin(), zk.end(), f.begin());
  std::copy_n(h, G, f.begin() + H);
  for (int e = 0; e < E; ++e) {
    m[size_t(e)] = head_dot(w.proj_in + int64_t(e) * F, f.data(), F);
    a[size_t(e)] = m[size_t(e)] * head_sigmoid(m[size_t(e)]);
  }
  for (int v = 0; v < d.vocab; ++v) fin[size_t(v)] += head_dot(w.proj_out + int64_t(v) * E, a.data(), E);
}

}  // namespace

DominoBlockRows domino_block_rows(const DominoHeadDims& d, const int32_t* tokens, const uint8_t* loss_mask,
                                  int64_t len, int64_t anchor, double gamma) {
  const int B = d.block_size;
  const int shift = d.shift_label ? 1 : 0, off = d.shift_label ? 0 : 1;
  DominoBlockRows r;
  r.labels.assign(size_t(B), 0);
  r.inputs.assign(size_t(B), 0);
  r.weights.assign(size_t(B), 0.0);
  if (anchor < 0) return r;
  DF_CHECK(anchor < len && len > 0, "domino rows: anchor %lld outside a sequence of %lld tokens",
           (long long)anchor, (long long)len);
  for (int k = 0; k < B; ++k) {
    const int64_t label_pos = anchor + k + shift;
    r.inputs[size_t(k)] = tokens[std::min(anchor + k, len - 1)];
    r.labels[size_t(k)] = tokens[std::min(label_pos, len - 1)];
    if (label_pos >= len || !loss_mask[label_pos] || k < off) continue;
    r.weights[size_t(k)] = std::exp(-double(k - off) / gamma);
  }
  return r;
}

double domino_lambda_base(int64_t step, int64_t total_steps, double start, double decay_ratio) {
  if (total_steps <= 0) return 0.0;
  const int64_t decay_steps = std::max<int64_t>(1, int64_t(double(total_steps) * decay_ratio));
  const double progress = std::min(double(step) / double(decay_steps), 1.0);
  return std::clamp(start * (1.0 - progress), 0.0, 1.0);
}

template <class T>
DominoBlockLoss domino_block_step(const DominoHeadDims& d, const DominoHeadTensors<const T>& w,
                                  const T* lm_head, const T* z, const T* emb, const DominoBlockRows& rows,
                                  double lambda, T* final_logits, const DominoHeadTensors<T>* grads, T* dz) {
  const int H = d.hidden, G = d.gru_hidden, E = d.emb_dim, V = d.vocab, B = d.block_size, F = H + G;
  const int s = d.suffix_start(), lag = d.gru_lag();
  const size_t Hn = size_t(H), Gn = size_t(G), En = size_t(E), Vn = size_t(V), Fn = size_t(F);
  const int steps = B - lag;  // GRU states h_0 .. h_{steps-1}; slot k reads h_{k-lag}
  DF_CHECK(int(rows.labels.size()) == B && int(rows.weights.size()) == B,
           "domino block: rows hold %zu labels for block_size %d", rows.labels.size(), B);

  // GRU forward, keeping what the backward needs. hs row t+1 is the state after input t; row 0 is h_{-1} = 0.
  std::vector<double> hs(size_t(steps + 1) * Gn, 0.0), r(size_t(steps) * Gn), u(r.size()), n(r.size()),
      hn(r.size()), x(Hn);
  for (int t = 0; t < steps; ++t) {
    for (int i = 0; i < H; ++i) x[size_t(i)] = double(emb[int64_t(t) * H + i]);
    const size_t at = size_t(t) * Gn;
    gru_cell(w, H, G, x.data(), &hs[at], &r[at], &u[at], &n[at], &hn[at], &hs[at + Gn]);
  }

  DominoBlockLoss loss;
  std::vector<double> zk(Hn), f(Fn), m(En), a(En), base(Vn), fin(Vn), pb(Vn), pf(Vn), dfin(Vn), da(En),
      dm(En);
  std::vector<double> dh_slot(grads ? size_t(steps) * Gn : 0, 0.0);  // ∂/∂h_t from the slots that read it
  for (int k = 0; k < B; ++k) {
    for (int i = 0; i < H; ++i) zk[size_t(i)] = double(z[int64_t(k) * H + i]);
    base_logits(lm_head, V, H, zk, base);
    fin = base;
    const bool corrected = k >= s;
    if (corrected) add_correction(w, d, zk, &hs[size_t(k - lag + 1) * G], f, m, a, fin);
    if (final_logits)
      for (int v = 0; v < V; ++v) final_logits[int64_t(k) * V + v] = T(fin[size_t(v)]);
    const int y = rows.labels[size_t(k)];
    DF_CHECK(y >= 0 && y < V, "domino block: label %d of slot %d outside the vocabulary [0, %d)", y, k, V);
    const double wk = rows.weights[size_t(k)];
    const double ce_final = head_softmax(fin, pf) - fin[size_t(y)];
    const double ce_base = head_softmax(base, pb) - base[size_t(y)];
    loss.final_sum += wk * ce_final;
    loss.base_sum += wk * ce_base;
    if (!grads || wk == 0.0) continue;

    const double cf = (1.0 - lambda) * wk, cb = lambda * wk;
    for (int v = 0; v < V; ++v) {
      const double onehot = v == y ? 1.0 : 0.0;
      dfin[size_t(v)] = cf * (pf[size_t(v)] - onehot);
    }
    if (dz) {
      // ∂/∂base = ∂/∂final (final = base + correction) + the base term's own.
      for (int v = 0; v < V; ++v) {
        const double dbase = dfin[size_t(v)] + cb * (pb[size_t(v)] - (v == y ? 1.0 : 0.0));
        for (int i = 0; i < H; ++i) dz[int64_t(k) * H + i] += T(dbase * double(lm_head[int64_t(v) * H + i]));
      }
    }
    if (!corrected) continue;
    std::fill(da.begin(), da.end(), 0.0);
    for (int v = 0; v < V; ++v)
      for (int e = 0; e < E; ++e) {
        grads->proj_out[int64_t(v) * E + e] += T(dfin[size_t(v)] * a[size_t(e)]);
        da[size_t(e)] += dfin[size_t(v)] * double(w.proj_out[int64_t(v) * E + e]);
      }
    for (int e = 0; e < E; ++e) {
      const double sg = head_sigmoid(m[size_t(e)]);
      dm[size_t(e)] = da[size_t(e)] * sg * (1.0 + m[size_t(e)] * (1.0 - sg));
    }
    for (int e = 0; e < E; ++e)
      for (int j = 0; j < F; ++j) {
        grads->proj_in[int64_t(e) * F + j] += T(dm[size_t(e)] * f[size_t(j)]);
        const double df = dm[size_t(e)] * double(w.proj_in[int64_t(e) * F + j]);
        if (j < H) {
          if (dz) dz[int64_t(k) * H + j] += T(df);
        } else {
          dh_slot[size_t(k - lag) * G + size_t(j - H)] += df;
        }
      }
  }
  if (!grads) return loss;

  // GRU backward through time.
  std::vector<double> dh(Gn, 0.0), dprev(Gn), dar(Gn), dau(Gn), dan(Gn);
  for (int t = steps - 1; t >= 0; --t) {
    for (int i = 0; i < H; ++i) x[size_t(i)] = double(emb[int64_t(t) * H + i]);
    const double* hp = &hs[size_t(t) * G];
    for (int g = 0; g < G; ++g) {
      const size_t at = size_t(t) * G + size_t(g);
      const double dht = dh[size_t(g)] + dh_slot[at];
      const double du = dht * (hp[g] - n[at]), dn = dht * (1.0 - u[at]);
      dprev[size_t(g)] = dht * u[at];
      dan[size_t(g)] = dn * (1.0 - n[at] * n[at]);
      dar[size_t(g)] = dan[size_t(g)] * hn[at] * r[at] * (1.0 - r[at]);
      dau[size_t(g)] = du * u[at] * (1.0 - u[at]);
    }
    for (int g = 0; g < G; ++g) {
      const size_t at = size_t(t) * G + size_t(g);
      const double gate[3] = {dar[size_t(g)], dau[size_t(g)], dan[size_t(g)]};
      const double hgate[3] = {dar[size_t(g)], dau[size_t(g)],
                               dan[size_t(g)] * r[at]};  // W_hn h sits inside r ⊙
      for (int q = 0; q < 3; ++q) {
        const int64_t row = int64_t(q) * G + g;
        for (int i = 0; i < H; ++i) grads->gru_ih[row * H + i] += T(gate[q] * x[size_t(i)]);
        for (int j = 0; j < G; ++j) {
          grads->gru_hh[row * G + j] += T(hgate[q] * hp[j]);
          dprev[size_t(j)] += hgate[q] * double(w.gru_hh[row * G + j]);
        }
      }
    }
    dh.swap(dprev);
  }
  return loss;
}

template <class T>
std::vector<int32_t> domino_block_propose(const DominoHeadDims& d, const DominoHeadTensors<const T>& w,
                                          const T* lm_head, const T* embed, const T* z, int32_t first) {
  const int H = d.hidden, G = d.gru_hidden, E = d.emb_dim, V = d.vocab, B = d.block_size;
  const size_t Hn = size_t(H), Gn = size_t(G), En = size_t(E), Vn = size_t(V);
  DF_CHECK(first >= 0 && first < V, "domino propose: token %d outside the vocabulary [0, %d)", first, V);
  std::vector<int32_t> tokens{first};
  std::vector<double> h(Gn, 0.0), next(Gn), r(Gn), u(Gn), n(Gn), hn(Gn), x(Hn), zk(Hn), f(Hn + Gn), m(En),
      a(En), logits(Vn);
  for (int p = 1; p < B; ++p) {
    // The GRU state after tokens 0..p−1: the one that slot p − 1 (shift_label) or p reads.
    for (int i = 0; i < H; ++i) x[size_t(i)] = double(embed[int64_t(tokens.back()) * H + i]);
    gru_cell(w, H, G, x.data(), h.data(), r.data(), u.data(), n.data(), hn.data(), next.data());
    h.swap(next);
    const int slot = d.shift_label ? p - 1 : p;
    for (int i = 0; i < H; ++i) zk[size_t(i)] = double(z[int64_t(slot) * H + i]);
    base_logits(lm_head, V, H, zk, logits);
    if (slot >= d.suffix_start()) add_correction(w, d, zk, h.data(), f, m, a, logits);
    tokens.push_back(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
  }
  return std::vector<int32_t>(tokens.begin() + 1, tokens.end());
}

template DominoBlockLoss domino_block_step<float>(const DominoHeadDims&,
                                                  const DominoHeadTensors<const float>&, const float*,
                                                  const float*, const float*, const DominoBlockRows&, double,
                                                  float*, const DominoHeadTensors<float>*, float*);
template DominoBlockLoss domino_block_step<double>(const DominoHeadDims&,
                                                   const DominoHeadTensors<const double>&, const double*,
                                                   const double*, const double*, const DominoBlockRows&,
                                                   double, double*, const DominoHeadTensors<double>*,
                                                   double*);

template std::vector<int32_t> domino_block_propose<float>(const DominoHeadDims&,
                                                          const DominoHeadTensors<const float>&, const float*,
                                                          const float*, const float*, int32_t);
template std::vector<int32_t> domino_block_propose<double>(const DominoHeadDims&,
                                                           const DominoHeadTensors<const double>&,
                                                           const double*, const double*, const double*,
                                                           int32_t);

}  // namespace df
