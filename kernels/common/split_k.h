#pragma once
// Split-K for a grid of equal blocks: the split count that fills one wave of blocks at most.
//
// A grid of `tiles` output tiles, each split over k into S runs of ceil(ktiles / S) k-tiles, is
// tiles * S blocks; with `slots` blocks resident at once, floor(slots / tiles) splits run in one
// wave. More splits that spill into a second wave lost where it was measured: VGG's 256-channel
// 8x8 weight gradient (36 tiles on 132 SMs) took 128.9 us on 3 splits (108 blocks, 24 SMs idle)
// and 148.4 us on 7 (252 blocks, two waves of 37 k-tiles where one wave runs 86; H100, TF32),
// so each block's fixed cost (the ring's fill, the epilogue's atomics of a whole tile) is
// worth about 30 k-tiles there, and a second wave does not pay for itself (docs/performance.md,
// "Split-K over one wave").
#include <algorithm>
#include <cstdint>

namespace cnn {

// floor(slots / tiles) splits, at least 1, at most ktiles / min_ktiles (each split gets at least
// min_ktiles k-tiles) and max_splits (the grid's limit).
inline int64_t split_k_one_wave(int64_t tiles, int64_t ktiles, int64_t slots, int64_t min_ktiles,
                                int64_t max_splits = 65535) {
  const int64_t want =
      std::max<int64_t>(1, std::max<int64_t>(1, slots) / std::max<int64_t>(1, tiles));
  return std::max<int64_t>(1,
                           std::min({want, ktiles / std::max<int64_t>(1, min_ktiles), max_splits}));
}

}  // namespace cnn
