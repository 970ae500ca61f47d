#include "kernels/gemm/linear.h"
#include "kernels/pointwise/relu.h"
#include "layers/layer_factories.h"
#include "runtime/error.h"

namespace cnn {
namespace {

class LinearLayer : public Layer {
 public:
  using Layer::Layer;

  Shape setup(const Shape& in, Device dev) override {
    Shape out = Layer::setup(in, dev);
    shape_ = {static_cast<int>(in[0]), static_cast<int>(in[1]), spec_.out_features};
    check_linear_shape(shape_);
    algo_ = spec_.algo;
    algos_ = PassAlgos(algo_);
    return out;
  }

  std::vector<ParamInfo> param_shapes() const override {
    std::vector<ParamInfo> p = {{name() + ".weight", {shape_.out, shape_.in}, 0, false}};
    if (spec_.bias) p.push_back({name() + ".bias", {shape_.out}, 0, true});
    return p;
  }

  void bind(float* params, float* grads) override {
    const int64_t wn = int64_t(shape_.out) * shape_.in;
    w_ = params;
    dw_ = grads;
    b_ = spec_.bias ? params + wn : nullptr;
    db_ = spec_.bias ? grads + wn : nullptr;
  }

  void init_params(float* h_params, std::mt19937_64& rng) const override {
    const int64_t wn = int64_t(shape_.out) * shape_.in;
    init_weight_and_bias(h_params, wn, spec_.bias ? h_params + wn : nullptr, shape_.out, shape_.in,
                         rng);
  }

  std::size_t scratch_floats(const Exec& ex, bool /*input_grad*/) const override {
    return linear_backward_weight_scratch_floats(shape_, ex);
  }

  void forward(int n, const float* x, float* y, float* /*scratch*/, const Exec& ex) override {
    linear_forward(at(n), x, w_, b_, y, fused_relu_, algos_.fwd, ex);
  }

  void backward(int n, const float* x, const float* y, float* dy, float* dx, float* scratch,
                const Exec& ex) override {
    const LinearShape s = at(n);
    if (relu_backward_here()) relu_backward(int64_t(n) * s.out, y, dy, dy, ex);
    linear_backward_weight(s, x, dy, dw_, db_, scratch, algos_.dw, ex);
    if (dx) linear_backward_data(s, dy, w_, dx, algos_.dx, ex);
  }

  std::vector<TuneChoice> autotune(int n, const float* x, float* y, float* dy, float* dx,
                                   float* scratch, const Exec& ex) override {
    if (algo_ != Algo::Auto) return {};
    const LinearShape s = at(n);
    const std::function<void(Algo)> input_grad = [&](Algo a) {
      linear_backward_data(s, dy, w_, dx, a, ex);
    };
    const std::string op = fmt::format("linear n{} in{} out{}{}{}", s.n, s.in, s.out,
                                       b_ ? " bias" : "", fused_relu_ ? " relu" : "");
    return tune_passes(
        TuneSite{name(), op, tune_cache_},
        [&](Algo a) { linear_forward(s, x, w_, b_, y, fused_relu_, a, ex); },
        [&](Algo a) { linear_backward_weight(s, x, dy, dw_, db_, scratch, a, ex); },
        dx ? &input_grad : nullptr, &algos_, ex);
  }

 private:
  LinearShape at(int n) const { return {n, shape_.in, shape_.out}; }
  LinearShape shape_;
  Algo algo_ = Algo::Auto;  // as configured; Auto may be refined per pass by autotune()
  PassAlgos algos_;
  float *w_ = nullptr, *b_ = nullptr, *dw_ = nullptr, *db_ = nullptr;
};

}  // namespace

std::unique_ptr<Layer> make_linear_layer(const LayerSpec& spec) {
  return std::make_unique<LinearLayer>(spec);
}

}  // namespace cnn
