// The tap-class copies of x for the TMA-box wgmma weight gradient (conv2d_wgrad_box_copies.h):
//   copy (qh, qw)[n][c][h'][w'] = x[n][c][h' sh + qh - ph][w' sw + qw - pw], 0 outside x.
// A streaming copy: every float of the copies is written once (the padding zeros too, so the
// scratch needs no clearing), x read through the cache with the rows' stride and shift.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/common/ptx.cuh"
#include "kernels/conv/conv2d_wgrad_box_copies.h"
#include "runtime/cuda_check.h"
#include "runtime/error.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

struct CopiesParams {
  int h, w, sh, sw, ph, pw;
  int copies_w;        // column classes: copy q = qh * copies_w + qw
  int copy_h, quads;   // Hc, Wc / 4
  int64_t nc;          // N * C planes per copy
  int skip;            // the copy not written (-1: none): copies from it on are one further
  int64_t skip_quads;  // float4 of one copy: how far on they are
  int64_t total;       // float4 of output written: (R, or R - 1 with skip) * N * C * Hc * Wc / 4
};

// Thread mapping: one float4 of output per thread and grid-stride step: columns [4 i, 4 i + 4)
// of one row h' of one (copy, image, channel) plane. Its four reads of x are scalar (stride sw,
// shifted by qw - pw: no 16-byte alignment to rely on).
__global__ void wgrad_box_copies_kernel(const float* __restrict__ d_x, float4* __restrict__ d_out,
                                        CopiesParams p) {
  ptx::griddep_enter();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int quad = int(i % p.quads);
    const int64_t row = i / p.quads;  // (copy, plane, h')
    const int hp = int(row % p.copy_h);
    const int64_t cp = row / p.copy_h;  // copy * nc + plane, counting the written copies
    const int written = int(cp / p.nc);
    const int64_t plane = cp - int64_t(written) * p.nc;
    const int copy = written + (p.skip >= 0 && written >= p.skip ? 1 : 0);
    const int qh = copy / p.copies_w, qw = copy - qh * p.copies_w;
    const int ih = hp * p.sh + qh - p.ph;
    float v[4] = {0.f, 0.f, 0.f, 0.f};
    if (ih >= 0 && ih < p.h) {
      const float* src = d_x + (plane * p.h + ih) * p.w;
      const int iw0 = 4 * quad * p.sw + qw - p.pw;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int iw = iw0 + k * p.sw;
        if (iw >= 0 && iw < p.w) v[k] = __ldg(src + iw);
      }
    }
    d_out[i + (copy - written) * p.skip_quads] = make_float4(v[0], v[1], v[2], v[3]);
  }
}

}  // namespace

void wgrad_box_copies_cuda(const Conv2dShape& s, const WgradBoxGeometry& g, const float* d_x,
                           float* d_copies, cudaStream_t stream, int skip) {
  if (g.reads_x || g.copy_floats == 0) return;
  CNN_CHECK(reinterpret_cast<uintptr_t>(d_copies) % 16 == 0,
            "wgrad_box_copies_cuda: the copies of x must be 16-byte aligned (float4 rows), got "
            "an address {} bytes past a 16-byte boundary",
            reinterpret_cast<uintptr_t>(d_copies) % 16);
  CopiesParams p{};
  p.h = s.h;
  p.w = s.w;
  p.sh = s.stride_h;
  p.sw = s.stride_w;
  p.ph = s.pad_h;
  p.pw = s.pad_w;
  p.copies_w = g.copies_w;
  p.copy_h = g.copy_h;
  p.quads = g.copy_w / 4;
  p.nc = int64_t{s.n} * s.c;
  CNN_CHECK(skip >= -1 && skip < g.copies,
            "wgrad_box_copies_cuda: copy {} to skip; expected -1 (none) or below {}", skip,
            g.copies);
  p.skip = skip;
  p.skip_quads = g.copy_floats / g.copies / 4;
  p.total = g.copy_floats / 4 - (skip >= 0 ? p.skip_quads : 0);
  if (p.total == 0) return;
  constexpr int kBlock = 256;
  // Enough blocks to fill an H200 several times over; the grid-stride loop takes the rest.
  const int blocks = static_cast<int>(std::min<int64_t>(ceil_div<int64_t>(p.total, kBlock), 4096));
  wgrad_box_copies_kernel<<<blocks, kBlock, 0, stream>>>(d_x, reinterpret_cast<float4*>(d_copies),
                                                         p);
  CNN_LAUNCH_CHECK("wgrad_box_copies_kernel");
}

}  // namespace cnn
