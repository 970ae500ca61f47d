// The int8 average pool's CPU twin (kernels/quant/qavgpool.h): round half to even of the exact
// window mean on hand-picked windows (ties, negatives, padding, saturation, ReLU), the padded
// channels written as zero, and, on random inputs of awkward shapes, the requantized mean within
// half a step of the float pool's mean of the dequantized inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/pool/avgpool.h"
#include "kernels/quant/qavgpool.h"
#include "kernels/quant/qconv.h"
#include "runtime/error.h"
#include "tests/test_util.h"

namespace cnn {
namespace {

// One 2x2 window (stride 2) over one channel: the four values, x (1, 2, 2, 4) with channel 0 set.
int pool_one(std::vector<int> window, float mult, bool relu) {
  QAvgPoolShape s;
  s.n = 1, s.h = 2, s.w = 2, s.c = 1, s.cp = 4;
  std::vector<int8_t> x(16, 0), y(4, int8_t(99));
  for (int i = 0; i < 4; ++i) x[size_t(i) * 4] = int8_t(window[size_t(i)]);
  qavgpool_forward(s, x.data(), mult, relu, y.data(), Exec{});
  for (int c = 1; c < 4; ++c) EXPECT_EQ(y[size_t(c)], 0) << "padding channel " << c;
  return y[0];
}

TEST(QAvgPool, RoundsTheMeanHalfToEven) {
  EXPECT_EQ(pool_one({1, 1, 0, 0}, 0.25f, false), 0);               // 0.5 -> 0
  EXPECT_EQ(pool_one({3, 3, 0, 0}, 0.25f, false), 2);               // 1.5 -> 2
  EXPECT_EQ(pool_one({5, 5, 0, 0}, 0.25f, false), 2);               // 2.5 -> 2
  EXPECT_EQ(pool_one({1, 1, 1, 0}, 0.25f, false), 1);               // 0.75 -> 1
  EXPECT_EQ(pool_one({-3, -3, 0, 0}, 0.25f, false), -2);            // -1.5 -> -2
  EXPECT_EQ(pool_one({-3, -3, 0, 0}, 0.25f, true), 0);              // ReLU
  EXPECT_EQ(pool_one({127, 127, 127, 127}, 3.f, false), 127);       // saturates
  EXPECT_EQ(pool_one({-127, -127, -127, -127}, 3.f, false), -127);  // never -128
  EXPECT_EQ(pool_one({10, 20, 30, 40}, 0.125f, false), 12);         // 100 / 8 = 12.5 -> 12
}

TEST(QAvgPool, PaddedZerosCountInTheMean) {
  // 3x3 window, stride 1, padding 1 over a 2x2 image of 9s: every window holds 4 real values.
  QAvgPoolShape s;
  s.n = 1, s.h = 2, s.w = 2, s.c = 1, s.cp = 4, s.kh = s.kw = 3, s.stride_h = s.stride_w = 1;
  s.pad_h = s.pad_w = 1;
  ASSERT_EQ(s.oh(), 2);
  std::vector<int8_t> x(16, 0), y(16, int8_t(99));
  for (int i = 0; i < 4; ++i) x[size_t(i) * 4] = 9;
  qavgpool_forward(s, x.data(), 1.f / 9.f, false, y.data(), Exec{});
  for (int i = 0; i < 4; ++i) EXPECT_EQ(y[size_t(i) * 4], 4) << i;  // 36 / 9
}

TEST(QAvgPool, WithinHalfAStepOfTheFloatPool) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> d(-127, 127);
  std::uniform_real_distribution<float> scale(0.01f, 0.2f);
  struct Case {
    int n, h, w, c, k, stride, pad;
  };
  for (const Case& k :
       {Case{2, 7, 5, 3, 2, 2, 0}, Case{3, 9, 11, 10, 3, 2, 1}, Case{1, 1, 1, 1, 1, 1, 0},
        Case{2, 6, 9, 6, 5, 1, 2}, Case{1, 8, 8, 4, 8, 8, 0}})
    for (bool relu : {false, true}) {
      QAvgPoolShape s;
      s.n = k.n, s.h = k.h, s.w = k.w, s.c = k.c, s.cp = round_up4(k.c);
      s.kh = s.kw = k.k, s.stride_h = s.stride_w = k.stride, s.pad_h = s.pad_w = k.pad;
      const float s_in = scale(rng), s_out = scale(rng);
      const float mult = float(double(s_in) / (double(s_out) * k.k * k.k));
      std::vector<int8_t> x(size_t(s.n) * s.h * s.w * s.cp, 0);
      std::vector<float> xf(size_t(s.n) * s.c * s.h * s.w);  // NCHW, dequantized
      for (int i = 0; i < s.n; ++i)
        for (int r = 0; r < s.h; ++r)
          for (int q = 0; q < s.w; ++q)
            for (int c = 0; c < s.c; ++c) {
              const int v = d(rng);
              x[((size_t(i) * s.h + r) * s.w + q) * s.cp + c] = int8_t(v);
              xf[((size_t(i) * s.c + c) * s.h + r) * s.w + q] = float(v) * s_in;
            }
      std::vector<int8_t> y(size_t(s.n) * s.oh() * s.ow() * s.cp, int8_t(99));
      qavgpool_forward(s, x.data(), mult, relu, y.data(), Exec{});
      AvgPoolShape p;
      p.n = s.n, p.c = s.c, p.h = s.h, p.w = s.w, p.kh = p.kw = k.k;
      p.stride_h = p.stride_w = k.stride, p.pad_h = p.pad_w = k.pad;
      std::vector<float> ref(size_t(s.n) * s.c * s.oh() * s.ow());
      avgpool_forward_cpu(p, xf.data(), ref.data());
      size_t bad = 0, padding = 0;
      for (int i = 0; i < s.n; ++i)
        for (int r = 0; r < s.oh(); ++r)
          for (int q = 0; q < s.ow(); ++q)
            for (int c = 0; c < s.cp; ++c) {
              const int8_t got = y[((size_t(i) * s.oh() + r) * s.ow() + q) * s.cp + c];
              if (c >= s.c) {
                padding += got != 0;
                continue;
              }
              double want = ref[((size_t(i) * s.c + c) * s.oh() + r) * s.ow() + q] / s_out;
              if (relu) want = std::max(want, 0.0);
              want = std::min(127.0, std::max(-127.0, want));
              bad += std::fabs(double(got) - want) > 0.5 + 1e-4;
            }
      EXPECT_EQ(bad, 0u) << "k" << k.k << " stride " << k.stride << " pad " << k.pad;
      EXPECT_EQ(padding, 0u);
    }
}

TEST(QAvgPool, RefusesBadWindowsByName) {
  QAvgPoolShape s;
  s.h = s.w = 4, s.kh = s.kw = 2, s.pad_h = 2;
  std::vector<int8_t> x(64), y(64);
  try {
    qavgpool_forward(s, x.data(), 1.f, false, y.data(), Exec{});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(test::contains(e.what(), "padding at most half the window")) << e.what();
  }
}

}  // namespace
}  // namespace cnn
