// The parameter-free layers: relu, maxpool2d, flatten.
#include "kernels/pointwise/relu.h"
#include "kernels/pool/maxpool.h"
#include "layers/layer_factories.h"
#include "runtime/memory.h"

namespace cnn {
namespace {

int64_t per_image(const Shape& s) {
  return shape_numel(s) / s.at(0);
}

class ReluLayer : public Layer {
 public:
  using Layer::Layer;
  void forward(int n, const float* x, float* y, float* /*scratch*/, const Exec& ex) override {
    relu_forward(n * per_image(in_), x, y, ex);
  }
  void backward(int n, const float*, const float* y, float* dy, float* dx, float*,
                const Exec& ex) override {
    if (dx) relu_backward(n * per_image(in_), y, dy, dx, ex);
  }
};

class MaxPoolLayer : public Layer {
 public:
  using Layer::Layer;
  Shape setup(const Shape& in, Device dev) override {
    Shape out = Layer::setup(in, dev);
    shape_ = pool_window_shape(in, spec_);
    check_maxpool_shape(shape_);
    argmax_ = Buffer<int32_t>(static_cast<size_t>(shape_numel(out)), dev);
    return out;
  }
  void forward(int n, const float* x, float* y, float* /*scratch*/, const Exec& ex) override {
    maxpool_forward(at(n), x, y, argmax_.data(), ex);
  }
  void backward(int n, const float*, const float* y, float* dy, float* dx, float*,
                const Exec& ex) override {
    if (dx) maxpool_backward(at(n), dy, argmax_.data(), dx, ex, mask_input_relu_ ? y : nullptr);
  }
  bool can_mask_input_relu() const override { return true; }
  int32_t* pool_argmax() override {
    const bool two_by_two = shape_.kh == 2 && shape_.kw == 2 && shape_.stride_h == 2 &&
                            shape_.stride_w == 2 && shape_.pad_h == 0 && shape_.pad_w == 0;
    return two_by_two ? argmax_.data() : nullptr;
  }

 private:
  MaxPoolShape at(int n) const {
    MaxPoolShape s = shape_;
    s.n = n;
    return s;
  }
  MaxPoolShape shape_;
  Buffer<int32_t> argmax_;  // (N, C, OH, OW)
};

// Flatten is a view change: NCHW is already contiguous as (N, C*H*W), so the Network aliases
// its output to its input and these passes copy only when the buffers differ.
class FlattenLayer : public Layer {
 public:
  using Layer::Layer;
  void forward(int n, const float* x, float* y, float* /*scratch*/, const Exec& ex) override {
    if (x != y) raw_copy(y, ex.device, x, ex.device, n * per_image(in_) * sizeof(float), ex.stream);
  }
  void backward(int n, const float*, const float*, float* dy, float* dx, float*,
                const Exec& ex) override {
    if (dx && dx != dy)
      raw_copy(dx, ex.device, dy, ex.device, n * per_image(in_) * sizeof(float), ex.stream);
  }
};

}  // namespace

std::unique_ptr<Layer> make_relu_layer(const LayerSpec& spec) {
  return std::make_unique<ReluLayer>(spec);
}
std::unique_ptr<Layer> make_maxpool2d_layer(const LayerSpec& spec) {
  return std::make_unique<MaxPoolLayer>(spec);
}
std::unique_ptr<Layer> make_flatten_layer(const LayerSpec& spec) {
  return std::make_unique<FlattenLayer>(spec);
}

}  // namespace cnn
