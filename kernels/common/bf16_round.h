#pragma once
// BF16 operand rounding on the CPU, bit for bit what the GPU's cvt.rn.bf16x2.f32 does before a
// BF16 mma.sync (round to nearest, ties to even, 8-bit significand; NaN stays NaN, overflow
// becomes infinity). The tests round a problem's operands with it and run the CPU twin on the
// result, so a BF16 kernel is compared with the exact products it computes, and only the FP32
// summation order separates the two.
#include <cstdint>
#include <cstring>
#include <vector>

namespace cnn {

inline float round_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    u |= 0x00400000u;  // NaN: keep it a (quiet) NaN after the low bits go
  } else {
    u += 0x7fffu + ((u >> 16) & 1u);  // ties go to the even upper half
  }
  u &= 0xffff0000u;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline std::vector<float> round_to_bf16(std::vector<float> v) {
  for (float& x : v) x = round_to_bf16(x);
  return v;
}

}  // namespace cnn
