#pragma once
// Device-side pieces shared by the single-input-channel convolutions (conv2d_1ch.cu) and the
// fused conv -> ReLU -> max-pool (conv_relu_pool.cu): the ReLU that keeps NaN, the shared-memory
// input tile, the warp reduce-scatter, and the two ways a weight-gradient block hands on its
// partial sums (atomicAdd, or per-block scratch summed in block order by a second kernel for
// ex.deterministic). They take plain pointers and sizes so that neither file's Params leaks into
// the other.
//
// Weight-gradient value layout, one block's partials for the q output channels oc0 .. oc0+q-1 of
// a kk-tap kernel: value vi < q*kk is weight tap (vi / kk, vi % kk), value q*kk + qi is the bias
// of channel qi: v = q*(kk+1) values. The scratch holds them per block, blocks of channel group g
// at g * blocks_per_group + b.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/ptx.cuh"

namespace cnn::conv1ch {

// max(v, 0) that passes NaN through (fmaxf would drop it): the ReLU of conv2d_forward.
__device__ __forceinline__ float relu_keep_nan(float v) {
  return (v < 0.f) ? 0.f : v;
}

// Fills s_x, rows x is floats (row stride is), with the window of img (h x w) whose top-left
// element is (iy0, ix0): zero where it hangs over the padding or past the image. The whole block
// takes part; the caller synchronizes. Unrolled so that a thread's next loads are issued before
// its earlier ones land (a tile is ~5 elements per thread of a 224-thread block).
__device__ __forceinline__ void load_input_tile(const float* img, int h, int w, int iy0, int ix0,
                                                int rows, int is, float* s_x) {
#pragma unroll 4
  for (int i = threadIdx.x; i < rows * is; i += blockDim.x) {
    const int r = i / is, c = i - r * is;
    const int iy = iy0 + r, ix = ix0 + c;
    s_x[i] = (iy >= 0 && iy < h && ix >= 0 && ix < w) ? __ldg(img + iy * w + ix) : 0.f;
  }
}

// Butterfly reduce-scatter across the 32 lanes of a warp: on entry every lane holds VP partial
// values; on return lane l holds in v[0 .. VP/32) the warp totals of values l*VP/32 + i.
// Each step halves the live values (half exchanged, half kept), so the whole reduction costs
// ~VP shuffles instead of 5*VP for VP separate tree reductions. Call as
// reduce_scatter_step<VP / 2, 16, VP>(v, lane) with VP a power of two >= 32, the warp converged.
template <int kHalf, int kOff, int VP>
__device__ __forceinline__ void reduce_scatter_step(float (&v)[VP], int lane) {
  const bool upper = (lane & kOff) != 0;
#pragma unroll
  for (int i = 0; i < kHalf; ++i) {
    const float send = upper ? v[i] : v[i + kHalf];
    const float keep = upper ? v[i + kHalf] : v[i];
    v[i] = keep + __shfl_xor_sync(0xffffffffu, send, kOff);
  }
  if constexpr (kOff > 1) reduce_scatter_step<kHalf / 2, kOff / 2, VP>(v, lane);
}

// Weight-gradient block epilogue (after a __syncthreads): value vi of the layout above is the sum
// of kParts partial vectors, s_part[j * stride + vi], taken in j order (so the result does not
// depend on timing). Deterministic (scratch != null): written to scratch[block * v + vi].
// Otherwise atomicAdd-ed into dw (OC, kk) / db (OC, may be null), skipping channels >= oc.
template <int kParts>
__device__ __forceinline__ void wgrad_block_epilogue(const float* s_part, int stride, int q, int kk,
                                                     int oc0, int oc, float* dw, float* db,
                                                     float* scratch, int64_t block) {
  const int v = q * (kk + 1);
  for (int vi = threadIdx.x; vi < v; vi += blockDim.x) {
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kParts; ++j) sum += s_part[j * stride + vi];  // fixed order
    if (scratch) {
      scratch[block * v + vi] = sum;
    } else if (vi < q * kk) {
      const int qi = vi / kk, c = oc0 + qi;
      if (c < oc) atomicAdd(dw + c * kk + (vi - qi * kk), sum);
    } else {
      const int c = oc0 + vi - q * kk;
      if (db && c < oc) atomicAdd(db + c, sum);
    }
  }
}

// Second stage of a deterministic weight gradient whose blocks each cover kQ output channels:
// gradient (oc, r) (r < kk: weight tap, r == kk: bias) sums the partials of its channel group's
// blocks_per_group blocks in block order and adds the sum into dw (OC, kk) / db (OC, or null).
// Thread mapping: one gradient per thread (grid-stride).
template <int kQ>
__global__ void conv1ch_wgrad_reduce(const float* scratch, float* dw, float* db, int oc, int kk,
                                     int blocks_per_group) {
  ptx::griddep_enter();
  const int v_per_block = kQ * (kk + 1);
  const int total = oc * (kk + 1);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int c = i / (kk + 1), r = i - c * (kk + 1);
    const int g = c / kQ, q = c - g * kQ;
    if (r == kk && !db) continue;
    const int vi = (r < kk) ? q * kk + r : kQ * kk + q;
    const float* src = scratch + static_cast<int64_t>(g) * blocks_per_group * v_per_block + vi;
    float sum = 0.f;
    for (int b = 0; b < blocks_per_group; ++b) sum += src[static_cast<int64_t>(b) * v_per_block];
    if (r < kk)
      dw[c * kk + r] += sum;
    else
      db[c] += sum;
  }
}

}  // namespace cnn::conv1ch
