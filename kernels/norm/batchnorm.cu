// Batch normalization on the GPU. The per-channel sums run in two fixed-order stages instead of
// atomics: stage 1 gives each (channel, split) block a contiguous range of the channel's N * HW
// values and writes one partial sum (block tree in double), stage 2 sums a channel's partials in
// split order with one thread per channel. The result is bitwise repeatable in every mode, so
// `deterministic` changes nothing here; atomics would save only the small second launch, which
// the training forward needs anyway to finish the statistics and update the running buffers.
// A fused ReLU (batchnorm.h) costs the forward nothing; its backward reads the post-ReLU output
// beside dy in the two passes that read dy, instead of a separate pass that reads y and dy and
// writes the masked dy.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cub/cub.cuh>

#include "kernels/norm/batchnorm_cuda.h"
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

constexpr int kThreads = 256;
constexpr int kTargetBlocks = 528;  // 4 per SM of an H100/H200: enough to fill the device
constexpr int64_t kMinPerBlock = 2048;
constexpr int64_t kMaxGrid = 65535 * 8;

// The fused ReLU's forward, as relu_forward: "not (v <= 0)" lets NaN through.
__device__ __forceinline__ float relu_if(bool relu, float v) {
  return (relu && v <= 0.f) ? 0.f : v;
}

// dy[k] as the fused ReLU's backward leaves it (relu_backward): 0 where relu_y[k] is not > 0.
template <class Index>
__device__ __forceinline__ float relu_masked(const float* __restrict__ d_dy,
                                             const float* __restrict__ d_relu_y, Index k) {
  const float g = __ldg(d_dy + k);
  return (d_relu_y && !(__ldg(d_relu_y + k) > 0.f)) ? 0.f : g;
}

// Thread mapping: block (c, s) owns values k in [s*chunk, (s+1)*chunk) of channel c (k = n*HW + i,
// the channel's values in memory order); thread t takes k = start + t, t + blockDim, ... and the
// block reduces in CUB's fixed tree. Forward (d_dy null): sums x and x^2. Backward: sums dy and
// dy * (x - mean[c]), dy masked by d_relu_y > 0 where d_relu_y is given. Thread 0 writes the pair
// to d_part[(c * S + s) * 2].
__global__ void __launch_bounds__(kThreads)
    bn_partial_sums(int c_count, int64_t hw, int64_t m, int64_t chunk,
                    const float* __restrict__ d_x, const float* __restrict__ d_dy,
                    const float* __restrict__ d_relu_y, const float* __restrict__ d_mean,
                    double* __restrict__ d_part) {
  using Reduce = cub::BlockReduce<double, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  const int c = blockIdx.x, s = blockIdx.y;
  const int64_t begin = int64_t(s) * chunk, end = min(m, begin + chunk);
  const float mean = d_dy ? d_mean[c] : 0.f;
  double a = 0, b = 0;
  for (int64_t k = begin + threadIdx.x; k < end; k += kThreads) {
    const int64_t n = k / hw, i = k - n * hw;
    const int64_t at = (n * c_count + c) * hw + i;
    const float x = __ldg(d_x + at);
    if (d_dy) {
      const float g = relu_masked(d_dy, d_relu_y, at);
      a += g;
      b += double(g) * double(x - mean);
    } else {
      a += x;
      b += double(x) * double(x);
    }
  }
  const double sa = Reduce(tmp).Sum(a);
  __syncthreads();  // tmp is reused
  const double sb = Reduce(tmp).Sum(b);
  if (threadIdx.x == 0) {
    d_part[(int64_t(c) * gridDim.y + s) * 2] = sa;
    d_part[(int64_t(c) * gridDim.y + s) * 2 + 1] = sb;
  }
}

// Thread mapping: thread c owns channel c: sums its S partials in order, writes the batch mean and
// 1/sqrt(var + eps), moves the running statistics; thread 0 counts the batch.
__global__ void bn_finish_forward(int c_count, int splits, int64_t m, float eps, float momentum,
                                  const double* __restrict__ d_part, float* __restrict__ d_mean,
                                  float* __restrict__ d_invstd, float* __restrict__ d_running_mean,
                                  float* __restrict__ d_running_var,
                                  float* __restrict__ d_num_batches) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c == 0 && d_num_batches) *d_num_batches += 1.0f;
  if (c >= c_count) return;
  double sum = 0, sq = 0;
  for (int s = 0; s < splits; ++s) {
    sum += d_part[(int64_t(c) * splits + s) * 2];
    sq += d_part[(int64_t(c) * splits + s) * 2 + 1];
  }
  const double mean = sum / double(m);
  const double var = fmax(sq / double(m) - mean * mean, 0.0);  // biased
  d_mean[c] = float(mean);
  d_invstd[c] = float(1.0 / sqrt(var + double(eps)));
  const double unbiased = var * double(m) / double(m - 1);
  if (d_running_mean)
    d_running_mean[c] = float((1.0 - momentum) * d_running_mean[c] + double(momentum) * mean);
  if (d_running_var)
    d_running_var[c] = float((1.0 - momentum) * d_running_var[c] + double(momentum) * unbiased);
}

// Thread mapping: thread c owns channel c: sums its backward partials in order, accumulates
// dgamma and dbeta, and leaves dx's per-channel coefficients in d_coef (3 per channel).
__global__ void bn_finish_backward(int c_count, int splits, int64_t m,
                                   const double* __restrict__ d_part,
                                   const float* __restrict__ d_gamma,
                                   const float* __restrict__ d_invstd, float* __restrict__ d_dgamma,
                                   float* __restrict__ d_dbeta, double* __restrict__ d_coef) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= c_count) return;
  double sum_dy = 0, sum_dy_xmu = 0;
  for (int s = 0; s < splits; ++s) {
    sum_dy += d_part[(int64_t(c) * splits + s) * 2];
    sum_dy_xmu += d_part[(int64_t(c) * splits + s) * 2 + 1];
  }
  const double invstd = d_invstd[c];
  const double sum_dy_xhat = sum_dy_xmu * invstd;
  d_dgamma[c] += float(sum_dy_xhat);
  d_dbeta[c] += float(sum_dy);
  d_coef[3 * c] = double(d_gamma[c]) * invstd;           // gamma * invstd
  d_coef[3 * c + 1] = sum_dy / double(m);                // mean of dy
  d_coef[3 * c + 2] = invstd * sum_dy_xhat / double(m);  // xhat's coefficient, per (x - mean)
}

// Thread mapping (the three elementwise passes): each thread owns elements k of the (N, C, HW)
// tensor flattened, grid-stride; its channel is (k / HW) % C. Index is int32_t when every
// flat index fits (no emulated 64-bit divisions), int64_t otherwise.
template <class Index>
__global__ void bn_normalize(Index total, int c_count, Index hw, const float* __restrict__ d_x,
                             const float* __restrict__ d_gamma, const float* __restrict__ d_beta,
                             const float* __restrict__ d_mean, const float* __restrict__ d_invstd,
                             bool relu, float* __restrict__ d_y) {
  for (Index k = Index(blockIdx.x) * blockDim.x + threadIdx.x; k < total;
       k += Index(gridDim.x) * blockDim.x) {
    const int c = int((k / hw) % c_count);
    const float scale = d_invstd[c] * d_gamma[c];
    d_y[k] = relu_if(relu, (__ldg(d_x + k) - d_mean[c]) * scale + d_beta[c]);
  }
}

template <class Index>
__global__ void bn_normalize_eval(Index total, int c_count, Index hw, float eps,
                                  const float* __restrict__ d_x, const float* __restrict__ d_gamma,
                                  const float* __restrict__ d_beta,
                                  const float* __restrict__ d_mean, const float* __restrict__ d_var,
                                  bool relu, float* __restrict__ d_y) {
  for (Index k = Index(blockIdx.x) * blockDim.x + threadIdx.x; k < total;
       k += Index(gridDim.x) * blockDim.x) {
    const int c = int((k / hw) % c_count);
    const float scale = d_gamma[c] / sqrtf(d_var[c] + eps);
    d_y[k] = relu_if(relu, (__ldg(d_x + k) - d_mean[c]) * scale + d_beta[c]);
  }
}

template <class Index>
__global__ void bn_backward_data(Index total, int c_count, Index hw, const float* __restrict__ d_x,
                                 const float* __restrict__ d_dy, const float* __restrict__ d_relu_y,
                                 const float* __restrict__ d_mean,
                                 const double* __restrict__ d_coef, float* __restrict__ d_dx) {
  for (Index k = Index(blockIdx.x) * blockDim.x + threadIdx.x; k < total;
       k += Index(gridDim.x) * blockDim.x) {
    const int c = int((k / hw) % c_count);
    const float a = float(d_coef[3 * c]), mdy = float(d_coef[3 * c + 1]),
                b = float(d_coef[3 * c + 2]);
    d_dx[k] = a * (relu_masked(d_dy, d_relu_y, k) - mdy - (__ldg(d_x + k) - d_mean[c]) * b);
  }
}

unsigned grid_for(int64_t total) {
  return unsigned(std::min<int64_t>(ceil_div<int64_t>(total, kThreads), kMaxGrid));
}

bool fits_int32(const BatchNormShape& s) {
  return int64_t(s.n) * s.c * s.hw <= INT_MAX;
}

}  // namespace

int batchnorm_splits(const BatchNormShape& s) {
  const int64_t by_device = ceil_div<int64_t>(kTargetBlocks, s.c);
  const int64_t by_size = std::max<int64_t>(1, ceil_div<int64_t>(s.count(), kMinPerBlock));
  return int(std::clamp<int64_t>(std::min(by_device, by_size), 1, 65535));
}

void batchnorm_forward_train_cuda(const BatchNormShape& s, const float* d_x, const float* d_gamma,
                                  const float* d_beta, float* d_y, bool relu, float* d_save_mean,
                                  float* d_save_invstd, const BatchNormTrainArgs& a,
                                  double* d_scratch, cudaStream_t stream) {
  const int splits = batchnorm_splits(s);
  const int64_t m = s.count(), chunk = ceil_div<int64_t>(m, splits);
  bn_partial_sums<<<dim3(unsigned(s.c), unsigned(splits)), kThreads, 0, stream>>>(
      s.c, s.hw, m, chunk, d_x, nullptr, nullptr, nullptr, d_scratch);
  CNN_LAUNCH_CHECK("bn_partial_sums");
  bn_finish_forward<<<unsigned(ceil_div(s.c, 128)), 128, 0, stream>>>(
      s.c, splits, m, a.eps, a.momentum, d_scratch, d_save_mean, d_save_invstd, a.running_mean,
      a.running_var, a.num_batches);
  CNN_LAUNCH_CHECK("bn_finish_forward");
  const int64_t total = int64_t(s.n) * s.c * s.hw;
  if (fits_int32(s))
    bn_normalize<int32_t>
        <<<grid_for(total), kThreads, 0, stream>>>(int32_t(total), s.c, int32_t(s.hw), d_x, d_gamma,
                                                   d_beta, d_save_mean, d_save_invstd, relu, d_y);
  else
    bn_normalize<int64_t><<<grid_for(total), kThreads, 0, stream>>>(
        total, s.c, s.hw, d_x, d_gamma, d_beta, d_save_mean, d_save_invstd, relu, d_y);
  CNN_LAUNCH_CHECK("bn_normalize");
}

void batchnorm_forward_eval_cuda(const BatchNormShape& s, const float* d_x, const float* d_gamma,
                                 const float* d_beta, const float* d_running_mean,
                                 const float* d_running_var, float eps, float* d_y, bool relu,
                                 cudaStream_t stream) {
  const int64_t total = int64_t(s.n) * s.c * s.hw;
  if (fits_int32(s))
    bn_normalize_eval<int32_t><<<grid_for(total), kThreads, 0, stream>>>(
        int32_t(total), s.c, int32_t(s.hw), eps, d_x, d_gamma, d_beta, d_running_mean,
        d_running_var, relu, d_y);
  else
    bn_normalize_eval<int64_t><<<grid_for(total), kThreads, 0, stream>>>(
        total, s.c, s.hw, eps, d_x, d_gamma, d_beta, d_running_mean, d_running_var, relu, d_y);
  CNN_LAUNCH_CHECK("bn_normalize_eval");
}

void batchnorm_backward_cuda(const BatchNormShape& s, const float* d_x, const float* d_dy,
                             const float* d_relu_y, const float* d_gamma, const float* d_save_mean,
                             const float* d_save_invstd, float* d_dx, float* d_dgamma,
                             float* d_dbeta, double* d_scratch, cudaStream_t stream) {
  const int splits = batchnorm_splits(s);
  const int64_t m = s.count(), chunk = ceil_div<int64_t>(m, splits);
  double* d_coef = d_scratch + 2 * int64_t(s.c) * splits;
  bn_partial_sums<<<dim3(unsigned(s.c), unsigned(splits)), kThreads, 0, stream>>>(
      s.c, s.hw, m, chunk, d_x, d_dy, d_relu_y, d_save_mean, d_scratch);
  CNN_LAUNCH_CHECK("bn_partial_sums");
  bn_finish_backward<<<unsigned(ceil_div(s.c, 128)), 128, 0, stream>>>(
      s.c, splits, m, d_scratch, d_gamma, d_save_invstd, d_dgamma, d_dbeta, d_coef);
  CNN_LAUNCH_CHECK("bn_finish_backward");
  if (!d_dx) return;
  const int64_t total = int64_t(s.n) * s.c * s.hw;
  if (fits_int32(s))
    bn_backward_data<int32_t><<<grid_for(total), kThreads, 0, stream>>>(
        int32_t(total), s.c, int32_t(s.hw), d_x, d_dy, d_relu_y, d_save_mean, d_coef, d_dx);
  else
    bn_backward_data<int64_t><<<grid_for(total), kThreads, 0, stream>>>(
        total, s.c, s.hw, d_x, d_dy, d_relu_y, d_save_mean, d_coef, d_dx);
  CNN_LAUNCH_CHECK("bn_backward_data");
}

}  // namespace cnn
