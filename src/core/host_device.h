// DF_HOST_DEVICE: marks the small inline functions that host code and CUDA kernels share (one definition of
// a random draw or an index rule for both), empty where no CUDA compiler reads the header.
#pragma once

#if defined(__CUDACC__)
#define DF_HOST_DEVICE __host__ __device__
#else
#define DF_HOST_DEVICE
#endif
