// The one-launch BatchNorm plan (kernels/norm/batchnorm_one_pass_plan.h): every channel covered by
// its cluster's registers, with the least waste any instance allows, inside the cluster and
// per-thread limits; the zoo's shapes on the plans the kernels were sized for; past the limit
// (values per channel, channels) no plan, so the three-launch passes run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>

#include "kernels/norm/batchnorm_one_pass_plan.h"

using namespace cnn;

namespace {

// The fewest register slots any instance covers M with, in clusters of at most the limit.
int64_t least_slots(int64_t m) {
  int64_t best = INT64_MAX;
  for (int v : kBnOnePassPerThread) {
    const int64_t per_block = int64_t(kBnOnePassThreads) * v;
    const int64_t r = (m + per_block - 1) / per_block;
    if (r <= kBnOnePassMaxCluster) best = std::min(best, r * per_block);
  }
  return best;
}

void expect_sound(const BatchNormShape& s) {
  SCOPED_TRACE(::testing::Message()
               << "(N, C, HW) = (" << s.n << ", " << s.c << ", " << s.hw << ")");
  const BatchNormOnePassPlan p = plan_batchnorm_one_pass(s);
  ASSERT_TRUE(p.fits);
  EXPECT_GE(p.cluster, 1);
  EXPECT_LE(p.cluster, kBnOnePassMaxCluster);
  EXPECT_NE(std::find(std::begin(kBnOnePassPerThread), std::end(kBnOnePassPerThread), p.per_thread),
            std::end(kBnOnePassPerThread));
  const int64_t m = s.count(), per_block = int64_t(kBnOnePassThreads) * p.per_thread;
  EXPECT_GE(p.slots(), m) << "coverage";
  EXPECT_LT(p.slots() - m, per_block) << "a block with nothing to hold";
  EXPECT_EQ(p.slots(), least_slots(m)) << "more waste than another instance";
}

}  // namespace

TEST(BatchNormOnePassPlan, CoversEveryChannelWithTheLeastWaste) {
  for (int n : {1, 2, 3, 7, 64, 128, 129, 256})
    for (int c : {1, 3, 32, 128, 1000})
      for (int64_t hw : {int64_t(1), int64_t(2), int64_t(7 * 7), int64_t(13 * 11), int64_t(28 * 28),
                         int64_t(32 * 32)})
        if (int64_t(n) * hw <= kBnOnePassMaxValues) expect_sound(BatchNormShape{n, c, hw});
  for (int64_t m = 2; m <= kBnOnePassMaxValues; m += 997) expect_sound(BatchNormShape{1, 64, m});
  expect_sound(BatchNormShape{1, 8, kBnOnePassMaxValues});
  expect_sound(BatchNormShape{2, 8, kBnOnePassMaxValues / 2});
}

TEST(BatchNormOnePassPlan, ZooShapesTakeTheirPlans) {
  struct Case {
    BatchNormShape s;
    int cluster, per_thread;
  };
  // ResNet (Fashion-MNIST) stages at batch 128: waste 6-12%, one wave of blocks or less.
  // VGG (CIFAR) stages: no waste; of the equal plans the smallest V whose grid fits one wave.
  for (const Case& k : {Case{{128, 32, 28 * 28}, 13, 32}, Case{{128, 64, 14 * 14}, 13, 8},
                        Case{{128, 128, 7 * 7}, 7, 4}, Case{{128, 64, 32 * 32}, 16, 32},
                        Case{{128, 128, 16 * 16}, 8, 16}, Case{{128, 256, 8 * 8}, 4, 8}}) {
    SCOPED_TRACE(::testing::Message()
                 << "(N, C, HW) = (" << k.s.n << ", " << k.s.c << ", " << k.s.hw << ")");
    const BatchNormOnePassPlan p = plan_batchnorm_one_pass(k.s);
    ASSERT_TRUE(p.fits);
    EXPECT_EQ(p.cluster, k.cluster);
    EXPECT_EQ(p.per_thread, k.per_thread);
  }
}

TEST(BatchNormOnePassPlan, PastTheLimitsThereIsNoPlan) {
  EXPECT_EQ(kBnOnePassMaxValues, 16 * 256 * 32);
  const BatchNormOnePassPlan at = plan_batchnorm_one_pass({1, 3, kBnOnePassMaxValues});
  ASSERT_TRUE(at.fits);
  EXPECT_EQ(at.cluster, kBnOnePassMaxCluster);
  EXPECT_EQ(at.per_thread, kBnOnePassMaxPerThread);
  EXPECT_FALSE(plan_batchnorm_one_pass({1, 3, kBnOnePassMaxValues + 1}).fits);
  EXPECT_FALSE(plan_batchnorm_one_pass({129, 3, 32 * 32}).fits);  // VGG stage 1 at batch 129
  EXPECT_FALSE(plan_batchnorm_one_pass({2, 3, 250001}).fits);
  EXPECT_TRUE(plan_batchnorm_one_pass({2, kBnOnePassMaxChannels, 4}).fits);
  EXPECT_FALSE(plan_batchnorm_one_pass({2, kBnOnePassMaxChannels + 1, 4}).fits);
}
