// The CPU model of BF16 operand rounding (kernels/common/bf16_round.h) that the GPU tests use
// as the BF16 kernels' twin, and the bf16 spelling of the precision switch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "kernels/common/bf16_round.h"
#include "runtime/error.h"
#include "runtime/exec.h"

using namespace cnn;

namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

TEST(Bf16Round, RepresentableValuesStay) {
  for (float f : {0.f, -0.f, 1.f, -2.5f, 0.15625f, 65280.f, 1.f + 1.f / 128})
    EXPECT_EQ(round_to_bf16(f), f) << f;
}

TEST(Bf16Round, NearestTiesToEven) {
  // Between 1 and 1 + 2^-7 (the next BF16 value) the midpoint 1 + 2^-8 goes to the even 1;
  // between 1 + 2^-7 and 1 + 2^-6 the midpoint goes to the even 1 + 2^-6.
  EXPECT_EQ(round_to_bf16(1.f + std::ldexp(1.f, -8)), 1.f);
  EXPECT_EQ(round_to_bf16(1.f + 3 * std::ldexp(1.f, -8)), 1.f + std::ldexp(1.f, -6));
  // Just past the midpoint rounds up, just before it down.
  EXPECT_EQ(round_to_bf16(from_bits(0x3f808001u)), from_bits(0x3f810000u));
  EXPECT_EQ(round_to_bf16(from_bits(0x3f807fffu)), 1.f);
  EXPECT_EQ(round_to_bf16(-1.f - std::ldexp(1.f, -8)), -1.f);
}

// BF16 keeps 8 significant bits (7 stored), so the unit roundoff is 2^-8: half a unit in the
// last place of a value just above a power of two. The bound is reached, not only respected.
TEST(Bf16Round, RelativeErrorAtMostTwoToMinusEight) {
  uint32_t state = 12345;
  double worst = 0;
  for (int i = 0; i < 100000; ++i) {
    state = state * 1664525u + 1013904223u;
    const float f = from_bits((state & 0x807fffffu) | (uint32_t{64 + (state >> 26)} << 23));
    const double r = round_to_bf16(f), rel = std::fabs(r - f) / std::fabs(static_cast<double>(f));
    ASSERT_LE(rel, std::ldexp(1.0, -8)) << f;
    worst = std::max(worst, rel);
  }
  EXPECT_GT(worst, std::ldexp(1.0, -9));
}

TEST(Bf16Round, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(round_to_bf16(inf), inf);
  EXPECT_EQ(round_to_bf16(-inf), -inf);
  EXPECT_TRUE(std::isnan(round_to_bf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isnan(round_to_bf16(from_bits(0x7f800001u))));    // a NaN with low bits only
  EXPECT_EQ(round_to_bf16(std::numeric_limits<float>::max()), inf);  // past BF16's largest
  const float tiny = from_bits(0x00010000u);                         // a BF16 subnormal
  EXPECT_EQ(round_to_bf16(tiny), tiny);
}

TEST(Bf16Precision, ParsesAndNames) {
  EXPECT_EQ(parse_precision("bf16"), Precision::BF16);
  EXPECT_STREQ(precision_name(Precision::BF16), "bf16");
  try {
    parse_precision("fp16");
    FAIL() << "fp16 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp32, tf32, bf16"), std::string::npos) << e.what();
  }
}

}  // namespace
