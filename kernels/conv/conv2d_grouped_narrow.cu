// The narrow-group kernels: forward, input gradient (the forward on dy, by phases at stride 2)
// and weight gradient of grouped convolutions with few channels a group
// (conv2d_grouped_narrow.h).
// Blocks walk their work with grid-stride loops over a 1-D grid; offsets that can exceed 2^31
// are int64.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/conv/conv2d_grouped_cuda.h"
#include "kernels/conv/conv2d_grouped_narrow.h"
#include "kernels/conv/direct_conv_common.cuh"
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

constexpr int kFwdThreads = 128;
constexpr int kStageChannels = 4;  // input channels staged per barrier pair (forward)
constexpr int kSeg = 8;            // weight gradient: positions a lane walks along its row
constexpr int kWgradMaxThreads = 256;

// The forward kernel's view: in (N, C, H, W) -> out (N, OC, OH, OW), C / cg = OC / ocg groups.
// For the input gradient in is dy, out is dx and the weights are read transposed: at stride 1
// the convolution of dy with the flipped weights, padded by K - 1 - p; at stride 2 by phases
// (kPhase): dx's pixels of row parity a and column parity b are a stride-1 convolution of dy with
// the taps ky = a + p (mod 2), kx = b + p (mod 2) alone, at most ceil(K / 2) of them each way.
struct FwdView {
  int n, c, h, w;
  int oc, oh, ow;  // with phases: a phase's grid, ceil(H / 2) x ceil(W / 2) of dx
  int pad;
  int groups;
  bool transposed;
};

struct NarrowFwd {
  int n, c, h, w;
  int oc, oh, ow;
  int pad;
  int cg, ocg, groups;
  int tx, ty, tz;  // threads: 4-column quads along W, rows, images
  int tiles_x, tiles_y, oc_chunks, image_blocks;
  int in_h, in_w, pitch;  // one staged channel: in_h rows of `pitch` floats, in_w of them used
  bool transposed;
  // Rows read as float4s (W % 4 == 0, a 16-byte aligned input): a row's window starts 0-3 floats
  // into its first aligned float4 and spans at most vec_chunks of them, read by lanes
  // (lane & (2^vec_lanes_log - 1)), 32 >> vec_lanes_log rows a warp at once.
  bool vec;
  int vec_chunks, vec_lanes_log;
  // Phases (the stride-2 input gradient): the layer's kernel size and padding, dx's plane.
  int ph_k, ph_pad, ph_h, ph_w;
};

// The least l with 2^l >= v (v >= 1).
int ceil_log2(int v) {
  int l = 0;
  while ((1 << l) < v) ++l;
  return l;
}

// Threads (tx, ty, tz) = 128: tx quads wide enough for the row (at most 8, 32 columns), ty rows
// (at most the output's), the rest images.
template <int K, int S, int OCT>
NarrowFwd fwd_dims(const FwdView& v) {
  NarrowFwd d{};
  d.n = v.n, d.c = v.c, d.h = v.h, d.w = v.w, d.oc = v.oc, d.oh = v.oh, d.ow = v.ow;
  d.pad = v.pad, d.cg = v.c / v.groups, d.ocg = v.oc / v.groups, d.groups = v.groups;
  d.tx = 1;
  while (d.tx < 8 && 4 * d.tx < d.ow) d.tx *= 2;
  d.ty = 1;
  while (d.tx * d.ty < kFwdThreads && d.ty < d.oh) d.ty *= 2;
  d.tz = kFwdThreads / (d.tx * d.ty);
  d.tiles_x = ceil_div(d.ow, 4 * d.tx);
  d.tiles_y = ceil_div(d.oh, d.ty);
  d.oc_chunks = ceil_div(d.ocg, OCT);
  d.image_blocks = ceil_div(d.n, d.tz);
  d.in_h = (d.ty - 1) * S + K;
  d.in_w = (4 * d.tx - 1) * S + K;
  d.pitch = d.in_w | 1;  // odd: the rows of a warp's lanes fall in different banks
  d.transposed = v.transposed;
  d.vec_chunks = (3 + d.in_w + 3) / 4;
  d.vec_lanes_log = ceil_log2(d.vec_chunks);
  d.vec = false;  // the launcher decides (it knows the pointer)
  return d;
}

template <int OCT>
std::size_t fwd_smem_bytes(const NarrowFwd& d, int k) {
  return (std::size_t(kStageChannels) * k * k * OCT +
          std::size_t(d.tz) * kStageChannels * d.in_h * d.pitch) *
         sizeof(float);
}

// A stage's input windows (tz images x cc channels from ch0 x in_h rows x in_w columns from
// (iy0, ix0)) into s_in: a warp a row, the row's indices once, then coalesced columns, every
// copy in flight at once (cp.async, zero-filled outside the image) until the stage's wait.
// (Nested loops, not one flat row index: a runtime division per row would cost more than the
// row's copies.)
__device__ __forceinline__ void stage_rows(const NarrowFwd& d, const float* __restrict__ d_in,
                                           float* s_in, int plane, int n0, int ch0, int cc, int iy0,
                                           int ix0, int lane, int warp) {
  for (int zi = 0; zi < d.tz; ++zi)
    for (int ci = 0; ci < cc; ++ci)
      for (int row = warp; row < d.in_h; row += kFwdThreads / 32) {
        const int iy = iy0 + row, n = n0 + zi;
        const bool row_ok = n < d.n && iy >= 0 && iy < d.h;
        const float* src = row_ok ? d_in + ((int64_t(n) * d.c + ch0 + ci) * d.h + iy) * d.w : d_in;
        float* dst = s_in + (zi * kStageChannels + ci) * plane + row * d.pitch;
        for (int col = lane; col < d.in_w; col += 32) {
          const int ix = ix0 + col;
          const bool ok = row_ok && ix >= 0 && ix < d.w;
          ptx::cp_async4(dst + col, ok ? src + ix : d_in, ok);
        }
      }
}

// The same windows read a float4 at a time (d.vec): lane (sub, chunk) loads the
// chunk-th aligned float4 under row `sub` of the warp's rows and stores those of its floats that
// fall in the window, one by one (the odd pitch that keeps the multiply loop's reads free of bank
// conflicts leaves the rows unaligned). A float4 is wholly inside or outside the image (W % 4 ==
// 0). kBatch loads are in flight before their stores; the rows walk (image, channel, row) by a
// fixed step carried along without divisions. One load and its indices for 4 floats: with a
// float at a time the copies cost more instructions than the multiplies (ncu, ResNeXt's 32-group
// forward: 97M instructions issued, 19M of them the FFMAs).
__device__ __forceinline__ void stage_rows_vec(const NarrowFwd& d, const float* __restrict__ d_in,
                                               float* s_in, int plane, int n0, int ch0, int cc,
                                               int iy0, int ix0, int lane, int warp) {
  constexpr int kBatch = 4;
  const int lead = ix0 & 3;  // the window's first column, in its float4
  const int chunk = lane & ((1 << d.vec_lanes_log) - 1);
  const int rows_at_once = 32 >> d.vec_lanes_log;
  const int step = (kFwdThreads / 32) * rows_at_once;
  const int col0 = 4 * chunk - lead;  // window column of the float4's first float
  const bool lane_on = col0 < d.in_w;
  const int gx = ix0 + col0;  // its image column, a multiple of 4
  const bool col_ok = lane_on && gx >= 0 && gx < d.w;
  int row = warp * rows_at_once + (lane >> d.vec_lanes_log), ci = 0, zi = 0;
  const auto advance = [&](int by) {
    row += by;
    while (row >= d.in_h) {
      row -= d.in_h;
      if (++ci == cc) ci = 0, ++zi;
    }
  };
  advance(0);
  while (zi < d.tz) {
    float4 v[kBatch];
    float* dst[kBatch];
    bool store[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const bool live = zi < d.tz;
      const int iy = iy0 + row, n = n0 + zi;
      const bool ok = live && col_ok && n < d.n && iy >= 0 && iy < d.h;
      // int offsets: the input has under 2^31 elements (grouped_narrow_*_applicable).
      v[b] =
          ok ? *reinterpret_cast<const float4*>(d_in + ((n * d.c + ch0 + ci) * d.h + iy) * d.w + gx)
             : make_float4(0.f, 0.f, 0.f, 0.f);
      store[b] = live && lane_on;
      dst[b] = s_in + (zi * kStageChannels + ci) * plane + row * d.pitch + col0;
      if (live) advance(step);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (!store[b]) continue;
      const float f[4] = {v[b].x, v[b].y, v[b].z, v[b].w};
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (col0 + e >= 0 && col0 + e < d.in_w) dst[b][e] = f[e];
    }
  }
}

// Thread mapping: thread (qx, ry, z) of a block owns outputs ox0 + 4 qx .. + 3 of row oy0 + ry of
// image n0 + z, for the block's OCT output channels of one group. Per stage of up to 4 input
// channels the block copies their (in_h, in_w) input windows (zero outside the image) and the
// taps' weights, OCT consecutive floats a tap, into shared memory; every thread then reads the
// same float4 of weights (a broadcast) and its own 3 S + K inputs of each kernel row. With phases
// (S = 1, K = the phase's ceil(K_layer / 2) taps each way, zero weights for the taps a phase
// lacks) a block computes one phase of dx and scatters its outputs to every other pixel.
template <int K, int S, int OCT, bool kPhase>
__global__ void __launch_bounds__(kFwdThreads)
    grouped_narrow_forward(NarrowFwd d, const float* __restrict__ d_in,
                           const float* __restrict__ d_w, const float* __restrict__ d_b,
                           float* __restrict__ d_out, bool relu, bool vec_store) {
  ptx::griddep_enter();
  extern __shared__ float4 smem4[];
  float* const s_w = reinterpret_cast<float*>(smem4);      // (kStageChannels, K, K, OCT)
  float* const s_in = s_w + kStageChannels * K * K * OCT;  // (tz, kStageChannels, in_h, pitch)
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int qx = tid % d.tx, ry = tid / d.tx % d.ty, z = tid / (d.tx * d.ty);
  const int plane = d.in_h * d.pitch;
  // Fewer than 2^31 blocks (each has an output; grouped_narrow_forward_applicable).
  const int blocks =
      (kPhase ? 4 : 1) * d.image_blocks * d.groups * d.oc_chunks * d.tiles_y * d.tiles_x;
  for (int blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
    const int tile_x = blk % d.tiles_x;
    int r = blk / d.tiles_x;
    const int tile_y = r % d.tiles_y;
    r /= d.tiles_y;
    const int chunk = r % d.oc_chunks;
    r /= d.oc_chunks;
    const int g = r % d.groups;
    r /= d.groups;
    const int n0 = (kPhase ? r % d.image_blocks : r) * d.tz;
    const int oy0 = tile_y * d.ty, ox0 = tile_x * 4 * d.tx;
    // A phase (a, b): its taps ky = first_a + 2 i (i < taps_a), read at dy row oy + d_a - i,
    // staged as tap K - 1 - i of a window from row oy0 + d_a - (K - 1).
    const int phase = kPhase ? r / d.image_blocks : 0, pa = phase >> 1, pb = phase & 1;
    const int first_a = (pa + d.ph_pad) & 1, first_b = (pb + d.ph_pad) & 1;
    const int taps_a = (d.ph_k - first_a + 1) / 2, taps_b = (d.ph_k - first_b + 1) / 2;
    const int iy0 = kPhase ? oy0 + (pa + d.ph_pad - first_a) / 2 - (K - 1) : oy0 * S - d.pad;
    const int ix0 = kPhase ? ox0 + (pb + d.ph_pad - first_b) / 2 - (K - 1) : ox0 * S - d.pad;
    const int o0 = chunk * OCT;  // the block's first output channel within the group
    float acc[OCT][4];
#pragma unroll
    for (int o = 0; o < OCT; ++o)
#pragma unroll
      for (int p = 0; p < 4; ++p) acc[o][p] = 0.f;
    for (int c0 = 0; c0 < d.cg; c0 += kStageChannels) {
      const int cc = min(kStageChannels, d.cg - c0);
      __syncthreads();  // everyone is done with the previous stage
      if (d.vec) {
        stage_rows_vec(d, d_in, s_in, plane, n0, g * d.cg + c0, cc, iy0, ix0, lane, warp);
      } else {
        stage_rows(d, d_in, s_in, plane, n0, g * d.cg + c0, cc, iy0, ix0, lane, warp);
      }
      for (int i = tid; i < cc * K * K * OCT; i += kFwdThreads) {
        const int o = i % OCT, tap = i / OCT % (K * K), ci = i / (OCT * K * K);
        const int oo = o0 + o, ic = c0 + ci;
        float v = 0.f;
        if (kPhase) {
          // Tap (ty, tx) of the phase is the layer's (first_a + 2 (K-1-ty), first_b + 2 (K-1-tx)),
          // where the phase has it; the layer's weight w[g d.cg + ic][oo] (its OC/G = d.cg
          // channels in, C/G = d.ocg out), not flipped.
          const int i_y = K - 1 - tap / K, i_x = K - 1 - tap % K;
          if (oo < d.ocg && i_y < taps_a && i_x < taps_b) {
            const int ky = first_a + 2 * i_y, kx = first_b + 2 * i_x;
            v = __ldg(d_w + ((int64_t(g) * d.cg + ic) * d.ocg + oo) * (d.ph_k * d.ph_k) +
                      ky * d.ph_k + kx);
          }
        } else if (oo < d.ocg) {
          // Forward: w[g ocg + oo][ic][tap]. Input gradient: the layer's weights are
          // (C_layer, cg_layer) = (d.c, d.ocg) per group the other way round, flipped.
          const int64_t src =
              d.transposed ? ((int64_t(g) * d.cg + ic) * d.ocg + oo) * (K * K) + (K * K - 1 - tap)
                           : ((int64_t(g) * d.ocg + oo) * d.cg + ic) * (K * K) + tap;
          v = __ldg(d_w + src);
        }
        s_w[(ci * K * K + tap) * OCT + o] = v;
      }
      ptx::cp_async_commit();
      ptx::cp_async_wait<0>();
      __syncthreads();
      for (int ci = 0; ci < cc; ++ci) {
        const float* src = s_in + (z * kStageChannels + ci) * plane + ry * S * d.pitch + qx * 4 * S;
        const float4* wq = reinterpret_cast<const float4*>(s_w) + ci * K * K * (OCT / 4);
#pragma unroll
        for (int ky = 0; ky < K; ++ky) {
          float in[3 * S + K];
#pragma unroll
          for (int i = 0; i < 3 * S + K; ++i) in[i] = src[ky * d.pitch + i];
#pragma unroll
          for (int kx = 0; kx < K; ++kx)
#pragma unroll
            for (int q = 0; q < OCT / 4; ++q) {
              const float4 wv = wq[(ky * K + kx) * (OCT / 4) + q];
#pragma unroll
              for (int p = 0; p < 4; ++p) {
                const float v = in[p * S + kx];
                acc[4 * q + 0][p] = fmaf(v, wv.x, acc[4 * q + 0][p]);
                acc[4 * q + 1][p] = fmaf(v, wv.y, acc[4 * q + 1][p]);
                acc[4 * q + 2][p] = fmaf(v, wv.z, acc[4 * q + 2][p]);
                acc[4 * q + 3][p] = fmaf(v, wv.w, acc[4 * q + 3][p]);
              }
            }
        }
      }
    }
    const int n = n0 + z, oy = oy0 + ry, ox = ox0 + 4 * qx;
    if (n >= d.n || oy >= d.oh || ox >= d.ow) continue;
#pragma unroll
    for (int o = 0; o < OCT; ++o) {
      if (o0 + o >= d.ocg) break;
      const int oc = g * d.ocg + o0 + o;
      const float bias = d_b ? __ldg(d_b + oc) : 0.f;
      float v[4];
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        v[p] = acc[o][p] + bias;
        if (relu) v[p] = relu_keep_nan(v[p]);
      }
      if (kPhase) {
        // Pixel (2 oy + a, 2 (ox + p) + b) of dx, where dx has it.
        const int row = 2 * oy + pa;
        if (row >= d.ph_h) break;
        float* out = d_out + ((int64_t(n) * d.oc + oc) * d.ph_h + row) * d.ph_w;
#pragma unroll
        for (int p = 0; p < 4; ++p)
          if (2 * (ox + p) + pb < d.ph_w) out[2 * (ox + p) + pb] = v[p];
        continue;
      }
      float* out = d_out + ((int64_t(n) * d.oc + oc) * d.oh + oy) * d.ow + ox;
      if (vec_store && ox + 3 < d.ow) {
        *reinterpret_cast<float4*>(out) = make_float4(v[0], v[1], v[2], v[3]);
      } else {
#pragma unroll
        for (int p = 0; p < 4; ++p)
          if (ox + p < d.ow) out[p] = v[p];
      }
    }
  }
}

// The phases' layer kernel size, padding and dx plane (kPhase only).
struct PhaseOf {
  int k = 0, pad = 0, h = 0, w = 0;
};

// False (nothing launched) where the tile does not fit this device's shared memory.
template <int K, int S, int OCT, bool kPhase>
bool launch_forward(const FwdView& v, const PhaseOf& ph, const float* d_in, const float* d_w,
                    const float* d_b, float* d_out, bool relu, cudaStream_t stream) {
  NarrowFwd d = fwd_dims<K, S, OCT>(v);
  d.ph_k = ph.k, d.ph_pad = ph.pad, d.ph_h = ph.h, d.ph_w = ph.w;
  const std::size_t smem = fwd_smem_bytes<OCT>(d, K);
  const auto kernel = grouped_narrow_forward<K, S, OCT, kPhase>;
  if (!fits_dynamic_smem(smem, kernel)) return false;
  // Whole float4 rows where every row starts 16-byte aligned.
  const bool vec = !kPhase && d.ow % 4 == 0 && reinterpret_cast<uintptr_t>(d_out) % 16 == 0;
  d.vec = d.w % 4 == 0 && reinterpret_cast<uintptr_t>(d_in) % 16 == 0 && d.vec_chunks <= 32;
  const int64_t blocks =
      (kPhase ? 4 : 1) * int64_t(d.image_blocks) * d.groups * d.oc_chunks * d.tiles_y * d.tiles_x;
  kernel<<<grid_for(blocks), kFwdThreads, smem, stream>>>(d, d_in, d_w, d_b, d_out, relu, vec);
  CNN_LAUNCH_CHECK("grouped_narrow_forward");
  return true;
}

// OCT = 8 where the group has at least 8 output channels (twice the multiplies per staged input).
template <int K, int S, bool kPhase>
bool launch_forward_oct(const FwdView& v, const PhaseOf& ph, const float* d_in, const float* d_w,
                        const float* d_b, float* d_out, bool relu, cudaStream_t stream) {
  if (v.oc / v.groups >= 8)
    return launch_forward<K, S, 8, kPhase>(v, ph, d_in, d_w, d_b, d_out, relu, stream);
  return launch_forward<K, S, 4, kPhase>(v, ph, d_in, d_w, d_b, d_out, relu, stream);
}

// k: the kernel's taps each way (1, 3, 5, 7; with phases 1 to 4).
template <int S, bool kPhase>
bool launch_forward_k(int k, const FwdView& v, const PhaseOf& ph, const float* d_in,
                      const float* d_w, const float* d_b, float* d_out, bool relu,
                      cudaStream_t stream) {
  if constexpr (kPhase) {
    switch (k) {
      case 1:
        return launch_forward_oct<1, 1, true>(v, ph, d_in, d_w, d_b, d_out, relu, stream);
      case 2:
        return launch_forward_oct<2, 1, true>(v, ph, d_in, d_w, d_b, d_out, relu, stream);
      case 3:
        return launch_forward_oct<3, 1, true>(v, ph, d_in, d_w, d_b, d_out, relu, stream);
      default:
        return launch_forward_oct<4, 1, true>(v, ph, d_in, d_w, d_b, d_out, relu, stream);
    }
  } else {
    switch (k) {
      case 1:
        return launch_forward_oct<1, S, false>(v, ph, d_in, d_w, d_b, d_out, relu, stream);
      case 3:
        return launch_forward_oct<3, S, false>(v, ph, d_in, d_w, d_b, d_out, relu, stream);
      case 5:
        return launch_forward_oct<5, S, false>(v, ph, d_in, d_w, d_b, d_out, relu, stream);
      default:
        return launch_forward_oct<7, S, false>(v, ph, d_in, d_w, d_b, d_out, relu, stream);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Weight gradient

struct NarrowWgrad {
  int n, c, h, w, oc, oh, ow, pad, cg, ocg, groups;
  int segs_x, th, tw, tiles_x, tiles_y, ipt, rows;
  int warps, c_blocks, oc_chunks;
  int units, chunk_units, chunks;
  int in_h, in_w, x_pitch, dy_pitch;  // in_h: an image's window (rows of output)
  // 16-byte copies (grouped_narrow_backward_weight with kLead >= 0): th = 2^th_log; a row of the
  // window is x_chunks float4s, copied by 2^x_lanes_log lanes, a row of dy by 2^dy_lanes_log.
  int th_log, x_chunks, x_lanes_log, dy_lanes_log;
};

// One tile's dy (4 channels x th rows x tw columns from (oy0, ox0); row t of image n0 + t / rows)
// and input windows (nci channels x ipt images x in_h rows x in_w columns from (iy0, ix0)) into
// shared memory 16 bytes a copy
// (cp.async, zero-filled outside the planes; W and OW multiples of 4, so a float4 is wholly
// inside or outside): lane (sub, chunk) copies float4 `chunk` of row `sub` of the warp's rows.
// The windows' rows are stored from the float4 that holds column ix0, which starts kLead floats
// before it (every ix0 = ox0 S - pad with ox0 S a multiple of 4). Offsets in int: x and dy have
// under 2^31 elements (grouped_narrow_backward_weight_applicable).
template <int kLead>
__device__ __forceinline__ void stage_wgrad_vec(const NarrowWgrad& d, const float* __restrict__ d_x,
                                                const float* __restrict__ d_dy, float* b_dy,
                                                float* b_x, int dy_plane, int x_plane, int n0,
                                                int g, int o0, int ci0, int nci, int oy0, int ox0,
                                                int iy0, int ix0, int lane, int warp, int warps) {
  {
    const int chunk = lane & ((1 << d.dy_lanes_log) - 1), at_once = 32 >> d.dy_lanes_log;
    const int ox = ox0 + 4 * chunk;
    const bool lane_on = 4 * chunk < d.tw, col_ok = lane_on && ox < d.ow;
    for (int t = warp * at_once + (lane >> d.dy_lanes_log); t < 4 * d.th; t += warps * at_once) {
      const int o = t >> d.th_log, row = t & (d.th - 1);
      const int slot = d.ipt == 1 ? 0 : row / d.rows, oy = oy0 + row - slot * d.rows;
      const int n = n0 + slot;
      const bool ok = col_ok && o0 + o < d.ocg && slot < d.ipt && n < d.n && oy < d.oh;
      if (lane_on)
        ptx::cp_async16(
            b_dy + o * dy_plane + row * d.dy_pitch + 4 * chunk,
            ok ? d_dy + ((n * d.oc + g * d.ocg + o0 + o) * d.oh + oy) * d.ow + ox : d_dy,
            ok ? 16 : 0);
    }
  }
  const int chunk = lane & ((1 << d.x_lanes_log) - 1), at_once = 32 >> d.x_lanes_log;
  const int gx = ix0 - kLead + 4 * chunk;
  const bool lane_on = chunk < d.x_chunks, col_ok = lane_on && gx >= 0 && gx < d.w;
  const int step = warps * at_once;
  // (channel, image, row) carried along by the fixed step, without divisions.
  int row = warp * at_once + (lane >> d.x_lanes_log), slot = 0, c = 0;
  const auto carry = [&] {
    while (row >= d.in_h) {
      row -= d.in_h;
      if (++slot == d.ipt) slot = 0, ++c;
    }
  };
  carry();
  while (c < nci) {
    const int iy = iy0 + row, n = n0 + slot;
    const bool ok = col_ok && n < d.n && iy >= 0 && iy < d.h;
    if (lane_on)
      ptx::cp_async16(b_x + c * x_plane + (slot * d.in_h + row) * d.x_pitch + 4 * chunk,
                      ok ? d_x + ((n * d.c + g * d.cg + ci0 + c) * d.h + iy) * d.w + gx : d_x,
                      ok ? 16 : 0);
    row += step;
    carry();
  }
}

// Thread mapping: warp w of a block owns input channel ci0 + w of group g, for the block's 4
// output channels o0..o0+3; lane (r, j) = (lane / segs_x, lane % segs_x) owns positions
// 8 j .. 8 j + 7 of row r of each output tile the block walks (on planes of at most th / 2 rows
// a tile holds ipt = th / OH images, row r of it row r % OH of image r / OH, and the lanes past
// ipt OH rows read zeros of dy). Per tile the block copies the
// 4 channels' dy tile and its input channels' windows into shared memory; a lane loads its 32 dy
// values once, then per kernel row its 7 S + K inputs, and adds their products into its
// 4 x K x K sums (and the dy sums, for the bias, in the warp of channel 0).
// kLead >= 0: the tiles are copied 16 bytes at a time (stage_wgrad_vec) and read as float4s,
// the input windows' rows from kLead floats into their first float4; pitches of an odd number of
// float4s keep a quarter-warp's float4 reads in distinct banks. kLead < 0: a float at a time,
// odd pitches. (A float a copy, the copies took more instructions than the multiplies.)
template <int K, int S, bool kDeterministic, int kLead>
__global__ void __launch_bounds__(kWgradMaxThreads)
    grouped_narrow_backward_weight(NarrowWgrad d, const float* __restrict__ d_x,
                                   const float* __restrict__ d_dy, float* __restrict__ d_dw,
                                   float* __restrict__ d_db, float* __restrict__ d_scratch) {
  ptx::griddep_enter();
  // Two buffers of (4, th, dy_pitch) dy then (warps, ipt, in_h, x_pitch) inputs.
  extern __shared__ float4 wsmem4[];
  float* const smem = reinterpret_cast<float*>(wsmem4);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int r = lane / d.segs_x, j = lane % d.segs_x;
  // The lane's first window row: image slot r / rows, its row r % rows (a lane past the tile's
  // images reads slot 0 against zeros of dy).
  const int r_slot = r / d.rows < d.ipt ? r / d.rows : 0;
  const int x_row = r_slot * d.in_h + (r - r / d.rows * d.rows) * S;
  const int64_t weights = int64_t(d.oc) * d.cg * K * K, slots = weights + d.oc;
  const int x_plane = d.ipt * d.in_h * d.x_pitch, dy_plane = d.th * d.dy_pitch;
  const int buf_floats = 4 * dy_plane + d.warps * x_plane;
  const int blocks = d.chunks * d.groups * d.oc_chunks * d.c_blocks;
  for (int blk = blockIdx.x; blk < blocks; blk += gridDim.x) {
    const int cb = blk % d.c_blocks;
    int t = blk / d.c_blocks;
    const int q = t % d.oc_chunks;
    t /= d.oc_chunks;
    const int g = t % d.groups;
    const int chunk = t / d.groups;
    const int ci0 = cb * d.warps, nci = min(d.warps, d.cg - ci0);
    const int ci = ci0 + warp, o0 = 4 * q;
    const bool bias_warp = d_db && ci == 0;
    float acc[4][K][K], bacc[4];
#pragma unroll
    for (int o = 0; o < 4; ++o) {
      bacc[o] = 0.f;
#pragma unroll
      for (int ky = 0; ky < K; ++ky)
#pragma unroll
        for (int kx = 0; kx < K; ++kx) acc[o][ky][kx] = 0.f;
    }
    const int u_begin = chunk * d.chunk_units;
    const int u_end = min(u_begin + d.chunk_units, d.units);
    // Copies unit u's dy tile and input windows into buffer `buf`: a warp a row, coalesced
    // columns, cp.async (zero-filled outside the planes), committed as one group.
    // (Nested loops, not one flat row index: a runtime division per row would cost more than
    // the row's copies.)
    const auto stage = [&](int u, int buf) {
      const int tile_x = u % d.tiles_x, rest = u / d.tiles_x;
      const int tile_y = rest % d.tiles_y, n0 = rest / d.tiles_y * d.ipt;
      const int oy0 = tile_y * d.rows, ox0 = tile_x * d.tw;
      const int iy0 = oy0 * S - d.pad, ix0 = ox0 * S - d.pad;
      float* const b_dy = smem + buf * buf_floats;
      float* const b_x = b_dy + 4 * dy_plane;
      if constexpr (kLead >= 0) {
        stage_wgrad_vec<kLead>(d, d_x, d_dy, b_dy, b_x, dy_plane, x_plane, n0, g, o0, ci0, nci, oy0,
                               ox0, iy0, ix0, lane, warp, warps);
      } else {
        for (int o = 0; o < 4; ++o)
          for (int row = warp; row < d.th; row += warps) {
            const int slot = row / d.rows, oy = oy0 + row - slot * d.rows, n = n0 + slot;
            const bool row_ok = o0 + o < d.ocg && slot < d.ipt && n < d.n && oy < d.oh;
            const float* src =
                row_ok ? d_dy + ((int64_t(n) * d.oc + g * d.ocg + o0 + o) * d.oh + oy) * d.ow
                       : d_dy;
            float* dst = b_dy + o * dy_plane + row * d.dy_pitch;
            for (int col = lane; col < d.tw; col += 32) {
              const int ox = ox0 + col;
              const bool ok = row_ok && ox < d.ow;
              ptx::cp_async4(dst + col, ok ? src + ox : d_dy, ok);
            }
          }
        for (int c = 0; c < nci; ++c)
          for (int srow = warp; srow < d.ipt * d.in_h; srow += warps) {
            const int slot = srow / d.in_h, iy = iy0 + srow - slot * d.in_h, n = n0 + slot;
            const bool row_ok = n < d.n && iy >= 0 && iy < d.h;
            const float* src =
                row_ok ? d_x + ((int64_t(n) * d.c + g * d.cg + ci0 + c) * d.h + iy) * d.w : d_x;
            float* dst = b_x + c * x_plane + srow * d.x_pitch;
            for (int col = lane; col < d.in_w; col += 32) {
              const int ix = ix0 + col;
              const bool ok = row_ok && ix >= 0 && ix < d.w;
              ptx::cp_async4(dst + col, ok ? src + ix : d_x, ok);
            }
          }
      }
      ptx::cp_async_commit();
    };
    __syncthreads();  // everyone is done with both buffers (the previous block's last tiles)
    stage(u_begin, 0);
    for (int u = u_begin; u < u_end; ++u) {
      const int buf = (u - u_begin) & 1;
      // The next tile streams in while this one is summed, into the buffer the previous tile
      // was read from (every warp has passed the barrier that ended it).
      if (u + 1 < u_end)
        stage(u + 1, buf ^ 1);
      else
        ptx::cp_async_commit();  // an empty group: the wait below still means "tile u landed"
      ptx::cp_async_wait<1>();
      __syncthreads();
      if (warp < nci) {
        const float* b_dy = smem + buf * buf_floats;
        const float* b_x = b_dy + 4 * dy_plane;
        float dv[4][kSeg];
        const float* dys = b_dy + r * d.dy_pitch + j * kSeg;
        if constexpr (kLead >= 0) {
#pragma unroll
          for (int o = 0; o < 4; ++o)
#pragma unroll
            for (int q = 0; q < kSeg / 4; ++q) {
              const float4 t = *reinterpret_cast<const float4*>(dys + o * dy_plane + 4 * q);
              dv[o][4 * q] = t.x, dv[o][4 * q + 1] = t.y, dv[o][4 * q + 2] = t.z,
                        dv[o][4 * q + 3] = t.w;
            }
        } else {
#pragma unroll
          for (int o = 0; o < 4; ++o)
#pragma unroll
            for (int p = 0; p < kSeg; ++p) dv[o][p] = dys[o * dy_plane + p];
        }
        if (bias_warp) {
#pragma unroll
          for (int o = 0; o < 4; ++o)
#pragma unroll
            for (int p = 0; p < kSeg; ++p) bacc[o] += dv[o][p];
        }
        const float* xs = b_x + warp * x_plane + x_row * d.x_pitch + j * kSeg * S;
#pragma unroll
        for (int ky = 0; ky < K; ++ky) {
          float in[(kSeg - 1) * S + K];
          if constexpr (kLead >= 0) {
            // The float4s that hold the lane's window row, which starts kLead floats in.
            constexpr int kQuads = (kLead + (kSeg - 1) * S + K + 3) / 4;
            float f[4 * kQuads];
#pragma unroll
            for (int q = 0; q < kQuads; ++q) {
              const float4 t = *reinterpret_cast<const float4*>(xs + ky * d.x_pitch + 4 * q);
              f[4 * q] = t.x, f[4 * q + 1] = t.y, f[4 * q + 2] = t.z, f[4 * q + 3] = t.w;
            }
#pragma unroll
            for (int i = 0; i < (kSeg - 1) * S + K; ++i) in[i] = f[kLead + i];
          } else {
#pragma unroll
            for (int i = 0; i < (kSeg - 1) * S + K; ++i) in[i] = xs[ky * d.x_pitch + i];
          }
#pragma unroll
          for (int p = 0; p < kSeg; ++p)
#pragma unroll
            for (int kx = 0; kx < K; ++kx)
#pragma unroll
              for (int o = 0; o < 4; ++o)
                acc[o][ky][kx] = fmaf(in[p * S + kx], dv[o][p], acc[o][ky][kx]);
        }
      }
      __syncthreads();  // everyone is done with this buffer before it is staged again
    }
    if (warp >= nci) continue;
    // The lanes' sums in a fixed shuffle order (bitwise repeatable), published by lane 0.
    const int64_t row = int64_t(chunk) * slots;
#pragma unroll
    for (int o = 0; o < 4; ++o) {
      const int oc = g * d.ocg + o0 + o;
      const bool real = o0 + o < d.ocg;
#pragma unroll
      for (int ky = 0; ky < K; ++ky)
#pragma unroll
        for (int kx = 0; kx < K; ++kx) {
          float v = acc[o][ky][kx];
          for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
          if (lane != 0 || !real) continue;
          const int64_t slot = (int64_t(oc) * d.cg + ci) * (K * K) + ky * K + kx;
          if (kDeterministic)
            d_scratch[row + slot] = v;
          else
            atomicAdd(d_dw + slot, v);
        }
      if (!bias_warp) continue;
      float v = bacc[o];
      for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
      if (lane != 0 || !real) continue;
      if (kDeterministic)
        d_scratch[row + weights + oc] = v;
      else
        atomicAdd(d_db + oc, v);
    }
  }
}

template <int K, int S, int kLead>
bool launch_wgrad_kernel(const Conv2dGroupedShape& s, const NarrowWgrad& d, int64_t chunks,
                         std::size_t smem, int64_t blocks, const float* d_x, const float* d_dy,
                         float* d_dw, float* d_db, float* d_scratch, bool deterministic,
                         cudaStream_t stream) {
  const int threads = 32 * d.warps;
  if (deterministic) {
    const auto kernel = grouped_narrow_backward_weight<K, S, true, kLead>;
    if (!fits_dynamic_smem(smem, kernel)) return false;
    kernel<<<grid_for(blocks), threads, smem, stream>>>(d, d_x, d_dy, d_dw, d_db, d_scratch);
    CNN_LAUNCH_CHECK("grouped_narrow_backward_weight<deterministic>");
    const int64_t weights = int64_t(s.oc) * s.cg() * K * K, slots = conv2d_grouped_wgrad_slots(s);
    backward_weight_finish<<<grid_for_items(slots), kBlock, 0, stream>>>(weights, slots, chunks,
                                                                         d_scratch, d_dw, d_db);
    CNN_LAUNCH_CHECK("backward_weight_finish");
    return true;
  }
  const auto kernel = grouped_narrow_backward_weight<K, S, false, kLead>;
  if (!fits_dynamic_smem(smem, kernel)) return false;
  kernel<<<grid_for(blocks), threads, smem, stream>>>(d, d_x, d_dy, d_dw, d_db, nullptr);
  CNN_LAUNCH_CHECK("grouped_narrow_backward_weight<atomic>");
  return true;
}

// False (nothing launched) where the tiles do not fit this device's shared memory.
template <int K, int S>
bool launch_wgrad(const Conv2dGroupedShape& s, const float* d_x, const float* d_dy, float* d_dw,
                  float* d_db, float* d_scratch, bool deterministic, cudaStream_t stream) {
  const NarrowWgradPlan p = grouped_narrow_wgrad_plan(s);
  NarrowWgrad d{};
  d.n = s.n, d.c = s.c, d.h = s.h, d.w = s.w, d.oc = s.oc, d.oh = s.oh(), d.ow = s.ow();
  d.pad = s.pad_h, d.cg = s.cg(), d.ocg = s.ocg(), d.groups = s.groups;
  d.segs_x = p.segs_x, d.th = p.th, d.tw = p.tw, d.tiles_x = p.tiles_x, d.tiles_y = p.tiles_y;
  d.ipt = p.ipt, d.rows = p.rows;
  d.warps = p.warps, d.c_blocks = p.c_blocks, d.oc_chunks = p.oc_chunks;
  d.units = int(p.units), d.chunk_units = int(p.chunk_units), d.chunks = int(p.chunks);
  d.in_h = (p.rows - 1) * S + K;
  d.in_w = (p.tw - 1) * S + K;
  // 16-byte copies where the rows are 16-byte aligned and the window's lead (-pad mod 4) is the
  // one instantiated for K: the "same" padding (K - 1) / 2.
  constexpr int kLead = K == 1 ? 0 : 3;
  d.th_log = ceil_log2(p.th);
  d.x_chunks = (kLead + d.in_w + 3) / 4;
  d.x_lanes_log = ceil_log2(d.x_chunks);
  d.dy_lanes_log = ceil_log2(p.tw / 4);
  const bool vec = ((-d.pad) & 3) == kLead && d.w % 4 == 0 && d.ow % 4 == 0 &&
                   reinterpret_cast<uintptr_t>(d_x) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(d_dy) % 16 == 0 && d.x_chunks <= 32 &&
                   p.tw / 4 <= 32;
  if (vec) {
    // Pitches of an odd number of float4s (tw is a multiple of 8).
    d.x_pitch = 4 * (d.x_chunks | 1);
    d.dy_pitch = p.tw + 4;
  } else {
    d.x_pitch = d.in_w | 1;  // odd pitches: a warp's rows fall in different banks
    d.dy_pitch = p.tw | 1;
  }
  const std::size_t smem =
      2 * (std::size_t(4) * p.th * d.dy_pitch + std::size_t(p.warps) * p.ipt * d.in_h * d.x_pitch) *
      sizeof(float);
  const int64_t blocks = p.chunks * s.groups * p.oc_chunks * p.c_blocks;
  if (vec)
    return launch_wgrad_kernel<K, S, kLead>(s, d, p.chunks, smem, blocks, d_x, d_dy, d_dw, d_db,
                                            d_scratch, deterministic, stream);
  return launch_wgrad_kernel<K, S, -1>(s, d, p.chunks, smem, blocks, d_x, d_dy, d_dw, d_db,
                                       d_scratch, deterministic, stream);
}

}  // namespace

bool grouped_narrow_forward_cuda(const Conv2dGroupedShape& s, const float* d_x, const float* d_w,
                                 const float* d_b, float* d_y, bool relu, cudaStream_t stream) {
  const FwdView v{s.n, s.c, s.h, s.w, s.oc, s.oh(), s.ow(), s.pad_h, s.groups, false};
  if (s.stride_h == 2)
    return launch_forward_k<2, false>(s.kh, v, {}, d_x, d_w, d_b, d_y, relu, stream);
  return launch_forward_k<1, false>(s.kh, v, {}, d_x, d_w, d_b, d_y, relu, stream);
}

bool grouped_narrow_backward_data_cuda(const Conv2dGroupedShape& s, const float* d_dy,
                                       const float* d_w, float* d_dx, cudaStream_t stream) {
  // dx(iy) = sum over ky of dy((iy + p - ky) / S) w(ky) where S divides iy + p - ky, with each
  // group's weights transposed (its OC/G channels in, C/G out). Stride 1: the convolution of dy
  // with the flipped weights, padded by K - 1 - p. Stride 2: per phase of dx (iy and ix mod 2),
  // that of dy with the phase's own taps, on the phase's grid.
  if (s.stride_h == 2) {
    const FwdView v{s.n,           s.oc,          s.oh(), s.ow(),   s.c,
                    (s.h + 1) / 2, (s.w + 1) / 2, 0,      s.groups, true};
    return launch_forward_k<1, true>((s.kh + 1) / 2, v, PhaseOf{s.kh, s.pad_h, s.h, s.w}, d_dy, d_w,
                                     nullptr, d_dx, false, stream);
  }
  const FwdView v{s.n, s.oc, s.oh(), s.ow(), s.c, s.h, s.w, s.kh - 1 - s.pad_h, s.groups, true};
  return launch_forward_k<1, false>(s.kh, v, {}, d_dy, d_w, nullptr, d_dx, false, stream);
}

bool grouped_narrow_backward_weight_cuda(const Conv2dGroupedShape& s, const float* d_x,
                                         const float* d_dy, float* d_dw, float* d_db,
                                         float* d_scratch, bool deterministic,
                                         cudaStream_t stream) {
  const bool s2 = s.stride_h == 2;
  if (s.kh == 1)
    return s2 ? launch_wgrad<1, 2>(s, d_x, d_dy, d_dw, d_db, d_scratch, deterministic, stream)
              : launch_wgrad<1, 1>(s, d_x, d_dy, d_dw, d_db, d_scratch, deterministic, stream);
  return s2 ? launch_wgrad<3, 2>(s, d_x, d_dy, d_dw, d_db, d_scratch, deterministic, stream)
            : launch_wgrad<3, 1>(s, d_x, d_dy, d_dw, d_db, d_scratch, deterministic, stream);
}

}  // namespace cnn
