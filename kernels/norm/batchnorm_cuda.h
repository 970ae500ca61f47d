#pragma once
// CUDA launchers for batchnorm.h (kernels/norm/batchnorm.cu). Called by batchnorm.cpp after the
// checks.
#include <cstdint>

#include "kernels/norm/batchnorm.h"
#include "runtime/stream.h"

namespace cnn {

// Blocks per channel of the first reduction stage (each writes one partial sum).
int batchnorm_splits(const BatchNormShape& s);

void batchnorm_forward_train_cuda(const BatchNormShape& s, const float* d_x, const float* d_gamma,
                                  const float* d_beta, float* d_y, bool relu, float* d_save_mean,
                                  float* d_save_invstd, const BatchNormTrainArgs& a,
                                  double* d_scratch, cudaStream_t stream);
void batchnorm_forward_eval_cuda(const BatchNormShape& s, const float* d_x, const float* d_gamma,
                                 const float* d_beta, const float* d_running_mean,
                                 const float* d_running_var, float eps, float* d_y, bool relu,
                                 cudaStream_t stream);
// d_relu_y: null, or the fused ReLU's output that masks every read of d_dy.
void batchnorm_backward_cuda(const BatchNormShape& s, const float* d_x, const float* d_dy,
                             const float* d_relu_y, const float* d_gamma, const float* d_save_mean,
                             const float* d_save_invstd, float* d_dx, float* d_dgamma,
                             float* d_dbeta, double* d_scratch, cudaStream_t stream);

}  // namespace cnn
