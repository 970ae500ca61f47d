// The direct FP32 weight gradient's plan and index scheme on the CPU (CI has no GPU):
//   - its CPU model (staging buffers laid out as the kernel's shared memory, NaN in every cell
//     the staging never writes, the two groups' runs, the split of units and channel tiles, the
//     epilogue's slots) against conv2d_backward_weight_cpu on awkward shapes, with and without db;
//   - the plan's promises: 16-byte strides of an odd number of words, every load of a run inside
//     its staged row, stages within the limit, every unit in exactly one split, refusals, and the
//     deterministic scratch.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_wgrad_direct_plan.h"
#include "tests/conv_test_cases.h"
#include "tests/test_util.h"

using namespace cnn;
using conv_test::conv;
using conv_test::describe_shape;

namespace {

const std::vector<Conv2dShape>& model_shapes() {
  static const std::vector<Conv2dShape> shapes = {
      conv(2, 32, 28, 28, 32, 3, 3, 1, 1, 1, 1),  // ResNet stage 1 at batch 2
      conv(3, 5, 13, 9, 7, 3, 3, 1, 1, 1, 1),     // C 5, OC 7 (tiles mostly empty), odd image
      conv(1, 33, 14, 14, 48, 3, 3, 1, 1, 0, 0),  // C 33 and OC 48: two tiles each way, pad 0
      conv(2, 64, 7, 7, 70, 3, 3, 1, 1, 1, 1),    // 7x7: one run of 4 and one of 3 a row
      conv(1, 3, 1, 1, 5, 3, 3, 1, 1, 1, 1),      // 1x1 image: 8 taps outside
      conv(2, 6, 9, 13, 33, 3, 3, 1, 1, 3, 2),    // pad 3 > kernel - 1: zero rows and columns
      conv(1, 4, 40, 3, 3, 3, 3, 1, 1, 1, 1),     // 3-wide image: one run a row, many rows
      conv(5, 8, 3, 50, 9, 3, 3, 1, 1, 0, 1),     // one output row (pad 0 x 1), 13 runs
  };
  return shapes;
}

TEST(ConvWgradDirect, ModelMatchesReference) {
  for (const Conv2dShape& s : model_shapes()) {
    for (bool with_db : {true, false}) {
      const uint64_t seed = test::fresh_seed();
      SCOPED_TRACE(describe_shape(s) + (with_db ? " db" : " no db") + " seed " +
                   std::to_string(seed));
      ASSERT_TRUE(wgrad_direct_supported(s)) << wgrad_direct_refusal(s);
      const conv_test::WgradProblem pr = conv_test::make_wgrad_problem(s, seed);
      const std::vector<float>&x = pr.x, &dy = pr.dy, &w0 = pr.dw0, &b0 = pr.db0;
      const size_t nw = w0.size();
      std::vector<float> dw_ref = w0, db_ref = b0, dw = w0, db = b0;
      conv2d_backward_weight_cpu(s, x.data(), dy.data(), dw_ref.data(),
                                 with_db ? db_ref.data() : nullptr);
      wgrad_direct_model_cpu(s, x.data(), dy.data(), dw.data(), with_db ? db.data() : nullptr);
      const double k = double(s.n) * s.oh() * s.ow();
      const double tol = 1e-5 * std::sqrt(k) * (1 + std::sqrt(k) / 3);
      for (size_t i = 0; i < nw; ++i) ASSERT_NEAR(dw[i], dw_ref[i], tol) << "dw[" << i << "]";
      for (int i = 0; i < s.oc; ++i) ASSERT_NEAR(db[i], db_ref[i], tol) << "db[" << i << "]";
    }
  }
}

TEST(ConvWgradDirect, PlanPromises) {
  std::vector<Conv2dShape> shapes = model_shapes();
  shapes.push_back(conv(128, 32, 28, 28, 32, 3, 3, 1, 1, 1, 1));
  shapes.push_back(conv(128, 64, 14, 14, 64, 3, 3, 1, 1, 1, 1));
  shapes.push_back(conv(128, 256, 8, 8, 256, 3, 3, 1, 1, 1, 1));
  shapes.push_back(conv(512, 64, 32, 32, 64, 3, 3, 1, 1, 1, 1));
  for (const Conv2dShape& s : shapes) {
    SCOPED_TRACE(describe_shape(s));
    ASSERT_TRUE(wgrad_direct_supported(s)) << wgrad_direct_refusal(s);
    const WgradDirectPlan p = wgrad_direct_plan(s);
    EXPECT_GE(p.rows, 1);
    EXPECT_LE(p.rows, kWgradDirectMaxRows);
    EXPECT_EQ(p.bands, (s.oh() + p.rows - 1) / p.rows);
    EXPECT_EQ(p.runs * 4 >= s.ow() && (p.runs - 1) * 4 < s.ow(), true);
    // A run's loads: a float4 at 4 run and a float2 at 4 run + 4, inside the row; the staged
    // columns cover every input column the row's taps reach (ox + kx up to 4 runs + 1).
    EXPECT_GE(p.x_row, 4 * p.runs + 2);
    EXPECT_EQ(p.x_row % 4, 0);
    EXPECT_EQ(p.dy_row % 4, 0);
    EXPECT_EQ(p.x_rows, p.rows + 2);
    EXPECT_GE(p.x_chan, p.x_rows * p.x_row);
    EXPECT_GE(p.dy_chan, p.rows * p.dy_row);
    EXPECT_EQ(p.x_chan % 8, 4) << "x_chan must be an odd number of 16-byte words";
    EXPECT_EQ(p.dy_chan % 8, 4) << "dy_chan must be an odd number of 16-byte words";
    EXPECT_LE(std::size_t(p.stage_floats) * 4, kWgradDirectMaxStageBytes);
    EXPECT_GE(p.smem, 2 * std::size_t(p.stage_floats) * 4);
    EXPECT_EQ(p.units, int64_t{s.n} * p.bands);
    EXPECT_GE(p.splits, 1);
    EXPECT_LE(p.splits, p.units);  // every split has a unit
    // Every unit in exactly one split: the splits' ranges tile [0, units).
    int64_t next = 0;
    for (int split = 0; split < p.splits; ++split) {
      const int64_t b = split * p.units / p.splits, e = (split + 1) * p.units / p.splits;
      EXPECT_EQ(b, next);
      EXPECT_GT(e, b);
      next = e;
    }
    EXPECT_EQ(next, p.units);
    EXPECT_EQ(wgrad_direct_scratch_floats(s, false), 0u);
    EXPECT_EQ(wgrad_direct_scratch_floats(s, true), std::size_t(p.splits) * p.slots);
  }
  // The ResNet's stage-1 layer at batch 128: bands of 5 rows (6 an image), 264 splits.
  const WgradDirectPlan r = wgrad_direct_plan(conv(128, 32, 28, 28, 32, 3, 3, 1, 1, 1, 1));
  EXPECT_EQ(r.rows, 5);
  EXPECT_EQ(r.splits, kWgradDirectTargetBlocks);
}

TEST(ConvWgradDirect, Refusals) {
  EXPECT_NE(wgrad_direct_refusal(conv(2, 8, 9, 9, 8, 3, 3, 2, 2, 1, 1)), "");        // stride 2
  EXPECT_NE(wgrad_direct_refusal(conv(2, 8, 9, 9, 8, 3, 3, 1, 2, 1, 1)), "");        // stride 1 x 2
  EXPECT_NE(wgrad_direct_refusal(conv(2, 8, 9, 9, 8, 5, 5, 1, 1, 2, 2)), "");        // 5x5
  EXPECT_NE(wgrad_direct_refusal(conv(2, 8, 9, 9, 8, 1, 1, 1, 1, 0, 0)), "");        // 1x1
  EXPECT_NE(wgrad_direct_refusal(conv(1, 8, 4, 1000, 8, 3, 3, 1, 1, 1, 1)), "");     // too wide
  EXPECT_EQ(wgrad_direct_refusal(conv(1, 8, 4, 100, 8, 3, 3, 1, 1, 1, 1)), "");      // 100 wide
  EXPECT_NE(wgrad_direct_refusal(conv(1, 8192, 1, 1, 8192, 3, 3, 1, 1, 1, 1)), "");  // grid y
  EXPECT_EQ(wgrad_direct_scratch_floats(conv(2, 8, 9, 9, 8, 5, 5, 1, 1, 2, 2), true), 0u);
}

}  // namespace
