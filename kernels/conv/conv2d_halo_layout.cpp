#include "kernels/conv/conv2d_halo_layout.h"

#include <fmt/format.h>

#include <algorithm>

#include "runtime/error.h"

namespace cnn {

std::string halo_refusal(const Conv2dShape& g, int tile_rows) {
  if (tile_rows != 128 && tile_rows != 256)
    return fmt::format("the halo tile has 128 or 256 rows (got {})", tile_rows);
  const int oh = g.oh(), ow = g.ow();
  if (g.stride_h != 1 || g.stride_w != 1)
    return fmt::format("the halo tile handles stride 1 only (got {}x{})", g.stride_h, g.stride_w);
  if (g.dilated())
    return fmt::format("the halo tile reads undilated taps (got dilation {}x{})", g.dil_h, g.dil_w);
  if (g.groups != 1) return fmt::format("the halo tile runs one group (got groups = {})", g.groups);
  if (oh < 1 || ow < 1) return fmt::format("empty output ({}x{})", oh, ow);
  const int wp = ow + g.kw - 1;
  if (wp > tile_rows)
    return fmt::format("the halo tile's row pitch {} (OW {} + KW {} - 1) is over {} pixels", wp, ow,
                       g.kw, tile_rows);
  const int rows = std::min(oh, tile_rows / wp);
  if (rows + g.kh - 1 > 256)
    return fmt::format("the halo box's {} input rows are over the TMA's 256", rows + g.kh - 1);
  const int last_read = tile_rows + (g.kh - 1) * wp + g.kw - 1;  // rows a tap reads
  const int need = std::max((rows + g.kh - 1) * wp, last_read);
  if (need > kHaloMaxSlotRows)
    return fmt::format("the halo slot of {} rows of 128 bytes is over {}", need, kHaloMaxSlotRows);
  return {};
}

HaloGeometry halo_geometry(const Conv2dShape& g, const char* what, int tile_rows) {
  const std::string why = halo_refusal(g, tile_rows);
  CNN_CHECK(why.empty(), "{}: algo wgmma-nhwc: {}", what, why);
  HaloGeometry h;
  const int oh = g.oh(), ow = g.ow();
  h.tile_rows = tile_rows;
  h.wp = ow + g.kw - 1;
  h.rows = std::min(oh, tile_rows / h.wp);
  h.tiles_per_image = (oh + h.rows - 1) / h.rows;
  h.box_w = h.wp;
  h.box_h = h.rows + g.kh - 1;
  h.lower_w = -g.pad_w;
  h.lower_h = -g.pad_h;
  const int need = std::max(h.box_h * h.wp, tile_rows + (g.kh - 1) * h.wp + g.kw - 1);
  h.slot_rows = (need + 7) / 8 * 8;
  return h;
}

double halo_useful_fraction(const Conv2dShape& g, const HaloGeometry& h) {
  return double(g.oh()) * g.ow() / (double(h.tiles_per_image) * h.tile_rows);
}

}  // namespace cnn
