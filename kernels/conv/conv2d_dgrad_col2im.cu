// The input gradient as one GEMM on explicit copies and a col2im gather (conv2d_dgrad_col2im.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/conv/conv2d_dgrad_col2im.h"
#include "kernels/conv/conv2d_gemm_copies.h"
#include "kernels/conv/staged_scratch.h"
#include "kernels/gemm/gemm_cuda.h"
#include "kernels/gemm/gemm_wgmma.h"
#include "runtime/cuda_check.h"
#include "runtime/error.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

constexpr int kTile = 32;     // the transposes' square tile
constexpr int kTileRows = 8;  // thread rows of a transpose block (32 x 8 threads)
constexpr int kGatherThreads = 256;

// One matrix a transpose block reads: src (rows, cols) of row stride src_ld to dst (cols, rows) of
// row stride dst_ld; `count` such matrices src_step and dst_step floats apart (dy's images).
struct TransposeJob {
  const float* src;
  float* dst;
  int rows, cols, count;
  int64_t src_ld, dst_ld, src_step, dst_step;
  int tiles_r, tiles_c;  // tiles a matrix
};

struct CopiesParams {
  TransposeJob dy, w;
  int64_t dy_tiles;  // blocks [0, dy_tiles) transpose dy, the rest w
};

// Block b: one 32 x 32 tile of dy's image b / (its tiles), or of w. Reads along src rows, writes
// along dst rows, both coalesced, through a padded shared tile (no bank conflicts).
__global__ void dgrad_col2im_copies_kernel(CopiesParams p) {
  ptx::griddep_enter();
  __shared__ float tile[kTile][kTile + 1];
  int64_t b = blockIdx.x;
  const bool is_dy = b < p.dy_tiles;
  const TransposeJob& j = is_dy ? p.dy : p.w;
  if (!is_dy) b -= p.dy_tiles;
  const int64_t per = int64_t{j.tiles_r} * j.tiles_c;
  const int64_t m = b / per, t = b - m * per;
  const int r0 = int(t / j.tiles_c) * kTile, c0 = int(t % j.tiles_c) * kTile;
  const float* src = j.src + m * j.src_step;
  float* dst = j.dst + m * j.dst_step;
  const int tx = threadIdx.x, ty = threadIdx.y;
  for (int i = ty; i < kTile; i += kTileRows) {
    const int r = r0 + i, c = c0 + tx;
    if (r < j.rows && c < j.cols) tile[i][tx] = __ldg(src + r * j.src_ld + c);
  }
  __syncthreads();
  for (int i = ty; i < kTile; i += kTileRows) {
    const int c = c0 + i, r = r0 + tx;
    if (r < j.rows && c < j.cols) dst[c * j.dst_ld + r] = tile[tx][i];
  }
}

struct GatherParams {
  const float* cols;
  float* dx;
  int c, h, w, kh, kw, sh, sw, ph, pw, oh, ow;
  int planes;  // N*C
  int per;     // planes a block row holds side by side: 256 / (H*W) on planes of at most 256
  int64_t ld;
};

// Planes of at most 256 pixels: block by holds planes by per + [0, per), thread t pixel t mod
// H*W of plane t / (H*W), so a 4x4 plane does not leave 240 of 256 threads idle; larger planes:
// block (bx, by) pixels [bx 256, +256) of plane by. Then the planes gridDim.y per apart, each
// pixel's consecutive threads along ix. A pixel's taps are those of the phase (iy + ph) mod sh,
// (ix + pw) mod sw, walked from there by the stride, each a step back of one output pixel: a few
// divisions a pixel, none a tap (dividing at every tap, ResNet-18's stride-2 conv16's whole
// input gradient took 116.3 us; with this walk 74.4, H100). The sum runs over (kh, then kw)
// ascending, the CPU twin's order, so every run writes the same bits.
__global__ void dgrad_col2im_gather_kernel(GatherParams p) {
  ptx::griddep_enter();
  const int hw = p.h * p.w;
  const int lp = p.per > 1 ? int(threadIdx.x) / hw : 0;
  const int t = p.per > 1 ? int(threadIdx.x) - lp * hw : int(blockIdx.x * blockDim.x + threadIdx.x);
  if (lp >= p.per || t >= hw) return;
  const int iy = t / p.w, ix = t - iy * p.w;
  const int ry = iy + p.ph, rx = ix + p.pw;
  const int kh0 = ry % p.sh, oy0 = ry / p.sh, kw0 = rx % p.sw, ox0 = rx / p.sw;
  const int ohw = p.oh * p.ow;
  const int64_t step = int64_t{gridDim.y} * p.per;
  for (int64_t plane = int64_t{blockIdx.y} * p.per + lp; plane < p.planes; plane += step) {
    const int n = int(plane) / p.c, c = int(plane) - n * p.c;
    const float* base = p.cols + int64_t{c} * p.kh * p.kw * p.ld + int64_t{n} * ohw;
    float sum = 0.f;
    for (int kh = kh0, oy = oy0; kh < p.kh && oy >= 0; kh += p.sh, --oy) {
      if (oy >= p.oh) continue;
      for (int kw = kw0, ox = ox0; kw < p.kw && ox >= 0; kw += p.sw, --ox) {
        if (ox >= p.ow) continue;
        sum += __ldg(base + (kh * p.kw + kw) * p.ld + oy * p.ow + ox);
      }
    }
    p.dx[plane * hw + t] = sum;
  }
}

// The GEMM view of one call: cols (m = C*KH*KW, n = N*OH*OW) = wt (m, k) dyt^T, k = OC, and the
// scratch the copies and the GEMM's workspace take (carve_staged_scratch's parts: dyt and wt,
// cols, the workspace).
struct Col2imPlan {
  int64_t m, n, k, ld_oc, ld_pix;
  std::size_t copies_floats, cols_floats, work_floats = 0;
  std::size_t dyt_floats() const { return static_cast<std::size_t>(n * ld_oc); }
};

Col2imPlan plan_of(const Conv2dShape& s) {
  Col2imPlan p;
  p.m = int64_t{s.c} * s.kh * s.kw;
  p.n = int64_t{s.n} * s.oh() * s.ow();
  p.k = s.oc;
  p.ld_oc = conv2d_dgrad_col2im_ld_oc(s);
  p.ld_pix = conv2d_dgrad_col2im_ld_pix(s);
  p.copies_floats = static_cast<std::size_t>((p.n + p.m) * p.ld_oc);  // dyt, then wt
  p.cols_floats = static_cast<std::size_t>(p.m * p.ld_pix);
  return p;
}

// The plan with its GEMM workspace, for a call the refusal lets through (m, n, k fit an int).
Col2imPlan plan_with_work(const Conv2dShape& s, Precision precision) {
  Col2imPlan p = plan_of(s);
  p.work_floats = gemm_cuda_work_floats(int(p.m), int(p.n), int(p.k), precision);
  return p;
}

std::size_t scratch_floats_of(const Col2imPlan& p) {
  return round_up4(p.copies_floats) + round_up4(p.cols_floats) + p.work_floats;
}

TransposeJob transpose_job(const float* src, float* dst, int rows, int cols, int count,
                           int64_t dst_ld) {
  TransposeJob j{};
  j.src = src;
  j.dst = dst;
  j.rows = rows;
  j.cols = cols;
  j.count = count;
  j.src_ld = cols;
  j.dst_ld = dst_ld;
  j.src_step = int64_t{rows} * cols;
  j.dst_step = int64_t{cols} * dst_ld;
  j.tiles_r = ceil_div(rows, kTile);
  j.tiles_c = ceil_div(cols, kTile);
  return j;
}

}  // namespace

std::string conv2d_dgrad_col2im_refusal(const Conv2dShape& s) {
  check_conv2d_shape_any(s);
  const Col2imPlan p = plan_of(s);
  return gemm_copies_refusal(s, "conv2d_backward_data: the input gradient", kDgradCol2imMaxPixels,
                             scratch_floats_of(p), std::size_t(kDgradCol2imMaxFloats),
                             p.m + p.n <= INT_MAX && int64_t{s.n} * s.c * s.h * s.w <= INT_MAX);
}

std::size_t conv2d_dgrad_col2im_scratch_floats(const Conv2dShape& s, const Exec& ex) {
  if (!conv2d_dgrad_col2im_refusal(s).empty()) return 0;
  return scratch_floats_of(plan_with_work(s, ex.precision));
}

void conv2d_dgrad_col2im_copies_cuda(const Conv2dShape& s, const float* d_dy, const float* d_w,
                                     float* d_dyt, float* d_wt, cudaStream_t stream) {
  const int64_t ld = conv2d_dgrad_col2im_ld_oc(s);
  const int ohw = s.oh() * s.ow(), ckk = s.c * s.kh * s.kw;
  CopiesParams p{};
  p.dy = transpose_job(d_dy, d_dyt, s.oc, ohw, s.n, ld);
  p.w = transpose_job(d_w, d_wt, s.oc, ckk, 1, ld);
  p.dy_tiles = int64_t{s.n} * p.dy.tiles_r * p.dy.tiles_c;
  const int64_t blocks = p.dy_tiles + int64_t{p.w.tiles_r} * p.w.tiles_c;
  CNN_CHECK(blocks <= INT_MAX, "conv2d_dgrad_col2im_copies_cuda: {} tiles exceed the grid limit",
            blocks);
  dgrad_col2im_copies_kernel<<<static_cast<unsigned>(blocks), dim3(kTile, kTileRows), 0, stream>>>(
      p);
  CNN_LAUNCH_CHECK("conv2d_dgrad_col2im_copies");
}

void conv2d_dgrad_col2im_gather_cuda(const Conv2dShape& s, const float* d_cols, float* d_dx,
                                     cudaStream_t stream) {
  GatherParams p{};
  p.cols = d_cols;
  p.dx = d_dx;
  p.c = s.c;
  p.h = s.h;
  p.w = s.w;
  p.kh = s.kh;
  p.kw = s.kw;
  p.sh = s.stride_h;
  p.sw = s.stride_w;
  p.ph = s.pad_h;
  p.pw = s.pad_w;
  p.oh = s.oh();
  p.ow = s.ow();
  p.ld = conv2d_dgrad_col2im_ld_pix(s);
  p.planes = s.n * s.c;  // the refusal keeps N*C*H*W an int
  const int hw = s.h * s.w;
  p.per = hw <= kGatherThreads ? kGatherThreads / hw : 1;
  const dim3 grid(static_cast<unsigned>(p.per > 1 ? 1 : ceil_div(hw, kGatherThreads)),
                  static_cast<unsigned>(std::min(ceil_div(p.planes, p.per), 65535)));
  dgrad_col2im_gather_kernel<<<grid, kGatherThreads, 0, stream>>>(p);
  CNN_LAUNCH_CHECK("conv2d_dgrad_col2im_gather");
}

void conv2d_backward_data_col2im(const Conv2dShape& s, const float* d_dy, const float* d_w,
                                 float* d_dx, float* d_scratch, const Exec& ex) {
  const std::string why = conv2d_dgrad_col2im_refusal(s);
  CNN_CHECK(why.empty(), "{}", why);
  CNN_CHECK(d_dy && d_w && d_dx, "conv2d_backward_data_col2im: dy, w and dx must not be null");
  CNN_CHECK(reinterpret_cast<uintptr_t>(d_scratch) % 16 == 0,
            "conv2d_backward_data_col2im: the scratch must be 16-byte aligned");
  const Col2imPlan p = plan_with_work(s, ex.precision);
  const StagedScratch parts =
      carve_staged_scratch("conv2d_backward_data_col2im", d_scratch, scratch_floats_of(p),
                           p.copies_floats, p.cols_floats, p.work_floats);
  float* const dyt = parts.first;
  float* const wt = dyt + p.dyt_floats();
  float* const cols = parts.second;
  conv2d_dgrad_col2im_copies_cuda(s, d_dy, d_w, dyt, wt, ex.stream);
  // cols (C*KH*KW, N*OH*OW) = wt (C*KH*KW, OC) dyt^T: A K-major as it lies, B stored (n, k).
  const int ld_oc = static_cast<int>(p.ld_oc);
  gemm_cuda_path(GemmPath::Wgmma, false, true, static_cast<int>(p.m), static_cast<int>(p.n), s.oc,
                 1.f, wt, ld_oc, dyt, ld_oc, 0.f, cols, static_cast<int>(p.ld_pix), nullptr, false,
                 ex.precision, ex.stream, Fp32Math::Tf32x3,
                 GemmWorkspace{parts.dense, p.work_floats});
  conv2d_dgrad_col2im_gather_cuda(s, cols, d_dx, ex.stream);
}

}  // namespace cnn
