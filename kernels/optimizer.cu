// Optimizer kernels over the one flat parameter buffer: a grid-stride loop per update rule that
// also zeroes the gradient, a fixed-order two-stage sum of squares (gradient clipping) and a
// NaN/Inf watch.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cub/cub.cuh>

#include "kernels/cuda_check.h"
#include "kernels/math_util.h"
#include "kernels/optimizer_cuda.h"

namespace cnn {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;

// Thread mapping: each thread owns parameters i = tid, tid + stride, ... (grid-stride) and does
// the whole torch.optim.SGD step for them, then zeroes g[i]. The learning rate comes from *d_lr
// when set (a captured graph's step), else from p.
__global__ void sgd_update_naive(int64_t count, float* __restrict__ d_w, float* __restrict__ d_g,
                                 float* __restrict__ d_m, const uint8_t* __restrict__ d_mask,
                                 SgdParams p, float grad_scale, const float* __restrict__ d_lr) {
  const float lr = d_lr ? *d_lr : p.lr;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const float w = d_w[i];
    float d = d_g[i] * grad_scale;
    if (p.weight_decay != 0.f && (!d_mask || d_mask[i])) d += p.weight_decay * w;
    if (p.momentum != 0.f) {
      const float buf = p.momentum * d_m[i] + d;
      d_m[i] = buf;
      d = p.nesterov ? d + p.momentum * buf : buf;
    }
    d_w[i] = w - lr * d;
    d_g[i] = 0.f;
  }
}

// Thread mapping: each thread owns parameters i = tid, tid + stride, ... (grid-stride) and does
// the whole torch.optim.Adam / AdamW step for them, then zeroes g[i]. kDeviceStep: lr and the
// step number come from *d_lr / *d_step (either may be null: p's value) when the kernel runs (a
// captured graph's step); thread 0 of each block derives step_size and bc2_sqrt from them in
// double, with the host path's expressions, and shares them through shared memory.
template <bool kDeviceStep>
__global__ void adam_update_naive(int64_t count, float* __restrict__ d_w, float* __restrict__ d_g,
                                  float* __restrict__ d_m, float* __restrict__ d_v,
                                  const uint8_t* __restrict__ d_mask, AdamParams p, float step_size,
                                  float bc2_sqrt, float grad_scale, const float* __restrict__ d_lr,
                                  const int64_t* __restrict__ d_step) {
  float lr = p.lr;
  if constexpr (kDeviceStep) {
    __shared__ float s_step[3];  // lr, step_size, bc2_sqrt
    if (threadIdx.x == 0) {
      const float l = d_lr ? *d_lr : p.lr;
      const double t = double(d_step ? *d_step : p.step);
      const double bc1 = 1.0 - pow(double(p.beta1), t);
      const double bc2 = 1.0 - pow(double(p.beta2), t);
      s_step[0] = l;
      s_step[1] = float(double(l) / bc1);
      s_step[2] = float(sqrt(bc2));
    }
    __syncthreads();
    lr = s_step[0];
    step_size = s_step[1];
    bc2_sqrt = s_step[2];
  }
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    float w = d_w[i];
    float d = d_g[i] * grad_scale;
    if (p.weight_decay != 0.f && (!d_mask || d_mask[i])) {
      if (p.decoupled)
        w *= 1.f - lr * p.weight_decay;
      else
        d += p.weight_decay * w;
    }
    const float m = p.beta1 * d_m[i] + (1.f - p.beta1) * d;
    const float v = p.beta2 * d_v[i] + (1.f - p.beta2) * d * d;
    d_m[i] = m;
    d_v[i] = v;
    const float denom = sqrtf(v) / bc2_sqrt + p.eps;
    d_w[i] = w - step_size * (m / denom);
    d_g[i] = 0.f;
  }
}

// Thread mapping: one thread advances the step counters (the last launch of a training step).
__global__ void advance_step_counters_single(StepCounters* __restrict__ d_c,
                                             const float* __restrict__ d_lr_table,
                                             int64_t table_len) {
  const int64_t b = d_c->batch + 1;
  d_c->batch = b;
  d_c->update += 1;
  if (b >= 0 && b < table_len) d_c->lr = d_lr_table[b];
}

// Thread mapping: block b owns partial b; its thread t sums g[i]^2 for
// i = b*blockDim + t + r*gridDim*blockDim, r = 0, 1, ... in order; the block reduces in CUB's
// fixed tree into d_partials[b]. The grid size depends on the count alone, so the result is
// bitwise repeatable.
__global__ void __launch_bounds__(kSumSquaresThreads)
    sum_squares_partial(int64_t count, const float* __restrict__ d_g,
                        double* __restrict__ d_partials) {
  using Reduce = cub::BlockReduce<double, kSumSquaresThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  double s = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    const double x = d_g[i];
    s += x * x;
  }
  const double total = Reduce(tmp).Sum(s);
  if (threadIdx.x == 0) d_partials[blockIdx.x] = total;
}

// Thread mapping: a single block; thread t sums partials t, t+blockDim, ... in order, then the
// block reduces and thread 0 writes *d_out (0 for no partials).
__global__ void __launch_bounds__(kSumSquaresThreads)
    sum_squares_final(int64_t partials, const double* __restrict__ d_partials,
                      double* __restrict__ d_out) {
  using Reduce = cub::BlockReduce<double, kSumSquaresThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  double s = 0;
  for (int64_t i = threadIdx.x; i < partials; i += kSumSquaresThreads) s += d_partials[i];
  const double total = Reduce(tmp).Sum(s);
  if (threadIdx.x == 0) *d_out = total;
}

// Thread mapping: each thread checks elements i = tid, tid + stride, ... (grid-stride); any that
// finds a NaN/Inf stores 1 (all writers store the same value, so the race is harmless).
__global__ void find_nonfinite_naive(int64_t count, const float* __restrict__ d_x,
                                     int32_t* __restrict__ d_flag) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  bool bad = false;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    bad |= !isfinite(d_x[i]);
  if (bad) *d_flag = 1;
}

unsigned grid_for(int64_t work) {
  return static_cast<unsigned>(
      std::clamp<int64_t>(ceil_div<int64_t>(work, kThreads), 1, kMaxBlocks));
}

}  // namespace

void sgd_update_cuda(int64_t count, float* d_w, float* d_g, float* d_m, const uint8_t* d_mask,
                     const SgdParams& p, float grad_scale, const float* d_lr, cudaStream_t stream) {
  sgd_update_naive<<<grid_for(count), kThreads, 0, stream>>>(count, d_w, d_g, d_m, d_mask, p,
                                                             grad_scale, d_lr);
  CNN_LAUNCH_CHECK("sgd_update_naive");
}

void adam_update_cuda(int64_t count, float* d_w, float* d_g, float* d_m, float* d_v,
                      const uint8_t* d_mask, const AdamParams& p, float step_size, float bc2_sqrt,
                      float grad_scale, cudaStream_t stream) {
  adam_update_naive<false><<<grid_for(count), kThreads, 0, stream>>>(
      count, d_w, d_g, d_m, d_v, d_mask, p, step_size, bc2_sqrt, grad_scale, nullptr, nullptr);
  CNN_LAUNCH_CHECK("adam_update_naive");
}

void adam_update_device_step_cuda(int64_t count, float* d_w, float* d_g, float* d_m, float* d_v,
                                  const uint8_t* d_mask, const AdamParams& p, float grad_scale,
                                  const float* d_lr, const int64_t* d_step, cudaStream_t stream) {
  adam_update_naive<true><<<grid_for(count), kThreads, 0, stream>>>(
      count, d_w, d_g, d_m, d_v, d_mask, p, 0.f, 1.f, grad_scale, d_lr, d_step);
  CNN_LAUNCH_CHECK("adam_update_naive<device step>");
}

void advance_step_counters_cuda(StepCounters* d_counters, const float* d_lr_table,
                                int64_t table_len, cudaStream_t stream) {
  advance_step_counters_single<<<1, 1, 0, stream>>>(d_counters, d_lr_table, table_len);
  CNN_LAUNCH_CHECK("advance_step_counters_single");
}

void sum_squares_cuda(int64_t count, const float* d_g, double* d_out, double* d_scratch,
                      cudaStream_t stream) {
  const int64_t partials = sum_squares_scratch_doubles(count);  // scratch: (partials) doubles
  if (partials > 0) {
    sum_squares_partial<<<unsigned(partials), kSumSquaresThreads, 0, stream>>>(count, d_g,
                                                                               d_scratch);
    CNN_LAUNCH_CHECK("sum_squares_partial");
  }
  sum_squares_final<<<1, kSumSquaresThreads, 0, stream>>>(partials, d_scratch, d_out);
  CNN_LAUNCH_CHECK("sum_squares_final");
}

void find_nonfinite_cuda(int64_t count, const float* d_x, int32_t* d_flag, cudaStream_t stream) {
  find_nonfinite_naive<<<grid_for(count), kThreads, 0, stream>>>(count, d_x, d_flag);
  CNN_LAUNCH_CHECK("find_nonfinite_naive");
}

}  // namespace cnn
