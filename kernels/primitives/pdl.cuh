// Programmatic dependent launch for the fast decode kernels (decode_fast.cu, decode_gdn.cu): a decode step is
// many short kernels, so each one's launch and block set-up overlap the previous kernel's tail on the stream.
// The device side waits before touching memory and lets the next kernel start; the host side launches.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>

#include "kernels/primitives/cuda_check.cuh"

namespace df {

// ---- kernels ------------------------------------------------------------------------------------------

// The fast kernels are launched with programmatic dependent launch (launch_pdl): a block may start while the
// previous kernel on the stream drains, so it waits here, before touching any memory, for that kernel's writes.
// A no-op when launched without the attribute.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Lets the next kernel on the stream, when launched with launch_pdl, start its blocks now: they wait in
// pdl_wait until this whole grid has finished and its writes are visible, so triggering at the start is safe
// and hides the next launch behind this kernel. Placed after pdl_wait, so at most two grids are resident.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// ---- launchers ----------------------------------------------------------------------------------------

// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialisation: its launch and
// block set-up overlap the previous kernel's tail (the kernels wait in pdl_wait before touching memory).
template <class... Params, class... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                Args... args) {
  cudaLaunchAttribute attr{};
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  DF_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...));
}

}  // namespace df
