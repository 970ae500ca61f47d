// Softmax cross-entropy on the GPU: one warp per row (the reference network has 10 classes, so
// a block per row would leave most threads idle), reductions through cub::WarpReduce, and the
// batch metrics through one cub::BlockReduce in fixed order.
#include <cuda_runtime.h>

#include <cstdint>
#include <cub/cub.cuh>

#include "kernels/common/ptx.cuh"
#include "kernels/loss/softmax_xent_cuda.h"
#include "kernels/loss/softmax_xent_row.cuh"
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;
constexpr int kMetricsThreads = 512;

// Thread mapping: warp w of block b owns row b*kWarpsPerBlock + w; lane l owns the columns
// l, l+32, ... of that row for the max, the sum of exponentials and dlogits; lane 0 writes the
// row's loss and prediction.
__global__ void __launch_bounds__(kWarp* kWarpsPerBlock)
    softmax_xent_warp(int n, int classes, const float* __restrict__ d_logits,
                      const int32_t* __restrict__ d_labels, float* __restrict__ d_loss_rows,
                      int32_t* __restrict__ d_pred, float* __restrict__ d_dlogits, float grad_scale,
                      float eps) {
  ptx::griddep_enter();
  __shared__ xent::WarpStorage tmp[kWarpsPerBlock];

  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + warp;
  if (row >= n) return;  // whole warps leave together, so the warp collectives stay complete
  const float* l = d_logits + row * classes;  // (classes)
  float* d = d_dlogits ? d_dlogits + row * classes : nullptr;  // (classes)
  const int label = __ldg(d_labels + row);
  const bool valid = label >= 0 && label < classes;
  xent::softmax_xent_row(
      tmp[warp], lane, classes, [&](int j) { return __ldg(l + j); },
      [&] { return valid ? __ldg(l + label) : 0.f; }, label, eps, grad_scale, d_loss_rows + row,
      d_pred + row, d != nullptr, [&](int j, float g) { d[j] = g; });
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
