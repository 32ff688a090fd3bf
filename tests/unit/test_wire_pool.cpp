// The host wire pool (ops/wire_pool.h) and the wire layout the feature channel puts in its slots: CPU ranks'
// slots are host memory that the wire reads in place, and a batch's final hidden starts on a 256-byte
// boundary after its taps. The CUDA pool is tested on the GPU (tests/gpu/test_wire_pool_cuda.cpp).
#include <gtest/gtest.h>

#include <cstdint>
#include <set>

#include "core/error.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/wire_pool.h"

namespace df {
namespace {

TEST(WireLayout, FinalHiddenFollowsTheTapsOn256Bytes) {
  // 10 tokens x 16 taps x 2 B = 320 B, rounded to 512; then 10 x 8 x 2 B of final hidden.
  EXPECT_EQ(WireLayout::final_offset(10, 16), 512u);
  EXPECT_EQ(WireLayout::bytes(10, 16, 0), 512u);
  EXPECT_EQ(WireLayout::bytes(10, 16, 8), 512u + 160u);
  // An exact multiple needs no padding; an empty batch needs no bytes.
  EXPECT_EQ(WireLayout::final_offset(8, 16), 256u);
  EXPECT_EQ(WireLayout::bytes(0, 16, 8), 0u);
}

TEST(WirePool, HostSlotsAreDistinctAlignedHostMemoryCopiedInPlace) {
  CpuOps ops;
  const size_t bytes = 1000;
  std::unique_ptr<WirePool> pool = ops.wire_pool(3, bytes);
  ASSERT_EQ(pool->depth(), 3);
  EXPECT_EQ(pool->bytes(), bytes);
  EXPECT_EQ(pool->device(), Device::cpu);
  std::set<char*> seen;
  for (int s = 0; s < pool->depth(); ++s) {
    char* d = pool->data(s);
    EXPECT_EQ(d, pool->host(s)) << "a host slot is its own host mirror";
    EXPECT_EQ(reinterpret_cast<uintptr_t>(d) % 256, 0u) << "slot " << s << " is not 256-byte aligned";
    for (size_t i = 0; i < bytes; ++i) d[i] = char(s * 7 + int(i));  // the whole slot is writable
    pool->to_host(s, bytes);
    pool->to_device(s, bytes);
    EXPECT_TRUE(pool->copied(s));
    pool->wait(s);
    for (size_t i = 0; i < bytes; ++i) ASSERT_EQ(d[i], char(s * 7 + int(i))) << "slot " << s << " byte " << i;
    seen.insert(d);
  }
  EXPECT_EQ(seen.size(), 3u) << "slots must not alias";
}

TEST(WirePool, ZeroSlotsIsAnErrorNamingTheKey) {
  try {
    wire_pool_host(0, 64);
    FAIL() << "a pool of 0 slots was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pipeline.hs_queue_depth"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace df
