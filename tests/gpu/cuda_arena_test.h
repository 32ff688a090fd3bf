// The fixture of the GPU tests that need one CudaOps and a 256 MiB device arena (test_fp8_cuda.cpp,
// test_fp8_block_cuda.cpp): skips itself without a device, frees the block after each test.
#pragma once
#include <gtest/gtest.h>

#include <memory>

#include "core/arena.h"
#include "ops/cuda/cuda_ops.h"

namespace df {

class CudaArenaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0)
      GTEST_SKIP() << "no CUDA device (cudaGetDeviceCount reports 0): GPU test skipped";
    gpu_ = std::make_unique<CudaOps>(0);
    block_ = gpu_->alloc_bytes(kBlock);
    arena_ = Arena(block_, kBlock, Device::cuda);
  }
  void TearDown() override {
    if (gpu_) gpu_->free_bytes(block_);
  }
  static constexpr size_t kBlock = size_t(256) << 20;
  std::unique_ptr<CudaOps> gpu_;
  void* block_ = nullptr;
  Arena arena_;
};

}  // namespace df
