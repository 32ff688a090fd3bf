// The e4m3fn format (core/fp8.h) against values computed here from its definition: 1 sign, 4 exponent bits
// with bias 7, 3 mantissa bits, subnormals, no infinities, NaN = S.1111.111, max finite 448. Every one of the
// 256 codes is decoded, every finite value encoded back, every midpoint between neighbours rounded, and the
// encoder shown to be the CUDA quantiser's cvt.rn.satfinite.e4m3x2.f32 on every class of f32 input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

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
  // The one canonical NaN code whatever the sign, as the hardware conversion gives.
  EXPECT_EQ(int(f32_to_e4m3(std::numeric_limits<float>::quiet_NaN())), 0x7f);
  EXPECT_EQ(int(f32_to_e4m3(-std::numeric_limits<float>::quiet_NaN())), 0x7f);
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

namespace {

// cvt.rn.satfinite.e4m3x2.f32 from its specification (PTX ISA: round to nearest even; .satfinite clamps what
// lies beyond the largest finite value, infinities included, to ±448; NaN gives NaN, the canonical 0x7f as
// cuda_fp8.hpp's host model of the instruction has it), written with value comparisons only: the codes below
// and above |f| from the table of values, then |f| against their midpoint (at most 5 significant bits,
// exact). The sign bit is f's, so -0 and what underflows from below zero give 0x80.
int hardware_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const int sign = std::signbit(f) ? 0x80 : 0;
  const double a = std::fabs(double(f));
  if (a >= 448.0) return sign | 0x7e;
  static const std::vector<double> value = [] {
    std::vector<double> v;
    for (int c = 0; c <= 0x7e; ++c) v.push_back(e4m3_definition(c));
    return v;
  }();
  int lo = 0, hi = 0x7e;  // value[lo] <= a < value[hi]
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (value[size_t(mid)] <= a ? lo : hi) = mid;
  }
  const double m = (value[size_t(lo)] + value[size_t(hi)]) / 2;
  const int code = a < m ? lo : a > m ? hi : (lo % 2 == 0 ? lo : hi);
  return sign | code;
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

// Every f32 whose top 20 bits (sign, exponent, 11 mantissa bits) take each of their 2^20 values, with the low
// 12 bits at 0, 1, just below and at and above their half, and all ones. The rounding decision of e4m3 (3
// kept mantissa bits, fewer for its subnormals) sits in the top 11 mantissa bits, so this meets every tie
// exactly, one ulp either side of every tie, and every sticky-bit pattern that can matter; with every
// exponent it meets zero, f32 subnormals, the e4m3 subnormal and normal ranges, 448 < |f| < 464 and beyond,
// infinities and NaNs of both signs. Then a million random bit patterns.
TEST(E4m3, EncoderIsTheHardwareConversionOnEveryClassOfInput) {
  int64_t bad = 0;
  auto check = [&](uint32_t u) {
    const float f = from_bits(u);
    const int got = f32_to_e4m3(f), want = hardware_e4m3(f);
    if (got != want && bad++ < 10)
      ADD_FAILURE() << "f32 0x" << std::hex << u << " (" << std::hexfloat << f << "): core/fp8.h 0x" << got
                    << ", cvt.rn.satfinite 0x" << want;
  };
  for (uint32_t hi = 0; hi < (1u << 20); ++hi)
    for (uint32_t lo : {0x000u, 0x001u, 0x7ffu, 0x800u, 0x801u, 0xfffu}) check(hi << 12 | lo);
  std::mt19937 g(5);
  for (int i = 0; i < 1000000; ++i) check(g());
  EXPECT_EQ(bad, 0) << "inputs where core/fp8.h and the hardware conversion differ";
}

// The quantiser's multiplication by the reciprocal (e4m3_quantize) against the division it replaces: never
// more than one code apart (x · rn(1/s) and rn(x/s) are within two f32 ulps), and the amax element of a group
// always maps to ±448 under the scale e4m3_scale gives it, for amax across the whole normal f32 range.
TEST(E4m3, ReciprocalQuantisationStaysWithinOneCodeOfTheDivision) {
  std::mt19937 g(9);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f), frac(-1.0f, 1.0f);
  int64_t moved = 0, total = 0;
  for (int e = -110; e <= 120; ++e) {
    const float amax = std::ldexp(mant(g), e), s = e4m3_scale(amax), inv = e4m3_inv_scale(s);
    ASSERT_EQ(int(e4m3_quantize(amax, inv)), 0x7e) << "amax " << amax << " scale " << s;
    ASSERT_EQ(int(e4m3_quantize(-amax, inv)), 0xfe) << "amax " << -amax << " scale " << s;
    for (int i = 0; i < 2000; ++i) {
      const float x = amax * frac(g);
      const int a = e4m3_quantize(x, inv), b = f32_to_e4m3(x / s);
      // Codes of one sign are ordered by value, so neighbours differ by one (0x00 and 0x80 are both zero).
      const int da = (a & 0x80) ? -(a & 0x7f) : a, db = (b & 0x80) ? -(b & 0x7f) : b;
      ASSERT_LE(std::abs(da - db), 1)
          << "x " << x << " scale " << s << ": 0x" << std::hex << a << " vs 0x" << b;
      moved += a != b;
      ++total;
    }
  }
  std::printf("reciprocal vs division: %lld of %lld codes differ\n", (long long)moved, (long long)total);
  EXPECT_LT(moved * 100, total) << "the reciprocal should move only rare near-midpoint values";
}

// A scale below the smallest normal f32 would have an infinite reciprocal (0 · inf = NaN codes): such groups
// take scale 1, and their codes are zeros of their signs, as with any tiny group.
TEST(E4m3, TinyGroupsTakeScaleOne) {
  for (float amax : {0.0f, std::numeric_limits<float>::denorm_min(), std::ldexp(1.0f, -120),
                     std::nextafter(448.0f * std::numeric_limits<float>::min(), 0.0f)}) {
    EXPECT_EQ(e4m3_scale(amax), 1.0f) << amax;
    EXPECT_EQ(int(e4m3_quantize(amax, e4m3_inv_scale(e4m3_scale(amax)))), 0x00) << amax;
    EXPECT_EQ(int(e4m3_quantize(-amax, e4m3_inv_scale(e4m3_scale(amax)))), 0x80) << amax;
  }
  const float smallest = 448.0f * std::numeric_limits<float>::min();
  EXPECT_EQ(e4m3_scale(smallest), std::numeric_limits<float>::min());
  EXPECT_EQ(int(e4m3_quantize(smallest, e4m3_inv_scale(e4m3_scale(smallest)))), 0x7e);
}
