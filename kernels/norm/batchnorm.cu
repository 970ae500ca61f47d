// Batch normalization on the GPU, as streaming passes near memory bandwidth. The per-channel sums
// run in two fixed-order stages instead of atomics: stage 1 gives each (channel, split) warp a
// contiguous range of the channel's values and writes one partial sum (per-lane double
// accumulators, then a warp tree in double), stage 2 sums a channel's partials in a fixed order
// (one warp per channel). The result is bitwise repeatable in every mode, so `deterministic`
// changes nothing here.
//
// Stage 2 is a launch of its own between the sums and the elementwise pass (normalize or dx): it
// writes each channel's outputs (saved statistics, running buffers, dgamma / dbeta) and what the
// elementwise pass multiplies by, so that pass reads a few floats a channel and streams. Three
// launches a pass: stage 2 summed in every elementwise block for the channels of its planes (two
// launches) costs in proportion to the partials it reads, and with one partial a warp it made
// the ResNet's BatchNorm passes 20% slower in all (docs/performance.md).
//
// Channels of at most kBnOnePassMaxValues values take one launch a pass instead, on thread-block
// clusters that hold the channel in registers (batchnorm_one_pass.cu); CNN_BN_ONE_PASS=0 keeps
// the passes here for every shape (BatchNormLaunch::one_pass).
//
// Every pass walks values in groups of 4 consecutive values of one plane (image n, channel c:
// HW contiguous floats; the last group of a plane is short when HW % 4 != 0). A group is one
// 16-byte load where HW % 4 == 0 and the pointers are 16-byte aligned, 4 scalar loads otherwise;
// the arithmetic is the same either way, so the alignment changes the speed, never the bits.
// Each thread loads kUnroll groups before it uses any (several loads in flight).
//
// Accuracy of the sums: every term is formed and added in double (products of two floats are
// exact there); the forward sums x - K and (x - K)^2 with K the channel's first value (a shift
// near the mean: no cancellation for inputs far from 0, as the sum of x^2 would have), and
// recovers mean = K + sum(x - K) / M and var = sum((x - K)^2) / M - (sum(x - K) / M)^2.
//
// A fused ReLU (batchnorm.h) costs the forward nothing; its backward reads the post-ReLU output
// beside dy in the two passes that read dy, instead of a separate pass that reads y and dy and
// writes the masked dy. A fused residual add (batchnorm.h) is one more read in the normalizing
// pass, instead of an add pass and a ReLU pass that each read and write the whole tensor.
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <initializer_list>

#include "kernels/common/ptx.cuh"
#include "kernels/norm/batchnorm_cuda.h"
#include "kernels/norm/batchnorm_math.cuh"
#include "kernels/norm/batchnorm_one_pass_cuda.h"
#include "runtime/cuda_check.h"
#include "runtime/env_switches.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

using namespace bn;

constexpr int kThreads = 256;
constexpr int kUnroll = 4;  // groups each thread loads before it uses any
// The partial sums run as one wave of warps, each summing one split of a channel: about
// kSumsWaveBlocks blocks of 8 warps (an H200's 132 SMs x kSumsBlocksPerSm, the blocks of 256
// threads its registers hold), each warp at least 2 groups a lane (kMinSumsGroups), so that a
// small tensor takes fewer, fuller warps. A constant, not the device's count, so that
// the splits, and with them the bits of the sums, are the same on every device.
constexpr int kSumsBlocksPerSm = 3;
constexpr int64_t kSumsWaveBlocks = 132 * kSumsBlocksPerSm;
constexpr int kSumsWarpsPerBlock = kThreads / 32;
constexpr int64_t kMinSumsGroups = 32 * 2;
constexpr int kFinishThreads = 256;  // one warp per channel
constexpr unsigned kMaxGridX = INT_MAX, kMaxGridY = 65535;

// How many of group g's values (4g .. 4g + 3 of a plane) are in the plane: 4, or HW % 4 for the
// last group when HW % 4 != 0.
__device__ __forceinline__ int group_valid(int64_t hw, int64_t g) {
  const int64_t left = hw - 4 * g;
  return left < 4 ? int(left) : 4;
}

// p[at .. at + 3], lanes past `valid` set to `fill`. kVec: one 16-byte load (valid is 4, p + at is
// 16-byte aligned).
template <bool kVec>
__device__ __forceinline__ float4 load_group(const float* __restrict__ p, int64_t at, int valid,
                                             float fill) {
  if (kVec) return __ldg(reinterpret_cast<const float4*>(p + at));
  float4 v = make_float4(__ldg(p + at), fill, fill, fill);
  if (valid > 1) v.y = __ldg(p + at + 1);
  if (valid > 2) v.z = __ldg(p + at + 2);
  if (valid > 3) v.w = __ldg(p + at + 3);
  return v;
}

template <bool kVec>
__device__ __forceinline__ void store_group(float* __restrict__ p, int64_t at, int valid,
                                            float4 v) {
  if (kVec) {
    *reinterpret_cast<float4*>(p + at) = v;
    return;
  }
  p[at] = v.x;
  if (valid > 1) p[at + 1] = v.y;
  if (valid > 2) p[at + 2] = v.z;
  if (valid > 3) p[at + 3] = v.w;
}

// q = *quot * d + *rem, in 32 bits where both fit (a 64-bit division is a long subroutine).
__device__ __forceinline__ void divmod(int64_t q, int64_t d, int64_t* quot, int64_t* rem) {
  if (q <= UINT_MAX && d <= UINT_MAX) {
    *quot = uint32_t(q) / uint32_t(d);
    *rem = uint32_t(q) % uint32_t(d);
  } else {
    *quot = q / d;
    *rem = q - *quot * d;
  }
}

// ---- stage 1: per-(channel, split) partial sums -------------------------------------------------

// Thread mapping: warp w of block (c, y) owns split s = y * blockDim.x / 32 + w of channel c
// (warps past S exit): groups q in [s * chunk, (s + 1) * chunk) of the channel, where
// q = n * G + g is group g (values 4g .. 4g + 3) of plane (n, c) and G = ceil(HW / 4): the
// channel's values in memory order. Lane l takes q = begin + l, + 32, ... (kLoads of them per
// round, all loaded before any is used) and keeps (n, g) by stepping, without a division per
// group; the warp then sums its lanes in a fixed shuffle tree and lane 0 writes the pair to
// d_part[(c * S + s) * 2]: a warp, not a block, per partial, so no barrier holds a warp that has
// finished, and the grid is one wave of long-lived warps (sums_layout) instead of
// thousands of one-round blocks, each a load, a wait and a block-wide tree. Forward (d_dy null):
// sums x - K and (x - K)^2, K = x[0, c, 0]. Backward: sums dy and dy * (x - mean[c]), dy masked
// by the fused ReLU's mask where `mask` is on. Split 0 writes K to d_shift[c] (forward): the
// finish reads K there, not in x, so that a normalize pass writing y over x cannot change it.
// kBackward: the backward's sums (d_dy given), else the forward's. Groups a lane loads per round:
// 8 of x in the forward, 4 each of x and dy in the backward (the same bytes in flight).
template <bool kVec, bool kBackward>
__global__ void __launch_bounds__(kThreads, kSumsBlocksPerSm)
    bn_partial_sums(int c_count, int splits, int64_t hw, int64_t groups /* N * G */, int64_t chunk,
                    const float* __restrict__ d_x, const float* __restrict__ d_dy, ReluMask mask,
                    const float* __restrict__ d_gamma, const float* __restrict__ d_invstd,
                    const float* __restrict__ d_mean, double* __restrict__ d_part,
                    double* __restrict__ d_shift) {
  ptx::griddep_enter();
  constexpr int kLoads = kBackward ? 4 : 8;
  const int c = blockIdx.x, lane = int(threadIdx.x) & 31;
  const int s = int(blockIdx.y) * int(blockDim.x / 32) + int(threadIdx.x / 32);
  if (s >= splits) return;                 // whole warps: the shuffles below see all 32 lanes
  const int64_t per_plane = (hw + 3) / 4;  // G, groups per plane
  const int64_t begin = int64_t(s) * chunk, end = min(groups, begin + chunk);
  const float* __restrict__ x_c = d_x + int64_t(c) * hw;  // plane (0, c)
  const float* __restrict__ dy_c = kBackward ? d_dy + int64_t(c) * hw : nullptr;
  const float* __restrict__ ry_c = kBackward && mask.y ? mask.y + int64_t(c) * hw : nullptr;
  const float2 mc = kBackward ? mask_coefs(mask, c, d_gamma, d_invstd) : make_float2(0.f, 0.f);
  const int64_t plane_stride = int64_t(c_count) * hw;  // from plane (n, c) to (n + 1, c)
  const float shift = kBackward ? d_mean[c] : __ldg(x_c);
  int64_t q = begin + lane, n, g;
  divmod(q, per_plane, &n, &g);
  int64_t dn, dg;  // a step of 32 groups, in planes and groups
  divmod(32, per_plane, &dn, &dg);
  double a = 0, b = 0;
  for (; q < end; q += int64_t(kLoads) * 32) {
    float4 xv[kLoads], gv[kBackward ? kLoads : 1], rv[kBackward ? kLoads : 1];
    bool in[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      in[u] = q + int64_t(u) * 32 < end;
      if (in[u]) {
        const int64_t at = n * plane_stride + 4 * g;
        const int valid = kVec ? 4 : group_valid(hw, g);
        // Lanes past the plane's end hold K (forward) or mean and dy = 0 (backward): they add 0.
        xv[u] = load_group<kVec>(x_c, at, valid, shift);
        if (kBackward) {
          gv[u] = load_group<kVec>(dy_c, at, valid, 0.f);
          if (ry_c) rv[u] = load_group<kVec>(ry_c, at, valid, 0.f);
        }
      }
      g += dg;
      n += dn;
      if (g >= per_plane) {
        g -= per_plane;
        ++n;
      }
    }
    // Each term into double, the products formed in double (exact for two floats): a float
    // product or a float sum of a group rounds at 2^-24 relative, and the input gradient is a
    // difference of nearly equal terms where a channel has few values (M = 2: dx ~ eps / var
    // of its parts), which amplifies that rounding past 1e-3; the double arithmetic is far below
    // the memory time of these passes.
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      if (!in[u]) continue;
      const float4 d =
          make_float4(xv[u].x - shift, xv[u].y - shift, xv[u].z - shift, xv[u].w - shift);
      if (kBackward) {
        float4 e = gv[u];
        if (ry_c)
          e = make_float4(relu_masked(e.x, true, rv[u].x), relu_masked(e.y, true, rv[u].y),
                          relu_masked(e.z, true, rv[u].z), relu_masked(e.w, true, rv[u].w));
        else if (mask.beta)  // d = x - mean here (shift is the saved mean)
          e = make_float4(
              relu_masked(e.x, true, pre_relu(d.x, mc)), relu_masked(e.y, true, pre_relu(d.y, mc)),
              relu_masked(e.z, true, pre_relu(d.z, mc)), relu_masked(e.w, true, pre_relu(d.w, mc)));
        a += (double(e.x) + double(e.y)) + (double(e.z) + double(e.w));
        b += (double(e.x) * double(d.x) + double(e.y) * double(d.y)) +
             (double(e.z) * double(d.z) + double(e.w) * double(d.w));
      } else {
        a += (double(d.x) + double(d.y)) + (double(d.z) + double(d.w));
        b += (double(d.x) * double(d.x) + double(d.y) * double(d.y)) +
             (double(d.z) * double(d.z) + double(d.w) * double(d.w));
      }
    }
  }
  for (int o = 16; o > 0; o /= 2) {
    a += __shfl_down_sync(0xffffffffu, a, o);
    b += __shfl_down_sync(0xffffffffu, b, o);
  }
  if (lane == 0) {
    d_part[(int64_t(c) * splits + s) * 2] = a;
    d_part[(int64_t(c) * splits + s) * 2 + 1] = b;
    if (d_shift && s == 0) d_shift[c] = shift;
  }
}

// ---- stage 2: per-channel statistics --------------------------------------------------------

// A channel's S partial pairs summed by a warp: lane l adds splits l, l + 32, ... in order, then a
// fixed shuffle tree; lane 0 holds the sums.
__device__ __forceinline__ void sum_partials(const double* __restrict__ d_part, int c, int splits,
                                             double* sa, double* sb) {
  const int lane = threadIdx.x & 31;
  double a = 0, b = 0;
  for (int s = lane; s < splits; s += 32) {
    a += d_part[(int64_t(c) * splits + s) * 2];
    b += d_part[(int64_t(c) * splits + s) * 2 + 1];
  }
  for (int o = 16; o > 0; o /= 2) {
    a += __shfl_down_sync(0xffffffffu, a, o);
    b += __shfl_down_sync(0xffffffffu, b, o);
  }
  *sa = a;
  *sb = b;
}

// Thread mapping: warp c owns channel c (its lane 0 writes): the batch mean and
// 1/sqrt(var + eps) from the shifted sums, the running statistics moved; thread 0 of the grid
// counts the batch.
__global__ void __launch_bounds__(kFinishThreads)
    bn_finish_forward(int c_count, int splits, int64_t m, float eps, float momentum,
                      const double* __restrict__ d_shift, const double* __restrict__ d_part,
                      float* __restrict__ d_mean, float* __restrict__ d_invstd,
                      float* __restrict__ d_running_mean, float* __restrict__ d_running_var,
                      float* __restrict__ d_num_batches) {
  ptx::griddep_enter();
  const int c = int((int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32);
  if (blockIdx.x == 0 && threadIdx.x == 0 && d_num_batches) *d_num_batches += 1.0f;
  if (c >= c_count) return;  // whole warps: the shuffles below see all 32 lanes
  double sum, sq;
  sum_partials(d_part, c, splits, &sum, &sq);
  if (threadIdx.x % 32 != 0) return;
  write_forward_stats(c, forward_stats(sum, sq, m, d_shift[c], eps), m, momentum, d_mean, d_invstd,
                      d_running_mean, d_running_var);
}

// Thread mapping: warp c owns channel c (its lane 0 writes): accumulates dgamma and dbeta, and
// leaves dx's per-channel coefficients in d_coef (3 per channel).
__global__ void __launch_bounds__(kFinishThreads)
    bn_finish_backward(int c_count, int splits, int64_t m, const double* __restrict__ d_part,
                       const float* __restrict__ d_gamma, const float* __restrict__ d_invstd,
                       float* __restrict__ d_dgamma, float* __restrict__ d_dbeta,
                       double* __restrict__ d_coef) {
  ptx::griddep_enter();
  const int c = int((int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32);
  if (c >= c_count) return;  // whole warps, as above
  double sum_dy, sum_dy_xmu;
  sum_partials(d_part, c, splits, &sum_dy, &sum_dy_xmu);
  if (threadIdx.x % 32 != 0) return;
  const BackwardCoefs k = backward_coefs(sum_dy, sum_dy_xmu, m, d_gamma[c], d_invstd[c]);
  d_dgamma[c] += float(k.dgamma);
  d_dbeta[c] += float(sum_dy);
  d_coef[3 * c] = k.a;
  d_coef[3 * c + 1] = k.mdy;
  d_coef[3 * c + 2] = k.b;
}

// ---- the elementwise passes, over planes ------------------------------------------------------

// How the elementwise passes cut the (N * C) planes: 2^lanes_log2 threads per plane (a power of
// two, enough for kUnroll groups each), kThreads >> lanes_log2 planes per block along x; a plane
// longer than one block's round (kThreads * kUnroll groups) is cut into `chunks` along y.
struct PlaneGrid {
  int64_t planes = 0, hw = 0, groups = 0, chunks = 0;  // groups: per plane, ceil(HW / 4)
  int c_count = 0, lanes_log2 = 0;
};

__device__ __forceinline__ int channel_of(int64_t plane, int c_count) {
  return plane <= UINT_MAX ? int(uint32_t(plane) % uint32_t(c_count)) : int(plane % c_count);
}

// Calls body(plane, c, g0, lanes) for each (plane, chunk) the thread owns: its groups are g0,
// g0 + lanes, ... (kUnroll of them, those < groups). The channel is one 32-bit modulo per call,
// and the body loads its coefficients once for kUnroll groups.
template <class Body>
__device__ __forceinline__ void walk_planes(const PlaneGrid& p, Body body) {
  const int lanes = 1 << p.lanes_log2;
  const int lane = int(threadIdx.x) & (lanes - 1);
  const int64_t per_block = kThreads >> p.lanes_log2;
  for (int64_t plane = int64_t(blockIdx.x) * per_block + (threadIdx.x >> p.lanes_log2);
       plane < p.planes; plane += int64_t(gridDim.x) * per_block)
    for (int64_t chunk = blockIdx.y; chunk < p.chunks; chunk += gridDim.y)
      body(plane, channel_of(plane, p.c_count), chunk * lanes * kUnroll + lane, lanes);
}

// The thread's kUnroll groups g0, g0 + lanes, ... of one plane: loads all of them (and the
// residual's, when d_res is given), then writes them normalized.
template <bool kVec>
__device__ __forceinline__ void normalize_groups(const PlaneGrid& pg, int64_t plane, int64_t g0,
                                                 int lanes, const float* __restrict__ d_x,
                                                 const float* __restrict__ d_res, float mean,
                                                 float scale, float beta, bool relu,
                                                 float* __restrict__ d_y) {
  const float* __restrict__ x = d_x + plane * pg.hw;
  float* __restrict__ y = d_y + plane * pg.hw;
  const bool add = d_res != nullptr;
  float4 v[kUnroll], r[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t g = g0 + int64_t(u) * lanes;
    if (g >= pg.groups) continue;
    v[u] = load_group<kVec>(x, 4 * g, group_valid(pg.hw, g), 0.f);
    r[u] = add ? load_group<kVec>(d_res + plane * pg.hw, 4 * g, group_valid(pg.hw, g), 0.f)
               : make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t g = g0 + int64_t(u) * lanes;
    if (g >= pg.groups) continue;
    const float4 o = make_float4(normalized(v[u].x, mean, scale, beta, add, r[u].x, relu),
                                 normalized(v[u].y, mean, scale, beta, add, r[u].y, relu),
                                 normalized(v[u].z, mean, scale, beta, add, r[u].z, relu),
                                 normalized(v[u].w, mean, scale, beta, add, r[u].w, relu));
    store_group<kVec>(y, 4 * g, group_valid(pg.hw, g), o);
  }
}

// Thread mapping (bn_normalize, bn_backward_data): walk_planes; each thread owns kUnroll groups
// of 4 values of one plane per round, loads all of them, then writes them.
// kEval: the running statistics (d_spread the variance: scale gamma / sqrt(var + eps)); else the
// batch's (d_spread 1 / sqrt(var + eps) from bn_finish_forward: scale invstd * gamma).
template <bool kVec, bool kEval>
__global__ void __launch_bounds__(kThreads)
    bn_normalize(PlaneGrid pg, float eps, const float* __restrict__ d_x,
                 const float* __restrict__ d_res, const float* __restrict__ d_gamma,
                 const float* __restrict__ d_beta, const float* __restrict__ d_mean,
                 const float* __restrict__ d_spread, bool relu, float* __restrict__ d_y) {
  ptx::griddep_enter();
  walk_planes(pg, [&](int64_t plane, int c, int64_t g0, int lanes) {
    const float mean = d_mean[c], beta = d_beta[c];
    const float scale = kEval ? d_gamma[c] / sqrtf(d_spread[c] + eps) : d_spread[c] * d_gamma[c];
    normalize_groups<kVec>(pg, plane, g0, lanes, d_x, d_res, mean, scale, beta, relu, d_y);
  });
}

// dx over the thread's kUnroll groups of one plane: loads all of them, then writes them.
template <bool kVec>
__device__ __forceinline__ void backward_groups(const PlaneGrid& pg, int64_t plane, int64_t g0,
                                                int lanes, const float* __restrict__ d_x,
                                                const float* __restrict__ d_dy,
                                                const ReluMask& mask, float2 mc, float a, float mdy,
                                                float b, float mean, float* __restrict__ d_dx) {
  const float* __restrict__ d_relu_y = mask.y;
  const bool masked = mask.on();
  const int64_t base = plane * pg.hw;
  float4 xv[kUnroll], gv[kUnroll], rv[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t g = g0 + int64_t(u) * lanes;
    if (g >= pg.groups) continue;
    const int valid = group_valid(pg.hw, g);
    xv[u] = load_group<kVec>(d_x + base, 4 * g, valid, 0.f);
    gv[u] = load_group<kVec>(d_dy + base, 4 * g, valid, 0.f);
    if (d_relu_y)
      rv[u] = load_group<kVec>(d_relu_y + base, 4 * g, valid, 0.f);
    else if (mask.beta)
      rv[u] = make_float4(pre_relu(xv[u].x - mean, mc), pre_relu(xv[u].y - mean, mc),
                          pre_relu(xv[u].z - mean, mc), pre_relu(xv[u].w - mean, mc));
    else
      rv[u] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t g = g0 + int64_t(u) * lanes;
    if (g >= pg.groups) continue;
    const float4 r =
        make_float4(backward_value(a, mdy, b, mean, xv[u].x, gv[u].x, masked, rv[u].x),
                    backward_value(a, mdy, b, mean, xv[u].y, gv[u].y, masked, rv[u].y),
                    backward_value(a, mdy, b, mean, xv[u].z, gv[u].z, masked, rv[u].z),
                    backward_value(a, mdy, b, mean, xv[u].w, gv[u].w, masked, rv[u].w));
    store_group<kVec>(d_dx + base, 4 * g, group_valid(pg.hw, g), r);
  }
}

template <bool kVec>
__global__ void __launch_bounds__(kThreads)
    bn_backward_data(PlaneGrid pg, const float* __restrict__ d_x, const float* __restrict__ d_dy,
                     ReluMask mask, const float* __restrict__ d_gamma,
                     const float* __restrict__ d_invstd, const float* __restrict__ d_mean,
                     const double* __restrict__ d_coef, float* __restrict__ d_dx) {
  ptx::griddep_enter();
  walk_planes(pg, [&](int64_t plane, int c, int64_t g0, int lanes) {
    const float a = float(d_coef[3 * c]), mdy = float(d_coef[3 * c + 1]),
                b = float(d_coef[3 * c + 2]), mean = d_mean[c];
    backward_groups<kVec>(pg, plane, g0, lanes, d_x, d_dy, mask,
                          mask_coefs(mask, c, d_gamma, d_invstd), a, mdy, b, mean, d_dx);
  });
}

// ---- launch geometry ----------------------------------------------------------------------------

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// 16-byte groups: every plane starts on a multiple of 4 values and every given pointer (null ones
// aside) is 16-byte aligned.
bool vector_groups(const BatchNormShape& s, std::initializer_list<const void*> ptrs) {
  if (s.hw % 4 != 0) return false;
  for (const void* p : ptrs)
    if (p && !aligned16(p)) return false;
  return true;
}

int64_t plane_groups(const BatchNormShape& s) {
  return ceil_div<int64_t>(s.hw, 4);
}

// lim: the launch's caps on the grid (tests cap it below the device's limits, so that blocks
// loop over several rounds of planes and chunks).
PlaneGrid plane_grid(const BatchNormShape& s, const BatchNormLaunch& lim, dim3* grid) {
  PlaneGrid p;
  p.planes = int64_t(s.n) * s.c;
  p.hw = s.hw;
  p.groups = plane_groups(s);
  p.c_count = s.c;
  while ((1 << p.lanes_log2) < kThreads && (int64_t(1) << p.lanes_log2) * kUnroll < p.groups)
    ++p.lanes_log2;
  p.chunks = ceil_div<int64_t>(p.groups, (int64_t(1) << p.lanes_log2) * kUnroll);
  const int64_t per_block = kThreads >> p.lanes_log2;
  const int64_t max_x = lim.max_grid_x ? std::min<int64_t>(lim.max_grid_x, kMaxGridX) : kMaxGridX;
  const int64_t max_y = lim.max_grid_y ? std::min<int64_t>(lim.max_grid_y, kMaxGridY) : kMaxGridY;
  *grid = dim3(unsigned(std::min<int64_t>(ceil_div(p.planes, per_block), max_x)),
               unsigned(std::min<int64_t>(p.chunks, max_y)));
  return p;
}

// How the partial sums launch: S splits a channel (batchnorm_splits), warps_per_block warps a
// block, grid (C, blocks_y).
struct SumsLayout {
  int splits = 1, warps_per_block = 1, blocks_y = 1;
};

SumsLayout sums_layout(const BatchNormShape& s) {
  const int64_t groups = int64_t(s.n) * plane_groups(s);  // a channel's
  const int64_t by_device = kSumsWarpsPerBlock * std::max<int64_t>(1, kSumsWaveBlocks / s.c);
  const int64_t by_size = ceil_div<int64_t>(groups, kMinSumsGroups);
  SumsLayout l;
  l.splits = int(std::clamp<int64_t>(std::min(by_device, by_size), 1, 65535));
  l.warps_per_block = std::min(l.splits, kSumsWarpsPerBlock);
  l.blocks_y = ceil_div(l.splits, l.warps_per_block);  // the last block's spare warps exit
  return l;
}

template <bool kVec>
void launch_partial_sums_as(const BatchNormShape& s, const SumsLayout& l, int64_t groups,
                            int64_t chunk, const float* d_x, const float* d_dy,
                            const ReluMask& mask, const float* d_gamma, const float* d_invstd,
                            const float* d_mean, double* d_part, double* d_shift,
                            cudaStream_t stream) {
  const dim3 grid(unsigned(s.c), unsigned(l.blocks_y));
  const unsigned threads = unsigned(32 * l.warps_per_block);
  if (d_dy)
    bn_partial_sums<kVec, true><<<grid, threads, 0, stream>>>(s.c, l.splits, s.hw, groups, chunk,
                                                              d_x, d_dy, mask, d_gamma, d_invstd,
                                                              d_mean, d_part, d_shift);
  else
    bn_partial_sums<kVec, false><<<grid, threads, 0, stream>>>(s.c, l.splits, s.hw, groups, chunk,
                                                               d_x, d_dy, mask, d_gamma, d_invstd,
                                                               d_mean, d_part, d_shift);
}

// Stage 1 of both reductions; d_dy null: the forward's sums (and each channel's K to d_shift).
void launch_partial_sums(const BatchNormShape& s, const float* d_x, const float* d_dy,
                         const ReluMask& mask, const float* d_gamma, const float* d_invstd,
                         const float* d_mean, double* d_part, double* d_shift,
                         cudaStream_t stream) {
  const SumsLayout l = sums_layout(s);
  const int64_t groups = int64_t(s.n) * plane_groups(s),
                chunk = ceil_div<int64_t>(groups, l.splits);
  if (vector_groups(s, {d_x, d_dy, mask.y}))
    launch_partial_sums_as<true>(s, l, groups, chunk, d_x, d_dy, mask, d_gamma, d_invstd, d_mean,
                                 d_part, d_shift, stream);
  else
    launch_partial_sums_as<false>(s, l, groups, chunk, d_x, d_dy, mask, d_gamma, d_invstd, d_mean,
                                  d_part, d_shift, stream);
  CNN_LAUNCH_CHECK("bn_partial_sums");
}

unsigned finish_blocks(const BatchNormShape& s) {
  return unsigned(ceil_div<int64_t>(int64_t(s.c) * 32, kFinishThreads));
}

// The normalize pass (bn_normalize), 16-byte groups where the shape and pointers allow.
template <bool kEval>
void launch_normalize(const BatchNormShape& s, const BatchNormLaunch& lim, float eps,
                      const float* d_x, const float* d_res, const float* d_gamma,
                      const float* d_beta, const float* d_mean, const float* d_spread, bool relu,
                      float* d_y, cudaStream_t stream) {
  dim3 grid;
  const PlaneGrid pg = plane_grid(s, lim, &grid);
  if (vector_groups(s, {d_x, d_res, d_y}))
    bn_normalize<true, kEval><<<grid, kThreads, 0, stream>>>(pg, eps, d_x, d_res, d_gamma, d_beta,
                                                             d_mean, d_spread, relu, d_y);
  else
    bn_normalize<false, kEval><<<grid, kThreads, 0, stream>>>(pg, eps, d_x, d_res, d_gamma, d_beta,
                                                              d_mean, d_spread, relu, d_y);
  CNN_LAUNCH_CHECK("bn_normalize");
}

}  // namespace

int batchnorm_splits(const BatchNormShape& s) {
  return sums_layout(s).splits;
}

bool batchnorm_one_pass_wanted(const BatchNormShape& s, const BatchNormLaunch& l) {
  if (!l.one_pass) return false;
  const BatchNormOnePassPlan p = plan_batchnorm_one_pass(s);
  return p.fits && p.cluster <= l.one_pass_max_cluster;
}

BatchNormLaunch batchnorm_launch_from_env() {
  BatchNormLaunch l;
  l.one_pass = process_env_switches().bn_one_pass;
  l.one_pass_max_cluster = process_env_switches().bn_one_pass_any_cluster
                               ? kBnOnePassMaxCluster
                               : kBnOnePassPreferredCluster;
  return l;
}

void batchnorm_forward_train_cuda(const BatchNormShape& s, const float* d_x, const float* d_gamma,
                                  const float* d_beta, float* d_y, bool relu,
                                  const float* d_residual, float* d_save_mean, float* d_save_invstd,
                                  const BatchNormTrainArgs& a, double* d_scratch,
                                  cudaStream_t stream, const BatchNormLaunch& l) {
  if (batchnorm_one_pass_wanted(s, l) &&
      batchnorm_forward_one_pass_cuda(s, d_x, d_gamma, d_beta, d_y, relu, d_residual, d_save_mean,
                                      d_save_invstd, a, stream))
    return;
  // Scratch: the partials (C, S, 2), then each channel's K where the backward keeps its
  // coefficients (batchnorm_scratch_doubles).
  const int splits = batchnorm_splits(s);
  double* d_shift = d_scratch + 2 * int64_t(s.c) * splits;
  launch_partial_sums(s, d_x, nullptr, ReluMask{}, nullptr, nullptr, nullptr, d_scratch, d_shift,
                      stream);
  bn_finish_forward<<<finish_blocks(s), kFinishThreads, 0, stream>>>(
      s.c, splits, s.count(), a.eps, a.momentum, d_shift, d_scratch, d_save_mean, d_save_invstd,
      a.running_mean, a.running_var, a.num_batches);
  CNN_LAUNCH_CHECK("bn_finish_forward");
  launch_normalize<false>(s, l, 0.f, d_x, d_residual, d_gamma, d_beta, d_save_mean, d_save_invstd,
                          relu, d_y, stream);
}

void batchnorm_forward_eval_cuda(const BatchNormShape& s, const float* d_x, const float* d_gamma,
                                 const float* d_beta, const float* d_running_mean,
                                 const float* d_running_var, float eps, float* d_y, bool relu,
                                 const float* d_residual, cudaStream_t stream) {
  launch_normalize<true>(s, BatchNormLaunch{}, eps, d_x, d_residual, d_gamma, d_beta,
                         d_running_mean, d_running_var, relu, d_y, stream);
}

void batchnorm_backward_cuda(const BatchNormShape& s, const float* d_x, const float* d_dy,
                             const float* d_relu_y, const float* d_relu_beta, const float* d_gamma,
                             const float* d_save_mean, const float* d_save_invstd, float* d_dx,
                             float* d_dgamma, float* d_dbeta, double* d_scratch,
                             cudaStream_t stream, const BatchNormLaunch& l) {
  if (batchnorm_one_pass_wanted(s, l) &&
      batchnorm_backward_one_pass_cuda(s, d_x, d_dy, d_relu_y, d_relu_beta, d_gamma, d_save_mean,
                                       d_save_invstd, d_dx, d_dgamma, d_dbeta, stream))
    return;
  // With the forward's beta the mask is recomputed from x and relu_y is not read.
  ReluMask mask;
  if (d_relu_y && d_relu_beta)
    mask.beta = d_relu_beta;
  else
    mask.y = d_relu_y;
  const int splits = batchnorm_splits(s);
  double* d_coef = d_scratch + 2 * int64_t(s.c) * splits;
  launch_partial_sums(s, d_x, d_dy, mask, d_gamma, d_save_invstd, d_save_mean, d_scratch, nullptr,
                      stream);
  bn_finish_backward<<<finish_blocks(s), kFinishThreads, 0, stream>>>(
      s.c, splits, s.count(), d_scratch, d_gamma, d_save_invstd, d_dgamma, d_dbeta, d_coef);
  CNN_LAUNCH_CHECK("bn_finish_backward");
  if (!d_dx) return;
  dim3 grid;
  const PlaneGrid pg = plane_grid(s, l, &grid);
  if (vector_groups(s, {d_x, d_dy, mask.y, d_dx}))
    bn_backward_data<true><<<grid, kThreads, 0, stream>>>(pg, d_x, d_dy, mask, d_gamma,
                                                          d_save_invstd, d_save_mean, d_coef, d_dx);
  else
    bn_backward_data<false><<<grid, kThreads, 0, stream>>>(
        pg, d_x, d_dy, mask, d_gamma, d_save_invstd, d_save_mean, d_coef, d_dx);
  CNN_LAUNCH_CHECK("bn_backward_data");
}

}  // namespace cnn
