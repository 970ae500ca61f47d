#include "layers/param_optimizer.h"

#include <algorithm>
#include <cmath>

#include "kernels/optimizer/optimizer.h"
#include "runtime/error.h"

namespace cnn {

const char* optimizer_name(OptimizerType type) {
  switch (type) {
    case OptimizerType::Sgd:
      return "sgd";
    case OptimizerType::Adam:
      return "adam";
    case OptimizerType::AdamW:
      return "adamw";
  }
  return "?";
}

ParamOptimizer::ParamOptimizer(const OptimizerOptions& opt, Network& net) : opt_(opt), net_(net) {
  const Device dev = net.exec().device;
  const size_t n = static_cast<size_t>(net.num_params());
  m_ = Buffer<float>(n, dev);
  m_.zero();
  if (opt.type != OptimizerType::Sgd) {
    v_ = Buffer<float>(n, dev);
    v_.zero();
  }
  kept_ = kept_grads(net.overwritten_grad_ranges(), "optimizer");
  if (opt.weight_decay > 0) {
    std::vector<uint8_t> mask = net.decay_mask(opt.decay_biases);
    decay_mask_ = Buffer<uint8_t>(n, dev);
    decay_mask_.copy_from(mask.data(), Device::CPU, n);
  }
  if (opt.clip_grad_norm > 0) {
    norm_ = Buffer<double>(1, dev);
    norm_scratch_ =
        Buffer<double>(static_cast<size_t>(sum_squares_scratch_doubles(int64_t(n))), dev);
  }
}

float ParamOptimizer::clip_scale() {
  if (opt_.clip_grad_norm <= 0) return 1.0f;
  const Exec& ex = net_.exec();
  sum_squares(net_.num_params(), net_.grads(), norm_.data(), norm_scratch_.data(), ex);
  double sq = 0;
  raw_copy(&sq, Device::CPU, norm_.data(), ex.device, sizeof(double), ex.stream);
  stream_sync(ex.device, ex.stream);
  last_norm_ = std::sqrt(sq);
  return last_norm_ > opt_.clip_grad_norm ? static_cast<float>(opt_.clip_grad_norm / last_norm_)
                                          : 1.0f;
}

void ParamOptimizer::step(double lr) {
  const float scale = clip_scale();
  ++steps_;
  update(static_cast<float>(lr), steps_, nullptr, nullptr, scale);
}

void ParamOptimizer::step_from(const float* d_lr, const int64_t* d_update) {
  CNN_CHECK(d_lr && d_update, "optimizer step: null device learning rate or step counter");
  update(0.0f, 1, d_lr, d_update, clip_scale());
}

void ParamOptimizer::update(float lr, int64_t step, const float* d_lr, const int64_t* d_step,
                            float scale) {
  const Exec& ex = net_.exec();
  const int64_t n = net_.num_params();
  const uint8_t* mask = decay_mask_.empty() ? nullptr : decay_mask_.data();
  if (opt_.type == OptimizerType::Sgd) {
    SgdParams p;
    p.lr = lr;
    p.momentum = static_cast<float>(opt_.momentum);
    p.weight_decay = static_cast<float>(opt_.weight_decay);
    p.nesterov = opt_.nesterov;
    sgd_update(n, net_.params(), net_.grads(), m_.data(), mask, p, scale, ex, d_lr, kept_);
  } else {
    AdamParams p;
    p.lr = lr;
    p.beta1 = static_cast<float>(opt_.beta1);
    p.beta2 = static_cast<float>(opt_.beta2);
    p.eps = static_cast<float>(opt_.eps);
    p.weight_decay = static_cast<float>(opt_.weight_decay);
    p.decoupled = opt_.type == OptimizerType::AdamW;
    p.step = step;
    adam_update(n, net_.params(), net_.grads(), m_.data(), v_.data(), mask, p, scale, ex, d_lr,
                d_step, kept_);
  }
}

namespace {
std::vector<float> host_copy(const Buffer<float>& b) {
  std::vector<float> h(b.size());
  raw_copy(h.data(), Device::CPU, b.data(), b.device(), b.bytes());
  return h;
}
}  // namespace

std::vector<std::pair<std::string, std::vector<float>>> ParamOptimizer::state_to_host() const {
  if (opt_.type == OptimizerType::Sgd) return {{"optimizer.momentum", host_copy(m_)}};
  return {{"optimizer.adam_m", host_copy(m_)}, {"optimizer.adam_v", host_copy(v_)}};
}

void ParamOptimizer::state_from_host(
    const std::vector<std::pair<std::string, std::vector<float>>>& state, int64_t steps_taken) {
  for (const auto& [name, values] : state) {
    Buffer<float>* dst = name == "optimizer.adam_v" ? &v_ : &m_;
    CNN_CHECK(!dst->empty() && values.size() == dst->size(),
              "optimizer state '{}' has {} values, expected {} for this optimizer and network",
              name, values.size(), dst->size());
    dst->copy_from(values.data(), Device::CPU, values.size());
  }
  steps_ = steps_taken;
}

}  // namespace cnn
