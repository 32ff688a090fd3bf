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
}

void drafter_layer_forward(TrainOps& ops, const DrafterConfig& c, int layer, const DrafterLayerTensors& w,
                           const DrafterLayerInputs& in, const Tensor& x_in, DrafterLayerActs& a) {
  const int64_t T = in.ctx.rows, N = x_in.rows;
  const Tensor pos_blk = in.pos_all.cols_view(T, N);
  ops.rmsnorm_fwd(x_in, w.input_layernorm, a.n, a.rstd1, c.rms_eps);
  ops.gemm(a.n, false, w.q_proj, true, a.q_raw, 1, 0);
  ops.qk_norm_rope_fwd(a.q_raw, w.q_norm, pos_blk, a.q, a.rstd_q, c.heads, c.head_dim, c.rope_theta, c.rms_eps);
  ops.gemm(in.ctx, false, w.k_proj, true, a.k_raw.rows_view(0, T), 1, 0);
  ops.gemm(a.n, false, w.k_proj, true, a.k_raw.rows_view(T, N), 1, 0);
  ops.qk_norm_rope_fwd(a.k_raw, w.k_norm, in.pos_all, a.k, a.rstd_k, c.kv_heads, c.head_dim, c.rope_theta, c.rms_eps);
  ops.gemm(in.ctx, false, w.v_proj, true, a.v.rows_view(0, T), 1, 0);
  ops.gemm(a.n, false, w.v_proj, true, a.v.rows_view(T, N), 1, 0);
  ops.dflash_attention_fwd(a.q, a.k, a.v, in.blocks, a.att, a.lse, attn_shape(c, layer));
  ops.gemm_add(a.att, false, w.o_proj, true, x_in, a.h, 1, 1);
  ops.rmsnorm_fwd(a.h, w.post_attention_layernorm, a.n2, a.rstd2, c.rms_eps);
  ops.gemm(a.n2, false, w.gate_proj, true, a.gate, 1, 0);
  ops.gemm(a.n2, false, w.up_proj, true, a.up, 1, 0);
  ops.swiglu_fwd(a.gate, a.up, a.act);
  ops.gemm_add(a.act, false, w.down_proj, true, a.h, a.x_out, 1, 1);
}

void drafter_layer_backward(TrainOps& ops, const DrafterConfig& c, int layer, const DrafterLayerTensors& w,
                            const DrafterLayerTensors& gw, float beta_gw, const DrafterLayerInputs& in,
                            const Tensor& x_in, const DrafterLayerActs& a, const Tensor& dx,
                            DrafterLayerGrads& s, float beta_dctx) {
  const int64_t T = in.ctx.rows, N = x_in.rows;
  const Tensor pos_blk = in.pos_all.cols_view(T, N);
  // MLP: x_out = h + down(swiglu(gate n2, up n2)), n2 = post_ln(h).
  ops.gemm(dx, true, a.act, false, gw.down_proj, 1, beta_gw);
  ops.gemm(dx, false, w.down_proj, false, s.dact, 1, 0);
  ops.swiglu_bwd(a.gate, a.up, s.dact, s.dgate, s.dup);
  ops.gemm(s.dgate, true, a.n2, false, gw.gate_proj, 1, beta_gw);
  ops.gemm(s.dup, true, a.n2, false, gw.up_proj, 1, beta_gw);
  ops.gemm(s.dgate, false, w.gate_proj, false, s.dn2, 1, 0);
  ops.gemm(s.dup, false, w.up_proj, false, s.dn2, 1, 1);
  ops.rmsnorm_bwd(a.h, w.post_attention_layernorm, a.rstd2, s.dn2, dx, gw.post_attention_layernorm, 1,
                  beta_gw);
  // Attention: h = x_in + o_proj(att); dx now holds ∂/∂h.
  ops.gemm(dx, true, a.att, false, gw.o_proj, 1, beta_gw);
  ops.gemm(dx, false, w.o_proj, false, s.datt, 1, 0);
  ops.dflash_attention_bwd(a.q, a.k, a.v, in.blocks, a.att, a.lse, s.datt, s.dq, s.dk, s.dv, attn_shape(c, layer));
  ops.qk_norm_rope_bwd(a.q_raw, w.q_norm, pos_blk, a.rstd_q, s.dq, s.dq_raw, gw.q_norm, c.heads, c.head_dim,
                       c.rope_theta, beta_gw);
  ops.qk_norm_rope_bwd(a.k_raw, w.k_norm, in.pos_all, a.rstd_k, s.dk, s.dk_raw, gw.k_norm, c.kv_heads,
                       c.head_dim, c.rope_theta, beta_gw);
  const Tensor dk_ctx = s.dk_raw.rows_view(0, T), dk_blk = s.dk_raw.rows_view(T, N);
  const Tensor dv_ctx = s.dv.rows_view(0, T), dv_blk = s.dv.rows_view(T, N);
  ops.gemm(s.dq_raw, true, a.n, false, gw.q_proj, 1, beta_gw);
  // k_proj and v_proj see the context rows and the block rows: the first product takes beta_gw (with T = 0
  // an empty product: zeros for beta 0), the second adds.
  ops.gemm(dk_ctx, true, in.ctx, false, gw.k_proj, 1, beta_gw);
  ops.gemm(dk_blk, true, a.n, false, gw.k_proj, 1, 1);
  ops.gemm(dv_ctx, true, in.ctx, false, gw.v_proj, 1, beta_gw);
  ops.gemm(dv_blk, true, a.n, false, gw.v_proj, 1, 1);
  ops.gemm(s.dq_raw, false, w.q_proj, false, s.dn, 1, 0);
  ops.gemm(dk_blk, false, w.k_proj, false, s.dn, 1, 1);
  ops.gemm(dv_blk, false, w.v_proj, false, s.dn, 1, 1);
  ops.gemm(dk_ctx, false, w.k_proj, false, s.dctx, 1, beta_dctx);
  ops.gemm(dv_ctx, false, w.v_proj, false, s.dctx, 1, 1);
  ops.rmsnorm_bwd(x_in, w.input_layernorm, a.rstd1, s.dn, dx, gw.input_layernorm, 1, beta_gw);
}

}  // namespace df
