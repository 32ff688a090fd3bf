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

void kernel_smem_opt_in(const void* kernel, size_t bytes, const char* what) {
  const DeviceCaps& c = device_caps();
  DF_CHECK(bytes <= c.smem_optin,
           "%s asks for %zu bytes of shared memory a block, more than the %zu a block may have on this compute "
           "%d.%d device%s%s; HINT: this kernel has no form for such a device yet: run it on a GPU with more shared "
           "memory%s",
           what, bytes, c.smem_optin, c.cc_major, c.cc_minor, c.profile.empty() ? "" : " (DFLASH_GPU_PROFILE=",
           c.profile.empty() ? "" : (c.profile + ")").c_str(), c.profile.empty() ? "" : " or without the profile");
  DF_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

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
