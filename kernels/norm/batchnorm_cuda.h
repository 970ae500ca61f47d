#pragma once
// CUDA launchers for batchnorm.h (kernels/norm/batchnorm.cu). Called by batchnorm.cpp after the
// checks.
#include <cstdint>

#include "kernels/norm/batchnorm.h"
#include "kernels/norm/batchnorm_one_pass_plan.h"
#include "runtime/stream.h"

namespace cnn {

// Partial sums per channel of the first reduction stage (a warp each).
int batchnorm_splits(const BatchNormShape& s);

// How the training passes launch. max_grid_x / max_grid_y (0: the device's limits): the
// elementwise grid capped lower, for tests, so that its blocks loop over several rounds of planes
// and of plane chunks (the same bits).
// one_pass: where plan_batchnorm_one_pass fits the shape and the device launches its clusters,
// each pass is one launch that reads its inputs once (batchnorm_one_pass_cuda.h; the sums in
// another fixed order, so other bits than the sums-finish-elementwise passes', the same on every
// run); false (CNN_BN_ONE_PASS=0), or past the plan's limits: those three launches.
// one_pass_max_cluster: one launch only where the plan's cluster has at most this many blocks.
// Any plan here; the process default is kBnOnePassPreferredCluster: on the H200 the one-launch
// passes were faster with clusters of 1 and 4 blocks ((128, 512), (128, 256, 8, 8): 1.3-1.6x)
// and slower with 7 to 16 on all but one of the ResNet's and VGG's larger passes (0.71-0.99x).
constexpr int kBnOnePassPreferredCluster = 4;
struct BatchNormLaunch {
  bool one_pass = true;
  int one_pass_max_cluster = kBnOnePassMaxCluster;
  unsigned max_grid_x = 0, max_grid_y = 0;
};
// The process's CNN_BN_ONE_PASS, no caps.
BatchNormLaunch batchnorm_launch_from_env();
// Whether a training pass of shape s takes the one-launch kernels under l (where the device
// launches the plan's clusters).
bool batchnorm_one_pass_wanted(const BatchNormShape& s, const BatchNormLaunch& l);

// d_residual: null, or the residual added before the ReLU (batchnorm.h).
void batchnorm_forward_train_cuda(const BatchNormShape& s, const float* d_x, const float* d_gamma,
                                  const float* d_beta, float* d_y, bool relu,
                                  const float* d_residual, float* d_save_mean, float* d_save_invstd,
                                  const BatchNormTrainArgs& a, double* d_scratch,
                                  cudaStream_t stream, const BatchNormLaunch& launch);
void batchnorm_forward_eval_cuda(const BatchNormShape& s, const float* d_x, const float* d_gamma,
                                 const float* d_beta, const float* d_running_mean,
                                 const float* d_running_var, float eps, float* d_y, bool relu,
                                 const float* d_residual, cudaStream_t stream);
// d_relu_y: null, or the fused ReLU's output that masks every read of d_dy; d_relu_beta (with
// d_relu_y): the forward's beta, the mask then recomputed from x instead of read (batchnorm.h).
void batchnorm_backward_cuda(const BatchNormShape& s, const float* d_x, const float* d_dy,
                             const float* d_relu_y, const float* d_relu_beta, const float* d_gamma,
                             const float* d_save_mean, const float* d_save_invstd, float* d_dx,
                             float* d_dgamma, float* d_dbeta, double* d_scratch,
                             cudaStream_t stream, const BatchNormLaunch& launch);

}  // namespace cnn
