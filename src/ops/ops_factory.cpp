// Backend selection; the only place that knows which backends this build contains.
#include "ops/ops_factory.h"

#include "ops/cpu/cpu_ops.h"
#include "ops/cpu/cpu_train_ops.h"
#ifdef DF_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/cuda_train_ops.h"
#endif

namespace df {

#ifdef DF_HAVE_CUDA
namespace {

// Both backends' start on a GPU: `setting` names what asked for CUDA, `cpu_hint` the way back to the CPU.
void expect_visible_gpu(int gpu, const char* setting, const char* cpu_hint) {
  const int n = cuda_device_count();
  DF_CHECK(n > 0, "%s but this machine shows no CUDA GPU; HINT: %s, or run where a GPU is visible "
           "(CUDA_VISIBLE_DEVICES)", setting, cpu_hint);
  DF_CHECK(gpu >= 0 && gpu < n, "%s: GPU %d asked for but %d visible", setting, gpu, n);
}

}  // namespace
#endif

std::unique_ptr<Ops> ops_create(const std::string& device, int gpu) {
  if (device == "cpu") return std::make_unique<CpuOps>();
  if (device == "cuda") {
#ifdef DF_HAVE_CUDA
    expect_visible_gpu(gpu, "device cuda (--device / target.device)", "--device cpu (target.device = \"cpu\")");
    return std::make_unique<CudaOps>(gpu);
#else
    DF_FAIL("--device cuda: this build has no CUDA backend; HINT: rebuild where nvcc exists (DF_ENABLE_CUDA=ON)");
#endif
  }
  DF_FAIL("unknown device '%s' (expected cpu or cuda)", device.c_str());
}

std::unique_ptr<TrainOps> train_ops_create(const std::string& device, int gpu) {
  if (device == "cpu") return std::make_unique<CpuTrainOps>();
  if (device == "cuda") {
#ifdef DF_HAVE_CUDA
    expect_visible_gpu(gpu, "drafter.device = \"cuda\"", "set drafter.device = \"cpu\"");
    return std::make_unique<CudaTrainOps>(gpu);
#else
    DF_FAIL(
        "drafter.device = \"cuda\": this build has no CUDA backend; HINT: rebuild where nvcc exists "
        "(DF_ENABLE_CUDA=ON) or set drafter.device = \"cpu\"");
#endif
  }
  DF_FAIL("unknown drafter.device '%s' (expected cpu or cuda)", device.c_str());
}

}  // namespace df
