#pragma once
// Batchnorm folded into the layer before it, for inference: a conv2d (or linear) followed
// directly by batchnorm2d (batchnorm1d) becomes one conv2d (linear) with a bias,
//   w'[o] = w[o] * s[o],  b'[o] = (b[o] - running_mean[o]) * s[o] + bias_bn[o],
//   s[o] = weight_bn[o] / sqrt(running_var[o] + eps),
// which computes the eval-mode pair in one pass (and lets a following ReLU fuse again). Pairs
// inside residual blocks (their layers and shortcuts) fold the same way.
#include <string>
#include <vector>

#include "layers/layer_spec.h"
#include "runtime/tensor.h"

namespace cnn {

struct FoldedNetwork {
  std::vector<LayerSpec> specs;     // the batchnorm layers that folded are gone
  std::vector<float> params;        // flat, in the layout of a Network built from `specs`
  std::vector<float> buffers;       // the batchnorm layers that did not fold keep theirs
  std::vector<std::string> folded;  // "conv1 + bn1", one per fold
};

// The specs alone: each conv2d (linear) directly followed by batchnorm2d (batchnorm1d) becomes
// one layer with a bias, the batchnorm gone (what fold_batchnorm's specs are).
std::vector<LayerSpec> fold_batchnorm_specs(const std::vector<LayerSpec>& specs);

// params / buffers: flat, in the layout of a Network built from `specs` (Network::params_to_host,
// Checkpoint::params). Throws when they do not fit that layout.
FoldedNetwork fold_batchnorm(const std::vector<LayerSpec>& specs, const Shape& input_chw,
                             const std::vector<float>& params, const std::vector<float>& buffers);

}  // namespace cnn
