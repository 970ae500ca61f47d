// The explicit copies and col2im gather of the input gradient on one GEMM
// (kernels/conv/conv2d_dgrad_col2im.h), on the CPU: the twins' dyt and wt multiplied
// (cols = wt dyt^T) and gathered give the reference input gradient conv2d_backward_data_cpu, on
// strided, padded, 1x1 and odd-channel shapes whose OC and N*OH*OW are not multiples of 4 (the
// row strides' padding); and the row strides. The device kernels against these twins:
// tests/gpu_conv_dgrad_col2im.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_dgrad_col2im.h"
#include "kernels/gemm/gemm_cpu.h"
#include "tests/conv_test_cases.h"
#include "tests/gemm_error_measure.h"
#include "tests/test_util.h"

using namespace cnn;
using conv_test::conv;
using conv_test::describe_shape;

TEST(ConvDgradCol2im, RowStridesRoundUpToFour) {
  const Conv2dShape s = conv(3, 2, 3, 3, 5, 3, 3, 1, 1, 1, 1);  // 27 pixels, 5 channels
  EXPECT_EQ(conv2d_dgrad_col2im_ld_pix(s), 28);
  EXPECT_EQ(conv2d_dgrad_col2im_ld_oc(s), 8);
  const Conv2dShape r18 = conv(128, 256, 8, 8, 512, 3, 3, 2, 2, 1, 1);
  EXPECT_EQ(conv2d_dgrad_col2im_ld_pix(r18), 2048);
  EXPECT_EQ(conv2d_dgrad_col2im_ld_oc(r18), 512);
}

TEST(ConvDgradCol2im, TwinsGiveTheReferenceGradient) {
  const Conv2dShape shapes[] = {
      conv(3, 5, 4, 4, 7, 3, 3, 1, 1, 1, 1),  // 48 pixels, 7 channels
      conv(3, 6, 8, 8, 9, 3, 3, 2, 2, 1, 1),  // stride 2: 4x4 output, every dx pixel 1-4 taps
      conv(2, 6, 7, 5, 9, 3, 3, 2, 2, 1, 1),  // stride 2, odd sizes: 4x3
      conv(5, 4, 3, 3, 6, 3, 3, 1, 1, 1, 1),  // 45 pixels: a padded row stride
      conv(2, 8, 6, 6, 3, 1, 1, 2, 2, 0, 0),  // 1x1 stride 2: dx zero off the grid
      conv(2, 3, 5, 6, 4, 5, 3, 1, 2, 2, 0),  // 5x3, mixed strides and paddings
      conv(2, 3, 7, 7, 5, 2, 2, 3, 3, 0, 0),  // stride 3 > kernel: rows no tap reaches
  };
  for (const Conv2dShape& s : shapes) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(describe_shape(s) + " seed " + std::to_string(seed));
    const conv_test::ConvOperands ops =
        conv_test::make_operands(conv_test::Pass::BackwardData, s, test::Fill::Random, seed);
    const std::vector<float>& dy = ops.in;
    const std::vector<float>& w = ops.w;
    const int64_t ld_oc = conv2d_dgrad_col2im_ld_oc(s), ld_pix = conv2d_dgrad_col2im_ld_pix(s);
    const int64_t ckk = int64_t{s.c} * s.kh * s.kw, k = int64_t{s.n} * s.oh() * s.ow();
    // The padding columns stay NaN: a read of them would show in dx.
    std::vector<float> dyt(size_t(k * ld_oc), NAN), wt(size_t(ckk * ld_oc), NAN);
    conv2d_dgrad_col2im_copies_cpu(s, dy.data(), w.data(), dyt.data(), wt.data());
    std::vector<float> cols(size_t(ckk * ld_pix), NAN);
    gemm_cpu(false, true, ckk, k, s.oc, 1.f, wt.data(), ld_oc, dyt.data(), ld_oc, 0.f, cols.data(),
             ld_pix);
    std::vector<float> dx(size_t(s.n) * s.c * s.h * s.w, NAN), dx_ref(dx.size(), NAN);
    conv2d_dgrad_col2im_gather_cpu(s, cols.data(), dx.data());
    conv2d_backward_data_cpu(s, dy.data(), w.data(), dx_ref.data());
    EXPECT_LE(test::rel_to_max(dx, dx_ref, test::typical(int64_t{s.oc} * s.kh * s.kw)), 1e-5);
  }
}
