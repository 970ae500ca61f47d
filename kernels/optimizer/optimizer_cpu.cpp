// CPU reference for the optimizers: plain loops, each element's arithmetic in double, following
// torch.optim.SGD / Adam / AdamW step by step.
#include <cmath>

#include "kernels/optimizer/optimizer.h"

namespace cnn {
namespace {

// Whether element i lies in one of kept's ranges (its gradient is left as it is).
bool is_kept(const KeptGrads& kept, int64_t i) {
  for (int r = 0; r < kept.count; ++r)
    if (i >= kept.begin[r] && i < kept.end[r]) return true;
  return false;
}

}  // namespace

void sgd_update_cpu(int64_t count, float* w, float* g, float* m, const uint8_t* decay_mask,
                    const SgdParams& p, float grad_scale, const KeptGrads& kept) {
  for (int64_t i = 0; i < count; ++i) {
    double d = double(g[i]) * grad_scale;
    if (p.weight_decay != 0 && (!decay_mask || decay_mask[i])) d += double(p.weight_decay) * w[i];
    if (p.momentum != 0) {
      const double buf = double(p.momentum) * m[i] + d;
      m[i] = static_cast<float>(buf);
      d = p.nesterov ? d + double(p.momentum) * buf : buf;
    }
    w[i] = static_cast<float>(w[i] - double(p.lr) * d);
    if (!is_kept(kept, i)) g[i] = 0.f;
  }
}

void adam_update_cpu(int64_t count, float* w, float* g, float* m, float* v,
                     const uint8_t* decay_mask, const AdamParams& p, float grad_scale,
                     const KeptGrads& kept) {
  const double bc1 = 1.0 - std::pow(double(p.beta1), double(p.step));
  const double bc2 = 1.0 - std::pow(double(p.beta2), double(p.step));
  for (int64_t i = 0; i < count; ++i) {
    double d = double(g[i]) * grad_scale;
    double wi = w[i];
    if (p.weight_decay != 0 && (!decay_mask || decay_mask[i])) {
      if (p.decoupled)
        wi *= 1.0 - double(p.lr) * p.weight_decay;
      else
        d += double(p.weight_decay) * wi;
    }
    const double mi = double(p.beta1) * m[i] + (1.0 - p.beta1) * d;
    const double vi = double(p.beta2) * v[i] + (1.0 - p.beta2) * d * d;
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    const double denom = std::sqrt(vi) / std::sqrt(bc2) + p.eps;
    w[i] = static_cast<float>(wi - double(p.lr) / bc1 * mi / denom);
    if (!is_kept(kept, i)) g[i] = 0.f;
  }
}

void advance_step_counters_cpu(StepCounters* counters, const float* lr_table, int64_t table_len) {
  ++counters->batch;
  ++counters->update;
  if (counters->batch >= 0 && counters->batch < table_len) counters->lr = lr_table[counters->batch];
}

void sum_squares_cpu(int64_t count, const float* g, double* out) {
  double s = 0;
  for (int64_t i = 0; i < count; ++i) s += double(g[i]) * g[i];
  *out = s;
}

void find_nonfinite_cpu(int64_t count, const float* x, int32_t* flag) {
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(x[i])) {
      *flag = 1;
      return;
    }
  }
}

}  // namespace cnn
