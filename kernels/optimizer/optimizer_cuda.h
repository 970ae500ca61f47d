#pragma once
// CUDA launchers for optimizer.h (kernels/optimizer.cu). Called by optimizer.cpp after checks.
#include <cstdint>

#include "kernels/optimizer/optimizer.h"
#include "runtime/stream.h"

namespace cnn {

// sum_squares stage 1: each block covers kSumSquaresBlockElems elements per grid-stride round
// and writes one partial; the block count (and so the summation order) depends on the count
// alone, never on the device.
constexpr int kSumSquaresThreads = 256;
constexpr int64_t kSumSquaresBlockElems = int64_t(kSumSquaresThreads) * 16;
constexpr int64_t kSumSquaresMaxPartials = 1024;

// d_lr (may be null): the learning rate read on the device instead of p.lr. kept: the gradient
// ranges left unzeroed (checked by the caller).
void sgd_update_cuda(int64_t count, float* d_w, float* d_g, float* d_m, const uint8_t* d_mask,
                     const SgdParams& p, float grad_scale, const float* d_lr, const KeptGrads& kept,
                     cudaStream_t stream);
// step_size = lr / (1 - beta1^step) and bc2_sqrt = sqrt(1 - beta2^step), computed on the host.
void adam_update_cuda(int64_t count, float* d_w, float* d_g, float* d_m, float* d_v,
                      const uint8_t* d_mask, const AdamParams& p, float step_size, float bc2_sqrt,
                      float grad_scale, const KeptGrads& kept, cudaStream_t stream);
// The same with lr and step read on the device (either pointer may be null: p.lr / p.step); each
// block computes the bias corrections once, in double as the host does.
void adam_update_device_step_cuda(int64_t count, float* d_w, float* d_g, float* d_m, float* d_v,
                                  const uint8_t* d_mask, const AdamParams& p, float grad_scale,
                                  const float* d_lr, const int64_t* d_step, const KeptGrads& kept,
                                  cudaStream_t stream);
void advance_step_counters_cuda(StepCounters* d_counters, const float* d_lr_table,
                                int64_t table_len, cudaStream_t stream);
void sum_squares_cuda(int64_t count, const float* d_g, double* d_out, double* d_scratch,
                      cudaStream_t stream);
void find_nonfinite_cuda(int64_t count, const float* d_x, int32_t* d_flag, cudaStream_t stream);

}  // namespace cnn
