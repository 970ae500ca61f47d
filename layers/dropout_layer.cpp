// Dropout: masks in training (kernels/pointwise/dropout.h), a copy in eval.
#include "kernels/pointwise/dropout.h"
#include "layers/layer_factories.h"
#include "runtime/hash_rng.h"
#include "runtime/memory.h"

namespace cnn {
namespace {

// FNV-1a of the layer's name: two dropout layers of one network draw unrelated masks, and a
// layer keeps its masks when layers are added before it.
uint64_t name_hash(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

class DropoutLayer : public Layer {
 public:
  using Layer::Layer;
  void forward(int n, const float* x, float* y, float* /*scratch*/, const Exec& ex) override {
    const int64_t count = int64_t(n) * per_image();
    if (!ex.training || spec_.dropout_p == 0) {
      if (x != y) raw_copy(y, ex.device, x, ex.device, size_t(count) * sizeof(float), ex.stream);
      return;
    }
    dropout_forward(count, x, y, args(ex), ex);
  }
  // Backward follows a training forward (the Network runs no other), so the mask applies.
  void backward(int n, const float*, const float*, float* dy, float* dx, float*,
                const Exec& ex) override {
    if (!dx) return;
    const int64_t count = int64_t(n) * per_image();
    if (spec_.dropout_p == 0) {
      if (dx != dy)
        raw_copy(dx, ex.device, dy, ex.device, size_t(count) * sizeof(float), ex.stream);
      return;
    }
    dropout_backward(count, dy, dx, args(ex), ex);
  }

 private:
  int64_t per_image() const { return shape_numel(in_) / in_.at(0); }
  DropoutArgs args(const Exec& ex) const {
    DropoutArgs a;
    a.p = static_cast<float>(spec_.dropout_p);
    a.seed = dropout_layer_seed(ex.seed, name());
    a.step = ex.step;
    return a;
  }
};

}  // namespace

uint64_t dropout_layer_seed(uint64_t run_seed, const std::string& layer_name) {
  return mix64(run_seed ^ name_hash(layer_name));
}

std::unique_ptr<Layer> make_dropout_layer(const LayerSpec& spec) {
  return std::make_unique<DropoutLayer>(spec);
}

}  // namespace cnn
