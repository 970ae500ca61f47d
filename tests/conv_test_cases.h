#pragma once
// The convolution cases the wgmma convolution tests share (gpu_conv_wgmma*.cpp): a shape
// builder, the two passes, and the two kinds of operand values (small integers, whose products
// and sums every precision represents exactly, and uniform random values).
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "tests/test_util.h"

namespace cnn::conv_test {

enum class Fill { Random, SmallInt };
enum class Pass { Forward, BackwardData };

struct ConvCase {
  Conv2dShape s;
  bool bias = false, relu = false;  // forward only
};

inline Conv2dShape conv(int n, int c, int h, int w, int oc, int kh, int kw, int sh, int sw, int ph,
                        int pw) {
  Conv2dShape s;
  s.n = n, s.c = c, s.h = h, s.w = w, s.oc = oc, s.kh = kh, s.kw = kw;
  s.stride_h = sh, s.stride_w = sw, s.pad_h = ph, s.pad_w = pw;
  return s;
}

// n values: uniform in [-1, 1) (Random) or integers in [-2, 2] (SmallInt), from `seed`.
inline std::vector<float> make_values(size_t n, Fill fill, uint64_t seed) {
  if (fill == Fill::Random) return test::random_vector(n, seed);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> d(-2, 2);
  std::vector<float> v(n);
  for (auto& x : v) x = static_cast<float>(d(rng));
  return v;
}

}  // namespace cnn::conv_test
