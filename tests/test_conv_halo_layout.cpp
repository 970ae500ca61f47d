// The halo tile's geometry (kernels/conv/conv2d_halo_layout.h), host code: known shapes, the
// refusals, and the index scheme the kernel runs, emulated: for every tile row a tap reads, the
// slot row it reads is inside the slot, inside the loaded box where the row is stored, and holds
// the input pixel the convolution needs there.
#include <gtest/gtest.h>

#include <string>

#include "kernels/conv/conv2d_halo_layout.h"
#include "kernels/conv/conv2d_nhwc_layout.h"
#include "runtime/error.h"
#include "tests/conv_test_cases.h"

using namespace cnn;
using conv_test::conv;

TEST(ConvHaloLayout, KnownShapes) {
  // LeNet's conv2, 14x14 with a 5x5 kernel and padding 2: pitch 18, 7 rows a tile (98 of the
  // 128 rows are pixels), 2 tiles an image, a box of 11 x 18 pixels; a tap reads up to row
  // 127 + 4 x 18 + 4 = 203, so the slot holds 208 rows.
  const HaloGeometry h = halo_geometry(conv(128, 32, 14, 14, 64, 5, 5, 1, 1, 2, 2), "t");
  EXPECT_EQ(h.wp, 18);
  EXPECT_EQ(h.rows, 7);
  EXPECT_EQ(h.tiles_per_image, 2);
  EXPECT_EQ(h.box_w, 18);
  EXPECT_EQ(h.box_h, 11);
  EXPECT_EQ(h.lower_w, -2);
  EXPECT_EQ(h.lower_h, -2);
  EXPECT_EQ(h.slot_rows, 208);
  // 256 rows: the whole 14-row image (252 rows of pitch 18), a box of 18 x 18, up to row
  // 255 + 76 = 331 read.
  const HaloGeometry t = halo_geometry(conv(128, 32, 14, 14, 64, 5, 5, 1, 1, 2, 2), "t", 256);
  EXPECT_EQ(t.rows, 14);
  EXPECT_EQ(t.tiles_per_image, 1);
  EXPECT_EQ(t.box_h, 18);
  EXPECT_EQ(t.slot_rows, 336);
  EXPECT_DOUBLE_EQ(halo_useful_fraction(conv(128, 32, 14, 14, 64, 5, 5, 1, 1, 2, 2), t),
                   196.0 / 256);
  // A 7x7 image with a 3x3 kernel: the whole image in one tile (7 rows of pitch 9).
  const HaloGeometry s = halo_geometry(conv(1, 8, 7, 7, 8, 3, 3, 1, 1, 1, 1), "t");
  EXPECT_EQ(s.rows, 7);
  EXPECT_EQ(s.tiles_per_image, 1);
  EXPECT_EQ(s.box_h, 9);
  // The input gradient's view of a layer with padding 0: padding KH - 1 on dy.
  const HaloGeometry d =
      halo_geometry(backward_data_as_forward(conv(2, 8, 12, 12, 16, 3, 3, 1, 1, 0, 0)), "t");
  EXPECT_EQ(d.wp, 14);
  EXPECT_EQ(d.lower_w, -2);
}

TEST(ConvHaloLayout, Refusals) {
  EXPECT_TRUE(halo_refusal(conv(1, 8, 14, 14, 8, 3, 3, 1, 1, 1, 1)).empty());
  EXPECT_NE(halo_refusal(conv(1, 8, 14, 14, 8, 3, 3, 2, 2, 1, 1)).find("stride"),
            std::string::npos);
  EXPECT_NE(halo_refusal(conv(1, 8, 14, 14, 8, 3, 3, 1, 2, 1, 1)).find("stride"),
            std::string::npos);
  // OW 127 + KW 3 - 1 = 129 pixels of pitch; 126 + 2 = 128 is the widest.
  EXPECT_NE(halo_refusal(conv(1, 8, 4, 127, 8, 3, 3, 1, 1, 1, 1)).find("pitch"), std::string::npos);
  EXPECT_TRUE(halo_refusal(conv(1, 8, 4, 126, 8, 3, 3, 1, 1, 1, 1)).empty());
  // A 7x7 kernel on rows of pitch 100: 128 + 6 x 100 + 6 rows read, over the 512-row slot.
  EXPECT_NE(halo_refusal(conv(1, 8, 20, 94, 8, 7, 7, 1, 1, 3, 3)).find("slot"), std::string::npos);
  // 256-row tiles take a pitch over 128 (129 here, a 1x3 kernel); other tile heights are refused.
  EXPECT_TRUE(halo_refusal(conv(1, 8, 4, 127, 8, 1, 3, 1, 1, 0, 1), 256).empty());
  EXPECT_FALSE(halo_refusal(conv(1, 8, 14, 14, 8, 3, 3, 1, 1, 1, 1), 192).empty());
  try {
    halo_geometry(conv(1, 8, 14, 14, 8, 3, 3, 2, 2, 1, 1), "conv2d_forward");
    ADD_FAILURE() << "stride 2 was not refused";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("conv2d_forward: algo wgmma-nhwc"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(ConvHaloLayout, EmulatedIndexScheme) {
  int checked = 0;
  for (const Conv2dShape& s :
       {conv(2, 8, 14, 14, 8, 5, 5, 1, 1, 2, 2), conv(1, 8, 13, 13, 8, 3, 3, 1, 1, 1, 1),
        conv(1, 8, 33, 32, 8, 5, 5, 1, 1, 2, 2), conv(2, 8, 7, 7, 8, 7, 7, 1, 1, 3, 3),
        conv(1, 8, 13, 33, 8, 3, 5, 1, 1, 0, 2), conv(1, 8, 9, 11, 8, 3, 3, 1, 1, 0, 0),
        backward_data_as_forward(conv(1, 8, 9, 11, 8, 3, 3, 1, 1, 0, 0)),
        backward_data_as_forward(conv(1, 8, 13, 7, 8, 7, 7, 1, 1, 3, 2)),
        conv(1, 8, 5, 126, 8, 3, 3, 1, 1, 1, 1), conv(1, 8, 40, 1, 8, 1, 1, 1, 1, 0, 0)}) {
    for (int tile_rows : {128, 256}) {
      if (!halo_refusal(s, tile_rows).empty()) continue;
      const HaloGeometry h = halo_geometry(s, "t", tile_rows);
      const int oh = s.oh(), ow = s.ow();
      std::vector<int> stored(size_t(oh) * ow, 0);
      for (int t = 0; t < h.tiles_per_image; ++t) {
        const int oy0 = t * h.rows;
        for (int r = 0; r < h.tile_rows; ++r) {
          const int q = halo_row_pixel(h.wp, h.rows, oh, ow, oy0, r);
          for (int ky = 0; ky < s.kh; ++ky)
            for (int kx = 0; kx < s.kw; ++kx) {
              const int row = r + ky * h.wp + kx;  // the slot row tap (ky, kx) reads for tile row r
              ASSERT_LT(row, h.slot_rows) << "r " << r << " tap " << ky << "," << kx;
              if (q < 0) continue;
              ASSERT_LT(row, h.box_w * h.box_h) << "a stored row reads past the box";
              // Box pixel (row / wp, row % wp) is input pixel (oy0 + lower_h + .., lower_w + ..).
              const int iy = oy0 + h.lower_h + row / h.box_w, ix = h.lower_w + row % h.box_w;
              const int oy = q / ow, ox = q % ow;
              ASSERT_EQ(iy, oy + ky - s.pad_h);
              ASSERT_EQ(ix, ox + kx - s.pad_w);
              ++checked;
            }
          if (q >= 0) ++stored[size_t(q)];
        }
      }
      for (size_t i = 0; i < stored.size(); ++i)
        ASSERT_EQ(stored[i], 1) << "output pixel " << i << " stored " << stored[i] << " times";
      EXPECT_EQ(h.slot_rows % 8, 0);
    }
  }
  EXPECT_GT(checked, 0);
}
