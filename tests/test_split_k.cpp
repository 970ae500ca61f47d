// split_k_one_wave (kernels/common/split_k.h): the split-K count that fills one wave at most.
#include <gtest/gtest.h>

#include "kernels/common/split_k.h"

namespace cnn {
namespace {

TEST(SplitK, OneWaveIsTheFloorOfSlotsOverTiles) {
  EXPECT_EQ(split_k_one_wave(36, 256, 132, 4), 3);  // VGG conv6's weight gradient: 108 blocks
  EXPECT_EQ(split_k_one_wave(38, 256, 132, 4), 3);
  EXPECT_EQ(split_k_one_wave(9, 1024, 132, 4), 14);
  EXPECT_EQ(split_k_one_wave(10, 1024, 132, 4), 13);
  EXPECT_EQ(split_k_one_wave(1, 12, 132, 4), 3);    // 12 k-tiles: 3 splits of 4
  EXPECT_EQ(split_k_one_wave(1, 3, 132, 4), 1);     // under one split's minimum
  EXPECT_EQ(split_k_one_wave(500, 64, 132, 4), 1);  // more tiles than slots
  EXPECT_EQ(split_k_one_wave(1, 100000, 132, 1, 50), 50);
  EXPECT_EQ(split_k_one_wave(0, 0, 0, 0), 1);
}

// Over small grids: the blocks fit one wave (or the tiles alone exceed it), each split has its
// minimum of k-tiles, and one more split would break a bound.
TEST(SplitK, OneWaveIsTheMostWithinTheBounds) {
  for (int64_t tiles = 1; tiles <= 40; ++tiles)
    for (int64_t ktiles : {1, 5, 17, 64, 255, 1024})
      for (int64_t slots : {1, 8, 132, 264}) {
        const int64_t s = split_k_one_wave(tiles, ktiles, slots, 4);
        ASSERT_GE(s, 1);
        if (s > 1) {
          ASSERT_LE(tiles * s, slots);
          ASSERT_LE(4 * s, ktiles);
        }
        const bool more_fits = tiles * (s + 1) <= slots && 4 * (s + 1) <= ktiles;
        ASSERT_FALSE(more_fits) << "tiles " << tiles << " ktiles " << ktiles << " slots " << slots;
      }
}

}  // namespace
}  // namespace cnn
