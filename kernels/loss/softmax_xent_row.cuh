#pragma once
// One row of softmax cross-entropy (softmax_xent.h) run by one warp, shared by the loss kernel
// (softmax_xent.cu) and the kernels that compute the logits themselves (linear_head_loss.cu), so
// that every one of them gives the same loss, prediction and dlogits bits for the same logits.
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cub/cub.cuh>

namespace cnn::xent {

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

// The warp's scratch for the row's reductions.
struct WarpStorage {
  typename cub::WarpReduce<MaxAt>::TempStorage max_tmp;
  typename cub::WarpReduce<float>::TempStorage sum_tmp;
};

// Called by all 32 lanes of a warp. Lane l owns the columns l, l + 32, ... of the row: logit(j)
// gives logit j for those j only; at_label() (every lane, the same value) the logit of the
// label when the label is valid. Lane 0 writes *loss and *pred; with grad, store(j, g) gets
// dlogits j for every owned column j.
template <class Logit, class AtLabel, class Store>
__device__ __forceinline__ void softmax_xent_row(WarpStorage& tmp, int lane, int classes,
                                                 Logit logit, AtLabel at_label, int label,
                                                 float eps, float grad_scale, float* loss,
                                                 int32_t* pred, bool grad, Store store) {
  constexpr int kWarp = 32;
  using MaxReduce = cub::WarpReduce<MaxAt>;
  using SumReduce = cub::WarpReduce<float>;
  MaxAt local{-INFINITY, INT_MAX};
  for (int j = lane; j < classes; j += kWarp) local = FirstMax()(local, MaxAt{logit(j), j});
  MaxAt best = MaxReduce(tmp.max_tmp).Reduce(local, FirstMax());
  best.v = __shfl_sync(0xffffffffu, best.v, 0);  // the reduction's result is valid in lane 0
  best.i = __shfl_sync(0xffffffffu, best.i, 0);
  if (best.i == INT_MAX) best.i = 0;  // an all-NaN row: still a valid class index (as the CPU)

  // The max's own term is exactly 1; summing the others apart ("rest") keeps the digits that
  // 1 + rest would round away, so a confident row's small loss and gradient stay accurate.
  float part = 0.f;
  for (int j = lane; j < classes; j += kWarp)
    if (j != best.i) part += expf(logit(j) - best.v);
  float rest = SumReduce(tmp.sum_tmp).Sum(part);
  rest = __shfl_sync(0xffffffffu, rest, 0);
  const float inv_sum = 1.f / (1.f + rest);

  // Label smoothing's share eps / K of every class, and the sum of the centered logits its loss
  // term needs (only summed when smoothing).
  const float spread = eps / float(classes);
  float centered = 0.f;
  if (eps > 0.f) {
    float c_part = 0.f;
    for (int j = lane; j < classes; j += kWarp) c_part += logit(j) - best.v;
    __syncwarp();                                   // sum_tmp is reused
    centered = SumReduce(tmp.sum_tmp).Sum(c_part);  // valid in lane 0, the one that uses it
  }

  const bool valid = label >= 0 && label < classes;
  const float l_label = at_label();
  if (lane == 0) {
    // log(sum) - (l[label] - max); the difference of two logits is exact, so large logits lose
    // nothing. Smoothing: log(sum) - (1 - eps)(l[label] - max) - eps/K sum_j (l_j - max).
    *loss = valid ? log1pf(rest) - (1.f - eps) * (l_label - best.v) - spread * centered
                  : __int_as_float(0x7fc00000);
    *pred = best.i;
  }
  if (!grad) return;
  for (int j = lane; j < classes; j += kWarp) {
    float g;
    if (j == best.i)  // p = 1 / (1 + rest), and p - 1 = -rest / (1 + rest) without cancellation
      g = (j == label) ? -rest * inv_sum + eps : inv_sum;
    else
      g = expf(logit(j) - best.v) * inv_sum - (j == label ? 1.f - eps : 0.f);
    store(j, (g - spread) * grad_scale);
  }
}

}  // namespace cnn::xent
