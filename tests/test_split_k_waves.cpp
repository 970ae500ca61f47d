// split_k_for_waves (kernels/common/split_k_waves.h): the split-K count whose waves finish first;
// split_k_one_wave: the one that fills a wave at most.
#include <gtest/gtest.h>

#include <algorithm>

#include "kernels/common/split_k_waves.h"

namespace cnn {
namespace {

// The cost is waves x (k-tiles a block + overhead).
TEST(SplitKWaves, CostCountsWavesAndBlockLength) {
  EXPECT_EQ(split_k_waves_cost(36, 256, 132, 3, 4), 1 * (86 + 4));   // 108 blocks, one wave
  EXPECT_EQ(split_k_waves_cost(36, 256, 132, 4, 4), 2 * (64 + 4));   // 144 blocks: two
  EXPECT_EQ(split_k_waves_cost(36, 256, 132, 7, 4), 2 * (37 + 4));   // 252 blocks: two
  EXPECT_EQ(split_k_waves_cost(36, 256, 132, 11, 4), 3 * (24 + 4));  // 396 blocks: three full
  EXPECT_EQ(split_k_waves_cost(1, 10, 1, 1, 0), 10);
}

// 36 tiles (VGG's 256-channel 3x3 weight gradient in 128 x 128 tiles) on 132 SMs: one wave of 3
// splits leaves 24 SMs idle; 7 splits in two waves are shorter.
TEST(SplitKWaves, TakesTwoFullerWavesOverOneShortOfSlots) {
  EXPECT_EQ(split_k_for_waves(36, 256, 132, 4, 4), 7);
  EXPECT_EQ(split_k_for_waves(36, 256, 132, 4, 0), 11);  // no overhead: three full waves
}

// Where the tiles divide the slots the one full wave wins; 9 tiles of 132 SMs take 14 splits
// (126 blocks) and 18 tiles 7 (126).
TEST(SplitKWaves, FillsOneWaveWhereThatIsShortest) {
  EXPECT_EQ(split_k_for_waves(4, 1000, 132, 4, 4), 33);
  EXPECT_EQ(split_k_for_waves(9, 1024, 132, 4, 4), 14);
  EXPECT_EQ(split_k_for_waves(18, 256, 132, 4, 4), 7);
}

// The bounds: at least min_ktiles k-tiles a split, at most max_splits, never below 1; more tiles
// than slots take no split.
TEST(SplitKWaves, KeepsItsBounds) {
  EXPECT_EQ(split_k_for_waves(1, 12, 132, 4, 4), 3);  // 12 k-tiles: 3 splits of 4
  EXPECT_EQ(split_k_for_waves(1, 3, 132, 4, 4), 1);   // under one split's minimum
  EXPECT_EQ(split_k_for_waves(1, 0, 132, 4, 4), 1);   // no k at all
  EXPECT_EQ(split_k_for_waves(1, 100000, 132, 1, 0, 50), 50);
  EXPECT_EQ(split_k_for_waves(500, 64, 132, 4, 4), 1);  // 4 waves of whole tiles already
  EXPECT_EQ(split_k_for_waves(0, 64, 0, 4, 4), split_k_for_waves(1, 64, 1, 4, 4));
}

// The default: the split that fills one wave at most, within the same bounds.
TEST(SplitKWaves, OneWaveIsTheFloorOfSlotsOverTiles) {
  EXPECT_EQ(split_k_one_wave(36, 256, 132, 4), 3);
  EXPECT_EQ(split_k_one_wave(38, 256, 132, 4), 3);
  EXPECT_EQ(split_k_one_wave(10, 1024, 132, 4), 13);
  EXPECT_EQ(split_k_one_wave(1, 12, 132, 4), 3);    // 12 k-tiles: 3 splits of 4
  EXPECT_EQ(split_k_one_wave(500, 64, 132, 4), 1);  // more tiles than slots
  EXPECT_EQ(split_k_one_wave(1, 100000, 132, 1, 50), 50);
  EXPECT_EQ(split_k_one_wave(0, 0, 0, 0), 1);
}

// Exhaustive against the cost over small grids: the pick is the cheapest within the bounds and
// the fewest splits among the cheapest.
TEST(SplitKWaves, PickIsTheCheapestAndFewest) {
  for (int64_t tiles = 1; tiles <= 40; ++tiles)
    for (int64_t ktiles : {1, 5, 17, 64, 255, 1024})
      for (int64_t slots : {1, 8, 132, 264})
        for (int64_t overhead : {0, 2, 4}) {
          const int64_t pick = split_k_for_waves(tiles, ktiles, slots, 4, overhead);
          const int64_t most = std::max<int64_t>(
              1, std::min<int64_t>(ktiles / 4, 4 * ((slots + tiles - 1) / tiles)));
          ASSERT_GE(pick, 1);
          ASSERT_LE(pick, most);
          const int64_t cost = split_k_waves_cost(tiles, ktiles, slots, pick, overhead);
          for (int64_t s = 1; s <= most; ++s) {
            const int64_t c = split_k_waves_cost(tiles, ktiles, slots, s, overhead);
            ASSERT_GE(c, cost) << "tiles " << tiles << " ktiles " << ktiles << " slots " << slots
                               << " s " << s << " pick " << pick;
            if (s < pick) ASSERT_GT(c, cost);
          }
        }
}

}  // namespace
}  // namespace cnn
