// Backend selection; the only place that knows which backends this build contains.
#include "ops/ops_factory.h"

#include "ops/cpu/cpu_ops.h"
#ifdef DF_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

namespace df {

std::unique_ptr<Ops> ops_create(const std::string& device, int gpu) {
  if (device == "cpu") return std::make_unique<CpuOps>();
  if (device == "cuda") {
#ifdef DF_HAVE_CUDA
    return std::make_unique<CudaOps>(gpu);
#else
    DF_FAIL("--device cuda: this build has no CUDA backend; HINT: rebuild where nvcc exists (DF_ENABLE_CUDA=ON)");
#endif
  }
  DF_FAIL("unknown device '%s' (expected cpu or cuda)", device.c_str());
}

}  // namespace df
