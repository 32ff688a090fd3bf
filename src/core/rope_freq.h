// The RoPE frequency of dimension pair j of rot_dim rotated dims, one definition for the CPU oracle
// (ops/cpu/cpu_ops.cpp) and the CUDA kernels (kernels/elementwise/rope.cu): as transformers forms it, the
// exponent 2j / rot_dim divided in fp32, then 1 / theta^e with the pow in double, rounded to fp32 once. A
// double exponent gives another fp32 frequency for about half the j of a rot_dim that is not a power of two
// (26 of 48 at 96, 11 of 20 at 40), an angle off by up to position · 2^-24 rad; one definition keeps the
// kernels on the oracle's frequencies.
#pragma once
#include <cmath>

#include "core/host_device.h"

namespace df {

DF_HOST_DEVICE inline float rope_inv_freq(int j, int rot_dim, float theta) {
#if defined(__CUDA_ARCH__)
  const float e = __fdiv_rn(static_cast<float>(2 * j), static_cast<float>(rot_dim));  // IEEE under fast math
#else
  const float e = static_cast<float>(2 * j) / static_cast<float>(rot_dim);
#endif
  return static_cast<float>(1.0 / pow(static_cast<double>(theta), static_cast<double>(e)));
}

}  // namespace df
