// The halo k-tile of the BF16 channels-last weight gradient
// (kernels/conv/conv2d_wgrad_halo_layout.h), host code: known shapes, the refusals, the tap groups,
// and the whole scheme emulated: boxes filled as the TMA fills them (zero outside the tensor, the
// slots' rows past the boxes zero), each tap reading the x slot at its row offset, summed over
// every k-tile, must give the weight gradient exactly (small integers), with every row read inside
// its slot.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_wgrad_halo_layout.h"
#include "runtime/error.h"
#include "tests/conv_test_cases.h"

using namespace cnn;
using conv_test::conv;

TEST(ConvWgradHaloLayout, KnownShapes) {
  // LeNet's conv2 (14x14, 5x5, padding 2): pitch 18; an image is 18 x 18 = 324 rows, over 128,
  // so bands of 7 output rows (126 rows, the last pixel at 6 x 18 + 14 = 122: 128 k rows), x
  // boxes of 11 rows; a tap reads up to 127 + 4 x 18 + 4 = 203: 208 rows.
  const Conv2dShape lenet = conv(128, 32, 14, 14, 64, 5, 5, 1, 1, 2, 2);
  const WgradHaloGeometry h = wgrad_halo_geometry(lenet, "t");
  EXPECT_EQ(h.wp, 18);
  EXPECT_EQ(h.images, 1);
  EXPECT_EQ(h.rows_dy, 7);
  EXPECT_EQ(h.rows_x, 11);
  EXPECT_EQ(h.bands, 2);
  EXPECT_EQ(h.ktiles, 256);
  EXPECT_EQ(h.k_rows, 128);
  EXPECT_EQ(h.dy_slot_rows, 128);
  EXPECT_EQ(h.x_slot_rows, 208);
  EXPECT_EQ(h.stage_bytes(), 16384 + 26624);
  EXPECT_EQ(h.stages, 4);
  EXPECT_DOUBLE_EQ(wgrad_halo_useful_fraction(lenet, h), 196.0 / 256);
  // 8x8 with a 3x3 kernel and padding 1: a whole image is 10 x 10 = 100 rows, one a k-tile (its
  // last pixel at 7 x 10 + 8 = 78: 80 k rows).
  const WgradHaloGeometry e = wgrad_halo_geometry(conv(6, 256, 8, 8, 256, 3, 3, 1, 1, 1, 1), "t");
  EXPECT_EQ(e.images, 1);
  EXPECT_EQ(e.rows_dy, 10);
  EXPECT_EQ(e.rows_x, 10);
  EXPECT_EQ(e.bands, 1);
  EXPECT_EQ(e.ktiles, 6);
  EXPECT_EQ(e.k_rows, 80);
  // 4x4 with a 3x3 kernel, padding 1: 36 rows an image, 3 images a k-tile.
  const WgradHaloGeometry f = wgrad_halo_geometry(conv(7, 8, 4, 4, 8, 3, 3, 1, 1, 1, 1), "t");
  EXPECT_EQ(f.images, 3);
  EXPECT_EQ(f.ktiles, 3);
  EXPECT_EQ(f.k_rows, ((2 * 6 + 3) * 6 + 4 + 15) / 16 * 16);
  // The tap groups: 25 taps in 4 blocks of 6, 6, 6, 7; 9 in 4 + 5; 1 in 1.
  const WgradHaloTaps t25 = wgrad_halo_taps(25);
  EXPECT_EQ(t25.groups, 4);
  EXPECT_EQ(t25.count(0, 25), 6);
  EXPECT_EQ(t25.count(3, 25), 7);
  EXPECT_EQ(wgrad_halo_taps(9).groups, 2);
  EXPECT_EQ(wgrad_halo_taps(1).groups, 1);
}

TEST(ConvWgradHaloLayout, Refusals) {
  EXPECT_TRUE(wgrad_halo_refusal(conv(1, 8, 14, 14, 8, 3, 3, 1, 1, 1, 1)).empty());
  EXPECT_NE(wgrad_halo_refusal(conv(1, 8, 14, 14, 8, 3, 3, 2, 2, 1, 1)).find("stride"),
            std::string::npos);
  EXPECT_NE(wgrad_halo_refusal(conv(1, 8, 14, 14, 8, 3, 3, 1, 2, 1, 1)).find("stride"),
            std::string::npos);
  // OW 127 + KW 3 - 1 = 129 pixels of pitch; 126 + 2 = 128 is the widest.
  EXPECT_NE(wgrad_halo_refusal(conv(1, 8, 4, 127, 8, 3, 3, 1, 1, 1, 1)).find("pitch"),
            std::string::npos);
  EXPECT_TRUE(wgrad_halo_refusal(conv(1, 8, 4, 126, 8, 3, 3, 1, 1, 1, 1)).empty());
  // A 7x7 kernel on a pitch of 100: an x slot of 128 + 600 + 6 rows, one stage of 110 KB.
  EXPECT_NE(wgrad_halo_refusal(conv(1, 8, 20, 94, 8, 7, 7, 1, 1, 3, 3)).find("stage"),
            std::string::npos);
  EXPECT_FALSE(wgrad_halo_refusal(conv(1, 8, 14, 14, 8, 3, 3, 1, 1, 1, 1), 100).empty());
  try {
    wgrad_halo_geometry(conv(1, 8, 14, 14, 8, 3, 3, 2, 2, 1, 1), "conv2d_backward_weight");
    ADD_FAILURE() << "stride 2 was not refused";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("conv2d_backward_weight: algo wgmma-nhwc"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

namespace {

// Small integers that no sum of the shapes below rounds: the emulation is compared bit for bit.
std::vector<float> ints(size_t n, int seed) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float(int((i * 7 + size_t(seed) * 13) % 7) - 3);
  return v;
}

// The kernel's scheme on the CPU: for each k-tile, the dy and x slots as the TMA boxes fill them
// (channels-last, zero outside the tensor, zero past the box), then every tap's products over
// the k-tile's k_rows rows, the x slot read from row ky wp + kx on.
std::vector<float> emulate(const Conv2dShape& s, const WgradHaloGeometry& h,
                           const std::vector<float>& x, const std::vector<float>& dy) {
  const int oh = s.oh(), ow = s.ow(), taps = s.kh * s.kw;
  std::vector<float> dw(size_t(s.oc) * s.c * taps, 0.f);
  for (int64_t kt = 0; kt < h.ktiles; ++kt) {
    const WgradHaloTileStart at = wgrad_halo_tile_start(h, kt);
    std::vector<float> dys(size_t(h.dy_slot_rows) * s.oc, 0.f),
        xs(size_t(h.x_slot_rows) * s.c, 0.f);
    for (int m = 0; m < h.images; ++m)
      for (int i = 0; i < h.rows_dy; ++i)
        for (int j = 0; j < h.wp; ++j) {
          const int n = at.n0 + m, oy = at.oy0 + i, ox = j;
          if (n >= s.n || oy >= oh || ox >= ow) continue;
          const size_t row = (size_t(m) * h.rows_dy + i) * h.wp + j;
          for (int o = 0; o < s.oc; ++o)
            dys[row * s.oc + o] = dy[((size_t(n) * s.oc + o) * oh + oy) * ow + ox];
        }
    for (int m = 0; m < h.images; ++m)
      for (int i = 0; i < h.rows_x; ++i)
        for (int j = 0; j < h.wp; ++j) {
          const int n = at.n0 + m, iy = at.oy0 - s.pad_h + i, ix = j - s.pad_w;
          if (n >= s.n || iy < 0 || iy >= s.h || ix < 0 || ix >= s.w) continue;
          const size_t row = (size_t(m) * h.rows_x + i) * h.wp + j;
          for (int c = 0; c < s.c; ++c)
            xs[row * s.c + c] = x[((size_t(n) * s.c + c) * s.h + iy) * s.w + ix];
        }
    for (int tap = 0; tap < taps; ++tap) {
      const int shift = (tap / s.kw) * h.wp + tap % s.kw;
      for (int r = 0; r < h.k_rows; ++r) {
        EXPECT_LT(r, h.dy_slot_rows);
        EXPECT_LT(r + shift, h.x_slot_rows) << "k row " << r << " tap " << tap;
        if (r >= h.dy_slot_rows || r + shift >= h.x_slot_rows) return dw;
        for (int o = 0; o < s.oc; ++o)
          for (int c = 0; c < s.c; ++c)
            dw[(size_t(o) * s.c + c) * taps + tap] +=
                dys[size_t(r) * s.oc + o] * xs[size_t(r + shift) * s.c + c];
      }
    }
  }
  return dw;
}

}  // namespace

TEST(ConvWgradHaloLayout, EmulatedSchemeGivesTheGradient) {
  int checked = 0;
  for (const Conv2dShape& s :
       {conv(2, 2, 14, 14, 3, 5, 5, 1, 1, 2, 2), conv(3, 2, 13, 13, 2, 3, 3, 1, 1, 1, 1),
        conv(1, 2, 33, 32, 2, 5, 5, 1, 1, 2, 2), conv(3, 2, 7, 7, 2, 7, 7, 1, 1, 3, 3),
        conv(2, 2, 13, 33, 2, 3, 5, 1, 1, 0, 2), conv(5, 2, 9, 11, 3, 3, 3, 1, 1, 0, 0),
        conv(7, 2, 4, 4, 2, 3, 3, 1, 1, 1, 1), conv(3, 1, 6, 6, 2, 5, 5, 1, 1, 3, 3),
        conv(1, 2, 5, 126, 2, 3, 3, 1, 1, 1, 1), conv(9, 2, 3, 1, 2, 1, 1, 1, 1, 0, 0),
        conv(2, 2, 8, 8, 2, 3, 3, 1, 1, 1, 1)}) {
    if (!wgrad_halo_refusal(s).empty()) {
      ADD_FAILURE() << "refused: " << wgrad_halo_refusal(s);
      continue;
    }
    const WgradHaloGeometry h = wgrad_halo_geometry(s, "t");
    const int64_t nx = int64_t(s.n) * s.c * s.h * s.w, ny = int64_t(s.n) * s.oc * s.oh() * s.ow();
    const std::vector<float> x = ints(size_t(nx), 1), dy = ints(size_t(ny), 2);
    std::vector<float> ref(size_t(s.oc) * s.c * s.kh * s.kw, 0.f), db(size_t(s.oc), 0.f);
    conv2d_backward_weight_cpu(s, x.data(), dy.data(), ref.data(), db.data());
    const std::vector<float> got = emulate(s, h, x, dy);
    ASSERT_EQ(got, ref) << "N=" << s.n << " " << s.h << "x" << s.w << " k " << s.kh << "x" << s.kw
                        << " pad " << s.pad_h << "," << s.pad_w;
    EXPECT_EQ(h.x_slot_rows % 8, 0);
    EXPECT_EQ(h.k_rows % 16, 0);
    EXPECT_GE(h.stages, 2);
    // Every tap is in one group, each consumer's half at most kWgradHaloTapsPerConsumer.
    const int taps = s.kh * s.kw;
    const WgradHaloTaps g = wgrad_halo_taps(taps);
    int covered = 0;
    for (int i = 0; i < g.groups; ++i) {
      EXPECT_EQ(g.first(i, taps), covered);
      EXPECT_LE((g.count(i, taps) + 1) / 2, kWgradHaloTapsPerConsumer);
      covered += g.count(i, taps);
    }
    EXPECT_EQ(covered, taps);
    ++checked;
  }
  EXPECT_EQ(checked, 11);
}
