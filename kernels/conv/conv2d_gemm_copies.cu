// The refusal the passes on explicit copies share (conv2d_gemm_copies.h). A .cu file: it asks
// the wgmma GEMM whether it runs here.
#include <cstdint>

#include "kernels/conv/conv2d_gemm_copies.h"
#include "kernels/gemm/gemm_wgmma.h"
#include "runtime/error.h"

namespace cnn {

std::string gemm_copies_refusal(const Conv2dShape& s, const char* what, int max_pixels,
                                std::size_t floats, std::size_t max_floats, bool fits) {
  check_conv2d_shape_any(s);
  if (s.extended())
    return fmt::format(
        "{} on explicit copies takes no dilation or groups (got dilation {}x{}, "
        "groups {})",
        what, s.dil_h, s.dil_w, s.groups);
  if (int64_t{s.oh()} * s.ow() > max_pixels)
    return fmt::format("{} on explicit copies takes at most {} output pixels a plane (got {}x{})",
                       what, max_pixels, s.oh(), s.ow());
  if (floats > max_floats || !fits)
    return fmt::format(
        "{} on explicit copies needs {} floats of copies for N={} C={} {}x{} OC={} "
        "{}x{}, over its {}",
        what, floats, s.n, s.c, s.h, s.w, s.oc, s.kh, s.kw, max_floats);
  if (!gemm_wgmma_available())
    return fmt::format(
        "{} on explicit copies runs on the wgmma GEMM (a compute capability 9.0 "
        "GPU and a build with CUDA architecture 90)",
        what);
  return {};
}

}  // namespace cnn
