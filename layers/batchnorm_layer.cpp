// BatchNorm2d / BatchNorm1d: torch.nn's parameters (weight = 1, bias = 0) and buffers
// (running_mean = 0, running_var = 1, num_batches_tracked = 0) under torch's names, so that a
// checkpoint loads into torch.nn.BatchNorm2d unchanged. A following ReLU may be folded in by the
// Network (fused_relu()): the forward then writes max(y, 0) and the backward masks dy by y > 0
// inside its own passes (unless a max-pool downstream applies the mask), as conv and linear do.
// Ending a residual block's branch, it can run the block's add and the ReLU after it in its
// normalizing pass too (forward_residual).
#include <fmt/format.h>

#include "kernels/norm/batchnorm.h"
#include "layers/layer_factories.h"
#include "runtime/error.h"
#include "runtime/memory.h"

namespace cnn {
namespace {

class BatchNormLayer : public Layer {
 public:
  using Layer::Layer;

  Shape setup(const Shape& in, Device dev) override {
    Shape out = Layer::setup(in, dev);  // checks the rank (2d after conv, 1d after linear)
    shape_.n = static_cast<int>(in[0]);
    shape_.c = static_cast<int>(in[1]);
    shape_.hw = in.size() == 4 ? in[2] * in[3] : 1;
    check_batchnorm_shape(shape_, false);
    save_mean_ = Buffer<float>(size_t(shape_.c), dev);
    save_invstd_ = Buffer<float>(size_t(shape_.c), dev);
    const int64_t scratch = batchnorm_scratch_doubles(shape_, dev);
    if (scratch > 0) scratch_ = Buffer<double>(size_t(scratch), dev);
    return out;
  }

  std::vector<ParamInfo> param_shapes() const override {
    const int64_t c = shape_.c;
    return {{name() + ".weight", {c}, 0, true}, {name() + ".bias", {c}, 0, true}};
  }
  void bind(float* params, float* grads) override {
    gamma_ = params;
    beta_ = params + shape_.c;
    dgamma_ = grads;
    dbeta_ = grads + shape_.c;
  }
  void init_params(float* h_params, std::mt19937_64&) const override {
    for (int c = 0; c < shape_.c; ++c) {
      h_params[c] = 1.0f;
      h_params[shape_.c + c] = 0.0f;
    }
  }

  std::vector<ParamInfo> buffer_shapes() const override {
    const int64_t c = shape_.c;
    ParamInfo count{name() + ".num_batches_tracked", {}, 0, false};
    count.is_int64 = true;
    return {
        {name() + ".running_mean", {c}, 0, false}, {name() + ".running_var", {c}, 0, false}, count};
  }
  void bind_buffers(float* buffers) override {
    running_mean_ = buffers;
    running_var_ = buffers + shape_.c;
    num_batches_ = buffers + 2 * shape_.c;
  }
  void init_buffers(float* h_buffers) const override {
    for (int c = 0; c < shape_.c; ++c) {
      h_buffers[c] = 0.0f;
      h_buffers[shape_.c + c] = 1.0f;
    }
    h_buffers[2 * shape_.c] = 0.0f;
  }

  void forward(int n, const float* x, float* y, float* /*scratch*/, const Exec& ex) override {
    run_forward(n, x, nullptr, fused_relu_, y, ex);
  }

  bool can_fuse_residual() const override { return true; }
  void forward_residual(int n, const float* x, const float* residual, bool relu, float* y,
                        float* /*scratch*/, const Exec& ex) override {
    run_forward(n, x, residual, relu, y, ex);
  }

  // y: the post-ReLU output when the ReLU is fused; its sign is the ReLU's gradient mask, which
  // the CUDA passes recompute from x and beta (the forward's: the step has not updated it yet).
  void backward(int n, const float* x, const float* y, float* dy, float* dx, float*,
                const Exec& ex) override {
    const bool relu = relu_backward_here();
    batchnorm_backward(at(n), x, dy, gamma_, save_mean_.data(), save_invstd_.data(), dx, dgamma_,
                       dbeta_, scratch_.data(), ex, relu ? y : nullptr, relu ? beta_ : nullptr);
  }

 private:
  // The forward in training or eval mode (ex.training); residual (may be null) added before the
  // ReLU when relu.
  void run_forward(int n, const float* x, const float* residual, bool relu, float* y,
                   const Exec& ex) {
    const BatchNormShape s = at(n);
    const float eps = static_cast<float>(spec_.eps);
    if (!ex.training) {
      batchnorm_forward_eval(s, x, gamma_, beta_, running_mean_, running_var_, eps, y, ex, relu,
                             residual);
      return;
    }
    CNN_CHECK(s.count() > 1,
              "layer '{}' ({}): expected more than 1 value per channel when training, got a "
              "batch of {} with {} value(s) per image and channel (as torch.nn, which refuses "
              "it too; use data.drop_last: true or a larger batch)",
              name(), layer_kind_name(spec_.kind), n, s.hw);
    BatchNormTrainArgs a;
    a.momentum = static_cast<float>(spec_.momentum);
    a.eps = eps;
    a.running_mean = running_mean_;
    a.running_var = running_var_;
    a.num_batches = num_batches_;
    batchnorm_forward_train(s, x, gamma_, beta_, y, save_mean_.data(), save_invstd_.data(), a,
                            scratch_.data(), ex, relu, residual);
  }

  BatchNormShape at(int n) const {
    BatchNormShape s = shape_;
    s.n = n;
    return s;
  }
  BatchNormShape shape_;
  float *gamma_ = nullptr, *beta_ = nullptr, *dgamma_ = nullptr, *dbeta_ = nullptr;
  float *running_mean_ = nullptr, *running_var_ = nullptr, *num_batches_ = nullptr;
  Buffer<float> save_mean_, save_invstd_;  // (C) the last training forward's statistics
  Buffer<double> scratch_;                 // CUDA's per-channel partial sums
};

}  // namespace

std::unique_ptr<Layer> make_batchnorm_layer(const LayerSpec& spec) {
  return std::make_unique<BatchNormLayer>(spec);
}

}  // namespace cnn
