#pragma once
// The augmentation of one sample, drawn from a counter-based hash of (seed, epoch, sample index):
// no generator state, so the CPU and the GPU, any batch size and any resume point draw the same.
#include <cstdint>

#include "runtime/hash_rng.h"

namespace cnn {

struct AugmentDraw {
  int dy = 0, dx = 0;  // crop offset in [-shift, shift]: out(y, x) = in(y + dy, x' + dx)
  bool flip = false;   // x' = w - 1 - x when set, else x
};

CNN_DATA_HD inline AugmentDraw draw_augment(uint64_t seed, int64_t epoch, int64_t index, int shift,
                                            bool flip) {
  const uint64_t h = hash3(seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(index));
  AugmentDraw a;
  if (shift > 0) {
    const uint32_t span = 2u * static_cast<uint32_t>(shift) + 1u;
    a.dy = static_cast<int>(bounded32(static_cast<uint32_t>(h), span)) - shift;
    a.dx = static_cast<int>(bounded32(static_cast<uint32_t>(h >> 32), span)) - shift;
  }
  a.flip = flip && (mix64(h ^ 0xF1F1F1F1ull) & 1u);
  return a;
}

}  // namespace cnn
