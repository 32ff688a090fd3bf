// DFlash2's candidate selector on the host: the unary transform, the top-K candidate sets, the block rows,
// the selector weight schedule, the exact forward and backward of one block's two CE terms, and the greedy
// lattice walk of decoding. Sums run in double in a fixed order.
#include "ops/dflash2_selector.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "ops/loss_rows.h"

namespace df {

namespace {

// logsumexp of s, and p = softmax(s).
double softmax(const std::vector<double>& s, std::vector<double>& p) {
  const double mx = *std::max_element(s.begin(), s.end());
  double sum = 0;
  p.resize(s.size());
  for (size_t i = 0; i < s.size(); ++i) sum += (p[i] = std::exp(s[i] - mx));
  for (double& x : p) x /= sum;
  return mx + std::log(sum);
}

// ctx = pred[prev] ⊙ proj, proj = W_h z.
template <class T>
void selector_context(const Dflash2SelectorDims& d, const Dflash2SelectorTensors<const T>& w, const T* z,
                      int32_t prev, std::vector<double>& proj, std::vector<double>& ctx) {
  const int H = d.hidden, R = d.rank;
  DF_CHECK(prev >= 0 && prev < d.vocab, "dflash2 selector: previous token %d outside the vocabulary [0, %d)",
           prev, d.vocab);
  proj.assign(size_t(R), 0.0);
  ctx.assign(size_t(R), 0.0);
  for (int r = 0; r < R; ++r) {
    double s = 0;
    for (int h = 0; h < H; ++h) s += double(w.hidden_projection[int64_t(r) * H + h]) * double(z[h]);
    proj[size_t(r)] = s;
    ctx[size_t(r)] = double(w.predecessor_codebook[int64_t(prev) * R + r]) * s;
  }
}

// score_j = unary_j + ⟨ctx, succ[cand_j]⟩.
template <class T>
void selector_scores(const Dflash2SelectorDims& d, const Dflash2SelectorTensors<const T>& w,
                     const Dflash2Candidates& cand, const std::vector<double>& ctx,
                     std::vector<double>& score) {
  const int R = d.rank;
  score.resize(cand.ids.size());
  for (size_t j = 0; j < cand.ids.size(); ++j) {
    double s = cand.unary[j];
    for (int r = 0; r < R; ++r)
      s += ctx[size_t(r)] * double(w.successor_codebook[int64_t(cand.ids[j]) * R + r]);
    score[j] = s;
  }
}

}  // namespace

double dflash2_unary(const Dflash2SelectorDims& d, double logit) {
  const double u = logit * d.output_multiplier;
  return d.softcap > 0 ? d.softcap * std::tanh(u / d.softcap) : u;
}

double dflash2_unary_grad(const Dflash2SelectorDims& d, double logit) {
  if (d.softcap <= 0) return d.output_multiplier;
  const double t = std::tanh(logit * d.output_multiplier / d.softcap);
  return d.output_multiplier * (1.0 - t * t);
}

template <class T>
Dflash2Candidates dflash2_selector_candidates(const Dflash2SelectorDims& d, const T* logits, int32_t gold) {
  const int V = d.vocab, K = d.top_k;
  DF_CHECK(K >= 1 && K <= V, "dflash2 selector: top_k %d outside [1, vocab %d]", K, V);
  DF_CHECK(gold < V, "dflash2 selector: label %d outside the vocabulary [0, %d)", gold, V);
  std::vector<double> u(static_cast<size_t>(V));
  for (int v = 0; v < V; ++v) u[size_t(v)] = dflash2_unary(d, double(logits[v]));
  std::vector<int32_t> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t a, int32_t b) {
    return u[size_t(a)] > u[size_t(b)] || (u[size_t(a)] == u[size_t(b)] && a < b);
  });
  Dflash2Candidates c;
  c.ids.assign(order.begin(), order.begin() + K);
  for (int32_t id : c.ids) c.unary.push_back(u[size_t(id)]);
  if (gold < 0) return c;
  const auto it = std::find(c.ids.begin(), c.ids.end(), gold);
  c.covered = it != c.ids.end();
  c.target = c.covered ? int(it - c.ids.begin()) : K - 1;
  if (!c.covered) {
    c.ids[size_t(K - 1)] = gold;
    c.unary[size_t(K - 1)] = u[size_t(gold)];
  }
  return c;
}

Dflash2BlockRows dflash2_block_rows(int block_size, const int32_t* tokens, const uint8_t* loss_mask,
                                    int64_t len, int64_t anchor, double gamma) {
  const int B = block_size;
  Dflash2BlockRows r;
  r.labels.assign(size_t(B), 0);
  r.prev.assign(size_t(B), 0);
  r.weights.assign(size_t(B), 0.0);
  if (anchor < 0) return r;
  DF_CHECK(anchor < len && len > 0, "dflash2 rows: anchor %lld outside a sequence of %lld tokens",
           (long long)anchor, (long long)len);
  for (int k = 0; k < B; ++k) {
    const int64_t pos = anchor + k;
    r.labels[size_t(k)] = tokens[std::min(pos, len - 1)];
    r.prev[size_t(k)] = tokens[std::min(std::max(pos - 1, anchor), len - 1)];
    if (k == 0 || pos >= len || !loss_mask[pos]) continue;
    r.weights[size_t(k)] = double(loss_offset_weight(k, float(gamma)));
  }
  return r;
}

double dflash2_selector_alpha(int64_t step, int64_t total_steps, double alpha, double warmup_ratio,
                              double ramp_ratio) {
  if (alpha <= 0 || total_steps <= 0) return alpha;
  const int64_t warmup = int64_t(double(total_steps) * warmup_ratio);
  if (step < warmup) return 0.0;
  const int64_t ramp = int64_t(double(total_steps) * ramp_ratio);
  if (ramp <= 0) return alpha;
  return alpha * std::clamp(double(step - warmup + 1) / double(ramp), 0.0, 1.0);
}

template <class T>
Dflash2BlockLoss dflash2_block_step(const Dflash2SelectorDims& d, const Dflash2SelectorTensors<const T>& w,
                                    const T* lm_head, const T* z, const Dflash2BlockRows& rows, double alpha,
                                    bool stop_gradient, T* logits_out, const Dflash2SelectorTensors<T>* grads,
                                    T* dz) {
  const int H = d.hidden, V = d.vocab, R = d.rank, B = d.block_size;
  DF_CHECK(int(rows.labels.size()) == B && int(rows.prev.size()) == B && int(rows.weights.size()) == B,
           "dflash2 block: rows hold %zu labels for block_size %d", rows.labels.size(), B);
  Dflash2BlockLoss loss;
  std::vector<double> logits(static_cast<size_t>(V)), p(logits.size()), dlogits(logits.size()), proj, ctx,
      score, q, dctx(static_cast<size_t>(R));
  for (int k = 0; k < B; ++k) {
    const double wk = rows.weights[size_t(k)];
    if (wk == 0.0) continue;  // a weightless slot adds nothing to either term or any gradient
    const T* zk = z + int64_t(k) * H;
    for (int v = 0; v < V; ++v) {
      double s = 0;
      for (int h = 0; h < H; ++h) s += double(lm_head[int64_t(v) * H + h]) * double(zk[h]);
      logits[size_t(v)] = s;
      if (logits_out) logits_out[int64_t(k) * V + v] = T(s);
    }
    const int32_t y = rows.labels[size_t(k)];
    DF_CHECK(y >= 0 && y < V, "dflash2 block: label %d of slot %d outside the vocabulary [0, %d)", y, k, V);
    loss.base_sum += wk * (softmax(logits, p) - logits[size_t(y)]);

    const Dflash2Candidates cand = dflash2_selector_candidates(d, logits.data(), y);
    loss.covered += cand.covered ? 1 : 0;
    selector_context(d, w, zk, rows.prev[size_t(k)], proj, ctx);
    selector_scores(d, w, cand, ctx, score);
    loss.selector_sum += wk * (softmax(score, q) - score[size_t(cand.target)]);
    if (!grads) continue;

    // Base CE: ∂/∂logits = w·(p − onehot).
    for (int v = 0; v < V; ++v) dlogits[size_t(v)] = wk * (p[size_t(v)] - (v == y ? 1.0 : 0.0));
    // Selector CE: ∂/∂score_j = α·w·(q_j − [j = target]).
    std::fill(dctx.begin(), dctx.end(), 0.0);
    for (size_t j = 0; j < cand.ids.size(); ++j) {
      const double ds = alpha * wk * (q[j] - (int(j) == cand.target ? 1.0 : 0.0));
      const int64_t id = cand.ids[j];
      for (int r = 0; r < R; ++r) {
        grads->successor_codebook[id * R + r] += T(ds * ctx[size_t(r)]);
        dctx[size_t(r)] += ds * double(w.successor_codebook[id * R + r]);
      }
      if (!stop_gradient) dlogits[size_t(id)] += ds * dflash2_unary_grad(d, logits[size_t(id)]);
    }
    const int64_t prev = rows.prev[size_t(k)];
    for (int r = 0; r < R; ++r) {
      const double pr = double(w.predecessor_codebook[prev * R + r]);
      grads->predecessor_codebook[prev * R + r] += T(dctx[size_t(r)] * proj[size_t(r)]);
      const double dproj = dctx[size_t(r)] * pr;
      for (int h = 0; h < H; ++h) {
        grads->hidden_projection[int64_t(r) * H + h] += T(dproj * double(zk[h]));
        if (dz && !stop_gradient)
          dz[int64_t(k) * H + h] += T(dproj * double(w.hidden_projection[int64_t(r) * H + h]));
      }
    }
    if (!dz) continue;
    for (int v = 0; v < V; ++v) {
      const double g = dlogits[size_t(v)];
      if (g == 0.0) continue;
      for (int h = 0; h < H; ++h) dz[int64_t(k) * H + h] += T(g * double(lm_head[int64_t(v) * H + h]));
    }
  }
  return loss;
}

template <class T>
std::vector<int32_t> dflash2_selector_greedy_path(const Dflash2SelectorDims& d,
                                                  const Dflash2SelectorTensors<const T>& w, const T* logits,
                                                  const T* z, int n, int32_t anchor_token) {
  std::vector<int32_t> path;
  std::vector<double> proj, ctx, score;
  int32_t prev = anchor_token;
  for (int k = 0; k < n; ++k) {
    const Dflash2Candidates cand = dflash2_selector_candidates(d, logits + int64_t(k) * d.vocab, -1);
    selector_context(d, w, z + int64_t(k) * d.hidden, prev, proj, ctx);
    selector_scores(d, w, cand, ctx, score);
    prev = cand.ids[size_t(std::max_element(score.begin(), score.end()) - score.begin())];
    path.push_back(prev);
  }
  return path;
}

#define DF_DFLASH2_SELECTOR(T)                                                                              \
  template Dflash2Candidates dflash2_selector_candidates<T>(const Dflash2SelectorDims&, const T*, int32_t); \
  template Dflash2BlockLoss dflash2_block_step<T>(                                                          \
      const Dflash2SelectorDims&, const Dflash2SelectorTensors<const T>&, const T*, const T*,               \
      const Dflash2BlockRows&, double, bool, T*, const Dflash2SelectorTensors<T>*, T*);                     \
  template std::vector<int32_t> dflash2_selector_greedy_path<T>(                                            \
      const Dflash2SelectorDims&, const Dflash2SelectorTensors<const T>&, const T*, const T*, int, int32_t);
DF_DFLASH2_SELECTOR(float)
DF_DFLASH2_SELECTOR(double)
#undef DF_DFLASH2_SELECTOR

}  // namespace df
