#include "layers/network.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>

#include "kernels/loss/softmax_xent.h"
#include "runtime/error.h"

namespace cnn {
namespace {

// The spec a layer is built from: the configured one, its variant replaced where the options say.
LayerSpec with_algo_override(LayerSpec spec, const NetworkOptions& opt) {
  if (spec.kind == LayerKind::Conv2d && opt.conv_algo) spec.algo = *opt.conv_algo;
  if (spec.kind == LayerKind::Linear && opt.linear_algo) spec.algo = *opt.linear_algo;
  return spec;
}

}  // namespace

NetworkOptions with_env_switches(NetworkOptions opt, const EnvSwitches& env) {
  if (!env.fuse_pool) opt.fuse_pool = PoolFusion::Off;
  if (!env.autotune) opt.autotune = false;
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
  Shape cur = {opt.max_batch};
  cur.insert(cur.end(), input_chw.begin(), input_chw.end());

  // Build and shape the layers; decide which buffers alias.
  std::vector<bool> aliases_input;  // output is the input (flatten) or the previous output (relu)
  for (size_t i = 0; i + 1 < specs.size(); ++i) {
    auto layer = make_layer(with_algo_override(specs[i], opt));
    cur = layer->setup(cur, ex.device);
    const bool fold = opt.fuse_relu && specs[i].kind == LayerKind::Relu && !layers_.empty() &&
                      (layers_.back()->spec().kind == LayerKind::Conv2d ||
                       layers_.back()->spec().kind == LayerKind::Linear) &&
                      !layers_.back()->fused_relu();
    if (fold) layers_.back()->set_fused_relu(true);
    skipped_.push_back(fold);
    aliases_input.push_back(fold || specs[i].kind == LayerKind::Flatten);
    layers_.push_back(std::move(layer));
  }
  // conv(1 input channel) -> relu -> maxpool 2x2 as the first three layers: one fused pass that
  // writes only the pooled output. Only as the first layer, whose input gradient is never needed
  // (the fused backward computes none); elsewhere the layers run apart.
  const PoolFusion pool_fusion = opt.fuse_pool;
  const bool fuse_pool = pool_fusion == PoolFusion::On ||
                         (pool_fusion == PoolFusion::Auto && ex.device == Device::CUDA);
  if (fuse_pool && layers_.size() >= 3 && layers_[0]->spec().kind == LayerKind::Conv2d &&
      skipped_[1] && layers_[2]->spec().kind == LayerKind::MaxPool2d &&
      layers_[0]->fuse_relu_pool(*layers_[2])) {
    skipped_[2] = true;
    aliases_input[2] = true;  // the conv writes the pool's output buffer
    fusion_notes_.push_back(fmt::format(
        "{} + {} + {}: fused conv-relu-maxpool (writes only the pooled output; CNN_FUSE_POOL=0 "
        "runs them apart)",
        layers_[0]->name(), layers_[1]->name(), layers_[2]->name()));
  }
  // A max-pool right after a layer with a fused ReLU applies that ReLU's gradient mask itself.
  for (size_t i = 1; i < layers_.size(); ++i) {
    const size_t prev = skipped_[i - 1] && i >= 2 ? i - 2 : i - 1;
    if (skipped_[i] || skipped_[prev] || !layers_[i]->can_mask_input_relu() ||
        !layers_[prev]->fused_relu())
      continue;
    layers_[i]->set_mask_input_relu(true);
    layers_[prev]->set_relu_masked_downstream(true);
  }
  layer_output_shape(specs.back(), cur);  // validates the loss input
  classes_ = static_cast<int>(cur.at(1));

  // Activations: layer i writes acts_[i]; an aliasing layer shares its input's buffer.
  Shape in_shape = {opt.max_batch};
  in_shape.insert(in_shape.end(), input_chw.begin(), input_chw.end());
  for (size_t i = 0; i < layers_.size(); ++i) {
    // A fused conv-relu-pool's buffer holds the pool's output; the relu and pool alias it.
    const size_t holds = layers_[i]->fused_pool() ? i + 2 : i;
    const int64_t count = shape_numel(layers_[holds]->out_shape());
    if (aliases_input[i] && i > 0) {
      acts_.push_back(acts_[i - 1]);
      grad_acts_.push_back(grad_acts_[i - 1]);
    } else if (aliases_input[i]) {
      first_is_input_view_ = true;  // set to the input on every call
      acts_.push_back(nullptr);
      grad_acts_.push_back(nullptr);
    } else {
      storage_.emplace_back(Shape{count}, ex.device);
      acts_.push_back(storage_.back().data());
      storage_.emplace_back(Shape{count}, ex.device);
      grad_acts_.push_back(storage_.back().data());
    }
  }

  // Flat parameters: offsets in layer order, He-uniform init from the seed on the host.
  int64_t total = 0;
  std::vector<int64_t> layer_offset;
  for (auto& l : layers_) {
    layer_offset.push_back(total);
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
  size_t scratch = 0;
  for (size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->init_params(h_params.data() + layer_offset[i], rng);
    layers_[i]->bind(params_.data() + layer_offset[i], grads_.data() + layer_offset[i]);
    scratch = std::max(scratch, layers_[i]->scratch_floats(ex));
  }
  params_.copy_from(h_params.data(), Device::CPU, h_params.size());
  scratch_ = Buffer<float>(scratch, ex.device);

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

  dlogits_ = Buffer<float>(size_t(opt.max_batch) * classes_, ex.device);
  loss_rows_ = Buffer<float>(size_t(opt.max_batch), ex.device);
  pred_ = Buffer<int32_t>(size_t(opt.max_batch), ex.device);
}

void Network::set_exec(const Exec& ex) {
  CNN_CHECK(ex.device == ex_.device, "set_exec cannot move the network to another device");
  size_t scratch = 0;
  for (auto& l : layers_) scratch = std::max(scratch, l->scratch_floats(ex));
  if (scratch > scratch_.size()) scratch_ = Buffer<float>(scratch, ex.device);
  ex_ = ex;
}

std::vector<std::string> Network::autotune(TuneCache* cache) {
  std::vector<std::string> lines;
  if (ex_.device != Device::CUDA || ex_.deterministic || !opt_.autotune) return lines;
  // Defined inputs for the timing runs: zeroed activations and a zero input batch.
  Shape in_shape = {opt_.max_batch};
  in_shape.insert(in_shape.end(), input_chw_.begin(), input_chw_.end());
  Tensor input(in_shape, ex_.device);
  input.zero(ex_.stream);
  for (Tensor& t : storage_) t.zero(ex_.stream);
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (skipped_[i]) continue;
    const float* x = i ? acts_[i - 1] : input.data();
    if (!x) x = input.data();  // a leading flatten aliases the input
    float* dx = i ? grad_acts_[i - 1] : nullptr;
    layers_[i]->set_tune_cache(cache);
    for (const TuneChoice& c :
         layers_[i]->autotune(opt_.max_batch, x, acts_[i], grad_acts_[i], dx, scratch_.data(), ex_))
      lines.push_back(describe(c));
    layers_[i]->set_tune_cache(nullptr);  // the cache need not outlive the network
  }
  grads_.zero(ex_.stream);
  stream_sync(ex_.device, ex_.stream);
  return lines;
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
  if (first_is_input_view_) acts_[0] = const_cast<float*>(x);  // never written through
  const Exec ex = mode_exec(training);
  const float* in = x;
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (!skipped_[i]) layers_[i]->forward(n, in, acts_[i], ex);
    in = acts_[i];
  }
  return in;
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
               dlogits_.data(), grad_scale, ex_, opt_.label_smoothing);
  const Exec ex = mode_exec(true);
  float* dy = dlogits_.data();
  for (size_t i = layers_.size(); i-- > 0;) {
    const float* in = i ? acts_[i - 1] : x;
    float* dx = i ? grad_acts_[i - 1] : nullptr;  // the input image needs no gradient
    if (!skipped_[i]) {
      layers_[i]->backward(n, in, acts_[i], dy, dx, scratch_.data(), ex);
      if (dx) dy = dx;
    }
  }
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
