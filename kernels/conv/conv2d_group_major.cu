// Group-major copy on the GPU: memory bound, one pass over the tensor. A block copies a span of
// one (sample, group) plane, so the (sample, group) -> (group, sample) index arithmetic is done
// once per block, not per element; float4 accesses where the plane and both bases allow them.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/conv/conv2d_group_major_cuda.h"
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

constexpr int kThreads = 256;
constexpr int kSpanVecs = 4 * kThreads;  // float4s (or floats) of a plane one block copies

// Grid: x cuts a plane into spans of kSpanVecs, y strides over the planes. T is float4 or float
// and `plane` counts Ts. Source plane p is (sample i, group g) in the source's order.
template <typename T>
__global__ void group_major_copy_kernel(const T* __restrict__ src, T* __restrict__ dst, int n,
                                        int groups, int64_t plane, int64_t planes,
                                        bool to_group_major) {
  ptx::griddep_enter();
  for (int64_t p = blockIdx.y; p < planes; p += gridDim.y) {
    // Source plane p; its destination plane q.
    int64_t q;
    if (to_group_major) {  // p = i * groups + g  ->  q = g * n + i
      const int64_t i = p / groups, g = p % groups;
      q = g * n + i;
    } else {  // p = g * n + i  ->  q = i * groups + g
      const int64_t g = p / n, i = p % n;
      q = i * groups + g;
    }
    const T* from = src + p * plane;
    T* to = dst + q * plane;
    const int64_t span_end = int64_t(blockIdx.x + 1) * kSpanVecs;
    const int64_t end = span_end < plane ? span_end : plane;
    for (int64_t e = int64_t(blockIdx.x) * kSpanVecs + threadIdx.x; e < end; e += kThreads)
      to[e] = from[e];
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

template <typename T>
void launch(const float* d_src, float* d_dst, int n, int groups, int64_t plane_floats,
            bool to_group_major, cudaStream_t stream, const char* name) {
  const int64_t plane = plane_floats / int64_t(sizeof(T) / sizeof(float));
  const int64_t planes = int64_t(n) * groups;
  const dim3 grid(static_cast<unsigned>(ceil_div<int64_t>(plane, kSpanVecs)),
                  static_cast<unsigned>(std::min<int64_t>(planes, 65535)));
  CNN_CHECK(grid.x <= 0x7fffffffu, "group_major_copy: a plane of {} floats is too large",
            plane_floats);
  group_major_copy_kernel<T><<<grid, kThreads, 0, stream>>>(reinterpret_cast<const T*>(d_src),
                                                            reinterpret_cast<T*>(d_dst), n, groups,
                                                            plane, planes, to_group_major);
  CNN_LAUNCH_CHECK(name);
}

}  // namespace

void group_major_copy_cuda(const float* d_src, float* d_dst, int n, int groups, int64_t plane,
                           bool to_group_major, cudaStream_t stream) {
  if (plane % 4 == 0 && aligned16(d_src) && aligned16(d_dst))
    launch<float4>(d_src, d_dst, n, groups, plane, to_group_major, stream,
                   "group_major_copy_kernel<float4>");
  else
    launch<float>(d_src, d_dst, n, groups, plane, to_group_major, stream,
                  "group_major_copy_kernel<float>");
}

}  // namespace cnn
