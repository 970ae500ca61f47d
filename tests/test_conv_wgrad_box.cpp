// The box geometry of the TMA-box wgmma weight gradient (kernels/conv/conv2d_wgrad_box.h), on
// the CPU:
//   BoxWidths       bw / br per output width (32x1, 16x2, 8x4) whatever the stride, boxes per
//                   image; a shape past the 32-bit indices refused in one line.
//   Copies          the tap-class copies of x: how many, their rows and row length (a multiple of
//                   4 floats), x itself for an unpadded stride-1 1x1 with W a multiple of 4.
//   BoxesAlignedAndInside  every box corner the kernel issues: innermost coordinate a multiple
//                   of 4 floats, all coordinates >= 0, every live pixel read inside the copy and
//                   equal to its input under the tap (x or the padding's 0).
//   DirectClass     which shapes have a tap class whose boxes read x itself (stride 1, W a
//                   multiple of 4, column shift 0); BoxesAlignedAndInside and EmulatedGemm run
//                   with and without it (its copy left NaN, so a stray read shows).
//   KnownCorners    B's box corners of a 3x3 padding-1 stride-2 and a 7x7 stride-1 convolution
//                   for chosen k-tiles and groups.
//   RunChoice       auto's run of channels a piece of B (conv2d_wgrad_box.h) on VGG's layers and
//                   on C that would pad (3, 24, 40, 100), the boxes of B a stage, every box
//                   destination of a pick on a 1024-byte boundary; a run of 24 refused.
//   ColumnsOnce     every (channel, tap) of dw is one column exactly, for every run; channels
//                   past C and columns past the bias column are discarded.
//   SmemAddressing  the shared-memory side (conv2d_wgrad_box_smem.h), element by element for
//                   each box width, tile height and run (one box a piece or a slab): the boxes land
//                   where TMA puts them (as measured on the H200) and every (row, k) the consumers'
//                   descriptors make wgmma read is the intended element; the gathered A writes
//                   where TMA would; slabs start on swizzle atoms; the first boxes' layout fails it
//                   for bw 8, 16, and so does one box a piece for run 16..64 at bw 8, 16.
//   EmulatedGemm    the whole scheme (copies, boxes landing in an emulated stage of shared
//                   memory with out-of-bounds zeros, operands read back through the kernel's
//                   descriptors, columns mapped back) against conv2d_backward_weight_cpu on
//                   awkward shapes, every run, small integers (exact).
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
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

// Every run a piece of B may have: auto's pick, then each forced width.
constexpr int kRuns[] = {kWgradBoxRunAuto, 8, 16, 32, 64, 128};

Conv2dShape with_ow(int ow, int stride) {
  // k = 1, no padding: OW = (W - 1) / stride + 1.
  return conv(1, 3, 5, (ow - 1) * stride + 1, 4, 1, stride, 0);
}

TEST(ConvWgradBox, BoxWidths) {
  struct Case {
    int ow, stride, bw, boxes_x;
  };
  // The stride does not narrow the box (the copies take it out of the rows).
  for (const Case& c : {Case{64, 1, 32, 2}, Case{33, 1, 32, 2}, Case{32, 1, 32, 1},
                        Case{28, 1, 32, 1}, Case{16, 1, 16, 1}, Case{14, 1, 16, 1},
                        Case{13, 1, 16, 1}, Case{8, 1, 8, 1}, Case{7, 1, 8, 1}, Case{1, 1, 8, 1},
                        Case{32, 2, 32, 1}, Case{16, 2, 16, 1}, Case{9, 2, 16, 1}, Case{8, 2, 8, 1},
                        Case{40, 3, 32, 2}, Case{16, 4, 16, 1}, Case{17, 5, 32, 1}}) {
    const Conv2dShape s = with_ow(c.ow, c.stride);
    ASSERT_EQ(s.ow(), c.ow);
    const WgradBoxGeometry g = wgrad_box_geometry(s);
    SCOPED_TRACE("OW " + std::to_string(c.ow) + " stride " + std::to_string(c.stride));
    EXPECT_EQ(g.bw, c.bw);
    EXPECT_EQ(g.bw * g.br, kWgradBoxPixels);
    EXPECT_EQ(g.boxes_x, c.boxes_x);
    EXPECT_EQ(g.boxes_y, (s.oh() + g.br - 1) / g.br);
    EXPECT_EQ(g.kt_img, g.boxes_x * g.boxes_y);
  }
  // Past the 32-bit indices: refused in one line naming the limit.
  const Conv2dShape huge = conv(1 << 30, 1, 5, 5, 1, 3, 1, 1);
  const std::string why = wgrad_box_refusal(huge);
  EXPECT_TRUE(test::contains(why, "32-bit")) << why;
  EXPECT_EQ(why.find('\n'), std::string::npos) << why;
  try {
    wgrad_box_geometry(huge);
    ADD_FAILURE() << "N = 2^30 accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(test::contains(e.what(), "limits")) << e.what();
  }
}

TEST(ConvWgradBox, Copies) {
  struct Case {
    Conv2dShape s;
    int copies_h, copies_w, copy_h, copy_w;
    bool reads_x;
  };
  for (const Case& c : {
           // 3x3 padding 1: three column classes, the padding rows inside the copy.
           Case{conv(2, 3, 32, 32, 4, 3, 1, 1), 1, 3, 34, 32, false},
           // W = 13: rows rounded up to 16 floats.
           Case{conv(2, 3, 13, 13, 4, 3, 1, 1), 1, 3, 15, 16, false},
           // 7x7 stride 1: four column classes, taps 4..6 four columns on.
           Case{conv(1, 3, 16, 16, 4, 7, 1, 3), 1, 4, 22, 20, false},
           // 7x7 stride-2 stem: 2 x 7 classes of a quarter of x each.
           Case{conv(1, 3, 64, 64, 4, 7, 2, 3), 2, 7, 35, 32, false},
           // 5x5 stride 2 padding 2, and 3x3 stride 2 unpadded.
           Case{conv(1, 3, 33, 33, 4, 5, 2, 2), 2, 5, 19, 20, false},
           Case{conv(1, 3, 17, 17, 4, 3, 2, 0), 2, 3, 9, 8, false},
           // 1x1: x itself where nothing moves, else one copy (strided: a quarter of x).
           Case{conv(1, 3, 16, 16, 4, 1, 1, 0), 1, 1, 16, 16, true},
           Case{conv(1, 3, 13, 13, 4, 1, 1, 0), 1, 1, 13, 16, false},
           Case{conv(1, 3, 16, 16, 4, 1, 2, 0), 1, 1, 8, 8, false},
           Case{conv(1, 3, 16, 16, 4, 1, 1, 1), 1, 1, 18, 20, false},
       }) {
    const Conv2dShape& s = c.s;
    SCOPED_TRACE("HxW " + std::to_string(s.h) + "x" + std::to_string(s.w) + " k " +
                 std::to_string(s.kh) + " stride " + std::to_string(s.stride_h) + " pad " +
                 std::to_string(s.pad_h));
    const WgradBoxGeometry g = wgrad_box_geometry(s);
    EXPECT_EQ(g.copies_h, c.copies_h);
    EXPECT_EQ(g.copies_w, c.copies_w);
    EXPECT_EQ(g.copies, c.copies_h * c.copies_w);
    EXPECT_EQ(g.copy_h, c.copy_h);
    EXPECT_EQ(g.copy_w, c.copy_w);
    EXPECT_EQ(g.copy_w % 4, 0);  // rows of a multiple of 16 bytes: TMA's stride rule
    EXPECT_EQ(g.reads_x, c.reads_x);
    EXPECT_EQ(g.copy_floats,
              c.reads_x ? 0 : int64_t{g.copies} * s.n * s.c * int64_t{g.copy_h} * g.copy_w);
  }
}

// Every box of B that the kernel issues, for every k-tile and group: its innermost coordinate a
// multiple of 4 floats (16 bytes, the rule the boxes of x itself broke), every coordinate >= 0,
// and for each live output pixel (oy < OH, ox < OW) the element it reads inside the copy (not
// TMA's out-of-bounds fill) and equal to that pixel's input under the tap: x, or 0 in the padding.
TEST(ConvWgradBox, BoxesAlignedAndInside) {
  const Conv2dShape shapes[] = {
      conv(2, 3, 13, 13, 4, 3, 1, 1), conv(1, 9, 16, 16, 4, 5, 1, 2),
      conv(2, 3, 20, 18, 4, 7, 2, 3), conv(1, 2, 13, 29, 4, 1, 1, 0),
      conv(1, 3, 16, 16, 4, 1, 1, 0), conv(1, 2, 30, 30, 4, 7, 1, 3),
      conv(2, 17, 11, 9, 4, 3, 2, 0), conv(1, 2, 23, 23, 4, 5, 3, 2),
      conv(1, 2, 17, 17, 4, 3, 4, 1), conv(1, 2, 40, 40, 4, 3, 5, 1),
      conv(1, 3, 9, 9, 4, 5, 1, 4),   conv(3, 3, 6, 6, 4, 3, 1, 3),
      conv(1, 40, 8, 8, 4, 3, 1, 1),  conv(1, 130, 16, 12, 4, 3, 2, 1),
      conv(1, 3, 12, 12, 4, 7, 1, 3), conv(2, 4, 8, 16, 4, 3, 1, 0),
      conv(2, 5, 8, 12, 4, 1, 1, 1),  conv(1, 3, 36, 36, 4, 3, 1, 1),
  };
  for (const Conv2dShape& s : shapes)
    for (int run : kRuns)
      for (bool direct : {false, true}) {
        SCOPED_TRACE("C=" + std::to_string(s.c) + " HxW=" + std::to_string(s.h) + "x" +
                     std::to_string(s.w) + " k=" + std::to_string(s.kh) +
                     " stride=" + std::to_string(s.stride_h) + " pad=" + std::to_string(s.pad_h) +
                     " run " + std::to_string(run) + " direct " + std::to_string(direct));
        const WgradBoxGeometry g = wgrad_box_geometry(s, run);
        std::vector<float> x(size_t(s.n) * s.c * s.h * s.w);
        for (size_t i = 0; i < x.size(); ++i) x[i] = float(i + 1);  // every value distinct, none 0
        // The skipped copy stays NaN: a box of another class that read it would not match.
        std::vector<float> copies(size_t(g.copy_floats), std::numeric_limits<float>::quiet_NaN());
        wgrad_box_copies_cpu(s, g, x.data(), copies.data(), direct ? g.direct_copy : -1);
        const float* src = g.reads_x ? x.data() : copies.data();
        const int src_w = g.reads_x ? s.w : g.copy_w, src_h = g.reads_x ? s.h : g.copy_h;
        int64_t bad = 0;
        for (int n = 0; n < s.n; ++n)
          for (int t = 0; t < g.kt_img; ++t) {
            const WgradBoxOrigin o = wgrad_box_origin(g, t);
            for (int group = 0; group < g.groups; ++group) {
              const WgradBoxCorner k = wgrad_box_corner(s, g, o, group, direct);
              ASSERT_EQ(k.x % 4, 0) << "k-tile " << t << " group " << group << ": x " << k.x;
              ASSERT_GE(k.x, 0);
              ASSERT_GE(k.c, 0);
              if (k.copy >= 0) {
                ASSERT_GE(k.y, 0);  // the copies hold the padding: no coordinate below 0
                ASSERT_LT(k.copy, g.copies);
              } else {  // x itself: only the direct class, when asked
                ASSERT_TRUE(direct);
                ASSERT_GE(g.direct_copy, 0);
                ASSERT_EQ(s.stride_h * s.stride_w, 1);
                ASSERT_EQ(s.w % 4, 0);  // x's rows: a multiple of 16 bytes, TMA's stride rule
              }
              const int tap = group / g.cgroups, kh = tap / s.kw, kw = tap % s.kw;
              for (int i = 0; i < g.run && k.c + i < s.c; ++i)
                for (int r = 0; r < g.br; ++r)
                  for (int col = 0; col < g.bw; ++col) {
                    const int oy = o.oy0 + r, ox = o.ox0 + col;
                    if (oy >= s.oh() || ox >= s.ow()) continue;
                    const int bx = k.x + col, by = k.y + r;
                    float got;
                    if (k.copy < 0) {  // TMA's zero fill outside x, above it as below
                      const bool in = by >= 0 && by < s.h && bx < s.w;
                      got = in ? x[((int64_t(n) * s.c + k.c + i) * s.h + by) * s.w + bx] : 0.f;
                    } else {
                      if (bx >= src_w || by >= src_h) {
                        if (bad++ == 0)
                          ADD_FAILURE()
                              << "live pixel (" << oy << ", " << ox << ") of tap (" << kh << ", "
                              << kw << ") reads past the copy at (" << by << ", " << bx << ")";
                        continue;
                      }
                      got = src[((int64_t(k.copy * s.n + n) * s.c + k.c + i) * src_h + by) * src_w +
                                bx];
                    }
                    const int ih = oy * s.stride_h - s.pad_h + kh,
                              iw = ox * s.stride_w - s.pad_w + kw;
                    const bool in = ih >= 0 && ih < s.h && iw >= 0 && iw < s.w;
                    const float want =
                        in ? x[((int64_t(n) * s.c + k.c + i) * s.h + ih) * s.w + iw] : 0.f;
                    if (!(got == want) && bad++ == 0)
                      ADD_FAILURE()
                          << "pixel (" << oy << ", " << ox << ") channel " << k.c + i << " tap ("
                          << kh << ", " << kw << "): got " << got << ", expected " << want;
                  }
            }
          }
        EXPECT_EQ(bad, 0);
      }
}

// The direct class: which shapes have one, and the copies it spares.
TEST(ConvWgradBox, DirectClass) {
  struct Case {
    Conv2dShape s;
    int direct_copy;
  };
  for (const Case& c : {
           Case{conv(2, 128, 16, 16, 8, 3, 1, 1), 1},  // 3x3 padding 1: the middle column
           Case{conv(2, 64, 32, 32, 8, 3, 1, 0), 0},   // unpadded: the first
           Case{conv(2, 8, 16, 16, 8, 5, 1, 2), 2},    // 5x5 padding 2 (4 classes)
           Case{conv(2, 8, 16, 16, 8, 7, 1, 3), 3},    // 7x7 padding 3
           Case{conv(2, 8, 16, 16, 8, 1, 1, 1), -1},   // 1x1 padding 1: column shift -1
           Case{conv(2, 8, 16, 16, 8, 1, 1, 0), -1},   // reads x itself already
           Case{conv(2, 8, 13, 13, 8, 3, 1, 1), -1},   // W = 13: x's rows not 16-byte multiples
           Case{conv(2, 8, 16, 16, 8, 3, 2, 1), -1},   // stride 2: the copies hold the stride
           Case{conv(2, 8, 16, 16, 8, 3, 1, 3), -1},   // padding 3 >= 3 classes
       }) {
    SCOPED_TRACE("k=" + std::to_string(c.s.kh) + " pad=" + std::to_string(c.s.pad_w) +
                 " W=" + std::to_string(c.s.w) + " stride=" + std::to_string(c.s.stride_w));
    const WgradBoxGeometry g = wgrad_box_geometry(c.s);
    EXPECT_EQ(g.direct_copy, c.direct_copy);
  }
}

TEST(ConvWgradBox, KnownCorners) {
  // C = 17: 3 channel groups; 3x3 taps; stride 2, padding 1 on 33x33: OH = OW = 17, bw = 32;
  // copies: rows kh mod 2 x columns kw (3 < 8).
  const Conv2dShape s = conv(2, 17, 33, 33, 4, 3, 2, 1);
  const WgradBoxGeometry g = wgrad_box_geometry(s, 8);
  ASSERT_EQ(g.run, 8);
  ASSERT_EQ(g.bw, 32);
  ASSERT_EQ(g.br, 1);
  EXPECT_EQ(g.boxes_x, 1);
  EXPECT_EQ(g.boxes_y, 17);
  EXPECT_EQ(g.cgroups, 3);
  EXPECT_EQ(g.groups, 27);
  EXPECT_EQ(g.bias_col, 216);
  EXPECT_EQ(g.copies, 6);
  const WgradBoxOrigin o0 = wgrad_box_origin(g, 0);
  EXPECT_EQ(o0.ox0, 0);
  EXPECT_EQ(o0.oy0, 0);
  // Group 0: tap (0, 0), channels 0..7: copy 0 at the origin (its padding is the copy's zeros).
  WgradBoxCorner k = wgrad_box_corner(s, g, o0, 0);
  EXPECT_EQ(k.x, 0);
  EXPECT_EQ(k.y, 0);
  EXPECT_EQ(k.c, 0);
  EXPECT_EQ(k.copy, 0);
  // k-tile 5: oy0 = 5; group 3 * 5 + 2 = tap 5 = (1, 2), channels 16..23: copy (1, 2) = 5.
  const WgradBoxOrigin o5 = wgrad_box_origin(g, 5);
  EXPECT_EQ(o5.ox0, 0);
  EXPECT_EQ(o5.oy0, 5);
  k = wgrad_box_corner(s, g, o5, 17);
  EXPECT_EQ(k.x, 0);
  EXPECT_EQ(k.y, 5);
  EXPECT_EQ(k.c, 16);
  EXPECT_EQ(k.copy, 5);
  // Group 3 * 8 = tap (2, 2): row class 0 one row on (2 = 0 + 2 * 1), copy (0, 2) = 2.
  k = wgrad_box_corner(s, g, o5, 24);
  EXPECT_EQ(k.y, 6);
  EXPECT_EQ(k.copy, 2);
  // 7x7 stride 1 padding 3, OW = 40: column classes kw mod 4; tap (0, 5) is class 1 four columns
  // on; k-tile 1 starts at ox0 = 32.
  const Conv2dShape s7 = conv(1, 8, 40, 40, 4, 7, 1, 3);
  const WgradBoxGeometry g7 = wgrad_box_geometry(s7);
  ASSERT_EQ(g7.copies, 4);
  k = wgrad_box_corner(s7, g7, wgrad_box_origin(g7, 1), 5);
  EXPECT_EQ(k.x, 32 + 4);
  EXPECT_EQ(k.y, 0);
  EXPECT_EQ(k.copy, 1);
  // Runs of 128 with C = 256, 3x3: two pieces a tap; piece 5 = tap 2 = (0, 2), channels 128..255.
  const Conv2dShape s256 = conv(1, 256, 8, 8, 4, 3, 1, 1);
  const WgradBoxGeometry g256 = wgrad_box_geometry(s256);
  ASSERT_EQ(g256.run, 128);
  EXPECT_EQ(g256.cgroups, 2);
  EXPECT_EQ(g256.groups, 18);
  EXPECT_EQ(g256.bias_col, 18 * 128);
  k = wgrad_box_corner(s256, g256, wgrad_box_origin(g256, 0), 5);
  EXPECT_EQ(k.x, 0);
  EXPECT_EQ(k.c, 128);
  EXPECT_EQ(k.copy, 2);
}

// Auto's run: the fewest boxes of B a stage whose zero columns stay within a quarter of run 8's,
// unless the cost model (column tiles x (100 + 6 boxes)) predicts 7% less for another run where
// the boxes lie mostly inside the output.
TEST(ConvWgradBox, RunChoice) {
  struct Case {
    Conv2dShape s;
    int run, b_boxes, bias_col;
  };
  for (const Case& c : {
           // VGG conv4 (bw 16): 1 box of 16 KB a stage instead of 16 of 1 KB.
           Case{conv(2, 128, 16, 16, 128, 3, 1, 1), 128, 1, 1152},
           // C = 64 at 16x16: pieces of 64, two boxes each (one a slab): 4 boxes.
           Case{conv(2, 64, 16, 16, 64, 3, 1, 1), 64, 4, 576},
           // C = 64 at 32x32 (bw 32, one slab): one box a piece, 2 a stage.
           Case{conv(2, 64, 32, 32, 64, 3, 1, 1), 64, 2, 576},
           // C = 256 and 512 at 8x8 / 4x4 (bw 8): a tap spans tiles, one box a tile.
           Case{conv(2, 256, 8, 8, 256, 3, 1, 1), 128, 1, 2304},
           Case{conv(2, 512, 4, 4, 512, 3, 1, 1), 128, 1, 4608},
           // C = 100: 28 zero channels a tap (23% more columns) for 1 box instead of 16.
           Case{conv(2, 100, 16, 16, 8, 3, 1, 1), 128, 1, 1152},
           // C = 3, 8, 24: wider runs would multiply zeros; the 8-channel groups stay.
           Case{conv(2, 3, 32, 32, 8, 3, 1, 1), 8, 16, 72},
           Case{conv(2, 8, 16, 16, 8, 3, 1, 1), 8, 16, 72},
           Case{conv(2, 24, 16, 16, 8, 3, 1, 1), 8, 16, 216},
           // C = 40 at 8x8 (bw 8): 64 would add 60% zeros, 16 is 32 boxes (8 pieces x 4 slabs).
           Case{conv(2, 40, 8, 8, 8, 3, 1, 1), 8, 16, 360},
           // C = 40 at 32x32 (bw 32): 16-channel pieces are one box each, 8 a stage (20% zeros);
           // the model's 64 (2 boxes, 60% zeros) is only 5% cheaper.
           Case{conv(2, 40, 32, 32, 8, 3, 1, 1), 16, 8, 432},
           // The model (measured on the H100 at batch 128): C = 160 at 8x8 takes 128 (18 tiles
           // of 1 box, 91.8 us) over the rule's 64 (14 tiles of 8 boxes, 103.6 us); C = 96 at
           // 16x16 takes 128 (133.9 us) over the rule's 32 (166.5 us); C = 48 at 16x16 takes 64.
           Case{conv(2, 160, 8, 8, 192, 3, 1, 1), 128, 1, 2304},
           Case{conv(2, 96, 16, 16, 160, 3, 1, 1), 128, 1, 1152},
           Case{conv(2, 48, 16, 16, 96, 3, 1, 1), 64, 4, 576},
           // Half of each 8-wide box past a 4x4 output: the rule (C = 160: 64, 96.1 us against
           // 110.0 at 128).
           Case{conv(2, 160, 4, 4, 320, 3, 1, 1), 64, 8, 1728},
       }) {
    SCOPED_TRACE("C=" + std::to_string(c.s.c) + " W=" + std::to_string(c.s.w));
    const WgradBoxGeometry g = wgrad_box_geometry(c.s);
    EXPECT_EQ(g.run, c.run);
    EXPECT_EQ(g.b_boxes, c.b_boxes);
    EXPECT_EQ(g.bias_col, c.bias_col);
    EXPECT_EQ(wgrad_box_geometry(c.s, 8).b_boxes, 16);  // the forced groups
  }
  // Every pick lands its boxes on 1024-byte boundaries (as the first layout's 1 KB groups did).
  for (int c = 1; c <= 300; c += 7)
    for (int w : {32, 16, 8}) {
      const Conv2dShape s = conv(1, c, w, w, 8, 3, 1, 1);
      const WgradBoxGeometry g = wgrad_box_geometry(s);
      for (int piece = 0; piece < 128 / g.run; ++piece)
        for (int r = 0; r < g.b.boxes_per_piece; ++r)
          EXPECT_EQ(wgrad_box_b_dst(g.bw, g.b, piece, r) % 1024, 0u)
              << "C=" << c << " W=" << w << " run " << g.run << " piece " << piece;
    }
  try {
    wgrad_box_geometry(conv(1, 8, 8, 8, 8, 3, 1, 1), 24);
    ADD_FAILURE() << "run 24 accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(test::contains(e.what(), "run 24")) << e.what();
  }
}

TEST(ConvWgradBox, ColumnsOnce) {
  for (const Conv2dShape& s : {conv(1, 1, 9, 9, 3, 1, 1, 0), conv(1, 17, 9, 9, 3, 3, 1, 1),
                               conv(1, 8, 9, 9, 3, 5, 2, 2), conv(1, 130, 9, 9, 3, 7, 1, 3),
                               conv(1, 256, 9, 9, 3, 3, 1, 1), conv(1, 100, 9, 9, 3, 1, 1, 0)})
    for (int run : kRuns) {
      SCOPED_TRACE("C=" + std::to_string(s.c) + " run " + std::to_string(run));
      const WgradBoxGeometry g = wgrad_box_geometry(s, run);
      const int64_t ckhw = int64_t{s.c} * s.kh * s.kw;
      std::vector<int> seen(size_t(ckhw), 0);
      int bias = 0;
      for (int col = 0; col < g.bias_col + 200; ++col) {
        const int64_t slot = wgrad_box_column_slot(s, g, col);
        if (slot >= 0) {
          ASSERT_LT(slot, ckhw);
          ++seen[size_t(slot)];
          // The column's piece is its tap's, its channel the slot's.
          EXPECT_EQ(slot % g.taps, (col / g.run) / g.cgroups) << col;
          EXPECT_EQ(slot / g.taps, ((col / g.run) % g.cgroups) * g.run + col % g.run) << col;
        } else if (slot == -1) {
          ++bias;
          EXPECT_EQ(col, g.bias_col);
        }
      }
      EXPECT_EQ(bias, 1);
      for (int64_t i = 0; i < ckhw; ++i) EXPECT_EQ(seen[size_t(i)], 1) << "slot " << i;
    }
}

// Tags of the elements of one stage: A (tile row m, pixel q) and B (tile column j, pixel q).
int a_tag(int m, int q) {
  return m * kWgradBoxPixels + q;
}
int b_tag(int j, int q) {
  return 1 << 20 | (j * kWgradBoxPixels + q);
}

// Lands one stage's boxes (A: (bw, BM, br, 1); B: the 128 / run pieces of a full tile, each
// boxes_per_piece boxes (bw, run, box_rows, 1) at wgrad_box_b_dst) with TMA swizzle span
// `map_span`, then reads every (row, k) of every k8 step through the descriptors
// `desc(operand, warpgroup, step)` and counts the elements that are not the intended one
// (overlapping landings and reads of unwritten bytes included).
template <typename Desc>
int64_t stage_mismatches(int bw, int bm, int run, uint32_t map_span, Desc desc) {
  const int br = kWgradBoxPixels / bw;
  const WgradBoxBLayout l = wgrad_box_b_layout(bw, run);
  const uint32_t b_base = uint32_t(bm) * kWgradBoxPixels * 4;
  std::vector<int> tag(size_t(b_base) * 8, -1);  // room for rows padded to a wider span
  int64_t bad = 0;
  auto land = [&](uint32_t addr, int value) {
    if (addr / 4 >= tag.size() || tag[addr / 4] != -1) {
      ++bad;
      return;
    }
    tag[addr / 4] = value;
  };
  for (int r = 0; r < br; ++r)
    for (int m = 0; m < bm; ++m)
      for (int col = 0; col < bw; ++col)
        land(tma_box_landing_offset(bw, map_span, r * bm + m, col), a_tag(m, r * bw + col));
  EXPECT_EQ(l.box_rows * l.boxes_per_piece, br);
  for (int piece = 0; piece < 128 / run; ++piece)
    for (int b = 0; b < l.boxes_per_piece; ++b) {
      const uint32_t dst = b_base + wgrad_box_b_dst(bw, l, piece, b);
      for (int r = 0; r < l.box_rows; ++r)
        for (int i = 0; i < run; ++i)
          for (int col = 0; col < bw; ++col)
            land(dst + tma_box_landing_offset(bw, map_span, r * run + i, col),
                 b_tag(piece * run + i, (b + r) * bw + col));
    }
  auto read = [&](uint32_t addr) { return addr / 4 < tag.size() ? tag[addr / 4] : -2; };
  for (int step = 0; step < kWgradBoxPixels / 8; ++step) {
    for (int wg = 0; wg < bm / 64; ++wg)
      for (int i = 0; i < 64; ++i)
        for (int k = 0; k < 8; ++k)
          bad += read(wgmma_kmajor_read_address(desc(0, wg, step), i, k)) !=
                 a_tag(64 * wg + i, 8 * step + k);
    for (int j = 0; j < 128; ++j)
      for (int k = 0; k < 8; ++k)
        bad += read(wgmma_kmajor_read_address(desc(1, 0, step), j, k)) != b_tag(j, 8 * step + k);
  }
  return bad;
}

TEST(ConvWgradBox, SmemAddressing) {
  for (int bw : {8, 16, 32})
    for (int bm : {64, 128})
      for (int run : {8, 16, 32, 64, 128}) {
        SCOPED_TRACE("bw " + std::to_string(bw) + " BM " + std::to_string(bm) + " run " +
                     std::to_string(run));
        const uint32_t span = wgrad_span_bytes(bw);
        const uint32_t b_base = uint32_t(bm) * kWgradBoxPixels * 4;
        const WgradBoxBLayout l = wgrad_box_b_layout(bw, run);
        ASSERT_EQ(b_base % 1024, 0u);
        // The kernel's descriptors (conv2d_wgmma_wgrad.cu builds them from the same functions).
        auto kernel_desc = [&](int operand, int wg, int step) {
          if (operand == 0)
            return wgrad_smem_desc(uint32_t(wg) * 64 * span + wgrad_box_step_offset(bw, bm, step),
                                   span, wgrad_a_sbo(bw));
          return wgrad_smem_desc(b_base + wgrad_box_step_offset(bw, l.slab_rows, step), span,
                                 wgrad_b_sbo(bw, l.slab_rows));
        };
        EXPECT_EQ(stage_mismatches(bw, bm, run, span, kernel_desc), 0);
        // One box (bw, run, br, 1) a piece with the slab layout's descriptor: right where the
        // layout takes it (run 128, or bw 32), wrong for run 16..64 at bw 16 and 8 (which is why
        // those pieces come as a box a slab).
        if (run != 8 && run != 128) {
          auto one_box_desc = [&](int operand, int wg, int step) {
            if (operand == 0) return kernel_desc(0, wg, step);
            return wgrad_smem_desc(b_base + wgrad_box_step_offset(bw, run, step), span,
                                   wgrad_b_sbo(bw, run));
          };
          const int64_t one_box = stage_mismatches(bw, bm, run, span, one_box_desc);
          if (bw == 32)
            EXPECT_EQ(one_box, 0);
          else
            EXPECT_GT(one_box, 0);
        }
        // The first boxes: 128-byte swizzle whatever bw, each step 32 bytes on in 128-byte rows.
        // Right for bw 32 only: a narrower box row takes the whole 128 bytes (measured).
        if (run == 8) {
          auto first_desc = [&](int operand, int wg, int step) {
            const uint32_t start = operand == 0 ? uint32_t(wg) * 64 * 128 : b_base;
            return wgrad_smem_desc(start + 32u * uint32_t(step), 128, 1024);
          };
          const int64_t first = stage_mismatches(bw, bm, 8, 128, first_desc);
          if (bw == 32)
            EXPECT_EQ(first, 0);
          else
            EXPECT_GT(first, 0);
        }
        // The gathered A (dy rows not 16-byte aligned) writes each element where TMA lands it,
        // and the constant columns of B go where B's boxes would land them.
        for (int m = 0; m < bm; ++m)
          for (int q = 0; q < kWgradBoxPixels; ++q)
            ASSERT_EQ(wgrad_box_smem_offset(bw, bm, m, q),
                      tma_box_landing_offset(bw, span, (q / bw) * bm + m, q % bw))
                << "row " << m << " pixel " << q;
        for (int j = 0; j < 128; ++j)
          for (int q = 0; q < kWgradBoxPixels; ++q) {
            const int piece = j / run, i = j % run, r = q / bw;
            const int b = l.boxes_per_piece == 1 ? 0 : r, rr = r - b;
            ASSERT_EQ(wgrad_box_b_offset(bw, l.slab_rows, j, q),
                      wgrad_box_b_dst(bw, l, piece, b) +
                          tma_box_landing_offset(bw, span, rr * run + i, q % bw))
                << "column " << j << " pixel " << q;
          }
        // Every step's slab (its start less the offset within the row) is a swizzle atom: base
        // offset 0 in the descriptor is right; so is every box of B's landing.
        for (int step = 0; step < 4; ++step) {
          const uint32_t in_row = uint32_t(8 * step % bw) * 4;
          EXPECT_EQ((wgrad_box_step_offset(bw, bm, step) - in_row) % (8 * span), 0u) << step;
          EXPECT_EQ((wgrad_box_step_offset(bw, l.slab_rows, step) - in_row) % (8 * span), 0u)
              << step;
        }
        for (int piece = 0; piece < 128 / run; ++piece)
          for (int b = 0; b < l.boxes_per_piece; ++b)
            EXPECT_EQ(wgrad_box_b_dst(bw, l, piece, b) % (8 * span), 0u) << piece << " " << b;
        EXPECT_EQ(64 * span % (8 * span), 0u);
      }
  // Layout types (bits 62-63) and stride byte offsets; bw 32 is the gathered layout's descriptor.
  EXPECT_EQ(wgrad_smem_desc(0, 32, wgrad_a_sbo(8)) >> 62, 3u);
  EXPECT_EQ(wgrad_smem_desc(0, 64, wgrad_a_sbo(16)) >> 62, 2u);
  EXPECT_EQ(wgrad_smem_desc(0, 128, wgrad_a_sbo(32)) >> 62, 1u);
  EXPECT_EQ((wgrad_smem_desc(0, 32, wgrad_a_sbo(8)) >> 32) & 0x3FFF, 256u / 16);
  EXPECT_EQ((wgrad_smem_desc(0, 32, wgrad_b_sbo(8, 8)) >> 32) & 0x3FFF, 1024u / 16);
  EXPECT_EQ((wgrad_smem_desc(0, 64, wgrad_b_sbo(16, 128)) >> 32) & 0x3FFF, 512u / 16);
  const uint32_t start = 0x12400;
  EXPECT_EQ(wgrad_smem_desc(start, 128, 1024), uint64_t(start >> 4) | (uint64_t{1} << 16) |
                                                   (uint64_t{1024 >> 4} << 32) |
                                                   (uint64_t{1} << 62));
}

TEST(ConvWgradBox, EmulatedGemm) {
  const Conv2dShape shapes[] = {
      conv(1, 1, 8, 8, 5, 1, 1, 0),     conv(3, 3, 13, 13, 8, 3, 1, 1),
      conv(1, 17, 14, 14, 24, 5, 1, 2), conv(3, 8, 7, 7, 8, 7, 1, 3),
      conv(1, 3, 33, 33, 8, 3, 2, 1),   conv(3, 17, 16, 16, 8, 3, 2, 0),
      conv(1, 3, 28, 28, 8, 5, 1, 0),   conv(2, 8, 32, 32, 4, 3, 1, 1),
      conv(1, 3, 64, 64, 4, 7, 2, 3),   conv(1, 9, 13, 13, 5, 5, 3, 2),
      conv(2, 2, 17, 17, 3, 3, 4, 1),   conv(1, 3, 64, 64, 4, 3, 1, 0),
      conv(2, 3, 16, 12, 4, 1, 1, 0),   conv(2, 5, 13, 13, 4, 1, 1, 0),
      conv(2, 5, 13, 13, 4, 1, 2, 0),   conv(1, 3, 40, 40, 4, 3, 5, 1),
      conv(1, 3, 9, 9, 4, 5, 1, 4),     conv(3, 3, 20, 18, 6, 7, 2, 3),
      conv(1, 24, 16, 16, 5, 3, 1, 1),  conv(1, 100, 8, 8, 5, 3, 1, 1),
      conv(1, 64, 16, 16, 8, 3, 1, 1),  conv(1, 130, 8, 10, 70, 1, 1, 0),
      conv(2, 3, 12, 12, 5, 7, 1, 3),   conv(2, 5, 8, 16, 6, 3, 1, 0),
  };
  for (const Conv2dShape& s : shapes)
    for (int run : kRuns) {
      const uint64_t seed = test::fresh_seed();
      SCOPED_TRACE("C=" + std::to_string(s.c) + " HxW=" + std::to_string(s.h) +
                   " k=" + std::to_string(s.kh) + " stride=" + std::to_string(s.stride_h) +
                   " pad=" + std::to_string(s.pad_h) + " run " + std::to_string(run) + " seed " +
                   std::to_string(seed));
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
      auto ref_dw = dw0, ref_db = db0;
      conv2d_backward_weight_cpu(s, x.data(), dy.data(), ref_dw.data(), ref_db.data());
      for (bool direct : {false, true}) {
        auto got_dw = dw0, got_db = db0;
        wgrad_box_model_cpu(s, x.data(), dy.data(), got_dw.data(), got_db.data(), run, direct);
        EXPECT_EQ(got_dw, ref_dw) << "direct " << direct;
        EXPECT_EQ(got_db, ref_db) << "direct " << direct;
      }
    }
}

}  // namespace
