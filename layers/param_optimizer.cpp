#include "layers/param_optimizer.h"

#include <algorithm>
#include <cmath>

#include "kernels/optimizer/optimizer.h"
#include "runtime/error.h"
#include "runtime/math_util.h"

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

ParamOptimizer::~ParamOptimizer() {
  if (early_) net_.set_grads_ready_hook(nullptr);
}

std::string ParamOptimizer::enable_early_updates(int64_t min_elems) {
  CNN_CHECK(min_elems >= 1, "early updates: min_elems={} (expected at least 1)", min_elems);
  if (opt_.clip_grad_norm > 0)
    return "optimizer.clip_grad_norm scales every gradient by their global norm first";
  if (net_.has_grads_ready_hook()) return "the gradients are summed across GPUs before any update";
  early_ = true;
  early_min_ = min_elems;
  net_.side_stream();  // created now, not inside a captured step
  net_.set_grads_ready_hook([this](int64_t final_from) { on_grads_ready(final_from); },
                            /*on_side_stream=*/true);
  return "";
}

void ParamOptimizer::begin_step(double lr) {
  if (!early_) return;
  announced_ = true;
  pending_end_ = net_.num_params();
  step_lr_ = static_cast<float>(lr);
  step_no_ = steps_ + 1;
  step_d_lr_ = nullptr;
  step_d_update_ = nullptr;
}

void ParamOptimizer::begin_step_from(const float* d_lr, const int64_t* d_update) {
  CNN_CHECK(d_lr && d_update, "optimizer step: null device learning rate or step counter");
  if (!early_) return;
  begin_step(0.0);  // the values come from the device: lr and step number unused
  step_d_lr_ = d_lr;
  step_d_update_ = d_update;
}

void ParamOptimizer::on_grads_ready(int64_t final_from) {
  if (!announced_) return;
  // Rounded up to a multiple of 4, so the update's 4-wide loads stay 16-byte aligned; what lies
  // below waits for a later range.
  const int64_t from = ceil_div<int64_t>(final_from, 4) * 4;
  if (pending_end_ - from < early_min_) return;
  Exec ex = net_.exec();
  SideStream& side = net_.side_stream();  // joined back by forward_backward
  side.fork_from(ex.stream);
  ex.stream = side.get();  // null on the CPU, which has no streams
  update(from, pending_end_, step_lr_, step_no_, step_d_lr_, step_d_update_, 1.0f, ex);
  pending_end_ = from;
}

void ParamOptimizer::finish(float lr, int64_t step, const float* d_lr, const int64_t* d_step,
                            float scale) {
  const int64_t end = announced_ ? pending_end_ : net_.num_params();
  announced_ = false;
  update(0, end, lr, step, d_lr, d_step, scale, net_.exec());
}

void ParamOptimizer::step(double lr) {
  CNN_CHECK(!announced_ || (step_d_lr_ == nullptr && step_lr_ == static_cast<float>(lr)),
            "optimizer step: learning rate {} differs from the one the step began with", lr);
  const float scale = clip_scale();
  ++steps_;
  finish(static_cast<float>(lr), steps_, nullptr, nullptr, scale);
}

void ParamOptimizer::step_from(const float* d_lr, const int64_t* d_update) {
  CNN_CHECK(d_lr && d_update, "optimizer step: null device learning rate or step counter");
  CNN_CHECK(!announced_ || (step_d_lr_ == d_lr && step_d_update_ == d_update),
            "optimizer step: device learning rate or step counter differs from the ones the "
            "step began with");
  finish(0.0f, 1, d_lr, d_update, clip_scale());
}

void ParamOptimizer::update(int64_t begin, int64_t end, float lr, int64_t step, const float* d_lr,
                            const int64_t* d_step, float scale, const Exec& ex) {
  const int64_t n = end - begin;
  if (n <= 0) return;
  const KeptGrads kept = kept_grads_slice(kept_, begin, end);
  const uint8_t* mask = decay_mask_.empty() ? nullptr : decay_mask_.data() + begin;
  float* w = net_.params() + begin;
  float* g = net_.grads() + begin;
  float* m = m_.data() + begin;
  if (opt_.type == OptimizerType::Sgd) {
    SgdParams p;
    p.lr = lr;
    p.momentum = static_cast<float>(opt_.momentum);
    p.weight_decay = static_cast<float>(opt_.weight_decay);
    p.nesterov = opt_.nesterov;
    sgd_update(n, w, g, m, mask, p, scale, ex, d_lr, kept);
  } else {
    AdamParams p;
    p.lr = lr;
    p.beta1 = static_cast<float>(opt_.beta1);
    p.beta2 = static_cast<float>(opt_.beta2);
    p.eps = static_cast<float>(opt_.eps);
    p.weight_decay = static_cast<float>(opt_.weight_decay);
    p.decoupled = opt_.type == OptimizerType::AdamW;
    p.step = step;
    adam_update(n, w, g, m, v_.data() + begin, mask, p, scale, ex, d_lr, d_step, kept);
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
