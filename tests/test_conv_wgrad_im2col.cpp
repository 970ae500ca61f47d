// The explicit copies of the weight gradient on one GEMM (kernels/conv/conv2d_wgrad_im2col.h),
// on the CPU: the twin's cols and dyk multiplied (dw += dyk cols^T, db += row sums of dyk) give
// the reference weight gradient conv2d_backward_weight_cpu, on strided, padded and 1x1 shapes with
// a batch whose N*OH*OW is not a multiple of 4 (the row stride's padding); and the row stride.
// The device copies against this twin: tests/gpu_conv_wgrad_im2col.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_wgrad_im2col.h"
#include "kernels/gemm/gemm_cpu.h"
#include "tests/conv_test_cases.h"
#include "tests/gemm_error_measure.h"
#include "tests/test_util.h"

using namespace cnn;
using conv_test::conv;
using conv_test::describe_shape;

TEST(ConvWgradIm2col, RowStrideRoundsTheBatchsPixelsUpToFour) {
  EXPECT_EQ(conv2d_wgrad_im2col_ld(conv(3, 2, 3, 3, 2, 3, 3, 1, 1, 1, 1)), 28);  // 27 pixels
  EXPECT_EQ(conv2d_wgrad_im2col_ld(conv(128, 512, 4, 4, 512, 3, 3, 1, 1, 1, 1)), 2048);
  EXPECT_EQ(conv2d_wgrad_im2col_ld(conv(1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0)), 4);
}

TEST(ConvWgradIm2col, TwinsCopiesGiveTheReferenceGradient) {
  const Conv2dShape shapes[] = {
      conv(3, 5, 4, 4, 7, 3, 3, 1, 1, 1, 1),  // 48 pixels
      conv(3, 6, 7, 5, 9, 3, 3, 2, 2, 1, 1),  // stride 2: 4x3 output, 36 pixels
      conv(5, 4, 3, 3, 6, 3, 3, 1, 1, 1, 1),  // 45 pixels: a padded row stride
      conv(2, 8, 6, 6, 3, 1, 1, 2, 2, 0, 0),  // 1x1 stride 2
      conv(2, 3, 5, 6, 4, 5, 3, 1, 2, 2, 0),  // 5x3, mixed strides and paddings
  };
  for (const Conv2dShape& s : shapes) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(describe_shape(s) + " seed " + std::to_string(seed));
    const conv_test::WgradProblem pr = conv_test::make_wgrad_problem(s, seed);
    const std::vector<float>&x = pr.x, &dy = pr.dy;
    const int64_t ld = conv2d_wgrad_im2col_ld(s), ckk = int64_t{s.c} * s.kh * s.kw;
    const int64_t k = int64_t{s.n} * s.oh() * s.ow();
    std::vector<float> cols(size_t(ckk * ld), NAN), dyk(size_t(s.oc * ld), NAN);
    conv2d_wgrad_im2col_copies_cpu(s, x.data(), dy.data(), cols.data(), dyk.data());
    std::vector<float> dw = pr.dw0, db = pr.db0, dw_ref = pr.dw0, db_ref = pr.db0;
    gemm_cpu(false, true, s.oc, ckk, k, 1.f, dyk.data(), ld, cols.data(), ld, 1.f, dw.data(), ckk);
    for (int oc = 0; oc < s.oc; ++oc)
      for (int64_t i = 0; i < k; ++i) db[oc] += dyk[oc * ld + i];
    conv2d_backward_weight_cpu(s, x.data(), dy.data(), dw_ref.data(), db_ref.data());
    EXPECT_LE(test::rel_to_max(dw, dw_ref, test::typical(k)), 1e-5);
    EXPECT_LE(test::rel_to_max(db, db_ref, test::typical(k)), 1e-5);
  }
}
