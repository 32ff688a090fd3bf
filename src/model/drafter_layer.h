// One drafter layer's forward and analytic backward, and the activations the backward needs. Internal to
// the drafter (drafter_step.cpp plans and owns the memory); kept apart so the step reads as a flat list.
#pragma once
#include "core/arena.h"
#include "model/drafter.h"

namespace df {

// Sizes of one micro-batch's step: T context tokens, nb blocks of B rows (N = nb·B query rows).
struct DrafterDims {
  int64_t T = 0, nb = 0, N = 0;
};

// Shared inputs of every layer.
struct DrafterLayerInputs {
  Tensor ctx;      // [T, H] hidden_norm(fc(taps))
  Tensor pos_all;  // i32 [1, T + N]: context positions, then block positions a + k
  Tensor blocks;   // i32 [nb, 2]: (sequence start row, anchor) per block
};

// Saved forward activations of one layer (x_in is the previous layer's x_out).
struct DrafterLayerActs {
  Tensor x_out;                       // [N, H]
  Tensor n, rstd1;                    // input_layernorm output, its rstd
  Tensor q_raw, q, rstd_q;            // [N, hq·hd]: q_proj n, after q_norm + RoPE; rstd [N, hq]
  Tensor k_raw, k, rstd_k, v;         // [T + N, hkv·hd]: context rows, then block rows
  Tensor att, lse;                    // attention output [N, hq·hd], logsumexp [N, hq]
  Tensor h, n2, rstd2;                // after the attention residual; post_attention_layernorm
  Tensor gate, up, act;               // [N, I]
  // kind = dflash2 (ops/dflash2_conv.h), else empty: each sublayer's dynamic coefficients [N, coeffs] and its
  // input after the input-side convolution, and its output before the output-side one (o_proj's,
  // down_proj's).
  Tensor coeff_attn, n_conv, o, coeff_mlp, n2_conv, mlp_out;
};

// Backward scratch shared by all layers (overwritten layer by layer).
struct DrafterLayerGrads {
  Tensor dn, dn2, datt, dq, dq_raw, dk, dk_raw, dv, dgate, dup, dact;
  Tensor dctx;  // [T, H] ∂/∂ctx, summed over the layers
  // kind = dflash2: ∂/∂ a sublayer's output before its output-side convolution, ∂/∂ its norm output through
  // the input-side convolution and the coefficients, ∂/∂ the coefficients [N, coeffs].
  Tensor dsub, dconv, dcoeff;
};

// Activations and their gradients in `act` (the backend's act_dtype), rstd and lse in f32.
void drafter_layer_acts_alloc(Arena& a, const DrafterConfig& c, const DrafterDims& d, DType act,
                              DrafterLayerActs& acts);
void drafter_layer_grads_alloc(Arena& a, const DrafterConfig& c, const DrafterDims& d, DType act,
                               DrafterLayerGrads& g);

void drafter_layer_forward(TrainOps& ops, const DrafterConfig& c, int layer, const DrafterLayerTensors& w,
                           const DrafterLayerInputs& in, const Tensor& x_in, DrafterLayerActs& a);
// dx holds ∂/∂x_out on entry and ∂/∂x_in on return; parameter gradients go to gw = beta_gw·gw + ∂/∂θ (0: a
// step's first backward writes them), ∂/∂ctx to scratch.dctx = beta_dctx·dctx + ∂/∂ctx.
void drafter_layer_backward(TrainOps& ops, const DrafterConfig& c, int layer, const DrafterLayerTensors& w,
                            const DrafterLayerTensors& gw, float beta_gw, const DrafterLayerInputs& in,
                            const Tensor& x_in, const DrafterLayerActs& a, const Tensor& dx,
                            DrafterLayerGrads& scratch, float beta_dctx);

}  // namespace df
