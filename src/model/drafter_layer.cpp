// A drafter layer: Qwen3 block with DFlash attention (queries from the block rows only, keys/values from
// [ctx ; block]) and its hand-derived backward. Every line is one TrainOps call so the CUDA backend runs
// exactly this sequence.
#include "model/drafter_layer.h"

#include <cmath>

namespace df {

namespace {

DFlashAttnShape attn_shape(const DrafterConfig& c, int layer) {
  DFlashAttnShape s;
  s.hq = c.heads;
  s.hkv = c.kv_heads;
  s.hd = c.head_dim;
  s.block = c.block_size;
  s.window = c.layer_types[size_t(layer)] == DrafterLayerType::sliding ? c.sliding_window : 0;
  s.scale = float(1.0 / std::sqrt(double(c.head_dim)));
  return s;
}

}  // namespace

void drafter_layer_acts_alloc(Arena& a, const DrafterConfig& c, const DrafterDims& d, DType act,
                              DrafterLayerActs& x) {
  const int64_t H = c.hidden, qd = int64_t(c.heads) * c.head_dim, kvd = int64_t(c.kv_heads) * c.head_dim;
  const int64_t N = d.N, TN = d.T + d.N;
  x.x_out = a.alloc(act, N, H);
  x.n = a.alloc(act, N, H);
  x.rstd1 = a.alloc(DType::f32, 1, N);
  x.q_raw = a.alloc(act, N, qd);
  x.q = a.alloc(act, N, qd);
  x.rstd_q = a.alloc(DType::f32, N, c.heads);
  x.k_raw = a.alloc(act, TN, kvd);
  x.k = a.alloc(act, TN, kvd);
  x.rstd_k = a.alloc(DType::f32, TN, c.kv_heads);
  x.v = a.alloc(act, TN, kvd);
  x.att = a.alloc(act, N, qd);
  x.lse = a.alloc(DType::f32, N, c.heads);
  x.h = a.alloc(act, N, H);
  x.n2 = a.alloc(act, N, H);
  x.rstd2 = a.alloc(DType::f32, 1, N);
  x.gate = a.alloc(act, N, c.intermediate);
  x.up = a.alloc(act, N, c.intermediate);
  x.act = a.alloc(act, N, c.intermediate);
  if (c.kind == DrafterKind::dflash2) {
    const int64_t C = dflash2_conv_dims(c).coeffs();
    x.coeff_attn = a.alloc(act, N, C);
    x.n_conv = a.alloc(act, N, H);
    x.o = a.alloc(act, N, H);
    x.coeff_mlp = a.alloc(act, N, C);
    x.n2_conv = a.alloc(act, N, H);
    x.mlp_out = a.alloc(act, N, H);
  }
}

void drafter_layer_grads_alloc(Arena& a, const DrafterConfig& c, const DrafterDims& d, DType act,
                               DrafterLayerGrads& g) {
  const int64_t H = c.hidden, qd = int64_t(c.heads) * c.head_dim, kvd = int64_t(c.kv_heads) * c.head_dim;
  const int64_t N = d.N, TN = d.T + d.N;
  g.dn = a.alloc(act, N, H);
  g.dn2 = a.alloc(act, N, H);
  g.datt = a.alloc(act, N, qd);
  g.dq = a.alloc(act, N, qd);
  g.dq_raw = a.alloc(act, N, qd);
  g.dk = a.alloc(act, TN, kvd);
  g.dk_raw = a.alloc(act, TN, kvd);
  g.dv = a.alloc(act, TN, kvd);
  g.dgate = a.alloc(act, N, c.intermediate);
  g.dup = a.alloc(act, N, c.intermediate);
  g.dact = a.alloc(act, N, c.intermediate);
  g.dctx = a.alloc(act, d.T, H);
  if (c.kind == DrafterKind::dflash2) {
    g.dsub = a.alloc(act, N, H);
    g.dconv = a.alloc(act, N, H);
    g.dcoeff = a.alloc(act, N, dflash2_conv_dims(c).coeffs());
  }
}

void drafter_layer_forward(TrainOps& ops, const DrafterConfig& c, int layer, const DrafterLayerTensors& w,
                           const DrafterLayerInputs& in, const Tensor& x_in, DrafterLayerActs& a) {
  const int64_t T = in.ctx.rows, N = x_in.rows;
  const Tensor pos_blk = in.pos_all.cols_view(T, N);
  // DFlash2 wraps each sublayer: its input n goes through the input-side convolution (coefficients from n)
  // and its output through the output-side one before the residual add.
  const bool conv = c.kind == DrafterKind::dflash2;
  const Dflash2ConvDims cd = conv ? dflash2_conv_dims(c) : Dflash2ConvDims{};
  ops.rmsnorm_fwd(x_in, w.input_layernorm, a.n, a.rstd1, c.rms_eps);
  if (conv) {
    ops.gemm(a.n, false, w.attention_conv.kernel_projection, true, a.coeff_attn, 1, 0);
    ops.dflash2_conv_fwd(a.n, w.attention_conv.base_kernel, a.coeff_attn, 0, Tensor{}, a.n_conv, cd);
  }
  const Tensor& n = conv ? a.n_conv : a.n;
  ops.gemm(n, false, w.q_proj, true, a.q_raw, 1, 0);
  ops.qk_norm_rope_fwd(a.q_raw, w.q_norm, pos_blk, a.q, a.rstd_q, c.heads, c.head_dim, c.rope_theta, c.rms_eps);
  ops.gemm(in.ctx, false, w.k_proj, true, a.k_raw.rows_view(0, T), 1, 0);
  ops.gemm(n, false, w.k_proj, true, a.k_raw.rows_view(T, N), 1, 0);
  ops.qk_norm_rope_fwd(a.k_raw, w.k_norm, in.pos_all, a.k, a.rstd_k, c.kv_heads, c.head_dim, c.rope_theta, c.rms_eps);
  ops.gemm(in.ctx, false, w.v_proj, true, a.v.rows_view(0, T), 1, 0);
  ops.gemm(n, false, w.v_proj, true, a.v.rows_view(T, N), 1, 0);
  ops.dflash_attention_fwd(a.q, a.k, a.v, in.blocks, a.att, a.lse, attn_shape(c, layer));
  if (conv) {
    ops.gemm(a.att, false, w.o_proj, true, a.o, 1, 0);
    ops.dflash2_conv_fwd(a.o, w.attention_conv.base_kernel, a.coeff_attn, 1, x_in, a.h, cd);
  } else {
    ops.gemm_add(a.att, false, w.o_proj, true, x_in, a.h, 1, 1);
  }
  ops.rmsnorm_fwd(a.h, w.post_attention_layernorm, a.n2, a.rstd2, c.rms_eps);
  if (conv) {
    ops.gemm(a.n2, false, w.mlp_conv.kernel_projection, true, a.coeff_mlp, 1, 0);
    ops.dflash2_conv_fwd(a.n2, w.mlp_conv.base_kernel, a.coeff_mlp, 0, Tensor{}, a.n2_conv, cd);
  }
  const Tensor& n2 = conv ? a.n2_conv : a.n2;
  ops.gemm(n2, false, w.gate_proj, true, a.gate, 1, 0);
  ops.gemm(n2, false, w.up_proj, true, a.up, 1, 0);
  ops.swiglu_fwd(a.gate, a.up, a.act);
  if (conv) {
    ops.gemm(a.act, false, w.down_proj, true, a.mlp_out, 1, 0);
    ops.dflash2_conv_fwd(a.mlp_out, w.mlp_conv.base_kernel, a.coeff_mlp, 1, a.h, a.x_out, cd);
  } else {
    ops.gemm_add(a.act, false, w.down_proj, true, a.h, a.x_out, 1, 1);
  }
}

void drafter_layer_backward(TrainOps& ops, const DrafterConfig& c, int layer, const DrafterLayerTensors& w,
                            const DrafterLayerTensors& gw, float beta_gw, const DrafterLayerInputs& in,
                            const Tensor& x_in, const DrafterLayerActs& a, const Tensor& dx,
                            DrafterLayerGrads& s, float beta_dctx) {
  const int64_t T = in.ctx.rows, N = x_in.rows;
  const Tensor pos_blk = in.pos_all.cols_view(T, N);
  const bool conv = c.kind == DrafterKind::dflash2;
  const Dflash2ConvDims cd = conv ? dflash2_conv_dims(c) : Dflash2ConvDims{};
  // DFlash2: u = conv_in(norm output) feeds the sublayer; its output y reaches the residual as conv_out(y).
  // Back through conv_out gives ∂/∂y in s.dsub; the sublayer's ∂/∂u then goes back through conv_in and the
  // coefficient projection (both sides' coefficients come from the norm output) into s.dconv.
  const auto conv_out_bwd = [&](const Tensor& y, const TrainOps::Dflash2ConvWeights& cw, const Tensor& coeff,
                                const TrainOps::Dflash2ConvWeights& cg) {
    ops.dflash2_conv_bwd(y, cw.base_kernel, coeff, 1, dx, s.dsub, s.dcoeff, cg.base_kernel, beta_gw, cd);
  };
  const auto conv_in_bwd = [&](const Tensor& x, const TrainOps::Dflash2ConvWeights& cw, const Tensor& coeff,
                               const Tensor& du, const TrainOps::Dflash2ConvWeights& cg) {
    ops.dflash2_conv_bwd(x, cw.base_kernel, coeff, 0, du, s.dconv, s.dcoeff, cg.base_kernel, beta_gw, cd);
    ops.gemm(s.dcoeff, true, x, false, cg.kernel_projection, 1, beta_gw);
    ops.gemm(s.dcoeff, false, cw.kernel_projection, false, s.dconv, 1, 1);
  };
  // MLP: x_out = h + down(swiglu(gate n2, up n2)), n2 = post_ln(h) (DFlash2: n2 → conv_in, down → conv_out).
  if (conv) conv_out_bwd(a.mlp_out, w.mlp_conv, a.coeff_mlp, gw.mlp_conv);
  const Tensor& d_down = conv ? s.dsub : dx;
  const Tensor& n2 = conv ? a.n2_conv : a.n2;
  ops.gemm(d_down, true, a.act, false, gw.down_proj, 1, beta_gw);
  ops.gemm(d_down, false, w.down_proj, false, s.dact, 1, 0);
  ops.swiglu_bwd(a.gate, a.up, s.dact, s.dgate, s.dup);
  ops.gemm(s.dgate, true, n2, false, gw.gate_proj, 1, beta_gw);
  ops.gemm(s.dup, true, n2, false, gw.up_proj, 1, beta_gw);
  ops.gemm(s.dgate, false, w.gate_proj, false, s.dn2, 1, 0);
  ops.gemm(s.dup, false, w.up_proj, false, s.dn2, 1, 1);
  if (conv) conv_in_bwd(a.n2, w.mlp_conv, a.coeff_mlp, s.dn2, gw.mlp_conv);
  ops.rmsnorm_bwd(a.h, w.post_attention_layernorm, a.rstd2, conv ? s.dconv : s.dn2, dx,
                  gw.post_attention_layernorm, 1, beta_gw);
  // Attention: h = x_in + o_proj(att); dx now holds ∂/∂h.
  if (conv) conv_out_bwd(a.o, w.attention_conv, a.coeff_attn, gw.attention_conv);
  const Tensor& d_o = conv ? s.dsub : dx;
  const Tensor& n = conv ? a.n_conv : a.n;
  ops.gemm(d_o, true, a.att, false, gw.o_proj, 1, beta_gw);
  ops.gemm(d_o, false, w.o_proj, false, s.datt, 1, 0);
  ops.dflash_attention_bwd(a.q, a.k, a.v, in.blocks, a.att, a.lse, s.datt, s.dq, s.dk, s.dv, attn_shape(c, layer));
  ops.qk_norm_rope_bwd(a.q_raw, w.q_norm, pos_blk, a.rstd_q, s.dq, s.dq_raw, gw.q_norm, c.heads, c.head_dim,
                       c.rope_theta, beta_gw);
  ops.qk_norm_rope_bwd(a.k_raw, w.k_norm, in.pos_all, a.rstd_k, s.dk, s.dk_raw, gw.k_norm, c.kv_heads,
                       c.head_dim, c.rope_theta, beta_gw);
  const Tensor dk_ctx = s.dk_raw.rows_view(0, T), dk_blk = s.dk_raw.rows_view(T, N);
  const Tensor dv_ctx = s.dv.rows_view(0, T), dv_blk = s.dv.rows_view(T, N);
  ops.gemm(s.dq_raw, true, n, false, gw.q_proj, 1, beta_gw);
  // k_proj and v_proj see the context rows and the block rows: the first product takes beta_gw (with T = 0
  // an empty product: zeros for beta 0), the second adds.
  ops.gemm(dk_ctx, true, in.ctx, false, gw.k_proj, 1, beta_gw);
  ops.gemm(dk_blk, true, n, false, gw.k_proj, 1, 1);
  ops.gemm(dv_ctx, true, in.ctx, false, gw.v_proj, 1, beta_gw);
  ops.gemm(dv_blk, true, n, false, gw.v_proj, 1, 1);
  ops.gemm(s.dq_raw, false, w.q_proj, false, s.dn, 1, 0);
  ops.gemm(dk_blk, false, w.k_proj, false, s.dn, 1, 1);
  ops.gemm(dv_blk, false, w.v_proj, false, s.dn, 1, 1);
  ops.gemm(dk_ctx, false, w.k_proj, false, s.dctx, 1, beta_dctx);
  ops.gemm(dv_ctx, false, w.v_proj, false, s.dctx, 1, 1);
  if (conv) conv_in_bwd(a.n, w.attention_conv, a.coeff_attn, s.dn, gw.attention_conv);
  ops.rmsnorm_bwd(x_in, w.input_layernorm, a.rstd1, conv ? s.dconv : s.dn, dx, gw.input_layernorm, 1,
                  beta_gw);
}

}  // namespace df
