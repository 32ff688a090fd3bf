// TargetDecoder: the target forward of target_forward.cpp, step by step. A step's rows form segments, one per
// sequence slot (one segment for step, one row per slot for step_all). Attention layers append each segment's
// keys/values to its slot's cache and attend over it (Ops::attention_cached); DeltaNet layers run the causal
// conv over [the slot's conv history | segment inputs] and continue its recurrence (Ops::gdn_decode), saving
// the states and conv inputs of a step's last tokens so commit can roll back.
#include "model/target_decode.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/target_moe.h"

namespace df {

struct TargetDecoder::Buffers {
  Tensor ids, pos;           // i32 [1, max_step]
  Tensor h, n, proj, mix;    // as in TargetForward's workspace, [max_step, ·]
  Tensor conv_in, conv_out;  // [K − 1 + max_step, conv channels]: [history | step inputs] and its conv
  Tensor normed, act;        // gated-norm output [max_step, nv·dv]; SwiGLU output [max_step, I]
  // The one-sequence layout of conv_in: offsets i32 [1, 2] and positions [1, K − 1 + max_step].
  Tensor conv_cu, conv_pos;
  std::vector<Tensor> taps;  // [max_step, H] per tap layer
  Tensor logits;             // [max(max_block, slots), V]
  Fp8Inputs fp8;             // FP8 GEMM input codes [max_step, max K]; empty unless the model holds FP8 codes
  MoeScratch moe;            // routing buffers of the MoE layers [max_step, top_k]; empty for a dense model
};

struct TargetDecoder::LayerCache {
  Tensor k, v;  // full attention: [slots · max_len, kv·hd], slot s at rows [s·max_len, (s+1)·max_len)
  // DeltaNet: raw conv inputs of each slot's last K − 1 committed tokens [slots · (K − 1), C].
  Tensor conv_hist;
  Tensor conv_saved;  // a step's last K − 1 + R conv inputs, for commit [K − 1 + max_block, C]
  Tensor state;       // f32 [slots, nv·dk·dv] after each slot's last committed token
  Tensor states;      // f32 [max(max_block, slots), nv·dk·dv]: after each of a step's last R tokens (step),
                      // after each slot's token (step_all)
};

TargetDecoder::TargetDecoder(const TargetModel& model, const TargetDecodeLimits& limits,
                             const std::vector<int>& tap_layers)
    : m_(model), ops_(*model.ops), lim_(limits), tap_layers_(tap_layers), b_(std::make_unique<Buffers>()) {
  const QwenConfig& c = m_.cfg;
  DF_CHECK(lim_.max_len > 0 && lim_.max_step > 0 && lim_.max_block > 0 && lim_.max_step <= lim_.max_len &&
               lim_.slots >= 1 && lim_.slots <= lim_.max_step,
           "target decode: limits max_len %lld, max_step %lld, max_block %lld, slots %d must be positive, "
           "max_step ≤ max_len, slots ≤ max_step",
           (long long)lim_.max_len, (long long)lim_.max_step, (long long)lim_.max_block, lim_.slots);
  DF_CHECK(
      m_.num_loaded_layers == c.layers && !m_.lm_head.empty(),
      "target decode needs every layer (%d of %d loaded) and the lm_head (%s); HINT: load the target with "
      "TargetLoadOptions{-1, need_lm_head = true}",
      m_.num_loaded_layers, c.layers, m_.lm_head.empty() ? "missing" : "present");
  for (int l : tap_layers_)
    DF_CHECK(l >= 0 && l < c.layers, "target decode: tap layer %d outside the target's layers 0..%d", l,
             c.layers - 1);
  lim_.max_block = std::min(lim_.max_block, lim_.max_step);
  caches_.resize(m_.layers.size());
  Arena arena;
  block_ = ops_alloc_planned(ops_, [this](Arena& a) { plan(a); }, 0, arena);
  std::vector<int32_t> pos(size_t(b_->conv_pos.cols));
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t(i);
  ops_.upload_raw(b_->conv_pos, pos.data());
  reset();
}

TargetDecoder::~TargetDecoder() {
  if (block_) ops_.free_bytes(block_);
}

void TargetDecoder::plan(Arena& a) {
  const QwenConfig& c = m_.cfg;
  const DType act = ops_.act_dtype();
  const int64_t S = lim_.max_step, K1 = std::max(c.conv_kernel - 1, 0), slots = lim_.slots;
  const int64_t vdim = int64_t(c.lin_nv) * c.lin_dv, sdim = vdim * c.lin_dk;
  const int64_t saved = std::max<int64_t>(lim_.max_block, slots);
  int64_t proj_cols = 2 * int64_t(c.intermediate), conv_ch = 1;
  for (const TargetLayer& L : m_.layers) {
    proj_cols = std::max(proj_cols, L.kind == LayerKind::full_attention ? L.w_qkv.rows : L.w_in.rows);
    if (L.kind == LayerKind::linear_attention) conv_ch = std::max(conv_ch, L.conv_w.rows);
  }
  if (m_.fp8_codes) proj_cols = (proj_cols + 15) / 16 * 16;  // as TargetForward::plan: FP8 GEMM output rows
  Buffers& b = *b_;
  b.ids = a.alloc(DType::i32, 1, S);
  b.pos = a.alloc(DType::i32, 1, S);
  b.h = a.alloc(act, S, c.hidden);
  b.n = a.alloc(act, S, c.hidden);
  b.proj = a.alloc(act, S, proj_cols);
  b.mix = a.alloc(act, S, std::max<int64_t>({int64_t(c.heads) * c.head_dim, vdim, 1}));
  b.conv_in = a.alloc(act, K1 + S, conv_ch);
  b.conv_out = a.alloc(act, K1 + S, conv_ch);
  b.normed = a.alloc(act, S, std::max<int64_t>(vdim, 1));
  b.act = a.alloc(act, S, c.intermediate);
  b.conv_cu = a.alloc(DType::i32, 1, 2);
  b.conv_pos = a.alloc(DType::i32, 1, K1 + S);
  b.taps.clear();
  for (size_t i = 0; i < tap_layers_.size(); ++i) b.taps.push_back(a.alloc(act, S, c.hidden));
  b.logits = a.alloc(act, saved, c.vocab);
  fp8_inputs_plan(m_, S, a, b.fp8);
  moe_scratch_plan(m_, S, a, b.moe);
  for (size_t l = 0; l < m_.layers.size(); ++l) {
    const TargetLayer& L = m_.layers[l];
    LayerCache& lc = caches_[l];
    if (L.kind == LayerKind::full_attention) {
      lc.k = a.alloc(act, slots * lim_.max_len, int64_t(c.kv_heads) * c.head_dim);
      lc.v = a.alloc(act, slots * lim_.max_len, int64_t(c.kv_heads) * c.head_dim);
    } else {
      if (K1 > 0) {
        lc.conv_hist = a.alloc(act, slots * K1, L.conv_w.rows);
        lc.conv_saved = a.alloc(act, K1 + lim_.max_block, L.conv_w.rows);
      }
      lc.state = a.alloc(DType::f32, slots, sdim);
      lc.states = a.alloc(DType::f32, saved, sdim);
    }
  }
}

void TargetDecoder::reset() {
  for (size_t l = 0; l < m_.layers.size(); ++l) {
    LayerCache& lc = caches_[l];
    for (const Tensor* t : {&lc.conv_hist, &lc.state}) {
      if (t->empty()) continue;
      const std::vector<float> zeros(size_t(t->numel()), 0.0f);
      ops_.upload_f32(*t, zeros.data());
    }
  }
  lens_.assign(size_t(lim_.slots), 0);
  last_step_ = 0;
  pending_ = -1;
  pending_saved_ = 0;
}

void TargetDecoder::layer_full(size_t l, int64_t T) {
  const QwenConfig& c = m_.cfg;
  const TargetLayer& L = m_.layers[l];
  LayerCache& lc = caches_[l];
  const int hd = c.head_dim;
  const int64_t q_cols = int64_t(c.heads) * hd, kv_cols = int64_t(c.kv_heads) * hd;
  Tensor proj = b_->proj.rows_view(0, T).cols_view(0, L.w_qkv.rows);
  target_linear(m_, b_->fp8, b_->n.rows_view(0, T), L.w_qkv, L.s_qkv, proj, 0.0f);
  const int64_t k0 = q_cols * (c.attn_output_gate ? 2 : 1);
  Tensor q = proj.cols_view(0, q_cols), k = proj.cols_view(k0, kv_cols),
         v = proj.cols_view(k0 + kv_cols, kv_cols);
  Tensor pos = b_->pos.cols_view(0, T);
  ops_.qk_norm_rope(q, L.q_norm, pos, c.heads, hd, c.rot_dim, c.rope_theta, c.rms_eps, c.norm_kind());
  ops_.qk_norm_rope(k, L.k_norm, pos, c.kv_heads, hd, c.rot_dim, c.rope_theta, c.rms_eps, c.norm_kind());
  Tensor o = b_->mix.rows_view(0, T).cols_view(0, q_cols);
  for (const Segment& g : segs_) {
    const int64_t base = int64_t(g.slot) * lim_.max_len;
    ops_.copy(k.rows_view(g.row0, g.n), lc.k.rows_view(base + g.past, g.n));
    ops_.copy(v.rows_view(g.row0, g.n), lc.v.rows_view(base + g.past, g.n));
    Tensor gate;
    if (c.attn_output_gate) gate = proj.cols_view(q_cols, q_cols).rows_view(g.row0, g.n);
    ops_.attention_cached(q.rows_view(g.row0, g.n), lc.k.rows_view(base, g.past + g.n),
                          lc.v.rows_view(base, g.past + g.n), o.rows_view(g.row0, g.n), g.past, c.heads,
                          c.kv_heads, hd, 1.0f / std::sqrt(float(hd)), c.attn_output_gate ? &gate : nullptr);
  }
  target_linear(m_, b_->fp8, o, L.w_o, L.s_o, b_->h.rows_view(0, T), 1.0f);
}

void TargetDecoder::layer_linear(size_t l, int64_t T, int64_t R) {
  const QwenConfig& c = m_.cfg;
  const TargetLayer& L = m_.layers[l];
  LayerCache& lc = caches_[l];
  const int64_t C = L.conv_w.rows, vdim = int64_t(c.lin_nv) * c.lin_dv, nv = c.lin_nv;
  const int64_t K1 = std::max(c.conv_kernel - 1, 0);
  Tensor proj = b_->proj.rows_view(0, T).cols_view(0, L.w_in.rows);
  target_linear(m_, b_->fp8, b_->n.rows_view(0, T), L.w_in, L.s_in, proj, 0.0f, &L.w_in_ba);
  Tensor o = b_->mix.rows_view(0, T).cols_view(0, vdim);
  for (size_t gi = 0; gi < segs_.size(); ++gi) {
    const Segment& g = segs_[gi];
    const int64_t rows = K1 + g.n;
    Tensor seg = proj.rows_view(g.row0, g.n);
    Tensor hist = K1 > 0 ? lc.conv_hist.rows_view(int64_t(g.slot) * K1, K1) : Tensor{};
    // The conv of the segment over [the slot's last K − 1 committed inputs | its inputs] as one sequence: the
    // history stands in for the zeros a prefill sees before position 0.
    Tensor conv_in = b_->conv_in.rows_view(0, rows).cols_view(0, C);
    if (K1 > 0) ops_.copy(hist, conv_in.rows_view(0, K1));
    ops_.copy(seg.cols_view(0, C), conv_in.rows_view(K1, g.n));
    SeqLayout one;
    one.cu_host = {0, int32_t(rows)};
    one.cu = b_->conv_cu;
    one.pos = b_->conv_pos.cols_view(0, rows);
    one.tokens = rows;
    one.num_seqs = 1;
    one.max_len = int(rows);
    if (conv_cu_rows_ != int32_t(rows)) {  // the same for every layer of a step: one sync a step, not 48
      ops_.upload_raw(one.cu, one.cu_host.data());
      conv_cu_rows_ = int32_t(rows);
    }
    Tensor conv_out = b_->conv_out.rows_view(0, rows).cols_view(0, C);
    ops_.conv1d_silu(conv_in, L.conv_w, conv_out, one);
    // step_all: one token per slot, its state in row gi; step: the last R tokens' states.
    Tensor states = batched_ ? lc.states.rows_view(int64_t(gi), 1) : lc.states.rows_view(0, R);
    Tensor state = lc.state.rows_view(g.slot, 1);
    ops_.gdn_decode(conv_out.rows_view(K1, g.n), seg.cols_view(C + vdim + nv, nv),
                    seg.cols_view(C + vdim, nv), L.A_log, L.dt_bias, o.rows_view(g.row0, g.n), state, states,
                    GdnShape{c.lin_nk, c.lin_nv, c.lin_dk, c.lin_dv});
    if (batched_) {  // committed at once: the slot's state and conv history move on
      ops_.copy(states, state);
      if (K1 > 0) ops_.copy(conv_in.rows_view(g.n, K1), hist);
    } else if (K1 > 0) {
      ops_.copy(conv_in.rows_view(g.n - R, K1 + R), lc.conv_saved.rows_view(0, K1 + R));
    }
  }
  Tensor normed = b_->normed.rows_view(0, T).cols_view(0, vdim);
  ops_.gated_rmsnorm(o, proj.cols_view(C, vdim), L.gdn_norm, normed, c.lin_nv, c.lin_dv, c.rms_eps);
  target_linear(m_, b_->fp8, normed, L.w_out, L.s_out, b_->h.rows_view(0, T), 1.0f);
}

void TargetDecoder::forward(const std::vector<int32_t>& ids, const std::vector<int32_t>& pos, int64_t R) {
  const QwenConfig& c = m_.cfg;
  const int64_t T = int64_t(ids.size());
  for (int32_t id : ids)
    DF_CHECK(id >= 0 && id < c.vocab, "target decode: token id %d outside vocab %d", id, c.vocab);
  ops_.upload_raw(b_->ids.cols_view(0, T), ids.data());
  ops_.upload_raw(b_->pos.cols_view(0, T), pos.data());
  const NormKind nk = c.norm_kind();
  Tensor h = b_->h.rows_view(0, T), n = b_->n.rows_view(0, T);
  ops_.embedding(b_->ids.cols_view(0, T), m_.embed, h);
  ops_.rmsnorm(h, m_.layers[0].ln1, n, c.rms_eps, nk);
  for (size_t l = 0; l < m_.layers.size(); ++l) {
    const TargetLayer& L = m_.layers[l];
    if (L.kind == LayerKind::full_attention)
      layer_full(l, T);
    else
      layer_linear(l, T, R);
    ops_.rmsnorm(h, L.ln2, n, c.rms_eps, nk);
    if (c.layer_is_moe(int(l)))
      target_moe(m_, b_->moe, L, b_->n, b_->h, T);
    else
      target_mlp(m_, b_->fp8, L, b_->n, b_->proj, b_->act, b_->h, T);
    const Tensor& next_w = l + 1 < m_.layers.size() ? m_.layers[l + 1].ln1 : m_.final_norm;
    ops_.rmsnorm(h, next_w, n, c.rms_eps, nk);  // after the last layer: the final norm
    for (size_t i = 0; i < tap_layers_.size(); ++i)
      if (tap_layers_[i] == int(l)) ops_.copy(h, b_->taps[i].rows_view(0, T));
  }
  ops_.gemm(n.rows_view(T - R, R), m_.lm_head, b_->logits.rows_view(0, R), 0.0f);
  last_step_ = T;
  pending_saved_ = R;
}

void TargetDecoder::step(const std::vector<int32_t>& ids, int slot) {
  const int64_t T = int64_t(ids.size());
  DF_CHECK(pending_ < 0, "target decode: commit the previous step (%lld tokens) before the next",
           (long long)pending_);
  DF_CHECK(slot >= 0 && slot < lim_.slots, "target decode: slot %d of %d", slot, lim_.slots);
  DF_CHECK(T >= 1 && T <= lim_.max_step,
           "target decode: a step of %lld tokens; it must be 1..%lld (max_step)", (long long)T,
           (long long)lim_.max_step);
  const int64_t past = lens_[size_t(slot)];
  DF_CHECK(past + T <= lim_.max_len,
           "target decode: %lld cached + %lld new tokens exceed max_len %lld; HINT: raise the decode limits "
           "(max new tokens + block size)",
           (long long)past, (long long)T, (long long)lim_.max_len);
  std::vector<int32_t> pos(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) pos[size_t(i)] = int32_t(past + i);
  segs_ = {Segment{slot, 0, T, past}};
  batched_ = false;
  forward(ids, pos, std::min(T, lim_.max_block));
  pending_ = T;
  pending_slot_ = slot;
}

void TargetDecoder::step_all(const std::vector<int32_t>& ids) {
  DF_CHECK(pending_ < 0, "target decode: commit the previous step (%lld tokens) before the next",
           (long long)pending_);
  DF_CHECK(int64_t(ids.size()) == lim_.slots,
           "target decode: step_all takes one token per slot (%d), got %zu", lim_.slots, ids.size());
  std::vector<int32_t> pos;
  segs_.clear();
  for (int s = 0; s < lim_.slots; ++s) {
    const int64_t past = lens_[size_t(s)];
    DF_CHECK(past + 1 <= lim_.max_len, "target decode: slot %d holds %lld tokens, max_len %lld", s,
             (long long)past, (long long)lim_.max_len);
    segs_.push_back(Segment{s, s, 1, past});
    pos.push_back(int32_t(past));
  }
  batched_ = true;
  forward(ids, pos, lim_.slots);
  for (int64_t& len : lens_) ++len;
}

void TargetDecoder::commit(int64_t n) {
  DF_CHECK(pending_ >= 0, "target decode: commit without a step");
  const int64_t first = pending_ - pending_saved_;  // tokens before the first saved state
  DF_CHECK(n >= 0 && n <= pending_ && (n == 0 || n > first),
           "target decode: cannot keep %lld of a %lld-token step (states are saved for its last %lld tokens)",
           (long long)n, (long long)pending_, (long long)pending_saved_);
  const int64_t K1 = std::max(m_.cfg.conv_kernel - 1, 0);
  if (n > 0)
    for (size_t l = 0; l < m_.layers.size(); ++l) {
      if (m_.layers[l].kind != LayerKind::linear_attention) continue;
      LayerCache& lc = caches_[l];
      ops_.copy(lc.states.rows_view(n - 1 - first, 1), lc.state.rows_view(pending_slot_, 1));
      if (K1 > 0)
        ops_.copy(lc.conv_saved.rows_view(n - first, K1),
                  lc.conv_hist.rows_view(int64_t(pending_slot_) * K1, K1));
    }
  lens_[size_t(pending_slot_)] += n;
  pending_ = -1;
}

Tensor TargetDecoder::logits() const {
  DF_CHECK(last_step_ > 0, "target decode: no step has run");
  return b_->logits.rows_view(0, pending_saved_);
}

Tensor TargetDecoder::tap(size_t i) const {
  DF_CHECK(i < b_->taps.size() && last_step_ > 0, "target decode: tap %zu of %zu after %lld steps", i,
           b_->taps.size(), (long long)last_step_);
  return b_->taps[i].rows_view(0, last_step_);
}

std::vector<float> TargetDecoder::logits_host() {
  const Tensor lg = logits();
  std::vector<float> host(size_t(lg.numel()));
  ops_.download_f32(lg, host.data());
  return host;
}

std::vector<int32_t> TargetDecoder::argmax_rows() {
  const std::vector<float> host = logits_host();
  const int64_t V = m_.cfg.vocab, rows = int64_t(host.size()) / V;
  std::vector<int32_t> out(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = &host[size_t(r * V)];
    out[size_t(r)] = int32_t(std::max_element(row, row + V) - row);
  }
  return out;
}

}  // namespace df
