// Batch-norm dispatch: checks the shape once, then runs the CPU reference or the CUDA launchers.
#include "kernels/norm/batchnorm.h"

#include "kernels/norm/batchnorm_cuda.h"
#include "runtime/dispatch.h"
#include "runtime/error.h"

namespace cnn {

void check_batchnorm_shape(const BatchNormShape& s, bool training) {
  CNN_CHECK(s.n >= 1 && s.c >= 1 && s.hw >= 1,
            "batchnorm: input (N, C, H*W) = ({}, {}, {}) must be positive", s.n, s.c, s.hw);
  CNN_CHECK(!training || s.count() > 1,
            "batchnorm: expected more than 1 value per channel when training, got input (N, C, "
            "H*W) = ({}, {}, {}) (a batch of 1 after a linear layer or of 1x1 images; use "
            "data.drop_last or a larger batch)",
            s.n, s.c, s.hw);
}

int64_t batchnorm_scratch_doubles(const BatchNormShape& s, Device dev) {
  if (dev == Device::CPU) return 0;
  (void)s;  // a CPU-only build reads no field of it
  return CNN_CUDA_VALUE(2 * int64_t(s.c) * batchnorm_splits(s) + 3 * int64_t(s.c), int64_t(0));
}

void batchnorm_forward_train(const BatchNormShape& s, const float* x, const float* gamma,
                             const float* beta, float* y, float* save_mean, float* save_invstd,
                             const BatchNormTrainArgs& a, double* scratch, const Exec& ex,
                             bool relu, const float* residual) {
  check_batchnorm_shape(s, true);
  CNN_CHECK(x && gamma && beta && y && save_mean && save_invstd,
            "batchnorm_forward_train: x, gamma, beta, y and the saved statistics must not be null");
  CNN_CHECK(a.momentum >= 0 && a.momentum <= 1 && a.eps > 0,
            "batchnorm_forward_train: momentum {} must be in [0, 1] and eps {} positive",
            a.momentum, a.eps);
  if (ex.device == Device::CPU)
    return batchnorm_forward_train_cpu(s, x, gamma, beta, y, save_mean, save_invstd, a, relu,
                                       residual);
  CNN_CUDA_BRANCH("batchnorm_forward_train", {
    CNN_CHECK(scratch, "batchnorm_forward_train: null scratch on cuda");
    batchnorm_forward_train_cuda(s, x, gamma, beta, y, relu, residual, save_mean, save_invstd, a,
                                 scratch, ex.stream, batchnorm_launch_from_env());
  });
}

void batchnorm_forward_eval(const BatchNormShape& s, const float* x, const float* gamma,
                            const float* beta, const float* running_mean, const float* running_var,
                            float eps, float* y, const Exec& ex, bool relu, const float* residual) {
  check_batchnorm_shape(s, false);
  CNN_CHECK(x && gamma && beta && running_mean && running_var && y,
            "batchnorm_forward_eval: null pointer");
  CNN_CHECK(eps > 0, "batchnorm_forward_eval: eps {} must be positive", eps);
  if (ex.device == Device::CPU)
    return batchnorm_forward_eval_cpu(s, x, gamma, beta, running_mean, running_var, eps, y, relu,
                                      residual);
  CNN_CUDA_BRANCH("batchnorm_forward_eval",
                  batchnorm_forward_eval_cuda(s, x, gamma, beta, running_mean, running_var, eps, y,
                                              relu, residual, ex.stream));
}

void batchnorm_backward(const BatchNormShape& s, const float* x, const float* dy,
                        const float* gamma, const float* save_mean, const float* save_invstd,
                        float* dx, float* dgamma, float* dbeta, double* scratch, const Exec& ex,
                        const float* relu_y, const float* relu_beta) {
  check_batchnorm_shape(s, true);
  CNN_CHECK(x && dy && gamma && save_mean && save_invstd && dgamma && dbeta,
            "batchnorm_backward: null pointer");
  if (ex.device == Device::CPU)
    return batchnorm_backward_cpu(s, x, dy, gamma, save_mean, save_invstd, dx, dgamma, dbeta,
                                  relu_y);
  CNN_CUDA_BRANCH("batchnorm_backward", {
    CNN_CHECK(scratch, "batchnorm_backward: null scratch on cuda");
    batchnorm_backward_cuda(s, x, dy, relu_y, relu_beta, gamma, save_mean, save_invstd, dx, dgamma,
                            dbeta, scratch, ex.stream, batchnorm_launch_from_env());
  });
}

}  // namespace cnn
