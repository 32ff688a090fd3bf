// Hopper (sm_90) bulk tensor copies (TMA) and the shared-memory mbarriers that track them, shared by the
// wgmma attention kernels: device-side barrier and copy primitives, and the host-side tensor map that
// describes a bf16 matrix as 64-column boxes in the 128-byte swizzled layout wgmma reads (kernels/primitives/wgmma.cuh).
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstdint>
#include <mutex>

#include "kernels/primitives/arch_asm.cuh"
#include "kernels/primitives/cuda_check.cuh"
#include "kernels/launchers.cuh"

namespace df {

// ---- device primitives ----
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
  DF_SM90_ASM("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  DF_SM90_ASM("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// The producer's arrival, announcing the bytes the TMA copies will deliver to this phase.
__device__ __forceinline__ void mbar_arrive_expect(uint32_t bar, uint32_t bytes) {
  DF_SM90_ASM("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  DF_SM90_ASM(
      "{\n.reg .pred done;\nwait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// A ROWS × HD tile at (row, col0) of the tensor behind tm (whose box is 64 columns × ROWS rows): HD / 64
// boxes, each landing as one column block of ROWS × 128 bytes. Rows past the tensor's end arrive as zeros.
template <int HD, int ROWS>
__device__ __forceinline__ void tma_load_tile(uint32_t dst, const CUtensorMap* tm, int col0, int row,
                                              uint32_t bar) {
#pragma unroll
  for (int b = 0; b < HD / 64; ++b)
    DF_SM90_ASM(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
        "[%4];\n" ::"r"(dst + b * ROWS * 128),
        "l"(tm), "r"(col0 + b * 64), "r"(row), "r"(bar)
        : "memory");
}

// One box of the 3-d tensor behind tm (tensor_map_bf16_heads) at (column, head, row) into dst, its bytes
// counted on bar; elements past the tensor's ends arrive as zeros.
__device__ __forceinline__ void tma_load_box3(uint32_t dst, const CUtensorMap* tm, int col, int head, int row,
                                              uint32_t bar) {
  DF_SM90_ASM(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(dst),
      "l"(tm), "r"(col), "r"(head), "r"(row), "r"(bar)
      : "memory");
}

// ---- host side ----
// cuTensorMapEncodeTiled from the driver, found through the runtime (no link against libcuda); null when the
// driver has none.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) ==
            cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  });
  return fn;
}

// A bf16 tensor of `rank` dimensions (dims innermost first, byte strides of the outer ones) read as `box`
// boxes, whose 64-element rows land with the 128-byte swizzle wgmma reads; `what` names it in the error.
inline CUtensorMap tensor_map_bf16_swizzled(const bf16* p, cuuint32_t rank, const cuuint64_t* dims,
                                            const cuuint64_t* strides, const cuuint32_t* box, const char* what) {
  CUtensorMap tm;
  const cuuint32_t elem[3] = {1, 1, 1};
  CUresult r =
      tensor_map_encoder()(&tm, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rank, const_cast<bf16*>(p), dims, strides, box,
                           elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) cuda_throw("cuTensorMapEncodeTiled", what, __FILE__, __LINE__);
  return tm;
}

// rows × cols bf16 (row stride ld elements) read as boxes of 64 columns × box_rows rows with the 128-byte
// swizzle.
inline CUtensorMap tensor_map_bf16(const bf16* p, int64_t rows, int64_t cols, int64_t ld, int box_rows) {
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(ld) * sizeof(bf16)};
  const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
  return tensor_map_bf16_swizzled(p, 2, dims, strides, box, "could not describe an attention operand");
}

// rows × heads × hd bf16 (head h of row r at p + r·ld + h·hd) read as boxes of 64 columns × box_heads heads ×
// box_rows rows with the 128-byte swizzle: a box lands as box_rows·box_heads rows of 128 bytes, row-major
// over (row, head). hd a multiple of 8 and ld of 8, p 16-byte aligned.
inline CUtensorMap tensor_map_bf16_heads(const bf16* p, int64_t rows, int heads, int hd, int64_t ld,
                                         int box_heads, int box_rows) {
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(hd), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(hd) * sizeof(bf16),
                                 static_cast<cuuint64_t>(ld) * sizeof(bf16)};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(box_heads), static_cast<cuuint32_t>(box_rows)};
  return tensor_map_bf16_swizzled(p, 3, dims, strides, box, "could not describe an attention operand by heads");
}

}  // namespace df
