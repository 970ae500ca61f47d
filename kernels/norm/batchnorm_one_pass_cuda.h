#pragma once
// One-launch CUDA BatchNorm training passes (batchnorm_one_pass.cu): each channel owned by a
// thread-block cluster that reads its values once into registers, exchanges the block sums through
// distributed shared memory and writes y (forward) or dx (backward) from the registers. Called by
// batchnorm.cu's launchers when BatchNormLaunch::one_pass is set; each returns false, having
// launched nothing, where the shape is past plan_batchnorm_one_pass's limits or the device cannot
// launch the plan's cluster (no clusters, or a cluster that does not fit a GPC), and the caller
// then runs the three-launch passes.
#include "kernels/norm/batchnorm.h"
#include "runtime/stream.h"

namespace cnn {

// Whether the training passes of s run in one launch on this device (plan and clusters), with
// 16-byte loads (aligned pointers) or not: what tests and the benchmark ask before they rely on it.
bool batchnorm_one_pass_available(const BatchNormShape& s);

// Arguments as batchnorm_forward_train_cuda's (no scratch: the sums never leave the cluster).
bool batchnorm_forward_one_pass_cuda(const BatchNormShape& s, const float* d_x,
                                     const float* d_gamma, const float* d_beta, float* d_y,
                                     bool relu, const float* d_residual, float* d_save_mean,
                                     float* d_save_invstd, const BatchNormTrainArgs& a,
                                     cudaStream_t stream);
// Arguments as batchnorm_backward_cuda's; d_dx may be null (the sums, dgamma and dbeta only).
bool batchnorm_backward_one_pass_cuda(const BatchNormShape& s, const float* d_x, const float* d_dy,
                                      const float* d_relu_y, const float* d_relu_beta,
                                      const float* d_gamma, const float* d_save_mean,
                                      const float* d_save_invstd, float* d_dx, float* d_dgamma,
                                      float* d_dbeta, cudaStream_t stream);

}  // namespace cnn
