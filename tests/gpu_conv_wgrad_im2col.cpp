// The weight gradient as one GEMM on explicit copies (kernels/conv/conv2d_wgrad_im2col.h) on the
// GPU:
//   CopiesMatchTheCpuTwin  the copies kernel against conv2d_wgrad_im2col_copies_cpu, bitwise, on
//                          strided, padded, 1x1-output and 16x16-output planes, and on a layer of
//                          more rows (C*KH*KW + OC) than a grid's y (the rows' loop).
//   MatchesTheCpuReference TF32, FP32 (3xTF32) and BF16 against conv2d_backward_weight_cpu on
//                          awkward shapes (BF16: on operands rounded as the GEMM rounds them, so
//                          FP32's tolerance), accumulating onto random dw/db, atomic and
//                          deterministic (two runs bitwise equal), a null db left alone
//                          (wgrad_test_check.h).
//   DispatchAndRefusals    conv2d_backward_weight runs it (bitwise equal to the direct call) with
//                          wgmma-nhwc at TF32 and wgmma at BF16 on a 4x4 plane; grouped, larger
//                          planes and copies past the cap refused naming why.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels/common/bf16_round.h"
#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_wgrad_im2col.h"
#include "runtime/exec.h"
#include "runtime/memory.h"
#include "tests/conv_test_cases.h"
#include "tests/conv_test_check.h"
#include "tests/gemm_error_measure.h"
#include "tests/test_util.h"
#include "tests/wgmma_test_require.h"
#include "tests/wgrad_test_check.h"

using namespace cnn;
using conv_test::bitwise_equal;
using conv_test::check_wgrad_contract;
using conv_test::conv;
using conv_test::describe_shape;
using conv_test::make_wgrad_problem;
using conv_test::WgradProblem;

namespace {

#ifdef CNN_HAVE_CUDA

Exec exec_of(Precision p, bool deterministic) {
  Exec ex;
  ex.device = Device::CUDA;
  ex.precision = p;
  ex.deterministic = deterministic;
  return ex;
}

// dw0/db0 accumulated on the device by the direct call (algo < 0) or by conv2d_backward_weight
// with `algo`; db null when !with_db. The scratch starts as NaN: nothing may read it unwritten.
void run(const Conv2dShape& s, const WgradProblem& pr, const Exec& ex, bool with_db,
         std::vector<float>& dw, std::vector<float>& db, const Algo* algo = nullptr) {
  Tensor d_x = test::to_device(pr.x), d_dy = test::to_device(pr.dy);
  Tensor d_dw = test::to_device(pr.dw0), d_db = test::to_device(pr.db0);
  const size_t floats = std::max(conv2d_wgrad_im2col_scratch_floats(s, ex),
                                 algo ? conv2d_backward_weight_scratch_floats(s, ex) : size_t(0));
  Tensor d_scratch({static_cast<int64_t>(std::max<size_t>(1, floats))}, Device::CUDA);
  test::poison_device(d_scratch.data(), std::max<size_t>(1, floats));
  float* db_ptr = with_db ? d_db.data() : nullptr;
  if (algo)
    conv2d_backward_weight(s, d_x.data(), d_dy.data(), d_dw.data(), db_ptr, d_scratch.data(), *algo,
                           ex);
  else
    conv2d_backward_weight_im2col(s, d_x.data(), d_dy.data(), d_dw.data(), db_ptr, d_scratch.data(),
                                  ex);
  dw = d_dw.to_vector();
  db = d_db.to_vector();
}

#endif

}  // namespace

TEST(GpuConvWgradIm2col, CopiesMatchTheCpuTwin) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_GPU();
  const Conv2dShape shapes[] = {
      conv(3, 5, 4, 4, 7, 3, 3, 1, 1, 1, 1),     // 16 pixels a plane, 48 in all
      conv(5, 6, 7, 5, 9, 3, 3, 2, 2, 1, 1),     // stride 2: 4x3, 60 pixels
      conv(7, 4, 3, 3, 6, 3, 3, 1, 1, 1, 1),     // 63 pixels: a padded row stride
      conv(9, 8, 5, 5, 3, 5, 5, 1, 1, 0, 0),     // 1x1 output: 256 images a pass
      conv(3, 3, 16, 16, 5, 3, 3, 1, 1, 1, 1),   // 16x16: one image a pass
      conv(2, 7300, 1, 1, 8, 3, 3, 1, 1, 1, 1),  // 65708 rows, past a grid's y
      conv(37, 16, 8, 8, 24, 3, 3, 1, 1, 1, 1),  // 37 images: a partial last block
  };
  for (const Conv2dShape& s : shapes) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(describe_shape(s) + " seed " + std::to_string(seed));
    const WgradProblem pr = make_wgrad_problem(s, seed);
    const std::vector<float>&x = pr.x, &dy = pr.dy;
    const int64_t ld = conv2d_wgrad_im2col_ld(s), ckk = int64_t{s.c} * s.kh * s.kw;
    const int64_t k = int64_t{s.n} * s.oh() * s.ow();
    std::vector<float> cols(size_t(ckk * ld), 0.f), dyk(size_t(s.oc * ld), 0.f);
    conv2d_wgrad_im2col_copies_cpu(s, x.data(), dy.data(), cols.data(), dyk.data());
    Tensor d_x = test::to_device(x), d_dy = test::to_device(dy);
    Tensor d_cols({ckk * ld}, Device::CUDA), d_dyk({int64_t{s.oc} * ld}, Device::CUDA);
    test::poison_device(d_cols.data(), size_t(ckk * ld));
    test::poison_device(d_dyk.data(), size_t(s.oc * ld));
    conv2d_wgrad_im2col_copies_cuda(s, d_x.data(), d_dy.data(), d_cols.data(), d_dyk.data(),
                                    nullptr);
    const std::vector<float> got_cols = d_cols.to_vector(), got_dyk = d_dyk.to_vector();
    // The first k floats of each row: the stride's padding is never read.
    const auto rows_equal = [&](const std::vector<float>& got, const std::vector<float>& want,
                                int64_t rows) {
      for (int64_t r = 0; r < rows; ++r)
        if (std::memcmp(got.data() + r * ld, want.data() + r * ld, size_t(k) * sizeof(float)))
          return false;
      return true;
    };
    EXPECT_TRUE(rows_equal(got_cols, cols, ckk)) << "cols";
    EXPECT_TRUE(rows_equal(got_dyk, dyk, s.oc)) << "dyk";
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvWgradIm2col, MatchesTheCpuReference) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA();
  const Conv2dShape shapes[] = {
      conv(6, 64, 4, 4, 96, 3, 3, 1, 1, 1, 1),    // ResNet-18's last stage, small
      conv(5, 33, 7, 7, 70, 3, 3, 1, 1, 1, 1),    // 7x7, odd channels, 245 pixels
      conv(4, 24, 9, 9, 40, 3, 3, 2, 2, 1, 1),    // stride 2: 5x5
      conv(3, 40, 6, 6, 17, 1, 1, 2, 2, 0, 0),    // 1x1 stride 2, 27 pixels: padded stride
      conv(2, 9, 16, 16, 130, 5, 5, 1, 1, 2, 2),  // 16x16, 5x5, two row tiles
      conv(1, 3, 1, 1, 5, 3, 3, 1, 1, 1, 1),      // one pixel, k = 1
  };
  for (const Conv2dShape& s : shapes)
    for (Precision prec : {Precision::TF32, Precision::FP32, Precision::BF16}) {
      const uint64_t seed = test::fresh_seed();
      SCOPED_TRACE(describe_shape(s) + " " + precision_name(prec) + " seed " +
                   std::to_string(seed));
      ASSERT_EQ(conv2d_wgrad_im2col_refusal(s), "");
      const WgradProblem pr = make_wgrad_problem(s, seed);
      const bool bf16 = prec == Precision::BF16;
      // db sums dy unrounded (its own kernel); dw multiplies the GEMM's BF16 operands.
      const std::vector<float> xr = bf16 ? round_to_bf16(pr.x) : pr.x;
      const std::vector<float> dyr = bf16 ? round_to_bf16(pr.dy) : pr.dy;
      std::vector<float> dw_ref = pr.dw0, db_ref = pr.db0, dw_unused = pr.dw0;
      conv2d_backward_weight_cpu(s, xr.data(), dyr.data(), dw_ref.data(), nullptr);
      conv2d_backward_weight_cpu(s, pr.x.data(), pr.dy.data(), dw_unused.data(), db_ref.data());
      const int64_t k = int64_t{s.n} * s.oh() * s.ow();
      const double tol = test::tolerance(bf16 ? Precision::FP32 : prec, k);
      const double worst = check_wgrad_contract(
          pr, dw_ref, db_ref, k, tol,
          [&](bool det, bool with_db, std::vector<float>& dw, std::vector<float>& db) {
            run(s, pr, exec_of(prec, det), with_db, dw, db);
          });
      std::printf("im2col gemm %-4s %s: worst rel err %.2g (tolerance %.2g)\n",
                  precision_name(prec), describe_shape(s).c_str(), worst, tol);
    }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

TEST(GpuConvWgradIm2col, DispatchAndRefusals) {
#ifdef CNN_HAVE_CUDA
  CNN_REQUIRE_WGMMA();
  // On a 4x4 plane wgmma-nhwc at TF32 and wgmma at BF16 run the GEMM on copies: bitwise the
  // direct call.
  const Conv2dShape s = conv(8, 32, 4, 4, 48, 3, 3, 1, 1, 1, 1);
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const WgradProblem pr = make_wgrad_problem(s, seed);
  const std::pair<Precision, Algo> calls[] = {{Precision::TF32, Algo::WgmmaNhwc},
                                              {Precision::BF16, Algo::Wgmma}};
  for (const auto& [prec, algo] : calls) {
    SCOPED_TRACE(precision_name(prec));
    const Exec e = exec_of(prec, true);
    std::vector<float> dw_api, db_api, dw_direct, db_direct;
    run(s, pr, e, true, dw_api, db_api, &algo);
    run(s, pr, e, true, dw_direct, db_direct);
    EXPECT_TRUE(bitwise_equal(dw_api, dw_direct) && bitwise_equal(db_api, db_direct));
    EXPECT_GE(conv2d_backward_weight_scratch_floats(s, e),
              conv2d_wgrad_im2col_scratch_floats(s, e));
  }
  const Exec ex = exec_of(Precision::TF32, true);
  // Refusals name why.
  const Conv2dShape plane_17x17 = conv(2, 8, 17, 17, 8, 3, 3, 1, 1, 1, 1);
  EXPECT_TRUE(
      test::contains(conv2d_wgrad_im2col_refusal(plane_17x17), "at most 256 output pixels"));
  Conv2dShape grouped = s;
  grouped.groups = 4;
  EXPECT_TRUE(test::contains(conv2d_wgrad_im2col_refusal(grouped), "groups 4"));
  EXPECT_TRUE(
      test::contains(conv2d_wgrad_im2col_refusal(conv(512, 512, 4, 4, 512, 3, 3, 1, 1, 1, 1)),
                     "floats of copies"));
  EXPECT_EQ(conv2d_wgrad_im2col_scratch_floats(plane_17x17, ex), 0u);
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}
