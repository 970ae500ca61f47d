#include "kernels/conv/conv2d_wgrad_halo_layout.h"

#include <fmt/format.h>

#include <algorithm>

#include "runtime/error.h"

namespace cnn {
namespace {

// The geometry without the checks: whole images where OH + KH - 1 rows of pitch wp fit, else
// bands of as many output rows as fit.
WgradHaloGeometry layout(const Conv2dShape& s, int max_k_rows) {
  WgradHaloGeometry h;
  const int oh = s.oh(), ow = s.ow();
  h.wp = ow + s.kw - 1;
  const int image_rows = oh + s.kh - 1;
  int last;  // the last box row that is an output pixel, plus one
  if (int64_t(image_rows) * h.wp <= max_k_rows) {
    h.images = std::min(s.n, max_k_rows / (image_rows * h.wp));
    h.rows_dy = h.rows_x = image_rows;
    h.bands = 1;
    h.ktiles = (s.n + h.images - 1) / h.images;
    last = ((h.images - 1) * image_rows + oh - 1) * h.wp + ow;
  } else {
    h.images = 1;
    h.rows_dy = std::min(oh, max_k_rows / h.wp);
    h.rows_x = h.rows_dy + s.kh - 1;
    h.bands = (oh + h.rows_dy - 1) / h.rows_dy;
    h.ktiles = int64_t(s.n) * h.bands;
    last = (h.rows_dy - 1) * h.wp + ow;
  }
  h.k_rows = (last + 15) / 16 * 16;
  const int dy_box = h.images * h.rows_dy * h.wp, x_box = h.images * h.rows_x * h.wp;
  h.dy_slot_rows = (std::max(dy_box, h.k_rows) + 7) / 8 * 8;
  const int x_read = h.k_rows + (s.kh - 1) * h.wp + s.kw - 1;  // rows a tap reads
  h.x_slot_rows = (std::max(x_box, x_read) + 7) / 8 * 8;
  h.stages = int(std::min<int64_t>(8, kWgradHaloRingBytes / h.stage_bytes()));
  return h;
}

}  // namespace

std::string wgrad_halo_refusal(const Conv2dShape& s, int max_k_rows) {
  if (max_k_rows < 16 || max_k_rows > 256 || max_k_rows % 16 != 0)
    return fmt::format("the halo k-tile has 16 to 256 rows, a multiple of 16 (got {})", max_k_rows);
  if (s.stride_h != 1 || s.stride_w != 1)
    return fmt::format("the halo k-tile handles stride 1 only (got {}x{})", s.stride_h, s.stride_w);
  if (s.dilated())
    return fmt::format("the halo k-tile reads undilated taps (got dilation {}x{})", s.dil_h,
                       s.dil_w);
  if (s.groups != 1)
    return fmt::format("the halo k-tile runs one group (got groups = {})", s.groups);
  const int oh = s.oh(), ow = s.ow();
  if (oh < 1 || ow < 1) return fmt::format("empty output ({}x{})", oh, ow);
  const int wp = ow + s.kw - 1;
  if (wp > max_k_rows)
    return fmt::format("the halo k-tile's row pitch {} (OW {} + KW {} - 1) is over {} pixels", wp,
                       ow, s.kw, max_k_rows);
  const WgradHaloGeometry h = layout(s, max_k_rows);
  if (h.rows_x > 256 || h.images > 256)
    return fmt::format("the halo box's {} rows x {} images are past the TMA's 256", h.rows_x,
                       h.images);
  if (h.stages < 2)
    return fmt::format("the halo k-tile's stage of {} bytes leaves fewer than 2 in {} bytes",
                       h.stage_bytes(), kWgradHaloRingBytes);
  return {};
}

WgradHaloGeometry wgrad_halo_geometry(const Conv2dShape& s, const char* what, int max_k_rows) {
  const std::string why = wgrad_halo_refusal(s, max_k_rows);
  CNN_CHECK(why.empty(), "{}: algo wgmma-nhwc: {}", what, why);
  return layout(s, max_k_rows);
}

double wgrad_halo_useful_fraction(const Conv2dShape& s, const WgradHaloGeometry& h) {
  return double(s.n) * s.oh() * s.ow() / (double(h.ktiles) * h.k_rows);
}

}  // namespace cnn
