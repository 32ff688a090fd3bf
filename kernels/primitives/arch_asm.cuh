// Instructions that only some GPU generations have, for kernels that every generation's build compiles: a
// multi-arch build compiles each kernel for every arch, and dispatch (kernels/dispatch) launches a kernel only on
// a device that has what it uses; where an arch lacks an instruction it becomes a trap, so a launch that got
// past dispatch fails loudly instead of computing something else.
#pragma once

// Defined in the device passes that have the sm_90a features: a kernel that issues wgmma compiles its body
// only there (the host pass and other targets see an empty body that is never launched).
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DF_WGMMA_BODY 1
#endif

// wgmma: the sm_90a device pass only (cc 9.0 with the arch-specific image).
#ifdef DF_WGMMA_BODY
#define DF_WGMMA_ASM(...) asm volatile(__VA_ARGS__)
#else
#define DF_WGMMA_ASM(...) __trap()
#endif

// TMA, mbarrier transaction counts, async-proxy and cluster fences: compute 9.0 and later (DeviceCaps::tma).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define DF_SM90_ASM(...) __trap()
#else
#define DF_SM90_ASM(...) asm volatile(__VA_ARGS__)
#endif
