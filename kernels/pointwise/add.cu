// Elementwise add on the GPU: memory bound, so as relu.cu, 16-byte (float4) accesses when every
// pointer allows them. No __restrict__: y may alias a or b.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/pointwise/add_cuda.h"
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

constexpr int kThreads = 256;
// Enough blocks to fill any current GPU several times over; grid-stride loops do the rest.
constexpr int64_t kMaxBlocks = 8192;

// Thread mapping: each thread owns float4 groups v = tid, tid + stride, ... (grid-stride), then
// one thread of the grid per leftover element of the last count % 4.
__global__ void add_vec4(int64_t count, const float* d_a, const float* d_b, float* d_y) {
  ptx::griddep_enter();
  const int64_t n4 = count / 4;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const float4* a4 = reinterpret_cast<const float4*>(d_a);
  const float4* b4 = reinterpret_cast<const float4*>(d_b);
  float4* y4 = reinterpret_cast<float4*>(d_y);
  for (int64_t v = tid; v < n4; v += stride) {
    const float4 a = a4[v], b = b4[v];
    y4[v] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
  }
  for (int64_t i = n4 * 4 + tid; i < count; i += stride) d_y[i] = d_a[i] + d_b[i];
}

// Thread mapping: each thread owns elements i = tid, tid + stride, ... (unaligned pointers).
__global__ void add_scalar(int64_t count, const float* d_a, const float* d_b, float* d_y) {
  ptx::griddep_enter();
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    d_y[i] = d_a[i] + d_b[i];
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

unsigned grid_for(int64_t work) {
  return static_cast<unsigned>(
      std::clamp<int64_t>(ceil_div<int64_t>(work, kThreads), 1, kMaxBlocks));
}

}  // namespace

void add_forward_cuda(int64_t count, const float* d_a, const float* d_b, float* d_y,
                      cudaStream_t stream) {
  if (aligned16(d_a) && aligned16(d_b) && aligned16(d_y)) {
    add_vec4<<<grid_for(count / 4 + 1), kThreads, 0, stream>>>(count, d_a, d_b, d_y);
    CNN_LAUNCH_CHECK("add_vec4");
  } else {
    add_scalar<<<grid_for(count), kThreads, 0, stream>>>(count, d_a, d_b, d_y);
    CNN_LAUNCH_CHECK("add_scalar");
  }
}

}  // namespace cnn
