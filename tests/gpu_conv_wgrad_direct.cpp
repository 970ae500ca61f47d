// The direct FP32 weight gradient (kernels/conv/conv2d_wgrad_direct.h) against the CPU reference
// conv2d_backward_weight_cpu on awkward shapes: batch 1/3/128, C and OC 1/5/7/33/48/64/70 (tiles
// padded with zero channels), images 28x28/14x14/7x7/13x9/1x1/3-wide/50-wide, padding 0..3;
// atomic and deterministic (twice, bitwise equal), with and without db (db untouched when null).
// dw/db accumulate onto random values. Also: conv2d_backward_weight with algo tiled runs it on a
// stride-1 3x3 shape (bitwise equal, deterministic) and keeps the old tiled kernel elsewhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_wgrad_direct_plan.h"
#include "runtime/exec.h"
#include "runtime/memory.h"
#include "tests/conv_test_cases.h"
#include "tests/conv_test_check.h"
#include "tests/gemm_error_measure.h"
#include "tests/test_util.h"
#include "tests/wgrad_test_check.h"
#ifdef CNN_HAVE_CUDA
#include "kernels/conv/conv2d_wgrad_direct.h"
#endif

using namespace cnn;
using conv_test::bitwise_equal;
using conv_test::check_wgrad_contract;
using conv_test::conv;
using conv_test::describe_shape;
using conv_test::make_wgrad_problem;
using conv_test::WgradProblem;
using test::rel_to_max;
using test::tolerance;
using test::typical;

namespace {

#ifdef CNN_HAVE_CUDA

// dw0/db0 accumulated on the device: the direct kernel itself (via_api false) or
// conv2d_backward_weight with algo tiled; db null when !with_db.
void run(const Conv2dShape& s, const WgradProblem& pr, bool deterministic, bool with_db,
         bool via_api, std::vector<float>& dw, std::vector<float>& db) {
  Tensor d_x = test::to_device(pr.x), d_dy = test::to_device(pr.dy);
  Tensor d_dw = test::to_device(pr.dw0), d_db = test::to_device(pr.db0);
  Exec ex;
  ex.device = Device::CUDA;
  ex.deterministic = deterministic;
  const size_t floats = via_api ? conv2d_backward_weight_scratch_floats(s, ex)
                                : wgrad_direct_scratch_floats(s, deterministic);
  Tensor d_scratch({static_cast<int64_t>(std::max<size_t>(1, floats))}, Device::CUDA);
  test::poison_device(d_scratch.data(), std::max<size_t>(1, floats));
  float* scratch = floats ? d_scratch.data() : nullptr;
  float* dbp = with_db ? d_db.data() : nullptr;
  if (via_api)
    conv2d_backward_weight(s, d_x.data(), d_dy.data(), d_dw.data(), dbp, scratch, Algo::Tiled, ex);
  else
    conv2d_backward_weight_direct_cuda(s, d_x.data(), d_dy.data(), d_dw.data(), dbp, scratch,
                                       deterministic, nullptr);
  dw = d_dw.to_vector();
  db = d_db.to_vector();
}

void check_shape(const Conv2dShape& s) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(describe_shape(s) + " seed=" + std::to_string(seed));
  ASSERT_TRUE(wgrad_direct_supported(s)) << wgrad_direct_refusal(s);
  const WgradProblem pr = make_wgrad_problem(s, seed);
  std::vector<float> dw_ref = pr.dw0, db_ref = pr.db0;
  conv2d_backward_weight_cpu(s, pr.x.data(), pr.dy.data(), dw_ref.data(), db_ref.data());
  const int64_t k = int64_t{s.n} * s.oh() * s.ow();
  const double tol = tolerance(Precision::FP32, k);
  const double worst = check_wgrad_contract(
      pr, dw_ref, db_ref, k, tol,
      [&](bool det, bool with_db, std::vector<float>& dw, std::vector<float>& db) {
        run(s, pr, det, with_db, false, dw, db);
      });
  std::printf("direct wgrad %s: worst rel err %.2g (tolerance %.2g)\n", describe_shape(s).c_str(),
              worst, tol);
}

#endif  // CNN_HAVE_CUDA

}  // namespace

// The layers the kernel is for: the ResNet's stride-1 3x3 layers and a VGG one, batch 128.
TEST(GpuConvWgradDirect, NetworkLayers) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  for (const Conv2dShape& s :
       {conv(128, 32, 28, 28, 32, 3, 3, 1, 1, 1, 1), conv(128, 64, 14, 14, 64, 3, 3, 1, 1, 1, 1),
        conv(128, 128, 7, 7, 128, 3, 3, 1, 1, 1, 1), conv(128, 64, 32, 32, 64, 3, 3, 1, 1, 1, 1)})
    check_shape(s);
#endif
}

TEST(GpuConvWgradDirect, AwkwardShapes) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  for (const Conv2dShape& s : {
           conv(3, 5, 13, 9, 7, 3, 3, 1, 1, 1, 1),     // C 5, OC 7: tiles mostly empty
           conv(1, 33, 14, 14, 48, 3, 3, 1, 1, 0, 0),  // two tiles each way, pad 0
           conv(2, 64, 7, 7, 70, 3, 3, 1, 1, 1, 1),    // OC 70: three oc tiles
           conv(1, 32, 1, 1, 7, 3, 3, 1, 1, 1, 1),     // 1x1 image: 8 of 9 taps outside
           conv(128, 1, 7, 7, 1, 3, 3, 1, 1, 2, 2),    // C 1, OC 1, pad 2 (9x9 output)
           conv(3, 6, 9, 13, 33, 3, 3, 1, 1, 3, 2),    // pad 3 x 2: zero rows and columns
           conv(2, 4, 40, 3, 3, 3, 3, 1, 1, 1, 1),     // 3-wide: one run a row
           conv(5, 8, 3, 50, 9, 3, 3, 1, 1, 0, 1),     // one output row, 13 runs
       })
    check_shape(s);
#endif
}

// algo tiled through the public API: the direct kernel on a stride-1 3x3 shape (bitwise its
// deterministic result), the old tiled kernel on a stride-2 one (still correct).
TEST(GpuConvWgradDirect, TiledAlgoRunsIt) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  const Conv2dShape s = conv(4, 40, 12, 12, 36, 3, 3, 1, 1, 1, 1);
  const WgradProblem pr = make_wgrad_problem(s, seed);
  std::vector<float> dw_api, db_api, dw_direct, db_direct;
  run(s, pr, true, true, true, dw_api, db_api);
  run(s, pr, true, true, false, dw_direct, db_direct);
  EXPECT_TRUE(bitwise_equal(dw_api, dw_direct) && bitwise_equal(db_api, db_direct));

  const Conv2dShape s2 = conv(4, 40, 12, 12, 36, 3, 3, 2, 2, 1, 1);
  ASSERT_FALSE(wgrad_direct_supported(s2));
  const WgradProblem pr2 = make_wgrad_problem(s2, seed + 10);
  std::vector<float> dw_ref = pr2.dw0, db_ref = pr2.db0, dw, db;
  conv2d_backward_weight_cpu(s2, pr2.x.data(), pr2.dy.data(), dw_ref.data(), db_ref.data());
  run(s2, pr2, false, true, true, dw, db);
  const int64_t k = int64_t{s2.n} * s2.oh() * s2.ow();
  EXPECT_LE(rel_to_max(dw, dw_ref, typical(k)), tolerance(Precision::FP32, k));
  EXPECT_LE(rel_to_max(db, db_ref, typical(k)), tolerance(Precision::FP32, k));
#endif
}
