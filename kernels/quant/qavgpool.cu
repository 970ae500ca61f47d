// Int8 average pool on the GPU (qavgpool.h): an exact int32 window sum, then the intrinsics whose
// rounding the CPU twin reproduces (__int2float_rn, __fmul_rn, __float2int_rn), so both agree bit
// for bit. Memory bound and small next to the convs: one thread per output element, consecutive
// threads on consecutive channels so the int8 loads of a warp are contiguous.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/quant/qconv_cuda.h"
#include "runtime/cuda_check.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

constexpr int kThreads = 256;

// Thread mapping: one thread per element (img, r, q, c) of y (N, OH, OW, CP), c fastest;
// channels C..CP-1 are written as zero.
// (oh, ow: s.oh(), s.ow(), computed on the host: the shape's methods are host code.)
__global__ void qavgpool_kernel(QAvgPoolShape s, int oh, int ow, int64_t total,
                                const int8_t* __restrict__ d_x, float mult, bool relu,
                                int8_t* __restrict__ d_y) {
  ptx::griddep_enter();
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= total) return;
  const int c = int(idx % s.cp);
  int64_t rest = idx / s.cp;
  const int q = int(rest % ow);
  rest /= ow;
  const int r = int(rest % oh);
  const int64_t img = rest / oh;
  if (c >= s.c) {
    d_y[idx] = 0;
    return;
  }
  int32_t acc = 0;
  for (int dr = 0; dr < s.kh; ++dr) {
    const int ir = r * s.stride_h - s.pad_h + dr;
    if (ir < 0 || ir >= s.h) continue;  // padded zeros
    for (int dq = 0; dq < s.kw; ++dq) {
      const int iq = q * s.stride_w - s.pad_w + dq;
      if (iq < 0 || iq >= s.w) continue;
      acc += d_x[((img * s.h + ir) * s.w + iq) * s.cp + c];
    }
  }
  float v = __fmul_rn(__int2float_rn(acc), mult);
  if (relu) v = v > 0.f ? v : 0.f;
  v = fminf(fmaxf(v, -127.f), 127.f);
  d_y[idx] = static_cast<int8_t>(__float2int_rn(v));
}

}  // namespace

void qavgpool_forward_cuda(const QAvgPoolShape& s, const int8_t* d_x, float mult, bool relu,
                           int8_t* d_y, cudaStream_t stream) {
  const int64_t total = int64_t(s.n) * s.oh() * s.ow() * s.cp;
  if (total == 0) return;
  qavgpool_kernel<<<unsigned(ceil_div<int64_t>(total, kThreads)), kThreads, 0, stream>>>(
      s, s.oh(), s.ow(), total, d_x, mult, relu, d_y);
  CNN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cnn
