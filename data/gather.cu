#include <cuda_runtime.h>

#include <algorithm>

#include "data/augment.h"
#include "data/gather_cuda.h"
#include "kernels/common/ptx.cuh"
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"

namespace cnn {

namespace {

// Thread mapping: block b owns batch samples b, b + gridDim.x, ... (grid-stride over the batch);
// within a sample, thread t owns output elements t, t + blockDim.x, ... of its (C, H, W) image,
// so consecutive threads write consecutive floats. The augmentation draw is recomputed per thread
// (three 64-bit mixes), cheaper than sharing it through shared memory and a barrier. With
// p.batch_ptr the batch's first order entry is read from device memory here (graph replay).
// The arithmetic is the CPU reference's, with the IEEE round-to-nearest intrinsics spelled out so
// that no compiler flag (fast-math, contraction) can make the two differ by a bit.
__global__ void gather_batch_naive(GatherParams p, const uint8_t* __restrict__ d_images,
                                   const int32_t* __restrict__ d_labels, int64_t n,
                                   const int32_t* __restrict__ d_indices, int batch,
                                   float* __restrict__ d_x, int32_t* __restrict__ d_y) {
  ptx::griddep_enter();
  const int64_t epoch = p.epoch_ptr ? *p.epoch_ptr : p.epoch;
  const int64_t first = p.batch_ptr ? *p.batch_ptr * p.batch_stride : 0;
  const bool batch_inside = !p.batch_ptr || (first >= 0 && first + batch <= n);
  const int plane = p.h * p.w, sample = plane * p.c;
  for (int b = blockIdx.x; b < batch; b += gridDim.x) {
    const int64_t i = batch_inside ? d_indices[first + b] : -1;
    float* dst = d_x + int64_t(b) * sample;  // (C, H, W)
    if (i < 0 || i >= n) {  // cannot throw here: poison the sample so the loss reports it
      for (int e = threadIdx.x; e < sample; e += blockDim.x) dst[e] = __int_as_float(0x7fc00000);
      if (threadIdx.x == 0) d_y[b] = -1;
      continue;
    }
    const AugmentDraw a = draw_augment(p.seed, epoch, i, p.shift, p.flip);
    const uint8_t* src = d_images + i * sample;  // (C, H, W)
    for (int e = threadIdx.x; e < sample; e += blockDim.x) {
      const int k = e / plane, r = e - k * plane;
      const int oy = r / p.w, ox = r - oy * p.w;
      const int sy = oy + a.dy;
      const int sx = (a.flip != p.mirror ? p.w - 1 - ox : ox) + a.dx;
      const bool inside = sy >= 0 && sy < p.h && sx >= 0 && sx < p.w;
      const float v = inside ? float(src[k * plane + sy * p.w + sx]) : 0.f;
      dst[e] = __fdiv_rn(__fsub_rn(__fdiv_rn(v, 255.f), p.mean[k]), p.stdev[k]);
    }
    if (threadIdx.x == 0) d_y[b] = d_labels[i];
  }
}

}  // namespace

void gather_batch_cuda(const GatherParams& p, const uint8_t* d_images, const int32_t* d_labels,
                       int64_t n, const int32_t* d_indices, int batch, float* d_x, int32_t* d_y,
                       cudaStream_t stream) {
  const int sample = p.c * p.h * p.w;
  // Small images: 128 threads; large ones: 256 to cover a sample in fewer strides.
  const int threads = sample <= 1024 ? 128 : 256;
  const int blocks = std::min(batch, 1 << 20);  // 1-D grid in x; the loop strides beyond it
  gather_batch_naive<<<blocks, threads, 0, stream>>>(p, d_images, d_labels, n, d_indices, batch,
                                                     d_x, d_y);
  CNN_LAUNCH_CHECK("gather_batch_naive");
}

}  // namespace cnn
