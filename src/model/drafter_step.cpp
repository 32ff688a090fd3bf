// drafter_accumulate: lays out the blocks of a micro-batch on the host (ids, positions, labels), uploads
// them, then runs context → layers → final norm → lm_head loss → row weights and statistics → backward as a
// flat list of TrainOps calls in the workspace planned once (drafter_plan_workspace). Nothing is read back
// per micro-batch.
#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "core/error.h"
#include "model/drafter.h"
#include "model/drafter_layer.h"

namespace df {

namespace {

// Host description of the blocks: everything that depends only on the batch and the anchors. DFlash's row
// weights depend on the forward (streak) and are made on the backend by loss_row_stats; Domino's, DFlash2's and
// DSpark's labels and weights (and Domino's GRU input tokens, the others' previous tokens) depend on the data
// only and are made here (domino_block_rows, dflash2_block_rows, dspark_block_rows).
struct BlockLayout {
  std::vector<int32_t> ids, pos_all, blocks, labels, tgt_rows, gru_ids, prev;
  std::vector<uint8_t> labelled;
  std::vector<float> row_w;  // kind = domino, dflash2, dspark
};

// Domino's labels, weights and GRU inputs of every block, replacing DFlash's labels in L.
void layout_domino_rows(const DrafterConfig& c, const DrafterBatch& b,
                        const std::vector<DrafterAnchor>& anchors, float gamma, BlockLayout& L) {
  const DominoHeadDims d = domino_head_dims(c);
  const size_t B = size_t(c.block_size);
  L.gru_ids.assign(anchors.size() * B, 0);
  L.row_w.assign(anchors.size() * B, 0.0f);
  for (size_t j = 0; j < anchors.size(); ++j) {
    const int64_t s0 = b.offsets[size_t(anchors[j].seq)], len = b.offsets[size_t(anchors[j].seq) + 1] - s0;
    const DominoBlockRows rows = domino_block_rows(d, b.tokens.data() + s0, b.loss_mask.data() + s0, len,
                                                   anchors[j].pos, double(gamma));
    for (size_t k = 0; k < B; ++k) {
      L.labels[j * B + k] = rows.labels[k];
      L.gru_ids[j * B + k] = rows.inputs[k];
      L.row_w[j * B + k] = float(rows.weights[k]);
    }
  }
}

// The labels, previous tokens and weights of every block for a head that reads each slot's previous token
// (DFlash2's selector, DSpark's Markov head), replacing DFlash's labels in L: rows_of(tokens, loss_mask, len,
// anchor) gives one block's rows. DSpark's rows also carry the position of the target's final hidden state that
// predicts each label (target_pos), which replaces DFlash's target row.
template <class RowsOf>
void layout_prev_rows(const DrafterConfig& c, const DrafterBatch& b, const std::vector<DrafterAnchor>& anchors,
                      RowsOf rows_of, BlockLayout& L) {
  const size_t B = size_t(c.block_size);
  L.prev.assign(anchors.size() * B, 0);
  L.row_w.assign(anchors.size() * B, 0.0f);
  for (size_t j = 0; j < anchors.size(); ++j) {
    const int64_t s0 = b.offsets[size_t(anchors[j].seq)], len = b.offsets[size_t(anchors[j].seq) + 1] - s0;
    const auto rows = rows_of(b.tokens.data() + s0, b.loss_mask.data() + s0, len, anchors[j].pos);
    for (size_t k = 0; k < B; ++k) {
      L.labels[j * B + k] = rows.labels[k];
      L.prev[j * B + k] = rows.prev[k];
      if constexpr (requires { rows.target_pos; }) L.tgt_rows[j * B + k] = int32_t(s0 + rows.target_pos[k]);
      L.row_w[j * B + k] = float(rows.weights[k]);
    }
  }
}

BlockLayout layout_blocks(const DrafterConfig& c, const DrafterBatch& b,
                          const std::vector<DrafterAnchor>& anchors) {
  const int B = c.block_size;
  const int64_t T = b.offsets.back(), N = int64_t(anchors.size()) * B;
  BlockLayout L;
  L.ids.assign(size_t(N), c.mask_token_id);
  L.labels.assign(size_t(N), 0);
  L.tgt_rows.assign(size_t(N), 0);
  L.labelled.assign(size_t(N), 0);
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
    }
  }
  return L;
}

// Every tensor of one step, carved from the model's workspace (or a counting arena when planning).
// Activations and their gradients are act_dtype; saved statistics, losses and weights f32; indices i32.
struct StepBuffers {
  Tensor taps, f, rstd_ctx, x0, y, rstd_final, ids, labels, active, tgt_rows, tgt, loss, p_label, argmax,
      row_w, dy, dx, dfc, gru_ids, gru_in, prev;
  DrafterLayerInputs in;
  std::vector<DrafterLayerActs> layers;
  DrafterLayerGrads grads;
};

// taps: the copy feature noise is added into (the batch's taps are the caller's: a replayed batch, the
// finite-difference checks, must see the same features again); only when noise is on. tgt: the gathered rows
// of the target's final hidden state for the soft-KL loss (DSpark's head reads the batch's rows itself).
StepBuffers step_alloc(Arena& a, const DrafterConfig& c, const DrafterDims& d, bool kl, bool noise,
                       DType act) {
  const int64_t H = c.hidden;
  StepBuffers s;
  if (noise) s.taps = a.alloc(act, d.T, H * c.num_taps());
  s.f = a.alloc(act, d.T, H);
  s.in.ctx = a.alloc(act, d.T, H);
  s.rstd_ctx = a.alloc(DType::f32, 1, d.T);
  s.in.pos_all = a.alloc(DType::i32, 1, d.T + d.N);
  s.in.blocks = a.alloc(DType::i32, d.nb, 2);
  s.x0 = a.alloc(act, d.N, H);
  s.layers.resize(size_t(c.layers));
  for (auto& l : s.layers) drafter_layer_acts_alloc(a, c, d, act, l);
  s.y = a.alloc(act, d.N, H);
  s.rstd_final = a.alloc(DType::f32, 1, d.N);
  s.ids = a.alloc(DType::i32, 1, d.N);
  s.labels = a.alloc(DType::i32, 1, d.N);
  s.active = a.alloc(DType::u8, 1, d.N);
  s.tgt_rows = a.alloc(DType::i32, 1, d.N);
  if (kl) s.tgt = a.alloc(act, d.N, H);
  s.loss = a.alloc(DType::f32, 1, d.N);
  s.p_label = a.alloc(DType::f32, 1, d.N);
  s.argmax = a.alloc(DType::i32, 1, d.N);
  s.row_w = a.alloc(DType::f32, 1, d.N);
  if (c.kind == DrafterKind::domino) {
    s.gru_ids = a.alloc(DType::i32, 1, d.N);  // the GRU input tokens, then their target embeddings
    s.gru_in = a.alloc(act, d.N, H);
  }
  if (c.kind == DrafterKind::dflash2 || c.kind == DrafterKind::dspark) s.prev = a.alloc(DType::i32, 1, d.N);
  s.dy = a.alloc(act, d.N, H);
  s.dx = a.alloc(act, d.N, H);
  s.dfc = a.alloc(act, d.T, H);
  drafter_layer_grads_alloc(a, c, d, act, s.grads);
  return s;
}

DrafterDims dims_of(const DrafterConfig& c, int64_t T, int64_t nb) {
  DrafterDims d;
  d.T = T;
  d.nb = nb;
  d.N = nb * c.block_size;
  return d;
}

void check_batch(const DrafterModel& m, const DrafterBatch& b, const DrafterLossOptions& o, int64_t nb) {
  const DrafterConfig& c = m.config();
  const DType act = m.ops().act_dtype();
  DF_CHECK(b.offsets.size() >= 2 && b.offsets[0] == 0, "drafter batch: offsets must start at 0 and name ≥ 1 sequence");
  for (size_t s = 1; s < b.offsets.size(); ++s)
    DF_CHECK(b.offsets[s] >= b.offsets[s - 1], "drafter batch: offsets decrease at sequence %zu", s - 1);
  const int64_t T = b.offsets.back();
  DF_CHECK(int64_t(b.tokens.size()) == T && int64_t(b.loss_mask.size()) == T,
           "drafter batch: %zu tokens and %zu loss_mask entries for %lld packed tokens", b.tokens.size(),
           b.loss_mask.size(), (long long)T);
  for (int32_t t : b.tokens) DF_CHECK(t >= 0 && t < c.vocab, "drafter batch: token id %d outside vocab %d", t, c.vocab);
  DF_CHECK(b.taps.dtype == act && b.taps.device == m.ops().device() && b.taps.rows == T &&
               b.taps.cols == int64_t(c.hidden) * c.num_taps(),
           "drafter batch: taps are %s %s, expected %s [%lld, %d taps × hidden %d] in %s backend memory",
           dtype_name(b.taps.dtype), b.taps.shape_str().c_str(), dtype_name(act), (long long)T, c.num_taps(),
           c.hidden, m.ops().name());
  const bool dspark_target =
      c.kind == DrafterKind::dspark && dspark_needs_target_hidden(dspark_head_dims(c), o.dspark);
  if (dspark_target)
    DF_CHECK(
        b.target_hidden.rows == T && b.target_hidden.cols == c.hidden && b.target_hidden.dtype == act,
        "drafter batch: the DSpark loss's L1 term and confidence target need target_hidden %s [%lld, %d] "
        "(target final-norm output), got %s",
        dtype_name(act), (long long)T, c.hidden, b.target_hidden.shape_str().c_str());
  if (o.kind == LmLossKind::kl)
    DF_CHECK(b.target_hidden.rows == T && b.target_hidden.cols == c.hidden && b.target_hidden.dtype == act,
             "drafter batch: the soft-KL loss needs target_hidden %s [%lld, %d] (target final-norm output), "
             "got %s",
             dtype_name(act), (long long)T, c.hidden, b.target_hidden.shape_str().c_str());
  const DrafterLimits& lim = m.limits;
  DF_CHECK(m.workspace != nullptr,
           "drafter step: no workspace; HINT: call drafter_plan_workspace(model, limits) once");
  DF_CHECK(T <= lim.max_tokens,
           "drafter batch: %lld tokens but the workspace is planned for %lld (data.token_budget); HINT: plan "
           "with the "
           "batcher's token budget",
           (long long)T, (long long)lim.max_tokens);
  DF_CHECK(nb <= lim.max_blocks,
           "drafter batch: %lld blocks but the workspace is planned for %lld (drafter.max_block_rows / "
           "block_size); "
           "HINT: cap the anchors first (anchors_cap)",
           (long long)nb, (long long)lim.max_blocks);
  DF_CHECK(!(o.kind == LmLossKind::kl) || lim.kl,
           "drafter step: soft-KL loss but the workspace was planned without it");
  DF_CHECK(!(o.noise_std > 0) || lim.noise,
           "drafter step: feature noise on but the workspace was planned without it (DrafterLimits::noise)");
}

// The tensors of the step drafter_accumulate last ran with these arguments: the same arena sequence at the
// same sizes carves the same workspace tensors.
StepBuffers step_buffers_after(const DrafterModel& m, const DrafterBatch& batch,
                               const std::vector<DrafterAnchor>& anchors, const DrafterLossOptions& opts) {
  Arena arena(m.workspace, m.workspace_bytes, m.ops().device());
  return step_alloc(arena, m.config(), dims_of(m.config(), batch.offsets.back(), int64_t(anchors.size())),
                    opts.kind == LmLossKind::kl, opts.noise_std > 0, m.ops().act_dtype());
}

// What a head's proposals start from: the final-norm output y [B, H] of the one real block that
// drafter_accumulate last ran with these arguments, and that block's anchor token. `who` names the caller in
// the error.
struct ProposalBlock {
  Tensor y;
  int32_t first;
};
ProposalBlock proposal_block(const DrafterModel& m, const DrafterBatch& batch,
                             const std::vector<DrafterAnchor>& anchors, const DrafterLossOptions& opts,
                             const char* who) {
  DF_CHECK(anchors.size() == 1 && anchors[0].pos >= 0, "%s: proposes for one real block, got %zu blocks", who,
           anchors.size());
  const int64_t s0 = batch.offsets[size_t(anchors[0].seq)];
  return {step_buffers_after(m, batch, anchors, opts).y, batch.tokens[size_t(s0 + anchors[0].pos)]};
}

}  // namespace

size_t drafter_workspace_bytes(const DrafterConfig& c, const DrafterLimits& limits, DType act) {
  Arena plan(nullptr, 0, Device::cpu);
  step_alloc(plan, c, dims_of(c, limits.max_tokens, limits.max_blocks), limits.kl, limits.noise, act);
  return plan.high_water();
}

void drafter_plan_workspace(DrafterModel& m, const DrafterLimits& limits) {
  DF_CHECK(m.workspace == nullptr, "drafter_plan_workspace: the workspace is planned once per model");
  DF_CHECK(limits.max_tokens > 0 && limits.max_blocks > 0,
           "drafter_plan_workspace: max_tokens %lld and max_blocks %lld must be > 0",
           (long long)limits.max_tokens, (long long)limits.max_blocks);
  m.workspace_bytes = drafter_workspace_bytes(m.config(), limits, m.ops().act_dtype());
  m.workspace = m.ops().alloc_bytes(m.workspace_bytes);
  m.limits = limits;
}

void drafter_accumulate(DrafterModel& m, const DrafterBatch& batch, const std::vector<DrafterAnchor>& anchors,
                        const DrafterLossOptions& opts) {
  const DrafterConfig& c = m.config();
  TrainOps& ops = m.ops();
  DF_CHECK(!m.embed.empty() && !m.lm_head.empty(), "drafter step: call set_frozen(embed, lm_head) first");
  check_batch(m, batch, opts, int64_t(anchors.size()));
  const bool kl = opts.kind == LmLossKind::kl, noise = opts.noise_std > 0;
  const DrafterDims d = dims_of(c, batch.offsets.back(), int64_t(anchors.size()));
  if (d.nb == 0) return;
  const bool domino = c.kind == DrafterKind::domino, dflash2 = c.kind == DrafterKind::dflash2,
             dspark = c.kind == DrafterKind::dspark;
  // Domino's head, DFlash2's selector and DSpark's head weight their rows on the host and give dy weighted.
  const bool head = domino || dflash2 || dspark;
  BlockLayout L = layout_blocks(c, batch, anchors);
  if (domino) layout_domino_rows(c, batch, anchors, opts.gamma, L);
  if (dflash2)
    layout_prev_rows(
        c, batch, anchors,
        [&](const int32_t* tokens, const uint8_t* mask, int64_t len, int64_t anchor) {
          return dflash2_block_rows(c.block_size, tokens, mask, len, anchor, double(opts.gamma));
        },
        L);
  if (dspark) {
    const DSparkHeadDims hd = dspark_head_dims(c);
    layout_prev_rows(
        c, batch, anchors,
        [&](const int32_t* tokens, const uint8_t* mask, int64_t len, int64_t anchor) {
          return dspark_block_rows(hd, tokens, mask, len, anchor, double(opts.gamma));
        },
        L);
  }
  // Carved at the batch's own sizes: every tensor is at most its planned size, so the planned bytes hold it.
  Arena arena(m.workspace, m.workspace_bytes, ops.device());
  StepBuffers s = step_alloc(arena, c, d, kl, noise, ops.act_dtype());
  ops.upload_raw(s.in.pos_all, L.pos_all.data());
  ops.upload_raw(s.in.blocks, L.blocks.data());
  ops.upload_raw(s.ids, L.ids.data());
  ops.upload_raw(s.labels, L.labels.data());
  ops.upload_raw(s.active, L.labelled.data());
  ops.upload_raw(s.tgt_rows, L.tgt_rows.data());
  if (domino) ops.upload_raw(s.gru_ids, L.gru_ids.data());
  if (dflash2 || dspark) ops.upload_raw(s.prev, L.prev.data());

  // ---- forward ----
  const Tensor& taps = noise ? s.taps : batch.taps;
  if (noise) {
    ops.copy(batch.taps, s.taps);
    ops.add_gaussian_noise(s.taps, opts.noise_std, opts.noise_seed);
  }
  ops.gemm(taps, false, m.w.fc, true, s.f, 1, 0);
  ops.rmsnorm_fwd(s.f, m.w.hidden_norm, s.in.ctx, s.rstd_ctx, c.rms_eps);
  ops.embedding(s.ids, m.embed, s.x0);
  for (int l = 0; l < c.layers; ++l)
    drafter_layer_forward(ops, c, l, m.w.layers[size_t(l)], s.in, l == 0 ? s.x0 : s.layers[size_t(l) - 1].x_out,
                          s.layers[size_t(l)]);
  const Tensor& x_last = s.layers.back().x_out;
  ops.rmsnorm_fwd(x_last, m.w.norm, s.y, s.rstd_final, c.rms_eps);
  // The step's first backward writes the gradients (beta 0; drafter_begin_step), later ones add.
  const float beta_g = m.grads_stale ? 0.0f : 1.0f;
  DF_CHECK(!opts.fixed_row_weights || int64_t(opts.fixed_row_weights->size()) == d.N,
           "drafter step: %zu fixed row weights for %lld rows",
           opts.fixed_row_weights ? opts.fixed_row_weights->size() : size_t(0), (long long)d.N);
  if (head) {
    // The three train their own loss, as the peer's do: no KL, D-PACE or streak weighting.
    DF_CHECK(!kl && opts.dpace == DpaceKind::off && !opts.streak,
             "drafter step: drafter.kind = \"%s\" trains its own loss (train.loss = \"ce\", no streak)",
             drafter_kind_name(c.kind));
    if (opts.fixed_row_weights) L.row_w = *opts.fixed_row_weights;
    ops.upload_raw(s.row_w, L.row_w.data());
  }
  if (dflash2) {
    TrainOps::Dflash2SelectorArgs sa;
    sa.dims = dflash2_selector_dims(c);
    sa.alpha = opts.dflash2_selector_alpha;
    sa.stop_gradient = opts.dflash2_stop_gradient;
    sa.backward = opts.backward;
    sa.beta_dw = beta_g;
    ops.dflash2_selector_loss(s.y, m.lm_head, m.w.selector, s.labels, s.prev, s.row_w, sa, s.argmax, s.dy,
                              m.g.selector, m.stats);
  } else if (domino) {
    ops.embedding(s.gru_ids, m.embed, s.gru_in);
    TrainOps::DominoHeadArgs da;
    da.dims = domino_head_dims(c);
    da.lambda = opts.domino_lambda;
    da.backward = opts.backward;
    da.beta_dw = beta_g;
    ops.domino_head_loss(s.y, m.lm_head, s.gru_in, m.w.domino, s.labels, s.row_w, da, s.argmax, s.dy,
                         m.g.domino, m.stats);
  } else if (dspark) {
    TrainOps::DSparkHeadArgs da;
    da.dims = dspark_head_dims(c);
    da.alpha = opts.dspark;
    da.backward = opts.backward;
    da.beta_dw = beta_g;
    // The head reads the target rows itself, each distinct one once (its blocks share most of them).
    const bool target = dspark_needs_target_hidden(da.dims, da.alpha);
    if (target) da.target_rows = L.tgt_rows;
    ops.dspark_head_loss(s.y, m.lm_head, target ? batch.target_hidden : Tensor{}, m.w.dspark, s.labels,
                         s.prev, s.row_w, da, s.argmax, s.dy, m.g.dspark, m.stats);
  } else {
    if (kl) ops.embedding(s.tgt_rows, batch.target_hidden, s.tgt);
    const int64_t labelled = std::count(L.labelled.begin(), L.labelled.end(), uint8_t(1));
    ops.lm_head_loss(s.y, m.lm_head, s.labels, s.active, s.tgt, opts.kind, s.loss, s.p_label, s.argmax, s.dy,
                     labelled);

    // ---- row weights and statistics (backend) ----
    TrainOps::LossRowArgs ra;
    ra.block = c.block_size;
    ra.gamma = opts.gamma;
    ra.streak = opts.streak;
    ra.streak_alpha = opts.streak_alpha;
    ra.dpace = opts.dpace;
    ra.dpace_alpha = opts.dpace_alpha;
    ra.sequences = batch.num_seqs();
    ra.weights_given = opts.fixed_row_weights != nullptr;
    if (ra.weights_given) ops.upload_raw(s.row_w, opts.fixed_row_weights->data());
    ops.loss_row_stats(s.labels, s.active, s.loss, s.p_label, s.argmax, ra, s.row_w, m.stats);
  }
  if (!opts.backward) return;

  // ---- backward: ∂(Σ w·L) ----
  // Every parameter has exactly one call with beta_g (k_proj, v_proj: the context rows' product; the block
  // rows' then adds; Domino's, DFlash2's and DSpark's heads: their head ops), and every call runs whatever the
  // batch (an empty range writes zeros), so all of m.grads but the padding is written. ∂/∂ctx likewise: the
  // first layer visited writes it, the others add.
  if (!head) ops.scale_rows(s.dy, s.row_w);
  ops.rmsnorm_bwd(x_last, m.w.norm, s.rstd_final, s.dy, s.dx, m.g.norm, 0, beta_g);
  for (int l = c.layers - 1; l >= 0; --l) {
    const float beta_dctx = l < c.layers - 1 ? 1.0f : 0.0f;
    drafter_layer_backward(ops, c, l, m.w.layers[size_t(l)], m.g.layers[size_t(l)], beta_g, s.in,
                           l == 0 ? s.x0 : s.layers[size_t(l) - 1].x_out, s.layers[size_t(l)], s.dx, s.grads,
                           beta_dctx);
  }
  ops.rmsnorm_bwd(s.f, m.w.hidden_norm, s.rstd_ctx, s.grads.dctx, s.dfc, m.g.hidden_norm, 0, beta_g);
  ops.gemm(s.dfc, true, taps, false, m.g.fc, 1, beta_g);
  m.grads_stale = false;
}

LossStats drafter_take_stats(DrafterModel& m) {
  const int B = m.config().block_size;
  std::vector<double> slots(size_t(LossStatsSlots::size(B)), 0.0);
  m.ops().download_raw(m.stats, slots.data());
  LossStats st = loss_stats_from_slots(slots, B);
  const std::vector<double> zero(slots.size(), 0.0);
  m.ops().upload_raw(m.stats, zero.data());
  return st;
}

LossStats drafter_forward_backward(DrafterModel& m, const DrafterBatch& batch,
                                   const std::vector<DrafterAnchor>& anchors,
                                   const DrafterLossOptions& opts) {
  drafter_accumulate(m, batch, anchors, opts);
  LossStats st = drafter_take_stats(m);
  const int64_t N = int64_t(anchors.size()) * m.config().block_size;
  st.row_weight.assign(size_t(N), 0.0f);
  st.row_argmax.assign(size_t(N), -1);
  if (N > 0) {
    // row_w and argmax (what the drafter drafts, pipeline/spec_decode.cpp) are workspace tensors of the step.
    const StepBuffers s = step_buffers_after(m, batch, anchors, opts);
    m.ops().download_raw(s.row_w, st.row_weight.data());
    m.ops().download_raw(s.argmax, st.row_argmax.data());
  }
  return st;
}

std::vector<int32_t> drafter_domino_drafts(const DrafterModel& m, const DrafterBatch& batch,
                                           const std::vector<DrafterAnchor>& anchors,
                                           const DrafterLossOptions& opts) {
  const ProposalBlock p = proposal_block(m, batch, anchors, opts, "drafter_domino_drafts");
  return m.ops().domino_head_propose(p.y, m.lm_head, m.embed, m.w.domino, domino_head_dims(m.config()), p.first);
}

std::vector<int32_t> drafter_dflash2_drafts(const DrafterModel& m, const DrafterBatch& batch,
                                            const std::vector<DrafterAnchor>& anchors,
                                            const DrafterLossOptions& opts) {
  const ProposalBlock p = proposal_block(m, batch, anchors, opts, "drafter_dflash2_drafts");
  return m.ops().dflash2_selector_propose(p.y, m.lm_head, m.w.selector, dflash2_selector_dims(m.config()),
                                          p.first);
}

std::vector<int32_t> drafter_dspark_drafts(const DrafterModel& m, const DrafterBatch& batch,
                                           const std::vector<DrafterAnchor>& anchors,
                                           const DrafterLossOptions& opts, std::vector<double>* confidence) {
  const ProposalBlock p = proposal_block(m, batch, anchors, opts, "drafter_dspark_drafts");
  return m.ops().dspark_head_propose(p.y, m.lm_head, m.w.dspark, dspark_head_dims(m.config()), p.first,
                                     confidence);
}

std::vector<float> drafter_final_hidden(const DrafterModel& m, const DrafterBatch& batch,
                                        const std::vector<DrafterAnchor>& anchors, const DrafterLossOptions& opts) {
  const int64_t n = int64_t(anchors.size()) * m.config().block_size * m.config().hidden;
  std::vector<float> y(size_t(n), 0.0f);
  if (n == 0) return y;
  const Tensor& dev = step_buffers_after(m, batch, anchors, opts).y;
  if (dev.dtype == DType::f32) {
    m.ops().download_raw(dev, y.data());
    return y;
  }
  DF_CHECK(dev.dtype == DType::bf16, "drafter_final_hidden: activations are %s", dtype_name(dev.dtype));
  std::vector<uint16_t> lp(static_cast<size_t>(n));
  m.ops().download_raw(dev, lp.data());
  for (size_t i = 0; i < lp.size(); ++i) y[i] = bf16_to_f32(lp[i]);
  return y;
}

}  // namespace df
