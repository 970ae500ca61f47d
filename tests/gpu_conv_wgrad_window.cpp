// The window weight-gradient kernel (kernels/conv/conv2d_igemm_wgrad_window.h, run as
// IgemmVariant::Window) against the CPU reference conv2d_backward_weight_cpu on awkward shapes:
// batch 1/3/128, C 1/5/32/33/64 (chunks padded with zero channels), OC 1/7/32/48/64/128 (every
// warp tiling), images 28x28/14x14/7x7/13x9/1x1/32x32, kernels 1x1/3x3/5x5, padding 0..3; TF32
// and BF16, atomic and deterministic (twice, bitwise equal), with and without db (db untouched
// when null). dw/db accumulate onto random values.
//   TF32: against the reference on the FP32 operands, the tolerances of gpu_conv2d_fast.cpp.
//   BF16: against the reference on operands rounded with round_to_bf16 (what the kernel's staging
//         does), so only the FP32 summation order separates them: FP32's tolerance.
// Also: a 7x7 kernel (refused) falls back to the dedicated kernel under Window, and Auto picks the
// window kernel for the ResNet stage-1 layer (bitwise equal to Window, deterministic) when
// CNN_CONV_WGRAD_WINDOW=1 (Auto's pick only then).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/common/bf16_round.h"
#include "kernels/conv/conv2d.h"
#include "runtime/env_switches.h"
#include "runtime/exec.h"
#include "runtime/memory.h"
#include "tests/conv_test_cases.h"
#include "tests/conv_test_check.h"
#include "tests/gemm_error_measure.h"
#include "tests/test_util.h"
#include "tests/wgrad_test_check.h"
#ifdef CNN_HAVE_CUDA
#include "kernels/conv/conv2d_igemm.h"
#include "kernels/conv/conv2d_igemm_wgrad_window.h"
#endif

using namespace cnn;
using conv_test::bitwise_equal;
using conv_test::check_wgrad_contract;
using conv_test::conv;
using conv_test::describe_shape;
using conv_test::make_wgrad_problem;
using conv_test::WgradProblem;
using test::tolerance;

namespace {

#ifdef CNN_HAVE_CUDA

Exec exec_of(Precision p, bool deterministic) {
  Exec ex;
  ex.device = Device::CUDA;
  ex.precision = p;
  ex.deterministic = deterministic;
  return ex;
}

// dw0/db0 accumulated on the device by `variant`; db null when !with_db.
void run(const Conv2dShape& s, const WgradProblem& pr, const Exec& ex, IgemmVariant variant,
         bool with_db, std::vector<float>& dw, std::vector<float>& db) {
  Tensor d_x = test::to_device(pr.x), d_dy = test::to_device(pr.dy);
  Tensor d_dw = test::to_device(pr.dw0), d_db = test::to_device(pr.db0);
  const size_t scratch_floats = conv2d_backward_weight_igemm_scratch_floats(s, ex);
  Tensor d_scratch({static_cast<int64_t>(std::max<size_t>(1, scratch_floats))}, Device::CUDA);
  test::poison_device(d_scratch.data(), std::max<size_t>(1, scratch_floats));
  conv2d_backward_weight_igemm_cuda(s, d_x.data(), d_dy.data(), d_dw.data(),
                                    with_db ? d_db.data() : nullptr,
                                    scratch_floats ? d_scratch.data() : nullptr, ex, variant);
  dw = d_dw.to_vector();
  db = d_db.to_vector();
}

// Every check of one shape at one precision with `variant` (Window, or Window falling back).
void check_shape(const Conv2dShape& s, Precision prec, IgemmVariant variant) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(describe_shape(s) + " " + precision_name(prec) + " seed=" + std::to_string(seed));
  const WgradProblem pr = make_wgrad_problem(s, seed);
  const bool bf16 = prec == Precision::BF16;
  // BF16: the reference on the operands the kernel multiplies (exact products in FP32).
  const std::vector<float> xr = bf16 ? round_to_bf16(pr.x) : pr.x;
  const std::vector<float> dyr = bf16 ? round_to_bf16(pr.dy) : pr.dy;
  std::vector<float> dw_ref = pr.dw0, db_ref = pr.db0;
  conv2d_backward_weight_cpu(s, xr.data(), dyr.data(), dw_ref.data(), db_ref.data());
  const int64_t k = int64_t{s.n} * s.oh() * s.ow();
  // BF16 against operands rounded as the kernel rounds them: FP32 summation alone.
  const double tol = tolerance(bf16 ? Precision::FP32 : prec, k);

  const double worst = check_wgrad_contract(
      pr, dw_ref, db_ref, k, tol,
      [&](bool det, bool with_db, std::vector<float>& dw, std::vector<float>& db) {
        run(s, pr, exec_of(prec, det), variant, with_db, dw, db);
      });
  std::printf("window %-4s %s: worst rel err %.2g (tolerance %.2g)\n", precision_name(prec),
              describe_shape(s).c_str(), worst, tol);
}

void run_window_shapes(const std::vector<Conv2dShape>& shapes) {
  for (const Conv2dShape& s : shapes)
    for (Precision prec : {Precision::TF32, Precision::BF16}) {
      // The window kernel itself must run, not a fallback.
      ASSERT_TRUE(wgrad_window_supported(s, prec))
          << describe_shape(s) << ": " << wgrad_window_refusal(s, prec);
      check_shape(s, prec, IgemmVariant::Window);
    }
}

#endif  // CNN_HAVE_CUDA

}  // namespace

// The ResNet layers the kernel is for (OC 32 / 64 / 128: the three 3x3 tilings) at batch 128.
TEST(GpuConvWgradWindow, ResNetLayers) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  run_window_shapes({
      conv(128, 32, 28, 28, 32, 3, 3, 1, 1, 1, 1),
      conv(128, 64, 14, 14, 64, 3, 3, 1, 1, 1, 1),
      conv(128, 128, 7, 7, 128, 3, 3, 1, 1, 1, 1),
  });
#endif
}

TEST(GpuConvWgradWindow, AwkwardShapes3x3) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  run_window_shapes({
      conv(3, 5, 13, 9, 7, 3, 3, 1, 1, 1, 1),      // C 5 in a 32-channel chunk, OC 7, odd image
      conv(1, 33, 14, 14, 48, 3, 3, 1, 1, 0, 0),   // two chunks (C 33), pad 0, OC 48
      conv(1, 32, 1, 1, 7, 3, 3, 1, 1, 1, 1),      // 1x1 image: 8 of 9 taps outside
      conv(128, 1, 7, 7, 1, 3, 3, 1, 1, 2, 2),     // C 1, OC 1, pad 2 (9x9 output)
      conv(3, 64, 32, 32, 128, 3, 3, 1, 1, 3, 3),  // pad 3: zero rows and columns, OC 128
      conv(3, 33, 13, 9, 64, 3, 3, 1, 1, 1, 2),    // non-square padding, OC 64, C 33
  });
#endif
}

TEST(GpuConvWgradWindow, AwkwardShapes5x5And1x1) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  run_window_shapes({
      conv(3, 64, 32, 32, 64, 5, 5, 1, 1, 2, 2),  // 5x5, OC 64: 8 channels a block
      conv(5, 32, 14, 14, 64, 5, 5, 1, 1, 2, 2),  // LeNet conv2: 16-byte dy, bands of 8 + 6 rows
      conv(2, 11, 15, 12, 30, 5, 5, 1, 1, 2, 2),  // 16-byte dy, 11 channels of a chunk of 16
      conv(3, 8, 6, 7, 40, 3, 3, 1, 1, 1, 1),     // 6 x 7: 16-byte dy, rows a multiple of 4
      conv(1, 33, 13, 9, 32, 5, 5, 1, 1, 3, 0),   // 5x5, pad 3 x 0, OC 32
      conv(128, 5, 7, 7, 7, 5, 5, 1, 1, 1, 1),    // 5x5 on 7x7, batch 128
      conv(3, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0),      // 1x1 everything
      conv(3, 5, 28, 28, 128, 1, 1, 1, 1, 0, 0),  // 1x1, OC 128
      conv(3, 64, 13, 9, 48, 1, 1, 1, 1, 1, 1),   // 1x1 with padding: zero border outputs
  });
#endif
}

// A kernel the window variant refuses (7x7) runs the dedicated kernel's rule under Window.
TEST(GpuConvWgradWindow, RefusedShapeFallsBack) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  const Conv2dShape s = conv(3, 32, 7, 7, 32, 7, 7, 1, 1, 3, 3);
  for (Precision prec : {Precision::TF32, Precision::BF16}) {
    ASSERT_FALSE(wgrad_window_supported(s, prec));
    check_shape(s, prec, IgemmVariant::Window);
  }
#endif
}

// Auto runs the window kernel on the ResNet stage-1 layer only under CNN_CONV_WGRAD_WINDOW=1:
// its deterministic result is then bitwise Window's, else bitwise Dedicated's (the two kernels
// split K differently, so the bits tell which one ran).
TEST(GpuConvWgradWindow, AutoFollowsTheWindowSwitch) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  const bool generic = process_env_switches().conv_generic;
  const IgemmVariant expected = generic ? IgemmVariant::Generic
                                : process_env_switches().conv_wgrad_window
                                    ? IgemmVariant::Window
                                    : IgemmVariant::Dedicated;
  const Conv2dShape s = conv(128, 32, 28, 28, 32, 3, 3, 1, 1, 1, 1);
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  const WgradProblem pr = make_wgrad_problem(s, seed);
  for (Precision prec : {Precision::TF32, Precision::BF16}) {
    SCOPED_TRACE(precision_name(prec));
    const Exec ex = exec_of(prec, true);
    ASSERT_TRUE(wgrad_window_preferred(s, ex));
    std::vector<float> dw_auto, db_auto, dw_exp, db_exp, dw_other, db_other;
    run(s, pr, ex, IgemmVariant::Auto, true, dw_auto, db_auto);
    run(s, pr, ex, expected, true, dw_exp, db_exp);
    EXPECT_TRUE(bitwise_equal(dw_auto, dw_exp) && bitwise_equal(db_auto, db_exp));
    // The bits do tell the kernels apart: the one Auto did not run differs.
    if (!generic) {
      const IgemmVariant other =
          expected == IgemmVariant::Window ? IgemmVariant::Dedicated : IgemmVariant::Window;
      run(s, pr, ex, other, true, dw_other, db_other);
      EXPECT_FALSE(bitwise_equal(dw_auto, dw_other));
    }
  }
#endif
}
