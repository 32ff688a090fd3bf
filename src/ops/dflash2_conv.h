// DFlash2's grouped dynamic depthwise convolution inside the block (drafter.kind = "dflash2"; SpecForge
// 5943b2f6 dflash2.py DFlashGroupedConv): the exact fp32 math on the host, forward and analytic backward, as
// the oracle the drafter step and the CUDA kernels are checked against. It wraps every attention and MLP
// sublayer of a layer:
//
//   n = norm(x);  c = W·n  [rows, 2·taps·G];  a = conv₀(n);  y = sublayer(a);  x' = x + conv₁(y)
//   conv_s(u)[r, h] = Σ_{t < taps, t ≤ r mod B} (base[s, t, h] + c[r, s·taps·G + t·G + h / gs]) · u[r − t, h]
//
// Rows are block rows, B per block (the block's offset k = r mod B): tap t reads row r − t of the same block,
// never the block before (causal inside the block). Both sides' coefficients come from the sublayer's input
// n; row r's coefficients are its own (the output row's). G = H / gs groups share one dynamic coefficient.
// Started as SpecForge documents it (base = [1, 0, ...] per side, W = 0), both convolutions are the identity.
//
// Parameter names (the peer's and SGLang's): layers.{i}.{attention_conv,mlp_conv}.base_kernel [2, taps, H],
// layers.{i}.{attention_conv,mlp_conv}.kernel_projection.weight [2·taps·G, H].
#pragma once
#include <cstdint>

namespace df {

struct Dflash2ConvDims {
  int hidden = 0;      // H
  int block_size = 0;  // B
  int taps = 0;
  int group_size = 0;  // gs, divides H

  int groups() const { return hidden / group_size; }
  int coeffs() const { return 2 * taps * groups(); }  // dynamic coefficients per row, both sides
};

// One side's convolution alone (the drafter step's op, ops/train_ops.h dflash2_conv_fwd): out = conv_s(u)
// with coeff [rows, coeffs()] both sides' dynamic coefficients (coeff = x·Wᵀ), base [2·taps, H] both sides'
// base kernels; side s reads its own half of each.
template <class T>
void dflash2_conv_side(const Dflash2ConvDims& d, const T* base, const T* coeff, int side, const T* u,
                       int64_t rows, T* out);
// Its backward: adds ∂/∂u into du, ∂/∂coeff into dcoeff's side-s columns and ∂/∂base[s] into dbase's side-s
// rows (dbase [2·taps, H]).
template <class T>
void dflash2_conv_side_backward(const Dflash2ConvDims& d, const T* base, const T* coeff, int side, const T* u,
                                int64_t rows, const T* dout, T* du, T* dcoeff, T* dbase);

// One convolution's weights (read) or their gradients (accumulated into).
template <class T>
struct Dflash2ConvTensors {
  T* base_kernel = nullptr;        // [2, taps, H]
  T* kernel_projection = nullptr;  // [2·taps·G, H]
};

// rows (a multiple of B) rows of x [rows, H]: coeff = x·Wᵀ [rows, coeffs()], out = conv₀(x) [rows, H].
template <class T>
void dflash2_conv_prepare(const Dflash2ConvDims& d, const Dflash2ConvTensors<const T>& w, const T* x,
                          int64_t rows, T* out, T* coeff);
// out = conv₁(y) with prepare's coefficients.
template <class T>
void dflash2_conv_finish(const Dflash2ConvDims& d, const Dflash2ConvTensors<const T>& w, const T* y,
                         const T* coeff, int64_t rows, T* out);

// Backward of finish: dout = ∂/∂out. Adds ∂/∂y into dy, ∂/∂coeff into dcoeff's side-1 columns and ∂/∂base[1]
// into grads.base_kernel.
template <class T>
void dflash2_conv_finish_backward(const Dflash2ConvDims& d, const Dflash2ConvTensors<const T>& w, const T* y,
                                  const T* coeff, int64_t rows, const T* dout, T* dy, T* dcoeff,
                                  const Dflash2ConvTensors<T>& grads);
// Backward of prepare: dout = ∂/∂out, dcoeff holds finish's side-1 part on entry (zeros if finish is not
// differentiated) and gets the side-0 part added. Adds ∂/∂x (through conv₀ and through W) into dx and
// ∂/∂base[0], ∂/∂W into grads.
template <class T>
void dflash2_conv_prepare_backward(const Dflash2ConvDims& d, const Dflash2ConvTensors<const T>& w, const T* x,
                                   const T* coeff, int64_t rows, const T* dout, T* dcoeff, T* dx,
                                   const Dflash2ConvTensors<T>& grads);

}  // namespace df
