// Max pooling on the GPU. Forward: one thread per output. Backward: gather form (one thread per
// input-gradient element), so overlapping windows need no atomics and the sum order is fixed.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda_check.h"
#include "kernels/math_util.h"
#include "kernels/maxpool_cuda.h"

namespace cnn {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;  // grid-stride beyond this; any count works

// Thread mapping: each thread owns output elements o = (n, c, i, j) flattened, grid-stride;
// it writes y[o] and argmax[o] from the window of input plane (n, c).
__global__ void maxpool_forward_naive(MaxPoolShape s, int oh, int ow, int64_t total,
                                      const float* __restrict__ d_x, float* __restrict__ d_y,
                                      int32_t* __restrict__ d_argmax) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += stride) {
    const int j = int(o % ow);
    const int i = int((o / ow) % oh);
    const int64_t p = o / (int64_t(ow) * oh);
    const float* xp = d_x + p * s.h * s.w;  // (H, W)
    const int h0 = i * s.stride_h - s.pad_h, w0 = j * s.stride_w - s.pad_w;
    const int a_lo = max(0, -h0), a_hi = min(s.kh, s.h - h0);  // rows of the window in range
    const int b_lo = max(0, -w0), b_hi = min(s.kw, s.w - w0);
    float best = 0.f;
    int32_t best_idx = -1;  // padding never wins: the first real element is always taken
    for (int a = a_lo; a < a_hi; ++a) {
      for (int b = b_lo; b < b_hi; ++b) {
        const int idx = (h0 + a) * s.w + (w0 + b);
        const float v = __ldg(xp + idx);
        // Strictly greater keeps the first of equal maxima; the first NaN wins and stays.
        if (best_idx < 0 || (!isnan(best) && (v > best || isnan(v)))) {
          best = v;
          best_idx = idx;
        }
      }
    }
    d_y[o] = best;
    d_argmax[o] = best_idx;
  }
}

// Thread mapping: each thread owns input-gradient elements e = (n, c, ih, iw) flattened,
// grid-stride; it visits the windows that contain (ih, iw) in row-major order and sums the dy
// of those whose argmax is (ih, iw).
__global__ void maxpool_backward_gather(MaxPoolShape s, int oh, int ow, int64_t total,
                                        const float* __restrict__ d_dy,
                                        const int32_t* __restrict__ d_argmax,
                                        float* __restrict__ d_dx) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int iw = int(e % s.w);
    const int ih = int((e / s.w) % s.h);
    const int64_t p = e / (int64_t(s.w) * s.h);
    // Window i covers rows [i*stride - pad, i*stride - pad + kh).
    const int th = ih + s.pad_h - s.kh + 1, tw = iw + s.pad_w - s.kw + 1;
    const int i_lo = th <= 0 ? 0 : (th + s.stride_h - 1) / s.stride_h;
    const int j_lo = tw <= 0 ? 0 : (tw + s.stride_w - 1) / s.stride_w;
    const int i_hi = min((ih + s.pad_h) / s.stride_h, oh - 1);
    const int j_hi = min((iw + s.pad_w) / s.stride_w, ow - 1);
    const int32_t me = ih * s.w + iw;
    const int64_t base = p * oh * ow;
    float acc = 0.f;
    for (int i = i_lo; i <= i_hi; ++i) {
      for (int j = j_lo; j <= j_hi; ++j) {
        const int64_t o = base + int64_t(i) * ow + j;
        if (__ldg(d_argmax + o) == me) acc += __ldg(d_dy + o);
      }
    }
    d_dx[e] = acc;
  }
}

unsigned grid_for(int64_t work) {
  return static_cast<unsigned>(
      std::clamp<int64_t>(ceil_div<int64_t>(work, kThreads), 1, kMaxBlocks));
}

}  // namespace

void maxpool_forward_cuda(const MaxPoolShape& s, const float* d_x, float* d_y, int32_t* d_argmax,
                          cudaStream_t stream) {
  const int oh = s.oh(), ow = s.ow();
  const int64_t total = int64_t(s.n) * s.c * oh * ow;  // outputs (N, C, OH, OW)
  maxpool_forward_naive<<<grid_for(total), kThreads, 0, stream>>>(s, oh, ow, total, d_x, d_y,
                                                                  d_argmax);
  CNN_LAUNCH_CHECK("maxpool_forward_naive");
}

void maxpool_backward_cuda(const MaxPoolShape& s, const float* d_dy, const int32_t* d_argmax,
                           float* d_dx, cudaStream_t stream) {
  const int64_t total = int64_t(s.n) * s.c * s.h * s.w;  // input gradients (N, C, H, W)
  maxpool_backward_gather<<<grid_for(total), kThreads, 0, stream>>>(s, s.oh(), s.ow(), total, d_dy,
                                                                    d_argmax, d_dx);
  CNN_LAUNCH_CHECK("maxpool_backward_gather");
}

}  // namespace cnn
