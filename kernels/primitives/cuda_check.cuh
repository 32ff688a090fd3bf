// Error checking shared by every launcher and by the CUDA backend: a failing CUDA, cuBLASLt or launch call
// becomes a df::Error naming the call, the file:line and the runtime's message, like DF_CHECK elsewhere.
#pragma once
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>

#include "core/error.h"
#include "kernels/dispatch/dispatch.h"
#include "kernels/primitives/kernel_error.h"

namespace df {

[[noreturn]] inline void cuda_throw(const char* call, const char* what, const char* file, int line) {
  kernel_throw(file, line, std::string(call) + " failed: " + what);
}

}  // namespace df

#define DF_CUDA_CHECK(call)                                                                 \
  do {                                                                                      \
    cudaError_t df_err_ = (call);                                                           \
    if (df_err_ != cudaSuccess) ::df::cuda_throw(#call, cudaGetErrorString(df_err_), __FILE__, __LINE__); \
  } while (0)

#define DF_CUBLAS_CHECK(call)                                                                          \
  do {                                                                                                 \
    cublasStatus_t df_st_ = (call);                                                                    \
    if (df_st_ != CUBLAS_STATUS_SUCCESS)                                                               \
      ::df::cuda_throw(#call, cublasLtGetStatusString(df_st_), __FILE__, __LINE__);                    \
  } while (0)

// After a <<<>>> launch: catches bad configurations (too much shared memory, grid too large) at the launch.
#define DF_CUDA_CHECK_LAUNCH(name)                                                                 \
  do {                                                                                             \
    cudaError_t df_err_ = cudaGetLastError();                                                      \
    if (df_err_ != cudaSuccess)                                                                    \
      ::df::cuda_throw("launch of " name, cudaGetErrorString(df_err_), __FILE__, __LINE__);        \
  } while (0)

namespace df {

// The current device's SM count (device_caps: read once per device): the launchers that size a grid by it
// (persistent grids, one-wave grid-stride loops) run on every layer of every step.
inline int device_sm_count() { return device_caps().sms; }

}  // namespace df
