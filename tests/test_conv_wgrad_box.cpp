// The box geometry of the TMA-box wgmma weight gradient (kernels/conv/conv2d_wgrad_box.h), on
// the CPU:
//   BoxWidths       bw / br per output width and stride (32x1, 16x2, 8x4; capped by the stride so
//                   that bw * stride <= 32), boxes per image; stride 5 refused in one line.
//   KnownCorners    B's box corners of a 3x3 padding-1 stride-2 convolution (negative at the
//                   top-left edge) for a chosen k-tile and group.
//   ColumnsOnce     every (channel, tap) of dw is one column exactly; channels past C and columns
//                   past the bias column are discarded.
//   EmulatedGemm    the whole scheme (boxes with out-of-bounds zeros, traversal strides, columns
//                   mapped back) against conv2d_backward_weight_cpu on awkward shapes, small
//                   integers (exact).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_wgrad_box.h"
#include "runtime/error.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

constexpr auto conv = test::square_conv;  // (n, c, h, w, oc, k, stride, pad)

Conv2dShape with_ow(int ow, int stride) {
  // k = 1, no padding: OW = (W - 1) / stride + 1.
  return conv(1, 3, 5, (ow - 1) * stride + 1, 4, 1, stride, 0);
}

TEST(ConvWgradBox, BoxWidths) {
  struct Case {
    int ow, stride, bw, boxes_x;
  };
  for (const Case& c :
       {Case{64, 1, 32, 2}, Case{33, 1, 32, 2}, Case{32, 1, 32, 1}, Case{28, 1, 32, 1},
        Case{16, 1, 16, 1}, Case{14, 1, 16, 1}, Case{13, 1, 16, 1}, Case{8, 1, 8, 1},
        Case{7, 1, 8, 1}, Case{1, 1, 8, 1}, Case{32, 2, 16, 2}, Case{16, 2, 16, 1},
        Case{9, 2, 16, 1}, Case{8, 2, 8, 1}, Case{16, 3, 8, 2}, Case{16, 4, 8, 2}}) {
    const Conv2dShape s = with_ow(c.ow, c.stride);
    ASSERT_EQ(s.ow(), c.ow);
    const WgradBoxGeometry g = wgrad_box_geometry(s);
    SCOPED_TRACE("OW " + std::to_string(c.ow) + " stride " + std::to_string(c.stride));
    EXPECT_EQ(g.bw, c.bw);
    EXPECT_EQ(g.bw * g.br, kWgradBoxPixels);
    EXPECT_LE(g.bw * c.stride, 32);  // the swizzle row holds the strided traversal
    EXPECT_EQ(g.boxes_x, c.boxes_x);
    EXPECT_EQ(g.boxes_y, (s.oh() + g.br - 1) / g.br);
    EXPECT_EQ(g.kt_img, g.boxes_x * g.boxes_y);
  }
  const Conv2dShape s5 = conv(1, 3, 40, 40, 4, 3, 5, 1);
  EXPECT_FALSE(wgrad_box_refusal(s5).empty());
  try {
    wgrad_box_geometry(s5);
    ADD_FAILURE() << "stride 5 accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(test::contains(e.what(), "stride")) << e.what();
  }
}

TEST(ConvWgradBox, KnownCorners) {
  // C = 17: 3 channel groups; 3x3 taps; stride 2, padding 1 on 33x33: OH = OW = 17, bw = 16.
  const Conv2dShape s = conv(2, 17, 33, 33, 4, 3, 2, 1);
  const WgradBoxGeometry g = wgrad_box_geometry(s);
  ASSERT_EQ(g.bw, 16);
  ASSERT_EQ(g.br, 2);
  EXPECT_EQ(g.boxes_x, 2);
  EXPECT_EQ(g.boxes_y, 9);
  EXPECT_EQ(g.cgroups, 3);
  EXPECT_EQ(g.groups, 27);
  EXPECT_EQ(g.bias_col, 216);
  const WgradBoxOrigin o0 = wgrad_box_origin(g, 0);
  EXPECT_EQ(o0.ox0, 0);
  EXPECT_EQ(o0.oy0, 0);
  // Group 0: tap (0, 0), channels 0..7: the padding corner.
  WgradBoxCorner k = wgrad_box_corner(s, g, o0, 0);
  EXPECT_EQ(k.x, -1);
  EXPECT_EQ(k.y, -1);
  EXPECT_EQ(k.c, 0);
  // k-tile 5 = box (1, 2): ox0 = 16, oy0 = 4; group 3 * 5 + 2 = tap 5 = (1, 2), channels 16..23.
  const WgradBoxOrigin o5 = wgrad_box_origin(g, 5);
  EXPECT_EQ(o5.ox0, 16);
  EXPECT_EQ(o5.oy0, 4);
  k = wgrad_box_corner(s, g, o5, 17);
  EXPECT_EQ(k.x, 16 * 2 - 1 + 2);
  EXPECT_EQ(k.y, 4 * 2 - 1 + 1);
  EXPECT_EQ(k.c, 16);
}

TEST(ConvWgradBox, ColumnsOnce) {
  for (const Conv2dShape& s : {conv(1, 1, 9, 9, 3, 1, 1, 0), conv(1, 17, 9, 9, 3, 3, 1, 1),
                               conv(1, 8, 9, 9, 3, 5, 2, 2), conv(1, 130, 9, 9, 3, 7, 1, 3)}) {
    const WgradBoxGeometry g = wgrad_box_geometry(s);
    const int64_t ckhw = int64_t{s.c} * s.kh * s.kw;
    std::vector<int> seen(size_t(ckhw), 0);
    int bias = 0;
    for (int col = 0; col < g.bias_col + 200; ++col) {
      const int64_t slot = wgrad_box_column_slot(s, g, col);
      if (slot >= 0) {
        ASSERT_LT(slot, ckhw);
        ++seen[size_t(slot)];
        // The column's group is its tap's, its channel the slot's.
        EXPECT_EQ(slot % g.taps, (col / 8) / g.cgroups) << col;
        EXPECT_EQ(slot / g.taps, ((col / 8) % g.cgroups) * 8 + col % 8) << col;
      } else if (slot == -1) {
        ++bias;
        EXPECT_EQ(col, g.bias_col);
      }
    }
    EXPECT_EQ(bias, 1);
    for (int64_t i = 0; i < ckhw; ++i) EXPECT_EQ(seen[size_t(i)], 1) << "slot " << i;
  }
}

TEST(ConvWgradBox, EmulatedGemm) {
  const Conv2dShape shapes[] = {
      conv(1, 1, 8, 8, 5, 1, 1, 0),     conv(3, 3, 13, 13, 8, 3, 1, 1),
      conv(1, 17, 14, 14, 24, 5, 1, 2), conv(3, 8, 7, 7, 8, 7, 1, 3),
      conv(1, 3, 33, 33, 8, 3, 2, 1),   conv(3, 17, 16, 16, 8, 3, 2, 0),
      conv(1, 3, 28, 28, 8, 5, 1, 0),   conv(2, 8, 32, 32, 4, 3, 1, 1),
      conv(1, 3, 64, 64, 4, 7, 2, 3),   conv(1, 9, 13, 13, 5, 5, 3, 2),
      conv(2, 2, 17, 17, 3, 3, 4, 1),   conv(1, 3, 64, 64, 4, 3, 1, 0),
  };
  for (const Conv2dShape& s : shapes) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("C=" + std::to_string(s.c) + " HxW=" + std::to_string(s.h) +
                 " k=" + std::to_string(s.kh) + " stride=" + std::to_string(s.stride_h) +
                 " pad=" + std::to_string(s.pad_h) + " seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> d(-2, 2);
    auto ints = [&](size_t n) {
      std::vector<float> v(n);
      for (auto& e : v) e = float(d(rng));
      return v;
    };
    const auto x = ints(size_t(s.n) * s.c * s.h * s.w);
    const auto dy = ints(size_t(s.n) * s.oc * s.oh() * s.ow());
    const auto dw0 = ints(size_t(s.oc) * s.c * s.kh * s.kw), db0 = ints(size_t(s.oc));
    auto ref_dw = dw0, ref_db = db0, got_dw = dw0, got_db = db0;
    conv2d_backward_weight_cpu(s, x.data(), dy.data(), ref_dw.data(), ref_db.data());
    wgrad_box_model_cpu(s, x.data(), dy.data(), got_dw.data(), got_db.data());
    EXPECT_EQ(got_dw, ref_dw);
    EXPECT_EQ(got_db, ref_db);
  }
}

}  // namespace
