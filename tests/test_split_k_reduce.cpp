// The CPU twin of the split-K group reduction (kernels/gemm/split_k_reduce.h) on values worked
// out by hand: the groups summed in order, then alpha, beta * C, the bias and ReLU; the
// workspace's padded rows; beta == 0 reads no C.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/gemm/split_k_reduce.h"
#include "runtime/error.h"

using namespace cnn;

TEST(SplitKReduceCpu, SumsGroupsThenAppliesTheEpilogue) {
  // 2 groups of a (2, 3) product, rows padded to 4 floats (the pad holds junk never read).
  const SplitKReduceShape s{2, 2, 3, 4, 3};
  const std::vector<float> work = {1,  2,  3,  99, 4,  5,  6,   99,   // group 0
                                   10, 20, 30, 99, 40, 50, -70, 99};  // group 1
  std::vector<float> c = {1, 1, 1, 2, 2, 2};
  const float bias[3] = {0.5f, -100.f, 0.f};
  GemmEpilogue e;
  e.alpha = 2.f;
  e.beta = 0.5f;
  e.bias = bias;
  e.relu = true;
  split_k_reduce_cpu(s, work.data(), e, c.data());
  // row 0: 2 * (11, 22, 33) + 0.5 * 1 + bias = (23, 0 (ReLU of -55.5), 66.5)
  // row 1: 2 * (44, 55, -64) + 0.5 * 2 + bias = (89.5, 11, 0 (ReLU of -127))
  EXPECT_EQ(c, (std::vector<float>{22.f + 0.5f + 0.5f, 0.f, 66.5f, 89.5f, 11.f, 0.f}));
}

TEST(SplitKReduceCpu, BetaZeroReadsNoC) {
  const SplitKReduceShape s{3, 1, 2, 4, 2};
  const std::vector<float> work = {1, 2, 0, 0, 3, 4, 0, 0, 5, 6, 0, 0};
  std::vector<float> c = {NAN, NAN};
  split_k_reduce_cpu(s, work.data(), GemmEpilogue{}, c.data());
  EXPECT_EQ(c, (std::vector<float>{9.f, 12.f}));
}

TEST(SplitKReduceCpu, WorkspaceFloatsPadRowsToFour) {
  EXPECT_EQ(split_k_work_floats(2, 3, 5), 2u * 3u * 8u);
  EXPECT_EQ(split_k_work_floats(1, 1, 4), 4u);
  EXPECT_THROW(split_k_work_floats(0, 1, 1), Error);
}
