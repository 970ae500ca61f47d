#pragma once
// Batch normalization over (N, C, HW): per channel c, the statistics of the N * HW values
// x[n, c, i]. BatchNorm2d is HW = H * W; BatchNorm1d on (N, F) is C = F, HW = 1. Torch's
// semantics: training normalizes with the batch's biased variance and moves the running
// statistics towards the batch mean and the UNBIASED variance by `momentum`; eval normalizes with
// the running statistics.
//
// A ReLU after the batchnorm (conv -> batchnorm -> relu) can run inside it: the forward's `relu`
// writes max(y, 0) (NaN passing, as relu_forward) instead of y, and the backward's `relu_y` (the
// layer's post-ReLU output) makes every read of dy a read of dy * (y > 0) (as relu_backward),
// without writing that masked copy. Both give the bits of the separate relu pass.
//
// A residual block's add can run inside the forward too (branch -> batchnorm -> add -> relu):
// `residual` (N, C, HW), when not null, is added to the normalized value before the ReLU,
// y = relu(bn(x) + residual), with the bits of the separate add and relu passes. The backward
// is unchanged: the add passes dy on as it is, and the ReLU's mask is the caller's.
#include <cstdint>

#include "runtime/exec.h"

namespace cnn {

struct BatchNormShape {
  int n = 1, c = 1;
  int64_t hw = 1;
  int64_t count() const { return int64_t(n) * hw; }  // values per channel
};

// Throws naming the bad field. training: at least two values per channel, as torch requires
// ("Expected more than 1 value per channel when training").
void check_batchnorm_shape(const BatchNormShape& s, bool training);

// Doubles of scratch the CUDA passes need (per-channel partial sums); 0 on the CPU.
int64_t batchnorm_scratch_doubles(const BatchNormShape& s, Device dev);

struct BatchNormTrainArgs {
  float momentum = 0.1f, eps = 1e-5f;
  float* running_mean = nullptr;  // (C) updated in place
  float* running_var = nullptr;   // (C) updated in place
  float* num_batches = nullptr;   // (1) incremented by one (a float counter: exact to 2^24)
};

// Training forward: y = (x - mean) * invstd * gamma + beta with the batch statistics, which are
// also written to save_mean / save_invstd (C) for backward. scratch: batchnorm_scratch_doubles.
// The reductions run in a fixed order on every device, so the pass is bitwise repeatable.
// relu: y = max(y, 0), the following ReLU fused; residual: added before it (above).
void batchnorm_forward_train(const BatchNormShape& s, const float* x, const float* gamma,
                             const float* beta, float* y, float* save_mean, float* save_invstd,
                             const BatchNormTrainArgs& a, double* scratch, const Exec& ex,
                             bool relu = false, const float* residual = nullptr);
// Eval forward with the running statistics; relu and residual as above.
void batchnorm_forward_eval(const BatchNormShape& s, const float* x, const float* gamma,
                            const float* beta, const float* running_mean, const float* running_var,
                            float eps, float* y, const Exec& ex, bool relu = false,
                            const float* residual = nullptr);
// Backward of the training forward: dx (may be null) overwritten, dgamma and dbeta (C)
// ACCUMULATED. The standard formula:
//   dx = gamma * invstd / M * (M * dy - sum(dy) - xhat * sum(dy * xhat)),  M = N * HW.
// relu_y (N, C, HW), when not null: the fused ReLU's output; dy then stands for dy * (relu_y > 0)
// everywhere (the sums and dx), dy itself unchanged. relu_beta, when relu_y is this forward's own
// output (the same x, gamma and saved statistics): the forward's beta, from which the CUDA passes
// recompute the mask (relu_y > 0 exactly where the forward's float (x - mean) * (invstd * gamma)
// + beta is > 0) from the x they read anyway, instead of reading relu_y twice; the CPU reads
// relu_y either way.
void batchnorm_backward(const BatchNormShape& s, const float* x, const float* dy,
                        const float* gamma, const float* save_mean, const float* save_invstd,
                        float* dx, float* dgamma, float* dbeta, double* scratch, const Exec& ex,
                        const float* relu_y = nullptr, const float* relu_beta = nullptr);

// CPU references, plain loops accumulating in double; the double twins serve the gradient checks.
// The running-statistics pointers of `a` may be null (gradcheck).
void batchnorm_forward_train_cpu(const BatchNormShape& s, const float* x, const float* gamma,
                                 const float* beta, float* y, float* save_mean, float* save_invstd,
                                 const BatchNormTrainArgs& a, bool relu = false,
                                 const float* residual = nullptr);
void batchnorm_forward_train_cpu(const BatchNormShape& s, const double* x, const double* gamma,
                                 const double* beta, double* y, double* save_mean,
                                 double* save_invstd, double eps, bool relu = false);
void batchnorm_forward_eval_cpu(const BatchNormShape& s, const float* x, const float* gamma,
                                const float* beta, const float* running_mean,
                                const float* running_var, float eps, float* y, bool relu = false,
                                const float* residual = nullptr);
void batchnorm_backward_cpu(const BatchNormShape& s, const float* x, const float* dy,
                            const float* gamma, const float* save_mean, const float* save_invstd,
                            float* dx, float* dgamma, float* dbeta, const float* relu_y = nullptr);
void batchnorm_backward_cpu(const BatchNormShape& s, const double* x, const double* dy,
                            const double* gamma, const double* save_mean, const double* save_invstd,
                            double* dx, double* dgamma, double* dbeta,
                            const double* relu_y = nullptr);

}  // namespace cnn
