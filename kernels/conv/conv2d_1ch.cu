// Single-input-channel convolutions (see conv2d_1ch.h).
//   conv1ch_forward_fast<K>:  1x4 output strip x 8 output channels per thread, register window
//   conv1ch_wgrad_fast<K>:    all K*K+1 gradients of 4 output channels per thread, register
//                             accumulators, warp reduce-scatter + block sum per block
//   conv1ch_forward_direct / conv1ch_wgrad_direct: any kernel size and stride (untuned)
// The fast kernels tile the output into spatial tiles of up to 256 strips of 4 pixels (a whole
// 28x28 image is one tile of 7 x 28 strips) and keep the matching input tile in shared memory.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/conv/conv1ch_common.cuh"
#include "kernels/conv/conv2d_1ch.h"
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

using conv1ch::load_input_tile;
using conv1ch::reduce_scatter_step;
using conv1ch::relu_keep_nan;

constexpr int kFwdOcPerBlock = 8;    // forward: output channels per block (and per thread)
constexpr int kWgradOcPerBlock = 4;  // weight gradient: output channels per block (and thread)
constexpr int kMaxStrips = 256;      // strips of 4 output pixels per spatial tile
constexpr int kFwdThreads = 256;
constexpr int kWgradThreads = 128;
constexpr int kWgradItemsPerBlock = 768;  // (image, strip) items a weight-gradient block sums
constexpr int kDirectThreads = 256;

// Spatial tiling of the output (host side): tw = 4 * tws columns by th rows per tile; the input
// tile is rows x is floats (row stride is, a multiple of 4 so every strip's window is 16-byte
// aligned).
struct Tiling {
  int tws, tw, th, tiles_x, tiles_y, is, rows;
  __host__ __device__ int tiles() const { return tiles_x * tiles_y; }
  __host__ __device__ int tile_floats() const { return rows * is; }
};

Tiling tiling_of(const Conv2dShape& s) {
  Tiling t{};
  const int oh = s.oh(), ow = s.ow();
  t.tws = std::min(ceil_div(ow, 4), 64);
  t.tw = 4 * t.tws;
  t.th = std::max(1, std::min(oh, kMaxStrips / t.tws));
  t.tiles_x = ceil_div(ow, t.tw);
  t.tiles_y = ceil_div(oh, t.th);
  t.is = (t.tw + s.kw - 1 + 3) / 4 * 4;
  t.rows = t.th + s.kh - 1;
  return t;
}

bool fast_path(const Conv2dShape& s) {
  return s.stride_h == 1 && s.stride_w == 1 && s.kh == s.kw && (s.kh == 3 || s.kh == 5);
}

struct Params {
  const float* x;   // (N, 1, H, W)
  const float* w;   // (OC, 1, KH, KW)            forward
  const float* b;   // (OC) or null               forward
  float* y;         // (N, OC, OH, OW)            forward
  const float* dy;  // (N, OC, OH, OW)            weight gradient
  float* dw;        // (OC, 1, KH, KW), accumulated
  float* db;        // (OC) or null, accumulated
  float* scratch;   // deterministic partials (blocks, values per block) or null
  int n, h, w_, oc, oh, ow, ph, pw;
  Tiling t;
  int ocg;      // output-channel groups
  int nb;       // weight gradient: images per block
  int nchunks;  // weight gradient: ceil(n / nb)
  bool relu;
  bool vec;  // ow % 4 == 0 and 16-byte aligned y / dy: whole strips move as float4
};

// Fills the shared input tile of image n whose output tile starts at (oy0, ox0): rows x is
// floats, zero where the window hangs over the padding.
__device__ __forceinline__ void load_tile(const Params& p, int n, int oy0, int ox0, float* s_x) {
  load_input_tile(p.x + static_cast<int64_t>(n) * p.h * p.w_, p.h, p.w_, oy0 - p.ph, ox0 - p.pw,
                  p.t.rows, p.t.is, s_x);
}

// Forward, K x K taps, stride 1. Block: (spatial tile, 8 output channels, image), flattened in
// blockIdx.x. Thread mapping: thread tid owns the 1x4 output strip (row tid / tws, columns
// 4 (tid % tws) .. +3) of the tile for all 8 channels of the block (32 accumulators); its
// K x 8 input window is read from shared memory once per window row and reused 8 x 4 times.
template <int K>
__global__ void __launch_bounds__(kFwdThreads) conv1ch_forward_fast(const Params p) {
  ptx::griddep_enter();
  constexpr int KK = K * K, KKP = (KK + 3) / 4 * 4;
  extern __shared__ float4 smem_f4[];
  float* s_w = reinterpret_cast<float*>(smem_f4);  // (8, KKP)
  float* s_b = s_w + kFwdOcPerBlock * KKP;         // (8)
  float* s_x = s_b + kFwdOcPerBlock;               // (rows, is)

  int bid = blockIdx.x;
  const int tx = bid % p.t.tiles_x;
  bid /= p.t.tiles_x;
  const int ty = bid % p.t.tiles_y;
  bid /= p.t.tiles_y;
  const int g = bid % p.ocg, n = bid / p.ocg;
  const int oc0 = g * kFwdOcPerBlock, oy0 = ty * p.t.th, ox0 = tx * p.t.tw;

  for (int i = threadIdx.x; i < kFwdOcPerBlock * KKP; i += blockDim.x) {
    const int q = i / KKP, r = i - q * KKP;
    s_w[i] = (r < KK && oc0 + q < p.oc) ? __ldg(p.w + (oc0 + q) * KK + r) : 0.f;
  }
  if (threadIdx.x < kFwdOcPerBlock) {
    const int oc = oc0 + threadIdx.x;
    s_b[threadIdx.x] = (p.b && oc < p.oc) ? __ldg(p.b + oc) : 0.f;
  }
  load_tile(p, n, oy0, ox0, s_x);
  __syncthreads();

  const int sy = threadIdx.x / p.t.tws, sx = threadIdx.x - sy * p.t.tws;
  const int oy = oy0 + sy, ox = ox0 + 4 * sx;
  if (sy >= p.t.th || oy >= p.oh || ox >= p.ow) return;

  float acc[kFwdOcPerBlock][4];
#pragma unroll
  for (int q = 0; q < kFwdOcPerBlock; ++q)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[q][j] = s_b[q];

  const float* win = s_x + sy * p.t.is + 4 * sx;
#pragma unroll
  for (int ky = 0; ky < K; ++ky) {
    float row[8];
    *reinterpret_cast<float4*>(&row[0]) = *reinterpret_cast<const float4*>(win + ky * p.t.is);
    *reinterpret_cast<float4*>(&row[4]) = *reinterpret_cast<const float4*>(win + ky * p.t.is + 4);
#pragma unroll
    for (int q = 0; q < kFwdOcPerBlock; ++q) {
#pragma unroll
      for (int kx = 0; kx < K; ++kx) {
        const float wv = s_w[q * KKP + ky * K + kx];  // same address in every lane: broadcast
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[q][j] = fmaf(wv, row[kx + j], acc[q][j]);
      }
    }
  }

#pragma unroll
  for (int q = 0; q < kFwdOcPerBlock; ++q) {
    const int oc = oc0 + q;
    if (oc >= p.oc) break;
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = p.relu ? relu_keep_nan(acc[q][j]) : acc[q][j];
    float* dst = p.y + ((static_cast<int64_t>(n) * p.oc + oc) * p.oh + oy) * p.ow + ox;
    if (p.vec) {
      *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (ox + j < p.ow) dst[j] = v[j];
    }
  }
}

// Any kernel size and stride. Thread mapping: one output element per thread (grid-stride over
// the flattened (N, OC, OH, OW) index).
__global__ void conv1ch_forward_direct(const Params p, int kh, int kw, int sh, int sw) {
  ptx::griddep_enter();
  const int64_t total = static_cast<int64_t>(p.n) * p.oc * p.oh * p.ow;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int ox = static_cast<int>(i % p.ow);
    const int oy = static_cast<int>((i / p.ow) % p.oh);
    const int oc = static_cast<int>((i / (static_cast<int64_t>(p.ow) * p.oh)) % p.oc);
    const int64_t n = i / (static_cast<int64_t>(p.ow) * p.oh * p.oc);
    const float* img = p.x + n * p.h * p.w_;
    float acc = p.b ? p.b[oc] : 0.f;
    for (int ky = 0; ky < kh; ++ky) {
      const int iy = oy * sh - p.ph + ky;
      if (iy < 0 || iy >= p.h) continue;
      for (int kx = 0; kx < kw; ++kx) {
        const int ix = ox * sw - p.pw + kx;
        if (ix < 0 || ix >= p.w_) continue;
        acc = fmaf(img[iy * p.w_ + ix], p.w[(oc * kh + ky) * kw + kx], acc);
      }
    }
    p.y[i] = p.relu ? relu_keep_nan(acc) : acc;
  }
}

// Loads one item's 4 x 4 dy values (channels oc0.., strip at (oy, ox) of image n); zeros where
// the channel or pixel does not exist.
__device__ __forceinline__ void load_dy_strip(const Params& p, int n, int oc0, int oy, int ox,
                                              bool valid, float (&d)[kWgradOcPerBlock][4]) {
#pragma unroll
  for (int q = 0; q < kWgradOcPerBlock; ++q) {
    const int oc = oc0 + q;
    const bool ok = valid && oc < p.oc;
    const float* src = p.dy + ((static_cast<int64_t>(n) * p.oc + oc) * p.oh + oy) * p.ow + ox;
    if (ok && p.vec) {
      const float4 t = __ldg(reinterpret_cast<const float4*>(src));
      d[q][0] = t.x;
      d[q][1] = t.y;
      d[q][2] = t.z;
      d[q][3] = t.w;
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j) d[q][j] = (ok && ox + j < p.ow) ? __ldg(src + j) : 0.f;
    }
  }
}

// Weight gradient, K x K taps, stride 1. Block: (spatial tile, chunk of nb images, group of 4
// output channels), flattened as blockIdx.x = (group * nchunks + chunk) * tiles + tile.
// Thread mapping: thread tid walks the block's (image, strip) items tid, tid + 128, ...; for
// each it adds dy[strip] x window into the 4*(K*K+1) accumulators (weights, then biases) of
// the block's channels. Then a warp reduce-scatter and a sum over the 4 warps in warp order
// give one partial per gradient per block: atomicAdd, or scratch (block, value) when
// deterministic.
template <int K>
__global__ void __launch_bounds__(kWgradThreads) conv1ch_wgrad_fast(const Params p) {
  ptx::griddep_enter();
  constexpr int KK = K * K, kQ = kWgradOcPerBlock;
  constexpr int V = kQ * (KK + 1);  // gradients per block: (q, ky, kx) then biases q
  constexpr int VP = (V <= 64) ? 64 : 128;
  static_assert(V <= VP, "gradient count exceeds the reduce-scatter width");
  constexpr int kWarps = kWgradThreads / 32;
  extern __shared__ float4 smem_f4[];
  float* s_red = reinterpret_cast<float*>(smem_f4);  // (warps, VP)
  float* s_x = s_red + kWarps * VP;                  // (nb, rows, is)

  const int tiles = p.t.tiles();
  const int tile = blockIdx.x % tiles, rest = blockIdx.x / tiles;
  const int chunk = rest % p.nchunks, g = rest / p.nchunks;
  const int tx = tile % p.t.tiles_x, ty = tile / p.t.tiles_x;
  const int oc0 = g * kQ, oy0 = ty * p.t.th, ox0 = tx * p.t.tw;
  const int n0 = chunk * p.nb, nbl = min(p.nb, p.n - n0);
  const int tf = p.t.tile_floats();

  for (int i = 0; i < nbl; ++i) load_tile(p, n0 + i, oy0, ox0, s_x + i * tf);
  __syncthreads();

  float acc[VP];
#pragma unroll
  for (int i = 0; i < VP; ++i) acc[i] = 0.f;

  const int strips = p.t.tws * p.t.th, items = nbl * strips;
  // Item it -> image nl, strip (sy, sx); the next item's dy is fetched before the current one
  // is summed, so the global loads overlap the arithmetic.
  auto locate = [&](int it, int& nl, int& sy, int& sx, bool& valid) {
    nl = it / strips;
    const int s = it - nl * strips;
    sy = s / p.t.tws;
    sx = s - sy * p.t.tws;
    valid = it < items && oy0 + sy < p.oh && ox0 + 4 * sx < p.ow;
  };
  int nl, sy, sx;
  bool valid;
  float dn[kQ][4];
  locate(threadIdx.x, nl, sy, sx, valid);
  load_dy_strip(p, n0 + nl, oc0, oy0 + sy, ox0 + 4 * sx, valid, dn);
  for (int it = threadIdx.x; it < items; it += kWgradThreads) {
    float d[kQ][4];
#pragma unroll
    for (int q = 0; q < kQ; ++q)
#pragma unroll
      for (int j = 0; j < 4; ++j) d[q][j] = dn[q][j];
    const int cl = nl, cy = sy, cx = sx;
    const bool cvalid = valid;
    locate(it + kWgradThreads, nl, sy, sx, valid);
    load_dy_strip(p, n0 + nl, oc0, oy0 + sy, ox0 + 4 * sx, valid, dn);
    if (!cvalid) continue;

    const float* win = s_x + cl * tf + cy * p.t.is + 4 * cx;
#pragma unroll
    for (int ky = 0; ky < K; ++ky) {
      float row[8];
      *reinterpret_cast<float4*>(&row[0]) = *reinterpret_cast<const float4*>(win + ky * p.t.is);
      *reinterpret_cast<float4*>(&row[4]) = *reinterpret_cast<const float4*>(win + ky * p.t.is + 4);
#pragma unroll
      for (int q = 0; q < kQ; ++q)
#pragma unroll
        for (int kx = 0; kx < K; ++kx) {
          float a = acc[q * KK + ky * K + kx];
#pragma unroll
          for (int j = 0; j < 4; ++j) a = fmaf(d[q][j], row[kx + j], a);
          acc[q * KK + ky * K + kx] = a;
        }
    }
#pragma unroll
    for (int q = 0; q < kQ; ++q) acc[kQ * KK + q] += (d[q][0] + d[q][1]) + (d[q][2] + d[q][3]);
  }

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  reduce_scatter_step<VP / 2, 16, VP>(acc, lane);
#pragma unroll
  for (int i = 0; i < VP / 32; ++i) s_red[warp * VP + lane * (VP / 32) + i] = acc[i];
  __syncthreads();
  conv1ch::wgrad_block_epilogue<kWarps>(s_red, VP, kQ, KK, oc0, p.oc, p.dw, p.db, p.scratch,
                                        blockIdx.x);
}

// Any kernel size and stride: block b sums gradient (oc, r) (r < kh*kw: weight tap, r ==
// kh*kw: bias) over all N*OH*OW output positions. Thread mapping: thread tid takes positions
// tid, tid + 256, ...; a fixed-order block sum finishes it, so this path is deterministic.
__global__ void __launch_bounds__(kDirectThreads)
    conv1ch_wgrad_direct(const Params p, int kh, int kw, int sh, int sw) {
  ptx::griddep_enter();
  __shared__ float s_warp[kDirectThreads / 32];
  const int kk = kh * kw;
  const int oc = blockIdx.x / (kk + 1), r = blockIdx.x % (kk + 1);
  if (r == kk && !p.db) return;
  const int ky = r / kw, kx = r % kw;
  const int64_t total = static_cast<int64_t>(p.n) * p.oh * p.ow;
  float acc = 0.f;
  for (int64_t i = threadIdx.x; i < total; i += blockDim.x) {
    const int ox = static_cast<int>(i % p.ow);
    const int oy = static_cast<int>((i / p.ow) % p.oh);
    const int64_t n = i / (static_cast<int64_t>(p.ow) * p.oh);
    const float g = p.dy[((n * p.oc + oc) * p.oh + oy) * p.ow + ox];
    if (r == kk) {
      acc += g;
      continue;
    }
    const int iy = oy * sh - p.ph + ky, ix = ox * sw - p.pw + kx;
    if (iy >= 0 && iy < p.h && ix >= 0 && ix < p.w_)
      acc = fmaf(p.x[(n * p.h + iy) * p.w_ + ix], g, acc);
  }
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, off);
  if (threadIdx.x % 32 == 0) s_warp[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float sum = 0.f;
    for (int w = 0; w < kDirectThreads / 32; ++w) sum += s_warp[w];
    if (r < kk)
      p.dw[oc * kk + r] += sum;
    else
      p.db[oc] += sum;
  }
}

Params params_of(const Conv2dShape& s) {
  Params p{};
  p.n = s.n;
  p.h = s.h;
  p.w_ = s.w;
  p.oc = s.oc;
  p.oh = s.oh();
  p.ow = s.ow();
  p.ph = s.pad_h;
  p.pw = s.pad_w;
  p.t = tiling_of(s);
  return p;
}

// Images per weight-gradient block: enough (image, strip) items to amortize the block's
// reduction, within 40 KB of shared input tiles. A function of the shape only (scratch size).
int wgrad_images_per_block(const Conv2dShape& s, const Tiling& t) {
  const int strips = t.tws * t.th;
  const int by_items = std::max(1, kWgradItemsPerBlock / strips);
  const int by_smem = std::max(1, (40 * 1024 / 4) / t.tile_floats());
  return std::max(1, std::min({by_items, by_smem, s.n}));
}

bool aligned16(const void* ptr) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

int grid_for(int64_t work, int block) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(ceil_div<int64_t>(work, block), int64_t{1} << 20)));
}

void check_1ch(const Conv2dShape& s, const char* op) {
  CNN_CHECK(s.c == 1, "{}: needs one input channel, got c={}", op, s.c);
  CNN_CHECK(int64_t{s.n} * s.oc * s.oh() * s.ow() < (int64_t{1} << 31) &&
                int64_t{s.n} * s.h * s.w < (int64_t{1} << 31),
            "{}: tensors over 2^31 elements are not supported", op);
}

}  // namespace

void conv2d_forward_1ch_cuda(const Conv2dShape& s, const float* d_x, const float* d_w,
                             const float* d_b, float* d_y, bool relu, const Exec& ex) {
  check_1ch(s, "conv2d_forward_1ch");
  Params p = params_of(s);
  p.x = d_x;
  p.w = d_w;
  p.b = d_b;
  p.y = d_y;
  p.relu = relu;
  p.ocg = ceil_div(s.oc, kFwdOcPerBlock);
  p.vec = p.ow % 4 == 0 && aligned16(d_y);
  if (!fast_path(s)) {
    const int64_t total = int64_t{s.n} * s.oc * p.oh * p.ow;
    conv1ch_forward_direct<<<grid_for(total, kDirectThreads), kDirectThreads, 0, ex.stream>>>(
        p, s.kh, s.kw, s.stride_h, s.stride_w);
    CNN_LAUNCH_CHECK("conv1ch_forward_direct");
    return;
  }
  const int64_t blocks = int64_t{p.t.tiles()} * p.ocg * s.n;
  CNN_CHECK(blocks < (int64_t{1} << 31), "conv2d_forward_1ch: {} blocks", blocks);
  const int kkp = (s.kh * s.kw + 3) / 4 * 4;
  const std::size_t smem =
      sizeof(float) * (kFwdOcPerBlock * kkp + kFwdOcPerBlock + p.t.tile_floats());
  if (s.kh == 5) {
    conv1ch_forward_fast<5><<<static_cast<unsigned>(blocks), kFwdThreads, smem, ex.stream>>>(p);
    CNN_LAUNCH_CHECK("conv1ch_forward_fast<5>");
  } else {
    conv1ch_forward_fast<3><<<static_cast<unsigned>(blocks), kFwdThreads, smem, ex.stream>>>(p);
    CNN_LAUNCH_CHECK("conv1ch_forward_fast<3>");
  }
}

std::size_t conv2d_backward_weight_1ch_scratch_floats(const Conv2dShape& s, const Exec& ex) {
  if (!ex.deterministic || !fast_path(s) || s.c != 1) return 0;
  const Tiling t = tiling_of(s);
  const int nb = wgrad_images_per_block(s, t);
  const int64_t blocks = int64_t{t.tiles()} * ceil_div(s.n, nb) * ceil_div(s.oc, kWgradOcPerBlock);
  return static_cast<std::size_t>(blocks * kWgradOcPerBlock * (s.kh * s.kw + 1));
}

void conv2d_backward_weight_1ch_cuda(const Conv2dShape& s, const float* d_x, const float* d_dy,
                                     float* d_dw, float* d_db, float* d_scratch, const Exec& ex) {
  check_1ch(s, "conv2d_backward_weight_1ch");
  Params p = params_of(s);
  p.x = d_x;
  p.dy = d_dy;
  p.dw = d_dw;
  p.db = d_db;
  const int kk = s.kh * s.kw;
  if (!fast_path(s)) {  // one block per gradient, fixed-order sums: deterministic as it is
    conv1ch_wgrad_direct<<<s.oc*(kk + 1), kDirectThreads, 0, ex.stream>>>(p, s.kh, s.kw, s.stride_h,
                                                                          s.stride_w);
    CNN_LAUNCH_CHECK("conv1ch_wgrad_direct");
    return;
  }
  CNN_CHECK(!ex.deterministic || d_scratch,
            "conv2d_backward_weight_1ch: deterministic mode needs {} floats of scratch, got null",
            conv2d_backward_weight_1ch_scratch_floats(s, ex));
  p.scratch = ex.deterministic ? d_scratch : nullptr;
  p.ocg = ceil_div(s.oc, kWgradOcPerBlock);
  p.nb = wgrad_images_per_block(s, p.t);
  p.nchunks = ceil_div(s.n, p.nb);
  p.vec = p.ow % 4 == 0 && aligned16(d_dy);
  const int64_t blocks = int64_t{p.t.tiles()} * p.nchunks * p.ocg;
  CNN_CHECK(blocks < (int64_t{1} << 31), "conv2d_backward_weight_1ch: {} blocks", blocks);
  const int vp = (kWgradOcPerBlock * (kk + 1) <= 64) ? 64 : 128;
  const std::size_t smem = sizeof(float) * (static_cast<std::size_t>(kWgradThreads / 32) * vp +
                                            static_cast<std::size_t>(p.nb) * p.t.tile_floats());
  if (s.kh == 5) {
    conv1ch_wgrad_fast<5><<<static_cast<unsigned>(blocks), kWgradThreads, smem, ex.stream>>>(p);
    CNN_LAUNCH_CHECK("conv1ch_wgrad_fast<5>");
  } else {
    conv1ch_wgrad_fast<3><<<static_cast<unsigned>(blocks), kWgradThreads, smem, ex.stream>>>(p);
    CNN_LAUNCH_CHECK("conv1ch_wgrad_fast<3>");
  }
  if (ex.deterministic) {
    const int total = s.oc * (kk + 1);
    conv1ch::conv1ch_wgrad_reduce<kWgradOcPerBlock><<<grid_for(total, 256), 256, 0, ex.stream>>>(
        p.scratch, p.dw, p.db, p.oc, kk, p.nchunks * p.t.tiles());
    CNN_LAUNCH_CHECK("conv1ch_wgrad_reduce");
  }
}

}  // namespace cnn
