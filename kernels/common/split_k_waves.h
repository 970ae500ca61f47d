#pragma once
// Split-K for a grid of equal blocks that the GPU runs in waves (a block an SM slot, the next
// block where one finishes): the split count whose waves finish first.
//
// A grid of `tiles` output tiles, each split over k into S runs of ceil(ktiles / S) k-tiles, is
// tiles * S blocks; with `slots` blocks resident at once it runs ceil(tiles * S / slots) waves,
// each as long as one block: ceil(ktiles / S) k-tiles plus the block's fixed cost (pipeline fill,
// the epilogue's atomics), `overhead` k-tiles' worth. The split that fills one wave,
// floor(slots / tiles), leaves slots idle whenever tiles does not divide slots: 36 tiles on 132
// SMs take 3 splits, 108 blocks, and 24 SMs wait; 7 splits run 252 blocks in 2 waves of 37 k-tiles
// each (74 k-tiles) where 3 splits run one wave of 86. The waves' pick is CNN_SPLIT_K_WAVES=1
// (not yet measured on a GPU); split_k_one_wave is the default.
#include <algorithm>
#include <cstdint>

#include "runtime/math_util.h"

namespace cnn {

// The split that fills one wave at most: floor(slots / tiles), within the same bounds.
inline int64_t split_k_one_wave(int64_t tiles, int64_t ktiles, int64_t slots, int64_t min_ktiles,
                                int64_t max_splits = 65535) {
  const int64_t want =
      std::max<int64_t>(1, std::max<int64_t>(1, slots) / std::max<int64_t>(1, tiles));
  return std::max<int64_t>(1,
                           std::min({want, ktiles / std::max<int64_t>(1, min_ktiles), max_splits}));
}

// The model's length of a grid, in k-tiles: waves times one block's k-tiles and overhead.
inline int64_t split_k_waves_cost(int64_t tiles, int64_t ktiles, int64_t slots, int64_t splits,
                                  int64_t overhead) {
  return ceil_div(tiles * splits, slots) * (ceil_div(ktiles, splits) + overhead);
}

// The split count in [1, max(1, min(ktiles / min_ktiles, max_splits))] of least cost; the fewest
// splits among equals (fewer partial tiles to add). Past four waves more splits only add
// overhead (the idle part of the last wave is under a quarter of the whole), so the search stops
// there: at most 4 ceil(slots / tiles) candidates.
inline int64_t split_k_for_waves(int64_t tiles, int64_t ktiles, int64_t slots, int64_t min_ktiles,
                                 int64_t overhead, int64_t max_splits = 65535) {
  tiles = std::max<int64_t>(1, tiles);
  slots = std::max<int64_t>(1, slots);
  const int64_t most = std::max<int64_t>(1, std::min({ktiles / std::max<int64_t>(1, min_ktiles),
                                                      max_splits, 4 * ceil_div(slots, tiles)}));
  int64_t best = 1, best_cost = split_k_waves_cost(tiles, ktiles, slots, 1, overhead);
  for (int64_t s = 2; s <= most; ++s) {
    const int64_t cost = split_k_waves_cost(tiles, ktiles, slots, s, overhead);
    if (cost < best_cost) best = s, best_cost = cost;
  }
  return best;
}

}  // namespace cnn
