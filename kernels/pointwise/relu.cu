// ReLU on the GPU: elementwise, memory bound, so the only trick is 16-byte (float4) accesses
// when every pointer allows them. No __restrict__: y may alias x and dx may alias dy.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"
#include "kernels/pointwise/relu_cuda.h"

namespace cnn {
namespace {

constexpr int kThreads = 256;
// Enough blocks to fill any current GPU several times over; grid-stride loops do the rest.
constexpr int64_t kMaxBlocks = 8192;

__device__ __forceinline__ float relu1(float x) {
  return (x <= 0.f) ? 0.f : x;
}  // NaN passes
__device__ __forceinline__ float relu_grad1(float y, float dy) {
  return (y > 0.f) ? dy : 0.f;
}

// Thread mapping: each thread owns float4 groups v = tid, tid + stride, ... (grid-stride), then
// one thread of the grid per leftover element of the last count % 4.
__global__ void relu_forward_vec4(int64_t count, const float* d_x, float* d_y) {
  ptx::griddep_enter();
  const int64_t n4 = count / 4;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const float4* x4 = reinterpret_cast<const float4*>(d_x);
  float4* y4 = reinterpret_cast<float4*>(d_y);
  for (int64_t v = tid; v < n4; v += stride) {
    float4 a = x4[v];
    y4[v] = make_float4(relu1(a.x), relu1(a.y), relu1(a.z), relu1(a.w));
  }
  for (int64_t i = n4 * 4 + tid; i < count; i += stride) d_y[i] = relu1(d_x[i]);
}

// Thread mapping: each thread owns elements i = tid, tid + stride, ... (unaligned pointers).
__global__ void relu_forward_scalar(int64_t count, const float* d_x, float* d_y) {
  ptx::griddep_enter();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    d_y[i] = relu1(d_x[i]);
}

// Thread mapping: as relu_forward_vec4, over (y, dy) -> dx.
__global__ void relu_backward_vec4(int64_t count, const float* d_y, const float* d_dy,
                                   float* d_dx) {
  ptx::griddep_enter();
  const int64_t n4 = count / 4;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const float4* y4 = reinterpret_cast<const float4*>(d_y);
  const float4* dy4 = reinterpret_cast<const float4*>(d_dy);
  float4* dx4 = reinterpret_cast<float4*>(d_dx);
  for (int64_t v = tid; v < n4; v += stride) {
    float4 y = y4[v], g = dy4[v];
    dx4[v] = make_float4(relu_grad1(y.x, g.x), relu_grad1(y.y, g.y), relu_grad1(y.z, g.z),
                         relu_grad1(y.w, g.w));
  }
  for (int64_t i = n4 * 4 + tid; i < count; i += stride) d_dx[i] = relu_grad1(d_y[i], d_dy[i]);
}

// Thread mapping: each thread owns elements i = tid, tid + stride, ... (unaligned pointers).
__global__ void relu_backward_scalar(int64_t count, const float* d_y, const float* d_dy,
                                     float* d_dx) {
  ptx::griddep_enter();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    d_dx[i] = relu_grad1(d_y[i], d_dy[i]);
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

unsigned grid_for(int64_t work) {
  return static_cast<unsigned>(
      std::clamp<int64_t>(ceil_div<int64_t>(work, kThreads), 1, kMaxBlocks));
}

}  // namespace

void relu_forward_cuda(int64_t count, const float* d_x, float* d_y, cudaStream_t stream) {
  if (aligned16(d_x) && aligned16(d_y)) {
    relu_forward_vec4<<<grid_for(count / 4 + 1), kThreads, 0, stream>>>(count, d_x, d_y);
    CNN_LAUNCH_CHECK("relu_forward_vec4");
  } else {
    relu_forward_scalar<<<grid_for(count), kThreads, 0, stream>>>(count, d_x, d_y);
    CNN_LAUNCH_CHECK("relu_forward_scalar");
  }
}

void relu_backward_cuda(int64_t count, const float* d_y, const float* d_dy, float* d_dx,
                        cudaStream_t stream) {
  if (aligned16(d_y) && aligned16(d_dy) && aligned16(d_dx)) {
    relu_backward_vec4<<<grid_for(count / 4 + 1), kThreads, 0, stream>>>(count, d_y, d_dy, d_dx);
    CNN_LAUNCH_CHECK("relu_backward_vec4");
  } else {
    relu_backward_scalar<<<grid_for(count), kThreads, 0, stream>>>(count, d_y, d_dy, d_dx);
    CNN_LAUNCH_CHECK("relu_backward_scalar");
  }
}

}  // namespace cnn
