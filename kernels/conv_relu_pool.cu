// Fused single-input-channel conv -> ReLU -> 2x2 / stride-2 max-pool (see conv_relu_pool.h).
//   crp_forward<K>:      conv + bias + ReLU + pool of one 2x2 window (one pooled output) for 8
//                        output channels per thread; writes the pooled y and the argmax only
//   crp_wgrad<K, Q>:     weight and bias gradients of Q output channels per thread straight from
//                        the pooled dy, argmax and y; warp reduce-scatter + block sum per block,
//                        atomicAdd or (deterministic) per-block partials summed in block order
//   crp_wgrad_reduce:    that deterministic second stage
// Both passes tile the POOLED output into tiles of up to 256 outputs (a 14x14 pooled plane of
// conv1 is one tile) and keep the matching input tile, (2*tile + K - 1) squared, in shared memory.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/conv_relu_pool_cuda.h"
#include "kernels/cuda_check.h"
#include "kernels/error.h"
#include "kernels/math_util.h"

namespace cnn {
namespace {

constexpr int kFwdOc = 8;                 // forward: output channels per thread (and per block)
constexpr int kMaxTile = 256;             // pooled outputs per tile (forward: one per thread)
constexpr int kMaxTileW = 32;             // pooled columns per tile
constexpr int kWgradThreads = 128;        // weight gradient: threads per block
constexpr int kWgradItemsPerBlock = 768;  // (image, pooled output) items a block sums

// Tile of the pooled output (tpw x tph) and its input tile in shared memory: rows x is floats
// (row stride `is` even, so every window row starts 8-byte aligned and moves as float2).
struct Tiling {
  int tpw, tph, tiles_x, tiles_y, rows, is;
  __host__ __device__ int tiles() const { return tiles_x * tiles_y; }
  __host__ __device__ int items() const { return tpw * tph; }
  __host__ __device__ int tile_floats() const { return rows * is; }
};

struct Params {
  const float* x;     // (N, 1, H, W)
  const float* w;     // (OC, 1, K, K)                  forward
  const float* b;     // (OC) or null                    forward
  float* y;           // (N, OC, PH, PW) pooled          forward
  int32_t* argmax;    // (N, OC, PH, PW)                 forward
  const float* ry;    // (N, OC, PH, PW) pooled y        weight gradient (ReLU mask)
  const float* dy;    // (N, OC, PH, PW) pooled gradient weight gradient
  const int32_t* am;  // (N, OC, PH, PW) argmax          weight gradient
  float* dw;          // (OC, 1, K, K), accumulated
  float* db;          // (OC) or null, accumulated
  float* scratch;     // deterministic partials (blocks, values per block) or null
  int n, h, w_, oc, ow, poh, pow_, pad_h, pad_w;  // ow: conv output width; poh x pow_: pooled
  Tiling t;
  int ocg;      // output-channel groups
  int nb;       // weight gradient: images per block
  int nchunks;  // weight gradient: ceil(n / nb)
};

__device__ __forceinline__ float relu_keep_nan(float v) {
  return (v < 0.f) ? 0.f : v;
}

// Fills the shared input tile of image n for the pooled tile starting at (py0, px0): rows x is
// floats, zero where the conv window hangs over the padding (or past the tile's last column).
__device__ __forceinline__ void load_input_tile(const Params& p, int n, int py0, int px0,
                                                float* s_x) {
  const int iy0 = 2 * py0 - p.pad_h, ix0 = 2 * px0 - p.pad_w;
  const float* img = p.x + static_cast<int64_t>(n) * p.h * p.w_;
  for (int i = threadIdx.x; i < p.t.rows * p.t.is; i += blockDim.x) {
    const int r = i / p.t.is, c = i - r * p.t.is;
    const int iy = iy0 + r, ix = ix0 + c;
    s_x[i] = (iy >= 0 && iy < p.h && ix >= 0 && ix < p.w_) ? __ldg(img + iy * p.w_ + ix) : 0.f;
  }
}

// Loads K + 1 consecutive floats (K odd) from an 8-byte aligned shared address.
template <int K>
__device__ __forceinline__ void load_row(const float* src, float (&r)[K + 1]) {
#pragma unroll
  for (int j = 0; j < K + 1; j += 2) {
    const float2 v = *reinterpret_cast<const float2*>(src + j);
    r[j] = v.x;
    r[j + 1] = v.y;
  }
}

// Forward, K x K taps, stride 1. Block: (pooled tile, group of 8 output channels, image),
// flattened in blockIdx.x. Thread mapping: thread tid owns pooled output (tid / tpw, tid % tpw)
// of the tile for the block's 8 channels, i.e. the 2x2 conv outputs of its window (32
// accumulators); it slides two (K+1)-wide input rows from shared memory down the window, so each
// input row is read once and each weight row once per thread. Sums run in the order of
// conv2d_1ch's fast kernel (bias, then ky, kx ascending, fmaf), so y is bitwise that chain's.
template <int K>
__global__ void __launch_bounds__(kMaxTile) crp_forward(const Params p) {
  static_assert(K % 2 == 1, "odd kernels only");
  constexpr int KW4 = (K + 3) / 4 * 4;  // weight row padded to whole float4s
  extern __shared__ float4 smem_f4[];
  float* s_w = reinterpret_cast<float*>(smem_f4);  // (8, K, KW4)
  float* s_b = s_w + kFwdOc * K * KW4;             // (8)
  float* s_x = s_b + kFwdOc;                       // (rows, is), 16-byte aligned

  int bid = blockIdx.x;
  const int tx = bid % p.t.tiles_x;
  bid /= p.t.tiles_x;
  const int ty = bid % p.t.tiles_y;
  bid /= p.t.tiles_y;
  const int g = bid % p.ocg, n = bid / p.ocg;
  const int oc0 = g * kFwdOc, py0 = ty * p.t.tph, px0 = tx * p.t.tpw;

  for (int i = threadIdx.x; i < kFwdOc * K * KW4; i += blockDim.x) {
    const int q = i / (K * KW4), r = i - q * (K * KW4);
    const int ky = r / KW4, kx = r - ky * KW4;
    s_w[i] = (kx < K && oc0 + q < p.oc) ? __ldg(p.w + (oc0 + q) * K * K + ky * K + kx) : 0.f;
  }
  if (threadIdx.x < kFwdOc) {
    const int oc = oc0 + threadIdx.x;
    s_b[threadIdx.x] = (p.b && oc < p.oc) ? __ldg(p.b + oc) : 0.f;
  }
  load_input_tile(p, n, py0, px0, s_x);
  __syncthreads();

  const int ly = threadIdx.x / p.t.tpw, lx = threadIdx.x - ly * p.t.tpw;
  const int py = py0 + ly, px = px0 + lx;
  if (ly >= p.t.tph || py >= p.poh || px >= p.pow_) return;

  float acc[kFwdOc][4];  // conv outputs (2py, 2px), (2py, 2px+1), (2py+1, 2px), (2py+1, 2px+1)
#pragma unroll
  for (int q = 0; q < kFwdOc; ++q)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[q][j] = s_b[q];

  const float* win = s_x + 2 * ly * p.t.is + 2 * lx;
  float ra[K + 1], rb[K + 1];  // input rows ky and ky + 1 of the window
  load_row<K>(win, rb);
#pragma unroll
  for (int ky = 0; ky < K; ++ky) {
#pragma unroll
    for (int j = 0; j < K + 1; ++j) ra[j] = rb[j];
    load_row<K>(win + (ky + 1) * p.t.is, rb);
#pragma unroll
    for (int q = 0; q < kFwdOc; ++q) {
      float wr[KW4];  // same address in every lane: broadcast
#pragma unroll
      for (int j = 0; j < KW4; j += 4)
        *reinterpret_cast<float4*>(&wr[j]) =
            *reinterpret_cast<const float4*>(s_w + (q * K + ky) * KW4 + j);
#pragma unroll
      for (int kx = 0; kx < K; ++kx) {
        acc[q][0] = fmaf(wr[kx], ra[kx], acc[q][0]);
        acc[q][1] = fmaf(wr[kx], ra[kx + 1], acc[q][1]);
        acc[q][2] = fmaf(wr[kx], rb[kx], acc[q][2]);
        acc[q][3] = fmaf(wr[kx], rb[kx + 1], acc[q][3]);
      }
    }
  }

  const int corner = 2 * py * p.ow + 2 * px;  // argmax of window element 0
#pragma unroll
  for (int q = 0; q < kFwdOc; ++q) {
    const int oc = oc0 + q;
    if (oc >= p.oc) break;
    // maxpool2x2_forward_exact's rule on the ReLU'd values: row-major order, strictly greater
    // replaces (the first of equal maxima stays, so among values <= 0 the first wins), NaN wins.
    float best = relu_keep_nan(acc[q][0]);
    int bi = 0;
#pragma unroll
    for (int t = 1; t < 4; ++t) {
      const float v = relu_keep_nan(acc[q][t]);
      if (!isnan(best) && (v > best || isnan(v))) {
        best = v;
        bi = t;
      }
    }
    const int64_t o = ((static_cast<int64_t>(n) * p.oc + oc) * p.poh + py) * p.pow_ + px;
    p.y[o] = best;
    p.argmax[o] = corner + (bi >> 1) * p.ow + (bi & 1);
  }
}

// Butterfly reduce-scatter across the 32 lanes of a warp (as in conv2d_1ch.cu): on entry every
// lane holds VP partial values; on return lane l holds in v[0 .. VP/32) the warp totals of values
// l*VP/32 + i.
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

template <int K, int Q>
struct WgradDims {
  static constexpr int KK = K * K;
  static constexpr int V = Q * (KK + 1);  // gradients per block: (q, ky, kx) then biases q
  static constexpr int VP = V <= 32 ? 32 : (V <= 64 ? 64 : 128);
  static_assert(V <= VP, "gradient count exceeds the reduce-scatter width");
};

// Weight gradient from the pooled gradient. Block: (pooled tile, chunk of nb images, group of Q
// output channels), flattened as blockIdx.x = (group * nchunks + chunk) * tiles + tile.
// Thread mapping: thread tid walks the block's (image, pooled output) items tid, tid + 128, ...;
// for each it reads the Q channels' dy (zeroed where the pooled y <= 0: the ReLU's mask) and
// argmax, i.e. which of the window's 4 conv outputs gets the gradient, slides two input rows of
// the (K+1) x (K+1) input window down from shared memory, and adds g x (the K x K window at the
// argmax's offset, picked per channel by selects) into its Q*(K*K+1) register accumulators.
// Then a warp reduce-scatter and a sum over the 4 warps in warp order give one partial per
// gradient per block: atomicAdd, or scratch (block, value) when deterministic.
template <int K, int Q>
__global__ void __launch_bounds__(kWgradThreads) crp_wgrad(const Params p) {
  using D = WgradDims<K, Q>;
  constexpr int KK = D::KK, V = D::V, VP = D::VP;
  constexpr int kWarps = kWgradThreads / 32;
  extern __shared__ float4 smem_f4[];
  float* s_red = reinterpret_cast<float*>(smem_f4);  // (warps, VP)
  float* s_x = s_red + kWarps * VP;                  // (nb, rows, is)

  const int tiles = p.t.tiles();
  const int tile = blockIdx.x % tiles, rest = blockIdx.x / tiles;
  const int chunk = rest % p.nchunks, g = rest / p.nchunks;
  const int tx = tile % p.t.tiles_x, ty = tile / p.t.tiles_x;
  const int oc0 = g * Q, py0 = ty * p.t.tph, px0 = tx * p.t.tpw;
  const int n0 = chunk * p.nb, nbl = min(p.nb, p.n - n0);
  const int tf = p.t.tile_floats();

  for (int i = 0; i < nbl; ++i) load_input_tile(p, n0 + i, py0, px0, s_x + i * tf);
  __syncthreads();

  float acc[VP];
#pragma unroll
  for (int i = 0; i < VP; ++i) acc[i] = 0.f;

  const int per_image = p.t.items(), items = nbl * per_image;
  for (int it = threadIdx.x; it < items; it += kWgradThreads) {
    const int nl = it / per_image, s = it - nl * per_image;
    const int ly = s / p.t.tpw, lx = s - ly * p.t.tpw;
    const int py = py0 + ly, px = px0 + lx;
    if (py >= p.poh || px >= p.pow_) continue;
    const int corner = 2 * py * p.ow + 2 * px;
    float gq[Q];
    bool down[Q], right[Q];  // the winner's row / column inside the 2x2 window
#pragma unroll
    for (int q = 0; q < Q; ++q) {
      gq[q] = 0.f;
      down[q] = right[q] = false;
      const int oc = oc0 + q;
      if (oc < p.oc) {
        const int64_t o = ((static_cast<int64_t>(n0 + nl) * p.oc + oc) * p.poh + py) * p.pow_ + px;
        const int a = __ldg(p.am + o) - corner;  // 0, 1, OW or OW + 1
        down[q] = a >= p.ow;
        right[q] = (a - (down[q] ? p.ow : 0)) != 0;
        gq[q] = (__ldg(p.ry + o) > 0.f) ? __ldg(p.dy + o) : 0.f;
      }
    }
    const float* win = s_x + nl * tf + 2 * ly * p.t.is + 2 * lx;
    float ra[K + 1], rb[K + 1];  // input rows ky and ky + 1 of the window
    load_row<K>(win, rb);
#pragma unroll
    for (int ky = 0; ky < K; ++ky) {
#pragma unroll
      for (int j = 0; j < K + 1; ++j) ra[j] = rb[j];
      load_row<K>(win + (ky + 1) * p.t.is, rb);
#pragma unroll
      for (int q = 0; q < Q; ++q) {
        float r[K + 1];
#pragma unroll
        for (int j = 0; j < K + 1; ++j) r[j] = down[q] ? rb[j] : ra[j];
#pragma unroll
        for (int kx = 0; kx < K; ++kx) {
          const float v = right[q] ? r[kx + 1] : r[kx];
          acc[q * KK + ky * K + kx] = fmaf(gq[q], v, acc[q * KK + ky * K + kx]);
        }
      }
    }
#pragma unroll
    for (int q = 0; q < Q; ++q) acc[Q * KK + q] += gq[q];
  }

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  reduce_scatter_step<VP / 2, 16, VP>(acc, lane);
#pragma unroll
  for (int i = 0; i < VP / 32; ++i) s_red[warp * VP + lane * (VP / 32) + i] = acc[i];
  __syncthreads();
  for (int vi = threadIdx.x; vi < V; vi += kWgradThreads) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += s_red[w * VP + vi];  // fixed order
    if (p.scratch) {
      p.scratch[static_cast<int64_t>(blockIdx.x) * V + vi] = sum;
    } else if (vi < Q * KK) {
      const int q = vi / KK, oc = oc0 + q;
      if (oc < p.oc) atomicAdd(p.dw + oc * KK + (vi - q * KK), sum);
    } else {
      const int oc = oc0 + vi - Q * KK;
      if (p.db && oc < p.oc) atomicAdd(p.db + oc, sum);
    }
  }
}

// Second stage of the deterministic weight gradient: gradient (oc, r) (r < KK: weight tap,
// r == KK: bias) sums the partials of its channel group's blocks in block order. Thread
// mapping: one gradient per thread.
__global__ void crp_wgrad_reduce(const Params p, int kk, int q_per_group) {
  const int v_per_block = q_per_group * (kk + 1);
  const int blocks_per_group = p.nchunks * p.t.tiles();
  const int total = p.oc * (kk + 1);
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
    const int oc = i / (kk + 1), r = i - oc * (kk + 1);
    const int g = oc / q_per_group, q = oc - g * q_per_group;
    if (r == kk && !p.db) continue;
    const int vi = (r < kk) ? q * kk + r : q_per_group * kk + q;
    const float* src = p.scratch + static_cast<int64_t>(g) * blocks_per_group * v_per_block + vi;
    float sum = 0.f;
    for (int b = 0; b < blocks_per_group; ++b) sum += src[static_cast<int64_t>(b) * v_per_block];
    if (r < kk)
      p.dw[oc * kk + r] += sum;
    else
      p.db[oc] += sum;
  }
}

Tiling tiling_of(const Conv2dShape& s) {
  Tiling t{};
  const int poh = s.oh() / 2, pow_ = s.ow() / 2;
  t.tpw = std::min(pow_, kMaxTileW);
  t.tph = std::max(1, std::min(poh, kMaxTile / t.tpw));
  t.tiles_x = ceil_div(pow_, t.tpw);
  t.tiles_y = ceil_div(poh, t.tph);
  t.rows = 2 * t.tph + s.kh - 1;
  t.is = (2 * t.tpw + s.kw - 1 + 1) / 2 * 2;
  return t;
}

Params params_of(const Conv2dShape& s) {
  Params p{};
  p.n = s.n;
  p.h = s.h;
  p.w_ = s.w;
  p.oc = s.oc;
  p.ow = s.ow();
  p.poh = s.oh() / 2;
  p.pow_ = s.ow() / 2;
  p.pad_h = s.pad_h;
  p.pad_w = s.pad_w;
  p.t = tiling_of(s);
  return p;
}

// Output channels per weight-gradient thread: 4, or 2 for 7x7 (register budget).
int wgrad_q(int k) {
  return k == 7 ? 2 : 4;
}

// Images per weight-gradient block: enough items to amortize the block's reduction, within
// 40 KB of shared input tiles. A function of the shape only (it sizes the scratch).
int wgrad_images_per_block(const Conv2dShape& s, const Tiling& t) {
  const int by_items = std::max(1, kWgradItemsPerBlock / t.items());
  const int by_smem = std::max(1, (40 * 1024 / 4) / t.tile_floats());
  return std::max(1, std::min({by_items, by_smem, s.n}));
}

int grid_for(int64_t work, int block) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>(ceil_div<int64_t>(work, block), int64_t{1} << 20)));
}

template <int K>
void launch_forward(const Params& p, unsigned blocks, int threads, cudaStream_t stream) {
  constexpr int KW4 = (K + 3) / 4 * 4;
  const std::size_t smem = sizeof(float) * (kFwdOc * K * KW4 + kFwdOc + p.t.tile_floats());
  crp_forward<K><<<blocks, threads, smem, stream>>>(p);
  CNN_LAUNCH_CHECK("crp_forward");
}

template <int K, int Q>
void launch_wgrad(const Params& p, unsigned blocks, cudaStream_t stream) {
  const std::size_t smem =
      sizeof(float) * (static_cast<std::size_t>(kWgradThreads / 32) * WgradDims<K, Q>::VP +
                       static_cast<std::size_t>(p.nb) * p.t.tile_floats());
  crp_wgrad<K, Q><<<blocks, kWgradThreads, smem, stream>>>(p);
  CNN_LAUNCH_CHECK("crp_wgrad");
}

}  // namespace

void conv_relu_pool_forward_cuda(const Conv2dShape& s, const float* d_x, const float* d_w,
                                 const float* d_b, float* d_y, int32_t* d_argmax, const Exec& ex) {
  Params p = params_of(s);
  p.x = d_x;
  p.w = d_w;
  p.b = d_b;
  p.y = d_y;
  p.argmax = d_argmax;
  p.ocg = ceil_div(s.oc, kFwdOc);
  const int64_t blocks = int64_t{p.t.tiles()} * p.ocg * s.n;
  CNN_CHECK(blocks < (int64_t{1} << 31), "conv_relu_pool_forward: {} blocks", blocks);
  const int threads = ceil_div(p.t.items(), 32) * 32;  // one pooled output each, whole warps
  const unsigned nb = static_cast<unsigned>(blocks);
  switch (s.kh) {
    case 1:
      return launch_forward<1>(p, nb, threads, ex.stream);
    case 3:
      return launch_forward<3>(p, nb, threads, ex.stream);
    case 5:
      return launch_forward<5>(p, nb, threads, ex.stream);
    case 7:
      return launch_forward<7>(p, nb, threads, ex.stream);
    default:
      CNN_FAIL("conv_relu_pool_forward: kernel {} has no fused kernel", s.kh);
  }
}

std::size_t conv_relu_pool_backward_weight_scratch_floats_cuda(const Conv2dShape& s,
                                                               const Exec& ex) {
  if (!ex.deterministic) return 0;
  const Tiling t = tiling_of(s);
  const int nb = wgrad_images_per_block(s, t), q = wgrad_q(s.kh);
  const int64_t blocks = int64_t{t.tiles()} * ceil_div(s.n, nb) * ceil_div(s.oc, q);
  return static_cast<std::size_t>(blocks * q * (s.kh * s.kw + 1));
}

void conv_relu_pool_backward_weight_cuda(const Conv2dShape& s, const float* d_x, const float* d_y,
                                         const float* d_dy, const int32_t* d_argmax, float* d_dw,
                                         float* d_db, float* d_scratch, const Exec& ex) {
  Params p = params_of(s);
  p.x = d_x;
  p.ry = d_y;
  p.dy = d_dy;
  p.am = d_argmax;
  p.dw = d_dw;
  p.db = d_db;
  p.scratch = ex.deterministic ? d_scratch : nullptr;
  CNN_CHECK(!ex.deterministic || d_scratch,
            "conv_relu_pool_backward_weight: deterministic mode needs scratch");
  const int q = wgrad_q(s.kh);
  p.ocg = ceil_div(s.oc, q);
  p.nb = wgrad_images_per_block(s, p.t);
  p.nchunks = ceil_div(s.n, p.nb);
  const int64_t blocks = int64_t{p.t.tiles()} * p.nchunks * p.ocg;
  CNN_CHECK(blocks < (int64_t{1} << 31), "conv_relu_pool_backward_weight: {} blocks", blocks);
  const unsigned nb = static_cast<unsigned>(blocks);
  switch (s.kh) {
    case 1:
      launch_wgrad<1, 4>(p, nb, ex.stream);
      break;
    case 3:
      launch_wgrad<3, 4>(p, nb, ex.stream);
      break;
    case 5:
      launch_wgrad<5, 4>(p, nb, ex.stream);
      break;
    case 7:
      launch_wgrad<7, 2>(p, nb, ex.stream);
      break;
    default:
      CNN_FAIL("conv_relu_pool_backward_weight: kernel {} has no fused kernel", s.kh);
  }
  if (ex.deterministic) {
    const int kk = s.kh * s.kw, total = s.oc * (kk + 1);
    crp_wgrad_reduce<<<grid_for(total, 256), 256, 0, ex.stream>>>(p, kk, q);
    CNN_LAUNCH_CHECK("crp_wgrad_reduce");
  }
}

}  // namespace cnn
