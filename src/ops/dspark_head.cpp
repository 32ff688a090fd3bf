// DSpark's head on the host: the head's parameters, the rows of a block, and the exact forward and backward
// of one block (Markov bias of each head type, confidence head, CE + L1 + BCE). Sums run in double in a fixed
// order, so the result does not depend on how blocks are spread over threads.
#include "ops/dspark_head.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "ops/head_math.h"

namespace df {

namespace {

// y = W x (+ bias), W [rows, cols] row-major.
template <class T>
void matvec(const T* W, const T* bias, const double* x, int rows, int cols, double* y) {
  for (int r = 0; r < rows; ++r)
    y[r] = head_dot(W + int64_t(r) * cols, x, cols) + (bias ? double(bias[r]) : 0.0);
}

// dW += dy ⊗ x, db += dy, dx += Wᵀ dy (dx may be null).
template <class T>
void matvec_backward(const T* W, const double* x, const double* dy, int rows, int cols, T* dW, T* db,
                     double* dx) {
  for (int r = 0; r < rows; ++r) {
    if (dy[r] == 0.0) continue;
    for (int j = 0; j < cols; ++j) {
      dW[int64_t(r) * cols + j] += T(dy[r] * x[j]);
      if (dx) dx[j] += dy[r] * double(W[int64_t(r) * cols + j]);
    }
    if (db) db[r] += T(dy[r]);
  }
}

// Scratch of one slot's Markov forward.
struct MarkovScratch {
  std::vector<double> in, pre;
  explicit MarkovScratch(const DSparkHeadDims& d)
      : in(size_t(2 * d.markov_rank + d.hidden)), pre(size_t(3 * d.markov_rank)) {}
};

// One slot's Markov forward (R > 0): e = W1[prev] and u, the vector W2 reads, from the slot's draft hidden z
// [H]; the gated head's gate, the RNN's gate and candidate into gate and cand (both unused by vanilla), and
// the RNN's state s_prev → s_next.
template <class T>
void markov_slot(const DSparkHeadDims& d, const DSparkHeadTensors<const T>& w, int prev, const double* z,
                 const double* s_prev, double* e, double* u, double* gate, double* cand, double* s_next,
                 MarkovScratch& m) {
  const int H = d.hidden, R = d.markov_rank, V = d.vocab;
  DF_CHECK(prev >= 0 && prev < V, "dspark head: previous token %d outside the vocabulary [0, %d)", prev, V);
  for (int r = 0; r < R; ++r) e[r] = double(w.markov_w1[int64_t(prev) * R + r]);
  if (d.markov_head_type == DrafterMarkovHead::gated) {
    std::copy_n(z, H, m.in.begin());
    std::copy_n(e, R, m.in.begin() + H);
    matvec(w.gate_w, w.gate_b, m.in.data(), R, H + R, m.pre.data());
    for (int r = 0; r < R; ++r) {
      gate[r] = head_sigmoid(m.pre[size_t(r)]);
      u[r] = gate[r] * e[r];
    }
  } else if (d.markov_head_type == DrafterMarkovHead::rnn) {
    std::copy_n(s_prev, R, m.in.begin());
    std::copy_n(e, R, m.in.begin() + R);
    std::copy_n(z, H, m.in.begin() + 2 * R);
    matvec(w.joint_w, w.joint_b, m.in.data(), 3 * R, 2 * R + H, m.pre.data());
    for (int r = 0; r < R; ++r) {
      gate[r] = head_sigmoid(m.pre[size_t(r)]);
      cand[r] = std::tanh(m.pre[size_t(R + r)]);
      s_next[r] = gate[r] * s_prev[r] + (1.0 - gate[r]) * cand[r];
      u[r] = std::tanh(m.pre[size_t(2 * R + r)]);
    }
  } else {
    std::copy_n(e, R, u);
  }
}

}  // namespace

std::vector<DSparkHeadParam> dspark_head_params(const DSparkHeadDims& d) {
  const int64_t H = d.hidden, V = d.vocab, R = d.markov_rank;
  std::vector<DSparkHeadParam> p;
  if (R > 0) {
    p.push_back({"markov_head.markov_w1.weight", V, R, true});
    p.push_back({"markov_head.markov_w2.weight", V, R, true});
    if (d.markov_head_type == DrafterMarkovHead::gated) {
      p.push_back({"markov_head.gate_proj.weight", R, H + R, true});
      p.push_back({"markov_head.gate_proj.bias", 1, R, false});
    } else if (d.markov_head_type == DrafterMarkovHead::rnn) {
      p.push_back({"markov_head.joint_proj.weight", 3 * R, 2 * R + H, true});
      p.push_back({"markov_head.joint_proj.bias", 1, 3 * R, false});
    }
  }
  if (d.confidence) {
    p.push_back({"confidence_head.proj.weight", 1, d.confidence_in(), true});
    p.push_back({"confidence_head.proj.bias", 1, 1, false});
  }
  return p;
}

DSparkBlockRows dspark_block_rows(const DSparkHeadDims& d, const int32_t* tokens, const uint8_t* loss_mask,
                                  int64_t len, int64_t anchor, double gamma) {
  const int B = d.block_size;
  DSparkBlockRows r;
  r.labels.assign(size_t(B), 0);
  r.prev.assign(size_t(B), 0);
  r.target_pos.assign(size_t(B), 0);
  r.weights.assign(size_t(B), 0.0);
  if (anchor < 0) return r;
  DF_CHECK(anchor < len && len > 0, "dspark rows: anchor %lld outside a sequence of %lld tokens",
           (long long)anchor, (long long)len);
  DF_CHECK(gamma >= 0, "dspark rows: the loss decay γ %g must be ≥ 0 (0: no decay)", gamma);
  bool open = true;  // every label so far inside the sequence and supervised
  for (int k = 0; k < B; ++k) {
    const int64_t label_pos = anchor + k + 1;
    r.labels[size_t(k)] = tokens[std::min(label_pos, len - 1)];
    r.prev[size_t(k)] = tokens[std::min(label_pos - 1, len - 1)];
    r.target_pos[size_t(k)] = std::min(label_pos - 1, len - 1);
    open = open && label_pos < len && loss_mask[label_pos];
    if (open) r.weights[size_t(k)] = gamma > 0 ? std::exp(-double(k) / gamma) : 1.0;
  }
  return r;
}

DSparkLossAlphas dspark_loss_alphas(const TrainSection& t) {
  return {t.dspark_ce_loss_alpha, t.dspark_l1_loss_alpha, t.dspark_confidence_head_alpha};
}

bool dspark_needs_target_hidden(const DSparkHeadDims& d, const DSparkLossAlphas& alpha) {
  return alpha.l1 > 0 || (d.confidence && alpha.confidence > 0);
}

template <class T>
DSparkBlockLoss dspark_block_step(const DSparkHeadDims& d, const DSparkHeadTensors<const T>& w,
                                  const T* lm_head, const T* z, const T* target_hidden,
                                  const DSparkBlockRows& rows, const DSparkLossAlphas& alpha, T* draft_logits,
                                  T* confidence_logits, const DSparkHeadTensors<T>* grads, T* dz) {
  const int H = d.hidden, V = d.vocab, B = d.block_size, R = d.markov_rank, C = d.confidence_in();
  const size_t Hn = size_t(H), Vn = size_t(V), Rn = size_t(R), Cn = size_t(C);
  const DrafterMarkovHead type = d.markov_head_type;
  const bool gated = R > 0 && type == DrafterMarkovHead::gated, rnn = R > 0 && type == DrafterMarkovHead::rnn;
  const bool need_target = dspark_needs_target_hidden(d, alpha);
  DF_CHECK(int(rows.labels.size()) == B && int(rows.weights.size()) == B && int(rows.prev.size()) == B,
           "dspark block: rows hold %zu labels for block_size %d", rows.labels.size(), B);
  DF_CHECK(!need_target || target_hidden,
           "dspark block: the L1 term and the confidence target need the target's final hidden state");
  DF_CHECK(!d.confidence_with_markov || R > 0,
           "dspark block: confidence_head_with_markov without a Markov head");

  // Markov forward over the block, keeping what the backward needs: e_k, u_k (the vector W2 reads) and the
  // head type's gates. RNN state row k+1 is s_k; row 0 is s_{-1} = 0.
  const size_t BR = size_t(B) * Rn;
  std::vector<double> e(BR), u(BR), gate(BR), cand(BR), state(rnn ? BR + Rn : 0, 0.0);
  std::vector<double> zk(Hn), in(size_t(2 * R + H));
  MarkovScratch scratch(d);
  for (int k = 0; k < B && R > 0; ++k) {
    for (int i = 0; i < H; ++i) zk[size_t(i)] = double(z[int64_t(k) * H + i]);
    const size_t at = size_t(k) * Rn;
    markov_slot(d, w, rows.prev[size_t(k)], zk.data(), rnn ? &state[at] : nullptr, &e[at], &u[at], &gate[at],
                &cand[at], rnn ? &state[at + Rn] : nullptr, scratch);
  }

  DSparkBlockLoss loss;
  std::vector<double> logits(Vn), q(Vn), th(Hn), tlogits(Vn), tp(Vn), dd(Vn), conf_in(Cn);
  // Per-slot gradients the head-specific pass below consumes: ∂/∂u_k, ∂/∂e_k (from the confidence head),
  // ∂/∂z_k.
  std::vector<double> du(grads ? BR : 0, 0.0), de(grads ? BR : 0, 0.0), dzk(grads ? size_t(B) * Hn : 0, 0.0);
  for (int k = 0; k < B; ++k) {
    for (int i = 0; i < H; ++i) zk[size_t(i)] = double(z[int64_t(k) * H + i]);
    const double* uk = R > 0 ? &u[size_t(k) * Rn] : nullptr;
    for (int v = 0; v < V; ++v)
      logits[size_t(v)] = head_dot(lm_head + int64_t(v) * H, zk.data(), H) +
                          (R > 0 ? head_dot(w.markov_w2 + int64_t(v) * R, uk, R) : 0.0);
    if (draft_logits)
      for (int v = 0; v < V; ++v) draft_logits[int64_t(k) * V + v] = T(logits[size_t(v)]);
    const int y = rows.labels[size_t(k)];
    DF_CHECK(y >= 0 && y < V, "dspark block: label %d of slot %d outside the vocabulary [0, %d)", y, k, V);
    const double wk = rows.weights[size_t(k)];
    loss.ce_sum += wk * (head_softmax(logits, q) - logits[size_t(y)]);

    double l1 = 0;
    if (need_target) {
      for (int i = 0; i < H; ++i) th[size_t(i)] = double(target_hidden[int64_t(k) * H + i]);
      for (int v = 0; v < V; ++v) tlogits[size_t(v)] = head_dot(lm_head + int64_t(v) * H, th.data(), H);
      head_softmax(tlogits, tp);
      for (int v = 0; v < V; ++v) l1 += std::fabs(q[size_t(v)] - tp[size_t(v)]);
      if (alpha.l1 > 0) loss.l1_sum += wk * l1;
    }
    double conf = 0, dconf = 0;
    if (d.confidence) {
      std::copy(zk.begin(), zk.end(), conf_in.begin());
      if (d.confidence_with_markov) std::copy_n(&e[size_t(k) * Rn], R, conf_in.begin() + H);
      conf = head_dot(w.conf_w, conf_in.data(), C) + double(w.conf_b[0]);
      if (confidence_logits) confidence_logits[k] = T(conf);
      if (alpha.confidence > 0) {
        const double acc = std::clamp(1.0 - 0.5 * l1, 0.0, 1.0);
        // BCE with logits, in the overflow-free form torch uses: max(c, 0) − c·acc + log(1 + exp(−|c|)).
        loss.confidence_sum +=
            wk * (std::max(conf, 0.0) - conf * acc + std::log1p(std::exp(-std::fabs(conf))));
        dconf = alpha.confidence * wk * (head_sigmoid(conf) - acc);
      }
    }
    if (!grads || wk == 0.0) continue;

    // ∂/∂logits: CE, then the L1 term through the softmax (∂|q−t|/∂q = sign(q−t), 0 where equal, as torch).
    double sq = 0;
    std::vector<double> sgn(need_target && alpha.l1 > 0 ? Vn : 0);
    for (size_t v = 0; v < sgn.size(); ++v) {
      const double diff = q[v] - tp[v];
      sgn[v] = diff > 0 ? 1.0 : diff < 0 ? -1.0 : 0.0;
      sq += sgn[v] * q[v];
    }
    for (int v = 0; v < V; ++v) {
      dd[size_t(v)] = alpha.ce * wk * (q[size_t(v)] - (v == y ? 1.0 : 0.0));
      if (!sgn.empty()) dd[size_t(v)] += alpha.l1 * wk * q[size_t(v)] * (sgn[size_t(v)] - sq);
    }
    double* dzr = &dzk[size_t(k) * Hn];
    for (int v = 0; v < V; ++v)
      for (int i = 0; i < H; ++i) dzr[i] += dd[size_t(v)] * double(lm_head[int64_t(v) * H + i]);
    if (R > 0)
      matvec_backward(w.markov_w2, uk, dd.data(), V, R, grads->markov_w2, (T*)nullptr, &du[size_t(k) * Rn]);
    if (dconf != 0.0) {
      std::vector<double> dconf_in(size_t(C), 0.0);
      matvec_backward(w.conf_w, conf_in.data(), &dconf, 1, C, grads->conf_w, grads->conf_b, dconf_in.data());
      for (int i = 0; i < H; ++i) dzr[i] += dconf_in[size_t(i)];
      if (d.confidence_with_markov)
        for (int r = 0; r < R; ++r) de[size_t(k) * Rn + size_t(r)] += dconf_in[size_t(H + r)];
    }
  }
  if (!grads) return loss;

  // The Markov head's backward: u_k back to e_k (and z_k), through the block in reverse for the RNN's state.
  std::vector<double> ds(Rn, 0.0), dpre(size_t(3 * R)), din(size_t(2 * R + H));
  for (int k = B - 1; k >= 0 && R > 0; --k) {
    const double* ek = &e[size_t(k) * Rn];
    const double* duk = &du[size_t(k) * Rn];
    double* dek = &de[size_t(k) * Rn];
    double* dzr = &dzk[size_t(k) * Hn];
    for (int i = 0; i < H; ++i) zk[size_t(i)] = double(z[int64_t(k) * H + i]);
    if (gated) {
      std::copy(zk.begin(), zk.end(), in.begin());
      std::copy_n(ek, R, in.begin() + H);
      for (int r = 0; r < R; ++r) {
        const double g = gate[size_t(k) * Rn + size_t(r)];
        dek[r] += duk[r] * g;
        dpre[size_t(r)] = duk[r] * ek[r] * g * (1.0 - g);
      }
      std::fill(din.begin(), din.end(), 0.0);
      matvec_backward(w.gate_w, in.data(), dpre.data(), R, H + R, grads->gate_w, grads->gate_b, din.data());
      for (int i = 0; i < H; ++i) dzr[i] += din[size_t(i)];
      for (int r = 0; r < R; ++r) dek[r] += din[size_t(H + r)];
    } else if (rnn) {
      const double* sp = &state[size_t(k) * Rn];
      std::copy_n(sp, R, in.begin());
      std::copy_n(ek, R, in.begin() + R);
      std::copy(zk.begin(), zk.end(), in.begin() + 2 * R);
      for (int r = 0; r < R; ++r) {
        const size_t at = size_t(k) * Rn + size_t(r);
        const double o = u[at], g = gate[at], c = cand[at];
        dpre[size_t(r)] = ds[size_t(r)] * (sp[r] - c) * g * (1.0 - g);
        dpre[size_t(R + r)] = ds[size_t(r)] * (1.0 - g) * (1.0 - c * c);
        dpre[size_t(2 * R + r)] = duk[r] * (1.0 - o * o);
      }
      std::fill(din.begin(), din.end(), 0.0);
      matvec_backward(w.joint_w, in.data(), dpre.data(), 3 * R, 2 * R + H, grads->joint_w, grads->joint_b,
                      din.data());
      for (int r = 0; r < R; ++r) {
        ds[size_t(r)] = ds[size_t(r)] * gate[size_t(k) * Rn + size_t(r)] + din[size_t(r)];
        dek[r] += din[size_t(R + r)];
      }
      for (int i = 0; i < H; ++i) dzr[i] += din[size_t(2 * R + i)];
    } else {
      for (int r = 0; r < R; ++r) dek[r] += duk[r];
    }
    const int p = rows.prev[size_t(k)];
    for (int r = 0; r < R; ++r) grads->markov_w1[int64_t(p) * R + r] += T(dek[r]);
  }
  if (dz)
    for (size_t i = 0; i < dzk.size(); ++i) dz[i] += T(dzk[i]);
  return loss;
}

template <class T>
std::vector<int32_t> dspark_block_propose(const DSparkHeadDims& d, const DSparkHeadTensors<const T>& w,
                                          const T* lm_head, const T* z, int32_t first,
                                          std::vector<double>* confidence) {
  const int H = d.hidden, V = d.vocab, B = d.block_size, R = d.markov_rank, C = d.confidence_in();
  const bool rnn = R > 0 && d.markov_head_type == DrafterMarkovHead::rnn;
  const size_t Hn = size_t(H), Rn = size_t(R), Cn = size_t(C);
  std::vector<double> zk(Hn), e(Rn), u(Rn), gate(Rn), cand(Rn), state(Rn, 0.0), next(Rn), conf_in(Cn);
  MarkovScratch scratch(d);
  std::vector<int32_t> out;
  if (confidence) confidence->clear();
  int32_t prev = first;
  for (int k = 0; k + 1 < B; ++k) {
    for (int i = 0; i < H; ++i) zk[size_t(i)] = double(z[int64_t(k) * H + i]);
    if (R > 0) {
      markov_slot(d, w, prev, zk.data(), state.data(), e.data(), u.data(), gate.data(), cand.data(),
                  next.data(), scratch);
      if (rnn) state.swap(next);
    }
    int32_t best = 0;
    double best_logit = 0;
    for (int v = 0; v < V; ++v) {
      const double l = head_dot(lm_head + int64_t(v) * H, zk.data(), H) +
                       (R > 0 ? head_dot(w.markov_w2 + int64_t(v) * R, u.data(), R) : 0.0);
      if (v == 0 || l > best_logit) {
        best = v;
        best_logit = l;
      }
    }
    if (confidence && d.confidence) {
      std::copy(zk.begin(), zk.end(), conf_in.begin());
      if (d.confidence_with_markov) std::copy(e.begin(), e.end(), conf_in.begin() + H);
      confidence->push_back(head_dot(w.conf_w, conf_in.data(), C) + double(w.conf_b[0]));
    }
    out.push_back(best);
    prev = best;
  }
  return out;
}

template DSparkBlockLoss dspark_block_step<float>(const DSparkHeadDims&,
                                                  const DSparkHeadTensors<const float>&, const float*,
                                                  const float*, const float*, const DSparkBlockRows&,
                                                  const DSparkLossAlphas&, float*, float*,
                                                  const DSparkHeadTensors<float>*, float*);
template DSparkBlockLoss dspark_block_step<double>(const DSparkHeadDims&,
                                                   const DSparkHeadTensors<const double>&, const double*,
                                                   const double*, const double*, const DSparkBlockRows&,
                                                   const DSparkLossAlphas&, double*, double*,
                                                   const DSparkHeadTensors<double>*, double*);

template std::vector<int32_t> dspark_block_propose<float>(const DSparkHeadDims&,
                                                          const DSparkHeadTensors<const float>&, const float*,
                                                          const float*, int32_t, std::vector<double>*);
template std::vector<int32_t> dspark_block_propose<double>(const DSparkHeadDims&,
                                                           const DSparkHeadTensors<const double>&,
                                                           const double*, const double*, int32_t,
                                                           std::vector<double>*);

}  // namespace df
