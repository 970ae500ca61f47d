// CUDA variants of the grouped, dilated 2-D convolution (NCHW, weights (OC, C/G, KH, KW)).
//   forward:          _naive (one thread per output), _tiled (shared-memory input tile + halo),
//                     depthwise_fast (register tiling, float4, fused bias/ReLU), for
//                     launch-bound problems depthwise_rows (no shared memory, one quad per
//                     thread), for bandwidth-bound ones depthwise_stream (each thread walks down
//                     a strip of its plane with a register ring of rows)
//   backward_data:    _naive (gather per dx element), _tiled (shared-memory dy tile + halo),
//                     depthwise_fast / _rows / _stream (the forward kernels on dy, kernel flipped);
//                     depthwise_flat (conv2d_depthwise_flat.cu, forward too; stride 2's only)
//   backward_weight:  _naive (one thread per weight, serial sum), _tiled (per-chunk block
//                     reductions), depthwise_fast_wgrad (per-tile register sums),
//                     depthwise_stream_wgrad (per-strip register sums); the last three
//                     publish by atomicAdd or, deterministic, into scratch for a fixed-order
//                     second stage.
// Blocks walk their work with grid-stride loops over a 1-D grid, so no grid dimension limits the
// batch or channel count. Indices that can exceed 2^31 are int64.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/conv/conv2d_depthwise_flat.h"
#include "kernels/conv/conv2d_grouped_cuda.h"
#include "kernels/conv/conv2d_grouped_narrow.h"
#include "kernels/conv/direct_conv_common.cuh"
#include "runtime/cuda_check.h"
#include "runtime/env_switches.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

constexpr int kTile = 16;  // tiled kernels: 16 x 16 outputs (or input gradients) per block

// Conv2dGroupedShape with the derived sizes, usable on the device.
struct GDims {
  int n, c, h, w;
  int oc, kh, kw;
  int sh, sw, ph, pw, dh, dw;
  int cg, ocg;
  int oh, ow;
};

GDims dims_of(const Conv2dGroupedShape& s) {
  return GDims{s.n,     s.c,     s.h,     s.w,     s.oc,   s.kh,    s.kw,   s.stride_h, s.stride_w,
               s.pad_h, s.pad_w, s.dil_h, s.dil_w, s.cg(), s.ocg(), s.oh(), s.ow()};
}

// Floor division for a possibly negative numerator and a positive divisor.
__device__ __forceinline__ int floor_div(int a, int b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

// ---------------------------------------------------------------------------------------------
// Naive

// Thread mapping: one thread per output element y[n, oc, oy, ox] (grid-stride); it sums the
// C/G input channels of oc's group over the (dilated) window.
__global__ void grouped_forward_naive(GDims d, const float* __restrict__ d_x,
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
    const int c0 = oc / d.ocg * d.cg;
    float acc = 0.f;
    for (int ci = 0; ci < d.cg; ++ci)
      for (int ky = 0; ky < d.kh; ++ky) {
        const int iy = oy * d.sh - d.ph + ky * d.dh;
        if (iy < 0 || iy >= d.h) continue;  // zero padding
        for (int kx = 0; kx < d.kw; ++kx) {
          const int ix = ox * d.sw - d.pw + kx * d.dw;
          if (ix < 0 || ix >= d.w) continue;
          acc += d_x[at4(n, c0 + ci, iy, ix, d.c, d.h, d.w)] *
                 d_w[at4(oc, ci, ky, kx, d.cg, d.kh, d.kw)];
        }
      }
    if (d_b) acc += d_b[oc];
    d_y[i] = relu ? relu_keep_nan(acc) : acc;
  }
}

// Thread mapping: one thread per input-gradient element dx[n, c, iy, ix] (grid-stride). It
// gathers dy over the output channels of c's group and every tap (ky, kx) whose output position
// oy = (iy + pad - ky*dil) / stride is a whole number inside the output: no atomics.
__global__ void grouped_backward_data_naive(GDims d, const float* __restrict__ d_dy,
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
    const int g = c / d.cg, ci = c % d.cg;
    float acc = 0.f;
    for (int ky = 0; ky < d.kh; ++ky) {
      const int ty = iy + d.ph - ky * d.dh;
      if (ty < 0 || ty % d.sh) continue;
      const int oy = ty / d.sh;
      if (oy >= d.oh) continue;
      for (int kx = 0; kx < d.kw; ++kx) {
        const int tx = ix + d.pw - kx * d.dw;
        if (tx < 0 || tx % d.sw) continue;
        const int ox = tx / d.sw;
        if (ox >= d.ow) continue;
        for (int j = 0; j < d.ocg; ++j) {
          const int oc = g * d.ocg + j;
          acc += d_dy[at4(n, oc, oy, ox, d.oc, d.oh, d.ow)] *
                 d_w[at4(oc, ci, ky, kx, d.cg, d.kh, d.kw)];
        }
      }
    }
    d_dx[i] = acc;
  }
}

// Slots number the gradients: slot < OC*CG*KH*KW is weight (oc, ci, ky, kx) in dw's layout; the
// OC slots after them are the biases.

// Thread mapping: one thread per slot (grid-stride), summing its gradient over all N*OH*OW
// output positions serially. Deterministic by construction.
__global__ void grouped_backward_weight_naive(GDims d, const float* __restrict__ d_x,
                                              const float* __restrict__ d_dy,
                                              float* __restrict__ d_dw, float* __restrict__ d_db) {
  ptx::griddep_enter();
  const int taps = d.kh * d.kw;
  const int64_t weights = static_cast<int64_t>(d.oc) * d.cg * taps;
  const int64_t slots = weights + (d_db ? d.oc : 0);
  for (int64_t slot = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; slot < slots;
       slot += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float acc = 0.f;
    if (slot < weights) {
      const int kx = static_cast<int>(slot % d.kw);
      const int ky = static_cast<int>(slot / d.kw % d.kh);
      const int ci = static_cast<int>(slot / taps % d.cg);
      const int oc = static_cast<int>(slot / taps / d.cg);
      const int c = oc / d.ocg * d.cg + ci;
      for (int64_t n = 0; n < d.n; ++n)
        for (int oy = 0; oy < d.oh; ++oy) {
          const int iy = oy * d.sh - d.ph + ky * d.dh;
          if (iy < 0 || iy >= d.h) continue;
          for (int ox = 0; ox < d.ow; ++ox) {
            const int ix = ox * d.sw - d.pw + kx * d.dw;
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

// ---------------------------------------------------------------------------------------------
// Tiled

// Thread mapping: a block owns a kTile x kTile output tile of one (n, oc); thread (ty, tx) owns
// output (oy0 + ty, ox0 + tx). Per input channel of oc's group the block stages the input tile
// plus its halo, in_h x in_w = ((kTile-1)*stride + (K-1)*dil + 1) per side, and the channel's
// KH x KW weights in shared memory, so each input value is read from global memory once per
// block instead of once per tap. Blocks walk (tile x, tile y, oc, n) with a grid-stride loop.
__global__ void __launch_bounds__(kTile* kTile)
    grouped_forward_tiled(GDims d, int in_h, int in_w, const float* __restrict__ d_x,
                          const float* __restrict__ d_w, const float* __restrict__ d_b,
                          float* __restrict__ d_y, bool relu) {
  ptx::griddep_enter();
  extern __shared__ float smem[];
  float* s_in = smem;               // (in_h, in_w)
  float* s_w = smem + in_h * in_w;  // (KH, KW)
  const int taps = d.kh * d.kw;
  const int tid = threadIdx.x, ty = tid / kTile, tx = tid % kTile;
  const int tiles_x = (d.ow + kTile - 1) / kTile, tiles_y = (d.oh + kTile - 1) / kTile;
  const int64_t blocks = static_cast<int64_t>(d.n) * d.oc * tiles_y * tiles_x;
  for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
    const int tile_x = static_cast<int>(blk % tiles_x);
    int64_t r = blk / tiles_x;
    const int tile_y = static_cast<int>(r % tiles_y);
    r /= tiles_y;
    const int oc = static_cast<int>(r % d.oc);
    const int64_t n = r / d.oc;
    const int c0 = oc / d.ocg * d.cg;
    const int oy = tile_y * kTile + ty, ox = tile_x * kTile + tx;
    const bool active = oy < d.oh && ox < d.ow;
    const int iy0 = tile_y * kTile * d.sh - d.ph, ix0 = tile_x * kTile * d.sw - d.pw;
    float acc = 0.f;
    for (int ci = 0; ci < d.cg; ++ci) {
      __syncthreads();  // everyone is done with the previous tile
      const float* plane = d_x + at4(n, c0 + ci, 0, 0, d.c, d.h, d.w);
      for (int i = tid; i < in_h * in_w; i += blockDim.x) {
        const int iy = iy0 + i / in_w, ix = ix0 + i % in_w;
        s_in[i] = iy >= 0 && iy < d.h && ix >= 0 && ix < d.w ? plane[iy * d.w + ix] : 0.f;
      }
      for (int i = tid; i < taps; i += blockDim.x)
        s_w[i] = d_w[(static_cast<int64_t>(oc) * d.cg + ci) * taps + i];
      __syncthreads();
      if (!active) continue;
      for (int ky = 0; ky < d.kh; ++ky)
        for (int kx = 0; kx < d.kw; ++kx)
          acc += s_in[(ty * d.sh + ky * d.dh) * in_w + tx * d.sw + kx * d.dw] * s_w[ky * d.kw + kx];
    }
    if (active) {
      if (d_b) acc += d_b[oc];
      d_y[at4(n, oc, oy, ox, d.oc, d.oh, d.ow)] = relu ? relu_keep_nan(acc) : acc;
    }
  }
}

// Thread mapping: a block owns a kTile x kTile tile of dx of one (n, c); thread (ty, tx) owns
// dx[n, c, iy0 + ty, ix0 + tx]. Per output channel of c's group the block stages the dy rows and
// columns that reach the tile, dy_h x dy_w from (oy_lo, ox_lo) on, and that channel's weights in
// shared memory; each thread then gathers its taps from there (no atomics). Blocks walk
// (tile x, tile y, c, n) with a grid-stride loop.
__global__ void __launch_bounds__(kTile* kTile)
    grouped_backward_data_tiled(GDims d, int dy_h, int dy_w, const float* __restrict__ d_dy,
                                const float* __restrict__ d_w, float* __restrict__ d_dx) {
  ptx::griddep_enter();
  extern __shared__ float smem[];
  float* s_dy = smem;               // (dy_h, dy_w)
  float* s_w = smem + dy_h * dy_w;  // (KH, KW)
  const int taps = d.kh * d.kw;
  const int tid = threadIdx.x, ty = tid / kTile, tx = tid % kTile;
  const int tiles_x = (d.w + kTile - 1) / kTile, tiles_y = (d.h + kTile - 1) / kTile;
  const int64_t blocks = static_cast<int64_t>(d.n) * d.c * tiles_y * tiles_x;
  for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
    const int tile_x = static_cast<int>(blk % tiles_x);
    int64_t r = blk / tiles_x;
    const int tile_y = static_cast<int>(r % tiles_y);
    r /= tiles_y;
    const int c = static_cast<int>(r % d.c);
    const int64_t n = r / d.c;
    const int g = c / d.cg, ci = c % d.cg;
    const int iy0 = tile_y * kTile, ix0 = tile_x * kTile;
    const int iy = iy0 + ty, ix = ix0 + tx;
    const bool active = iy < d.h && ix < d.w;
    // The lowest output row/column any tap of the tile reaches; dy_h/dy_w cover the highest.
    const int oy_lo = floor_div(iy0 + d.ph - (d.kh - 1) * d.dh, d.sh);
    const int ox_lo = floor_div(ix0 + d.pw - (d.kw - 1) * d.dw, d.sw);
    float acc = 0.f;
    for (int j = 0; j < d.ocg; ++j) {
      const int oc = g * d.ocg + j;
      __syncthreads();
      const float* plane = d_dy + at4(n, oc, 0, 0, d.oc, d.oh, d.ow);
      for (int i = tid; i < dy_h * dy_w; i += blockDim.x) {
        const int oy = oy_lo + i / dy_w, ox = ox_lo + i % dy_w;
        s_dy[i] = oy >= 0 && oy < d.oh && ox >= 0 && ox < d.ow ? plane[oy * d.ow + ox] : 0.f;
      }
      for (int i = tid; i < taps; i += blockDim.x)
        s_w[i] = d_w[(static_cast<int64_t>(oc) * d.cg + ci) * taps + i];
      __syncthreads();
      if (!active) continue;
      for (int ky = 0; ky < d.kh; ++ky) {
        const int t_y = iy + d.ph - ky * d.dh;
        if (t_y < 0 || t_y % d.sh) continue;
        const int sy = t_y / d.sh - oy_lo;
        for (int kx = 0; kx < d.kw; ++kx) {
          const int t_x = ix + d.pw - kx * d.dw;
          if (t_x < 0 || t_x % d.sw) continue;
          acc += s_dy[sy * dy_w + t_x / d.sw - ox_lo] * s_w[ky * d.kw + kx];
        }
      }
    }
    if (active) d_dx[at4(n, c, iy, ix, d.c, d.h, d.w)] = acc;
  }
}

// Thread mapping: a block owns (chunk of kGroupedWgradChunk output positions, oc, ci) and thread
// t the chunk's positions t, t + blockDim, ... (ox fastest: coalesced dy reads). Each thread
// keeps one partial sum per tap (and the bias when ci == 0) in its own shared-memory column,
// (jobs, blockDim); then per job the block reduces the columns in a fixed order and thread 0
// publishes: atomicAdd into dw/db, or (kDeterministic) a store into scratch[chunk][slot].
template <bool kDeterministic>
__global__ void __launch_bounds__(kBlock)
    grouped_backward_weight_tiled(GDims d, int64_t chunks, const float* __restrict__ d_x,
                                  const float* __restrict__ d_dy, float* __restrict__ d_dw,
                                  float* __restrict__ d_db, float* __restrict__ d_scratch) {
  ptx::griddep_enter();
  extern __shared__ float s_acc[];  // (KH*KW + 1, blockDim.x)
  __shared__ float s_warp[kBlock / 32];
  const int taps = d.kh * d.kw;
  const int tid = threadIdx.x, nthreads = blockDim.x;
  const int64_t weights = static_cast<int64_t>(d.oc) * d.cg * taps;
  const int64_t slots = weights + d.oc;
  const int64_t positions = static_cast<int64_t>(d.n) * d.oh * d.ow;
  const int64_t blocks = chunks * d.oc * d.cg;
  for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
    const int ci = static_cast<int>(blk % d.cg);
    const int oc = static_cast<int>(blk / d.cg % d.oc);
    const int64_t chunk = blk / d.cg / d.oc;
    const int c = oc / d.ocg * d.cg + ci;
    const int64_t p_begin = chunk * kGroupedWgradChunk;
    const int64_t p_end = min(p_begin + kGroupedWgradChunk, positions);
    const bool with_bias = ci == 0 && d_db;
    const int jobs = taps + (with_bias ? 1 : 0);
    // Only this thread's column until block_sum, whose barriers ordered the previous reads.
    for (int j = 0; j < jobs; ++j) s_acc[j * nthreads + tid] = 0.f;
    for (int64_t p = p_begin + tid; p < p_end; p += nthreads) {
      const int ox = static_cast<int>(p % d.ow);
      const int oy = static_cast<int>(p / d.ow % d.oh);
      const int64_t n = p / d.ow / d.oh;
      const float g = d_dy[at4(n, oc, oy, ox, d.oc, d.oh, d.ow)];
      if (with_bias) s_acc[taps * nthreads + tid] += g;
      const float* plane = d_x + at4(n, c, 0, 0, d.c, d.h, d.w);
      const int iy0 = oy * d.sh - d.ph, ix0 = ox * d.sw - d.pw;
      for (int ky = 0; ky < d.kh; ++ky) {
        const int iy = iy0 + ky * d.dh;
        if (iy < 0 || iy >= d.h) continue;
        for (int kx = 0; kx < d.kw; ++kx) {
          const int ix = ix0 + kx * d.dw;
          if (ix < 0 || ix >= d.w) continue;
          s_acc[(ky * d.kw + kx) * nthreads + tid] += plane[iy * d.w + ix] * g;
        }
      }
    }
    for (int job = 0; job < jobs; ++job) {
      const float sum = block_sum(s_acc[job * nthreads + tid], s_warp);
      if (tid != 0) continue;
      const bool bias = job == taps;
      const int64_t slot =
          bias ? weights + oc : (static_cast<int64_t>(oc) * d.cg + ci) * taps + job;
      if (kDeterministic)
        d_scratch[chunk * slots + slot] = sum;
      else if (bias)
        atomicAdd(&d_db[oc], sum);
      else
        atomicAdd(&d_dw[slot], sum);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Fast depthwise (C/G == 1, K x K with K odd, stride 1, padding K/2, dilation 1: output size ==
// input size). Shared-memory tiles are (tile_h + K - 1) rows x (tile_w + 8) columns; column j
// holds input column x0 - 4 + j, so every row is a whole number of 16-byte float4s and, when W
// is a multiple of 4, each float4 lies entirely inside or outside the image.

struct FastDims {
  int n, c, h, w;  // one plane is H x W for input and output alike
  int m;           // channel multiplier OC / C
  int tiles_x, tiles_y, rows;
};

// Fills the (tile_h + K - 1) x (tile_w + 8) tile of `plane` whose row 0 is image row y0 - P and
// whose column 0 is image column x0 - 4; zero outside the image.
template <int K, bool kVec>
__device__ __forceinline__ void fill_tile(float4* s4, int sw4, int rows, const float* plane, int h,
                                          int w, int y0, int x0) {
  constexpr int P = K / 2;
  const int nthreads = blockDim.x * blockDim.y, tid = threadIdx.y * blockDim.x + threadIdx.x;
  for (int i = tid; i < rows * sw4; i += nthreads) {
    const int row = i / sw4, q = i % sw4;
    const int iy = y0 - P + row, ix = x0 - 4 + 4 * q;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (iy >= 0 && iy < h) {
      const float* src = plane + static_cast<int64_t>(iy) * w;
      if (kVec) {
        if (ix >= 0 && ix < w) v = __ldg(reinterpret_cast<const float4*>(src + ix));
      } else {
        if (ix >= 0 && ix < w) v.x = __ldg(src + ix);
        if (ix + 1 >= 0 && ix + 1 < w) v.y = __ldg(src + ix + 1);
        if (ix + 2 >= 0 && ix + 2 < w) v.z = __ldg(src + ix + 2);
        if (ix + 3 >= 0 && ix + 3 < w) v.w = __ldg(src + ix + 3);
      }
    }
    s4[i] = v;
  }
}

// The 12 input columns x0 - 4 + 4tx .. x0 + 4tx + 7 of smem row `row`: enough for 4 adjacent
// outputs of any K <= 9.
__device__ __forceinline__ void window12(const float4* s4, int sw4, int row, int tx, float* v) {
  const float4 a = s4[row * sw4 + tx], b = s4[row * sw4 + tx + 1], c = s4[row * sw4 + tx + 2];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
  v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  v[8] = c.x, v[9] = c.y, v[10] = c.z, v[11] = c.w;
}

// Thread mapping: block (tx, ty) of a (rows*ty) x (4*tx) tile of one (n, c) plane; thread
// (tx, ty) owns 4 adjacent outputs along W (columns x0 + 4tx .. +3) in d.rows <= kRows rows ty,
// ty + TY, ..., accumulators in registers. Forward (kBackward = false): the input tile of x[n, c]
// is staged once and serves all m output channels c*m + j, each with its bias and ReLU fused into
// the store. Input gradient (kBackward = true): dx[n, c] sums the m planes dy[n, c*m + j], each
// staged in turn and correlated with its kernel flipped (a "same" convolution's transpose). Blocks
// walk (tile x, tile y, c, n) with a grid-stride loop.
template <int K, bool kVec, bool kBackward>
__global__ void __launch_bounds__(kBlock)
    depthwise_fast(FastDims d, const float* __restrict__ d_in, const float* __restrict__ d_w,
                   const float* __restrict__ d_b, float* __restrict__ d_out, bool relu) {
  ptx::griddep_enter();
  constexpr int P = K / 2;
  constexpr int kRows = kDepthwiseFwdRows;
  extern __shared__ float4 s4[];
  const int TX = blockDim.x, TY = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  const int rows = d.rows;  // <= kRows; fewer for small problems (depthwise_tiling)
  const int tile_w = 4 * TX, tile_h = TY * rows;
  const int sw4 = TX + 2, srows = tile_h + K - 1;
  const int64_t plane_size = static_cast<int64_t>(d.h) * d.w;
  const int64_t blocks = static_cast<int64_t>(d.n) * d.c * d.tiles_y * d.tiles_x;
  for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
    const int tile_x = static_cast<int>(blk % d.tiles_x);
    int64_t r = blk / d.tiles_x;
    const int tile_y = static_cast<int>(r % d.tiles_y);
    const int64_t nc = r / d.tiles_y;  // n * C + c
    const int c = static_cast<int>(nc % d.c);
    const int64_t n = nc / d.c;
    const int x0 = tile_x * tile_w, y0 = tile_y * tile_h;
    const int ox0 = x0 + 4 * tx;
    float acc[kRows][4];
    if (kBackward) {
#pragma unroll
      for (int i = 0; i < kRows; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    }
    for (int j = 0; j < d.m; ++j) {
      const int oc = c * d.m + j;
      if (!kBackward && j > 0) {
        // The tile stays; only the weights change.
      } else {
        __syncthreads();  // the previous tile's readers are done
        const float* plane =
            kBackward ? d_in + (n * d.c * d.m + oc) * plane_size : d_in + nc * plane_size;
        fill_tile<K, kVec>(s4, sw4, srows, plane, d.h, d.w, y0, x0);
        __syncthreads();
      }
      float wr[K * K];
#pragma unroll
      for (int t = 0; t < K * K; ++t)
        wr[t] = __ldg(d_w + static_cast<int64_t>(oc) * K * K + (kBackward ? K * K - 1 - t : t));
      if (!kBackward) {
#pragma unroll
        for (int i = 0; i < kRows; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
      }
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        if (i >= rows) break;
        const int row = ty + i * TY;  // output row within the tile
#pragma unroll
        for (int ky = 0; ky < K; ++ky) {
          float v[12];
          window12(s4, sw4, row + ky, tx, v);
#pragma unroll
          for (int kx = 0; kx < K; ++kx) {
            const float wv = wr[ky * K + kx];
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[i][q] += v[4 + q - P + kx] * wv;
          }
        }
      }
      if (kBackward) continue;
      const float bias = d_b ? __ldg(d_b + oc) : 0.f;
      float* out = d_out + (n * d.c * d.m + oc) * plane_size;
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        const int oy = y0 + ty + i * TY;
        if (i >= rows || oy >= d.h) break;
        float o[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          o[q] = acc[i][q] + bias;
          if (relu) o[q] = relu_keep_nan(o[q]);
        }
        float* dst = out + static_cast<int64_t>(oy) * d.w + ox0;
        if (kVec) {
          if (ox0 < d.w) *reinterpret_cast<float4*>(dst) = make_float4(o[0], o[1], o[2], o[3]);
        } else {
#pragma unroll
          for (int q = 0; q < 4; ++q)
            if (ox0 + q < d.w) dst[q] = o[q];
        }
      }
    }
    if (!kBackward) continue;
    float* out = d_out + nc * plane_size;
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const int oy = y0 + ty + i * TY;
      if (i >= rows || oy >= d.h) break;
      float* dst = out + static_cast<int64_t>(oy) * d.w + ox0;
      if (kVec) {
        if (ox0 < d.w)
          *reinterpret_cast<float4*>(dst) = make_float4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]);
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q)
          if (ox0 + q < d.w) dst[q] = acc[i][q];
      }
    }
  }
}

// The depthwise weight-gradient kernels' last step: each thread's K*K tap sums and bias sum
// (acc) reduced over the block in a fixed order (warp shuffles, then the warps in order through
// s_red) and published for output channel oc: atomicAdd into dw/db, or (kDeterministic) into
// scratch[part][slot] for the fixed-order second stage. The jobs may outnumber the block's
// threads (7x7: 50 sums, blocks of 32 threads).
template <int K, bool kDeterministic, int kWarps>
__device__ __forceinline__ void publish_tap_sums(const float (&acc)[K * K + 1],
                                                 float (&s_red)[kWarps][K * K + 1], int lane,
                                                 int warp, int warps, int tid, int threads, int oc,
                                                 int oc_total, int64_t part, int64_t slots,
                                                 float* d_dw, float* d_db, float* d_scratch) {
  constexpr int kJobs = K * K + 1;
#pragma unroll
  for (int t = 0; t < kJobs; ++t) {
    float v = acc[t];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    if (lane == 0) s_red[warp][t] = v;
  }
  __syncthreads();
  for (int job = tid; job < kJobs; job += threads) {
    if (job == K * K && !d_db) continue;
    float sum = 0.f;
    for (int wi = 0; wi < warps; ++wi) sum += s_red[wi][job];
    const bool bias = job == K * K;
    const int64_t slot =
        bias ? static_cast<int64_t>(oc_total) * K * K + oc : static_cast<int64_t>(oc) * K * K + job;
    if (kDeterministic)
      d_scratch[part * slots + slot] = sum;
    else if (bias)
      atomicAdd(&d_db[oc], sum);
    else
      atomicAdd(&d_dw[slot], sum);
  }
}

// Thread mapping: block (tx, ty) of a (rows*ty) x (4*tx) output tile of one (n, oc) plane;
// thread (tx, ty) owns 4 adjacent output positions along W in rows ty, ty + TY, ... (d.rows of
// them) and keeps all K*K tap sums plus the bias sum in registers, reading dy straight from
// global memory (float4 where aligned) and x from the staged tile of x[n, oc / m]. The block then
// reduces each sum in a fixed order (warp shuffles, then warps in order) and publishes it by
// atomicAdd or (kDeterministic) into scratch[partial][slot], partial = (n, tile y, tile x).
// Blocks walk (tile x, tile y, n, oc) with a grid-stride loop.
template <int K, bool kVec, bool kDeterministic>
__global__ void __launch_bounds__(kBlock)
    depthwise_fast_wgrad(FastDims d, int oc_total, const float* __restrict__ d_x,
                         const float* __restrict__ d_dy, float* __restrict__ d_dw,
                         float* __restrict__ d_db, float* __restrict__ d_scratch) {
  ptx::griddep_enter();
  constexpr int P = K / 2;
  constexpr int kJobs = K * K + 1;
  extern __shared__ float4 s4[];
  __shared__ float s_red[kBlock / 32][kJobs];
  const int TX = blockDim.x, TY = blockDim.y, tx = threadIdx.x, ty = threadIdx.y;
  const int tid = ty * TX + tx, lane = tid & 31, warp = tid >> 5, warps = (TX * TY + 31) / 32;
  const int tile_w = 4 * TX, tile_h = TY * d.rows;
  const int sw4 = TX + 2, srows = tile_h + K - 1;
  const int64_t plane_size = static_cast<int64_t>(d.h) * d.w;
  const int64_t partials = static_cast<int64_t>(d.n) * d.tiles_y * d.tiles_x;
  const int64_t slots = static_cast<int64_t>(oc_total) * K * K + oc_total;
  const int64_t blocks = partials * oc_total;
  for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
    const int64_t part = blk % partials;
    const int oc = static_cast<int>(blk / partials);
    const int tile_x = static_cast<int>(part % d.tiles_x);
    const int tile_y = static_cast<int>(part / d.tiles_x % d.tiles_y);
    const int64_t n = part / d.tiles_x / d.tiles_y;
    const int c = oc / d.m;
    const int x0 = tile_x * tile_w, y0 = tile_y * tile_h;
    const int ox0 = x0 + 4 * tx;
    __syncthreads();  // the previous tile's readers are done
    fill_tile<K, kVec>(s4, sw4, srows, d_x + (n * d.c + c) * plane_size, d.h, d.w, y0, x0);
    __syncthreads();
    float acc[kJobs];
#pragma unroll
    for (int t = 0; t < kJobs; ++t) acc[t] = 0.f;
    const float* dy_plane = d_dy + (n * oc_total + oc) * plane_size;
    for (int i = 0; i < d.rows; ++i) {
      const int row = ty + i * TY, oy = y0 + row;
      if (oy >= d.h) break;
      float g[4] = {0.f, 0.f, 0.f, 0.f};
      const float* src = dy_plane + static_cast<int64_t>(oy) * d.w + ox0;
      if (kVec) {
        if (ox0 < d.w) {
          const float4 v = __ldg(reinterpret_cast<const float4*>(src));
          g[0] = v.x, g[1] = v.y, g[2] = v.z, g[3] = v.w;
        }
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q)
          if (ox0 + q < d.w) g[q] = __ldg(src + q);
      }
      acc[K * K] += (g[0] + g[1]) + (g[2] + g[3]);
#pragma unroll
      for (int ky = 0; ky < K; ++ky) {
        float v[12];
        window12(s4, sw4, row + ky, tx, v);
#pragma unroll
        for (int kx = 0; kx < K; ++kx)
#pragma unroll
          for (int q = 0; q < 4; ++q) acc[ky * K + kx] += v[4 + q - P + kx] * g[q];
      }
    }
    // Fixed-order block reduction of the kJobs sums.
    publish_tap_sums<K, kDeterministic>(acc, s_red, lane, warp, warps, tid, TX * TY, oc, oc_total,
                                        part, slots, d_dw, d_db, d_scratch);
  }
}

// ---------------------------------------------------------------------------------------------
// Depthwise "rows" kernel, for launch-bound problems (a few hundred thousand outputs): there the
// time is the launch plus one round trip to memory, and the tile kernel's staging (a shared-
// memory fill, a barrier, 64-bit index divisions) is latency on the critical path. Here every
// thread reads its K input rows straight through the read-only cache (the neighbours' loads make
// the overlapping columns L1 hits), so one load round trip, the FMAs and one store are all there
// is. Same applicability as depthwise_fast.

struct RowsDims {
  int c, h, w;  // one plane is H x W for input and output alike
  int m;        // channel multiplier OC / C
  int qw;       // quads (4 adjacent outputs) per row: ceil(W / 4)
  int strip;    // output rows per block
  int strips;   // blocks per plane: ceil(H / strip)
  int blocks;   // planes * strips (< 2^31: depthwise_rows_fits)
};

// Input columns ox0 - 4 .. ox0 + 7 of row iy of `plane` into v[0..11], zero outside the image;
// only the columns a K-wide window of 4 outputs reads (4 - K/2 .. 7 + K/2) are loaded.
template <int K, bool kVec>
__device__ __forceinline__ void load_row12(const float* __restrict__ plane, int h, int w, int iy,
                                           int ox0, float* v) {
  constexpr int P = K / 2;
#pragma unroll
  for (int j = 0; j < 12; ++j) v[j] = 0.f;
  if (iy < 0 || iy >= h) return;
  const float* src = plane + static_cast<int64_t>(iy) * w;
  if (kVec) {
    // W % 4 == 0 and a 16-byte aligned plane: each float4 is wholly inside or outside the row.
#pragma unroll
    for (int q = 0; q < 3; ++q) {
      const int ix = ox0 - 4 + 4 * q;
      if (ix >= 0 && ix < w) {
        const float4 f = __ldg(reinterpret_cast<const float4*>(src + ix));
        v[4 * q] = f.x, v[4 * q + 1] = f.y, v[4 * q + 2] = f.z, v[4 * q + 3] = f.w;
      }
    }
  } else {
#pragma unroll
    for (int j = 4 - P; j < 8 + P; ++j) {
      const int ix = ox0 - 4 + j;
      if (ix >= 0 && ix < w) v[j] = __ldg(src + ix);
    }
  }
}

// Thread mapping: block b covers output rows [strip * S, strip * S + S) of one (n, c) plane,
// (n, c, strip) = b's decomposition; its threads walk the S * ceil(W/4) quads of that strip
// (one each where S * ceil(W/4) <= blockDim, the launcher's usual choice), a quad being 4
// adjacent outputs along W whose sums stay in registers. Forward (kBackward = false): the quad
// of each of the m output planes c*m + j, from the K input rows of x[n, c], bias and ReLU fused
// into the store. Input gradient (kBackward = true): the quad of dx[n, c] summed over the m
// planes dy[n, c*m + j], each correlated with its kernel flipped. Grid-stride over the blocks.
template <int K, bool kVec, bool kBackward>
__global__ void __launch_bounds__(kDepthwiseRowsThreads)
    depthwise_rows(RowsDims d, const float* __restrict__ d_in, const float* __restrict__ d_w,
                   const float* __restrict__ d_b, float* __restrict__ d_out, bool relu) {
  ptx::griddep_enter();
  constexpr int P = K / 2;
  const int64_t plane_size = static_cast<int64_t>(d.h) * d.w;
  const int items = d.strip * d.qw;
  for (int blk = blockIdx.x; blk < d.blocks; blk += gridDim.x) {
    const int strip = blk % d.strips, plane = blk / d.strips;  // plane = n * C + c
    const int c = plane % d.c, n = plane / d.c;
    for (int item = threadIdx.x; item < items; item += blockDim.x) {
      const int oy = strip * d.strip + item / d.qw, ox0 = 4 * (item % d.qw);
      if (oy >= d.h) break;  // items only grow
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
      for (int j = 0; j < d.m; ++j) {
        const int oc = c * d.m + j;
        const float* src = kBackward
                               ? d_in + (static_cast<int64_t>(n) * d.c * d.m + oc) * plane_size
                               : d_in + static_cast<int64_t>(plane) * plane_size;
        const float* wk = d_w + static_cast<int64_t>(oc) * K * K;
        if (!kBackward) acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
#pragma unroll
        for (int ky = 0; ky < K; ++ky) {
          float v[12];
          load_row12<K, kVec>(src, d.h, d.w, oy - P + ky, ox0, v);
#pragma unroll
          for (int kx = 0; kx < K; ++kx) {
            const float wv = __ldg(wk + (kBackward ? K * K - 1 - (ky * K + kx) : ky * K + kx));
#pragma unroll
            for (int q = 0; q < 4; ++q) acc[q] += v[4 + q - P + kx] * wv;
          }
        }
        if (kBackward) continue;
        const float bias = d_b ? __ldg(d_b + oc) : 0.f;
        float o[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          o[q] = acc[q] + bias;
          if (relu) o[q] = relu_keep_nan(o[q]);
        }
        float* dst = d_out + (static_cast<int64_t>(n) * d.c * d.m + oc) * plane_size +
                     static_cast<int64_t>(oy) * d.w + ox0;
        if (kVec) {
          *reinterpret_cast<float4*>(dst) = make_float4(o[0], o[1], o[2], o[3]);
        } else {
#pragma unroll
          for (int q = 0; q < 4; ++q)
            if (ox0 + q < d.w) dst[q] = o[q];
        }
      }
      if (!kBackward) continue;
      float* dst =
          d_out + static_cast<int64_t>(plane) * plane_size + static_cast<int64_t>(oy) * d.w + ox0;
      if (kVec) {
        *reinterpret_cast<float4*>(dst) = make_float4(acc[0], acc[1], acc[2], acc[3]);
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q)
          if (ox0 + q < d.w) dst[q] = acc[q];
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Depthwise "stream" kernels, for the bandwidth-bound problems: a thread walks down a strip of
// one plane, 4 columns wide, row by row. The K input rows its current output row needs, and the
// D rows after them, sit in a register ring of R = K + D row windows (the K + 3 columns
// ox0 - K/2 .. ox0 + 3 + K/2: load_window); each step issues the load of the row D steps ahead
// before computing, so D rows per thread are in flight while it works, and each input row is
// read once per strip (the neighbours' overlapping columns and the strips' K - 1 halo rows are
// cache hits). The row loop is unrolled by R so that the ring rotates by renaming registers,
// never by moving a register whose load is still in flight.

struct StreamDims {
  int c, h, w;     // one plane is H x W for input and output alike
  int m;           // channel multiplier OC / C
  int tiles_x;     // blocks across a plane's width
  int strips;      // blocks down a plane's height
  int rows;        // rows per thread
  int64_t planes;  // planes the grid walks: N * OC (forward, weight gradient) or N * C (dgrad)
};

// Rows of the prefetch distance: two for 3x3 (a short window leaves registers to spare), one
// for 5x5 and 7x7, whose rings (and the weight gradient's 50 sums) would otherwise spill.
template <int K>
constexpr int stream_ahead() {
  return K == 3 ? 2 : 1;
}

// Input columns ox0 - P .. ox0 + 3 + P of row iy into v[4 - P .. 7 + P] (v[j] is column
// ox0 - 4 + j), zero outside the image; v's other entries are never read. The vector path (W %
// 4 == 0, 16-byte aligned plane) loads the middle quad as one float4 and each side with the
// narrowest aligned load that covers it (a float for 3x3, a float2 for 5x5, a float4 for 7x7),
// so the ring holds only the columns the window reads.
template <int K, bool kVec>
__device__ __forceinline__ void load_window(const float* __restrict__ plane, int h, int w, int iy,
                                            int ox0, float* v) {
  constexpr int P = K / 2;
#pragma unroll
  for (int j = 4 - P; j < 8 + P; ++j) v[j] = 0.f;
  if (iy < 0 || iy >= h) return;
  const float* src = plane + static_cast<int64_t>(iy) * w;
  if (!kVec) {
#pragma unroll
    for (int j = 4 - P; j < 8 + P; ++j) {
      const int ix = ox0 - 4 + j;
      if (ix >= 0 && ix < w) v[j] = __ldg(src + ix);
    }
    return;
  }
  const float4 mid = __ldg(reinterpret_cast<const float4*>(src + ox0));
  v[4] = mid.x, v[5] = mid.y, v[6] = mid.z, v[7] = mid.w;
  const bool left = ox0 > 0, right = ox0 + 4 < w;  // whole quads: inside or outside the row
  if (K == 3) {
    if (left) v[3] = __ldg(src + ox0 - 1);
    if (right) v[8] = __ldg(src + ox0 + 4);
  } else if (K == 5) {
    if (left) {
      const float2 f = __ldg(reinterpret_cast<const float2*>(src + ox0 - 2));
      v[2] = f.x, v[3] = f.y;
    }
    if (right) {
      const float2 f = __ldg(reinterpret_cast<const float2*>(src + ox0 + 4));
      v[8] = f.x, v[9] = f.y;
    }
  } else {
    if (left) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(src + ox0 - 4));
      v[1] = f.y, v[2] = f.z, v[3] = f.w;
    }
    if (right) {
      const float4 f = __ldg(reinterpret_cast<const float4*>(src + ox0 + 4));
      v[8] = f.x, v[9] = f.y, v[10] = f.z;
    }
  }
}

StreamDims stream_dims(const Conv2dGroupedShape& s, const DepthwiseStreamTiling& t,
                       int64_t planes) {
  return StreamDims{s.c, s.h, s.w, s.oc / s.c, t.tiles_x, t.strips, t.rows, planes};
}

// The output rows [y0, y_end) at columns ox0 .. ox0 + 3 of one plane: the correlation of `src`
// with the K x K weights wr, plus `bias`, ReLU'd if `relu`, stored into dst (or, kAdd, added to
// what dst holds: the input gradient's second and later output channels). Rows of src outside
// [0, hl) read as zero; hl = min(H, y_end + K/2) stops the ring loading rows no output needs.
template <int K, bool kVec, bool kAdd>
__device__ __forceinline__ void stream_rows(const float* __restrict__ src, const float* wr,
                                            float bias, bool relu, float* __restrict__ dst, int w,
                                            int y0, int y_end, int hl, int ox0) {
  constexpr int P = K / 2, D = stream_ahead<K>(), R = K + D;
  float v[R][12];
#pragma unroll
  for (int r = 0; r < R - 1; ++r) load_window<K, kVec>(src, hl, w, y0 - P + r, ox0, v[r]);
  for (int t0 = 0; y0 + t0 < y_end; t0 += R) {
#pragma unroll
    for (int u = 0; u < R; ++u) {
      const int oy = y0 + t0 + u;
      if (oy >= y_end) break;
      // The row D steps ahead goes where the row last used one step ago was.
      load_window<K, kVec>(src, hl, w, oy - P + R - 1, ox0, v[(u + R - 1) % R]);
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int ky = 0; ky < K; ++ky)
#pragma unroll
        for (int kx = 0; kx < K; ++kx) {
          const float wv = wr[ky * K + kx];
#pragma unroll
          for (int q = 0; q < 4; ++q) acc[q] += v[(u + ky) % R][4 + q - P + kx] * wv;
        }
      float* out = dst + static_cast<int64_t>(oy) * w + ox0;
      float o[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        o[q] = acc[q] + bias;
        if (relu) o[q] = relu_keep_nan(o[q]);
      }
      if (kVec) {
        if (kAdd) {
          const float4 prev = *reinterpret_cast<const float4*>(out);
          o[0] += prev.x, o[1] += prev.y, o[2] += prev.z, o[3] += prev.w;
        }
        *reinterpret_cast<float4*>(out) = make_float4(o[0], o[1], o[2], o[3]);
      } else {
#pragma unroll
        for (int q = 0; q < 4; ++q)
          if (ox0 + q < w) out[q] = kAdd ? out[q] + o[q] : o[q];
      }
    }
  }
}

// Thread mapping: block (tx, ty) of plane part (tile x, strip); thread (tx, ty) owns output
// columns ox0 = tile_x * 4TX + 4tx .. +3 of rows [y0, y0 + d.rows), y0 = (strip * TY + ty) *
// d.rows, of one plane, and streams down them (stream_rows). Forward (kBackward = false): plane
// (n, oc) of y from plane (n, oc / m) of x, bias and ReLU fused into the store. Input gradient
// (kBackward = true): plane (n, c) of dx, the sum over the m planes dy[n, c*m + j] each
// correlated with its kernel flipped, the second and later ones added to what the thread stored
// (its own elements: no atomics, bitwise repeatable). Blocks walk (tile x, strip, plane) with a
// grid-stride loop; no barriers, so idle threads simply skip.
template <int K, bool kVec, bool kBackward>
__global__ void __launch_bounds__(kDepthwiseStreamThreads)
    depthwise_stream(StreamDims d, const float* __restrict__ d_in, const float* __restrict__ d_w,
                     const float* __restrict__ d_b, float* __restrict__ d_out, bool relu) {
  ptx::griddep_enter();
  const int64_t plane_size = static_cast<int64_t>(d.h) * d.w;
  const int64_t blocks = d.planes * d.strips * d.tiles_x;
  for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
    const int tile_x = static_cast<int>(blk % d.tiles_x);
    const int strip = static_cast<int>(blk / d.tiles_x % d.strips);
    const int64_t plane = blk / d.tiles_x / d.strips;
    const int ox0 = 4 * (tile_x * blockDim.x + threadIdx.x);
    const int y0 = (strip * blockDim.y + threadIdx.y) * d.rows;
    if (ox0 >= d.w || y0 >= d.h) continue;
    const int y_end = min(d.h, y0 + d.rows), hl = min(d.h, y_end + K / 2);
    float wr[K * K];
    if (!kBackward) {
      const int64_t oc_total = static_cast<int64_t>(d.c) * d.m;
      const int64_t oc = plane % oc_total, n = plane / oc_total;
#pragma unroll
      for (int t = 0; t < K * K; ++t) wr[t] = __ldg(d_w + oc * K * K + t);
      const float bias = d_b ? __ldg(d_b + oc) : 0.f;
      stream_rows<K, kVec, false>(d_in + (n * d.c + oc / d.m) * plane_size, wr, bias, relu,
                                  d_out + plane * plane_size, d.w, y0, y_end, hl, ox0);
    } else {
      for (int j = 0; j < d.m; ++j) {
        const int64_t oc = plane * d.m + j;  // plane = n * C + c, so this is n * OC + c * m + j
        const int64_t w_oc = oc % (static_cast<int64_t>(d.c) * d.m);
#pragma unroll
        for (int t = 0; t < K * K; ++t) wr[t] = __ldg(d_w + w_oc * K * K + K * K - 1 - t);
        const float* src = d_in + oc * plane_size;
        float* dst = d_out + plane * plane_size;
        if (j == 0)
          stream_rows<K, kVec, false>(src, wr, 0.f, false, dst, d.w, y0, y_end, hl, ox0);
        else
          stream_rows<K, kVec, true>(src, wr, 0.f, false, dst, d.w, y0, y_end, hl, ox0);
      }
    }
  }
}

// Thread mapping: as depthwise_stream's forward, over planes (n, oc) of dy: thread (tx, ty)
// streams down rows [y0, y0 + d.rows) at columns ox0 .. ox0 + 3 of dy[n, oc] and the x[n, oc/m]
// rows around them (the register ring), keeping all K*K tap sums plus the bias sum in
// registers; the dy row is loaded D steps ahead like the x rows. The block then reduces each sum
// in a fixed order (warp shuffles, then the warps in order) and publishes it by one atomicAdd per
// weight or (kDeterministic) into scratch[partial][slot], partial = (n, strip, tile x). Blocks
// walk (partial, oc) with a grid-stride loop.
template <int K, bool kVec, bool kDeterministic>
__global__ void __launch_bounds__(kDepthwiseStreamThreads)
    depthwise_stream_wgrad(StreamDims d, int n_images, const float* __restrict__ d_x,
                           const float* __restrict__ d_dy, float* __restrict__ d_dw,
                           float* __restrict__ d_db, float* __restrict__ d_scratch) {
  ptx::griddep_enter();
  constexpr int P = K / 2, D = stream_ahead<K>(), R = K + D;
  constexpr int kJobs = K * K + 1;
  __shared__ float s_red[kDepthwiseStreamThreads / 32][kJobs];
  const int TX = blockDim.x, TY = blockDim.y;
  const int tid = threadIdx.y * TX + threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warps = TX * TY / 32;  // the tiling keeps blocks whole warps
  const int oc_total = d.c * d.m;
  const int64_t plane_size = static_cast<int64_t>(d.h) * d.w;
  const int64_t partials = static_cast<int64_t>(n_images) * d.strips * d.tiles_x;
  const int64_t slots = static_cast<int64_t>(oc_total) * K * K + oc_total;
  const int64_t blocks = partials * oc_total;
  for (int64_t blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
    const int64_t part = blk % partials;
    const int oc = static_cast<int>(blk / partials);
    const int tile_x = static_cast<int>(part % d.tiles_x);
    const int strip = static_cast<int>(part / d.tiles_x % d.strips);
    const int64_t n = part / d.tiles_x / d.strips;
    const int ox0 = 4 * (tile_x * TX + threadIdx.x);
    const int y0 = (strip * TY + threadIdx.y) * d.rows;
    float acc[kJobs];
#pragma unroll
    for (int t = 0; t < kJobs; ++t) acc[t] = 0.f;
    if (ox0 < d.w && y0 < d.h) {
      const int y_end = min(d.h, y0 + d.rows), hl = min(d.h, y_end + P);
      const float* x_plane = d_x + (n * d.c + oc / d.m) * plane_size;
      const float* dy_plane = d_dy + (n * oc_total + oc) * plane_size;
      float v[R][12];
      float g[R][4];
      // dy row of step t: its quad, zero past the strip or the row's end.
      const auto load_g = [&](int oy, float* gq) {
        gq[0] = gq[1] = gq[2] = gq[3] = 0.f;
        if (oy >= y_end) return;
        const float* src = dy_plane + static_cast<int64_t>(oy) * d.w + ox0;
        if (kVec) {
          const float4 f = __ldg(reinterpret_cast<const float4*>(src));
          gq[0] = f.x, gq[1] = f.y, gq[2] = f.z, gq[3] = f.w;
        } else {
#pragma unroll
          for (int q = 0; q < 4; ++q)
            if (ox0 + q < d.w) gq[q] = __ldg(src + q);
        }
      };
#pragma unroll
      for (int r = 0; r < R - 1; ++r) load_window<K, kVec>(x_plane, hl, d.w, y0 - P + r, ox0, v[r]);
#pragma unroll
      for (int r = 0; r < D; ++r) load_g(y0 + r, g[r]);
      for (int t0 = 0; y0 + t0 < y_end; t0 += R) {
#pragma unroll
        for (int u = 0; u < R; ++u) {
          const int oy = y0 + t0 + u;
          if (oy >= y_end) break;
          load_window<K, kVec>(x_plane, hl, d.w, oy - P + R - 1, ox0, v[(u + R - 1) % R]);
          load_g(oy + D, g[(u + D) % R]);
          const float* gq = g[u % R];
          acc[K * K] += (gq[0] + gq[1]) + (gq[2] + gq[3]);
#pragma unroll
          for (int ky = 0; ky < K; ++ky)
#pragma unroll
            for (int kx = 0; kx < K; ++kx)
#pragma unroll
              for (int q = 0; q < 4; ++q)
                acc[ky * K + kx] += v[(u + ky) % R][4 + q - P + kx] * gq[q];
        }
      }
    }
    __syncthreads();  // the previous block's readers of s_red are done
    publish_tap_sums<K, kDeterministic>(acc, s_red, lane, warp, warps, tid, TX * TY, oc, oc_total,
                                        part, slots, d_dw, d_db, d_scratch);
  }
}

// ---------------------------------------------------------------------------------------------
// Launch helpers

bool fast_vec(const Conv2dGroupedShape& s, const float* a, const float* b) {
  const auto aligned = [](const float* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return s.w % 4 == 0 && aligned(a) && aligned(b);
}

FastDims fast_dims(const Conv2dGroupedShape& s, const DepthwiseTiling& t) {
  return FastDims{s.n, s.c, s.h, s.w, s.oc / s.c, t.tiles_x, t.tiles_y, t.rows};
}

std::size_t fast_smem_bytes(const DepthwiseTiling& t, int k) {
  return static_cast<std::size_t>(t.tile_h() + k - 1) * (t.tile_w() + 8) * sizeof(float);
}

template <int K, bool kBackward>
void launch_fast(const Conv2dGroupedShape& s, const float* d_in, const float* d_w, const float* d_b,
                 float* d_out, bool relu, cudaStream_t stream) {
  const int64_t planes = int64_t(s.n) * s.c;
  const DepthwiseTiling t = depthwise_tiling(s, kDepthwiseFwdRows, planes);
  const FastDims d = fast_dims(s, t);
  const std::size_t smem = fast_smem_bytes(t, K);
  const dim3 block(t.tx, t.ty);
  const unsigned grid = grid_for(planes * t.tiles_x * t.tiles_y);
  if (fast_vec(s, d_in, d_out)) {
    depthwise_fast<K, true, kBackward>
        <<<grid, block, smem, stream>>>(d, d_in, d_w, d_b, d_out, relu);
  } else {
    depthwise_fast<K, false, kBackward>
        <<<grid, block, smem, stream>>>(d, d_in, d_w, d_b, d_out, relu);
  }
  CNN_LAUNCH_CHECK(kBackward ? "depthwise_fast<dgrad>" : "depthwise_fast<fwd>");
}

// The rows kernel's strip: enough whole rows for one quad per thread of a full block, fewer
// threads where the plane has fewer quads. Nothing that the results depend on.
RowsDims rows_dims(const Conv2dGroupedShape& s, int* threads) {
  RowsDims d{};
  d.c = s.c, d.h = s.h, d.w = s.w, d.m = s.oc / s.c;
  d.qw = ceil_div(s.w, 4);
  d.strip = std::min(s.h, std::max(1, kDepthwiseRowsThreads / d.qw));
  d.strips = ceil_div(s.h, d.strip);
  d.blocks = static_cast<int>(int64_t(s.n) * s.c * d.strips);
  *threads = static_cast<int>(std::min<int64_t>(
      kDepthwiseRowsThreads, ceil_div<int64_t>(int64_t(d.strip) * d.qw, 32) * 32));
  return d;
}

template <int K, bool kBackward>
void launch_rows(const Conv2dGroupedShape& s, const float* d_in, const float* d_w, const float* d_b,
                 float* d_out, bool relu, cudaStream_t stream) {
  int threads = kDepthwiseRowsThreads;
  const RowsDims d = rows_dims(s, &threads);
  const unsigned grid = grid_for(d.blocks);
  if (fast_vec(s, d_in, d_out))
    depthwise_rows<K, true, kBackward>
        <<<grid, threads, 0, stream>>>(d, d_in, d_w, d_b, d_out, relu);
  else
    depthwise_rows<K, false, kBackward>
        <<<grid, threads, 0, stream>>>(d, d_in, d_w, d_b, d_out, relu);
  CNN_LAUNCH_CHECK(kBackward ? "depthwise_rows<dgrad>" : "depthwise_rows<fwd>");
}

template <int K, bool kBackward>
void launch_stream(const Conv2dGroupedShape& s, const float* d_in, const float* d_w,
                   const float* d_b, float* d_out, bool relu, int rows, cudaStream_t stream) {
  const DepthwiseStreamTiling t = depthwise_stream_tiling(s, rows, depthwise_stream_strips(false));
  const int64_t planes = int64_t(s.n) * (kBackward ? s.c : s.oc);
  const StreamDims d = stream_dims(s, t, planes);
  const unsigned grid = grid_for(planes * t.strips * t.tiles_x);
  const dim3 block(t.tx, t.ty);
  if (fast_vec(s, d_in, d_out))
    depthwise_stream<K, true, kBackward>
        <<<grid, block, 0, stream>>>(d, d_in, d_w, d_b, d_out, relu);
  else
    depthwise_stream<K, false, kBackward>
        <<<grid, block, 0, stream>>>(d, d_in, d_w, d_b, d_out, relu);
  CNN_LAUNCH_CHECK(kBackward ? "depthwise_stream<dgrad>" : "depthwise_stream<fwd>");
}

// The kernel an Auto request runs: CNN_DEPTHWISE_KERNEL's, else the shape's pick.
DepthwiseKernel resolve_kernel(DepthwiseKernel kernel, DepthwiseKernel by_shape) {
  if (kernel != DepthwiseKernel::Auto) return kernel;
  switch (process_env_switches().depthwise_kernel) {
    case DepthwiseKernelSwitch::Tile:
      return DepthwiseKernel::Tile;
    case DepthwiseKernelSwitch::Rows:
      return DepthwiseKernel::Rows;
    case DepthwiseKernelSwitch::Stream:
      return DepthwiseKernel::Stream;
    case DepthwiseKernelSwitch::Flat:
      return DepthwiseKernel::Flat;
    default:
      return by_shape;
  }
}

// The fast forward or input gradient with the kernel `kernel` picks (Auto: resolve_kernel).
template <bool kBackward>
void launch_depthwise(const Conv2dGroupedShape& s, const float* d_in, const float* d_w,
                      const float* d_b, float* d_out, bool relu, DepthwiseKernel kernel, int rows,
                      cudaStream_t stream) {
  kernel = resolve_kernel(kernel, conv2d_grouped_fast_kernel(s));
  if (kernel == DepthwiseKernel::Flat) {
    if (kBackward) return depthwise_flat_backward_data_cuda(s, d_in, d_w, d_out, stream);
    return depthwise_flat_forward_cuda(s, d_in, d_w, d_b, d_out, relu, stream);
  }
  if (kernel == DepthwiseKernel::Stream) {
    switch (s.kh) {
      case 3:
        return launch_stream<3, kBackward>(s, d_in, d_w, d_b, d_out, relu, rows, stream);
      case 5:
        return launch_stream<5, kBackward>(s, d_in, d_w, d_b, d_out, relu, rows, stream);
      default:
        return launch_stream<7, kBackward>(s, d_in, d_w, d_b, d_out, relu, rows, stream);
    }
  }
  if (kernel == DepthwiseKernel::Rows && depthwise_rows_fits(s)) {
    switch (s.kh) {
      case 3:
        return launch_rows<3, kBackward>(s, d_in, d_w, d_b, d_out, relu, stream);
      case 5:
        return launch_rows<5, kBackward>(s, d_in, d_w, d_b, d_out, relu, stream);
      default:
        return launch_rows<7, kBackward>(s, d_in, d_w, d_b, d_out, relu, stream);
    }
  }
  switch (s.kh) {
    case 3:
      return launch_fast<3, kBackward>(s, d_in, d_w, d_b, d_out, relu, stream);
    case 5:
      return launch_fast<5, kBackward>(s, d_in, d_w, d_b, d_out, relu, stream);
    default:
      return launch_fast<7, kBackward>(s, d_in, d_w, d_b, d_out, relu, stream);
  }
}

template <int K>
void launch_fast_wgrad(const Conv2dGroupedShape& s, const float* d_x, const float* d_dy,
                       float* d_dw, float* d_db, float* d_scratch, bool deterministic,
                       cudaStream_t stream) {
  const int64_t planes = int64_t(s.n) * s.oc;
  const DepthwiseTiling t = depthwise_tiling(s, kDepthwiseWgradRows, planes);
  const FastDims d = fast_dims(s, t);
  const std::size_t smem = fast_smem_bytes(t, K);
  const dim3 block(t.tx, t.ty);
  const int64_t partials = int64_t(s.n) * t.tiles_x * t.tiles_y;
  const unsigned grid = grid_for(partials * s.oc);
  const bool vec = fast_vec(s, d_x, d_dy);
#define CNN_DW_WGRAD(VEC, DET)      \
  depthwise_fast_wgrad<K, VEC, DET> \
      <<<grid, block, smem, stream>>>(d, s.oc, d_x, d_dy, d_dw, d_db, DET ? d_scratch : nullptr)
  if (vec && deterministic)
    CNN_DW_WGRAD(true, true);
  else if (vec)
    CNN_DW_WGRAD(true, false);
  else if (deterministic)
    CNN_DW_WGRAD(false, true);
  else
    CNN_DW_WGRAD(false, false);
#undef CNN_DW_WGRAD
  CNN_LAUNCH_CHECK("depthwise_fast_wgrad");
  if (!deterministic) return;
  const int64_t weights = int64_t(s.oc) * K * K, slots = conv2d_grouped_wgrad_slots(s);
  backward_weight_finish<<<grid_for_items(slots), kBlock, 0, stream>>>(weights, slots, partials,
                                                                       d_scratch, d_dw, d_db);
  CNN_LAUNCH_CHECK("backward_weight_finish");
}

template <int K>
void launch_stream_wgrad(const Conv2dGroupedShape& s, const float* d_x, const float* d_dy,
                         float* d_dw, float* d_db, float* d_scratch, bool deterministic, int rows,
                         cudaStream_t stream) {
  // Deterministic: scratch holds the Fill plan's partials, the most of any plan (its strips are
  // the shortest); fewer rows would need more.
  if (deterministic && rows < depthwise_stream_tiling(s, 0, DepthwiseStreamStrips::Fill).rows)
    rows = 0;
  const DepthwiseStreamTiling t = depthwise_stream_tiling(s, rows, depthwise_stream_strips(true));
  const StreamDims d = stream_dims(s, t, int64_t(s.n) * s.oc);
  const dim3 block(t.tx, t.ty);
  const int64_t partials = int64_t(s.n) * t.strips * t.tiles_x;
  const unsigned grid = grid_for(partials * s.oc);
  const bool vec = fast_vec(s, d_x, d_dy);
#define CNN_DW_STREAM_WGRAD(VEC, DET) \
  depthwise_stream_wgrad<K, VEC, DET> \
      <<<grid, block, 0, stream>>>(d, s.n, d_x, d_dy, d_dw, d_db, DET ? d_scratch : nullptr)
  if (vec && deterministic)
    CNN_DW_STREAM_WGRAD(true, true);
  else if (vec)
    CNN_DW_STREAM_WGRAD(true, false);
  else if (deterministic)
    CNN_DW_STREAM_WGRAD(false, true);
  else
    CNN_DW_STREAM_WGRAD(false, false);
#undef CNN_DW_STREAM_WGRAD
  CNN_LAUNCH_CHECK("depthwise_stream_wgrad");
  if (!deterministic) return;
  const int64_t weights = int64_t(s.oc) * K * K, slots = conv2d_grouped_wgrad_slots(s);
  backward_weight_finish<<<grid_for_items(slots), kBlock, 0, stream>>>(weights, slots, partials,
                                                                       d_scratch, d_dw, d_db);
  CNN_LAUNCH_CHECK("backward_weight_finish");
}

// fast and auto run the depthwise kernels where they apply, then the narrow-group kernels
// (conv2d_grouped_narrow.h), then tiled.
bool fast_or_auto(Algo algo) {
  return algo == Algo::Fast || algo == Algo::Auto;
}

bool use_fast(const Conv2dGroupedShape& s, Algo algo) {
  return fast_or_auto(algo) && conv2d_grouped_fast_applicable(s);
}

bool use_strided(const Conv2dGroupedShape& s, Algo algo) {
  return fast_or_auto(algo) && conv2d_grouped_strided_applicable(s);
}

bool launch_forward_tiled(const GDims& d, const float* d_x, const float* d_w, const float* d_b,
                          float* d_y, bool relu, cudaStream_t stream) {
  const int64_t in_h = int64_t(std::min(kTile, d.oh) - 1) * d.sh + int64_t(d.kh - 1) * d.dh + 1;
  const int64_t in_w = int64_t(std::min(kTile, d.ow) - 1) * d.sw + int64_t(d.kw - 1) * d.dw + 1;
  const int64_t floats = in_h * in_w + int64_t(d.kh) * d.kw;
  if (floats > (int64_t{1} << 28)) return false;
  const std::size_t smem = static_cast<std::size_t>(floats) * sizeof(float);
  if (!fits_dynamic_smem(smem, grouped_forward_tiled)) return false;
  const int64_t blocks = int64_t(d.n) * d.oc * ceil_div(d.oh, kTile) * ceil_div(d.ow, kTile);
  grouped_forward_tiled<<<grid_for(blocks), kTile * kTile, smem, stream>>>(
      d, int(in_h), int(in_w), d_x, d_w, d_b, d_y, relu);
  CNN_LAUNCH_CHECK("grouped_forward_tiled");
  return true;
}

bool launch_backward_data_tiled(const GDims& d, const float* d_dy, const float* d_w, float* d_dx,
                                cudaStream_t stream) {
  // Rows of dy one dx tile reaches: from floor((iy0 + ph - (kh-1)*dh) / sh) to
  // floor((iy0 + kTile - 1 + ph) / sh); at most this many for any iy0.
  const int64_t dy_h = (kTile - 1 + int64_t(d.kh - 1) * d.dh) / d.sh + 2;
  const int64_t dy_w = (kTile - 1 + int64_t(d.kw - 1) * d.dw) / d.sw + 2;
  const int64_t floats = dy_h * dy_w + int64_t(d.kh) * d.kw;
  if (floats > (int64_t{1} << 28)) return false;
  const std::size_t smem = static_cast<std::size_t>(floats) * sizeof(float);
  if (!fits_dynamic_smem(smem, grouped_backward_data_tiled)) return false;
  const int64_t blocks = int64_t(d.n) * d.c * ceil_div(d.h, kTile) * ceil_div(d.w, kTile);
  grouped_backward_data_tiled<<<grid_for(blocks), kTile * kTile, smem, stream>>>(
      d, int(dy_h), int(dy_w), d_dy, d_w, d_dx);
  CNN_LAUNCH_CHECK("grouped_backward_data_tiled");
  return true;
}

}  // namespace

std::size_t conv2d_grouped_backward_weight_scratch_floats_cuda(const Conv2dGroupedShape& s,
                                                               bool deterministic) {
  if (!deterministic) return 0;
  const int64_t positions = int64_t(s.n) * s.oh() * s.ow();
  int64_t partials = ceil_div(positions, kGroupedWgradChunk);
  if (conv2d_grouped_fast_applicable(s)) {
    const DepthwiseTiling t = depthwise_tiling(s, kDepthwiseWgradRows, int64_t(s.n) * s.oc);
    partials = std::max(partials, int64_t(s.n) * t.tiles_x * t.tiles_y);
    // Either plan (CNN_DEPTHWISE_STREAM_STRIPS picks): Long's strips are never shorter.
    for (DepthwiseStreamStrips plan : {DepthwiseStreamStrips::Fill, DepthwiseStreamStrips::Long}) {
      const DepthwiseStreamTiling st = depthwise_stream_tiling(s, 0, plan);
      partials = std::max(partials, int64_t(s.n) * st.strips * st.tiles_x);
    }
  }
  if (grouped_narrow_backward_weight_applicable(s))
    return static_cast<std::size_t>(
        std::max(partials * conv2d_grouped_wgrad_slots(s), grouped_narrow_wgrad_scratch_floats(s)));
  return static_cast<std::size_t>(partials * conv2d_grouped_wgrad_slots(s));
}

void conv2d_grouped_forward_cuda(const Conv2dGroupedShape& s, const float* d_x, const float* d_w,
                                 const float* d_b, float* d_y, bool relu, Algo algo,
                                 cudaStream_t stream, DepthwiseKernel kernel, int stream_rows) {
  if (use_fast(s, algo))
    return launch_depthwise<false>(s, d_x, d_w, d_b, d_y, relu, kernel, stream_rows, stream);
  if (use_strided(s, algo)) return depthwise_flat_forward_cuda(s, d_x, d_w, d_b, d_y, relu, stream);
  if (fast_or_auto(algo) && grouped_narrow_forward_applicable(s) &&
      grouped_narrow_forward_cuda(s, d_x, d_w, d_b, d_y, relu, stream))
    return;
  const GDims d = dims_of(s);
  if (algo != Algo::Naive && launch_forward_tiled(d, d_x, d_w, d_b, d_y, relu, stream)) return;
  const int64_t outputs = int64_t(d.n) * d.oc * d.oh * d.ow;
  grouped_forward_naive<<<grid_for_items(outputs), kBlock, 0, stream>>>(d, d_x, d_w, d_b, d_y,
                                                                        relu);
  CNN_LAUNCH_CHECK("grouped_forward_naive");
}

void conv2d_grouped_backward_data_cuda(const Conv2dGroupedShape& s, const float* d_dy,
                                       const float* d_w, float* d_dx, Algo algo,
                                       cudaStream_t stream, DepthwiseKernel kernel,
                                       int stream_rows) {
  if (use_fast(s, algo))
    return launch_depthwise<true>(s, d_dy, d_w, nullptr, d_dx, false, kernel, stream_rows, stream);
  if (use_strided(s, algo)) return depthwise_flat_backward_data_cuda(s, d_dy, d_w, d_dx, stream);
  if (fast_or_auto(algo) && grouped_narrow_backward_data_applicable(s) &&
      grouped_narrow_backward_data_cuda(s, d_dy, d_w, d_dx, stream))
    return;
  const GDims d = dims_of(s);
  if (algo != Algo::Naive && launch_backward_data_tiled(d, d_dy, d_w, d_dx, stream)) return;
  const int64_t inputs = int64_t(d.n) * d.c * d.h * d.w;
  grouped_backward_data_naive<<<grid_for_items(inputs), kBlock, 0, stream>>>(d, d_dy, d_w, d_dx);
  CNN_LAUNCH_CHECK("grouped_backward_data_naive");
}

void conv2d_grouped_backward_weight_cuda(const Conv2dGroupedShape& s, const float* d_x,
                                         const float* d_dy, float* d_dw, float* d_db,
                                         float* d_scratch, Algo algo, bool deterministic,
                                         cudaStream_t stream, DepthwiseKernel kernel,
                                         int stream_rows) {
  if (use_fast(s, algo) &&
      resolve_kernel(kernel, conv2d_grouped_fast_wgrad_kernel(s)) == DepthwiseKernel::Stream) {
    switch (s.kh) {
      case 3:
        return launch_stream_wgrad<3>(s, d_x, d_dy, d_dw, d_db, d_scratch, deterministic,
                                      stream_rows, stream);
      case 5:
        return launch_stream_wgrad<5>(s, d_x, d_dy, d_dw, d_db, d_scratch, deterministic,
                                      stream_rows, stream);
      default:
        return launch_stream_wgrad<7>(s, d_x, d_dy, d_dw, d_db, d_scratch, deterministic,
                                      stream_rows, stream);
    }
  }
  if (use_fast(s, algo)) {
    switch (s.kh) {
      case 3:
        return launch_fast_wgrad<3>(s, d_x, d_dy, d_dw, d_db, d_scratch, deterministic, stream);
      case 5:
        return launch_fast_wgrad<5>(s, d_x, d_dy, d_dw, d_db, d_scratch, deterministic, stream);
      default:
        return launch_fast_wgrad<7>(s, d_x, d_dy, d_dw, d_db, d_scratch, deterministic, stream);
    }
  }
  if (fast_or_auto(algo) && grouped_narrow_backward_weight_applicable(s) &&
      grouped_narrow_backward_weight_cuda(s, d_x, d_dy, d_dw, d_db, d_scratch, deterministic,
                                          stream))
    return;
  const GDims d = dims_of(s);
  const std::size_t smem = (std::size_t(d.kh) * d.kw + 1) * kBlock * sizeof(float);
  const bool tiled_fits = deterministic
                              ? fits_dynamic_smem(smem, grouped_backward_weight_tiled<true>)
                              : fits_dynamic_smem(smem, grouped_backward_weight_tiled<false>);
  if (algo == Algo::Naive || !tiled_fits) {
    const int64_t slots = conv2d_grouped_wgrad_slots(s);
    grouped_backward_weight_naive<<<grid_for_items(slots), kBlock, 0, stream>>>(d, d_x, d_dy, d_dw,
                                                                                d_db);
    CNN_LAUNCH_CHECK("grouped_backward_weight_naive");
    return;
  }
  const int64_t chunks = ceil_div(int64_t(d.n) * d.oh * d.ow, kGroupedWgradChunk);
  const int64_t blocks = chunks * d.oc * d.cg;
  if (!deterministic) {
    grouped_backward_weight_tiled<false>
        <<<grid_for(blocks), kBlock, smem, stream>>>(d, chunks, d_x, d_dy, d_dw, d_db, nullptr);
    CNN_LAUNCH_CHECK("grouped_backward_weight_tiled<atomic>");
    return;
  }
  grouped_backward_weight_tiled<true>
      <<<grid_for(blocks), kBlock, smem, stream>>>(d, chunks, d_x, d_dy, d_dw, d_db, d_scratch);
  CNN_LAUNCH_CHECK("grouped_backward_weight_tiled<deterministic>");
  const int64_t weights = int64_t(d.oc) * d.cg * d.kh * d.kw, slots = conv2d_grouped_wgrad_slots(s);
  backward_weight_finish<<<grid_for_items(slots), kBlock, 0, stream>>>(weights, slots, chunks,
                                                                       d_scratch, d_dw, d_db);
  CNN_LAUNCH_CHECK("backward_weight_finish");
}

}  // namespace cnn
