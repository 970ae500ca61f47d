#include <algorithm>
#include <functional>
#include <optional>

#include "kernels/gemm/linear.h"
#include "kernels/gemm/linear_head.h"
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
    dev_ = dev;
    pass_scratch_.reset();  // a new shape needs new sizes
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

  // The GEMM workspaces of the forward and input gradient (split groups, CNN_WGMMA_GROUPS), and
  // the weight gradient's scratch where it runs in turn (beside, it has side_scratch).
  std::size_t scratch_floats(const Exec& ex, bool input_grad) const override {
    const PassScratch& p = pass_scratch(ex);
    std::size_t need = p.fwd;
    if (head_backward()) return need;
    if (input_grad) need = std::max(need, p.dgrad);
    return std::max(need, p.wgrad);
  }

  // The fused backward reads x anyway, so it also applies the ReLU mask of the layer before
  // (whose output x is) and that layer skips its own ReLU backward pass.
  bool can_mask_input_relu() const override { return head_backward(); }
  bool can_sum_input_bias_grad() const override { return head_backward(); }
  float* hand_over_bias_grad() override {
    bias_grad_downstream_ = db_ != nullptr;
    return db_;
  }

  // The weight, whose every backward GEMM (CPU, CUDA naive / tiled / gemm_cuda in any precision)
  // has one owner per element; not the fused head's, which splits the batch over blocks and
  // adds their sums by atomicAdd. The bias stays accumulating: its CUDA sum goes in by atomicAdd
  // beyond 1024 rows, and a bias gradient handed over is summed by the next layer's kernel.
  std::vector<size_t> overwritable_grads() const override {
    if (head_backward()) return {};
    return {0};
  }

  void forward(int n, const float* x, float* y, float* scratch, const Exec& ex) override {
    linear_forward(at(n), x, w_, b_, y, fused_relu_, algos_.fwd, ex, scratch, pass_scratch(ex).fwd);
  }

  void backward(int n, const float* x, const float* y, float* dy, float* dx, float* scratch,
                const Exec& ex) override {
    if (head_backward()) {
      const LinearShape s = at(n);
      if (relu_backward_here()) relu_backward(int64_t(n) * s.out, y, dy, dy, ex);
      return linear_head_backward(s, x, dy, w_, dw_, own_db(), dx, mask_input_relu_,
                                  input_bias_grad_, ex);
    }
    run_backward(n, x, y, dy, dx, scratch, scratch, ex, ex, [] {});
  }

  // The fused head is one kernel for both gradients: it stays on the one stream.
  bool backward_beside(int n, const float* x, const float* y, float* dy, float* dx, float* scratch,
                       float* side_scratch, const Exec& ex, const Exec& side,
                       const std::function<void()>& fork) override {
    if (head_backward()) return false;
    run_backward(n, x, y, dy, dx, scratch, side_scratch, ex, side, fork);
    return true;
  }
  std::size_t beside_scratch_floats(const Exec& ex) const override {
    return head_backward() ? 0 : pass_scratch(ex).wgrad;
  }

  PassAlgos* tuned_algos() override { return algo_ == Algo::Auto ? &algos_ : nullptr; }

  std::vector<TuneChoice> autotune(int n, const float* x, float* y, float* dy, float* dx,
                                   float* scratch, const Exec& ex) override {
    if (algo_ != Algo::Auto) return {};
    const LinearShape s = at(n);
    const std::string op = fmt::format("linear n{} in{} out{}{}{}", s.n, s.in, s.out,
                                       b_ ? " bias" : "", fused_relu_ ? " relu" : "");
    const auto forward = [&](Algo a) {
      linear_forward(s, x, w_, b_, y, fused_relu_, a, ex, scratch, pass_scratch(ex).fwd);
    };
    if (head_backward()) {
      // The fused kernel is both gradient passes at once, with nothing to pick between, so only
      // the forward is timed.
      const TuneChoice c = pick_fastest(TuneSite{name(), op, tune_cache_}, "forward", forward, ex);
      algos_.fwd = c.chosen;
      return {c};
    }
    const std::function<void(Algo)> input_grad = [&](Algo a) {
      linear_backward_data(s, dy, w_, dx, a, ex, scratch, pass_scratch(ex).dgrad);
    };
    return tune_passes(
        TuneSite{name(), op, tune_cache_}, forward,
        [&](Algo a) {
          linear_backward_weight(s, x, dy, dw_, own_db(), scratch, a, ex, overwrite_grads_,
                                 pass_scratch(ex).wgrad);
        },
        dx ? &input_grad : nullptr, &algos_, ex);
  }

 private:
  LinearShape at(int n) const { return {n, shape_.in, shape_.out}; }
  // The separate passes: dy's ReLU mask on ex, fork(), the weight gradient on `side` (with its
  // scratch, wgrad_scratch), the input gradient on ex (with dgrad_scratch, its GEMM workspace).
  void run_backward(int n, const float* x, const float* y, float* dy, float* dx,
                    float* dgrad_scratch, float* wgrad_scratch, const Exec& ex, const Exec& side,
                    const std::function<void()>& fork) {
    const LinearShape s = at(n);
    if (relu_backward_here()) relu_backward(int64_t(n) * s.out, y, dy, dy, ex);
    fork();
    linear_backward_weight(s, x, dy, dw_, own_db(), wgrad_scratch, algos_.dw, side,
                           overwrite_grads_, pass_scratch(ex).wgrad);
    if (!dx) return;
    linear_backward_data(s, dy, w_, dx, algos_.dx, ex, dgrad_scratch, pass_scratch(ex).dgrad);
    // Only the fused path is offered the mask (can_mask_input_relu); kept here too so that the
    // flag means the same whatever path runs.
    if (mask_input_relu_) relu_backward(int64_t(n) * s.in, x, dx, dx, ex);
  }
  // Whether backward runs the fused head kernel in place of the weight- and input-gradient
  // passes: for algo auto or fast, whose passes would otherwise be latency-bound launches at
  // these shapes; naive, tiled and igemm keep their own passes, so that each stays selectable to
  // bisect (as does CNN_LINEAR_HEAD=0). Fixed at setup, so the Network's pairing of the ReLU mask
  // (can_mask_input_relu) holds for every batch.
  bool head_backward() const {
    return (algo_ == Algo::Auto || algo_ == Algo::Fast) &&
           linear_head_backward_applies(shape_, dev_);
  }
  // The bias gradient this layer's backward sums itself: null where it has none, or where the
  // layer after sums it (hand_over_bias_grad).
  float* own_db() const { return bias_grad_downstream_ ? nullptr : db_; }
  // The floats each pass's scratch holds at least (the sizes scratch_floats and
  // beside_scratch_floats ask the Network for), worked out once per device, precision and
  // determinism: they ask the device for its cluster capacity, host work no launch should repeat.
  struct PassScratch {
    Device device;
    Precision precision;
    bool deterministic;
    std::size_t fwd, dgrad, wgrad;
  };
  const PassScratch& pass_scratch(const Exec& ex) const {
    const std::optional<PassScratch>& p = pass_scratch_;
    if (!p || p->device != ex.device || p->precision != ex.precision ||
        p->deterministic != ex.deterministic)
      pass_scratch_ = PassScratch{ex.device,
                                  ex.precision,
                                  ex.deterministic,
                                  linear_forward_scratch_floats(shape_, ex),
                                  linear_backward_data_scratch_floats(shape_, ex),
                                  linear_backward_weight_scratch_floats(shape_, ex)};
    return *pass_scratch_;
  }
  mutable std::optional<PassScratch> pass_scratch_;
  LinearShape shape_;
  bool bias_grad_downstream_ = false;
  Algo algo_ = Algo::Auto;  // as configured; Auto may be refined per pass by autotune()
  PassAlgos algos_;
  Device dev_ = Device::CPU;
  float *w_ = nullptr, *b_ = nullptr, *dw_ = nullptr, *db_ = nullptr;
};

}  // namespace

std::unique_ptr<Layer> make_linear_layer(const LayerSpec& spec) {
  return std::make_unique<LinearLayer>(spec);
}

}  // namespace cnn
