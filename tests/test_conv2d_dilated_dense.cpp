// A stride-1 dilated convolution on the dense kernels (conv2d_dilated_dense.h) on the CPU: the
// phase layout's index map and round trip, the composition against the grouped reference loops
// (forward with bias and ReLU, input gradient, weight gradient accumulating) on dilations 2 and 3,
// unequal ones and paddings from 0 to beyond the dilation, the shapes it refuses, which passes
// wgmma-nhwc runs on the dilated shape itself, and a gradient check through the layer. The GPU side
// is gpu_conv2d_dilated_dense.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/conv/conv2d_dilated_dense.h"
#include "kernels/conv/conv2d_dilation_phases.h"
#include "kernels/conv/conv2d_grouped.h"
#include "kernels/conv/conv2d_grouped_dense.h"
#include "layers/gradcheck/gradcheck.h"
#include "layers/layer_spec.h"
#include "runtime/error.h"
#include "tests/grouped_conv_test_check.h"
#include "tests/test_util.h"

using namespace cnn;

TEST(DilationPhases, SplitPlacesEveryPixelAndMergeReadsItBack) {
  // A 5x7 image at dilation 2x3 with origin (1, 2): phases of 3x3 cover 6 >= 5 + 1, 9 >= 7 + 2.
  const DilationPhases p{2, 3, 5, 7, 2, 3, 1, 2, 3, 3};
  std::vector<float> image(size_t(p.image_floats())), phases(size_t(p.phase_floats()), -1.f);
  for (size_t i = 0; i < image.size(); ++i) image[i] = float(i + 1);
  dilation_phase_split(p, image.data(), phases.data(), Exec{});
  size_t inside = 0;
  for (int rh = 0; rh < 2; ++rh)
    for (int rw = 0; rw < 3; ++rw)
      for (int n = 0; n < 2; ++n)
        for (int c = 0; c < 3; ++c)
          for (int j = 0; j < 3; ++j)
            for (int k = 0; k < 3; ++k) {
              const int i = 2 * j + rh - 1, l = 3 * k + rw - 2;
              const float got = phases[size_t(((((rh * 3 + rw) * 2 + n) * 3 + c) * 3 + j) * 3 + k)];
              const bool in = i >= 0 && i < 5 && l >= 0 && l < 7;
              inside += in;
              EXPECT_EQ(got, in ? image[size_t(((n * 3 + c) * 5 + i) * 7 + l)] : 0.f)
                  << rh << rw << " " << n << c << " " << j << k;
            }
  EXPECT_EQ(inside, image.size());  // each pixel in exactly one phase
  std::vector<float> back(image.size(), -1.f);
  dilation_phase_merge(p, phases.data(), back.data(), Exec{});
  EXPECT_EQ(back, image);
  // Phases that do not cover the image are refused.
  const DilationPhases short_p{2, 3, 5, 7, 2, 3, 1, 2, 2, 3};
  EXPECT_THROW(dilation_phase_split(short_p, image.data(), phases.data(), Exec{}), Error);
}

TEST(Conv2dDilatedDense, TakesStrideOneOneGroupDilatedOnly) {
  EXPECT_TRUE(
      conv2d_dilated_dense_applicable(grouped_test::dilated_shape(1, 4, 9, 9, 4, 3, 2, 2, 2, 2)));
  EXPECT_TRUE(
      conv2d_dilated_dense_applicable(grouped_test::dilated_shape(1, 4, 9, 9, 4, 3, 1, 0, 1, 3)));
  EXPECT_FALSE(
      conv2d_dilated_dense_applicable(grouped_test::dilated_shape(1, 4, 9, 9, 4, 3, 1, 1, 1, 1)));
  Conv2dGroupedShape strided = grouped_test::dilated_shape(1, 4, 9, 9, 4, 3, 2, 2, 2, 2);
  strided.stride_h = strided.stride_w = 2;
  EXPECT_FALSE(conv2d_dilated_dense_applicable(strided));
  Conv2dGroupedShape grouped = grouped_test::dilated_shape(1, 4, 9, 9, 4, 3, 2, 2, 2, 2);
  grouped.groups = 2;
  EXPECT_FALSE(conv2d_dilated_dense_applicable(grouped));
  std::vector<float> x(4 * 81), w(4 * 2 * 9), y(4 * 81), scratch(100000);
  try {
    conv2d_grouped_forward(grouped, x.data(), w.data(), nullptr, y.data(), false, scratch.data(),
                           Algo::Igemm, Exec{});
    ADD_FAILURE() << "grouped dilated accepted by the dense variants";
  } catch (const Error& e) {
    EXPECT_TRUE(test::contains(e.what(), "dilation 2x2")) << e.what();
  }
  // The phase convolution: 9 + 2 * 2 = 13 rows in 2 phases of 7, no padding, batch 4.
  const Conv2dShape d =
      conv2d_dilated_phase_shape(grouped_test::dilated_shape(1, 4, 9, 9, 4, 3, 2, 2, 2, 2));
  EXPECT_EQ(d.n, 4);
  EXPECT_EQ(d.h, 7);
  EXPECT_EQ(d.pad_h, 0);
  EXPECT_EQ(d.oh(), 5);
}

// Which passes wgmma-nhwc runs on the dilated shape itself (no phases, the dense pass's
// scratch only) and which stay on the phases: host predicates, the same on any machine.
TEST(Conv2dDilatedDense, WgmmaNhwcReadsDilatedTapsWhereItCan) {
  const Conv2dGroupedShape s = grouped_test::dilated_shape(2, 64, 16, 16, 64, 3, 2, 2, 2, 2);
  const Conv2dShape d = conv2d_grouped_as_dense(s);
  EXPECT_EQ(d.dil_h, 2);
  EXPECT_EQ(d.oh(), 16);
  grouped_test::expect_every_pass_runs_directly(s);
  Exec ex;  // the cases below, at BF16
  ex.device = Device::CUDA;
  ex.precision = Precision::BF16;
  // Nowhere on the CPU, nor for a strided input gradient or a shape the TMA cannot express.
  EXPECT_FALSE(conv2d_forward_runs_directly(d, Algo::WgmmaNhwc, Exec{}));
  Conv2dShape strided = d;
  strided.stride_h = 2;
  EXPECT_TRUE(conv2d_forward_runs_directly(strided, Algo::WgmmaNhwc, ex));
  EXPECT_FALSE(conv2d_backward_data_runs_directly(strided, Algo::WgmmaNhwc, ex));
  Conv2dShape far = d;
  far.h = far.w = 300, far.dil_h = 64;
  EXPECT_FALSE(conv2d_forward_runs_directly(far, Algo::WgmmaNhwc, ex));
  // The other variants refuse a dilated dense shape in one line naming the dilation.
  std::vector<float> x(size_t(2) * 64 * 256), w(size_t(64) * 64 * 9), y(x.size());
  try {
    conv2d_forward(d, x.data(), w.data(), nullptr, y.data(), false, nullptr, Algo::Naive, Exec{});
    ADD_FAILURE() << "a dilated dense shape was taken on the CPU";
  } catch (const Error& e) {
    EXPECT_TRUE(test::contains(e.what(), "dilation 2x2")) << e.what();
  }
}

TEST(Conv2dDilatedDense, MatchesTheReferenceOnCpu) {
  const Conv2dGroupedShape shapes[] = {
      grouped_test::dilated_shape(2, 5, 9, 11, 7, 3, 2, 2, 2, 2),   // "same" at dilation 2
      grouped_test::dilated_shape(1, 3, 13, 10, 4, 3, 3, 3, 3, 3),  // dilation 3
      grouped_test::dilated_shape(2, 4, 8, 12, 6, 3, 1, 0, 2,
                                  3),  // unequal dilations, padding below them
      grouped_test::dilated_shape(1, 6, 12, 12, 5, 5, 0, 5, 2,
                                  2),  // 5x5, no padding on H, beyond the span on W
      grouped_test::dilated_shape(3, 2, 7, 7, 3, 2, 1, 1, 2, 2)};  // even kernel
  for (const Conv2dGroupedShape& s : shapes) {
    SCOPED_TRACE("C" + std::to_string(s.c) + " " + std::to_string(s.h) + "x" + std::to_string(s.w) +
                 " k" + std::to_string(s.kh) + " p" + std::to_string(s.pad_h) + "x" +
                 std::to_string(s.pad_w) + " d" + std::to_string(s.dil_h) + "x" +
                 std::to_string(s.dil_w));
    const std::size_t nx = std::size_t(s.n) * s.c * s.h * s.w;
    const std::size_t ny = std::size_t(s.n) * s.oc * s.oh() * s.ow();
    const std::size_t nw = std::size_t(s.oc) * s.c * s.kh * s.kw;
    const std::vector<float> x = test::random_vector(nx, 1), w = test::random_vector(nw, 2),
                             b = test::random_vector(s.oc, 3), dy = test::random_vector(ny, 4),
                             dw0 = test::random_vector(nw, 5), db0 = test::random_vector(s.oc, 6);
    std::vector<float> scratch(
        std::max({conv2d_grouped_forward_scratch_floats(s, Algo::Igemm, {}),
                  conv2d_grouped_backward_data_scratch_floats(s, Algo::Igemm, {}),
                  conv2d_grouped_backward_weight_scratch_floats(s, Algo::Igemm, {})}));
    ASSERT_GT(scratch.size(), 0u);
    std::vector<float> y(ny), y_ref(ny), dx(nx), dx_ref(nx);
    conv2d_grouped_forward(s, x.data(), w.data(), b.data(), y.data(), true, scratch.data(),
                           Algo::Igemm, Exec{});
    conv2d_grouped_forward_cpu(s, x.data(), w.data(), b.data(), y_ref.data(), true);
    grouped_test::expect_near_all(y, y_ref, "forward");
    conv2d_grouped_backward_data(s, dy.data(), w.data(), dx.data(), scratch.data(), Algo::Igemm,
                                 Exec{});
    conv2d_grouped_backward_data_cpu(s, dy.data(), w.data(), dx_ref.data());
    grouped_test::expect_near_all(dx, dx_ref, "input gradient");
    std::vector<float> dw = dw0, db = db0, dw_ref = dw0, db_ref = db0;
    conv2d_grouped_backward_weight(s, x.data(), dy.data(), dw.data(), db.data(), scratch.data(),
                                   Algo::Igemm, Exec{});
    conv2d_grouped_backward_weight_cpu(s, x.data(), dy.data(), dw_ref.data(), db_ref.data());
    grouped_test::expect_near_all(dw, dw_ref, "weight gradient");
    grouped_test::expect_near_all(db, db_ref, "bias gradient");
  }
}

// Through the layer: a dilated convolution configured `algo: igemm` in a float Network on the
// CPU against the double numerical gradient.
TEST(Conv2dDilatedDense, FloatNetworkGradcheckOnCpu) {
  LayerSpec conv = conv2d_spec("conv", 5, 3, 3, 1, 2);
  conv.dil_h = conv.dil_w = 2;
  conv.algo = Algo::Igemm;
  GradcheckOptions o;
  o.seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(o.seed));
  const GradcheckResult r =
      gradcheck_network(test::conv_in_small_net(conv, 4), {4, 7, 8}, o, Exec{}, true);
  EXPECT_TRUE(r.passed()) << format_gradcheck(r);
}
