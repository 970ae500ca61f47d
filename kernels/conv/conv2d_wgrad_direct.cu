// The direct FP32 weight gradient of stride-1 3x3 convolutions; the scheme is described in
// conv2d_wgrad_direct_plan.h.
//
// Thread mapping (256 threads): group g = tid / 128 takes the runs g, g + 2, ... of every unit;
// inside a group, warp w (0..3) and lane l own output channels to + 8 i (i < 4, to = l % 8) and
// input channels tc + 16 j (j < 2, tc = 4 w + l / 8) of the block's tile, for all 9 taps. A warp
// thus reads 8 distinct dy rows and 4 distinct input rows at one offset: each 16-byte load is
// broadcast to the lanes that share it, and the channel strides (an odd number of 16-byte words)
// put the distinct rows in distinct bank groups.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/conv/conv2d_wgrad_direct.h"
#include "kernels/conv/direct_conv_common.cuh"
#include "runtime/cuda_check.h"
#include "runtime/error.h"

namespace cnn {
namespace {

constexpr int kGroupThreads = kWgradDirectThreads / 2;
constexpr int kTileRow = kWgradDirectCTile * 9 + 1;  // the epilogue tile's row stride (floats)

struct DirectArgs {
  const float* x;
  const float* dy;
  float* dw;
  float* db;       // null: no bias gradient
  float* scratch;  // deterministic: (splits, slots) partial tiles; null: atomics
  int n, c, h, w, oc, oh, ow, ph, pw;
  int rows, bands, runs, dy_row, x_row, x_rows, x_chan, dy_chan, stage_floats, tiles_c;
  int64_t units, slots;
  int splits;
};

// Stages unit u (image n, band of rows from oy0) of the tile into one stage: the input channels
// c0.. (x_rows rows of x_row floats from input row oy0 - ph and column -pw, zero outside the image
// and past C) and the output channels oc0.. (rows rows of dy_row floats, zero past OW, OH, OC).
// The x_rows + rows staged row positions are slots, each in two halves of 16 channels; warp w
// takes halves w, w + 8, ..., and for each walks its channels, lane j copying column j (and
// j + 32, ... for rows over 32 floats).
// A row then costs ~7 instructions, the offsets only stepping by a plane: staging has to stay a
// small share of the kernel's instructions, which its FFMAs issue at close to one a cycle, so
// no division or 64-bit offset arithmetic a row.
__device__ __forceinline__ void stage_unit(const DirectArgs& a, int u, int c0, int oc0, float* xs,
                                           float* ds) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  constexpr int kWarps = kWgradDirectThreads / 32;
  const int n = u / a.bands;
  const int oy0 = (u - n * a.bands) * a.rows;
  const int c_valid = a.c - c0, oc_valid = a.oc - oc0;  // channels of the tile inside the tensor
  // Each slot in two halves of 16 channels, so that the 8 warps get near-equal shares.
  constexpr int kHalf = kWgradDirectCTile / 2;
  static_assert(kWgradDirectOcTile == kWgradDirectCTile, "one channel walk serves x and dy");
  for (int part = warp; part < 2 * (a.x_rows + a.rows); part += kWarps) {
    const int slot = part >> 1, first = (part & 1) * kHalf;
    if (slot < a.x_rows) {
      const int iy = oy0 - a.ph + slot;
      const bool row_ok = unsigned(iy) < unsigned(a.h);
      const int plane = a.h * a.w;
      const float* src = a.x + (int64_t{n} * a.c + c0 + first) * plane;  // channel c0 + first
      for (int j = lane; j < a.x_row; j += 32) {
        const bool ok = row_ok && unsigned(j - a.pw) < unsigned(a.w);
        int off = iy * a.w + j - a.pw;
        float* dst = xs + first * a.x_chan + slot * a.x_row + j;
#pragma unroll 4
        for (int cl = first; cl < first + kHalf; ++cl, off += plane, dst += a.x_chan) {
          const bool v = ok && cl < c_valid;
          ptx::cp_async4(dst, v ? src + off : a.x, v);
        }
      }
    } else {
      const int r = slot - a.x_rows, oy = oy0 + r;
      const int plane = a.oh * a.ow;
      const float* src = a.dy + (int64_t{n} * a.oc + oc0 + first) * plane;
      for (int j = lane; j < a.dy_row; j += 32) {
        const bool ok = oy < a.oh && j < a.ow;
        int off = oy * a.ow + j;
        float* dst = ds + first * a.dy_chan + r * a.dy_row + j;
#pragma unroll 4
        for (int ol = first; ol < first + kHalf; ++ol, off += plane, dst += a.dy_chan) {
          const bool v = ok && ol < oc_valid;
          ptx::cp_async4(dst, v ? src + off : a.dy, v);
        }
      }
    }
  }
}

// grid (splits, tiles_oc * tiles_c), kWgradDirectThreads threads, plan.smem bytes.
template <bool kBias>
__global__ void __launch_bounds__(kWgradDirectThreads, 2) wgrad_direct_kernel(DirectArgs a) {
  ptx::griddep_enter();
  extern __shared__ __align__(16) float smem[];
  const int tid = threadIdx.x;
  const int group = tid / kGroupThreads, gt = tid % kGroupThreads;
  const int lane = gt & 31, gwarp = gt >> 5;
  const int to = lane & 7, tc = 4 * gwarp + (lane >> 3);
  const int tile_oc = blockIdx.y / a.tiles_c, tile_c = blockIdx.y % a.tiles_c;
  const int oc0 = tile_oc * kWgradDirectOcTile, c0 = tile_c * kWgradDirectCTile;
  const int split = blockIdx.x;
  const int u_begin = static_cast<int>(split * a.units / a.splits);
  const int u_end = static_cast<int>((split + 1) * a.units / a.splits);
  // Only the bias sums of the tile's first input-channel group (tc == 0) count.
  const bool bias_thread = kBias && tile_c == 0 && tc == 0;

  float acc[4][2][9];
  float bsum[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    bsum[i] = 0.f;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int t = 0; t < 9; ++t) acc[i][j][t] = 0.f;
  }

  int buf = 0;
  stage_unit(a, u_begin, c0, oc0, smem, smem + kWgradDirectCTile * a.x_chan);
  ptx::cp_async_commit();
  for (int u = u_begin; u < u_end; ++u) {
    if (u + 1 < u_end) {
      float* next = smem + (buf ^ 1) * a.stage_floats;
      stage_unit(a, u + 1, c0, oc0, next, next + kWgradDirectCTile * a.x_chan);
    }
    ptx::cp_async_commit();
    ptx::cp_async_wait<1>();
    __syncthreads();

    const float* xs = smem + buf * a.stage_floats;
    const float* ds = xs + kWgradDirectCTile * a.x_chan;
    const int oy0 = (u % a.bands) * a.rows;
    const int pairs = min(a.rows, a.oh - oy0) * a.runs;
    // Run `group` of the unit, then every second one. Run pr of the band starts at 4 pr in a
    // staged dy channel (rows of 4 runs floats) and at 4 (pr + row) in an input channel (rows of
    // 4 runs + 4); the row advances without a division.
    int row = group / a.runs, run = group - row * a.runs;
    const float* dbase = ds + to * a.dy_chan;
    const float* xbase = xs + tc * a.x_chan;
    for (int pr = group; pr < pairs; pr += 2) {
      const float* dp = dbase + 4 * pr;
      float g[4][4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 v = *reinterpret_cast<const float4*>(dp + i * 8 * a.dy_chan);
        g[i][0] = v.x, g[i][1] = v.y, g[i][2] = v.z, g[i][3] = v.w;
        if (bias_thread) bsum[i] += (v.x + v.y) + (v.z + v.w);
      }
      const float* xp = xbase + 4 * (pr + row);
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int ky = 0; ky < 3; ++ky) {
          const float* q = xp + j * 16 * a.x_chan + ky * a.x_row;
          const float4 v = *reinterpret_cast<const float4*>(q);
          const float2 e = *reinterpret_cast<const float2*>(q + 4);
          const float xv[6] = {v.x, v.y, v.z, v.w, e.x, e.y};
          // Position outermost: the 12 FMAs in a row are independent.
#pragma unroll
          for (int p = 0; p < 4; ++p)
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
              for (int kx = 0; kx < 3; ++kx)
                acc[i][j][ky * 3 + kx] = fmaf(g[i][p], xv[p + kx], acc[i][j][ky * 3 + kx]);
        }
      for (run += 2; run >= a.runs; run -= a.runs) ++row;
    }
    __syncthreads();  // every thread is done with this stage before it is refilled
    buf ^= 1;
  }
  ptx::cp_async_wait<0>();  // the last (empty) group
  __syncthreads();

  // The block's tile in shared memory, dw's layout within a row: tile[ol][cl * 9 + tap] (row
  // stride kTileRow), the biases after it. Group 1 stores, group 0 adds, then everyone publishes.
  float* tile = smem;
  float* tile_b = smem + kWgradDirectOcTile * kTileRow;
  for (int step = 1; step >= 0; --step) {
    if (group == step) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float* row = tile + (to + 8 * i) * kTileRow;
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int t = 0; t < 9; ++t) {
            float* d = row + (tc + 16 * j) * 9 + t;
            *d = step == 1 ? acc[i][j][t] : *d + acc[i][j][t];
          }
        if (bias_thread) tile_b[to + 8 * i] = step == 1 ? bsum[i] : tile_b[to + 8 * i] + bsum[i];
      }
    }
    __syncthreads();
  }

  // dw (OC, C, 3, 3): the tile's row ol covers the contiguous weights (oc0 + ol, c0 .. c0 + 31).
  const int c_valid = min(kWgradDirectCTile, a.c - c0);
  const int row_len = c_valid * 9;
  const int oc_valid = min(kWgradDirectOcTile, a.oc - oc0);
  float* part = a.scratch ? a.scratch + int64_t{split} * a.slots : nullptr;
  // A warp a row, lanes along it: no division an element.
  for (int ol = tid >> 5; ol < oc_valid; ol += kWgradDirectThreads / 32) {
    const int64_t slot0 = (int64_t{oc0 + ol} * a.c + c0) * 9;
    const float* src = tile + ol * kTileRow;
    for (int k = tid & 31; k < row_len; k += 32) {
      if (part)
        part[slot0 + k] = src[k];
      else
        atomicAdd(a.dw + slot0 + k, src[k]);
    }
  }
  if (kBias && tile_c == 0 && tid < oc_valid) {
    const float v = tile_b[tid];
    if (part)
      part[int64_t{a.oc} * a.c * 9 + oc0 + tid] = v;
    else
      atomicAdd(a.db + oc0 + tid, v);
  }
}

}  // namespace

void conv2d_backward_weight_direct_cuda(const Conv2dShape& s, const float* d_x, const float* d_dy,
                                        float* d_dw, float* d_db, float* d_scratch,
                                        bool deterministic, cudaStream_t stream) {
  const std::string why = wgrad_direct_refusal(s);
  CNN_CHECK(why.empty(), "conv2d_backward_weight (direct): {}", why);
  CNN_CHECK(!deterministic || d_scratch,
            "conv2d_backward_weight (direct): deterministic mode needs {} floats of scratch",
            wgrad_direct_scratch_floats(s, true));
  const WgradDirectPlan p = wgrad_direct_plan(s);
  // clang-format off
  const DirectArgs a{d_x, d_dy, d_dw, d_db, deterministic ? d_scratch : nullptr,
                     s.n, s.c, s.h, s.w, s.oc, s.oh(), s.ow(), s.pad_h, s.pad_w,
                     p.rows, p.bands, p.runs, p.dy_row, p.x_row, p.x_rows, p.x_chan, p.dy_chan,
                     p.stage_floats, p.tiles_c, p.units, p.slots, p.splits};
  // clang-format on
  const dim3 grid(static_cast<unsigned>(p.splits), static_cast<unsigned>(p.tiles_oc * p.tiles_c));
  const bool bias = d_db != nullptr;
  const bool fits = bias ? fits_dynamic_smem(p.smem, wgrad_direct_kernel<true>)
                         : fits_dynamic_smem(p.smem, wgrad_direct_kernel<false>);
  CNN_CHECK(fits, "conv2d_backward_weight (direct): {} bytes of shared memory do not fit", p.smem);
  if (bias)
    wgrad_direct_kernel<true><<<grid, kWgradDirectThreads, p.smem, stream>>>(a);
  else
    wgrad_direct_kernel<false><<<grid, kWgradDirectThreads, p.smem, stream>>>(a);
  CNN_LAUNCH_CHECK("wgrad_direct_kernel");
  if (!deterministic) return;
  const int64_t weights = int64_t{s.oc} * s.c * 9;
  backward_weight_finish<<<grid_for_items(p.slots), kBlock, 0, stream>>>(weights, p.slots, p.splits,
                                                                         d_scratch, d_dw, d_db);
  CNN_LAUNCH_CHECK("backward_weight_finish (direct)");
}

}  // namespace cnn
