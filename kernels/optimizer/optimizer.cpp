// Optimizer dispatch: checks the hyper-parameters and buffers once, then runs the CPU reference
// or the CUDA launcher.
#include "kernels/optimizer/optimizer.h"

#include <algorithm>
#include <cmath>

#include "kernels/optimizer/optimizer_cuda.h"  // declarations only; safe in a CPU-only build
#include "runtime/dispatch.h"
#include "runtime/error.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

void check_count(const char* what, int64_t count) {
  CNN_CHECK(count >= 0, "{}: element count must be >= 0, got {}", what, count);
}

void check_kept_count(const char* what, int64_t ranges) {
  CNN_CHECK(ranges >= 0 && ranges <= KeptGrads::kMax, "{}: {} kept gradient ranges, expected 0..{}",
            what, ranges, KeptGrads::kMax);
}

void check_kept(const char* what, const KeptGrads& kept, int64_t count) {
  check_kept_count(what, kept.count);
  for (int r = 0; r < kept.count; ++r)
    CNN_CHECK(kept.begin[r] >= 0 && kept.begin[r] <= kept.end[r] && kept.end[r] <= count,
              "{}: kept gradient range [{}, {}) is not within [0, {})", what, kept.begin[r],
              kept.end[r], count);
}

}  // namespace

KeptGrads kept_grads(const std::vector<std::pair<int64_t, int64_t>>& ranges, const char* what) {
  check_kept_count(what, int64_t(ranges.size()));  // before filling the fixed slots
  KeptGrads kept;
  for (const auto& [begin, end] : ranges) {
    kept.begin[kept.count] = begin;
    kept.end[kept.count++] = end;
  }
  return kept;
}

KeptGrads kept_grads_slice(const KeptGrads& kept, int64_t begin, int64_t end) {
  check_kept_count("kept_grads_slice", kept.count);
  KeptGrads slice;
  for (int r = 0; r < kept.count; ++r) {
    const int64_t lo = std::max(kept.begin[r], begin), hi = std::min(kept.end[r], end);
    if (lo >= hi) continue;
    slice.begin[slice.count] = lo - begin;
    slice.end[slice.count++] = hi - begin;
  }
  return slice;
}

void sgd_update(int64_t count, float* w, float* g, float* m, const uint8_t* decay_mask,
                const SgdParams& p, float grad_scale, const Exec& ex, const float* lr_device,
                const KeptGrads& kept) {
  check_count("sgd_update", count);
  check_kept("sgd_update", kept, count);
  CNN_CHECK(p.lr >= 0, "sgd: learning rate must be >= 0, got {}", p.lr);
  CNN_CHECK(p.momentum >= 0, "sgd: momentum must be >= 0, got {}", p.momentum);
  CNN_CHECK(p.weight_decay >= 0, "sgd: weight_decay must be >= 0, got {}", p.weight_decay);
  CNN_CHECK(!p.nesterov || p.momentum > 0, "sgd: nesterov needs a momentum > 0, got {}",
            p.momentum);
  if (count == 0) return;
  CNN_CHECK(w && g, "sgd_update: weights and gradients must not be null");
  CNN_CHECK(m || p.momentum == 0, "sgd_update: momentum {} needs a momentum buffer", p.momentum);
  if (ex.device == Device::CPU) {
    SgdParams q = p;
    if (lr_device) q.lr = *lr_device;
    CNN_CHECK(q.lr >= 0, "sgd: learning rate must be >= 0, got {}", q.lr);
    return sgd_update_cpu(count, w, g, m, decay_mask, q, grad_scale, kept);
  }
  CNN_CUDA_BRANCH("sgd_update", sgd_update_cuda(count, w, g, m, decay_mask, p, grad_scale,
                                                lr_device, kept, ex.stream));
}

void adam_update(int64_t count, float* w, float* g, float* m, float* v, const uint8_t* decay_mask,
                 const AdamParams& p, float grad_scale, const Exec& ex, const float* lr_device,
                 const int64_t* step_device, const KeptGrads& kept) {
  check_count("adam_update", count);
  check_kept("adam_update", kept, count);
  CNN_CHECK(p.lr >= 0, "adam: learning rate must be >= 0, got {}", p.lr);
  CNN_CHECK(p.beta1 >= 0 && p.beta1 < 1 && p.beta2 >= 0 && p.beta2 < 1,
            "adam: betas ({}, {}) must lie in [0, 1)", p.beta1, p.beta2);
  CNN_CHECK(p.eps >= 0, "adam: eps must be >= 0, got {}", p.eps);
  CNN_CHECK(p.weight_decay >= 0, "adam: weight_decay must be >= 0, got {}", p.weight_decay);
  CNN_CHECK(step_device || p.step >= 1,
            "adam: step must be >= 1 (1-based, after this update), got {}", p.step);
  if (count == 0) return;
  CNN_CHECK(w && g && m && v, "adam_update: weights, gradients, m and v must not be null");
  if (ex.device == Device::CPU) {
    AdamParams q = p;
    if (lr_device) q.lr = *lr_device;
    if (step_device) q.step = *step_device;
    CNN_CHECK(q.lr >= 0, "adam: learning rate must be >= 0, got {}", q.lr);
    CNN_CHECK(q.step >= 1, "adam: step must be >= 1 (1-based, after this update), got {}", q.step);
    return adam_update_cpu(count, w, g, m, v, decay_mask, q, grad_scale, kept);
  }
  CNN_CUDA_BRANCH("adam_update", {
    if (lr_device || step_device) {
      adam_update_device_step_cuda(count, w, g, m, v, decay_mask, p, grad_scale, lr_device,
                                   step_device, kept, ex.stream);
      return;
    }
    // Bias corrections in double on the host, as torch does in Python floats.
    const double bc1 = 1.0 - std::pow(double(p.beta1), double(p.step));
    const double bc2 = 1.0 - std::pow(double(p.beta2), double(p.step));
    adam_update_cuda(count, w, g, m, v, decay_mask, p, static_cast<float>(p.lr / bc1),
                     static_cast<float>(std::sqrt(bc2)), grad_scale, kept, ex.stream);
  });
}

void advance_step_counters(StepCounters* counters, const float* lr_table, int64_t table_len,
                           const Exec& ex) {
  CNN_CHECK(counters && table_len >= 0 && (table_len == 0 || lr_table),
            "advance_step_counters: null counters or a table of {} without data", table_len);
  if (ex.device == Device::CPU) return advance_step_counters_cpu(counters, lr_table, table_len);
  CNN_CUDA_BRANCH("advance_step_counters",
                  advance_step_counters_cuda(counters, lr_table, table_len, ex.stream));
}

int64_t sum_squares_scratch_doubles(int64_t count) {
  return std::min(ceil_div<int64_t>(count, kSumSquaresBlockElems), kSumSquaresMaxPartials);
}

void sum_squares(int64_t count, const float* g, double* out, double* scratch, const Exec& ex) {
  check_count("sum_squares", count);
  CNN_CHECK(out && (count == 0 || g), "sum_squares: null pointer for {} elements", count);
  if (ex.device == Device::CPU) return sum_squares_cpu(count, g, out);
  CNN_CHECK(scratch || sum_squares_scratch_doubles(count) == 0,
            "sum_squares: needs a scratch buffer of {} doubles",
            sum_squares_scratch_doubles(count));
  CNN_CUDA_BRANCH("sum_squares", sum_squares_cuda(count, g, out, scratch, ex.stream));
}

void find_nonfinite(int64_t count, const float* x, int32_t* flag, const Exec& ex) {
  check_count("find_nonfinite", count);
  CNN_CHECK(flag && (count == 0 || x), "find_nonfinite: null pointer for {} elements", count);
  if (count == 0) return;
  if (ex.device == Device::CPU) return find_nonfinite_cpu(count, x, flag);
  CNN_CUDA_BRANCH("find_nonfinite", find_nonfinite_cuda(count, x, flag, ex.stream));
}

}  // namespace cnn
