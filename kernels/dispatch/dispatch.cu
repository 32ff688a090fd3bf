// The environment and device reads behind kernels/dispatch/dispatch.h: the registry of forced kernel
// variants and each device's capabilities, each read once.
#include <cstdlib>
#include <mutex>

#include "kernels/dispatch/dispatch.h"
#include "kernels/primitives/cuda_check.cuh"
#include "kernels/primitives/tma.cuh"

namespace df {

namespace {

KernelVariants& variants_store() {
  static KernelVariants v;
  static std::once_flag once;
  std::call_once(once, [] {
    const char* e = std::getenv("DFLASH_KERNEL_VARIANTS");
    v = kernel_variants_parse(e ? e : "");
  });
  return v;
}

DeviceCaps device_caps_read(int dev) {
  DeviceCaps c;
  int smem = 0, cluster = 0;
  DF_CUDA_CHECK(cudaDeviceGetAttribute(&c.cc_major, cudaDevAttrComputeCapabilityMajor, dev));
  DF_CUDA_CHECK(cudaDeviceGetAttribute(&c.cc_minor, cudaDevAttrComputeCapabilityMinor, dev));
  DF_CUDA_CHECK(cudaDeviceGetAttribute(&c.sms, cudaDevAttrMultiProcessorCount, dev));
  DF_CUDA_CHECK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  DF_CUDA_CHECK(cudaDeviceGetAttribute(&cluster, cudaDevAttrClusterLaunch, dev));
  c.smem_optin = size_t(smem);
  c.max_cluster = cluster ? 8 : 1;  // 8: the portable cluster size every cluster-launching GPU takes
  c.tma = c.cc_major >= 9 && tensor_map_encoder() != nullptr;
#ifdef DF_CUDA_SM90A
  c.wgmma = c.cc_major == 9 && c.cc_minor == 0;
#endif
  const char* profile = std::getenv("DFLASH_GPU_PROFILE");
  return device_caps_profile(c, profile ? profile : "");
}

}  // namespace

const KernelVariants& kernel_variants() { return variants_store(); }

void kernel_variants_set(const KernelVariants& v) { variants_store() = v; }

const DeviceCaps& device_caps() {
  constexpr int kDevices = 64;
  static DeviceCaps caps[kDevices];
  static std::once_flag once[kDevices];
  int dev = 0;
  DF_CUDA_CHECK(cudaGetDevice(&dev));
  DF_CHECK(dev >= 0 && dev < kDevices, "device %d: only devices 0..%d are supported", dev, kDevices - 1);
  std::call_once(once[dev], [dev] { caps[dev] = device_caps_read(dev); });
  return caps[dev];
}

}  // namespace df
