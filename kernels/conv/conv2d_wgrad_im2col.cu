// The weight gradient as one GEMM on explicit copies (conv2d_wgrad_im2col.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/conv/conv2d_gemm_copies.h"
#include "kernels/conv/conv2d_wgrad_im2col.h"
#include "kernels/conv/staged_scratch.h"
#include "kernels/gemm/gemm_cuda.h"
#include "kernels/gemm/gemm_wgmma.h"
#include "runtime/cuda_check.h"
#include "runtime/error.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

constexpr int kCopyThreads = 256;
// Images a thread writes a row of per block: its setup (the tap's offset and bounds) amortized.
constexpr int kImagesPerThread = 8;

struct CopiesParams {
  const float* x;
  const float* dy;
  float* cols;
  float* dyk;
  int c, h, w, oc, kh, kw, sh, sw, ph, pw, ow;
  int n, ohw, khw, rows;  // rows: C*KH*KW + OC
  int imgs;               // images a pass of the block's threads covers: kCopyThreads / ohw
  int64_t ld;
};

// Block (bx, by): images [bx imgs kImagesPerThread, ...) of rows by, by + gridDim.y, ... (the
// first C*KH*KW rows are cols', the rest dyk's). Thread t keeps one output pixel p = t % ohw of
// image t / ohw of each pass, so its tap's offset and bounds are worked out once, not per float;
// consecutive threads write consecutive floats of a row.
__global__ void wgrad_im2col_copies_kernel(CopiesParams p) {
  ptx::griddep_enter();
  const int t = threadIdx.x, j = t / p.ohw, px = t - j * p.ohw;
  if (j >= p.imgs) return;
  const int oh = px / p.ow, ow = px - oh * p.ow;
  const int n0 = blockIdx.x * p.imgs * kImagesPerThread + j;
  const int n1 = min(p.n, int(blockIdx.x + 1) * p.imgs * kImagesPerThread);
  const int64_t chw = int64_t{p.c} * p.h * p.w;
  for (int r = blockIdx.y; r < p.rows; r += gridDim.y) {
    if (r < p.c * p.khw) {
      const int c = r / p.khw, tap = r - c * p.khw, kh = tap / p.kw, kw = tap - kh * p.kw;
      const int ih = oh * p.sh - p.ph + kh, iw = ow * p.sw - p.pw + kw;
      const bool in = ih >= 0 && ih < p.h && iw >= 0 && iw < p.w;
      const float* src = p.x + (int64_t{c} * p.h + (in ? ih : 0)) * p.w + (in ? iw : 0);
      float* dst = p.cols + r * p.ld + px;
      for (int n = n0; n < n1; n += p.imgs)
        dst[int64_t{n} * p.ohw] = in ? __ldg(src + n * chw) : 0.f;
    } else {
      const int oc = r - p.c * p.khw;
      const float* src = p.dy + int64_t{oc} * p.ohw + px;
      float* dst = p.dyk + oc * p.ld + px;
      const int64_t plane = int64_t{p.oc} * p.ohw;
      for (int n = n0; n < n1; n += p.imgs) dst[int64_t{n} * p.ohw] = __ldg(src + n * plane);
    }
  }
}

constexpr int kSumThreads = 256;

// db[oc] += the sum of dyk's row oc: one block a row, each thread a strided partial, then a tree
// in shared memory: the same order every run.
__global__ void wgrad_im2col_bias_kernel(const float* __restrict__ dyk, int64_t ld, int64_t k,
                                         int oc, float* __restrict__ db) {
  ptx::griddep_enter();
  __shared__ float part[kSumThreads];
  for (int r = blockIdx.x; r < oc; r += gridDim.x) {
    float sum = 0.f;
    for (int64_t i = threadIdx.x; i < k; i += kSumThreads) sum += dyk[r * ld + i];
    part[threadIdx.x] = sum;
    __syncthreads();
    for (int half = kSumThreads / 2; half > 0; half /= 2) {
      if (threadIdx.x < half) part[threadIdx.x] += part[threadIdx.x + half];
      __syncthreads();
    }
    if (threadIdx.x == 0) db[r] += part[0];
    __syncthreads();
  }
}

// The GEMM view of one call: dw (m = OC, n = C*KH*KW) += dyk (m, k) cols^T, k = N*OH*OW,
// both copies of row stride ld, and the scratch they and the GEMM's workspace take
// (carve_staged_scratch's parts).
struct Im2colPlan {
  int64_t m, n, k, ld;
  std::size_t cols_floats, dyk_floats, work_floats = 0;
};

Im2colPlan plan_of(const Conv2dShape& s) {
  Im2colPlan p;
  p.m = s.oc;
  p.n = int64_t{s.c} * s.kh * s.kw;
  p.k = int64_t{s.n} * s.oh() * s.ow();
  p.ld = conv2d_wgrad_im2col_ld(s);
  p.cols_floats = static_cast<std::size_t>(p.n * p.ld);
  p.dyk_floats = static_cast<std::size_t>(p.m * p.ld);
  return p;
}

// The plan with its GEMM workspace, for a call the refusal lets through (m, n, k fit an int).
Im2colPlan plan_with_work(const Conv2dShape& s, Precision precision) {
  Im2colPlan p = plan_of(s);
  p.work_floats = gemm_cuda_work_floats(int(p.m), int(p.n), int(p.k), precision);
  return p;
}

std::size_t scratch_floats_of(const Im2colPlan& p) {
  return round_up4(p.cols_floats) + round_up4(p.dyk_floats) + p.work_floats;
}

}  // namespace

std::string conv2d_wgrad_im2col_refusal(const Conv2dShape& s) {
  check_conv2d_shape_any(s);
  const Im2colPlan p = plan_of(s);
  return gemm_copies_refusal(
      s, "conv2d_backward_weight: the weight gradient", kWgradIm2colMaxPixels, scratch_floats_of(p),
      std::size_t(kWgradIm2colMaxFloats), p.n + p.m <= INT_MAX && p.k <= INT_MAX);
}

std::size_t conv2d_wgrad_im2col_scratch_floats(const Conv2dShape& s, const Exec& ex) {
  if (!conv2d_wgrad_im2col_refusal(s).empty()) return 0;
  return scratch_floats_of(plan_with_work(s, ex.precision));
}

void conv2d_wgrad_im2col_copies_cuda(const Conv2dShape& s, const float* d_x, const float* d_dy,
                                     float* d_cols, float* d_dyk, cudaStream_t stream) {
  CopiesParams p{};
  p.x = d_x;
  p.dy = d_dy;
  p.cols = d_cols;
  p.dyk = d_dyk;
  p.c = s.c;
  p.h = s.h;
  p.w = s.w;
  p.oc = s.oc;
  p.kh = s.kh;
  p.kw = s.kw;
  p.sh = s.stride_h;
  p.sw = s.stride_w;
  p.ph = s.pad_h;
  p.pw = s.pad_w;
  p.ow = s.ow();
  p.n = s.n;
  p.ohw = s.oh() * s.ow();
  p.khw = s.kh * s.kw;
  p.rows = s.c * p.khw + s.oc;
  p.ld = conv2d_wgrad_im2col_ld(s);
  CNN_CHECK(p.ohw <= kCopyThreads,
            "conv2d_wgrad_im2col_copies_cuda: {} output pixels a plane, at most {}", p.ohw,
            kCopyThreads);
  p.imgs = kCopyThreads / p.ohw;
  const int per_block = p.imgs * kImagesPerThread;
  const dim3 grid(static_cast<unsigned>(ceil_div(s.n, per_block)),
                  static_cast<unsigned>(std::min(p.rows, 65535)));
  wgrad_im2col_copies_kernel<<<grid, kCopyThreads, 0, stream>>>(p);
  CNN_LAUNCH_CHECK("conv2d_wgrad_im2col_copies");
}

void conv2d_backward_weight_im2col(const Conv2dShape& s, const float* d_x, const float* d_dy,
                                   float* d_dw, float* d_db, float* d_scratch, const Exec& ex) {
  const std::string why = conv2d_wgrad_im2col_refusal(s);
  CNN_CHECK(why.empty(), "{}", why);
  CNN_CHECK(d_x && d_dy && d_dw, "conv2d_backward_weight_im2col: x, dy and dw must not be null");
  CNN_CHECK(reinterpret_cast<uintptr_t>(d_scratch) % 16 == 0,
            "conv2d_backward_weight_im2col: the scratch must be 16-byte aligned");
  const Im2colPlan p = plan_with_work(s, ex.precision);
  const StagedScratch parts =
      carve_staged_scratch("conv2d_backward_weight_im2col", d_scratch, scratch_floats_of(p),
                           p.cols_floats, p.dyk_floats, p.work_floats);
  float* const cols = parts.first;
  float* const dyk = parts.second;
  conv2d_wgrad_im2col_copies_cuda(s, d_x, d_dy, cols, dyk, ex.stream);
  if (d_db) {
    wgrad_im2col_bias_kernel<<<std::min(s.oc, 4096), kSumThreads, 0, ex.stream>>>(dyk, p.ld, p.k,
                                                                                  s.oc, d_db);
    CNN_LAUNCH_CHECK("conv2d_wgrad_im2col_bias");
  }
  // dw (OC, C*KH*KW) += dyk (OC, K) * cols^T: A K-major as it lies, B stored (n, k): trans_b.
  const int ld = static_cast<int>(p.ld), n = static_cast<int>(p.n);
  gemm_cuda_path(GemmPath::Wgmma, false, true, s.oc, n, static_cast<int>(p.k), 1.f, dyk, ld, cols,
                 ld, 1.f, d_dw, n, nullptr, false, ex.precision, ex.stream, Fp32Math::Tf32x3,
                 GemmWorkspace{parts.dense, p.work_floats});
}

}  // namespace cnn
