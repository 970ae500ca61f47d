// The phase geometry of a strided input gradient (kernels/conv/conv2d_dgrad_phase.h), which the
// implicit GEMM's phase launches are built from:
//  - per axis, the (input, tap, output) triples that a phase's q, j enumerate are exactly those of
//    the convolution (o s - p + t == i, all in range), each input index in exactly one phase;
//  - the 2-D phases of known shapes (ResNet's 3x3 and 1x1 stride-2 layers);
//  - an input gradient computed phase by phase with the same index arithmetic as the GPU problem
//    (DgradPhaseProblem in conv2d_igemm.cu: k = (oc, jy, jx), dy[qy + oy0 - jy][qx + ox0 - jx],
//    w[ky0 + sh jy][kx0 + sw jx], tapless phases zero) equals the CPU twin on awkward shapes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_dgrad_phase.h"
#include "runtime/error.h"
#include "tests/conv_test_cases.h"
#include "tests/test_util.h"

using namespace cnn;
using conv_test::conv;
using conv_test::describe_shape;

namespace {

using Triple = std::tuple<int, int, int>;  // (input i, tap t, output o)

std::vector<Triple> conv_triples(int size, int kernel, int stride, int pad) {
  const int out = (size + 2 * pad - kernel) / stride + 1;
  std::vector<Triple> v;
  for (int o = 0; o < out; ++o)
    for (int t = 0; t < kernel; ++t) {
      const int i = o * stride - pad + t;
      if (i >= 0 && i < size) v.emplace_back(i, t, o);
    }
  std::sort(v.begin(), v.end());
  return v;
}

std::vector<Triple> phase_triples(int size, int kernel, int stride, int pad,
                                  std::vector<int>& phase_of_input) {
  const int out = (size + 2 * pad - kernel) / stride + 1;
  std::vector<Triple> v;
  phase_of_input.assign(static_cast<size_t>(size), -1);
  for (int ph = 0; ph < stride; ++ph) {
    const DgradPhaseAxis a = dgrad_phase_axis(size, kernel, stride, pad, ph);
    for (int q = 0; q < a.count; ++q) {
      const int i = ph + stride * q;
      EXPECT_LT(i, size);
      if (i < size) {
        EXPECT_EQ(phase_of_input[i], -1) << "input " << i << " in two phases";
        phase_of_input[i] = ph;
      }
      for (int j = 0; j < a.taps; ++j) {
        const int t = a.first + stride * j;
        EXPECT_LT(t, kernel);
        const int o = q + a.origin - j;
        if (o >= 0 && o < out) v.emplace_back(i, t, o);
      }
    }
    // No tap past the last one: the next would fall outside the kernel.
    EXPECT_GE(a.first + stride * a.taps, kernel);
    EXPECT_GE(ph + stride * a.count, size);
  }
  std::sort(v.begin(), v.end());
  return v;
}

// The input gradient phase by phase, indexed as the GPU's DgradPhaseProblem gathers it.
std::vector<double> dgrad_by_phases(const Conv2dShape& s, const std::vector<double>& dy,
                                    const std::vector<double>& w) {
  const int oh = s.oh(), ow = s.ow(), khw = s.kh * s.kw;
  std::vector<double> dx(static_cast<size_t>(s.n) * s.c * s.h * s.w, NAN);
  for (const DgradPhase& ph : dgrad_phases(s)) {
    for (int n = 0; n < s.n; ++n)
      for (int c = 0; c < s.c; ++c)
        for (int qy = 0; qy < ph.y.count; ++qy)
          for (int qx = 0; qx < ph.x.count; ++qx) {
            double acc = 0;
            for (int k = 0; k < s.oc * ph.taps(); ++k) {
              const int oc = k / ph.taps(), r = k % ph.taps();
              const int jy = r / ph.x.taps, jx = r % ph.x.taps;
              const int oy = qy + ph.y.origin - jy, ox = qx + ph.x.origin - jx;
              if (oy < 0 || oy >= oh || ox < 0 || ox >= ow) continue;
              const int ky = ph.y.first + s.stride_h * jy, kx = ph.x.first + s.stride_w * jx;
              acc += dy[((static_cast<size_t>(n) * s.oc + oc) * oh + oy) * ow + ox] *
                     w[(static_cast<size_t>(oc) * s.c + c) * khw + ky * s.kw + kx];
            }
            const int iy = ph.py + s.stride_h * qy, ix = ph.px + s.stride_w * qx;
            dx[((static_cast<size_t>(n) * s.c + c) * s.h + iy) * s.w + ix] = acc;
          }
  }
  return dx;
}

std::vector<double> random_doubles(size_t n, uint64_t seed) {
  const std::vector<float> f = test::random_vector(n, seed);
  return std::vector<double>(f.begin(), f.end());
}

}  // namespace

TEST(DgradPhase, AxisTriplesMatchTheConvolution) {
  for (int stride = 1; stride <= 4; ++stride)
    for (int kernel = 1; kernel <= 7; ++kernel)
      for (int pad = 0; pad <= 3; ++pad)
        for (int size : {1, 2, 5, 7, 13, 28, 29}) {
          if (size + 2 * pad < kernel) continue;
          SCOPED_TRACE("size " + std::to_string(size) + " kernel " + std::to_string(kernel) +
                       " stride " + std::to_string(stride) + " pad " + std::to_string(pad));
          std::vector<int> phase_of_input;
          EXPECT_EQ(phase_triples(size, kernel, stride, pad, phase_of_input),
                    conv_triples(size, kernel, stride, pad));
          for (int i = 0; i < size; ++i) EXPECT_EQ(phase_of_input[i], i % stride) << i;
        }
}

TEST(DgradPhase, ResnetStrideTwoLayers) {
  // 3x3, stride 2, pad 1, 28x28: four 14x14 phases with 1, 2, 2 and 4 taps.
  const std::vector<DgradPhase> p3 = dgrad_phases(conv(128, 32, 28, 28, 64, 3, 3, 2, 2, 1, 1));
  ASSERT_EQ(p3.size(), 4u);
  const int want_taps[4] = {1, 2, 2, 4};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(p3[i].py, i / 2);
    EXPECT_EQ(p3[i].px, i % 2);
    EXPECT_EQ(p3[i].y.count, 14);
    EXPECT_EQ(p3[i].x.count, 14);
    EXPECT_EQ(p3[i].taps(), want_taps[i]) << "phase " << i;
  }
  EXPECT_EQ(p3[0].y.first, 1);  // even rows: tap 1 only, from output row qy
  EXPECT_EQ(p3[0].y.origin, 0);
  EXPECT_EQ(p3[3].y.first, 0);  // odd rows: taps 0 and 2, from output rows qy + 1 and qy
  EXPECT_EQ(p3[3].y.origin, 1);
  // 1x1, stride 2, pad 0: only the even-even phase has a tap; the other three are zeros.
  const std::vector<DgradPhase> p1 = dgrad_phases(conv(128, 64, 14, 14, 128, 1, 1, 2, 2, 0, 0));
  ASSERT_EQ(p1.size(), 4u);
  EXPECT_EQ(p1[0].taps(), 1);
  for (int i = 1; i < 4; ++i) EXPECT_EQ(p1[i].taps(), 0) << "phase " << i;
  // Odd sizes: 7 rows at stride 3 are phases of 3, 2 and 2 rows; 2x1 strides give 2 phases.
  const std::vector<DgradPhase> p7 = dgrad_phases(conv(1, 1, 7, 13, 1, 5, 3, 3, 1, 2, 0));
  ASSERT_EQ(p7.size(), 3u);
  EXPECT_EQ(p7[0].y.count, 3);
  EXPECT_EQ(p7[1].y.count, 2);
  EXPECT_EQ(p7[2].y.count, 2);
  for (const DgradPhase& ph : p7) EXPECT_EQ(ph.x.count, 13);
}

TEST(DgradPhase, PhasesCoverEveryPixelOnce) {
  const Conv2dShape s = conv(2, 3, 29, 13, 5, 5, 3, 3, 2, 2, 1);
  int pixels = 0;
  for (const DgradPhase& ph : dgrad_phases(s)) pixels += ph.pixels();
  EXPECT_EQ(pixels, s.h * s.w);
}

TEST(DgradPhase, InputGradientByPhasesMatchesTheTwin) {
  const Conv2dShape shapes[] = {
      conv(2, 3, 28, 28, 5, 3, 3, 2, 2, 1, 1),  conv(1, 1, 7, 7, 1, 1, 1, 2, 2, 0, 0),
      conv(3, 17, 13, 29, 3, 5, 5, 2, 2, 2, 2), conv(1, 3, 29, 13, 17, 7, 7, 3, 3, 3, 3),
      conv(2, 1, 13, 7, 3, 2, 2, 2, 2, 0, 1),   conv(1, 3, 28, 13, 1, 3, 3, 2, 1, 0, 2),
      conv(2, 17, 7, 29, 3, 1, 1, 3, 3, 0, 0),  conv(1, 3, 29, 29, 3, 5, 3, 3, 2, 1, 0),
      conv(1, 2, 13, 13, 3, 2, 2, 3, 3, 3, 0),
  };
  for (const Conv2dShape& s : shapes) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("shape " + std::to_string(s.n) + "x" + std::to_string(s.c) + "x" +
                 std::to_string(s.h) + "x" + std::to_string(s.w) + " oc " + std::to_string(s.oc) +
                 " k " + std::to_string(s.kh) + "x" + std::to_string(s.kw) + " stride " +
                 std::to_string(s.stride_h) + "x" + std::to_string(s.stride_w) + " seed " +
                 std::to_string(seed));
    const std::vector<double> dy =
        random_doubles(static_cast<size_t>(s.n) * s.oc * s.oh() * s.ow(), seed);
    const std::vector<double> w =
        random_doubles(static_cast<size_t>(s.oc) * s.c * s.kh * s.kw, seed + 1);
    std::vector<double> want(static_cast<size_t>(s.n) * s.c * s.h * s.w);
    conv2d_backward_data_cpu(s, dy.data(), w.data(), want.data());
    const std::vector<double> got = dgrad_by_phases(s, dy, w);
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
    EXPECT_LE(worst, 1e-12);  // only the order of the double sums differs (NaN fails too)
  }
}

TEST(DgradPhase, RejectsAPhaseOutsideTheStride) {
  try {
    dgrad_phase_axis(7, 3, 2, 1, 2);
    FAIL() << "phase 2 of stride 2 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("phase 2 of stride 2"), std::string::npos) << e.what();
  }
}
