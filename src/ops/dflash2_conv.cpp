// DFlash2's in-block convolution on the host: the projection to dynamic coefficients, one side's convolution
// and their exact backward. Sums run in double in a fixed order.
#include "ops/dflash2_conv.h"

#include "core/error.h"

namespace df {

namespace {

void check_rows(const Dflash2ConvDims& d, int64_t rows) {
  DF_CHECK(rows >= 0 && rows % d.block_size == 0, "dflash2 conv: %lld rows are not whole blocks of %d",
           (long long)rows, d.block_size);
}

}  // namespace

// Side s reads base[s] and the coefficient columns [s·taps·G, (s+1)·taps·G) of coeff.
template <class T>
void dflash2_conv_side(const Dflash2ConvDims& d, const T* base, const T* coeff, int side, const T* u,
                       int64_t rows, T* out) {
  check_rows(d, rows);
  const int H = d.hidden, taps = d.taps, G = d.groups(), gs = d.group_size, C = d.coeffs();
  const T* b = base + int64_t(side) * taps * H;
  for (int64_t r = 0; r < rows; ++r) {
    const int k = int(r % d.block_size);
    const T* c = coeff + r * C + int64_t(side) * taps * G;
    for (int h = 0; h < H; ++h) {
      double s = 0;
      for (int t = 0; t < taps && t <= k; ++t)
        s +=
            (double(b[int64_t(t) * H + h]) + double(c[int64_t(t) * G + h / gs])) * double(u[(r - t) * H + h]);
      out[r * H + h] = T(s);
    }
  }
}

template <class T>
void dflash2_conv_side_backward(const Dflash2ConvDims& d, const T* base, const T* coeff, int side, const T* u,
                                int64_t rows, const T* dout, T* du, T* dcoeff, T* dbase) {
  check_rows(d, rows);
  const int H = d.hidden, taps = d.taps, G = d.groups(), gs = d.group_size, C = d.coeffs();
  const int64_t at = int64_t(side) * taps;
  for (int64_t r = 0; r < rows; ++r) {
    const int k = int(r % d.block_size);
    const T* c = coeff + r * C + at * G;
    T* dc = dcoeff + r * C + at * G;
    for (int t = 0; t < taps && t <= k; ++t)
      for (int g = 0; g < G; ++g) {
        double dcg = 0;
        for (int h = g * gs; h < (g + 1) * gs; ++h) {
          const double go = double(dout[r * H + h]), ui = double(u[(r - t) * H + h]);
          const double coef = double(base[(at + t) * H + h]) + double(c[int64_t(t) * G + g]);
          du[(r - t) * H + h] += T(go * coef);
          dbase[(at + t) * H + h] += T(go * ui);
          dcg += go * ui;
        }
        dc[int64_t(t) * G + g] += T(dcg);
      }
  }
}

template <class T>
void dflash2_conv_prepare(const Dflash2ConvDims& d, const Dflash2ConvTensors<const T>& w, const T* x,
                          int64_t rows, T* out, T* coeff) {
  check_rows(d, rows);
  const int H = d.hidden, C = d.coeffs();
  for (int64_t r = 0; r < rows; ++r)
    for (int j = 0; j < C; ++j) {
      double s = 0;
      for (int h = 0; h < H; ++h) s += double(w.kernel_projection[int64_t(j) * H + h]) * double(x[r * H + h]);
      coeff[r * C + j] = T(s);
    }
  dflash2_conv_side(d, w.base_kernel, static_cast<const T*>(coeff), 0, x, rows, out);
}

template <class T>
void dflash2_conv_finish(const Dflash2ConvDims& d, const Dflash2ConvTensors<const T>& w, const T* y,
                         const T* coeff, int64_t rows, T* out) {
  dflash2_conv_side(d, w.base_kernel, coeff, 1, y, rows, out);
}

template <class T>
void dflash2_conv_finish_backward(const Dflash2ConvDims& d, const Dflash2ConvTensors<const T>& w, const T* y,
                                  const T* coeff, int64_t rows, const T* dout, T* dy, T* dcoeff,
                                  const Dflash2ConvTensors<T>& grads) {
  dflash2_conv_side_backward(d, w.base_kernel, coeff, 1, y, rows, dout, dy, dcoeff, grads.base_kernel);
}

template <class T>
void dflash2_conv_prepare_backward(const Dflash2ConvDims& d, const Dflash2ConvTensors<const T>& w, const T* x,
                                   const T* coeff, int64_t rows, const T* dout, T* dcoeff, T* dx,
                                   const Dflash2ConvTensors<T>& grads) {
  dflash2_conv_side_backward(d, w.base_kernel, coeff, 0, x, rows, dout, dx, dcoeff, grads.base_kernel);
  // coeff = x·Wᵀ: ∂W += dcoeffᵀ·x, ∂x += dcoeff·W.
  const int H = d.hidden, C = d.coeffs();
  for (int64_t r = 0; r < rows; ++r)
    for (int j = 0; j < C; ++j) {
      const double dc = double(dcoeff[r * C + j]);
      if (dc == 0.0) continue;
      for (int h = 0; h < H; ++h) {
        grads.kernel_projection[int64_t(j) * H + h] += T(dc * double(x[r * H + h]));
        dx[r * H + h] += T(dc * double(w.kernel_projection[int64_t(j) * H + h]));
      }
    }
}

#define DF_DFLASH2_CONV(T)                                                                                   \
  template void dflash2_conv_side<T>(const Dflash2ConvDims&, const T*, const T*, int, const T*, int64_t,     \
                                     T*);                                                                    \
  template void dflash2_conv_side_backward<T>(const Dflash2ConvDims&, const T*, const T*, int, const T*,     \
                                              int64_t, const T*, T*, T*, T*);                                \
  template void dflash2_conv_prepare<T>(const Dflash2ConvDims&, const Dflash2ConvTensors<const T>&,          \
                                        const T*, int64_t, T*, T*);                                          \
  template void dflash2_conv_finish<T>(const Dflash2ConvDims&, const Dflash2ConvTensors<const T>&, const T*, \
                                       const T*, int64_t, T*);                                               \
  template void dflash2_conv_finish_backward<T>(const Dflash2ConvDims&, const Dflash2ConvTensors<const T>&,  \
                                                const T*, const T*, int64_t, const T*, T*, T*,               \
                                                const Dflash2ConvTensors<T>&);                               \
  template void dflash2_conv_prepare_backward<T>(const Dflash2ConvDims&, const Dflash2ConvTensors<const T>&, \
                                                 const T*, const T*, int64_t, const T*, T*, T*,              \
                                                 const Dflash2ConvTensors<T>&);
DF_DFLASH2_CONV(float)
DF_DFLASH2_CONV(double)
#undef DF_DFLASH2_CONV

}  // namespace df
