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

std::string device_caps_summary(const DeviceCaps& c) {
  std::string s = c.profile.empty() ? std::string() : "DFLASH_GPU_PROFILE=" + c.profile + ": ";
  s += "compute " + std::to_string(c.cc_major) + "." + std::to_string(c.cc_minor) + ", " +
       std::to_string(c.sms) + " SMs, " + std::to_string(c.smem_optin / 1024) + " KB shared memory a block, ";
  s += c.max_cluster > 1 ? "clusters of " + std::to_string(c.max_cluster) : std::string("no clusters");
  s += c.tma ? ", TMA" : ", no TMA";
  s += c.wgmma ? ", wgmma" : ", no wgmma";
  return s;
}

void kernel_smem_opt_in(const void* kernel, size_t bytes, const char* what) {
  const DeviceCaps& c = device_caps();
  if (bytes > c.smem_optin) {
    const bool profiled = !c.profile.empty();
    kernel_throw(__FILE__, __LINE__,
                 std::string(what) + " asks for " + std::to_string(bytes) +
                     " bytes of shared memory a block, more than the " + std::to_string(c.smem_optin) +
                     " a block may have on this compute " + std::to_string(c.cc_major) + "." +
                     std::to_string(c.cc_minor) + " device" +
                     (profiled ? " (DFLASH_GPU_PROFILE=" + c.profile + ")" : std::string()) +
                     "; HINT: this kernel has no form for such a device yet: run it on a GPU with more shared "
                     "memory" + (profiled ? " or without the profile" : ""));
  }
  DF_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
}

const DeviceCaps& device_caps() {
  constexpr int kDevices = 64;
  static DeviceCaps caps[kDevices];
  static std::once_flag once[kDevices];
  int dev = 0;
  DF_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kDevices)
    kernel_throw(__FILE__, __LINE__,
                 "device " + std::to_string(dev) + ": only devices 0.." + std::to_string(kDevices - 1) +
                     " are supported");
  std::call_once(once[dev], [dev] { caps[dev] = device_caps_read(dev); });
  return caps[dev];
}

}  // namespace df
