#pragma once
// The scratch of an op that stages copies before a dense pass (conv2d_grouped_dense,
// conv2d_dilated_dense): [first copy][second copy][the dense pass's own scratch], each part
// starting 16-byte aligned, so that the dense kernels' vector and TMA loads see aligned bases.
#include <cstddef>

#include "runtime/error.h"

namespace cnn {

inline std::size_t round_up4(std::size_t floats) {
  return (floats + 3) / 4 * 4;
}

struct StagedScratch {
  float* first;
  float* second;
  float* dense;  // null when the dense pass needs none
};

// Checks that a scratch of `need` floats was given (null only when need is 0), then carves it.
inline StagedScratch carve_staged_scratch(const char* what, float* scratch, std::size_t need,
                                          std::size_t first, std::size_t second,
                                          std::size_t dense) {
  CNN_CHECK(scratch || need == 0,
            "{}: needs a scratch buffer of {} floats (the _scratch_floats function), got null",
            what, need);
  float* b = scratch + round_up4(first);
  float* c = b + round_up4(second);
  return {scratch, b, dense > 0 ? c : nullptr};
}

}  // namespace cnn
