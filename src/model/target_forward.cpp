// The target backbone forward as a flat list of op calls. Pre-norm residual stream h kept in act dtype;
// each sub-layer's output projection accumulates straight into h (gemm with beta = 1), so no sub-layer
// output buffer exists and the next norm is a plain rmsnorm of h. The workspace is planned once for
// max_tokens against a counting arena and allocated in one block.
#include <algorithm>
#include <cmath>

#include "core/fp8.h"
#include "model/target.h"
#include "model/target_moe.h"

namespace df {

struct TargetForward::Workspace {
  Tensor h;     // residual stream [T, H]
  Tensor n;     // normed input of the current sub-layer [T, H]
  Tensor proj;  // fused projection output [T, max(qkv, in, 2I)]
  Tensor mix;   // attention / DeltaNet output [T, max(heads·hd, nv·dv)]
  Tensor mix2;  // gated-norm output and conv output share this [T, max(conv channels, nv·dv)]
  Tensor act;   // SwiGLU output [T, I]
  Tensor gdn;   // DeltaNet prefill scratch u8 [1, Ops::gdn_workspace_bytes(T)]; empty on the CPU backend
  Fp8Inputs fp8;  // the FP8 GEMMs' input codes and scales; empty unless the model holds FP8 codes
  MoeScratch moe;  // routing buffers of the MoE layers; empty for a dense model
};

TargetForward::TargetForward(const TargetModel& model, int64_t max_tokens)
    : m_(model), ops_(*model.ops), max_tokens_(max_tokens), ws_(std::make_unique<Workspace>()) {
  DF_CHECK(max_tokens > 0, "max_tokens must be positive (got %lld)", (long long)max_tokens);
  Arena arena;
  ws_block_ = ops_alloc_planned(ops_, [this](Arena& a) { plan(a); }, 0, arena);
  ws_bytes_ = arena.capacity();
}

TargetForward::~TargetForward() {
  if (ws_block_) ops_.free_bytes(ws_block_);
}

void TargetForward::plan(Arena& a) {
  const QwenConfig& c = m_.cfg;
  const int64_t T = max_tokens_;
  DType act = ops_.act_dtype();
  int64_t proj_cols = 2 * int64_t(c.intermediate), mix_cols = 0, mix2_cols = 0, gdn_bytes = 0;
  for (const TargetLayer& L : m_.layers) {
    if (L.kind == LayerKind::full_attention) {
      proj_cols = std::max(proj_cols, L.w_qkv.rows);
      mix_cols = std::max(mix_cols, int64_t(c.heads) * c.head_dim);
    } else {
      proj_cols = std::max(proj_cols, L.w_in.rows);
      mix_cols = std::max(mix_cols, int64_t(c.lin_nv) * c.lin_dv);
      mix2_cols = std::max({mix2_cols, L.conv_w.rows, int64_t(c.lin_nv) * c.lin_dv});
      gdn_bytes = std::max(gdn_bytes, ops_.gdn_workspace_bytes(T, gdn_shape()));
    }
  }
  // FP8 GEMMs want 16-byte multiples for every leading dimension: the fused projection's row stride a multiple
  // of 16 bf16 (32 bytes, as PyTorch's _scaled_mm asks of its output too).
  if (m_.fp8_codes) proj_cols = (proj_cols + 15) / 16 * 16;
  ws_->h = a.alloc(act, T, c.hidden);
  ws_->n = a.alloc(act, T, c.hidden);
  ws_->proj = a.alloc(act, T, proj_cols);
  ws_->mix = a.alloc(act, T, std::max<int64_t>(mix_cols, 1));
  ws_->mix2 = a.alloc(act, T, std::max<int64_t>(mix2_cols, 1));
  ws_->act = a.alloc(act, T, c.intermediate);
  if (gdn_bytes > 0) ws_->gdn = a.alloc(DType::u8, 1, gdn_bytes);
  fp8_inputs_plan(m_, T, a, ws_->fp8);
  moe_scratch_plan(m_, T, a, ws_->moe);
}

void fp8_inputs_plan(const TargetModel& m, int64_t T, Arena& a, Fp8Inputs& in) {
  if (!m.fp8_codes) return;
  int64_t k = m.cfg.hidden;  // every projection but the three output ones reads the hidden state
  for (const TargetLayer& L : m.layers)
    for (const Tensor* w : {&L.w_o, &L.w_out, &L.w_down})
      if (!w->empty()) k = std::max(k, w->cols);
  in.codes = a.alloc(DType::f8_e4m3, T, k);
  // One scale per token, or per token per 128 columns (core/fp8.h fp8_group_scale_index).
  const int64_t groups = m.fp8_group > 0 ? (k + m.fp8_group - 1) / m.fp8_group : 0;
  in.scales = a.alloc(DType::f32, 1, groups > 0 ? fp8_group_scales_size(T, groups) : T);
}

GdnShape TargetForward::gdn_shape() const {
  const QwenConfig& c = m_.cfg;
  return GdnShape{c.lin_nk, c.lin_nv, c.lin_dk, c.lin_dv};
}

int TargetForward::last_needed_layer(const TargetOutputs& out) const {
  int last = -1;
  for (int l : out.tap_layers) last = std::max(last, l);
  if (out.want_final_norm) last = m_.cfg.layers - 1;
  return last;
}

void TargetForward::layer_full(const TargetLayer& L, const SeqLayout& seqs, int64_t T, bool n_quantised) {
  const QwenConfig& c = m_.cfg;
  const int hd = c.head_dim;
  const int64_t q_cols = int64_t(c.heads) * hd, kv_cols = int64_t(c.kv_heads) * hd;
  Tensor proj = ws_->proj.rows_view(0, T).cols_view(0, L.w_qkv.rows);
  target_linear(m_, ws_->fp8, ws_->n.rows_view(0, T), L.w_qkv, L.s_qkv, proj, 0.0f, nullptr, n_quantised);
  int64_t k0 = q_cols * (c.attn_output_gate ? 2 : 1);
  Tensor q = proj.cols_view(0, q_cols);
  Tensor k = proj.cols_view(k0, kv_cols);
  Tensor v = proj.cols_view(k0 + kv_cols, kv_cols);
  ops_.qk_norm_rope(q, L.q_norm, seqs.pos, c.heads, hd, c.rot_dim, c.rope_theta, c.rms_eps, c.norm_kind());
  ops_.qk_norm_rope(k, L.k_norm, seqs.pos, c.kv_heads, hd, c.rot_dim, c.rope_theta, c.rms_eps, c.norm_kind());
  Tensor o = ws_->mix.rows_view(0, T).cols_view(0, q_cols);
  Tensor gate;  // the gate half of [q | gate], applied in the attention epilogue
  if (c.attn_output_gate) gate = proj.cols_view(q_cols, q_cols);
  ops_.attention_causal(q, k, v, o, seqs, c.heads, c.kv_heads, hd, 1.0f / std::sqrt(float(hd)),
                        c.attn_output_gate ? &gate : nullptr);
  target_linear(m_, ws_->fp8, o, L.w_o, L.s_o, ws_->h.rows_view(0, T), 1.0f);
}

void TargetForward::layer_linear(const TargetLayer& L, const SeqLayout& seqs, int64_t T, bool n_quantised) {
  const QwenConfig& c = m_.cfg;
  const int64_t conv_ch = L.conv_w.rows, vdim = int64_t(c.lin_nv) * c.lin_dv, nv = c.lin_nv;
  Tensor proj = ws_->proj.rows_view(0, T).cols_view(0, L.w_in.rows);
  target_linear(m_, ws_->fp8, ws_->n.rows_view(0, T), L.w_in, L.s_in, proj, 0.0f, &L.w_in_ba, n_quantised);
  // conv1d_silu → gdn_prefill → gated_rmsnorm as one op: mix2 holds the conv output and then, once it is dead,
  // the normed output; mix holds the prefill's output (scratch where the CUDA backend fuses the three).
  Tensor conv = ws_->mix2.rows_view(0, T).cols_view(0, conv_ch);
  Tensor normed = conv.cols_view(0, vdim);
  ops_.gdn_mixer(proj.cols_view(0, conv_ch), proj.cols_view(conv_ch, vdim), proj.cols_view(conv_ch + vdim + nv, nv),
                 proj.cols_view(conv_ch + vdim, nv), GdnWeights{L.conv_w, L.A_log, L.dt_bias, L.gdn_norm, c.rms_eps},
                 normed, seqs, gdn_shape(), ws_->gdn, conv, ws_->mix.rows_view(0, T).cols_view(0, vdim));
  target_linear(m_, ws_->fp8, normed, L.w_out, L.s_out, ws_->h.rows_view(0, T), 1.0f);
}

// The planned FP8 input buffers cut to an input x's shape.
static Tensor fp8_codes_for(const Fp8Inputs& q, const Tensor& x) {
  DF_CHECK(!q.codes.empty() && x.rows <= q.codes.rows && x.cols <= q.codes.cols,
           "target_linear: FP8 input %s does not fit the planned codes %s", x.shape_str().c_str(),
           q.codes.shape_str().c_str());
  return q.codes.rows_view(0, x.rows).cols_view(0, x.cols);
}

void target_linear(const TargetModel& m, const Fp8Inputs& q, const Tensor& x, const Tensor& w,
                   const Tensor& w_scale, const Tensor& out, float beta, const Tensor* ba, bool x_quantised) {
  if (!m.fp8_codes) {
    if (m.fp8) m.ops->fp8_round_rows(x, m.fp8_group);
    m.ops->gemm(x, w, out, beta);
    return;
  }
  const Tensor codes = fp8_codes_for(q, x);
  // The b / a rows multiply the same quantised input in bf16 (written back into x, rounded to bf16 once).
  const bool tail = ba != nullptr && !ba->empty();
  const int64_t n8 = w.rows - (tail ? ba->rows : 0);
  if (m.fp8_group > 0) {  // the checkpoint's 128x128 blocks: w_scale has a row per 128 FP8 rows
    DF_CHECK(!x_quantised, "target_linear: the fused norm leaves per-token codes, a block checkpoint needs per-128");
    const int64_t groups = (x.cols + m.fp8_group - 1) / m.fp8_group;
    const Tensor scales = q.scales.cols_view(0, fp8_group_scales_size(x.rows, groups));
    m.ops->fp8_quantize_groups(x, codes, scales, tail);
    m.ops->gemm_fp8_block(codes, scales, w.rows_view(0, n8), w_scale.rows_view(0, n8 / 128), out.cols_view(0, n8),
                          beta);
  } else {
    const Tensor scales = q.scales.cols_view(0, x.rows);
    if (!x_quantised) m.ops->fp8_quantize_rows(x, codes, scales, tail);
    m.ops->gemm_fp8(codes, scales, w.rows_view(0, n8), w_scale.cols_view(0, n8), out.cols_view(0, n8), beta);
  }
  if (tail) m.ops->gemm(x, *ba, out.cols_view(n8, ba->rows), beta);
}

void target_mlp(const TargetModel& m, const Fp8Inputs& q, const TargetLayer& L, const Tensor& n,
                const Tensor& proj, const Tensor& act, const Tensor& h, int64_t T, bool n_quantised) {
  const int64_t I = m.cfg.intermediate;
  Tensor gate_up = proj.rows_view(0, T).cols_view(0, 2 * I);
  target_linear(m, q, n.rows_view(0, T), L.w_gate_up, L.s_gate_up, gate_up, 0.0f, nullptr, n_quantised);
  Tensor a = act.rows_view(0, T);
  if (m.fp8_codes && m.fp8_group == 0) {  // swiglu straight into down's per-token e4m3 codes: act never stored
    const Tensor codes = fp8_codes_for(q, a), scales = q.scales.cols_view(0, T);
    m.ops->swiglu_fp8(gate_up.cols_view(0, I), gate_up.cols_view(I, I), codes, scales);
    m.ops->gemm_fp8(codes, scales, L.w_down, L.s_down, h.rows_view(0, T), 1.0f);
    return;
  }
  m.ops->swiglu(gate_up.cols_view(0, I), gate_up.cols_view(I, I), a);
  target_linear(m, q, a, L.w_down, L.s_down, h.rows_view(0, T), 1.0f);
}

bool TargetForward::norm_for_linear(const Tensor& w, bool tail, int64_t T) {
  const QwenConfig& c = m_.cfg;
  const Tensor h = ws_->h.rows_view(0, T), n = ws_->n.rows_view(0, T);
  if (!m_.fp8_codes || m_.fp8_group > 0) {  // the fused norm quantises per token, not per 128 columns
    ops_.rmsnorm(h, w, n, c.rms_eps, c.norm_kind());
    return false;
  }
  ops_.rmsnorm_fp8(h, w, n, c.rms_eps, c.norm_kind(), fp8_codes_for(ws_->fp8, n),
                   ws_->fp8.scales.cols_view(0, T), tail);
  return true;
}

void TargetForward::run(const Tensor& ids, const SeqLayout& seqs, TargetOutputs& out) {
  const QwenConfig& c = m_.cfg;
  const int64_t T = seqs.tokens;
  DF_CHECK(T <= max_tokens_, "batch of %lld tokens exceeds the planned %lld", (long long)T, (long long)max_tokens_);
  DF_CHECK(ids.cols == T, "ids hold %lld tokens but the layout %lld", (long long)ids.cols, (long long)T);
  DF_CHECK(out.taps.size() == out.tap_layers.size(), "one output tensor per tap layer");
  const int last = last_needed_layer(out);
  DF_CHECK(last < m_.num_loaded_layers, "outputs need layer %d but only %d layers are loaded", last,
           m_.num_loaded_layers);
  const NormKind nk = c.norm_kind();
  Tensor h = ws_->h.rows_view(0, T), n = ws_->n.rows_view(0, T);

  ops_.embedding(ids, m_.embed, h);
  if (out.want_embeddings) ops_.copy(h, out.embeddings);
  if (last < 0) return;
  auto has_tail = [](const TargetLayer& L) { return !L.w_in_ba.empty(); };
  bool n_quantised = norm_for_linear(m_.layers[0].ln1, has_tail(m_.layers[0]), T);
  for (int l = 0; l <= last; ++l) {
    const TargetLayer& L = m_.layers[l];
    if (L.kind == LayerKind::full_attention)
      layer_full(L, seqs, T, n_quantised);
    else
      layer_linear(L, seqs, T, n_quantised);
    n_quantised = norm_for_linear(L.ln2, false, T);
    if (c.layer_is_moe(l))
      target_moe(m_, ws_->moe, L, ws_->n, ws_->h, T);
    else
      target_mlp(m_, ws_->fp8, L, ws_->n, ws_->proj, ws_->act, ws_->h, T, n_quantised);
    // h now holds the output of layer l. Norm it for the next layer's input, or with the final norm after
    // the last loaded layer (then n is the final norm's output).
    if (l + 1 < m_.num_loaded_layers)
      n_quantised = norm_for_linear(m_.layers[l + 1].ln1, has_tail(m_.layers[l + 1]), T);
    else
      ops_.rmsnorm(h, m_.final_norm, n, c.rms_eps, nk);
    for (size_t i = 0; i < out.tap_layers.size(); ++i)
      if (out.tap_layers[i] == l) ops_.copy(h, out.taps[i]);
  }
  if (out.want_final_norm) {
    if (last + 1 < m_.num_loaded_layers)  // n holds the next layer's input norm, not the final norm
      ops_.rmsnorm(h, m_.final_norm, out.final_norm, c.rms_eps, nk);
    else
      ops_.copy(n, out.final_norm);
  }
}

SeqLayout seq_layout_make(const std::vector<int32_t>& lengths, Ops& ops, Arena& arena) {
  SeqLayout s;
  s.num_seqs = static_cast<int>(lengths.size());
  s.cu_host.assign(1, 0);
  std::vector<int32_t> pos;
  for (int32_t len : lengths) {
    DF_CHECK(len > 0, "sequence lengths must be positive (got %d)", len);
    s.cu_host.push_back(s.cu_host.back() + len);
    s.max_len = std::max(s.max_len, static_cast<int>(len));
    for (int32_t p = 0; p < len; ++p) pos.push_back(p);
  }
  s.tokens = s.cu_host.back();
  s.cu = arena.alloc(DType::i32, 1, s.num_seqs + 1);
  s.pos = arena.alloc(DType::i32, 1, std::max<int64_t>(s.tokens, 1));
  s.pos.cols = s.tokens;
  s.pos.stride = s.tokens;
  ops.upload_raw(s.cu, s.cu_host.data());
  if (s.tokens > 0) ops.upload_raw(s.pos, pos.data());
  return s;
}

}  // namespace df
