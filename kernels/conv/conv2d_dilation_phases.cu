// Dilation phase layout on the GPU: a thread per element of the destination, grid-stride; memory
// bound (one read and one write of an activation), so plain index arithmetic.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/conv/conv2d_dilation_phases_cuda.h"
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

constexpr int kThreads = 256;

__global__ void phase_split_kernel(DilationPhases p, const float* __restrict__ image,
                                   float* __restrict__ phases, int64_t count) {
  ptx::griddep_enter();
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < count;
       o += int64_t(gridDim.x) * blockDim.x) {
    int64_t t = o;
    const int k = int(t % p.ws);
    t /= p.ws;
    const int j = int(t % p.hs);
    t /= p.hs;
    const int64_t nc = t % (int64_t(p.n) * p.c);
    const int phase = int(t / (int64_t(p.n) * p.c));
    const int i = p.d_h * j + phase / p.d_w - p.off_h, l = p.d_w * k + phase % p.d_w - p.off_w;
    phases[o] = i >= 0 && i < p.h && l >= 0 && l < p.w ? image[(nc * p.h + i) * p.w + l] : 0.f;
  }
}

__global__ void phase_merge_kernel(DilationPhases p, const float* __restrict__ phases,
                                   float* __restrict__ image, int64_t count) {
  ptx::griddep_enter();
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < count;
       o += int64_t(gridDim.x) * blockDim.x) {
    const int l = int(o % p.w);
    const int64_t rest = o / p.w;
    const int i = int(rest % p.h);
    const int64_t nc = rest / p.h;
    const int ih = i + p.off_h, lw = l + p.off_w;
    const int phase = (ih % p.d_h) * p.d_w + lw % p.d_w;
    image[o] = phases[((int64_t(phase) * p.n * p.c + nc) * p.hs + ih / p.d_h) * p.ws + lw / p.d_w];
  }
}

unsigned grid_for(int64_t work) {
  return static_cast<unsigned>(std::clamp<int64_t>(ceil_div<int64_t>(work, kThreads), 1, 8192));
}

}  // namespace

void dilation_phase_split_cuda(const DilationPhases& p, const float* d_image, float* d_phases,
                               cudaStream_t stream) {
  const int64_t count = p.phase_floats();
  phase_split_kernel<<<grid_for(count), kThreads, 0, stream>>>(p, d_image, d_phases, count);
  CNN_LAUNCH_CHECK("phase_split_kernel");
}

void dilation_phase_merge_cuda(const DilationPhases& p, const float* d_phases, float* d_image,
                               cudaStream_t stream) {
  const int64_t count = p.image_floats();
  phase_merge_kernel<<<grid_for(count), kThreads, 0, stream>>>(p, d_phases, d_image, count);
  CNN_LAUNCH_CHECK("phase_merge_kernel");
}

}  // namespace cnn
