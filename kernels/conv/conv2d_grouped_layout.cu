// Grouped-convolution layout changes on the GPU, all memory bound. The group-major copy: a block
// copies a span of one (sample, group) plane, so the (sample, group) -> (group, sample) index
// arithmetic is done once per block, not per element; float4 accesses where the plane and both
// bases allow them. The block-diagonal weights: a thread per element of the larger side (weights
// are small: a 256 -> 256 3x3 layer's dense form is 2.4 MB).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/conv/conv2d_grouped_layout_cuda.h"
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

// Thread per element of wd (OC, C, taps), grid-stride.
__global__ void block_diagonal_expand_kernel(BlockDiagonal b, const float* __restrict__ w,
                                             float* __restrict__ wd) {
  ptx::griddep_enter();
  const int cg = b.c / b.groups, ocg = b.oc / b.groups;
  const int64_t count = int64_t(b.oc) * b.c * b.taps;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i % b.taps, oc_c = i / b.taps;
    const int c = int(oc_c % b.c), o = int(oc_c / b.c);
    wd[i] = c / cg == o / ocg ? w[(int64_t(o) * cg + c % cg) * b.taps + t] : 0.f;
  }
}

// Thread per element of dw (OC, C/G, taps), grid-stride.
__global__ void block_diagonal_add_back_kernel(BlockDiagonal b, const float* __restrict__ dwd,
                                               float* __restrict__ dw) {
  ptx::griddep_enter();
  const int cg = b.c / b.groups, ocg = b.oc / b.groups;
  const int64_t count = int64_t(b.oc) * cg * b.taps;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = i % b.taps, oc_c = i / b.taps;
    const int c = int(oc_c % cg), o = int(oc_c / cg);
    dw[i] += dwd[(int64_t(o) * b.c + (o / ocg) * cg + c) * b.taps + t];
  }
}

unsigned grid_for(int64_t work) {
  return static_cast<unsigned>(std::clamp<int64_t>(ceil_div<int64_t>(work, kThreads), 1, 8192));
}

}  // namespace

void block_diagonal_expand_cuda(const BlockDiagonal& b, const float* d_w, float* d_wd,
                                cudaStream_t stream) {
  block_diagonal_expand_kernel<<<grid_for(b.dense_floats()), kThreads, 0, stream>>>(b, d_w, d_wd);
  CNN_LAUNCH_CHECK("block_diagonal_expand_kernel");
}

void block_diagonal_add_back_cuda(const BlockDiagonal& b, const float* d_dwd, float* d_dw,
                                  cudaStream_t stream) {
  block_diagonal_add_back_kernel<<<grid_for(b.dense_floats() / b.groups), kThreads, 0, stream>>>(
      b, d_dwd, d_dw);
  CNN_LAUNCH_CHECK("block_diagonal_add_back_kernel");
}

void zero_floats_cuda(float* d_p, int64_t count, cudaStream_t stream) {
  CNN_CUDA_CHECK(cudaMemsetAsync(d_p, 0, size_t(count) * sizeof(float), stream));
}

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
