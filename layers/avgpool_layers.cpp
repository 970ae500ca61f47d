// avgpool2d and global_avgpool: parameter-free, deterministic in both passes.
#include "kernels/pool/avgpool.h"
#include "layers/layer_factories.h"

namespace cnn {
namespace {

class AvgPoolLayer : public Layer {
 public:
  using Layer::Layer;
  Shape setup(const Shape& in, Device dev) override {
    Shape out = Layer::setup(in, dev);
    shape_ = pool_window_shape(in, spec_);
    check_avgpool_shape(shape_);
    return out;
  }
  void forward(int n, const float* x, float* y, float* /*scratch*/, const Exec& ex) override {
    avgpool_forward(at(n), x, y, ex);
  }
  void backward(int n, const float*, const float*, float* dy, float* dx, float*,
                const Exec& ex) override {
    if (dx) avgpool_backward(at(n), dy, dx, ex);
  }

 private:
  AvgPoolShape at(int n) const {
    AvgPoolShape s = shape_;
    s.n = n;
    return s;
  }
  AvgPoolShape shape_;
};

class GlobalAvgPoolLayer : public Layer {
 public:
  using Layer::Layer;
  void forward(int n, const float* x, float* y, float* /*scratch*/, const Exec& ex) override {
    global_avgpool_forward(int64_t(n) * in_[1], in_[2] * in_[3], x, y, ex);
  }
  void backward(int n, const float*, const float*, float* dy, float* dx, float*,
                const Exec& ex) override {
    if (dx) global_avgpool_backward(int64_t(n) * in_[1], in_[2] * in_[3], dy, dx, ex);
  }
};

}  // namespace

std::unique_ptr<Layer> make_avgpool2d_layer(const LayerSpec& spec) {
  return std::make_unique<AvgPoolLayer>(spec);
}
std::unique_ptr<Layer> make_global_avgpool_layer(const LayerSpec& spec) {
  return std::make_unique<GlobalAvgPoolLayer>(spec);
}

}  // namespace cnn
