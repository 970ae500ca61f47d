#include <algorithm>
#include <functional>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_grouped.h"
#include "kernels/conv/conv_relu_pool.h"
#include "kernels/pointwise/relu.h"
#include "layers/layer_factories.h"
#include "runtime/error.h"

namespace cnn {
namespace {

class Conv2dLayer : public Layer {
 public:
  using Layer::Layer;

  Shape setup(const Shape& in, Device dev) override {
    Shape out = Layer::setup(in, dev);
    shape_.c = static_cast<int>(in[1]);
    shape_.h = static_cast<int>(in[2]);
    shape_.w = static_cast<int>(in[3]);
    shape_.oc = spec_.out_channels;
    shape_.kh = spec_.kernel_h;
    shape_.kw = spec_.kernel_w;
    shape_.stride_h = spec_.stride_h;
    shape_.stride_w = spec_.stride_w;
    shape_.pad_h = spec_.pad_h;
    shape_.pad_w = spec_.pad_w;
    shape_.n = static_cast<int>(in[0]);
    // Grouped or dilated convolutions run the grouped op; the plain one keeps conv2d's kernels.
    grouped_ = spec_.groups != 1 || spec_.dil_h != 1 || spec_.dil_w != 1;
    gshape_ = grouped_shape(shape_);
    algo_ = spec_.algo;  // CNN_ALGO* already applied by the Network
    if (grouped_) {
      check_conv2d_grouped_shape(gshape_);
      check_conv2d_grouped_algo(name().c_str(), gshape_, algo_);
    } else {
      check_conv2d_shape(shape_);
    }
    algos_ = PassAlgos(algo_);
    return out;
  }

  std::vector<ParamInfo> param_shapes() const override {
    std::vector<ParamInfo> p = {
        {name() + ".weight", {shape_.oc, in_per_group(), shape_.kh, shape_.kw}, 0, false}};
    if (spec_.bias) p.push_back({name() + ".bias", {shape_.oc}, 0, true});
    return p;
  }

  void bind(float* params, float* grads) override {
    w_ = params;
    dw_ = grads;
    const int64_t wn = int64_t(shape_.oc) * in_per_group() * shape_.kh * shape_.kw;
    b_ = spec_.bias ? params + wn : nullptr;
    db_ = spec_.bias ? grads + wn : nullptr;
  }

  void init_params(float* h_params, std::mt19937_64& rng) const override {
    const int64_t fan_in = int64_t(in_per_group()) * shape_.kh * shape_.kw;
    const int64_t wn = fan_in * shape_.oc;
    init_weight_and_bias(h_params, wn, spec_.bias ? h_params + wn : nullptr, shape_.oc, fan_in,
                         rng);
  }

  // One scratch serves all three passes (the largest need, not the sum): the weight gradient's
  // deterministic partial sums and, for algo wgmma-nhwc, the forward's and the input gradient's
  // channels-last copies. They never hold it at the same time: every pass of every layer is
  // enqueued on the one stream ex.stream, backward() enqueues the weight gradient (which writes
  // its partial sums and reduces them into dw in its own launches) before the input gradient, so
  // the input gradient's pre-passes overwrite the scratch only after the weight gradient's last
  // read of it, and a forward reads only what its own pre-passes wrote just before.
  std::size_t scratch_floats(const Exec& ex, bool input_grad) const override {
    if (fused_pool_) return conv_relu_pool_backward_weight_scratch_floats(shape_, ex);
    if (grouped_) return grouped_scratch_floats(algos_, input_grad, ex);
    return plain_scratch_floats(algos_, input_grad, ex);
  }

  // algo auto times every candidate of every pass on the Network's scratch (wgmma-nhwc among
  // them), so the scratch covers them all while it tunes; the Network shrinks it to
  // scratch_floats afterwards, when each pass has its pick.
  std::size_t tune_scratch_floats(const Exec& ex, bool input_grad) const override {
    std::size_t need = scratch_floats(ex, input_grad);
    if (algo_ != Algo::Auto || fused_pool_) return need;
    for (Algo a : tune_candidates())
      need = std::max(need, grouped_ ? grouped_scratch_floats(PassAlgos(a), input_grad, ex)
                                     : plain_scratch_floats(PassAlgos(a), input_grad, ex));
    return need;
  }

  bool fuse_relu_pool(Layer& pool) override {
    int32_t* argmax = pool.pool_argmax();
    if (grouped_ || !fused_relu_ || !argmax || !conv_relu_pool_applicable(shape_)) return false;
    pool_argmax_ = argmax;
    fused_pool_ = true;
    return true;
  }

  // Fused with the pool (fuse_relu_pool): y is the pool's output (N, OC, OH/2, OW/2).
  void forward(int n, const float* x, float* y, float* scratch, const Exec& ex) override {
    if (fused_pool_) return conv_relu_pool_forward(at(n), x, w_, b_, y, pool_argmax_, ex);
    run_forward(n, x, y, scratch, algos_.fwd, ex);
  }

  // Fused with the pool: y and dy are the pool's output and its gradient.
  void backward(int n, const float* x, const float* y, float* dy, float* dx, float* scratch,
                const Exec& ex) override {
    if (fused_pool_) {
      CNN_CHECK(!dx, "{}: the fused conv-relu-pool computes no input gradient", name());
      conv_relu_pool_backward_weight(at(n), x, y, dy, pool_argmax_, dw_, db_, scratch, ex);
      return;
    }
    if (relu_backward_here())
      relu_backward(int64_t(n) * gshape_.oc * gshape_.oh() * gshape_.ow(), y, dy, dy, ex);
    // Both at once where they can share dy's channels-last copy (wgmma-nhwc at bf16).
    if (!grouped_ &&
        conv2d_backward_shared(at(n), x, dy, w_, dw_, db_, dx, scratch, algos_.dw, algos_.dx, ex))
      return;
    run_backward_weight(n, x, dy, scratch, algos_.dw, ex);
    // After the weight gradient on the same stream: both may use the scratch (scratch_floats).
    if (dx) run_backward_data(n, dy, dx, scratch, algos_.dx, ex);
  }

  // The weight gradient on `side` with its own scratch, the input gradient on ex's stream; each
  // pass alone (not the shared dy copy of conv2d_backward_shared, which orders them). Not for a
  // layer whose only pass is the weight gradient (no dx, or the fused conv-relu-pool).
  bool backward_beside(int n, const float* x, const float* y, float* dy, float* dx, float* scratch,
                       float* side_scratch, const Exec& ex, const Exec& side,
                       const std::function<void()>& fork) override {
    if (fused_pool_ || !dx) return false;
    if (relu_backward_here())
      relu_backward(int64_t(n) * gshape_.oc * gshape_.oh() * gshape_.ow(), y, dy, dy, ex);
    fork();
    run_backward_weight(n, x, dy, side_scratch, algos_.dw, side);
    run_backward_data(n, dy, dx, scratch, algos_.dx, ex);
    return true;
  }
  std::size_t beside_scratch_floats(const Exec& ex) const override {
    if (fused_pool_) return 0;
    if (grouped_) return conv2d_grouped_backward_weight_scratch_floats(gshape_, algos_.dw, ex);
    return conv2d_backward_weight_scratch_floats(shape_, ex);
  }

  PassAlgos* tuned_algos() override {
    return algo_ == Algo::Auto && !fused_pool_ ? &algos_ : nullptr;
  }
  // The dense kernels say it for the shape, the pick and the bias gradient. A grouped or dilated
  // layer on a dense form (conv2d_grouped_dense.h, conv2d_dilated_dense.h) runs them on shapes of
  // the form's own: a superset there (wgmma or wgmma-nhwc, TF32 or BF16), whose switch may time
  // the same kernel both ways; its own kernels have no clusters.
  bool weight_grad_may_cluster(int n, const Exec& ex) const override {
    if (fused_pool_) return false;
    if (!grouped_) return conv2d_backward_weight_may_cluster(at(n), algos_.dw, ex, db_ != nullptr);
    return ex.device == Device::CUDA && ex.precision != Precision::FP32 &&
           (algos_.dw == Algo::Wgmma || algos_.dw == Algo::WgmmaNhwc) &&
           conv2d_grouped_runs_dense(grouped_at(n), algos_.dw, ex);
  }

  std::vector<TuneChoice> autotune(int n, const float* x, float* y, float* dy, float* dx,
                                   float* scratch, const Exec& ex) override {
    if (algo_ != Algo::Auto || fused_pool_) return {};  // the fused pass has no variants
    const std::function<void(Algo)> input_grad = [&](Algo a) {
      run_backward_data(n, dy, dx, scratch, a, ex);
    };
    // Everything the variants' speed depends on: the shape (groups and dilation included), the
    // bias and the fused ReLU.
    const Conv2dShape s = at(n);
    const std::string op = fmt::format(
        "conv2d n{} c{} h{} w{} oc{} k{}x{} s{}x{} p{}x{}{}{}{}", s.n, s.c, s.h, s.w, s.oc, s.kh,
        s.kw, s.stride_h, s.stride_w, s.pad_h, s.pad_w,
        grouped_ ? fmt::format(" d{}x{} g{}", spec_.dil_h, spec_.dil_w, spec_.groups) : "",
        b_ ? " bias" : "", fused_relu_ ? " relu" : "");
    return tune_passes(
        TuneSite{name(), op, tune_cache_}, [&](Algo a) { run_forward(n, x, y, scratch, a, ex); },
        [&](Algo a) { run_backward_weight(n, x, dy, scratch, a, ex); }, dx ? &input_grad : nullptr,
        &algos_, ex);
  }

 private:
  int in_per_group() const { return shape_.c / spec_.groups; }

  Conv2dGroupedShape grouped_shape(const Conv2dShape& c) const {
    Conv2dGroupedShape g;
    g.n = c.n, g.c = c.c, g.h = c.h, g.w = c.w, g.oc = c.oc, g.kh = c.kh, g.kw = c.kw;
    g.stride_h = c.stride_h, g.stride_w = c.stride_w, g.pad_h = c.pad_h, g.pad_w = c.pad_w;
    g.dil_h = spec_.dil_h, g.dil_w = spec_.dil_w, g.groups = spec_.groups;
    return g;
  }
  Conv2dGroupedShape grouped_at(int n) const {
    Conv2dGroupedShape g = gshape_;
    g.n = n;
    return g;
  }

  // The plain (ungrouped, unfused) convolution's need with the passes run by `algos`.
  std::size_t plain_scratch_floats(const PassAlgos& algos, bool input_grad, const Exec& ex) const {
    return std::max(
        {conv2d_backward_weight_scratch_floats(shape_, ex),
         conv2d_forward_scratch_floats(shape_, algos.fwd, ex),
         input_grad ? conv2d_backward_data_scratch_floats(shape_, algos.dx, ex) : std::size_t(0)});
  }

  // The grouped op's need with the passes run by `algos` (the dense variants' copies); sized at
  // the setup batch, the largest a pass runs.
  std::size_t grouped_scratch_floats(const PassAlgos& algos, bool input_grad,
                                     const Exec& ex) const {
    return std::max({conv2d_grouped_backward_weight_scratch_floats(gshape_, algos.dw, ex),
                     conv2d_grouped_forward_scratch_floats(gshape_, algos.fwd, ex),
                     input_grad ? conv2d_grouped_backward_data_scratch_floats(gshape_, algos.dx, ex)
                                : std::size_t(0)});
  }

  void run_forward(int n, const float* x, float* y, float* scratch, Algo a, const Exec& ex) {
    if (grouped_)
      conv2d_grouped_forward(grouped_at(n), x, w_, b_, y, fused_relu_, scratch, a, ex);
    else
      conv2d_forward(at(n), x, w_, b_, y, fused_relu_, scratch, a, ex);
  }
  void run_backward_weight(int n, const float* x, const float* dy, float* scratch, Algo a,
                           const Exec& ex) {
    Exec e = ex;
    e.clusters = ex.clusters && algos_.dw_clusters;
    if (grouped_)
      conv2d_grouped_backward_weight(grouped_at(n), x, dy, dw_, db_, scratch, a, e);
    else
      conv2d_backward_weight(at(n), x, dy, dw_, db_, scratch, a, e);
  }
  void run_backward_data(int n, const float* dy, float* dx, float* scratch, Algo a,
                         const Exec& ex) {
    if (grouped_)
      conv2d_grouped_backward_data(grouped_at(n), dy, w_, dx, scratch, a, ex);
    else
      conv2d_backward_data(at(n), dy, w_, dx, scratch, a, ex);
  }

  Conv2dShape at(int n) const {
    Conv2dShape s = shape_;
    s.n = n;
    return s;
  }
  Conv2dShape shape_;
  Conv2dGroupedShape gshape_;  // the same with dilation and groups
  bool grouped_ = false;       // groups != 1 or dilation != 1: the grouped op serves it
  Algo algo_ = Algo::Auto;     // as configured; Auto may be refined per pass by autotune()
  PassAlgos algos_;
  float *w_ = nullptr, *b_ = nullptr, *dw_ = nullptr, *db_ = nullptr;
  int32_t* pool_argmax_ = nullptr;  // the fused pool's (N, OC, OH/2, OW/2)
};

}  // namespace

std::unique_ptr<Layer> make_conv2d_layer(const LayerSpec& spec) {
  return std::make_unique<Conv2dLayer>(spec);
}

}  // namespace cnn
