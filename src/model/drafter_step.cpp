// drafter_forward_backward: lays out the blocks of a micro-batch on the host (ids, positions, labels,
// weights), then runs context → layers → final norm → lm_head loss → backward as a flat list of TrainOps calls.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "model/drafter.h"
#include "model/drafter_layer.h"

namespace df {

namespace {

// Host description of the blocks: everything that depends only on the batch and the anchors.
struct BlockLayout {
  std::vector<int32_t> ids, pos_all, blocks, labels, tgt_rows;
  std::vector<uint8_t> labelled;
  std::vector<float> weight;  // base weight exp(−(k−1)/γ) · [a+k < len] · loss_mask[a+k]
};

BlockLayout layout_blocks(const DrafterConfig& c, const DrafterBatch& b, const std::vector<DrafterAnchor>& anchors,
                          float gamma) {
  const int B = c.block_size;
  const int64_t T = b.offsets.back(), N = int64_t(anchors.size()) * B;
  BlockLayout L;
  L.ids.assign(size_t(N), c.mask_token_id);
  L.labels.assign(size_t(N), 0);
  L.tgt_rows.assign(size_t(N), 0);
  L.labelled.assign(size_t(N), 0);
  L.weight.assign(size_t(N), 0.0f);
  L.blocks.assign(2 * anchors.size(), 0);
  L.pos_all.resize(size_t(T + N));
  for (int s = 0; s < b.num_seqs(); ++s)
    for (int64_t t = b.offsets[size_t(s)]; t < b.offsets[size_t(s) + 1]; ++t)
      L.pos_all[size_t(t)] = int32_t(t - b.offsets[size_t(s)]);
  for (size_t j = 0; j < anchors.size(); ++j) {
    const DrafterAnchor& an = anchors[j];
    DF_CHECK(an.seq >= 0 && an.seq < b.num_seqs(), "drafter step: anchor %zu names sequence %d of %d", j, an.seq,
             b.num_seqs());
    const int64_t s0 = b.offsets[size_t(an.seq)], len = b.offsets[size_t(an.seq) + 1] - s0;
    DF_CHECK(an.pos < len, "drafter step: anchor %zu at position %d is past the end of sequence %d (length %lld)", j,
             an.pos, an.seq, (long long)len);
    L.blocks[2 * j] = int32_t(s0);
    L.blocks[2 * j + 1] = an.pos;
    for (int k = 0; k < B; ++k) {
      const size_t r = j * size_t(B) + size_t(k);
      L.pos_all[size_t(T) + r] = std::max(an.pos, 0) + k;
      if (an.pos < 0) continue;
      if (k == 0) L.ids[r] = b.tokens[size_t(s0 + an.pos)];
      const int64_t t = s0 + an.pos + k;
      if (k == 0 || an.pos + k >= len || !b.loss_mask[size_t(t)]) continue;
      L.labels[r] = b.tokens[size_t(t)];
      L.tgt_rows[r] = int32_t(t - 1);
      L.labelled[r] = 1;
      L.weight[r] = loss_offset_weight(k, gamma);
    }
  }
  return L;
}

// Every tensor of one step, carved from the model's workspace (or a counting arena when planning).
struct StepBuffers {
  Tensor taps, f, rstd_ctx, x0, y, rstd_final, ids, labels, active, tgt_rows, tgt, loss, p_label, argmax, row_w, dy,
      dx, dfc;
  DrafterLayerInputs in;
  std::vector<DrafterLayerActs> layers;
  DrafterLayerGrads grads;
};

StepBuffers step_alloc(Arena& a, const DrafterConfig& c, const DrafterDims& d, bool kl) {
  const int64_t H = c.hidden;
  StepBuffers s;
  s.taps = a.alloc(DType::f32, d.T, H * c.num_taps());
  s.f = a.alloc(DType::f32, d.T, H);
  s.in.ctx = a.alloc(DType::f32, d.T, H);
  s.rstd_ctx = a.alloc(DType::f32, 1, d.T);
  s.in.pos_all = a.alloc(DType::i32, 1, d.T + d.N);
  s.in.blocks = a.alloc(DType::i32, d.nb, 2);
  s.x0 = a.alloc(DType::f32, d.N, H);
  s.layers.resize(size_t(c.layers));
  for (auto& l : s.layers) drafter_layer_acts_alloc(a, c, d, l);
  s.y = a.alloc(DType::f32, d.N, H);
  s.rstd_final = a.alloc(DType::f32, 1, d.N);
  s.ids = a.alloc(DType::i32, 1, d.N);
  s.labels = a.alloc(DType::i32, 1, d.N);
  s.active = a.alloc(DType::u8, 1, d.N);
  s.tgt_rows = a.alloc(DType::i32, 1, d.N);
  if (kl) s.tgt = a.alloc(DType::f32, d.N, H);
  s.loss = a.alloc(DType::f32, 1, d.N);
  s.p_label = a.alloc(DType::f32, 1, d.N);
  s.argmax = a.alloc(DType::i32, 1, d.N);
  s.row_w = a.alloc(DType::f32, 1, d.N);
  s.dy = a.alloc(DType::f32, d.N, H);
  s.dx = a.alloc(DType::f32, d.N, H);
  s.dfc = a.alloc(DType::f32, d.T, H);
  drafter_layer_grads_alloc(a, c, d, s.grads);
  return s;
}

void check_batch(const DrafterConfig& c, const DrafterBatch& b, const DrafterLossOptions& o) {
  DF_CHECK(b.offsets.size() >= 2 && b.offsets[0] == 0, "drafter batch: offsets must start at 0 and name ≥ 1 sequence");
  for (size_t s = 1; s < b.offsets.size(); ++s)
    DF_CHECK(b.offsets[s] >= b.offsets[s - 1], "drafter batch: offsets decrease at sequence %zu", s - 1);
  const int64_t T = b.offsets.back();
  DF_CHECK(int64_t(b.tokens.size()) == T && int64_t(b.loss_mask.size()) == T,
           "drafter batch: %zu tokens and %zu loss_mask entries for %lld packed tokens", b.tokens.size(),
           b.loss_mask.size(), (long long)T);
  for (int32_t t : b.tokens) DF_CHECK(t >= 0 && t < c.vocab, "drafter batch: token id %d outside vocab %d", t, c.vocab);
  DF_CHECK(b.taps.dtype == DType::f32 && b.taps.rows == T && b.taps.cols == int64_t(c.hidden) * c.num_taps(),
           "drafter batch: taps are %s, expected f32 [%lld, %d taps × hidden %d]", b.taps.shape_str().c_str(),
           (long long)T, c.num_taps(), c.hidden);
  if (o.kind == LmLossKind::kl)
    DF_CHECK(b.target_hidden.rows == T && b.target_hidden.cols == c.hidden,
             "drafter batch: the soft-KL loss needs target_hidden [%lld, %d] (target final-norm output), got %s",
             (long long)T, c.hidden, b.target_hidden.shape_str().c_str());
}

}  // namespace

LossStats drafter_forward_backward(DrafterModel& m, const DrafterBatch& batch, const std::vector<DrafterAnchor>& anchors,
                                   const DrafterLossOptions& opts) {
  const DrafterConfig& c = m.config();
  TrainOps& ops = m.ops();
  DF_CHECK(!m.embed.empty() && !m.lm_head.empty(), "drafter step: call set_frozen(embed, lm_head) first");
  check_batch(c, batch, opts);
  const int B = c.block_size;
  const bool kl = opts.kind == LmLossKind::kl;
  DrafterDims d;
  d.T = batch.offsets.back();
  d.nb = int64_t(anchors.size());
  d.N = d.nb * B;
  LossStats st;
  st.correct.assign(size_t(B - 1), 0);
  st.count.assign(size_t(B - 1), 0);
  if (d.nb == 0) return st;
  BlockLayout L = layout_blocks(c, batch, anchors, opts.gamma);

  Arena plan(nullptr, 0, ops.device());
  step_alloc(plan, c, d, kl);
  if (plan.high_water() > m.workspace_bytes) {
    if (m.workspace) ops.free_bytes(m.workspace);
    m.workspace = ops.alloc_bytes(plan.high_water());
    m.workspace_bytes = plan.high_water();
  }
  Arena arena(m.workspace, m.workspace_bytes, ops.device());
  StepBuffers s = step_alloc(arena, c, d, kl);
  ops.upload_raw(s.in.pos_all, L.pos_all.data());
  ops.upload_raw(s.in.blocks, L.blocks.data());
  ops.upload_raw(s.ids, L.ids.data());
  ops.upload_raw(s.labels, L.labels.data());
  ops.upload_raw(s.active, L.labelled.data());
  ops.upload_raw(s.tgt_rows, L.tgt_rows.data());

  // ---- forward ----
  ops.copy(batch.taps, s.taps);
  if (opts.noise_std > 0) ops.add_gaussian_noise(s.taps, opts.noise_std, opts.noise_seed);
  ops.gemm(s.taps, false, m.w.fc, true, s.f, 1, 0);
  ops.rmsnorm_fwd(s.f, m.w.hidden_norm, s.in.ctx, s.rstd_ctx, c.rms_eps);
  ops.embedding(s.ids, m.embed, s.x0);
  for (int l = 0; l < c.layers; ++l)
    drafter_layer_forward(ops, c, l, m.w.layers[size_t(l)], s.in, l == 0 ? s.x0 : s.layers[size_t(l) - 1].x_out,
                          s.layers[size_t(l)]);
  const Tensor& x_last = s.layers.back().x_out;
  ops.rmsnorm_fwd(x_last, m.w.norm, s.y, s.rstd_final, c.rms_eps);
  if (kl) ops.embedding(s.tgt_rows, batch.target_hidden, s.tgt);
  ops.lm_head_loss(s.y, m.lm_head, s.labels, s.active, s.tgt, opts.kind, s.loss, s.p_label, s.argmax, s.dy);

  // ---- weights and statistics (host) ----
  std::vector<float> loss(size_t(d.N)), p_label(size_t(d.N));
  std::vector<int32_t> argmax(size_t(d.N));
  ops.download_raw(s.loss, loss.data());
  ops.download_raw(s.p_label, p_label.data());
  ops.download_raw(s.argmax, argmax.data());
  if (opts.fixed_row_weights) {
    DF_CHECK(int64_t(opts.fixed_row_weights->size()) == d.N, "drafter step: %zu fixed row weights for %lld rows",
             opts.fixed_row_weights->size(), (long long)d.N);
    st.row_weight = *opts.fixed_row_weights;
  } else if (opts.dpace != DpaceKind::off) {
    st.row_weight = loss_dpace_weights(L.labelled, p_label, B, opts.dpace_alpha, opts.dpace);
  } else {
    st.row_weight = L.weight;
    if (opts.streak) loss_apply_streak(st.row_weight, L.labelled, p_label, B, opts.streak_alpha);
  }
  for (int64_t r = 0; r < d.N; ++r) {
    st.loss_sum += double(st.row_weight[size_t(r)]) * loss[size_t(r)];
    st.weight_sum += st.row_weight[size_t(r)];
  }
  if (opts.dpace != DpaceKind::off) st.weight_sum = batch.num_seqs();  // D-PACE divides by the sequences
  loss_count_accuracy(st, L.labelled, argmax, L.labels, B);
  st.row_argmax = argmax;  // what the drafter drafts (pipeline/spec_decode.cpp)
  if (!opts.backward) return st;

  // ---- backward: ∂(Σ w·L) ----
  ops.upload_raw(s.row_w, st.row_weight.data());
  ops.scale_rows(s.dy, s.row_w);
  ops.rmsnorm_bwd(x_last, m.w.norm, s.rstd_final, s.dy, s.dx, m.g.norm, 0);
  ops.fill(s.grads.dctx, 0.0f);
  for (int l = c.layers - 1; l >= 0; --l)
    drafter_layer_backward(ops, c, l, m.w.layers[size_t(l)], m.g.layers[size_t(l)], s.in,
                           l == 0 ? s.x0 : s.layers[size_t(l) - 1].x_out, s.layers[size_t(l)], s.dx, s.grads);
  ops.rmsnorm_bwd(s.f, m.w.hidden_norm, s.rstd_ctx, s.grads.dctx, s.dfc, m.g.hidden_norm, 0);
  ops.gemm(s.dfc, true, s.taps, false, m.g.fc, 1, 1);
  return st;
}

}  // namespace df
