// Int8 convolution for inputs of at most 4 channels on tensor cores (qconv_few_channels.h): the
// tiles, the input words and the epilogue of the dp4a kernel (qconv_few_channels.cu), with the
// sums on mma.sync m16n8k32 s8. The block stages its input tile as 4-byte words (for C = 1 word
// (row, j) holds pixels j..j+3 of the row, else one pixel's 4 channels; the same Int8Nhwc /
// FloatNchw reads and quantization as the dp4a kernel) and its weights as words (r, j) of the
// kernel. The GEMM: rows the conv outputs of the block's pool windows, columns its output
// channels, the reduction over the kernel's KH x KWW words (4 bytes each, zero padded to 8-word
// k steps). An A fragment register (row g or g + 8, k bytes 4t..4t+3 or 16+4t..16+4t+3) is then
// one input word, x_s[base(row) + koff(word)], with no byte shuffling; the weights are staged in
// B fragment order (one 8-byte load a lane). The sums are exact int32, the epilogue is
// qconv_epilogue.cuh's, so the outputs equal the CPU twin's bit for bit.
//
// Pool windows in registers: a window takes `slots` rows (its outputs rounded up to a power of
// two); slot s of an mma tile is row s / 2 + 8 (s % 2), so a thread's rows g and g + 8 are two
// neighbouring slots of one window (or, without a pool, two neighbouring outputs) and a window's
// other slots are in the lanes a shuffle (xor 4, 8, 16) away. Int8 outputs reduce the int32
// sums before the epilogue: it is monotone in the sum (non-decreasing for mult >= 0, else
// non-increasing: fma, ReLU, clamp and rounding all are), so the window's maximum output is the
// epilogue of its largest sum (smallest for mult < 0), the same int8 value as the twin's maximum
// of the outputs. Float outputs go through the epilogue first and keep the twin's tie rule (the
// first maximum in row-major window order: the bits of +-0), as (value, element) pairs.
//
// 2x2 windows with int8 outputs and up to 32 channels a block (LeNet's conv1) take tile pairs
// instead: a warp runs mma tiles 2p and 2p + 1 together and lane (g, t)'s rows g and g + 8 of the
// two are the 4 slots of one window, so the window's maximum takes no shuffle and each lane runs
// the epilogue of a window of its own (the general loop runs each twice, in lanes g and g ^ 1);
// one B fragment load feeds two mma. About half the instructions a tile (PTX, k_steps = 2: 310
// a tile paired against 630).
//
// Resources (ptxas -v, sm_90, CUDA 13.0): 256 threads a block; int8 outputs 62-64 registers
// (LeNet's conv1, paired from float input: 64, no spills; some paired and 8-column-tile
// variants spill 12 bytes at the 64-register cap); float outputs 75-80 (8 column tiles: 12
// bytes of spills). Shared memory a block: LeNet's conv1 8648 bytes (2 KiB of B fragments, 416
// window slots of 8 bytes, 18 input rows of 41 words); at most kQFewMaxSmem (48 KiB), the tiles
// halved until they fit.
#include <cuda_runtime.h>

#include <cfloat>
#include <climits>
#include <cstdint>
#include <type_traits>

#include "kernels/common/ptx.cuh"
#include "kernels/quant/qconv_epilogue.cuh"
#include "kernels/quant/qconv_few_channels.h"
#include "kernels/quant/qconv_few_channels_cuda.h"
#include "kernels/quant/qconv_few_channels_staging.cuh"
#include "runtime/cuda_check.h"

namespace cnn {
namespace {

// 8 warps; a warp takes the block's mma tiles w, w + 8, ... (LeNet's conv1: 25 tiles of 4 pool
// windows a block, 512 blocks at batch 256). Blocks an SM (the register bound ptxas works to):
// four for int8 outputs of at most 32 channels a block (64 registers: LeNet's 512 blocks then
// run in one wave on 132 SMs); the variants that hold more take one block fewer, since at 64
// (int8) or 85 (float) registers they spill 4-16 bytes: three for int8 with 8 column tiles and
// for paired tiles other than LeNet's (one channel, float input quantized while staging), three
// for float outputs, two for float with 8 column tiles.
constexpr int kThreads = 256, kWarps = kThreads / 32;
template <class T, int kNT, bool kOneChannel, bool kPaired, class Input>
constexpr int min_blocks_per_sm() {
  constexpr bool lenet_pair = kOneChannel && std::is_same_v<Input, qfew::FloatNchw>;
  if constexpr (sizeof(T) == 1)
    return kNT == 8 || (kPaired && !lenet_pair) ? 3 : 4;
  else
    return kNT == 8 ? 2 : 3;
}
constexpr unsigned kFullMask = 0xffffffffu;

using qepilogue::lowest;
using qfew::byte_at;
using qfew::FloatNchw;
using qfew::Int8Nhwc;

__device__ __forceinline__ void mma_s8(int (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint2 b) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b.x), "r"(b.y));
}

// Kernel word k = (r, j) of output channel o, as the dp4a kernel stages it: with one channel
// taps 4j..4j+3 of row r (zero past KW), else tap j's 4 channels (CGP == 4); zero for a padded
// word or a channel past OC.
template <bool kOneChannel>
__device__ uint32_t weight_word(const QConvShape& s, const QFewTiling& t, const int8_t* d_w, int o,
                                int k) {
  if (o >= s.oc || k >= s.kh * t.kww) return 0;
  const int r = k / t.kww, j = k % t.kww;
  const int8_t* wr = d_w + (int64_t(o) * s.kh + r) * s.kw * s.cgp;
  if constexpr (kOneChannel) {
    uint32_t word = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b)
      if (j * 4 + b < s.kw) word |= byte_at(__ldg(wr + (j * 4 + b) * s.cgp), b);
    return word;
  } else {
    return __ldg(reinterpret_cast<const unsigned*>(wr + j * s.cgp));
  }
}

// Whether float pair (v, e) wins over (best, best_e): the larger value, or the same value at an
// earlier window element (the twin keeps the first maximum).
__device__ __forceinline__ bool wins(float v, int e, float best, int best_e) {
  return v > best || (v == best && e < best_e);
}

// Thread mapping: block (image * tiles + tile, channel chunk) owns the t.tph x t.tpw pooled
// outputs of its tile and t.ocb output channels, as the dp4a kernel's; warp w owns mma tiles
// w, w + kWarps, ... of the block's window slots (16 rows each) by all its kNT 8-channel column
// tiles (n_tiles of them real). A lane (g, t) accumulates rows g and g + 8 (slots 2g, 2g + 1)
// and channels 2t, 2t + 1 of each column tile; after the window reduction the lanes holding a
// window's first slot, even t, write 4 channels of it as one word (int8), or each lane its 2
// channels (float). Without a pool every lane writes one word: rows g and g + 8 are two outputs,
// and lanes t, t ^ 1 swap halves. Int8 outputs: channels OC..stride-1 written as zero; float
// outputs: stride == OC.
template <class T, int kNT, bool kOneChannel, bool kPaired, class Input>
__global__ void __launch_bounds__(kThreads,
                                  (min_blocks_per_sm<T, kNT, kOneChannel, kPaired, Input>()))
    qconv_few_channels_mma(QConvShape s, QFewMmaTiling m, Input in, const int8_t* __restrict__ d_w,
                           const float* __restrict__ d_mult, const float* __restrict__ d_add,
                           bool relu, int stride, T* __restrict__ d_y) {
  ptx::griddep_enter();
  const QFewTiling& t = m.few;
  extern __shared__ uint4 smem[];
  uint2* w_s = reinterpret_cast<uint2*>(smem);  // (k_steps, n_tiles, 32 lanes) B fragments
  int2* koff_s = reinterpret_cast<int2*>(w_s + m.k_steps * m.n_tiles * 32);  // (k_steps, 4)
  int2* slot_s = koff_s + m.k_steps * 4;                                     // (m_tiles * 16)
  float* mult_s = reinterpret_cast<float*>(slot_s + m.m_tiles * 16);         // (OCB)
  float* add_s = mult_s + t.ocb;                                             // (OCB)
  unsigned* x_s = reinterpret_cast<unsigned*>(add_s + t.ocb);                // (in_rows, row_words)
  const int tiles = t.tiles_h * t.tiles_w;
  const int img = int(blockIdx.x / unsigned(tiles));
  const int tile = int(blockIdx.x % unsigned(tiles));
  const int py0 = tile / t.tiles_w * t.tph, px0 = tile % t.tiles_w * t.tpw;
  const int o0 = int(blockIdx.y) * t.ocb;
  const int cy0 = py0 * s.pool_sh - s.pool_ph, cx0 = px0 * s.pool_sw - s.pool_pw;
  const int iy0 = cy0 * s.stride_h - s.pad_h, ix0 = cx0 * s.stride_w - s.pad_w;

  // B fragments: lane (g, t) of column tile nt, k step ks holds words 8ks + t and 8ks + t + 4 of
  // channel o0 + 8nt + g.
  const int b_frags = m.k_steps * m.n_tiles * 32;
  for (int i = int(threadIdx.x); i < b_frags; i += kThreads) {
    const int lane = i % 32, nt = i / 32 % m.n_tiles, ks = i / 32 / m.n_tiles;
    const int o = o0 + nt * 8 + lane / 4, k = ks * 8 + lane % 4;
    w_s[i] = make_uint2(weight_word<kOneChannel>(s, t, d_w, o, k),
                        weight_word<kOneChannel>(s, t, d_w, o, k + 4));
  }
  // Where kernel word k = (r, j) sits in the input tile relative to its conv output's word; a
  // padded word reads the output's own word (its weights are zero).
  const int k_words = s.kh * t.kww;
  for (int i = int(threadIdx.x); i < m.k_steps * 4; i += kThreads) {
    const int k = i / 4 * 8 + i % 4;
    const auto offset = [&](int kk) {
      return kk < k_words ? kk / t.kww * m.row_words + kk % t.kww * t.taps_per_word : 0;
    };
    koff_s[i] = make_int2(offset(k), offset(k + 4));
  }
  // Entry i: row i % 16 / 2 + 8 (i % 2) of mma tile i / 16, which holds window slot i (the
  // general loop) or slot e of window wi (paired, below): its conv output's word in the tile (0
  // for a padded slot or one outside the conv output: it reads real words, its result is
  // dropped), and 2 * its pooled output's index in the image's (PH, PW) plane (-1 outside it) +
  // whether its conv output exists (padded pool positions never win). Once a block, so that the
  // tiles' loops have no divisions.
  const int window = s.pool_kh * s.pool_kw, tile_windows = t.tph * t.tpw;
  const int slot_mask = m.slots - 1;
  for (int i = int(threadIdx.x); i < m.m_tiles * 16; i += kThreads) {
    int wi = i >> m.slot_shift, e = i & slot_mask;
    if constexpr (kPaired) wi = 8 * (i / 32) + i % 16 / 2, e = 2 * (i / 16 % 2) + i % 2;
    int base = 0, widx = -1;
    bool ok = false;
    if (wi < tile_windows) {
      const int py = py0 + wi / t.tpw, px = px0 + wi % t.tpw;
      if (py < t.ph && px < t.pw) widx = py * t.pw + px;
      if (e < window) {
        const int cy = py * s.pool_sh - s.pool_ph + e / s.pool_kw;
        const int cx = px * s.pool_sw - s.pool_pw + e % s.pool_kw;
        ok = cy >= 0 && cy < t.oh && cx >= 0 && cx < t.ow;
        if (ok) base = (cy - cy0) * s.stride_h * m.row_words + (cx - cx0) * s.stride_w;
      }
    }
    slot_s[i] = make_int2(base, 2 * widx + int(ok));
  }
  // Channels past OC: mult = add = 0, so their int8 outputs are 0 (+-0 rounds to 0).
  for (int i = int(threadIdx.x); i < t.ocb; i += kThreads) {
    const bool real = o0 + i < s.oc;
    mult_s[i] = real ? __ldg(d_mult + o0 + i) : 0.f;
    add_s[i] = real ? __ldg(d_add + o0 + i) : 0.f;
  }
  if constexpr (kOneChannel) {
    // Words 4q..4q+3 of a row (word j: pixels j..j+3) from its pixels 4q..4q+7, loaded together
    // as two words: funnel shifts of those, no staged bytes and no second barrier.
    const int groups = m.word_groups;
    for (int i = int(threadIdx.x); i < t.in_rows * groups; i += kThreads) {
      const int row = i / groups, j0 = 4 * (i % groups);
      const uint32_t lo = in.row4(s, img, iy0 + row, ix0 + j0);
      const uint32_t hi = in.row4(s, img, iy0 + row, ix0 + j0 + 4);
      unsigned* xr = x_s + row * m.row_words + j0;
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (j0 + k < t.in_words) xr[k] = __funnelshift_r(lo, hi, 8 * k);
    }
  } else {
    for (int i = int(threadIdx.x); i < t.in_rows * t.in_words; i += kThreads) {
      const int row = i / t.in_words, j = i % t.in_words;
      x_s[row * m.row_words + j] = in.word4(s, img, iy0 + row, ix0 + j);
    }
  }
  __syncthreads();

  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int g = lane / 4, tq = lane % 4;
  // Slot i's pooled output and whether its conv output exists, read after the sums (volatile:
  // not kept in registers through them, where the 8-column-tile variants would spill).
  const auto slot_info = [&](int i) {
    return reinterpret_cast<const volatile int*>(slot_s + i)[1];
  };
  const auto output_of = [&](int i) -> int64_t {
    const int widx = slot_info(i) >> 1;
    return widx < 0 ? -1 : (int64_t(img) * t.ph * t.pw + widx) * stride;
  };
  if constexpr (kPaired) {
    // 2x2 windows (4 slots), int8 outputs, up to 4 column tiles: a warp takes mma tiles 2p and
    // 2p + 1 together; lane (g, t) holds rows g and g + 8 of both, which are the 4 slots of
    // window 8p + g (entries 32p + 2g, +1 of tile 2p, +16, +17 of tile 2p + 1). The window's
    // maximum needs no shuffle and every lane has a window of its own: half the epilogues of the
    // general loop below, and each B fragment load feeds two mma.
    for (int p = warp; 2 * p < m.m_tiles; p += kWarps) {
      const int i0 = 32 * p + 2 * g;
      const int base[4] = {slot_s[i0].x, slot_s[i0 + 1].x, slot_s[i0 + 16].x, slot_s[i0 + 17].x};
      int acc[2][kNT][4];
#pragma unroll
      for (int u = 0; u < 2; ++u)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
          for (int q = 0; q < 4; ++q) acc[u][nt][q] = 0;
      for (int ks = 0; ks < m.k_steps; ++ks) {
        const int2 ko = koff_s[ks * 4 + tq];
        const uint32_t a0 = x_s[base[0] + ko.x], a1 = x_s[base[1] + ko.x];
        const uint32_t a2 = x_s[base[0] + ko.y], a3 = x_s[base[1] + ko.y];
        const uint32_t b0 = x_s[base[2] + ko.x], b1 = x_s[base[3] + ko.x];
        const uint32_t b2 = x_s[base[2] + ko.y], b3 = x_s[base[3] + ko.y];
        const uint2* b = w_s + ks * m.n_tiles * 32 + lane;
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt)
          if (nt < m.n_tiles) {
            const uint2 bf = b[nt * 32];
            mma_s8(acc[0][nt], a0, a1, a2, a3, bf);
            mma_s8(acc[1][nt], b0, b1, b2, b3, bf);
          }
      }
      const int64_t out = output_of(i0);
      const bool ok[4] = {(slot_info(i0) & 1) != 0, (slot_info(i0 + 1) & 1) != 0,
                          (slot_info(i0 + 16) & 1) != 0, (slot_info(i0 + 17) & 1) != 0};
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        if (nt >= m.n_tiles) break;
        const int oo = nt * 8 + 2 * tq;
        const float2 mu = *reinterpret_cast<const float2*>(mult_s + oo);
        const float2 ad = *reinterpret_cast<const float2*>(add_s + oo);
        uint32_t half = 0;
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float mult = c ? mu.y : mu.x;
          // The largest sum, or for mult < 0 the smallest (~ reverses the order of int32).
          const int flip = mult < 0.f ? -1 : 0;
          int best = INT_MIN;
#pragma unroll
          for (int e = 0; e < 4; ++e)
            best = max(best, ok[e] ? acc[e / 2][nt][2 * (e % 2) + c] ^ flip : INT_MIN);
          half |= byte_at(qepilogue::value<int8_t>(best ^ flip, mult, c ? ad.y : ad.x, relu), c);
        }
        // Lanes t and t ^ 1 hold channels 2t, 2t + 1 of the same window: even t writes 4.
        const uint32_t other = __shfl_xor_sync(kFullMask, half, 1);
        const int c4 = o0 + oo;
        if ((tq & 1) == 0 && out >= 0 && c4 < stride)
          *reinterpret_cast<unsigned*>(d_y + out + c4) = half | other << 16;
      }
      if (tq == 0 && out >= 0 && blockIdx.y + 1 == gridDim.y)
        for (int c4 = o0 + t.ocb; c4 < stride; c4 += 4)
          *reinterpret_cast<unsigned*>(d_y + out + c4) = 0u;
    }
  }
  // The general loop: any window, float outputs, 8 column tiles (none of it when paired).
  for (int mt = warp; !kPaired && mt < m.m_tiles; mt += kWarps) {
    // Rows g and g + 8: slots 2g and 2g + 1 of the tile.
    const int base[2] = {slot_s[16 * mt + 2 * g].x, slot_s[16 * mt + 2 * g + 1].x};
    int acc[kNT][4];
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int q = 0; q < 4; ++q) acc[nt][q] = 0;
    for (int ks = 0; ks < m.k_steps; ++ks) {
      const int2 ko = koff_s[ks * 4 + tq];
      const uint32_t a0 = x_s[base[0] + ko.x], a1 = x_s[base[1] + ko.x];
      const uint32_t a2 = x_s[base[0] + ko.y], a3 = x_s[base[1] + ko.y];
      const uint2* b = w_s + ks * m.n_tiles * 32 + lane;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
        if (nt < m.n_tiles) mma_s8(acc[nt], a0, a1, a2, a3, b[nt * 32]);
    }

    if (m.slots == 1) {
      // No pool: rows g and g + 8 are outputs 2g and 2g + 1 of the tile.
      if constexpr (sizeof(T) == 1) {
        // Lane t writes output 2g + t % 2's channels 4 (t / 2)..+3: it keeps its own half of that
        // word and takes the other from lane t ^ 1.
        const int64_t out = output_of(16 * mt + 2 * g + (tq & 1));
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
          if (nt >= m.n_tiles) break;
          const int oo = nt * 8 + 2 * tq;
          const float2 mu = *reinterpret_cast<const float2*>(mult_s + oo);
          const float2 ad = *reinterpret_cast<const float2*>(add_s + oo);
          uint32_t half[2];
#pragma unroll
          for (int h = 0; h < 2; ++h)
            half[h] = byte_at(qepilogue::value<int8_t>(acc[nt][2 * h], mu.x, ad.x, relu), 0) |
                      byte_at(qepilogue::value<int8_t>(acc[nt][2 * h + 1], mu.y, ad.y, relu), 1);
          const uint32_t other = __shfl_xor_sync(kFullMask, (tq & 1) ? half[0] : half[1], 1);
          const uint32_t word = (tq & 1) ? other | half[1] << 16 : half[0] | other << 16;
          const int c4 = o0 + nt * 8 + 4 * (tq >> 1);
          if (out >= 0 && c4 < stride) *reinterpret_cast<unsigned*>(d_y + out + c4) = word;
        }
        if (out >= 0 && tq < 2 && blockIdx.y + 1 == gridDim.y)
          for (int c4 = o0 + t.ocb; c4 < stride; c4 += 4)
            *reinterpret_cast<unsigned*>(d_y + out + c4) = 0u;
      } else {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t out = output_of(16 * mt + 2 * g + h);
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt) {
            if (nt >= m.n_tiles) break;
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              const int oo = nt * 8 + 2 * tq + c;
              float v = qepilogue::value<float>(acc[nt][2 * h + c], mult_s[oo], add_s[oo], relu);
              v = v > lowest<float>() ? v : lowest<float>();  // the twin's max from lowest
              if (out >= 0 && o0 + oo < s.oc) d_y[out + o0 + oo] = v;
            }
          }
        }
      }
      continue;
    }

    // Pooled: a window's slots are rows g, g + 8 of lanes g .. g + slots / 2 - 1 (same t).
    const int e0 = (2 * g) & slot_mask;  // the window element of row g (row g + 8: e0 + 1)
    const int64_t out = output_of(16 * mt + 2 * g);
    const bool ok[2] = {(slot_info(16 * mt + 2 * g) & 1) != 0,
                        (slot_info(16 * mt + 2 * g + 1) & 1) != 0};
    const bool first = e0 == 0;  // the lanes holding a window's first slot write it
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      if (nt >= m.n_tiles) break;
      const int oo = nt * 8 + 2 * tq;
      const float2 mu = *reinterpret_cast<const float2*>(mult_s + oo);
      const float2 ad = *reinterpret_cast<const float2*>(add_s + oo);
      if constexpr (sizeof(T) == 1) {
        uint32_t half = 0;
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float mult = c ? mu.y : mu.x;
          // The largest sum, or for mult < 0 the smallest (~ reverses the order of int32).
          const int flip = mult < 0.f ? -1 : 0;
          int best =
              max(ok[0] ? acc[nt][c] ^ flip : INT_MIN, ok[1] ? acc[nt][2 + c] ^ flip : INT_MIN);
          for (int d = 4; d < 2 * m.slots; d <<= 1)
            best = max(best, __shfl_xor_sync(kFullMask, best, d));
          half |= byte_at(qepilogue::value<int8_t>(best ^ flip, mult, c ? ad.y : ad.x, relu), c);
        }
        const uint32_t other = __shfl_xor_sync(kFullMask, half, 1);
        const int c4 = o0 + oo;
        if (first && (tq & 1) == 0 && out >= 0 && c4 < stride)
          *reinterpret_cast<unsigned*>(d_y + out + c4) = half | other << 16;
      } else {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float mult = c ? mu.y : mu.x, add = c ? ad.y : ad.x;
          // Absent slots: lowest at an element past every real one, so they never win.
          float best = lowest<float>();
          int best_e = INT_MAX;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if (!ok[h]) continue;
            float v = qepilogue::value<float>(acc[nt][2 * h + c], mult, add, relu);
            v = v > lowest<float>() ? v : lowest<float>();  // NaN and -inf never win in the twin
            if (wins(v, e0 + h, best, best_e)) best = v, best_e = e0 + h;
          }
          for (int d = 4; d < 2 * m.slots; d <<= 1) {
            const float v = __shfl_xor_sync(kFullMask, best, d);
            const int e = __shfl_xor_sync(kFullMask, best_e, d);
            if (wins(v, e, best, best_e)) best = v, best_e = e;
          }
          if (first && out >= 0 && o0 + oo + c < s.oc) d_y[out + o0 + oo + c] = best;
        }
      }
    }
    if constexpr (sizeof(T) == 1)
      if (first && tq == 0 && out >= 0 && blockIdx.y + 1 == gridDim.y)
        for (int c4 = o0 + t.ocb; c4 < stride; c4 += 4)
          *reinterpret_cast<unsigned*>(d_y + out + c4) = 0u;
  }
}

template <class T, int kNT, bool kOneChannel, bool kPaired, class Input>
void launch_with(const QConvShape& s, const QFewMmaTiling& m, const Input& in, const int8_t* d_w,
                 const QEpilogue& ep, int stride, T* d_y, cudaStream_t stream) {
  const QFewTiling& t = m.few;
  const dim3 grid(unsigned(int64_t(s.n) * t.tiles_h * t.tiles_w), unsigned(t.chunks));
  qconv_few_channels_mma<T, kNT, kOneChannel, kPaired, Input>
      <<<grid, kThreads, size_t(m.smem_bytes), stream>>>(s, m, in, d_w, ep.mult, ep.add, ep.relu,
                                                         stride, d_y);
  CNN_CUDA_CHECK(cudaGetLastError());
}

template <class T, int kNT, bool kPaired, class Input>
void launch_channels(const QConvShape& s, const QFewMmaTiling& m, const Input& in,
                     const int8_t* d_w, const QEpilogue& ep, int stride, T* d_y,
                     cudaStream_t stream) {
  if (s.c == 1)
    launch_with<T, kNT, true, kPaired>(s, m, in, d_w, ep, stride, d_y, stream);
  else
    launch_with<T, kNT, false, kPaired>(s, m, in, d_w, ep, stride, d_y, stream);
}

// The shape was checked by qconv_few_channels_mma_supported. Column tiles: up to 4 (32 channels
// a block, LeNet's conv1) or up to 8 (64); the unused ones of a block are skipped.
template <class T, class Input>
void launch(const QConvShape& s, const Input& in, const int8_t* d_w, const QEpilogue& ep,
            int stride, T* d_y, cudaStream_t stream) {
  const QFewMmaTiling m = qconv_few_channels_mma_tiling(s);
  if constexpr (sizeof(T) == 1) {
    if (m.slots == 4 && m.n_tiles <= 4)  // 2x2 windows (LeNet's conv1): tile pairs
      return launch_channels<T, 4, true>(s, m, in, d_w, ep, stride, d_y, stream);
  }
  if (m.n_tiles <= 4)
    launch_channels<T, 4, false>(s, m, in, d_w, ep, stride, d_y, stream);
  else
    launch_channels<T, 8, false>(s, m, in, d_w, ep, stride, d_y, stream);
}

}  // namespace

void qconv_few_channels_mma_forward_cuda(const QConvShape& s, const int8_t* d_x, const int8_t* d_w,
                                         const QEpilogue& ep, int8_t* d_y, cudaStream_t stream) {
  launch(s, Int8Nhwc{d_x}, d_w, ep, s.ocp, d_y, stream);
}

void qconv_few_channels_mma_forward_float_cuda(const QConvShape& s, const int8_t* d_x,
                                               const int8_t* d_w, const QEpilogue& ep, float* d_y,
                                               cudaStream_t stream) {
  launch(s, Int8Nhwc{d_x}, d_w, ep, s.oc, d_y, stream);
}

void qconv_few_channels_mma_forward_quantize_cuda(const QConvShape& s, const float* d_x,
                                                  float inv_scale, const int8_t* d_w,
                                                  const QEpilogue& ep, int8_t* d_y,
                                                  cudaStream_t stream) {
  launch(s, FloatNchw{d_x, inv_scale}, d_w, ep, s.ocp, d_y, stream);
}

}  // namespace cnn
