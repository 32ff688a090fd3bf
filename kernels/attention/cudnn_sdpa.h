// cuDNN's fused flash attention (its tuned SDPA kernels for Hopper and both Blackwells) as a second
// implementation of attention_causal_launch's prefill attention, built through cuDNN's backend graph API (the
// C++ frontend headers are not packaged). The packed sequences map onto cuDNN's ragged layout: per-sequence
// lengths (the padding mask) and element offsets of each sequence's first row. Compiled only where CMake
// found cuDNN (DF_HAVE_CUDNN); attention.cu reaches it through attention_cudnn_available and the measured
// dispatch.
#pragma once
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace df {

// Whether cuDNN's fused attention can run on the current device: the loaded library is 9.6 or newer (ragged
// GQA layouts with empty padding sequences) and a handle opens. Else false, with the reason in *why.
bool cudnn_sdpa_usable(std::string* why);

// Causal GQA attention inside each packed sequence on cuDNN, as attention_causal_launch without the gate:
// q [tokens, hq·hd], k, v [tokens, hkv·hd], out [tokens, hq·hd] (row strides in elements, multiples of 8;
// every pointer 16-byte aligned), cu [num_seqs + 1] sequence offsets on the device, max_len the longest
// sequence. The plan of the call's bucket (num_seqs and max_len rounded up to powers of two, so a run builds
// a few) is built at its first use and kept for the process; its workspace is kept per device and stream and
// grows as needed. Throws naming the cuDNN status and the graph node where cuDNN cannot build or run it.
void cudnn_sdpa_launch(const __nv_bfloat16* q, int64_t ld_q, const __nv_bfloat16* k, int64_t ld_k,
                       const __nv_bfloat16* v, int64_t ld_v, __nv_bfloat16* out, int64_t ld_out,
                       const int32_t* cu, int num_seqs, int max_len, int hq, int hkv, int hd, float scale,
                       cudaStream_t stream);

}  // namespace df
