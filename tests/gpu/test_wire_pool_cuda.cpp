// The CUDA wire pool (ops/wire_pool.h, src/ops/cuda/cuda_wire_pool.cpp): its copies run on the pool's own
// stream but are ordered against the compute stream both ways. A D2H copy must see what a kernel queued
// before it wrote (here a device fill queued on the compute stream), and work queued on the compute stream
// after an H2D copy must see the copied bytes. Skips without a GPU; one skipped test in a build without CUDA.
#include <gtest/gtest.h>

#ifndef DF_HAVE_CUDA
TEST(WirePoolCuda, SkippedWithoutCudaBuild) {
  GTEST_SKIP() << "built without CUDA: GPU wire-pool tests skipped";
}
#else
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "ops/cuda/cuda_ops.h"

namespace df {
namespace {

TEST(WirePoolCuda, CopiesAreOrderedAgainstTheComputeStream) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  CudaOps ops(0);
  // 3 M bf16 values per slot: large enough that an unordered copy would race the fill.
  const int64_t rows = 3000, cols = 1024;
  const size_t bytes = size_t(rows * cols) * 2;
  std::unique_ptr<WirePool> pool = ops.wire_pool(2, bytes);
  ASSERT_EQ(pool->device(), Device::cuda);
  for (int s = 0; s < 2; ++s) {
    // D2H: a fill queued on the compute stream, then the copy; the host mirror must hold the fill.
    const Tensor t = tensor_make(pool->data(s), DType::bf16, Device::cuda, rows, cols);
    ops.fill_normal(t, 11, uint64_t(s), 0.f, 1.f);
    pool->to_host(s, bytes);
    pool->wait(s);
    ASSERT_TRUE(pool->copied(s));
    std::vector<uint16_t> want(size_t(rows * cols));
    ops.download_raw(t, want.data());
    ASSERT_EQ(std::memcmp(pool->host(s), want.data(), bytes), 0)
        << "slot " << s << ": the D2H copy did not see "
        << "the fill queued before it";
    // H2D: new host bytes, the copy, then a read queued on the compute stream must see them.
    uint16_t* h = reinterpret_cast<uint16_t*>(pool->host(s));
    for (size_t i = 0; i < want.size(); ++i) h[i] = f32_to_bf16(float(int(i % 977) - 488) / 64.f);
    std::vector<uint16_t> sent(h, h + want.size());
    pool->to_device(s, bytes);
    std::vector<uint16_t> got(want.size());
    ops.download_raw(t, got.data());
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], sent[i]) << "slot " << s << " element " << i << ": the compute stream read the slot "
                                 << "before the H2D copy finished";
  }
  EXPECT_NE(pool->data(0), pool->data(1));
  EXPECT_NE(pool->host(0), pool->host(1));
}

TEST(WirePoolCuda, ACopyBeyondTheSlotIsAnError) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: GPU test skipped";
  CudaOps ops(0);
  std::unique_ptr<WirePool> pool = ops.wire_pool(1, 4096);
  EXPECT_THROW(pool->to_host(0, 4097), Error);
  EXPECT_THROW(pool->to_device(1, 16), Error);  // no slot 1
}

}  // namespace
}  // namespace df
#endif
