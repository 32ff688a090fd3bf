// The e4m3fn format (core/fp8.h) against values computed here from its definition: 1 sign, 4 exponent bits
// with bias 7, 3 mantissa bits, subnormals, no infinities, NaN = S.1111.111, max finite 448. Every one of the
// 256 codes is decoded, every finite value encoded back, and every midpoint between neighbours rounded.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/fp8.h"

using namespace df;

namespace {

// The value a code stands for, straight from the definition, in double.
double e4m3_definition(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m / 8.0, 1 - 7) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}

bool is_nan_code(int code) {
  return (code & 0x7f) == 0x7f;
}

}  // namespace

TEST(E4m3, DecodesEveryCodeExactly) {
  for (int c = 0; c < 256; ++c) {
    const float f = e4m3_to_f32(static_cast<uint8_t>(c));
    const double want = e4m3_definition(c);
    if (is_nan_code(c)) {
      EXPECT_TRUE(std::isnan(f)) << "code 0x" << std::hex << c;
      continue;
    }
    EXPECT_EQ(double(f), want) << "code 0x" << std::hex << c;
    EXPECT_EQ(std::signbit(f), c >= 0x80) << "code 0x" << std::hex << c;  // -0 is 0x80
  }
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0xfe), -448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
  EXPECT_EQ(e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
}

TEST(E4m3, EncodesEveryFiniteValueBackToItsCode) {
  for (int c = 0; c < 256; ++c) {
    if (is_nan_code(c)) continue;
    EXPECT_EQ(int(f32_to_e4m3(e4m3_to_f32(static_cast<uint8_t>(c)))), c) << "code 0x" << std::hex << c;
  }
  EXPECT_TRUE(is_nan_code(f32_to_e4m3(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(is_nan_code(f32_to_e4m3(-std::numeric_limits<float>::quiet_NaN())));
}

// Codes 0x00..0x7e are the non-negative finite values in increasing order, so neighbours are c and c + 1;
// their midpoint (at most 5 significant bits: exact in f32) goes to the one with an even mantissa, which
// is the even code, and anything off the midpoint goes to the nearer one.
TEST(E4m3, MidpointsRoundToEvenAndNeighboursToNearest) {
  for (int c = 0; c < 0x7e; ++c) {
    const double a = e4m3_definition(c), b = e4m3_definition(c + 1);
    ASSERT_LT(a, b) << "code 0x" << std::hex << c;
    const float mid = static_cast<float>((a + b) / 2);
    ASSERT_EQ(double(mid), (a + b) / 2);
    const int even = (c % 2 == 0) ? c : c + 1;
    EXPECT_EQ(int(f32_to_e4m3(mid)), even) << "midpoint of codes 0x" << std::hex << c << ", 0x" << c + 1;
    EXPECT_EQ(int(f32_to_e4m3(-mid)), even | 0x80) << "negative midpoint of 0x" << std::hex << c;
    EXPECT_EQ(int(f32_to_e4m3(std::nextafter(mid, 0.0f))), c) << "below midpoint of 0x" << std::hex << c;
    EXPECT_EQ(int(f32_to_e4m3(std::nextafter(mid, 1e9f))), c + 1) << "above midpoint of 0x" << std::hex << c;
  }
}

TEST(E4m3, SaturatesAtMaxFinite) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float v :
       {448.0f * (1.0f + 1.0f / 16), 464.0f, 480.0f, 1e30f, std::numeric_limits<float>::max(), inf}) {
    EXPECT_EQ(int(f32_to_e4m3(v)), 0x7e) << v;
    EXPECT_EQ(int(f32_to_e4m3(-v)), 0xfe) << -v;
  }
  EXPECT_EQ(int(f32_to_e4m3(std::nextafter(448.0f, 0.0f))), 0x7e);  // rounds to 448 from below as well
}

TEST(E4m3, UnderflowsToZeroBelowHalfTheSmallestSubnormal) {
  const float tiny = std::ldexp(1.0f, -9), half = std::ldexp(1.0f, -10);
  EXPECT_EQ(int(f32_to_e4m3(tiny)), 0x01);
  EXPECT_EQ(int(f32_to_e4m3(half)), 0x00);  // a tie: 0 is even
  EXPECT_EQ(int(f32_to_e4m3(-half)), 0x80);
  EXPECT_EQ(int(f32_to_e4m3(std::nextafter(half, 1.0f))), 0x01);
  for (float v : {std::nextafter(half, 0.0f), std::ldexp(1.0f, -11), 1e-30f,
                  std::numeric_limits<float>::denorm_min()}) {
    EXPECT_EQ(int(f32_to_e4m3(v)), 0x00) << v;
    EXPECT_EQ(int(f32_to_e4m3(-v)), 0x80) << -v;
  }
  EXPECT_EQ(int(f32_to_e4m3(0.0f)), 0x00);
  EXPECT_EQ(int(f32_to_e4m3(-0.0f)), 0x80);
}
