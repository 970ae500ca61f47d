#pragma once
// What the few-channel int8 convolutions (the dp4a kernel, qconv_few_channels.cu, and the
// tensor-core one, qconv_few_channels_mma.cu) stage from their input, in one place so that the
// two read the same bytes and quantize a float input with the same arithmetic (quantize.h's: one
// IEEE multiply by inv_scale, clamp, round half to even).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/quant/qconv.h"
#include "kernels/quant/qconv_epilogue.cuh"

namespace cnn::qfew {

__device__ __forceinline__ uint32_t byte_at(int8_t v, int k) {
  return uint32_t(uint8_t(v)) << (8 * k);
}

// From an int8 NHWC input: with one channel, pixel (iy, ix)'s byte (a word of 4 neighbouring
// pixels is then assembled in shared memory), else the 4 channels of the pixel as one word; zero
// outside the image (the conv's zero padding).
struct Int8Nhwc {
  const int8_t* x;  // (N, H, W, CP), 4-byte aligned
  __device__ uint32_t byte0(const QConvShape& s, int img, int iy, int ix) const {
    if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) return 0;
    return uint8_t(__ldg(x + ((int64_t(img) * s.h + iy) * s.w + ix) * s.cp));
  }
  // With one channel: pixels ix..ix+3 of row iy as one word (byte0's bytes), the four loads
  // issued together.
  __device__ uint32_t row4(const QConvShape& s, int img, int iy, int ix) const {
    if (iy < 0 || iy >= s.h) return 0;
    const int8_t* xr = x + (int64_t(img) * s.h + iy) * s.w * s.cp;
    uint32_t word = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int c = ix + b;
      const bool in = c >= 0 && c < s.w;
      word |= byte_at(in ? __ldg(xr + int64_t(in ? c : 0) * s.cp) : int8_t(0), b);
    }
    return word;
  }
  __device__ uint32_t word4(const QConvShape& s, int img, int iy, int ix) const {
    // Channels C..CP-1 are zero in x's layout (and their weights are zero anyway).
    if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) return 0;
    return __ldg(
        reinterpret_cast<const unsigned*>(x + ((int64_t(img) * s.h + iy) * s.w + ix) * s.cp));
  }
};

// The network's float input, quantized on the way in exactly as quantize_kernel (qconv.cu) does;
// staged as Int8Nhwc's.
struct FloatNchw {
  const float* x;  // (N, C, H, W)
  float inv_scale;
  __device__ uint32_t quantized(float v) const {
    return uint8_t(qepilogue::requantize(__fmul_rn(v, inv_scale)));
  }
  __device__ uint32_t byte0(const QConvShape& s, int img, int iy, int ix) const {
    if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) return 0;
    return quantized(__ldg(x + (int64_t(img) * s.c * s.h + iy) * s.w + ix));
  }
  __device__ uint32_t row4(const QConvShape& s, int img, int iy, int ix) const {
    if (iy < 0 || iy >= s.h) return 0;
    const float* xr = x + (int64_t(img) * s.c * s.h + iy) * s.w;
    float v[4];
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int c = ix + b;
      v[b] = c >= 0 && c < s.w ? __ldg(xr + c) : 0.f;
    }
    uint32_t word = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      const int c = ix + b;  // outside the image: 0, not quantized(0.f) (NaN for an inf scale)
      if (c >= 0 && c < s.w) word |= quantized(v[b]) << (8 * b);
    }
    return word;
  }
  __device__ uint32_t word4(const QConvShape& s, int img, int iy, int ix) const {
    if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) return 0;
    const int64_t plane = int64_t(s.h) * s.w;
    const float* xi = x + int64_t(img) * s.c * plane + int64_t(iy) * s.w + ix;
    uint32_t word = 0;
    for (int c = 0; c < s.c; ++c) word |= byte_at(int8_t(quantized(__ldg(xi + c * plane))), c);
    return word;
  }
};

}  // namespace cnn::qfew
