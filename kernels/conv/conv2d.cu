// CUDA variants of the 2-D convolution (NCHW, weights (OC, C, KH, KW), cross-correlation).
//   forward:          _naive (one thread per output), _tiled (shared-memory input tile + halo)
//   backward_data:    _naive (gather: one thread per dx element, no atomics)
//   backward_weight:  _naive (one thread per weight, serial sum), _tiled (per-chunk block
//                     reductions, then atomicAdd or a fixed-order second stage); algo tiled
//                     runs the direct register-tiled kernel instead on stride-1 3x3 shapes
//                     (conv2d_wgrad_direct.h)
// Every kernel walks its work with a grid-stride loop over a 1-D grid, so no grid dimension
// limits the batch or channel count. Indices that can exceed 2^31 are int64.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/conv/conv2d_cuda.h"
#include "kernels/conv/conv2d_wgrad_direct.h"
#include "kernels/conv/direct_conv_common.cuh"
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

// Tiled forward: a block computes a kTileH x kTileW output tile for kOcGroup output channels.
constexpr int kTileH = 16;
constexpr int kTileW = 16;
constexpr int kOcGroup = 8;

// Conv2dShape plus the derived output size, usable on the device (Conv2dShape's oh()/ow() are
// host functions).
struct ConvDims {
  int n, c, h, w;
  int oc, kh, kw;
  int sh, sw, ph, pw;
  int oh, ow;
};

ConvDims dims_of(const Conv2dShape& s) {
  return ConvDims{s.n,        s.c,        s.h,     s.w,     s.oc,   s.kh,  s.kw,
                  s.stride_h, s.stride_w, s.pad_h, s.pad_w, s.oh(), s.ow()};
}

// ---------------------------------------------------------------------------------------------
// Forward

// Thread mapping: one thread per output element y[n, oc, oy, ox] (grid-stride over all of them).
__global__ void conv2d_forward_naive(ConvDims d, const float* __restrict__ d_x,
                                     const float* __restrict__ d_w, const float* __restrict__ d_b,
                                     float* __restrict__ d_y, bool relu) {
  ptx::griddep_enter();
  const int64_t total = static_cast<int64_t>(d.n) * d.oc * d.oh * d.ow;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int ox = static_cast<int>(i % d.ow);
    int64_t r = i / d.ow;
    const int oy = static_cast<int>(r % d.oh);
    r /= d.oh;
    const int oc = static_cast<int>(r % d.oc);
    const int64_t n = r / d.oc;
    float acc = 0.f;
    for (int c = 0; c < d.c; ++c)
      for (int ky = 0; ky < d.kh; ++ky) {
        const int iy = oy * d.sh - d.ph + ky;
        if (iy < 0 || iy >= d.h) continue;  // zero padding
        for (int kx = 0; kx < d.kw; ++kx) {
          const int ix = ox * d.sw - d.pw + kx;
          if (ix < 0 || ix >= d.w) continue;
          acc += d_x[at4(n, c, iy, ix, d.c, d.h, d.w)] * d_w[at4(oc, c, ky, kx, d.c, d.kh, d.kw)];
        }
      }
    if (d_b) acc += d_b[oc];
    d_y[i] = relu ? relu_keep_nan(acc) : acc;
  }
}

// Thread mapping: a block owns a kTileH x kTileW tile of output pixels of one image n for
// kOcGroup consecutive output channels; thread (ty, tx) owns pixel (oy0 + ty, ox0 + tx) for all
// kOcGroup channels (accumulators in registers). Per input channel the block stages the input
// tile plus its halo, in_h x in_w = ((tile_h-1)*stride_h + KH) x ((tile_w-1)*stride_w + KW), and
// the kOcGroup x KH x KW weights in shared memory, so each input value is read from global memory
// once per block instead of once per tap. Blocks walk (oc group, tile x, tile y, n) with a
// grid-stride loop, oc group fastest so that neighbouring blocks share the input tile in L2.
__global__ void __launch_bounds__(kTileH* kTileW)
    conv2d_forward_tiled(ConvDims d, int in_h, int in_w, const float* __restrict__ d_x,
                         const float* __restrict__ d_w, const float* __restrict__ d_b,
                         float* __restrict__ d_y, bool relu) {
  ptx::griddep_enter();
  extern __shared__ float smem[];
  float* s_in = smem;               // (in_h, in_w): one input channel's tile + halo
  float* s_w = smem + in_h * in_w;  // (kOcGroup, KH, KW): that channel's weights
  const int taps = d.kh * d.kw;
  const int tid = threadIdx.x;
  const int ty = tid / kTileW, tx = tid % kTileW;
  const int tiles_x = (d.ow + kTileW - 1) / kTileW;
  const int tiles_y = (d.oh + kTileH - 1) / kTileH;
  const int groups = (d.oc + kOcGroup - 1) / kOcGroup;
  const int64_t blocks = static_cast<int64_t>(d.n) * tiles_y * tiles_x * groups;

  for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
    const int group = static_cast<int>(blk % groups);
    int64_t r = blk / groups;
    const int tile_x = static_cast<int>(r % tiles_x);
    r /= tiles_x;
    const int tile_y = static_cast<int>(r % tiles_y);
    const int64_t n = r / tiles_y;
    const int oc0 = group * kOcGroup;
    const int oy = tile_y * kTileH + ty, ox = tile_x * kTileW + tx;
    const bool active = oy < d.oh && ox < d.ow;
    const int iy0 = tile_y * kTileH * d.sh - d.ph;  // input row of s_in's first row
    const int ix0 = tile_x * kTileW * d.sw - d.pw;

    float acc[kOcGroup];
#pragma unroll
    for (int g = 0; g < kOcGroup; ++g) acc[g] = 0.f;

    for (int c = 0; c < d.c; ++c) {
      __syncthreads();  // everyone is done with the previous channel's tile
      for (int i = tid; i < in_h * in_w; i += blockDim.x) {
        const int iy = iy0 + i / in_w, ix = ix0 + i % in_w;
        const bool inside = iy >= 0 && iy < d.h && ix >= 0 && ix < d.w;
        s_in[i] = inside ? d_x[at4(n, c, iy, ix, d.c, d.h, d.w)] : 0.f;  // zero padding
      }
      for (int i = tid; i < kOcGroup * taps; i += blockDim.x) {
        const int oc = oc0 + i / taps;
        s_w[i] = oc < d.oc ? d_w[(static_cast<int64_t>(oc) * d.c + c) * taps + i % taps] : 0.f;
      }
      __syncthreads();
      if (!active) continue;
      for (int ky = 0; ky < d.kh; ++ky)
        for (int kx = 0; kx < d.kw; ++kx) {
          const float v = s_in[(ty * d.sh + ky) * in_w + tx * d.sw + kx];
#pragma unroll
          for (int g = 0; g < kOcGroup; ++g) acc[g] += v * s_w[g * taps + ky * d.kw + kx];
        }
    }

    if (active) {
#pragma unroll
      for (int g = 0; g < kOcGroup; ++g) {
        const int oc = oc0 + g;
        if (oc >= d.oc) break;
        float v = acc[g] + (d_b ? d_b[oc] : 0.f);
        d_y[at4(n, oc, oy, ox, d.oc, d.oh, d.ow)] = relu ? relu_keep_nan(v) : v;
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Backward data

// Thread mapping: one thread per input-gradient element dx[n, c, iy, ix] (grid-stride). It
// gathers dy over every (oc, ky, kx) whose output position oy = (iy + pad_h - ky) / stride_h is a
// whole number inside the output, so no two threads write the same element and no atomics are
// needed.
__global__ void conv2d_backward_data_naive(ConvDims d, const float* __restrict__ d_dy,
                                           const float* __restrict__ d_w,
                                           float* __restrict__ d_dx) {
  ptx::griddep_enter();
  const int64_t total = static_cast<int64_t>(d.n) * d.c * d.h * d.w;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int ix = static_cast<int>(i % d.w);
    int64_t r = i / d.w;
    const int iy = static_cast<int>(r % d.h);
    r /= d.h;
    const int c = static_cast<int>(r % d.c);
    const int64_t n = r / d.c;
    const int py = iy + d.ph, px = ix + d.pw;  // position in the padded input
    float acc = 0.f;
    // Only taps with (py - ky) a non-negative multiple of the stride reach this element.
    for (int ky = py % d.sh; ky < d.kh && ky <= py; ky += d.sh) {
      const int oy = (py - ky) / d.sh;
      if (oy >= d.oh) continue;
      for (int kx = px % d.sw; kx < d.kw && kx <= px; kx += d.sw) {
        const int ox = (px - kx) / d.sw;
        if (ox >= d.ow) continue;
        for (int oc = 0; oc < d.oc; ++oc)
          acc +=
              d_dy[at4(n, oc, oy, ox, d.oc, d.oh, d.ow)] * d_w[at4(oc, c, ky, kx, d.c, d.kh, d.kw)];
      }
    }
    d_dx[i] = acc;
  }
}

// ---------------------------------------------------------------------------------------------
// Backward weight. "Slots" number the gradients: slot < OC*C*KH*KW is weight (oc, c, ky, kx) in
// dw's own layout; the OC slots after them are the biases.

// Thread mapping: one thread per slot (grid-stride); it sums that gradient over all N*OH*OW
// output positions serially and adds the total into dw/db. Deterministic by construction.
__global__ void conv2d_backward_weight_naive(ConvDims d, const float* __restrict__ d_x,
                                             const float* __restrict__ d_dy,
                                             float* __restrict__ d_dw, float* __restrict__ d_db) {
  ptx::griddep_enter();
  const int taps = d.kh * d.kw;
  const int64_t weights = static_cast<int64_t>(d.oc) * d.c * taps;
  const int64_t slots = weights + (d_db ? d.oc : 0);
  for (int64_t slot = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; slot < slots;
       slot += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float acc = 0.f;
    if (slot < weights) {
      const int kx = static_cast<int>(slot % d.kw);
      const int ky = static_cast<int>(slot / d.kw % d.kh);
      const int c = static_cast<int>(slot / taps % d.c);
      const int oc = static_cast<int>(slot / taps / d.c);
      for (int64_t n = 0; n < d.n; ++n)
        for (int oy = 0; oy < d.oh; ++oy) {
          const int iy = oy * d.sh - d.ph + ky;
          if (iy < 0 || iy >= d.h) continue;
          for (int ox = 0; ox < d.ow; ++ox) {
            const int ix = ox * d.sw - d.pw + kx;
            if (ix < 0 || ix >= d.w) continue;
            acc +=
                d_x[at4(n, c, iy, ix, d.c, d.h, d.w)] * d_dy[at4(n, oc, oy, ox, d.oc, d.oh, d.ow)];
          }
        }
      d_dw[slot] += acc;
    } else {
      const int oc = static_cast<int>(slot - weights);
      for (int64_t n = 0; n < d.n; ++n)
        for (int oy = 0; oy < d.oh; ++oy)
          for (int ox = 0; ox < d.ow; ++ox) acc += d_dy[at4(n, oc, oy, ox, d.oc, d.oh, d.ow)];
      d_db[oc] += acc;
    }
  }
}

// Thread mapping: a block owns (chunk of kConv2dWgradChunk output positions, oc, c), and thread t
// owns the chunk's positions t, t + blockDim, ... (position = (n, oy, ox), ox fastest, so dy
// reads are coalesced). For each of its positions a thread reads dy once and adds x * dy into its
// own partial sum of every tap (ky, kx), plus dy alone into the bias sum when c == 0; the partial
// sums live in a shared-memory column per thread, (jobs, blockDim) with jobs = KH*KW (+1), so a
// position is decoded once rather than once per tap. Then, per job, the block reduces the columns
// in a fixed order and thread 0 publishes the block's partial: atomicAdd into dw/db
// (kDeterministic = false) or a plain store into scratch[chunk][slot] for the fixed-order second
// stage (kDeterministic = true). Blocks walk (c, oc, chunk) with a grid-stride loop.
template <bool kDeterministic>
__global__ void __launch_bounds__(kBlock)
    conv2d_backward_weight_tiled(ConvDims d, int64_t chunks, const float* __restrict__ d_x,
                                 const float* __restrict__ d_dy, float* __restrict__ d_dw,
                                 float* __restrict__ d_db, float* __restrict__ d_scratch) {
  ptx::griddep_enter();
  extern __shared__ float s_acc[];  // (KH*KW + 1, blockDim.x): per-thread partial sums
  __shared__ float s_warp[kBlock / 32];
  const int taps = d.kh * d.kw;
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const int64_t weights = static_cast<int64_t>(d.oc) * d.c * taps;
  const int64_t slots = weights + d.oc;  // the scratch row length (conv2d_wgrad_slots)
  const int64_t positions = static_cast<int64_t>(d.n) * d.oh * d.ow;
  const int64_t blocks = chunks * d.oc * d.c;

  for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
    const int c = static_cast<int>(blk % d.c);
    const int oc = static_cast<int>(blk / d.c % d.oc);
    const int64_t chunk = blk / d.c / d.oc;
    const int64_t p_begin = chunk * kConv2dWgradChunk;
    const int64_t p_end = min(p_begin + kConv2dWgradChunk, positions);
    // The block's last job is the bias, handled by the c == 0 block of each (chunk, oc).
    const bool with_bias = c == 0 && d_db;
    const int jobs = taps + (with_bias ? 1 : 0);

    // A thread touches only its own column until block_sum, so no barrier is needed here; the
    // barriers in the previous iteration's block_sum calls already ordered its reads.
    for (int j = 0; j < jobs; ++j) s_acc[j * nthreads + tid] = 0.f;
    for (int64_t p = p_begin + tid; p < p_end; p += nthreads) {
      const int ox = static_cast<int>(p % d.ow);
      const int oy = static_cast<int>(p / d.ow % d.oh);
      const int64_t n = p / d.ow / d.oh;
      const float g = d_dy[at4(n, oc, oy, ox, d.oc, d.oh, d.ow)];
      if (with_bias) s_acc[taps * nthreads + tid] += g;
      const float* x_plane = d_x + at4(n, c, 0, 0, d.c, d.h, d.w);  // (H, W) of image n, channel c
      const int iy0 = oy * d.sh - d.ph, ix0 = ox * d.sw - d.pw;
      for (int ky = 0; ky < d.kh; ++ky) {
        const int iy = iy0 + ky;
        if (iy < 0 || iy >= d.h) continue;  // zero padding contributes nothing
        for (int kx = 0; kx < d.kw; ++kx) {
          const int ix = ix0 + kx;
          if (ix < 0 || ix >= d.w) continue;
          s_acc[(ky * d.kw + kx) * nthreads + tid] += x_plane[iy * d.w + ix] * g;
        }
      }
    }

    for (int job = 0; job < jobs; ++job) {
      const float sum = block_sum(s_acc[job * nthreads + tid], s_warp);
      if (tid != 0) continue;
      const bool bias = job == taps;
      const int64_t slot = bias ? weights + oc : (static_cast<int64_t>(oc) * d.c + c) * taps + job;
      if (kDeterministic) {
        d_scratch[chunk * slots + slot] = sum;
      } else if (bias) {
        atomicAdd(&d_db[oc], sum);
      } else {
        atomicAdd(&d_dw[slot], sum);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Launch helpers

void launch_forward_naive(const ConvDims& d, const float* d_x, const float* d_w, const float* d_b,
                          float* d_y, bool relu, cudaStream_t stream) {
  const int64_t outputs = static_cast<int64_t>(d.n) * d.oc * d.oh * d.ow;
  conv2d_forward_naive<<<grid_for_items(outputs), kBlock, 0, stream>>>(d, d_x, d_w, d_b, d_y, relu);
  CNN_LAUNCH_CHECK("conv2d_forward_naive");
}

// Returns false (launching nothing) when the tile + halo of this shape does not fit in shared
// memory (huge kernels or strides); the caller then falls back to the naive kernel.
bool launch_forward_tiled(const ConvDims& d, const float* d_x, const float* d_w, const float* d_b,
                          float* d_y, bool relu, cudaStream_t stream) {
  // Images smaller than a tile only stage the rows/columns their outputs need.
  const int64_t in_h = static_cast<int64_t>(std::min(kTileH, d.oh) - 1) * d.sh + d.kh;
  const int64_t in_w = static_cast<int64_t>(std::min(kTileW, d.ow) - 1) * d.sw + d.kw;
  const int64_t smem_floats = in_h * in_w + static_cast<int64_t>(kOcGroup) * d.kh * d.kw;
  if (smem_floats > (int64_t{1} << 30)) return false;  // keeps the size_t maths honest
  const std::size_t smem = static_cast<std::size_t>(smem_floats) * sizeof(float);
  if (!fits_dynamic_smem(smem, conv2d_forward_tiled)) return false;
  const int64_t blocks = static_cast<int64_t>(d.n) * ceil_div(d.oh, kTileH) *
                         ceil_div(d.ow, kTileW) * ceil_div(d.oc, kOcGroup);
  conv2d_forward_tiled<<<grid_for(blocks), kTileH * kTileW, smem, stream>>>(
      d, static_cast<int>(in_h), static_cast<int>(in_w), d_x, d_w, d_b, d_y, relu);
  CNN_LAUNCH_CHECK("conv2d_forward_tiled");
  return true;
}

void launch_backward_weight_naive(const ConvDims& d, const float* d_x, const float* d_dy,
                                  float* d_dw, float* d_db, cudaStream_t stream) {
  const int64_t slots = static_cast<int64_t>(d.oc) * d.c * d.kh * d.kw + d.oc;
  conv2d_backward_weight_naive<<<grid_for_items(slots), kBlock, 0, stream>>>(d, d_x, d_dy, d_dw,
                                                                             d_db);
  CNN_LAUNCH_CHECK("conv2d_backward_weight_naive");
}

}  // namespace

void conv2d_forward_cuda(const Conv2dShape& s, const float* d_x, const float* d_w, const float* d_b,
                         float* d_y, bool relu, Algo algo, cudaStream_t stream) {
  const ConvDims d = dims_of(s);
  if (algo != Algo::Naive && launch_forward_tiled(d, d_x, d_w, d_b, d_y, relu, stream)) return;
  launch_forward_naive(d, d_x, d_w, d_b, d_y, relu, stream);
}

void conv2d_backward_data_cuda(const Conv2dShape& s, const float* d_dy, const float* d_w,
                               float* d_dx, Algo /*algo: one variant for every algo so far*/,
                               cudaStream_t stream) {
  const ConvDims d = dims_of(s);
  const int64_t inputs = static_cast<int64_t>(d.n) * d.c * d.h * d.w;
  conv2d_backward_data_naive<<<grid_for_items(inputs), kBlock, 0, stream>>>(d, d_dy, d_w, d_dx);
  CNN_LAUNCH_CHECK("conv2d_backward_data_naive");
}

void conv2d_backward_weight_cuda(const Conv2dShape& s, const float* d_x, const float* d_dy,
                                 float* d_dw, float* d_db, float* d_scratch, Algo algo,
                                 bool deterministic, cudaStream_t stream) {
  // Tiled: the direct register-tiled kernel where it takes the shape (stride-1 3x3).
  if (algo == Algo::Tiled && wgrad_direct_supported(s)) {
    conv2d_backward_weight_direct_cuda(s, d_x, d_dy, d_dw, d_db, d_scratch, deterministic, stream);
    return;
  }
  const ConvDims d = dims_of(s);
  // One shared-memory column of partial sums per thread and job (taps + bias).
  const std::size_t smem = (static_cast<std::size_t>(d.kh) * d.kw + 1) * kBlock * sizeof(float);
  const bool tiled_fits = deterministic
                              ? fits_dynamic_smem(smem, conv2d_backward_weight_tiled<true>)
                              : fits_dynamic_smem(smem, conv2d_backward_weight_tiled<false>);
  // Naive: serial per-weight sums, deterministic without scratch. Also the fallback for kernels
  // too large for the tiled variant's shared-memory partial sums.
  if (algo == Algo::Naive || !tiled_fits) {
    launch_backward_weight_naive(d, d_x, d_dy, d_dw, d_db, stream);
    return;
  }
  const int64_t chunks = conv2d_wgrad_chunks(s);
  const int64_t blocks = chunks * d.oc * d.c;
  if (!deterministic) {
    conv2d_backward_weight_tiled<false>
        <<<grid_for(blocks), kBlock, smem, stream>>>(d, chunks, d_x, d_dy, d_dw, d_db, nullptr);
    CNN_LAUNCH_CHECK("conv2d_backward_weight_tiled<atomic>");
    return;
  }
  conv2d_backward_weight_tiled<true>
      <<<grid_for(blocks), kBlock, smem, stream>>>(d, chunks, d_x, d_dy, d_dw, d_db, d_scratch);
  CNN_LAUNCH_CHECK("conv2d_backward_weight_tiled<deterministic>");
  const int64_t weights = static_cast<int64_t>(d.oc) * d.c * d.kh * d.kw;
  const int64_t slots = conv2d_wgrad_slots(s);
  backward_weight_finish<<<grid_for_items(slots), kBlock, 0, stream>>>(weights, slots, chunks,
                                                                       d_scratch, d_dw, d_db);
  CNN_LAUNCH_CHECK("backward_weight_finish");
}

}  // namespace cnn
