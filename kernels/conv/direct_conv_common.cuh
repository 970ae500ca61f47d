#pragma once
// What the direct (naive and tiled, not implicit-GEMM) convolution kernels of conv2d.cu and
// conv2d_grouped.cu share: their block and grid sizes, the dynamic shared-memory opt-in, NCHW
// offsets, the NaN-keeping ReLU, the fixed-order block sum and the deterministic weight
// gradient's second stage. One copy, so both ops compute with the same code.
//
// Everything sits in an anonymous namespace: without relocatable device code each .cu file needs
// its own copy of a __global__ kernel, and the host-side stubs must not clash at link time.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

constexpr int kBlock = 256;  // threads per block of the 1-D kernels and the wgrad reduction
// Grids are capped here; the grid-stride loops cover any remaining work.
constexpr int64_t kMaxGridBlocks = int64_t{1} << 20;
// Above this much dynamic shared memory a kernel must opt in (cudaFuncSetAttribute).
constexpr std::size_t kDefaultSmemBytes = 48 * 1024;

__device__ __forceinline__ int64_t at4(int64_t i0, int64_t i1, int64_t i2, int64_t i3, int d1,
                                       int d2, int d3) {
  return ((i0 * d1 + i1) * d2 + i2) * d3 + i3;
}

// max(v, 0) that lets NaN through, like the CPU reference's std::max(v, 0.0).
__device__ __forceinline__ float relu_keep_nan(float v) {
  return v < 0.f ? 0.f : v;
}

// Sum of v over the block, valid in thread 0. blockDim.x must be a multiple of 32 (<= 1024).
// The order of additions is fixed by the thread layout, so the result is bitwise repeatable.
// s_warp holds one float per warp and may be reused by the next call.
__device__ float block_sum(float v, float* s_warp) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  __syncthreads();  // the previous call's readers of s_warp are done
  if (lane == 0) s_warp[warp] = v;
  __syncthreads();
  v = 0.f;
  if (warp == 0) {
    v = lane < warps ? s_warp[lane] : 0.f;
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  }
  return v;
}

// The deterministic weight gradient's second stage. Slots number the gradients: slot < weights is
// a weight in dw's own layout, the slots after them are the biases; scratch holds one row of
// `slots` partial sums per chunk of output positions (or per tile).
// Thread mapping: one thread per slot (grid-stride); it adds that slot's partial sums in row order
// and then adds the total into dw/db, so the result is bitwise repeatable.
__global__ void backward_weight_finish(int64_t weights, int64_t slots, int64_t partials,
                                       const float* __restrict__ d_scratch,
                                       float* __restrict__ d_dw, float* __restrict__ d_db) {
  ptx::griddep_enter();
  for (int64_t slot = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; slot < slots;
       slot += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (slot >= weights && !d_db) continue;
    float sum = 0.f;
    for (int64_t k = 0; k < partials; ++k) sum += d_scratch[k * slots + slot];
    if (slot < weights)
      d_dw[slot] += sum;
    else
      d_db[slot - weights] += sum;
  }
}

unsigned grid_for(int64_t work_blocks) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(work_blocks, kMaxGridBlocks)));
}

// Blocks of kBlock threads for one item per thread.
unsigned grid_for_items(int64_t items) {
  return grid_for(ceil_div<int64_t>(items, kBlock));
}

// Largest dynamic shared memory one block of this device may use (after opting in).
std::size_t max_smem_optin() {
  int dev = 0, bytes = 0;
  CNN_CUDA_CHECK(cudaGetDevice(&dev));
  CNN_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return static_cast<std::size_t>(bytes);
}

// True when `kernel` can launch with `bytes` of dynamic shared memory on this device; opts the
// kernel in above the 48 KiB default when needed.
template <class Kernel>
bool fits_dynamic_smem(std::size_t bytes, Kernel kernel) {
  if (bytes <= kDefaultSmemBytes) return true;
  if (bytes > max_smem_optin()) return false;
  CNN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(bytes)));
  return true;
}

}  // namespace
}  // namespace cnn
