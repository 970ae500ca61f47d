// The window weight-gradient kernel's plan and index scheme on the CPU (CI has no GPU):
//   - its CPU model (staging buffers laid out as the kernel's shared memory, NaN in every cell the
//     kernel never writes, the position table, the tap offsets, the split of units and channel
//     chunks) against conv2d_backward_weight_cpu on awkward shapes, with and without db;
//   - the bank argument of the fragment loads: 8 rows x 4 lanes hit 32 distinct banks for every
//     k-step that lies inside the band (TF32 and BF16 slot orders), for the dy tile and for every
//     tap of the window;
//   - the plan's promises: strides 4 (mod 8), ws = OW (mod 4), shared memory within the limit,
//     splits a function of the shape only, every unit in exactly one split, refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_wgrad_window_plan.h"
#include "tests/conv_test_cases.h"
#include "tests/test_util.h"

using namespace cnn;
using conv_test::conv;
using conv_test::describe_shape;

namespace {

const std::vector<Conv2dShape>& model_shapes() {
  static const std::vector<Conv2dShape> shapes = {
      conv(2, 32, 28, 28, 32, 3, 3, 1, 1, 1, 1),  // ResNet stage 1 at batch 2: 7 bands of 4
      conv(3, 5, 13, 9, 7, 3, 3, 1, 1, 1, 1),     // C 5 (chunk padded), OC 7, odd image
      conv(1, 33, 14, 14, 48, 3, 3, 1, 1, 0, 0),  // C 33: two chunks, pad 0, OC 48
      conv(2, 16, 7, 7, 128, 3, 3, 1, 1, 1, 1),   // OC 128: 8 channels a block
      conv(3, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0),      // 1x1 image, 1x1 kernel
      conv(1, 3, 1, 1, 5, 3, 3, 1, 1, 1, 1),      // 1x1 image, 3x3 kernel (8 taps outside)
      conv(2, 9, 13, 9, 64, 5, 5, 1, 1, 2, 2),    // 5x5, OC 64
      conv(1, 17, 32, 32, 20, 5, 5, 1, 1, 0, 3),  // 5x5, pad 0 x 3
      conv(2, 6, 9, 13, 33, 3, 3, 1, 1, 3, 2),    // pad 3 > kernel - 1: zero rows and columns
      conv(2, 70, 10, 6, 100, 1, 1, 1, 1, 1, 0),  // 1x1 with padding, C 70, OC 100
      conv(1, 4, 40, 3, 3, 3, 3, 1, 1, 1, 1),     // 3-wide image: many rows a band
      conv(3, 32, 14, 14, 64, 5, 5, 1, 1, 2, 2),  // LeNet conv2: dy in 16-byte pieces, even rows
      conv(2, 11, 15, 12, 30, 5, 5, 1, 1, 2, 2),  // 15 x 12 output: 16-byte dy, any rows
      conv(2, 8, 6, 7, 40, 3, 3, 1, 1, 1, 1),     // 6 x 7: rows a multiple of 4, short last band
  };
  return shapes;
}

TEST(ConvWgradWindow, ModelMatchesReference) {
  for (const Conv2dShape& s : model_shapes()) {
    for (bool with_db : {true, false}) {
      const uint64_t seed = test::fresh_seed();
      SCOPED_TRACE(describe_shape(s) + (with_db ? " db" : " no db") + " seed " +
                   std::to_string(seed));
      ASSERT_TRUE(wgrad_window_supported(s, Precision::TF32))
          << wgrad_window_refusal(s, Precision::TF32);
      const conv_test::WgradProblem pr = conv_test::make_wgrad_problem(s, seed);
      const std::vector<float>&x = pr.x, &dy = pr.dy, &w0 = pr.dw0, &b0 = pr.db0;
      const size_t nw = w0.size();
      for (Precision prec : {Precision::TF32, Precision::BF16}) {
        std::vector<float> dw_ref = w0, db_ref = b0, dw = w0, db = b0;
        conv2d_backward_weight_cpu(s, x.data(), dy.data(), dw_ref.data(),
                                   with_db ? db_ref.data() : nullptr);
        wgrad_window_model_cpu(s, prec, x.data(), dy.data(), dw.data(),
                               with_db ? db.data() : nullptr);
        const double k = double(s.n) * s.oh() * s.ow();
        const double tol = 1e-5 * std::sqrt(k) * (1 + std::sqrt(k) / 3);
        for (size_t i = 0; i < nw; ++i)
          ASSERT_NEAR(dw[i], dw_ref[i], tol) << "dw[" << i << "] " << precision_name(prec);
        for (int i = 0; i < s.oc; ++i)
          ASSERT_NEAR(db[i], db_ref[i], tol) << "db[" << i << "] " << precision_name(prec);
      }
    }
  }
}

// Banks of 8 rows (row stride `stride`) x 4 lanes at the given word offsets: all distinct?
bool banks_distinct(int stride, const int (&off)[4]) {
  std::set<int> banks;
  for (int g = 0; g < 8; ++g)
    for (int t = 0; t < 4; ++t) banks.insert((g * stride + off[t]) % 32);
  return banks.size() == 32;
}

TEST(ConvWgradWindow, FragmentLoadsAreBankConflictFree) {
  for (const Conv2dShape& s : model_shapes()) {
    for (Precision prec : {Precision::TF32, Precision::BF16}) {
      SCOPED_TRACE(describe_shape(s) + " " + precision_name(prec));
      const WgradWindowPlan p = wgrad_window_plan(s, prec);
      const int ow = s.ow();
      std::vector<int> table(p.kp);
      for (int q = 0; q < p.kp; ++q) table[q] = q < p.p ? (q / ow) * p.ws + q % ow : 0;
      // One load: lanes t take positions k0 + t + 4 j (the same j for all), j < kstep / 4.
      for (int k0 = 0; k0 + p.kstep <= p.p; k0 += p.kstep)
        for (int j = 0; j < p.kstep / 4; ++j) {
          int a[4], b[4];
          for (int t = 0; t < 4; ++t) a[t] = k0 + t + 4 * j;
          EXPECT_TRUE(banks_distinct(p.ds, a)) << "dy load, k0 " << k0 << " j " << j;
          for (int ky = 0; ky < s.kh; ++ky)
            for (int kx = 0; kx < s.kw; ++kx) {
              for (int t = 0; t < 4; ++t) b[t] = table[k0 + t + 4 * j] + ky * p.ws + kx;
              EXPECT_TRUE(banks_distinct(p.cs, b))
                  << "window load, k0 " << k0 << " j " << j << " tap " << ky << "," << kx;
            }
        }
    }
  }
}

TEST(ConvWgradWindow, PlanKeepsItsPromises) {
  for (const Conv2dShape& s : model_shapes()) {
    SCOPED_TRACE(describe_shape(s));
    const WgradWindowPlan t = wgrad_window_plan(s, Precision::TF32);
    const WgradWindowPlan b = wgrad_window_plan(s, Precision::BF16);
    // The split, and with it the deterministic scratch, does not depend on the precision.
    EXPECT_EQ(t.rows, b.rows);
    EXPECT_EQ(t.splits, b.splits);
    EXPECT_EQ(t.units_per_split, b.units_per_split);
    for (const WgradWindowPlan& p : {t, b}) {
      EXPECT_EQ(p.ds % 8, 4);
      EXPECT_EQ(p.cs % 8, 4);
      EXPECT_EQ(p.ws % 4, s.ow() % 4);
      EXPECT_GE(p.ws, p.ww);
      EXPECT_GE(p.cs, p.wr * p.ws);
      EXPECT_GE(p.ds, p.kp);
      EXPECT_EQ(p.kp % p.kstep, 0);
      EXPECT_LE(p.smem, kWgradWindowMaxSmem);
      EXPECT_GE(p.oc_pad, s.oc);
      EXPECT_GE(p.chunks * p.cb, s.c);
      EXPECT_GE(p.bands * p.rows, s.oh());
      EXPECT_LT((p.bands - 1) * p.rows, s.oh());  // no empty band
      // Every unit in exactly one split, no split empty.
      EXPECT_GE(p.splits * p.units_per_split, p.units);
      EXPECT_LT((p.splits - 1) * p.units_per_split, p.units);
      EXPECT_LE(int64_t{p.chunks} * p.splits, 2 * kWgradWindowTargetBlocks + p.chunks);
      // Accumulators a thread within the register budget.
      EXPECT_LE(p.mtw * p.cgw * ((s.kh * s.kw + p.wt - 1) / p.wt) * 4, 104);
      EXPECT_EQ(p.wm * p.wt * p.wc, 4);
      // 16-byte dy pieces only where every band starts 16-byte aligned.
      if (p.dy_vec) {
        EXPECT_EQ(s.oh() * s.ow() % 4, 0);
        EXPECT_EQ(p.rows * s.ow() % 4, 0);
      }
    }
    Exec ex;
    ex.deterministic = true;
    EXPECT_EQ(wgrad_window_scratch_floats(s, ex), size_t(t.splits) * size_t(t.slots));
    ex.deterministic = false;
    EXPECT_EQ(wgrad_window_scratch_floats(s, ex), 0u);
  }
}

TEST(ConvWgradWindow, RefusesWhatItCannotRun) {
  EXPECT_FALSE(wgrad_window_supported(conv(2, 8, 9, 9, 8, 3, 3, 2, 2, 1, 1), Precision::TF32));
  EXPECT_FALSE(wgrad_window_supported(conv(2, 8, 9, 9, 8, 3, 3, 1, 1, 1, 1), Precision::FP32));
  EXPECT_FALSE(wgrad_window_supported(conv(2, 8, 9, 9, 129, 3, 3, 1, 1, 1, 1), Precision::TF32));
  EXPECT_FALSE(wgrad_window_supported(conv(2, 8, 9, 9, 65, 5, 5, 1, 1, 2, 2), Precision::BF16));
  EXPECT_FALSE(wgrad_window_supported(conv(2, 8, 9, 9, 8, 7, 7, 1, 1, 3, 3), Precision::TF32));
  EXPECT_FALSE(wgrad_window_supported(conv(2, 8, 9, 9, 8, 3, 5, 1, 1, 1, 2), Precision::TF32));
  // A row too wide for two stages of one-row bands (32 channels x 3 rows x 4000 floats).
  EXPECT_FALSE(wgrad_window_supported(conv(1, 32, 4, 4000, 32, 3, 3, 1, 1, 1, 1), Precision::TF32));
  EXPECT_TRUE(wgrad_window_supported(conv(1, 32, 4, 64, 32, 3, 3, 1, 1, 1, 1), Precision::BF16));
  EXPECT_THROW(wgrad_window_plan(conv(2, 8, 9, 9, 8, 7, 7, 1, 1, 3, 3), Precision::TF32), Error);
}

// The ResNet stage-1 layer's plan, as the kernel comments and the lead's predictions assume it.
TEST(ConvWgradWindow, ResNetStage1Plan) {
  const WgradWindowPlan p =
      wgrad_window_plan(conv(128, 32, 28, 28, 32, 3, 3, 1, 1, 1, 1), Precision::TF32);
  EXPECT_EQ(p.cb, 32);
  EXPECT_EQ(p.chunks, 1);
  EXPECT_EQ(p.rows, 4);
  EXPECT_EQ(p.bands, 7);
  EXPECT_EQ(p.units, 896);
  EXPECT_EQ(p.units_per_split, 4);
  EXPECT_EQ(p.splits, 224);
  EXPECT_EQ(p.kp, 112);
  EXPECT_EQ(p.ws, 32);
  EXPECT_TRUE(p.dy_vec);
}

// LeNet's conv2 (14 x 14, 5x5, OC 64): bands of an even number of rows, so that dy's 196-float
// planes are copied in 16-byte pieces; 8 channels a block, the 25 taps over two warps.
TEST(ConvWgradWindow, LeNetConv2Plan) {
  const WgradWindowPlan p =
      wgrad_window_plan(conv(128, 32, 14, 14, 64, 5, 5, 1, 1, 2, 2), Precision::TF32);
  EXPECT_TRUE(p.dy_vec);
  EXPECT_EQ(p.rows, 8);
  EXPECT_EQ(p.bands, 2);
  EXPECT_EQ(p.kp, 112);
  EXPECT_EQ(p.cb, 8);
  EXPECT_EQ(p.chunks, 4);
  EXPECT_EQ(p.oc_pad, 64);
  EXPECT_EQ(p.wt, 2);
}

}  // namespace
