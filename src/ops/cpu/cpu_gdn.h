// Gated DeltaNet on the CPU: prefill in its two forms, the token-by-token recurrence (the definition) and the
// chunked UT/WY form that FLA and the CUDA kernels compute (tests hold the two against each other), and the
// decode step that continues the recurrence from a carried state.
#pragma once

#include "ops/ops.h"

namespace df {

// The chunk length FLA and the GPU kernels use; CpuOps::gdn_prefill runs the chunked form with it.
constexpr int kCpuGdnChunk = 64;

// Both take qkv [T, nk·dk | nk·dk | nv·dv] (after conv1d_silu), raw a/b [T, nv], A_log/dt_bias f32 [1, nv] and
// write o [T, nv·dv] (before the gated norm), exactly as Ops::gdn_prefill documents; views may be strided.
void cpu_gdn_recurrent(const Tensor& qkv, const Tensor& a, const Tensor& b, const Tensor& A_log,
                       const Tensor& dt_bias, const Tensor& out, const SeqLayout& seqs, const GdnShape& shape);
// Ops::gdn_decode on the CPU: the recurrence continued from a carried state, saving the last states.rows states.
void cpu_gdn_decode(const Tensor& qkv, const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias,
                    const Tensor& out, const Tensor& state, const Tensor& states, const GdnShape& shape);
// chunk: tokens per chunk (kCpuGdnChunk in production; other values let tests probe the chunk seams). The last
// chunk of each sequence may be partial.
void cpu_gdn_chunked(const Tensor& qkv, const Tensor& a, const Tensor& b, const Tensor& A_log,
                     const Tensor& dt_bias, const Tensor& out, const SeqLayout& seqs, const GdnShape& shape,
                     int chunk);

}  // namespace df
