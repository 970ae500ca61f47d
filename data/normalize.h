#pragma once
// Per-channel input normalization in [0, 1] pixel units, as torchvision's ToTensor + Normalize:
// value = (pixel / 255 - mean[c]) / std[c]. The checkpoint stores it so that ./infer normalizes
// exactly as training did.
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace cnn {

struct Normalization {
  std::vector<float> mean;  // (C), in [0, 1] pixel units
  std::vector<float> std;   // (C), > 0
  int channels() const { return static_cast<int>(mean.size()); }
};

// Mean and standard deviation of every channel over the whole dataset (double accumulation; the
// population std, as is usual for these statistics). A constant channel gets std 1, not 0.
Normalization compute_normalization(const Dataset& d);

// The configured mean/std when given (checked: one value per channel, std > 0), else computed
// from the training set. Throws naming data.mean / data.std.
Normalization resolve_normalization(const std::vector<float>& mean, const std::vector<float>& std,
                                    const Dataset& train);

// Throws unless the normalization has `channels` entries and positive, finite std.
void validate_normalization(const Normalization& n, int channels);

// One (C, H, W) uint8 image to normalized floats, with the same float operations as the gather
// kernel (bitwise equal to a gathered sample without augmentation).
void normalize_image(const uint8_t* pixels, int c, int h, int w, const Normalization& norm,
                     float* out);

// "mean (0.1307) std (0.3081)".
std::string normalization_str(const Normalization& n);

}  // namespace cnn
