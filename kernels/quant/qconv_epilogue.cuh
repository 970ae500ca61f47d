#pragma once
// The int8 epilogue of qconv.h as every CUDA kernel of kernels/quant computes it, in one place so
// that the direct, tensor-core, few-channel and linear kernels cannot drift apart (their outputs
// must equal the CPU twin's bit for bit): v = fma(float(acc), mult, add) with one rounding, ReLU,
// then round half to even after the clamp for an int8 output, v itself for a float one; and the
// starting value of a max-pool. The intrinsics are the ones whose rounding the CPU twin
// reproduces (__int2float_rn, __fmaf_rn, __float2int_rn).
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

namespace cnn::qepilogue {

// Clamp to [-127, 127], then round half to even (quantize.h's rule).
__device__ __forceinline__ int8_t requantize(float v) {
  v = fminf(fmaxf(v, -127.f), 127.f);
  return static_cast<int8_t>(__float2int_rn(v));
}

// An int32 sum through the epilogue: int8 (requantized) or float (dequantized) T.
template <class T>
__device__ __forceinline__ T value(int32_t acc, float mult, float add, bool relu) {
  float v = __fmaf_rn(__int2float_rn(acc), mult, add);
  if (relu) v = v > 0.f ? v : 0.f;
  if constexpr (sizeof(T) == 1)
    return requantize(v);
  else
    return v;
}

// Below every value the epilogue gives: a max-pool's starting point.
template <class T>
__device__ __forceinline__ T lowest();
template <>
__device__ __forceinline__ int8_t lowest<int8_t>() {
  return -128;
}
template <>
__device__ __forceinline__ float lowest<float>() {
  return -FLT_MAX;
}

}  // namespace cnn::qepilogue
