#pragma once
// One factory per layer kind; make_layer() picks by LayerSpec::kind.
#include <memory>

#include "kernels/pool/maxpool.h"
#include "layers/layer.h"

namespace cnn {

std::unique_ptr<Layer> make_conv2d_layer(const LayerSpec& spec);
std::unique_ptr<Layer> make_linear_layer(const LayerSpec& spec);
std::unique_ptr<Layer> make_relu_layer(const LayerSpec& spec);
std::unique_ptr<Layer> make_maxpool2d_layer(const LayerSpec& spec);
std::unique_ptr<Layer> make_flatten_layer(const LayerSpec& spec);
std::unique_ptr<Layer> make_batchnorm_layer(const LayerSpec& spec);  // 2d and 1d
std::unique_ptr<Layer> make_avgpool2d_layer(const LayerSpec& spec);
std::unique_ptr<Layer> make_global_avgpool_layer(const LayerSpec& spec);
std::unique_ptr<Layer> make_dropout_layer(const LayerSpec& spec);
// The seed a dropout layer's masks come from: the run's seed mixed with the layer's name.
uint64_t dropout_layer_seed(uint64_t run_seed, const std::string& layer_name);

// The pooling window of a max- or average-pooling layer (the two share MaxPoolShape) over its
// input (N, C, H, W).
inline MaxPoolShape pool_window_shape(const Shape& in, const LayerSpec& s) {
  return {static_cast<int>(in[0]),
          static_cast<int>(in[1]),
          static_cast<int>(in[2]),
          static_cast<int>(in[3]),
          s.kernel_h,
          s.kernel_w,
          s.stride_h,
          s.stride_w,
          s.pad_h,
          s.pad_w};
}

// Kaiming-uniform weights as torch.nn initializes them (a = sqrt(5): bound 1/sqrt(fan_in)) and
// PyTorch's bias bound 1/sqrt(fan_in), drawn in a fixed order so a seed reproduces the network.
void init_weight_and_bias(float* w, int64_t w_count, float* b, int64_t b_count, int64_t fan_in,
                          std::mt19937_64& rng);

}  // namespace cnn
