#include "layers/ref_network.h"

#include "kernels/conv/conv2d.h"
#include "runtime/error.h"
#include "kernels/gemm/linear.h"
#include "kernels/pool/maxpool.h"
#include "kernels/pointwise/add.h"
#include "kernels/pointwise/relu.h"
#include "kernels/loss/softmax_xent.h"

namespace cnn {
namespace {

Conv2dShape conv_shape(const LayerSpec& s, const Shape& in) {
  Conv2dShape c;
  c.n = int(in[0]);
  c.c = int(in[1]);
  c.h = int(in[2]);
  c.w = int(in[3]);
  c.oc = s.out_channels;
  c.kh = s.kernel_h;
  c.kw = s.kernel_w;
  c.stride_h = s.stride_h;
  c.stride_w = s.stride_w;
  c.pad_h = s.pad_h;
  c.pad_w = s.pad_w;
  return c;
}

MaxPoolShape pool_shape(const LayerSpec& s, const Shape& in) {
  return {int(in[0]), int(in[1]), int(in[2]), int(in[3]), s.kernel_h,
          s.kernel_w, s.stride_h, s.stride_w, s.pad_h,    s.pad_w};
}

}  // namespace

RefNetwork::RefNetwork(const std::vector<LayerSpec>& specs, const Shape& input_chw, int n) : n_(n) {
  in_shape_ = {n};
  in_shape_.insert(in_shape_.end(), input_chw.begin(), input_chw.end());
  Shape cur = in_shape_;
  for (const GraphNode& node : layer_graph(specs)) {
    const LayerSpec& s = node.spec;
    cur = node.input < 0 ? in_shape_ : steps_[size_t(node.input)].out;
    if (s.kind == LayerKind::SoftmaxCrossEntropy) {
      layer_output_shape(s, cur);
      softmax_ = true;
      classes_ = int(cur[1]);
      break;
    }
    Step st{s, cur, cur, num_params_, node.input, node.shortcut_input};
    if (s.kind != LayerKind::Residual) st.out = layer_output_shape(s, cur);
    // Same parameter order and names as the float Network (weight, then bias).
    if (s.kind == LayerKind::Conv2d || s.kind == LayerKind::Linear) {
      Shape w = s.kind == LayerKind::Conv2d ? Shape{s.out_channels, cur[1], s.kernel_h, s.kernel_w}
                                            : Shape{s.out_features, cur[1]};
      infos_.push_back({s.name + ".weight", w, num_params_, false});
      num_params_ += shape_numel(w);
      if (s.bias) {
        int64_t b = w[0];
        infos_.push_back({s.name + ".bias", {b}, num_params_, true});
        num_params_ += b;
      }
    }
    cur = st.out;
    steps_.push_back(st);
  }
  out_count_ = shape_numel(cur);
}

std::vector<std::vector<double>> RefNetwork::forward_all(
    const std::vector<double>& p, const std::vector<double>& x,
    std::vector<std::vector<int32_t>>* argmax) const {
  std::vector<std::vector<double>> acts = {x};
  if (argmax) argmax->assign(steps_.size(), {});
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Step& st = steps_[i];
    const std::vector<double>& in = acts[size_t(st.input + 1)];
    std::vector<double> out(static_cast<size_t>(shape_numel(st.out)));
    const double* w = p.data() + st.param_offset;
    switch (st.spec.kind) {
      case LayerKind::Conv2d: {
        Conv2dShape c = conv_shape(st.spec, st.in);
        const double* b = st.spec.bias ? w + int64_t(c.oc) * c.c * c.kh * c.kw : nullptr;
        conv2d_forward_cpu(c, in.data(), w, b, out.data(), false);
        break;
      }
      case LayerKind::Linear: {
        LinearShape l{n_, int(st.in[1]), st.spec.out_features};
        const double* b = st.spec.bias ? w + int64_t(l.out) * l.in : nullptr;
        linear_forward_cpu(l, in.data(), w, b, out.data(), false);
        break;
      }
      case LayerKind::Relu:
        relu_forward_cpu(int64_t(out.size()), in.data(), out.data());
        break;
      case LayerKind::MaxPool2d: {
        std::vector<int32_t> am(out.size());
        maxpool_forward_cpu(pool_shape(st.spec, st.in), in.data(), out.data(), am.data());
        if (argmax) (*argmax)[i] = std::move(am);
        break;
      }
      case LayerKind::Flatten:
        out = in;
        break;
      case LayerKind::SoftmaxCrossEntropy:
        break;
      case LayerKind::Residual:
        add_forward_cpu(int64_t(out.size()), in.data(), acts[size_t(st.shortcut_input + 1)].data(),
                        out.data());
        break;
    }
    acts.push_back(std::move(out));
  }
  return acts;
}

double RefNetwork::loss(const std::vector<double>& p, const std::vector<double>& x,
                        const std::vector<int32_t>& labels,
                        const std::vector<double>& probe) const {
  auto acts = forward_all(p, x, nullptr);
  const std::vector<double>& out = acts.back();
  double total = 0;
  if (softmax_) {
    std::vector<double> rows(n_);
    std::vector<int32_t> pred(n_);
    softmax_xent_cpu({n_, classes_}, out.data(), labels.data(), rows.data(), pred.data(),
                     static_cast<double*>(nullptr), 1.0);
    for (double r : rows) total += r;
    return total / n_;
  }
  for (size_t i = 0; i < out.size(); ++i) total += out[i] * probe[i];
  return total;
}

void RefNetwork::gradients(const std::vector<double>& p, const std::vector<double>& x,
                           const std::vector<int32_t>& labels, const std::vector<double>& probe,
                           std::vector<double>* dparams, std::vector<double>* dx) const {
  std::vector<std::vector<int32_t>> argmax;
  auto acts = forward_all(p, x, &argmax);
  std::vector<double> dy(acts.back().size());
  if (softmax_) {
    std::vector<double> rows(n_);
    std::vector<int32_t> pred(n_);
    softmax_xent_cpu({n_, classes_}, acts.back().data(), labels.data(), rows.data(), pred.data(),
                     dy.data(), 1.0 / n_);
  } else {
    dy = probe;
  }
  dparams->assign(static_cast<size_t>(num_params_), 0.0);
  // grad[i + 1]: the loss gradient w.r.t. the output of step i, summed over its readers;
  // grad[0]: w.r.t. the input.
  std::vector<std::vector<double>> grad(acts.size());
  grad.back() = std::move(dy);
  const auto sum_into = [&grad](int step, const std::vector<double>& g) {
    std::vector<double>& to = grad[size_t(step + 1)];
    if (to.empty()) to.assign(g.size(), 0.0);
    add_forward_cpu(int64_t(g.size()), to.data(), g.data(), to.data());
  };
  for (size_t i = steps_.size(); i-- > 0;) {
    const Step& st = steps_[i];
    const std::vector<double>& in = acts[size_t(st.input + 1)];
    dy = std::move(grad[i + 1]);
    if (dy.empty()) dy.assign(acts[i + 1].size(), 0.0);  // an output nothing reads
    std::vector<double> din(in.size(), 0.0);
    const double* w = p.data() + st.param_offset;
    double* dw = dparams->data() + st.param_offset;
    switch (st.spec.kind) {
      case LayerKind::Conv2d: {
        Conv2dShape c = conv_shape(st.spec, st.in);
        const int64_t wn = int64_t(c.oc) * c.c * c.kh * c.kw;
        conv2d_backward_weight_cpu(c, in.data(), dy.data(), dw, st.spec.bias ? dw + wn : nullptr);
        conv2d_backward_data_cpu(c, dy.data(), w, din.data());
        break;
      }
      case LayerKind::Linear: {
        LinearShape l{n_, int(st.in[1]), st.spec.out_features};
        const int64_t wn = int64_t(l.out) * l.in;
        linear_backward_weight_cpu(l, in.data(), dy.data(), dw, st.spec.bias ? dw + wn : nullptr);
        linear_backward_data_cpu(l, dy.data(), w, din.data());
        break;
      }
      case LayerKind::Relu:
        relu_backward_cpu(int64_t(din.size()), acts[i + 1].data(), dy.data(), din.data());
        break;
      case LayerKind::MaxPool2d:
        maxpool_backward_cpu(pool_shape(st.spec, st.in), dy.data(), argmax[i].data(), din.data());
        break;
      case LayerKind::Flatten:
        din = dy;
        break;
      case LayerKind::SoftmaxCrossEntropy:
        break;
      case LayerKind::Residual:  // the add passes dy to both of its inputs
        din = dy;
        sum_into(st.shortcut_input, dy);
        break;
    }
    sum_into(st.input, din);
  }
  if (dx) *dx = std::move(grad[0]);
}

}  // namespace cnn
