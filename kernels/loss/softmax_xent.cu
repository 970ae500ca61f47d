// Softmax cross-entropy on the GPU: one warp per row (the reference network has 10 classes, so
// a block per row would leave most threads idle), reductions through cub::WarpReduce, and the
// batch metrics through one cub::BlockReduce in fixed order.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cub/cub.cuh>

#include "kernels/common/ptx.cuh"
#include "kernels/loss/softmax_xent_cuda.h"
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;
constexpr int kMetricsThreads = 512;

struct MaxAt {
  float v;
  int i;
};

// Larger value wins; equal values go to the smaller index, so the result is the FIRST maximum
// whatever order the warp combines lanes in.
struct FirstMax {
  __device__ __forceinline__ MaxAt operator()(const MaxAt& a, const MaxAt& b) const {
    return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a;
  }
};

// Thread mapping: warp w of block b owns row b*kWarpsPerBlock + w; lane l owns the columns
// l, l+32, ... of that row for the max, the sum of exponentials and dlogits; lane 0 writes the
// row's loss and prediction.
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock)
    softmax_xent_warp(int n, int classes, const float* __restrict__ d_logits,
                      const int32_t* __restrict__ d_labels, float* __restrict__ d_loss_rows,
                      int32_t* __restrict__ d_pred, float* __restrict__ d_dlogits, float grad_scale,
                      float eps) {
  ptx::griddep_enter();
  using MaxReduce = cub::WarpReduce<MaxAt>;
  using SumReduce = cub::WarpReduce<float>;
  __shared__ typename MaxReduce::TempStorage max_tmp[kWarpsPerBlock];
  __shared__ typename SumReduce::TempStorage sum_tmp[kWarpsPerBlock];

  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (row >= n) return;  // whole warps leave together, so the warp collectives stay complete
  const float* l = d_logits + row * classes;  // (classes)

  MaxAt local{-INFINITY, INT_MAX};
  for (int j = lane; j < classes; j += kWarp) local = FirstMax()(local, MaxAt{__ldg(l + j), j});
  MaxAt best = MaxReduce(max_tmp[warp]).Reduce(local, FirstMax());
  best.v = __shfl_sync(0xffffffffu, best.v, 0);  // the reduction's result is valid in lane 0
  best.i = __shfl_sync(0xffffffffu, best.i, 0);
  if (best.i == INT_MAX) best.i = 0;  // an all-NaN row: still a valid class index (as the CPU)

  // The max's own term is exactly 1; summing the others apart ("rest") keeps the digits that
  // 1 + rest would round away, so a confident row's small loss and gradient stay accurate.
  float part = 0.f;
  for (int j = lane; j < classes; j += kWarp)
    if (j != best.i) part += expf(__ldg(l + j) - best.v);
  float rest = SumReduce(sum_tmp[warp]).Sum(part);
  rest = __shfl_sync(0xffffffffu, rest, 0);
  const float inv_sum = 1.f / (1.f + rest);

  // Label smoothing's share eps / K of every class, and the sum of the centered logits its loss
  // term needs (only summed when smoothing).
  const float spread = eps / float(classes);
  float centered = 0.f;
  if (eps > 0.f) {
    float c_part = 0.f;
    for (int j = lane; j < classes; j += kWarp) c_part += __ldg(l + j) - best.v;
    __syncwarp();                                     // sum_tmp is reused
    centered = SumReduce(sum_tmp[warp]).Sum(c_part);  // valid in lane 0, the one that uses it
  }

  const int label = __ldg(d_labels + row);
  const bool valid = label >= 0 && label < classes;
  if (lane == 0) {
    // log(sum) - (l[label] - max); the difference of two logits is exact, so large logits lose
    // nothing. Smoothing: log(sum) - (1 - eps)(l[label] - max) - eps/K sum_j (l_j - max).
    d_loss_rows[row] =
        valid ? log1pf(rest) - (1.f - eps) * (__ldg(l + label) - best.v) - spread * centered
              : __int_as_float(0x7fc00000);
    d_pred[row] = best.i;
  }
  if (!d_dlogits) return;
  float* d = d_dlogits + row * classes;  // (classes)
  for (int j = lane; j < classes; j += kWarp) {
    float g;
    if (j == best.i)  // p = 1 / (1 + rest), and p - 1 = -rest / (1 + rest) without cancellation
      g = (j == label) ? -rest * inv_sum + eps : inv_sum;
    else
      g = expf(__ldg(l + j) - best.v) * inv_sum - (j == label ? 1.f - eps : 0.f);
    d[j] = (g - spread) * grad_scale;
  }
}

// Thread mapping: a single block; thread t owns rows t, t+kMetricsThreads, ... in order, then
// the block reduces in CUB's fixed tree, so the totals are bitwise repeatable. Thread 0 adds into
// the device totals.
__global__ void __launch_bounds__(kMetricsThreads)
    metrics_block_reduce(int n, const float* __restrict__ d_loss_rows,
                         const int32_t* __restrict__ d_pred, const int32_t* __restrict__ d_labels,
                         double* __restrict__ d_totals) {
  ptx::griddep_enter();
  using Reduce = cub::BlockReduce<double, kMetricsThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  double loss = 0, correct = 0;
  for (int i = threadIdx.x; i < n; i += kMetricsThreads) {
    loss += d_loss_rows[i];
    correct += d_pred[i] == d_labels[i] ? 1.0 : 0.0;
  }
  const double loss_sum = Reduce(tmp).Sum(loss);
  __syncthreads();  // tmp is reused by the second reduction
  const double correct_sum = Reduce(tmp).Sum(correct);
  if (threadIdx.x == 0) {
    d_totals[0] += loss_sum;
    d_totals[1] += correct_sum;
    d_totals[2] += n;
  }
}

}  // namespace

void softmax_xent_cuda(const XentShape& s, const float* d_logits, const int32_t* d_labels,
                       float* d_loss_rows, int32_t* d_pred, float* d_dlogits, float grad_scale,
                       float label_smoothing, cudaStream_t stream) {
  const unsigned blocks = unsigned(ceil_div<int64_t>(s.n, kWarpsPerBlock));
  softmax_xent_warp<<<blocks, kWarp * kWarpsPerBlock, 0, stream>>>(
      s.n, s.classes, d_logits, d_labels, d_loss_rows, d_pred, d_dlogits, grad_scale,
      label_smoothing);
  CNN_LAUNCH_CHECK("softmax_xent_warp");
}

void accumulate_metrics_cuda(int n, const float* d_loss_rows, const int32_t* d_pred,
                             const int32_t* d_labels, double* d_totals, cudaStream_t stream) {
  metrics_block_reduce<<<1, kMetricsThreads, 0, stream>>>(n, d_loss_rows, d_pred, d_labels,
                                                          d_totals);
  CNN_LAUNCH_CHECK("metrics_block_reduce");
}

}  // namespace cnn
