// The k-tile of the TF32 halo weight gradient (kernels/conv/conv2d_wgrad_tf32_halo_layout.h), host
// code: known shapes, the refusals, the tap split, the bank rule of the fragment loads, and the
// kernel's arithmetic modelled on the CPU (boxes as the TMA lands them, every tap read at the
// fragment offsets) against the weight gradient.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_wgrad_tf32_halo_layout.h"
#include "runtime/error.h"
#include "tests/conv_test_cases.h"

using namespace cnn;
using conv_test::conv;

TEST(ConvWgradTf32HaloLayout, KnownShapes) {
  // ResNet's 64-channel 32x32 layers: 2 output rows (64 pixels) a k-tile, 5 x rows (4, odd) of
  // pitch 36 (33 rounded to 4s, 9 quads): 64 x 180 floats = 46080 bytes + the guard: 46 KB, then
  // two dy boxes (16 KB): 3 stages of 63 KB.
  const WgradTf32HaloGeometry h =
      wgrad_tf32_halo_geometry(conv(128, 64, 32, 32, 64, 3, 3, 1, 1, 1, 1), "t");
  EXPECT_EQ(h.rows, 2);
  EXPECT_EQ(h.k, 64);
  EXPECT_EQ(h.ksteps, 8);
  EXPECT_EQ(h.dy_boxes, 2);
  EXPECT_EQ(h.bands, 16);
  EXPECT_EQ(h.ktiles, 2048);
  EXPECT_EQ(h.pitch, 36);
  EXPECT_EQ(h.rows_x, 5);
  EXPECT_EQ(h.chan_stride, 180);
  EXPECT_EQ(h.x_slot_bytes(), 47104);
  EXPECT_EQ(h.stage_bytes(), 47104 + 16384);
  EXPECT_EQ(h.stages, 3);
  // 8x8 planes: a whole image (64 pixels) a k-tile; 11 rows (10, odd) of pitch 12 (9 -> 12).
  const WgradTf32HaloGeometry e =
      wgrad_tf32_halo_geometry(conv(128, 256, 8, 8, 256, 3, 3, 1, 1, 1, 1), "t");
  EXPECT_EQ(e.rows, 8);
  EXPECT_EQ(e.bands, 1);
  EXPECT_EQ(e.pitch, 12);
  EXPECT_EQ(e.rows_x, 11);
  // 16x16: 4 rows; pitch 20 (17 -> 20, 5 quads); 7 rows (6, odd).
  const WgradTf32HaloGeometry m =
      wgrad_tf32_halo_geometry(conv(128, 128, 16, 16, 128, 3, 3, 1, 1, 1, 1), "t");
  EXPECT_EQ(m.rows, 4);
  EXPECT_EQ(m.pitch, 20);
  EXPECT_EQ(m.rows_x, 7);
  // 56x56 (ImageNet's first stage): one row of 56 pixels a k-tile, 7 k steps, pitch 60.
  const WgradTf32HaloGeometry w =
      wgrad_tf32_halo_geometry(conv(2, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1), "t");
  EXPECT_EQ(w.rows, 1);
  EXPECT_EQ(w.k, 56);
  EXPECT_EQ(w.ksteps, 7);
  EXPECT_EQ(w.dy_boxes, 2);
  EXPECT_EQ(w.pitch, 60);
  EXPECT_EQ(w.rows_x, 3);
  // The taps: 9 in two blocks of 4 (1 + 1 + 2 a consumer) and 5 (1 + 2 + 2); 25 in 5 blocks of 5.
  const WgradTf32HaloTaps t9 = wgrad_tf32_halo_taps(9);
  EXPECT_EQ(t9.groups, 2);
  EXPECT_EQ(t9.count(0, 9), 4);
  EXPECT_EQ(t9.count(1, 9), 5);
  EXPECT_EQ(WgradTf32HaloTaps::consumer_count(5, 0), 1);
  EXPECT_EQ(WgradTf32HaloTaps::consumer_count(5, 1), 2);
  EXPECT_EQ(WgradTf32HaloTaps::consumer_count(5, 2), 2);
  const WgradTf32HaloTaps t25 = wgrad_tf32_halo_taps(25);
  EXPECT_EQ(t25.groups, 5);
  for (int g = 0; g < 5; ++g) EXPECT_EQ(t25.count(g, 25), 5);
  EXPECT_EQ(WgradTf32HaloTaps::consumer_count(4, 0), 1);
  EXPECT_EQ(WgradTf32HaloTaps::consumer_count(4, 2), 2);
}

TEST(ConvWgradTf32HaloLayout, Refusals) {
  const auto refused = [](const Conv2dShape& s, const char* word) {
    const std::string why = wgrad_tf32_halo_shape_refusal(s);
    EXPECT_NE(why.find(word), std::string::npos) << "'" << why << "' lacks '" << word << "'";
    EXPECT_EQ(why.find('\n'), std::string::npos) << why;
  };
  EXPECT_TRUE(wgrad_tf32_halo_shape_refusal(conv(1, 16, 8, 8, 8, 3, 3, 1, 1, 1, 1)).empty());
  refused(conv(1, 16, 16, 16, 8, 3, 3, 2, 2, 1, 1), "stride");
  refused(conv(1, 16, 14, 14, 8, 3, 3, 1, 1, 1, 1), "OW");   // 14 not a multiple of 8
  refused(conv(1, 16, 8, 72, 8, 3, 3, 1, 1, 1, 1), "OW");    // 72 over 64
  refused(conv(1, 16, 8, 10, 8, 3, 3, 1, 1, 0, 0), "W a");   // OW 8, but W 10
  refused(conv(1, 8, 8, 8, 8, 3, 3, 1, 1, 1, 1), "16 input");
  refused(conv(1, 16, 8, 8, 8, 1, 1, 1, 1, 0, 0), "4 taps");
  Conv2dShape dil = conv(1, 16, 12, 12, 8, 3, 3, 1, 1, 2, 2);
  dil.dil_h = dil.dil_w = 2;
  refused(dil, "dilation");
  try {
    wgrad_tf32_halo_geometry(conv(1, 16, 14, 14, 8, 3, 3, 1, 1, 1, 1), "conv2d_backward_weight");
    ADD_FAILURE() << "OW 14 was not refused";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("conv2d_backward_weight: the TF32 halo"), std::string::npos) << msg;
  }
}

TEST(ConvWgradTf32HaloLayout, FragmentLoadsMeetNoBankConflict) {
  // One load of a fragment register: lanes l read channel l / 4 (8 consecutive channels: rows g
  // of the m16n8k8 fragment) at pixel k0 + l % 4 (4 consecutive pixels of one output row, as OW
  // is a multiple of 8), at any tap: 32 different banks.
  for (const Conv2dShape& s :
       {conv(4, 64, 32, 32, 64, 3, 3, 1, 1, 1, 1), conv(4, 128, 16, 16, 128, 3, 3, 1, 1, 1, 1),
        conv(4, 256, 8, 8, 256, 3, 3, 1, 1, 1, 1), conv(2, 32, 24, 24, 16, 5, 5, 1, 1, 2, 2),
        conv(2, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1), conv(1, 16, 20, 16, 16, 7, 7, 1, 1, 3, 3)}) {
    const WgradTf32HaloGeometry h = wgrad_tf32_halo_geometry(s, "t");
    EXPECT_EQ(h.pitch % 4, 0);
    EXPECT_EQ((h.chan_stride / 4) % 2, 1) << s.h << "x" << s.w;
    for (int c0 = 0; c0 < 64; c0 += 8)
      for (int ks = 0; ks < h.ksteps; ++ks)
        for (int half = 0; half < 2; ++half)
          for (int tap = 0; tap < s.kh * s.kw; ++tap) {
            std::set<int> banks;
            for (int lane = 0; lane < 32; ++lane) {
              const int at = kWgradTf32HaloGuardFloats + (c0 + lane / 4) * h.chan_stride +
                             h.pixel_offset(8 * ks + lane % 4 + 4 * half, s.ow()) +
                             h.tap_offset(tap / s.kw, tap % s.kw, s.pad_w);
              banks.insert(at % 32);
            }
            ASSERT_EQ(banks.size(), 32u) << s.h << "x" << s.w << " ks " << ks << " tap " << tap;
          }
  }
}

TEST(ConvWgradTf32HaloLayout, ModelGivesTheGradient) {
  int checked = 0;
  for (const Conv2dShape& s :
       {conv(2, 16, 8, 8, 5, 3, 3, 1, 1, 1, 1), conv(3, 20, 13, 16, 70, 3, 3, 1, 1, 1, 1),
        conv(1, 17, 12, 16, 3, 5, 5, 1, 1, 2, 2), conv(2, 70, 8, 8, 9, 3, 3, 1, 1, 1, 1),
        conv(1, 16, 9, 24, 4, 2, 3, 1, 1, 0, 1), conv(1, 16, 5, 56, 3, 3, 3, 1, 1, 1, 1),
        conv(2, 16, 11, 12, 2, 7, 7, 1, 1, 3, 1), conv(1, 16, 6, 20, 2, 3, 5, 1, 1, 0, 0)}) {
    const std::string why = wgrad_tf32_halo_shape_refusal(s);
    if (!why.empty()) {
      ADD_FAILURE() << "refused: " << why;
      continue;
    }
    const int64_t nx = int64_t(s.n) * s.c * s.h * s.w, ny = int64_t(s.n) * s.oc * s.oh() * s.ow();
    std::vector<float> x(static_cast<size_t>(nx)), dy(static_cast<size_t>(ny));
    for (size_t i = 0; i < x.size(); ++i) x[i] = float(int((i * 7 + 13) % 7) - 3);
    for (size_t i = 0; i < dy.size(); ++i) dy[i] = float(int((i * 5 + 26) % 9) - 4);
    const size_t nw = size_t(s.oc) * s.c * s.kh * s.kw;
    std::vector<float> ref(nw, 0.f);
    conv2d_backward_weight_cpu(s, x.data(), dy.data(), ref.data(), nullptr);
    std::vector<double> got(nw, 0.0);
    wgrad_tf32_halo_model(s, x.data(), dy.data(), got.data());
    for (size_t i = 0; i < nw; ++i)
      ASSERT_EQ(got[i], double(ref[i])) << "element " << i << " of " << s.h << "x" << s.w << " k "
                                        << s.kh << "x" << s.kw << " pad " << s.pad_h << ","
                                        << s.pad_w;
    ++checked;
  }
  EXPECT_EQ(checked, 8);
}
