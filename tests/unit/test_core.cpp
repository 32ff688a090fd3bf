// Core pieces: bf16 rounding, tensor views, arena planning, the error message format and counted nouns.
#include <gtest/gtest.h>

#include <cmath>

#include "core/arena.h"
#include "core/count_noun.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"

using namespace df;

TEST(Dtype, Bf16RoundsToNearestEven) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  // 1 + 2^-8 is exactly halfway between two bf16 values: ties go to the even mantissa (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3·2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even): rounds up to even.
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(NAN))));
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(-2.5f)), -2.5f);
}

TEST(Dtype, F16Decodes) {
  EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
}

TEST(Tensor, ViewsShareMemoryAndCheckBounds) {
  float buf[12];
  for (int i = 0; i < 12; ++i) buf[i] = float(i);
  Tensor t = tensor_make(buf, DType::f32, Device::cpu, 3, 4);
  Tensor c = t.cols_view(1, 2);
  EXPECT_EQ(c.stride, 4);
  EXPECT_FALSE(c.contiguous());
  EXPECT_EQ(reinterpret_cast<float*>(c.row_bytes(2))[1], 10.0f);
  EXPECT_THROW(t.cols_view(3, 2), Error);
  EXPECT_THROW(t.rows_view(2, 2), Error);
  EXPECT_THROW(c.reshape(2, 3), Error);
  EXPECT_EQ(t.reshape(2, 6).cols, 6);
}

TEST(Arena, CountingPlanMatchesRealAllocation) {
  Arena plan(nullptr, 0, Device::cpu);
  plan.alloc(DType::f32, 7, 3);
  plan.alloc(DType::bf16, 5, 5);
  size_t need = plan.high_water();
  HostBuffer buf(need);
  Arena real(buf.data(), buf.size(), Device::cpu);
  Tensor a = real.alloc(DType::f32, 7, 3);
  Tensor b = real.alloc(DType::bf16, 5, 5);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data) % Arena::kAlign, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data) % Arena::kAlign, 0u);
  EXPECT_EQ(real.high_water(), need);
  EXPECT_THROW(real.alloc(DType::f32, 1, 1), Error);
}

TEST(Error, MessageNamesFileAndLine) {
  try {
    DF_CHECK(1 == 2, "value %d is wrong", 7);
    FAIL() << "no throw";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("test_core.cpp:"), std::string::npos) << m;
    EXPECT_NE(m.find("value 7 is wrong"), std::string::npos) << m;
    EXPECT_NE(m.find("1 == 2"), std::string::npos) << m;
  }
}

TEST(CountNoun, AgreesWithItsCount) {
  EXPECT_EQ(count_noun(1, "drafter"), "1 drafter");
  EXPECT_EQ(count_noun(2, "drafter"), "2 drafters");
  EXPECT_EQ(count_noun(0, "target"), "0 targets");
  EXPECT_EQ(count_noun(1, "micro-batch", "micro-batches"), "1 micro-batch");
  EXPECT_EQ(count_noun(12, "micro-batch", "micro-batches"), "12 micro-batches");
}
