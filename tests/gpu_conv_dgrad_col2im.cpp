// The input gradient as one GEMM on explicit copies and a col2im gather
// (kernels/conv/conv2d_dgrad_col2im.h) on the GPU:
//   KernelsMatchTheCpuTwins  the copies kernel and the gather kernel against
//                            conv2d_dgrad_col2im_copies_cpu / _gather_cpu, bitwise, on strided,
//                            padded, 1x1, odd-channel shapes, a stride past the kernel, a batch
//                            of more images than a tile's rows and more dx planes than a grid's y.
//   MatchesTheCpuReference   TF32, FP32 (3xTF32) and BF16 against conv2d_backward_data_cpu on
//                            awkward shapes (BF16: on operands rounded as the GEMM rounds them,
//                            so FP32's tolerance), dx and the scratch poisoned beforehand (every
//                            dx element written, no unwritten scratch read), two runs bitwise
//                            equal.
//   DispatchAndRefusals      conv2d_backward_data runs it with algo wgmma and a scratch (bitwise
//                            the direct call) at every precision; without a scratch the TF32
//                            kernel; grouped, dilated, larger planes and copies past the cap
//                            refused naming why.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/common/bf16_round.h"
#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_dgrad_col2im.h"
#include "runtime/exec.h"
#include "runtime/memory.h"
#include "tests/conv_test_cases.h"
#include "tests/conv_test_check.h"
#include "tests/gemm_error_measure.h"
#include "tests/test_util.h"
#include "tests/wgmma_test_require.h"

using namespace cnn;
using conv_test::bitwise_equal;
using conv_test::conv;
using conv_test::ConvOperands;
using conv_test::describe_shape;

namespace {

#ifdef CNN_HAVE_CUDA

Exec exec_of(Precision p) {
  Exec ex;
  ex.device = Device::CUDA;
  ex.precision = p;
  return ex;
}

// dy (the operands' `in`) and w as the other convolution tests draw them.
ConvOperands make_problem(const Conv2dShape& s, uint64_t seed) {
  return conv_test::make_operands(conv_test::Pass::BackwardData, s, test::Fill::Random, seed);
}

// dx from the direct call (algo null) or from conv2d_backward_data with `algo`; dx and the
// scratch start as NaN.
std::vector<float> run(const Conv2dShape& s, const ConvOperands& pr, const Exec& ex,
                       const Algo* algo = nullptr) {
  Tensor d_dy = test::to_device(pr.in), d_w = test::to_device(pr.w);
  const size_t nx = size_t(s.n) * s.c * s.h * s.w;
  Tensor d_dx({static_cast<int64_t>(nx)}, Device::CUDA);
  test::poison_device(d_dx.data(), nx);
  const size_t floats = algo ? conv2d_backward_data_scratch_floats(s, *algo, ex)
                             : conv2d_dgrad_col2im_scratch_floats(s, ex);
  Tensor d_scratch({static_cast<int64_t>(std::max<size_t>(1, floats))}, Device::CUDA);
  test::poison_device(d_scratch.data(), std::max<size_t>(1, floats));
  if (algo)
    conv2d_backward_data(s, d_dy.data(), d_w.data(), d_dx.data(), d_scratch.data(), *algo, ex);
  else
    conv2d_backward_data_col2im(s, d_dy.data(), d_w.data(), d_dx.data(), d_scratch.data(), ex);
  return d_dx.to_vector();
}

#endif

}  // namespace

TEST(GpuConvDgradCol2im, KernelsMatchTheCpuTwins) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_GPU();
  const Conv2dShape shapes[] = {
      conv(3, 5, 4, 4, 7, 3, 3, 1, 1, 1, 1),        // 7 channels: a padded row stride
      conv(5, 6, 8, 7, 33, 3, 3, 2, 2, 1, 1),       // stride 2, 33 channels: two tile rows
      conv(9, 40, 5, 5, 3, 5, 5, 1, 1, 0, 0),       // 1x1 output, 1000 weight columns
      conv(3, 3, 16, 16, 5, 3, 3, 1, 1, 1, 1),      // 16x16: eight tile columns a plane
      conv(37, 16, 8, 8, 24, 1, 1, 2, 2, 0, 0),     // 1x1 stride 2, 37 images
      conv(2, 3, 7, 7, 5, 2, 2, 3, 3, 0, 0),        // stride 3 > kernel: pixels no tap reaches
      conv(2, 32769, 10, 13, 1, 1, 1, 1, 1, 0, 0),  // 65538 planes of 130 pixels: past a grid's y
  };
  for (const Conv2dShape& s : shapes) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(describe_shape(s) + " seed " + std::to_string(seed));
    const ConvOperands pr = make_problem(s, seed);
    const int64_t ld_oc = conv2d_dgrad_col2im_ld_oc(s), ld_pix = conv2d_dgrad_col2im_ld_pix(s);
    const int64_t ckk = int64_t{s.c} * s.kh * s.kw, k = int64_t{s.n} * s.oh() * s.ow();
    std::vector<float> dyt(size_t(k * ld_oc), 0.f), wt(size_t(ckk * ld_oc), 0.f);
    conv2d_dgrad_col2im_copies_cpu(s, pr.in.data(), pr.w.data(), dyt.data(), wt.data());
    Tensor d_dy = test::to_device(pr.in), d_w = test::to_device(pr.w);
    Tensor d_dyt({k * ld_oc}, Device::CUDA), d_wt({ckk * ld_oc}, Device::CUDA);
    test::poison_device(d_dyt.data(), size_t(k * ld_oc));
    test::poison_device(d_wt.data(), size_t(ckk * ld_oc));
    conv2d_dgrad_col2im_copies_cuda(s, d_dy.data(), d_w.data(), d_dyt.data(), d_wt.data(), nullptr);
    const std::vector<float> got_dyt = d_dyt.to_vector(), got_wt = d_wt.to_vector();
    // The first OC floats of each row: the stride's padding is never read.
    const auto rows_equal = [&](const std::vector<float>& got, const std::vector<float>& want,
                                int64_t rows) {
      for (int64_t r = 0; r < rows; ++r)
        if (std::memcmp(got.data() + r * ld_oc, want.data() + r * ld_oc,
                        size_t(s.oc) * sizeof(float)))
          return false;
      return true;
    };
    EXPECT_TRUE(rows_equal(got_dyt, dyt, k)) << "dyt";
    EXPECT_TRUE(rows_equal(got_wt, wt, ckk)) << "wt";
    // The gather on random cols (the padding columns NaN: never read).
    std::vector<float> cols = test::random_vector(size_t(ckk * ld_pix), seed + 2);
    for (int64_t r = 0; r < ckk; ++r)
      for (int64_t i = k; i < ld_pix; ++i) cols[size_t(r * ld_pix + i)] = NAN;
    std::vector<float> dx(size_t(s.n) * s.c * s.h * s.w);
    conv2d_dgrad_col2im_gather_cpu(s, cols.data(), dx.data());
    Tensor d_cols = test::to_device(cols);
    Tensor d_dx({static_cast<int64_t>(dx.size())}, Device::CUDA);
    test::poison_device(d_dx.data(), dx.size());
    conv2d_dgrad_col2im_gather_cuda(s, d_cols.data(), d_dx.data(), nullptr);
    EXPECT_TRUE(bitwise_equal(d_dx.to_vector(), dx)) << "dx";
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvDgradCol2im, MatchesTheCpuReference) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA();
  const Conv2dShape shapes[] = {
      conv(6, 64, 8, 8, 96, 3, 3, 2, 2, 1, 1),    // ResNet-18's stride-2 conv, small
      conv(4, 48, 4, 4, 80, 3, 3, 1, 1, 1, 1),    // its last stage's stride-1 shape
      conv(5, 33, 7, 7, 70, 3, 3, 1, 1, 1, 1),    // 7x7, odd channels
      conv(3, 40, 11, 11, 17, 1, 1, 2, 2, 0, 0),  // 1x1 stride 2, 17 channels: padded strides
      conv(2, 9, 16, 16, 130, 5, 5, 1, 1, 2, 2),  // 16x16, 5x5
      conv(1, 3, 1, 1, 5, 3, 3, 1, 1, 1, 1),      // one pixel
  };
  for (const Conv2dShape& s : shapes)
    for (Precision prec : {Precision::TF32, Precision::FP32, Precision::BF16}) {
      const uint64_t seed = test::fresh_seed();
      SCOPED_TRACE(describe_shape(s) + " " + precision_name(prec) + " seed " +
                   std::to_string(seed));
      ASSERT_EQ(conv2d_dgrad_col2im_refusal(s), "");
      const ConvOperands pr = make_problem(s, seed);
      const bool bf16 = prec == Precision::BF16;
      const std::vector<float> dyr = bf16 ? round_to_bf16(pr.in) : pr.in;
      const std::vector<float> wr = bf16 ? round_to_bf16(pr.w) : pr.w;
      std::vector<float> ref(size_t(s.n) * s.c * s.h * s.w);
      conv2d_backward_data_cpu(s, dyr.data(), wr.data(), ref.data());
      const int64_t k = int64_t{s.oc} * s.kh * s.kw;
      const double tol = test::tolerance(bf16 ? Precision::FP32 : prec, k);
      const Exec ex = exec_of(prec);
      const std::vector<float> got = run(s, pr, ex), again = run(s, pr, ex);
      const double err = test::rel_to_max(got, ref, test::typical(k));
      EXPECT_LE(err, tol);
      EXPECT_TRUE(bitwise_equal(got, again)) << "two runs differ";
      std::printf("col2im dgrad %-4s %s: worst rel err %.2g (tolerance %.2g)\n",
                  precision_name(prec), describe_shape(s).c_str(), err, tol);
    }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvDgradCol2im, DispatchAndRefusals) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA();
  const Conv2dShape s = conv(8, 32, 8, 8, 48, 3, 3, 2, 2, 1, 1);
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const ConvOperands pr = make_problem(s, seed);
  const Algo wgmma = Algo::Wgmma;
  for (Precision prec : {Precision::TF32, Precision::FP32, Precision::BF16}) {
    SCOPED_TRACE(precision_name(prec));
    const Exec e = exec_of(prec);
    EXPECT_EQ(conv2d_backward_data_scratch_floats(s, wgmma, e),
              conv2d_dgrad_col2im_scratch_floats(s, e));
    EXPECT_TRUE(bitwise_equal(run(s, pr, e, &wgmma), run(s, pr, e)));
  }
  // A stride-1 plane above 16x16: no scratch, the TF32 kernel (and a refusal at BF16).
  const Exec tf32 = exec_of(Precision::TF32);
  const Conv2dShape plane_17x17 = conv(2, 8, 17, 17, 8, 3, 3, 1, 1, 1, 1);
  EXPECT_TRUE(
      test::contains(conv2d_dgrad_col2im_refusal(plane_17x17), "at most 256 output pixels"));
  EXPECT_EQ(conv2d_backward_data_scratch_floats(plane_17x17, wgmma, tf32), 0u);
  EXPECT_EQ(conv2d_dgrad_col2im_scratch_floats(plane_17x17, tf32), 0u);
  Conv2dShape grouped = s;
  grouped.groups = 4;
  EXPECT_TRUE(test::contains(conv2d_dgrad_col2im_refusal(grouped), "groups 4"));
  Conv2dShape dilated = s;
  dilated.dil_h = dilated.dil_w = 2;
  EXPECT_TRUE(test::contains(conv2d_dgrad_col2im_refusal(dilated), "dilation 2x2"));
  EXPECT_TRUE(
      test::contains(conv2d_dgrad_col2im_refusal(conv(512, 512, 4, 4, 512, 3, 3, 1, 1, 1, 1)),
                     "floats of copies"));
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}
