// Int8 convolution for inputs of at most 4 channels (qconv_few_channels.h): a block stages its
// tile of the input and its output channels' weights in shared memory as 4-byte words, then each
// thread accumulates the conv outputs of one pool window row for 8 output channels with one dp4a
// per (word, channel), and runs the epilogue of qconv.h with the intrinsics whose rounding the
// CPU twin reproduces (__int2float_rn, __fmaf_rn, __float2int_rn). The sums are exact int32, so
// the outputs equal the twin's bit for bit.
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/quant/qconv_epilogue.cuh"
#include "kernels/quant/qconv_few_channels.h"
#include "kernels/quant/qconv_few_channels_cuda.h"
#include "kernels/quant/qconv_few_channels_staging.cuh"
#include "runtime/cuda_check.h"

namespace cnn {
namespace {

constexpr int kThreads = 256;
// Two blocks per SM: ptxas then keeps every variant spill-free (about 100 registers); asking for
// three caps them at 80 and spills.
constexpr int kMinBlocksPerSm = 2;
constexpr int kChannelsPerThread = 8;

using qepilogue::lowest;
using qfew::byte_at;
using qfew::FloatNchw;
using qfew::Int8Nhwc;

// Thread mapping: block (image * tiles + tile, channel chunk) owns t.tph x t.tpw pooled outputs
// and t.ocb output channels; a thread owns one item = (pooled output, 8 consecutive channels),
// the 8-channel group fastest so that a warp's stores are contiguous and its weight loads hit
// distinct banks. For each row of its pool window it accumulates the kPoolW conv outputs of that
// row at once (the window's columns share the weight loads), then keeps the window's maximum.
// Int8 outputs: channels OC..stride-1 written as zero; float outputs: stride == OC.
template <class T, int kPoolW, bool kOneChannel, class Input>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm)
    qconv_few_channels(QConvShape s, QFewTiling t, Input in, const int8_t* __restrict__ d_w,
                       const float* __restrict__ d_mult, const float* __restrict__ d_add, bool relu,
                       int stride, T* __restrict__ d_y) {
  ptx::griddep_enter();
  extern __shared__ uint4 smem[];  // 16-byte aligned: the weights are read as uint4
  unsigned* w_s = reinterpret_cast<unsigned*>(smem);                     // (KH, KWW, OCB)
  float* mult_s = reinterpret_cast<float*>(w_s + s.kh * t.kww * t.ocb);  // (OCB)
  float* add_s = mult_s + t.ocb;                                         // (OCB)
  unsigned* x_s = reinterpret_cast<unsigned*>(add_s + t.ocb);            // (in_rows, in_words)
  const int tiles = t.tiles_h * t.tiles_w;
  const int img = int(blockIdx.x / unsigned(tiles));
  const int tile = int(blockIdx.x % unsigned(tiles));
  const int py0 = tile / t.tiles_w * t.tph, px0 = tile % t.tiles_w * t.tpw;
  const int o0 = int(blockIdx.y) * t.ocb;
  const int cy0 = py0 * s.pool_sh - s.pool_ph, cx0 = px0 * s.pool_sw - s.pool_pw;
  const int iy0 = cy0 * s.stride_h - s.pad_h, ix0 = cx0 * s.stride_w - s.pad_w;

  // Weights (OC, KH, KW, CGP) -> words (KH, KWW, OCB): with one channel, 4 taps of a row per
  // word (zero past KW), else one tap's 4 channels (CGP == 4). Channels past OC are zero.
  const int w_words = s.kh * t.kww * t.ocb;
  for (int i = int(threadIdx.x); i < w_words; i += kThreads) {
    const int oo = i % t.ocb, j = i / t.ocb % t.kww, r = i / t.ocb / t.kww;
    const int o = o0 + oo;
    unsigned word = 0;
    if (o < s.oc) {
      const int8_t* wr = d_w + (int64_t(o) * s.kh + r) * s.kw * s.cgp;
      if constexpr (kOneChannel) {
        for (int k = 0; k < 4; ++k)
          if (j * 4 + k < s.kw) word |= byte_at(__ldg(wr + (j * 4 + k) * s.cgp), k);
      } else {
        word = __ldg(reinterpret_cast<const unsigned*>(wr + j * s.cgp));
      }
    }
    w_s[i] = word;
  }
  for (int i = int(threadIdx.x); i < t.ocb; i += kThreads) {
    const bool real = o0 + i < s.oc;
    mult_s[i] = real ? __ldg(d_mult + o0 + i) : 0.f;
    add_s[i] = real ? __ldg(d_add + o0 + i) : 0.f;
  }
  const int x_words = t.in_rows * t.in_words;
  if constexpr (kOneChannel) {
    // Word j of a row holds pixels j..j+3, so staging word by word would load every pixel four
    // times, one dependent load after another: the pixels go to shared memory once, coalesced
    // along the rows, and the words are assembled from there.
    uint8_t* xb_s = reinterpret_cast<uint8_t*>(x_s + x_words);  // (in_rows, in_words + 3)
    const int cols = t.in_words + 3;
    for (int i = int(threadIdx.x); i < t.in_rows * cols; i += kThreads)
      xb_s[i] = uint8_t(in.byte0(s, img, iy0 + i / cols, ix0 + i % cols));
    __syncthreads();
    for (int i = int(threadIdx.x); i < x_words; i += kThreads) {
      const uint8_t* b = xb_s + (i / t.in_words) * cols + i % t.in_words;
      x_s[i] = uint32_t(b[0]) | uint32_t(b[1]) << 8 | uint32_t(b[2]) << 16 | uint32_t(b[3]) << 24;
    }
  } else {
    for (int i = int(threadIdx.x); i < x_words; i += kThreads)
      x_s[i] = in.word4(s, img, iy0 + i / t.in_words, ix0 + i % t.in_words);
  }
  __syncthreads();

  const int groups8 = t.ocb / kChannelsPerThread;
  const int items = t.tph * t.tpw * groups8;
  for (int item = int(threadIdx.x); item < items; item += kThreads) {
    const int g = item % groups8, pos = item / groups8;
    const int py = py0 + pos / t.tpw, px = px0 + pos % t.tpw;
    if (py >= t.ph || px >= t.pw) continue;
    const int ob = o0 + g * kChannelsPerThread;
    T best[kChannelsPerThread];
#pragma unroll
    for (int q = 0; q < kChannelsPerThread; ++q) best[q] = lowest<T>();
    // The window's columns: word offsets in the tile's rows, and whether the conv output exists
    // (padded pool positions never win).
    int col[kPoolW];
    bool col_ok[kPoolW];
#pragma unroll
    for (int pc = 0; pc < kPoolW; ++pc) {
      const int cx = px * s.pool_sw - s.pool_pw + pc;
      col_ok[pc] = cx >= 0 && cx < t.ow;
      col[pc] = col_ok[pc] ? (cx - cx0) * s.stride_w : 0;
    }
    for (int pr = 0; pr < s.pool_kh; ++pr) {
      const int cy = py * s.pool_sh - s.pool_ph + pr;
      if (cy < 0 || cy >= t.oh) continue;
      const unsigned* xrow = x_s + (cy - cy0) * s.stride_h * t.in_words;
      int acc[kPoolW][kChannelsPerThread];
#pragma unroll
      for (int pc = 0; pc < kPoolW; ++pc)
#pragma unroll
        for (int q = 0; q < kChannelsPerThread; ++q) acc[pc][q] = 0;
      for (int r = 0; r < s.kh; ++r) {
        const unsigned* wr = w_s + r * t.kww * t.ocb + g * kChannelsPerThread;
        const unsigned* xr = xrow + r * t.in_words;
        for (int j = 0; j < t.kww; ++j) {
          const uint4 w0 = *reinterpret_cast<const uint4*>(wr + j * t.ocb);
          const uint4 w1 = *reinterpret_cast<const uint4*>(wr + j * t.ocb + 4);
          const int wv[kChannelsPerThread] = {int(w0.x), int(w0.y), int(w0.z), int(w0.w),
                                              int(w1.x), int(w1.y), int(w1.z), int(w1.w)};
#pragma unroll
          for (int pc = 0; pc < kPoolW; ++pc) {
            const int xv = int(xr[col[pc] + j * t.taps_per_word]);
#pragma unroll
            for (int q = 0; q < kChannelsPerThread; ++q) acc[pc][q] = __dp4a(xv, wv[q], acc[pc][q]);
          }
        }
      }
#pragma unroll
      for (int pc = 0; pc < kPoolW; ++pc) {
        if (!col_ok[pc]) continue;
#pragma unroll
        for (int q = 0; q < kChannelsPerThread; ++q) {
          const int oo = g * kChannelsPerThread + q;
          const T tv = qepilogue::value<T>(acc[pc][q], mult_s[oo], add_s[oo], relu);
          best[q] = tv > best[q] ? tv : best[q];
        }
      }
    }
    T* out = d_y + ((int64_t(img) * t.ph + py) * t.pw + px) * stride + ob;
    if constexpr (sizeof(T) == 1) {
      // Whole 4-byte words: stride and ob are multiples of 4.
#pragma unroll
      for (int k = 0; k < kChannelsPerThread / 4; ++k) {
        if (ob + 4 * k >= stride) break;
        unsigned word = 0;
#pragma unroll
        for (int u = 0; u < 4; ++u)
          if (ob + 4 * k + u < s.oc) word |= byte_at(best[4 * k + u], u);
        reinterpret_cast<unsigned*>(out)[k] = word;
      }
      // Channels past the last chunk (a stride wider than the chunks cover) are zero too: the
      // last chunk's last group writes them.
      if (g == groups8 - 1 && blockIdx.y + 1 == gridDim.y)
        for (int c4 = o0 + t.ocb; c4 < stride; c4 += 4)
          *reinterpret_cast<unsigned*>(out - ob + c4) = 0u;
    } else {
#pragma unroll
      for (int q = 0; q < kChannelsPerThread; ++q)
        if (ob + q < s.oc) out[q] = best[q];
    }
  }
}

template <class T, int kPoolW, bool kOneChannel, class Input>
void launch_with(const QConvShape& s, const QFewTiling& t, const Input& in, const int8_t* d_w,
                 const QEpilogue& ep, int stride, T* d_y, cudaStream_t stream) {
  const dim3 grid(unsigned(int64_t(s.n) * t.tiles_h * t.tiles_w), unsigned(t.chunks));
  qconv_few_channels<T, kPoolW, kOneChannel, Input>
      <<<grid, kThreads, size_t(t.smem_bytes), stream>>>(s, t, in, d_w, ep.mult, ep.add, ep.relu,
                                                         stride, d_y);
  CNN_CUDA_CHECK(cudaGetLastError());
}

template <class T, int kPoolW, class Input>
void launch_channels(const QConvShape& s, const QFewTiling& t, const Input& in, const int8_t* d_w,
                     const QEpilogue& ep, int stride, T* d_y, cudaStream_t stream) {
  if (s.c == 1)
    launch_with<T, kPoolW, true>(s, t, in, d_w, ep, stride, d_y, stream);
  else
    launch_with<T, kPoolW, false>(s, t, in, d_w, ep, stride, d_y, stream);
}

// The shape was checked by qconv_few_channels_supported (pool width 1..kQFewMaxPoolW).
template <class T, class Input>
void launch(const QConvShape& s, const Input& in, const int8_t* d_w, const QEpilogue& ep,
            int stride, T* d_y, cudaStream_t stream) {
  static_assert(kQFewMaxPoolW == 3, "one instantiation per pool width");
  const QFewTiling t = qconv_few_channels_tiling(s);
  if (s.pool_kw == 1)
    launch_channels<T, 1>(s, t, in, d_w, ep, stride, d_y, stream);
  else if (s.pool_kw == 2)
    launch_channels<T, 2>(s, t, in, d_w, ep, stride, d_y, stream);
  else
    launch_channels<T, 3>(s, t, in, d_w, ep, stride, d_y, stream);
}

}  // namespace

void qconv_few_channels_forward_cuda(const QConvShape& s, const int8_t* d_x, const int8_t* d_w,
                                     const QEpilogue& ep, int8_t* d_y, cudaStream_t stream) {
  launch(s, Int8Nhwc{d_x}, d_w, ep, s.ocp, d_y, stream);
}

void qconv_few_channels_forward_float_cuda(const QConvShape& s, const int8_t* d_x,
                                           const int8_t* d_w, const QEpilogue& ep, float* d_y,
                                           cudaStream_t stream) {
  launch(s, Int8Nhwc{d_x}, d_w, ep, s.oc, d_y, stream);
}

void qconv_few_channels_forward_quantize_cuda(const QConvShape& s, const float* d_x,
                                              float inv_scale, const int8_t* d_w,
                                              const QEpilogue& ep, int8_t* d_y,
                                              cudaStream_t stream) {
  launch(s, FloatNchw{d_x, inv_scale}, d_w, ep, s.ocp, d_y, stream);
}

}  // namespace cnn
