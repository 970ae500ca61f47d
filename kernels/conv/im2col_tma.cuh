#pragma once
// The TMA im2col copy shared by the channels-last convolution kernels (conv2d_wgmma_nhwc.cu: the
// forward's A operand; conv2d_wgmma_wgrad_nhwc.cu: the weight gradient's B operand): the 4-D
// im2col load and the driver's im2col tensor-map encoder. Geometry: conv2d_nhwc_layout.h.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/cuda_check.h"

namespace cnn {
namespace wgmma {

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// 4-D im2col TMA: channels [c, c + channelsPerPixel) of pixelsPerColumn pixels walked from (x, y,
// n) through the map's bounding box, each read at (x + off_x, y + off_y), completing on `bar`.
__device__ __forceinline__ void tma_load_im2col_4d(uint32_t dst, const CUtensorMap* map, int c,
                                                   int x, int y, int n, uint16_t off_x,
                                                   uint16_t off_y, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5}], [%6], {%7, %8};\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c), "r"(x), "r"(y), "r"(n), "r"(bar), "h"(off_x),
      "h"(off_y)
      : "memory");
}

// Where the im2col walk of a tile starts (im2col_start, conv2d_nhwc_layout.h): the image of the
// tile's first output pixel m0 and the top-left input pixel of that pixel's filter window.
struct Im2colCorner {
  int x, y, n;
};
__device__ __forceinline__ Im2colCorner im2col_corner(int m0, int oh, int ow, int stride_h,
                                                      int stride_w, int lower_h, int lower_w) {
  const int pix = oh * ow;
  const int img = m0 / pix, r = m0 - img * pix;
  const int oy = r / ow, ox = r - oy * ow;
  return {lower_w + ox * stride_w, lower_h + oy * stride_h, img};
}
#endif

// cuTensorMapEncodeIm2col through the runtime's driver entry point (no -lcuda).
inline PFN_cuTensorMapEncodeIm2col_v12000 im2col_map_encoder() {
  static const PFN_cuTensorMapEncodeIm2col_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    CNN_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeIm2col", &f, 12000,
                                                    cudaEnableDefault, &q));
    CNN_CHECK(f && q == cudaDriverEntryPointSuccess,
              "conv2d wgmma-nhwc: the driver has no cuTensorMapEncodeIm2col (query result {})",
              int(q));
    return reinterpret_cast<PFN_cuTensorMapEncodeIm2col_v12000>(f);
  }();
  return fn;
}

}  // namespace wgmma
}  // namespace cnn
