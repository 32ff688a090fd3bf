// Whether this build carries code that runs on a given GPU: asked once when a CUDA backend takes a device, so
// a GPU the build was not compiled for is refused at start-up, naming it, instead of failing at a first launch.
#include <cstdio>
#include <string>

#include "kernels/launchers.cuh"
#include "kernels/primitives/cuda_check.cuh"

namespace df {

namespace {
// Never launched: its attributes say whether the runtime found an image (SASS or PTX to JIT) for the device.
__global__ void arch_probe_kernel() {}
}  // namespace

void cuda_check_device_supported(int device) {
  cudaDeviceProp prop{};
  DF_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  const int cc = prop.major * 10 + prop.minor;
  cudaFuncAttributes attr{};
  cudaError_t e = cudaFuncGetAttributes(&attr, arch_probe_kernel);
  if (e == cudaSuccess && cc >= DF_CUDA_MIN_ARCH) return;
  cudaGetLastError();
  char buf[768];
  std::snprintf(buf, sizeof(buf),
                "GPU %d (%s, compute capability %d.%d) is not one this build runs on: it was compiled for "
                "CUDA archs %s (%s). HINT: rebuild with -DDF_CUDA_ARCHS=%d (or \"all\"), see README \"GPU build\"",
                device, prop.name, prop.major, prop.minor, DF_CUDA_ARCH_LIST,
                e == cudaSuccess ? "older than the oldest built" : cudaGetErrorString(e), cc);
  throw Error(buf);
}

}  // namespace df
