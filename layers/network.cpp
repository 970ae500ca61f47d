#include "layers/network.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <utility>

#include "kernels/loss/softmax_xent.h"
#include "kernels/optimizer/optimizer.h"
#include "kernels/pointwise/add.h"
#include "kernels/pointwise/relu.h"
#include "runtime/error.h"

namespace cnn {
namespace {

// The spec a layer is built from: the configured one, its variant replaced where the options say.
LayerSpec with_algo_override(LayerSpec spec, const NetworkOptions& opt) {
  if (spec.kind == LayerKind::Conv2d && opt.conv_algo) spec.algo = *opt.conv_algo;
  if (spec.kind == LayerKind::Linear && opt.linear_algo) spec.algo = *opt.linear_algo;
  return spec;
}

// The add that ends a residual block. It reads two inputs, which the one-input Layer interface
// cannot pass, so the Network runs its passes; this entry keeps layers() one per graph node.
class ResidualAddLayer : public Layer {
 public:
  using Layer::Layer;
  Shape setup(const Shape& in, Device) override {
    in_ = out_ = in;
    return out_;
  }
  void forward(int, const float*, float*, float*, const Exec&) override {
    CNN_FAIL("{}: the add of a residual block is run by the Network", name());
  }
  void backward(int, const float*, const float*, float*, float*, float*, const Exec&) override {
    CNN_FAIL("{}: the add of a residual block is run by the Network", name());
  }
};

}  // namespace

NetworkOptions with_env_switches(NetworkOptions opt, const EnvSwitches& env) {
  if (!env.fuse_pool) opt.fuse_pool = PoolFusion::Off;
  if (!env.fuse_bn_relu) opt.fuse_batchnorm_relu = false;
  if (!env.fuse_residual) opt.fuse_residual = false;
  if (!env.autotune) opt.autotune = false;
  if (!env.tune_backward) opt.tune_backward = false;
  if (Algo a = env.algo_for("conv", Algo::Auto); env.algo_conv || env.algo) opt.conv_algo = a;
  if (Algo a = env.algo_for("linear", Algo::Auto); env.algo_linear || env.algo) opt.linear_algo = a;
  return opt;
}

Network::Network(const std::vector<LayerSpec>& specs, const Shape& input_chw,
                 const NetworkOptions& opt, const Exec& ex)
    : opt_(opt), ex_(ex), input_chw_(input_chw) {
  CNN_CHECK(opt.max_batch > 0, "batch size must be positive, got {}", opt.max_batch);
  CNN_CHECK(!specs.empty() && specs.back().kind == LayerKind::SoftmaxCrossEntropy,
            "the last layer must be softmax_cross_entropy");
  const std::vector<GraphNode> graph = layer_graph(specs);
  const size_t count = graph.size() - 1;  // the loss is run by the Network
  Shape in_shape = {opt.max_batch};
  in_shape.insert(in_shape.end(), input_chw.begin(), input_chw.end());
  const auto shape_of = [&](int k) { return k < 0 ? in_shape : layers_[size_t(k)]->out_shape(); };
  const auto kind_of = [&](int k) { return layers_[size_t(k)]->spec().kind; };

  // Build and shape the layers.
  for (size_t i = 0; i < count; ++i) {
    const GraphNode& g = graph[i];
    input_.push_back(g.input);
    shortcut_input_.push_back(g.shortcut_input);
    if (g.spec.kind == LayerKind::Residual) {
      CNN_CHECK(shape_of(g.input) == shape_of(g.shortcut_input),
                "residual block '{}': its layers give {} but its shortcut gives {}; they must "
                "match to be added",
                g.spec.name, shape_str(shape_of(g.input)), shape_str(shape_of(g.shortcut_input)));
      layers_.push_back(std::make_unique<ResidualAddLayer>(g.spec));
    } else {
      layers_.push_back(make_layer(with_algo_override(g.spec, opt)));
    }
    layers_.back()->setup(shape_of(g.input), ex.device);
  }
  layer_output_shape(specs.back(), shape_of(int(count) - 1));  // validates the loss input
  classes_ = static_cast<int>(shape_of(int(count) - 1).at(1));

  // Who reads each output; the last reader in the list writes its gradient first.
  std::vector<int> consumers(count, 0);
  last_consumer_.assign(count, -1);
  for (size_t i = 0; i <= count; ++i) {
    const int ins[2] = {i < count ? input_[i] : int(count) - 1,
                        i < count ? shortcut_input_[i] : -1};
    for (int t : ins)
      if (t >= 0) {
        ++consumers[size_t(t)];
        last_consumer_[size_t(t)] = int(i);
      }
  }

  // A relu whose input feeds nothing else is folded into the layer before it: the epilogue of a
  // conv/linear, the normalizing pass of a batchnorm. That layer writes the ReLU's output and
  // masks its output gradient itself, saving the relu's full-size read and write each way.
  skipped_.assign(count, false);
  std::string batchnorm_folds;
  for (size_t i = 0; i < count; ++i) {
    const int t = input_[i];
    if (!opt.fuse_relu || kind_of(int(i)) != LayerKind::Relu || t < 0) continue;
    const LayerKind k = kind_of(t);
    const bool batchnorm = k == LayerKind::BatchNorm2d || k == LayerKind::BatchNorm1d;
    const bool foldable =
        k == LayerKind::Conv2d || k == LayerKind::Linear || (batchnorm && opt.fuse_batchnorm_relu);
    if (!foldable || consumers[size_t(t)] != 1 || layers_[size_t(t)]->fused_relu()) continue;
    layers_[size_t(t)]->set_fused_relu(true);
    skipped_[i] = true;
    if (batchnorm)
      batchnorm_folds += fmt::format("{}{} + {}", batchnorm_folds.empty() ? "" : ", ",
                                     layers_[size_t(t)]->name(), layers_[i]->name());
  }
  // conv(1 input channel) -> relu -> maxpool 2x2 as the first three layers: one fused pass that
  // writes only the pooled output. Only as the first layer, whose input gradient is never needed
  // (the fused backward computes none); elsewhere the layers run apart.
  const PoolFusion pool_fusion = opt.fuse_pool;
  const bool fuse_pool = pool_fusion == PoolFusion::On ||
                         (pool_fusion == PoolFusion::Auto && ex.device == Device::CUDA);
  if (fuse_pool && count >= 3 && kind_of(0) == LayerKind::Conv2d && skipped_[1] && input_[2] == 1 &&
      consumers[1] == 1 && kind_of(2) == LayerKind::MaxPool2d &&
      layers_[0]->fuse_relu_pool(*layers_[2])) {
    skipped_[2] = true;
    fusion_notes_.push_back(fmt::format(
        "{} + {} + {}: fused conv-relu-maxpool (writes only the pooled output; CNN_FUSE_POOL=0 "
        "runs them apart)",
        layers_[0]->name(), layers_[1]->name(), layers_[2]->name()));
  }
  if (!batchnorm_folds.empty())
    fusion_notes_.push_back(fmt::format(
        "{}: relu folded into batchnorm (max(y, 0) written by the batchnorm, dy masked in its "
        "backward; CNN_FUSE_BN_RELU=0 runs them apart)",
        batchnorm_folds));
  // A max-pool or linear layer reading a folded relu's output (and the only reader of it) applies
  // that ReLU's gradient mask itself; a linear layer also sums the bias gradient of the layer
  // before where it can (paired once the parameters are bound, below).
  std::vector<std::pair<size_t, size_t>> bias_grad_folds;  // (summing layer, layer before)
  for (size_t i = 0; i < count; ++i) {
    const int t = input_[i];
    if (skipped_[i] || t < 0 || !skipped_[size_t(t)] || consumers[size_t(t)] != 1 ||
        !layers_[i]->can_mask_input_relu())
      continue;
    const int prev = input_[size_t(t)];
    if (prev < 0 || skipped_[size_t(prev)] || !layers_[size_t(prev)]->fused_relu()) continue;
    layers_[i]->set_mask_input_relu(true);
    layers_[size_t(prev)]->set_relu_masked_downstream(true);
    if (layers_[i]->can_sum_input_bias_grad()) bias_grad_folds.emplace_back(i, size_t(prev));
  }

  // A block's add (and the relu after it, the add's only reader) run by the batchnorm that ends
  // the block's branch, in its normalizing pass, when nothing else reads the batchnorm's output:
  // the add's and the relu's full-size read-and-write passes go. The add keeps its turn (its
  // shortcut may run after the branch); the branch end's turn does nothing.
  add_run_by_.assign(count, -1);
  runs_at_add_.assign(count, false);
  add_relu_.assign(count, false);
  std::string residual_folds;
  for (size_t i = 0; i < count && opt.fuse_residual; ++i) {
    const int b = input_[i];
    if (kind_of(int(i)) != LayerKind::Residual || b < 0 || skipped_[size_t(b)] ||
        consumers[size_t(b)] != 1 || layers_[size_t(b)]->fused_relu() ||
        !layers_[size_t(b)]->can_fuse_residual())
      continue;
    add_run_by_[i] = b;
    runs_at_add_[size_t(b)] = true;
    std::string fold = layers_[size_t(b)]->name() + " + " + layers_[i]->name();
    for (size_t r = i + 1; r < count && opt.fuse_relu && consumers[i] == 1; ++r)
      if (input_[r] == int(i) && kind_of(int(r)) == LayerKind::Relu) {
        skipped_[r] = true;
        add_relu_[i] = true;
        fold += " + " + layers_[r]->name();
        break;  // the add's only reader
      }
    residual_folds += (residual_folds.empty() ? "" : ", ") + fold;
  }
  if (!residual_folds.empty())
    fusion_notes_.push_back(fmt::format(
        "{}: residual add (and relu) in the batchnorm's normalizing pass (CNN_FUSE_RESIDUAL=0 "
        "runs them apart)",
        residual_folds));

  // Gradients are needed only downstream of parameters (a leading flatten or pool needs none).
  needs_grad_.assign(count, false);
  for (size_t i = 0; i < count; ++i)
    needs_grad_[i] = !layers_[i]->param_shapes().empty() ||
                     (input_[i] >= 0 && needs_grad_[size_t(input_[i])]) ||
                     (shortcut_input_[i] >= 0 && needs_grad_[size_t(shortcut_input_[i])]);

  // Buffers. Activations: a folded relu, the relu and pool of a fused conv-relu-pool and a
  // flatten share their input's buffer. Gradients: the same, except a flatten whose input has
  // other readers (their gradients are summed in the input's buffer, not the flatten's); and a
  // block's branch end shares its add's gradient (the add's other input gets a copy first).
  std::vector<int64_t> stored(count);  // values per batch that node i's pass writes itself
  for (size_t i = 0; i < count; ++i) {
    const size_t holds = layers_[i]->fused_pool() ? i + 2 : i;  // the fused conv writes the pool's
    // A branch end that runs its block's add writes the add's output, not its own.
    stored[i] = skipped_[i] || runs_at_add_[i] ? 0 : shape_numel(layers_[holds]->out_shape());
  }
  std::vector<int> act_owner(count);  // node whose buffer holds the output; -1: the input
  std::vector<int> grad_root(count);
  std::iota(grad_root.begin(), grad_root.end(), 0);
  const std::function<int(int)> root = [&](int k) {
    return grad_root[size_t(k)] == k ? k : grad_root[size_t(k)] = root(grad_root[size_t(k)]);
  };
  const auto share_grad = [&](int a, int b) { grad_root[size_t(root(a))] = root(b); };
  for (size_t i = 0; i < count; ++i) {
    const int t = input_[i];
    const LayerKind k = kind_of(int(i));
    const bool view = skipped_[i] || k == LayerKind::Flatten;
    act_owner[i] = !view ? int(i) : t < 0 ? -1 : act_owner[size_t(t)];
    if (t >= 0 && (skipped_[i] || ((k == LayerKind::Flatten || k == LayerKind::Residual) &&
                                   consumers[size_t(t)] == 1)))
      share_grad(int(i), t);
  }
  std::vector<int64_t> act_size(count, 0), grad_size(count, 0);
  std::vector<bool> grad_used(count, false);
  for (size_t i = 0; i < count; ++i) {
    if (act_owner[i] >= 0)
      act_size[size_t(act_owner[i])] = std::max(act_size[size_t(act_owner[i])], stored[i]);
    const size_t r = size_t(root(int(i)));
    grad_size[r] = std::max(grad_size[r], stored[i]);
    grad_used[r] = grad_used[r] || needs_grad_[i];
  }
  std::vector<float*> act_buf(count, nullptr), grad_buf(count, nullptr);
  for (size_t i = 0; i < count; ++i) {
    if (act_size[i] > 0) {
      storage_.emplace_back(Shape{act_size[i]}, ex.device);
      act_buf[i] = storage_.back().data();
    }
    if (grad_used[i] && grad_size[i] > 0) {
      storage_.emplace_back(Shape{grad_size[i]}, ex.device);
      grad_buf[i] = storage_.back().data();
    }
  }
  for (size_t i = 0; i < count; ++i) {
    acts_.push_back(act_owner[i] < 0 ? nullptr : act_buf[size_t(act_owner[i])]);
    if (act_owner[i] < 0) input_views_.push_back(i);  // set to the input on every call
    grad_acts_.push_back(needs_grad_[i] ? grad_buf[size_t(root(int(i)))] : nullptr);
  }
  dy_from_.assign(count, -1);
  for (size_t i = 0; i < count; ++i) {
    const int b = add_run_by_[i], s = shortcut_input_[i];
    if (b >= 0 && add_relu_[i] && s >= 0 && grad_acts_[size_t(s)] &&
        grad_acts_[size_t(s)] != grad_acts_[i] && last_consumer_[size_t(s)] == int(i))
      dy_from_[size_t(b)] = s;
  }
  int64_t sum_size = 0;
  for (size_t t = 0; t < count; ++t)
    if (consumers[t] > 1 && needs_grad_[t])
      sum_size = std::max(sum_size, shape_numel(layers_[t]->out_shape()));
  if (sum_size > 0) {
    storage_.emplace_back(Shape{sum_size}, ex.device);
    grad_sum_ = storage_.back().data();
  }

  // Flat parameters: offsets in layer order, He-uniform init from the seed on the host.
  int64_t total = 0;
  std::vector<int64_t> layer_offset;
  for (auto& l : layers_) {
    layer_offset.push_back(total);
    layer_param_begin_.push_back(total);
    for (ParamInfo p : l->param_shapes()) {
      p.offset = total;
      total += p.numel();
      infos_.push_back(p);
    }
  }
  params_ = Buffer<float>(static_cast<size_t>(total), ex.device);
  grads_ = Buffer<float>(static_cast<size_t>(total), ex.device);
  grads_.zero();
  std::vector<float> h_params(static_cast<size_t>(total));
  std::mt19937_64 rng(opt.seed);
  for (size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->init_params(h_params.data() + layer_offset[i], rng);
    layers_[i]->bind(params_.data() + layer_offset[i], grads_.data() + layer_offset[i]);
  }
  for (const auto& [i, prev] : bias_grad_folds)
    layers_[i]->set_input_bias_grad(layers_[prev]->hand_over_bias_grad());
  if (opt.overwrite_grads) pick_overwritten_grads();
  params_.copy_from(h_params.data(), Device::CPU, h_params.size());
  resize_scratch(scratch_need(ex, false));
  fit_side_scratch(ex);
  if (opt_.weight_grads_beside) side_stream();  // created now, not inside a captured step

  // Buffers: offsets in layer order, their initial values from the layers.
  int64_t buffer_total = 0;
  std::vector<int64_t> buffer_offset;
  for (auto& l : layers_) {
    buffer_offset.push_back(buffer_total);
    for (ParamInfo b : l->buffer_shapes()) {
      b.offset = buffer_total;
      buffer_total += b.numel();
      buffer_infos_.push_back(b);
    }
  }
  if (buffer_total > 0) {
    buffers_ = Buffer<float>(static_cast<size_t>(buffer_total), ex.device);
    std::vector<float> h_buffers(static_cast<size_t>(buffer_total));
    for (size_t i = 0; i < layers_.size(); ++i) {
      layers_[i]->init_buffers(h_buffers.data() + buffer_offset[i]);
      layers_[i]->bind_buffers(buffers_.data() + buffer_offset[i]);
    }
    buffers_.copy_from(h_buffers.data(), Device::CPU, h_buffers.size());
  }

  loss_rows_ = Buffer<float>(size_t(opt.max_batch), ex.device);
  pred_ = Buffer<int32_t>(size_t(opt.max_batch), ex.device);
}

std::vector<std::string> Network::overwritten_grad_names() const {
  std::vector<std::string> names;
  for (const ParamInfo& p : infos_)
    for (const auto& [begin, end] : overwritten_)
      if (p.offset >= begin && p.offset + p.numel() <= end) names.push_back(p.name);
  return names;
}

void Network::pick_overwritten_grads() {
  struct Candidate {
    size_t layer = 0;
    int64_t floats = 0;
    std::vector<std::pair<int64_t, int64_t>> ranges;  // adjacent parameters merged
  };
  std::vector<Candidate> candidates;
  size_t first_info = 0;  // infos_ holds every layer's parameters in layer order
  for (size_t i = 0; i < layers_.size(); ++i) {
    Candidate c;
    c.layer = i;
    for (const size_t k : layers_[i]->overwritable_grads()) {
      const ParamInfo& p = infos_.at(first_info + k);
      if (!c.ranges.empty() && c.ranges.back().second == p.offset)
        c.ranges.back().second += p.numel();
      else
        c.ranges.emplace_back(p.offset, p.offset + p.numel());
      c.floats += p.numel();
    }
    first_info += layers_[i]->param_shapes().size();
    if (!c.ranges.empty()) candidates.push_back(std::move(c));
  }
  // The optimizer takes at most KeptGrads::kMax ranges: the largest layers' first (where more
  // layers could overwrite, the rest keep accumulating, which is always correct).
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) { return a.floats > b.floats; });
  size_t room = KeptGrads::kMax;
  for (const Candidate& c : candidates) {
    if (c.ranges.size() > room) continue;
    room -= c.ranges.size();
    layers_[c.layer]->set_overwrite_grads(true);
    overwritten_.insert(overwritten_.end(), c.ranges.begin(), c.ranges.end());
  }
  std::sort(overwritten_.begin(), overwritten_.end());
}

int64_t Network::per_image(int node) const {
  return shape_numel(layers_[size_t(node)]->out_shape()) / opt_.max_batch;
}

bool Network::input_grad(size_t i) const {
  const int t = input_[i];
  return t >= 0 && needs_grad_[size_t(t)];
}

size_t Network::scratch_need(const Exec& ex, bool tuning) const {
  size_t need = 0;
  for (size_t i = 0; i < layers_.size(); ++i)
    need = std::max(need, tuning ? layers_[i]->tune_scratch_floats(ex, input_grad(i))
                                 : layers_[i]->scratch_floats(ex, input_grad(i)));
  return need;
}

void Network::resize_scratch(size_t floats) {
  if (floats == scratch_.size()) return;
  // Work enqueued before may still read the old scratch. Freed before the new one is allocated:
  // the two need not coexist (either can be as large as an activation).
  if (!scratch_.empty()) stream_sync(ex_.device, ex_.stream);
  scratch_ = Buffer<float>();
  scratch_ = Buffer<float>(floats, ex_.device);
}

void Network::set_exec(const Exec& ex) {
  CNN_CHECK(ex.device == ex_.device, "set_exec cannot move the network to another device");
  const size_t need = scratch_need(ex, false);
  if (need > scratch_.size()) resize_scratch(need);
  fit_side_scratch(ex);
  ex_ = ex;
}

void Network::fit_side_scratch(const Exec& ex) {
  if (!opt_.weight_grads_beside) return;
  size_t need = 0;
  for (const auto& l : layers_) need = std::max(need, l->beside_scratch_floats(ex));
  if (need <= side_scratch_.size()) return;
  if (side_) side_->sync();  // work enqueued before may still read the old one
  side_scratch_ = Buffer<float>();
  side_scratch_ = Buffer<float>(need, ex.device);
}

SideStream& Network::side_stream() {
  if (!side_) side_ = std::make_unique<SideStream>(ex_.device);
  return *side_;
}

Exec Network::mode_exec(bool training) const {
  Exec ex = ex_;
  ex.training = training;
  ex.seed = opt_.seed;
  ex.step = step_;
  return ex;
}

const float* Network::run_forward(int n, const float* x, bool training) {
  CNN_CHECK(n > 0 && n <= opt_.max_batch, "batch of {} images, expected 1..{}", n, opt_.max_batch);
  for (size_t v : input_views_) acts_[v] = const_cast<float*>(x);  // never written through
  const Exec ex = mode_exec(training);
  for (size_t i = 0; i < layers_.size(); ++i) run_node(i, n, x, ex);
  return acts_.back();
}

void Network::run_node(size_t i, int n, const float* x, const Exec& ex) {
  if (skipped_[i] || runs_at_add_[i]) return;
  if (const int b = add_run_by_[i]; b >= 0)
    layers_[size_t(b)]->forward_residual(n, act_of(input_[size_t(b)], x),
                                         act_of(shortcut_input_[i], x), add_relu_[i], acts_[i],
                                         scratch_.data(), ex);
  else if (layers_[i]->spec().kind == LayerKind::Residual)
    add_forward(n * per_image(int(i)), act_of(input_[i], x), act_of(shortcut_input_[i], x),
                acts_[i], ex);
  else
    layers_[i]->forward(n, act_of(input_[i], x), acts_[i], scratch_.data(), ex);
}

const float* Network::activation(size_t node) const {
  CNN_CHECK(node < layers_.size(), "node {} of a network of {}", node, layers_.size());
  return acts_[node];
}

void Network::forward_node(size_t node, int n, const float* x) {
  CNN_CHECK(node < layers_.size(), "node {} of a network of {}", node, layers_.size());
  CNN_CHECK(n > 0 && n <= opt_.max_batch, "batch of {} images, expected 1..{}", n, opt_.max_batch);
  for (size_t v : input_views_) acts_[v] = const_cast<float*>(x);  // never written through
  run_node(node, n, x, mode_exec(false));
}

const float* Network::forward(int n, const float* x) {
  return run_forward(n, x, false);
}

void Network::forward_loss(int n, const float* x, const int32_t* labels) {
  forward(n, x);
  softmax_xent({n, classes_}, acts_.back(), labels, loss_rows_.data(), pred_.data(), nullptr, 1.0f,
               ex_);
}

void Network::forward_backward(int n, const float* x, const int32_t* labels, float grad_scale) {
  run_forward(n, x, true);
  softmax_xent({n, classes_}, acts_.back(), labels, loss_rows_.data(), pred_.data(),
               grad_acts_.back(), grad_scale, ex_, opt_.label_smoothing);
  run_backward(n, x);
}

void Network::run_backward(int n, const float* x) {
  const Exec ex = mode_exec(true);
  for (size_t i = layers_.size(); i-- > 0;) {
    if (!skipped_[i]) backward_node(i, n, x, ex);
    if (!grads_ready_) continue;
    if (side_ && !hook_on_side_) side_->join_into(ex.stream);
    grads_ready_(layer_param_begin_[i]);
  }
  if (side_) side_->join_into(ex.stream);
}

std::vector<int64_t> Network::grads_ready_offsets() const {
  return std::vector<int64_t>(layer_param_begin_.rbegin(), layer_param_begin_.rend());
}

void Network::backward_node(size_t i, int n, const float* x, const Exec& ex) {
  float* dy = grad_acts_[i];
  if (!dy) return;  // no parameter at or before this node
  if (layers_[i]->spec().kind == LayerKind::Residual) {
    // A relu run inside the add (add_relu_) shares the add's output and gradient: its mask first,
    // written straight into the shortcut input's gradient where the branch end reads it from
    // there (dy_from_), else in place.
    const int direct = add_run_by_[i] >= 0 ? dy_from_[size_t(add_run_by_[i])] : -1;
    if (add_relu_[i])
      relu_backward(n * per_image(int(i)), acts_[i], dy,
                    direct >= 0 ? grad_acts_[size_t(direct)] : dy, ex);
    // The add passes dy to both inputs: the branch end shares dy's buffer, the other input gets
    // it copied (its last reader) or summed in.
    for (const int t : {input_[i], shortcut_input_[i]}) {
      if (t < 0 || t == direct || !needs_grad_[size_t(t)] || grad_acts_[size_t(t)] == dy) continue;
      float* g = grad_acts_[size_t(t)];
      if (last_consumer_[size_t(t)] == int(i))
        raw_copy(g, ex.device, dy, ex.device, size_t(n * per_image(t)) * sizeof(float), ex.stream);
      else
        add_forward(n * per_image(t), g, dy, g, ex);
    }
    return;
  }
  const int t = input_[i];
  float* dx = nullptr;  // the input image needs no gradient, nor anything before parameters
  bool sum = false;
  if (t >= 0 && needs_grad_[size_t(t)]) {
    dx = grad_acts_[size_t(t)];
    if (dx != dy && last_consumer_[size_t(t)] != int(i)) {
      dx = grad_sum_;
      sum = true;
    }
  }
  // A fused add's branch end: its output gradient is where the add's backward wrote it.
  if (dy_from_[i] >= 0) dy = grad_acts_[size_t(dy_from_[i])];
  // Beside: the weight gradient reads dy on the side stream while the main one goes on, so dy
  // must be this node's own buffer, which no node after it in backward writes (a fused add's
  // branch end reads the shortcut input's, which that input's other consumers write next).
  bool beside = false;
  if (opt_.weight_grads_beside && dy_from_[i] < 0) {
    SideStream& side = side_stream();
    Exec sx = ex;
    sx.stream = side.get();
    beside = layers_[i]->backward_beside(n, act_of(t, x), acts_[i], dy, dx, scratch_.data(),
                                         side_scratch_.data(), ex, sx,
                                         [&] { side.fork_from(ex.stream); });
  }
  if (!beside) layers_[i]->backward(n, act_of(t, x), acts_[i], dy, dx, scratch_.data(), ex);
  if (sum)
    add_forward(n * per_image(t), grad_acts_[size_t(t)], grad_sum_, grad_acts_[size_t(t)], ex);
}

std::vector<float> Network::params_to_host() const {
  std::vector<float> h(params_.size());
  raw_copy(h.data(), Device::CPU, params_.data(), params_.device(), params_.bytes());
  return h;
}

void Network::params_from_host(const std::vector<float>& h) {
  CNN_CHECK(h.size() == params_.size(), "{} parameter values for a network of {}", h.size(),
            params_.size());
  params_.copy_from(h.data(), Device::CPU, h.size());
}

std::vector<float> Network::buffers_to_host() const {
  std::vector<float> h(buffers_.size());
  if (!h.empty())
    raw_copy(h.data(), Device::CPU, buffers_.data(), buffers_.device(), buffers_.bytes());
  return h;
}

void Network::buffers_from_host(const std::vector<float>& h) {
  CNN_CHECK(h.size() == buffers_.size(), "{} buffer values for a network of {}", h.size(),
            buffers_.size());
  if (!h.empty()) buffers_.copy_from(h.data(), Device::CPU, h.size());
}

std::vector<float> Network::grads_to_host() const {
  std::vector<float> h(grads_.size());
  raw_copy(h.data(), Device::CPU, grads_.data(), grads_.device(), grads_.bytes());
  return h;
}

std::vector<uint8_t> Network::decay_mask(bool decay_biases) const {
  std::vector<uint8_t> mask(params_.size(), 1);
  for (const auto& p : infos_)
    if (p.is_bias && !decay_biases)
      std::fill(mask.begin() + p.offset, mask.begin() + p.offset + p.numel(), 0);
  return mask;
}

}  // namespace cnn
