#include "layers/ref_network.h"

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_grouped.h"
#include "kernels/gemm/linear.h"
#include "kernels/loss/softmax_xent.h"
#include "kernels/norm/batchnorm.h"
#include "kernels/pointwise/add.h"
#include "kernels/pointwise/dropout.h"
#include "kernels/pointwise/relu.h"
#include "kernels/pool/avgpool.h"
#include "kernels/pool/maxpool.h"
#include "layers/layer_factories.h"
#include "runtime/error.h"

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

// Grouped or dilated convolutions run the grouped op's reference; plain ones keep conv2d's.
bool is_grouped(const LayerSpec& s) {
  return s.groups != 1 || s.dil_h != 1 || s.dil_w != 1;
}

Conv2dGroupedShape grouped_shape(const LayerSpec& s, const Shape& in) {
  const Conv2dShape c = conv_shape(s, in);
  Conv2dGroupedShape g;
  g.n = c.n, g.c = c.c, g.h = c.h, g.w = c.w, g.oc = c.oc, g.kh = c.kh, g.kw = c.kw;
  g.stride_h = c.stride_h, g.stride_w = c.stride_w, g.pad_h = c.pad_h, g.pad_w = c.pad_w;
  g.dil_h = s.dil_h, g.dil_w = s.dil_w, g.groups = s.groups;
  return g;
}

MaxPoolShape pool_shape(const LayerSpec& s, const Shape& in) {
  return {int(in[0]), int(in[1]), int(in[2]), int(in[3]), s.kernel_h,
          s.kernel_w, s.stride_h, s.stride_w, s.pad_h,    s.pad_w};
}

BatchNormShape bn_shape(const Shape& in) {
  return {int(in[0]), int(in[1]), in.size() == 4 ? in[2] * in[3] : 1};
}

// The float Network's dropout mask times its scale, per element (0 or 1 / (1 - p) in float).
std::vector<double> dropout_factors(const LayerSpec& s, uint64_t seed, int64_t count) {
  DropoutArgs a;
  a.p = static_cast<float>(s.dropout_p);
  a.seed = dropout_layer_seed(seed, s.name);
  std::vector<float> ones(size_t(count), 1.0f), f(ones.size());
  dropout_forward_cpu(count, ones.data(), f.data(), a);
  return std::vector<double>(f.begin(), f.end());
}

}  // namespace

RefNetwork::RefNetwork(const std::vector<LayerSpec>& specs, const Shape& input_chw, int n,
                       double label_smoothing, uint64_t seed)
    : n_(n), label_smoothing_(label_smoothing), seed_(seed) {
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
      Shape w = s.kind == LayerKind::Conv2d
                    ? Shape{s.out_channels, cur[1] / s.groups, s.kernel_h, s.kernel_w}
                    : Shape{s.out_features, cur[1]};
      infos_.push_back({s.name + ".weight", w, num_params_, false});
      num_params_ += shape_numel(w);
      if (s.bias) {
        int64_t b = w[0];
        infos_.push_back({s.name + ".bias", {b}, num_params_, true});
        num_params_ += b;
      }
    }
    if (s.kind == LayerKind::BatchNorm2d || s.kind == LayerKind::BatchNorm1d) {
      infos_.push_back({s.name + ".weight", {cur[1]}, num_params_, true});
      infos_.push_back({s.name + ".bias", {cur[1]}, num_params_ + cur[1], true});
      num_params_ += 2 * cur[1];
    }
    cur = st.out;
    steps_.push_back(st);
  }
  out_count_ = shape_numel(cur);
}

std::vector<std::vector<double>> RefNetwork::forward_all(
    const std::vector<double>& p, const std::vector<double>& x,
    std::vector<std::vector<int32_t>>* argmax) const {
  return forward_from(0, {x}, p, argmax);
}

std::vector<std::vector<double>> RefNetwork::activations(const std::vector<double>& p,
                                                         const std::vector<double>& x,
                                                         std::vector<uint64_t>* pieces) const {
  return forward_from(0, {x}, p, nullptr, pieces);
}

size_t RefNetwork::step_of_param(int64_t offset) const {
  for (size_t i = 0; i < steps_.size(); ++i) {
    const int64_t end = i + 1 < steps_.size() ? steps_[i + 1].param_offset : num_params_;
    if (steps_[i].param_offset <= offset && offset < end) return i;
  }
  CNN_FAIL("parameter index {} is outside the network's {} parameters", offset, num_params_);
}

std::vector<std::vector<double>> RefNetwork::forward_from(
    size_t first, const std::vector<std::vector<double>>& prefix, const std::vector<double>& p,
    std::vector<std::vector<int32_t>>* argmax, std::vector<uint64_t>* pieces) const {
  CNN_CHECK(prefix.size() > first, "forward_from: {} activations given, {} needed", prefix.size(),
            first + 1);
  std::vector<std::vector<double>> acts(first + 1);
  if (first == 0) acts[0] = prefix[0];
  const auto act = [&](int j) -> const std::vector<double>& {
    return size_t(j) <= first ? prefix[size_t(j)] : acts[size_t(j)];
  };
  if (argmax) argmax->assign(steps_.size(), {});
  if (pieces) pieces->assign(steps_.size(), 0);
  // FNV-1a over one value per element.
  const auto hash = [](auto begin, auto end, auto key) {
    uint64_t h = 1469598103934665603ull;
    for (auto it = begin; it != end; ++it) h = (h ^ uint64_t(key(*it))) * 1099511628211ull;
    return h;
  };
  for (size_t i = first; i < steps_.size(); ++i) {
    const Step& st = steps_[i];
    const std::vector<double>& in = act(st.input + 1);
    std::vector<double> out(static_cast<size_t>(shape_numel(st.out)));
    const double* w = p.data() + st.param_offset;
    switch (st.spec.kind) {
      case LayerKind::Conv2d: {
        if (is_grouped(st.spec)) {
          const Conv2dGroupedShape g = grouped_shape(st.spec, st.in);
          const double* b = st.spec.bias ? w + int64_t(g.oc) * g.cg() * g.kh * g.kw : nullptr;
          conv2d_grouped_forward_cpu(g, in.data(), w, b, out.data(), false);
          break;
        }
        Conv2dShape c = conv_shape(st.spec, st.in);
        const double* b = st.spec.bias ? w + int64_t(c.oc) * c.c * c.kh * c.kw : nullptr;
        // The numerical gradient runs this forward twice per checked coordinate: the im2col
        // form, equal to the reference's sums to rounding, keeps a VGG-sized check in seconds.
        conv2d_forward_im2col_cpu(c, in.data(), w, b, out.data());
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
        if (pieces) (*pieces)[i] = hash(in.begin(), in.end(), [](double v) { return v > 0; });
        break;
      case LayerKind::MaxPool2d: {
        std::vector<int32_t> am(out.size());
        maxpool_forward_cpu(pool_shape(st.spec, st.in), in.data(), out.data(), am.data());
        if (pieces) (*pieces)[i] = hash(am.begin(), am.end(), [](int32_t v) { return v; });
        if (argmax) (*argmax)[i] = std::move(am);
        break;
      }
      case LayerKind::Flatten:
        out = in;
        break;
      case LayerKind::BatchNorm2d:
      case LayerKind::BatchNorm1d: {
        const BatchNormShape b = bn_shape(st.in);
        std::vector<double> mean(size_t(b.c)), invstd(size_t(b.c));
        batchnorm_forward_train_cpu(b, in.data(), w, w + b.c, out.data(), mean.data(),
                                    invstd.data(), st.spec.eps);
        break;
      }
      case LayerKind::AvgPool2d:
        avgpool_forward_cpu(pool_shape(st.spec, st.in), in.data(), out.data());
        break;
      case LayerKind::GlobalAvgPool:
        global_avgpool_forward_cpu(st.in[0] * st.in[1], st.in[2] * st.in[3], in.data(), out.data());
        break;
      case LayerKind::Dropout: {
        const std::vector<double> f = dropout_factors(st.spec, seed_, int64_t(in.size()));
        for (size_t k = 0; k < in.size(); ++k) out[k] = in[k] * f[k];
        break;
      }
      case LayerKind::SoftmaxCrossEntropy:
        break;
      case LayerKind::Residual:
        add_forward_cpu(int64_t(out.size()), in.data(), act(st.shortcut_input + 1).data(),
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
  return loss_of(forward_all(p, x, nullptr).back(), labels, probe);
}

double RefNetwork::loss_from(size_t first, const std::vector<std::vector<double>>& acts,
                             const std::vector<double>& p, const std::vector<int32_t>& labels,
                             const std::vector<double>& probe,
                             std::vector<uint64_t>* pieces) const {
  return loss_of(forward_from(first, acts, p, nullptr, pieces).back(), labels, probe);
}

double RefNetwork::loss_of(const std::vector<double>& out, const std::vector<int32_t>& labels,
                           const std::vector<double>& probe) const {
  double total = 0;
  if (softmax_) {
    std::vector<double> rows(n_);
    std::vector<int32_t> pred(n_);
    softmax_xent_cpu({n_, classes_}, out.data(), labels.data(), rows.data(), pred.data(),
                     static_cast<double*>(nullptr), 1.0, label_smoothing_);
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
                     dy.data(), 1.0 / n_, label_smoothing_);
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
        if (is_grouped(st.spec)) {
          const Conv2dGroupedShape g = grouped_shape(st.spec, st.in);
          const int64_t wn = int64_t(g.oc) * g.cg() * g.kh * g.kw;
          conv2d_grouped_backward_weight_cpu(g, in.data(), dy.data(), dw,
                                             st.spec.bias ? dw + wn : nullptr);
          conv2d_grouped_backward_data_cpu(g, dy.data(), w, din.data());
          break;
        }
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
      case LayerKind::BatchNorm2d:
      case LayerKind::BatchNorm1d: {
        const BatchNormShape b = bn_shape(st.in);
        std::vector<double> mean(size_t(b.c)), invstd(size_t(b.c)), y(in.size());
        batchnorm_forward_train_cpu(b, in.data(), w, w + b.c, y.data(), mean.data(), invstd.data(),
                                    st.spec.eps);
        batchnorm_backward_cpu(b, in.data(), dy.data(), w, mean.data(), invstd.data(), din.data(),
                               dw, dw + b.c);
        break;
      }
      case LayerKind::AvgPool2d:
        avgpool_backward_cpu(pool_shape(st.spec, st.in), dy.data(), din.data());
        break;
      case LayerKind::GlobalAvgPool:
        global_avgpool_backward_cpu(st.in[0] * st.in[1], st.in[2] * st.in[3], dy.data(),
                                    din.data());
        break;
      case LayerKind::Dropout: {
        const std::vector<double> f = dropout_factors(st.spec, seed_, int64_t(in.size()));
        for (size_t k = 0; k < in.size(); ++k) din[k] = dy[k] * f[k];
        break;
      }
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
