// The channels-last view of the TMA im2col convolution (kernels/conv/conv2d_nhwc_layout.h), on
// the CPU:
//   KnownCorners       the corners of a 3x3 padding-1 convolution on 14x14 (the PTX ISA's im2col
//                      example: the box from (-1, -1) to (12, 12)) and of a stride-2 one.
//   TraversalIsOutputOrder  for forward and input-gradient views of awkward shapes (stride 1/2,
//                      kernels 1..7, padding 0..3, batch 1..3), the traversal model started at
//                      each 128-row tile visits, row by row, the top-left input pixel of output
//                      pixel m0 + r: the corners encode the convolution.
//   Refusals           corners outside [-128, 127], strides above 8 and taps more than 127 pixels
//                      from the window's corner, one line each.
//   DilatedCorners     a dilated convolution's box and offsets, and its input gradient's view.
//   RoundTf32          round to nearest, ties away from zero, on the 13 dropped bits.
//   EmulatedGemm       the whole GPU scheme on the CPU: the NHWC copy and packed weights (the
//                      pre-passes' twins), k ordered (tap, 32-channel chunk), rows found by the
//                      traversal model, taps at their dilated offsets, a grouped shape's groups
//                      each on its group-major images and weight rows, against
//                      conv2d_forward_cpu / conv2d_backward_data_cpu on small integers (exact),
//                      dilated and grouped shapes included; strided input gradients as their
//                      phases (nhwc_dgrad_phases: each a launch over the phase-ordered pack,
//                      stored at the stride; phases without taps zero); the same with the BF16
//                      twins and 64-channel chunks.
//   Bf16Bits           bf16_bits_cpu: nearest, ties to even, the upper half of round_to_bf16.
//   Bf16Layouts        the BF16 twins: channels padded to 64 with zeros, every value the bits of
//                      its rounded source; geometry and weight packs at the 64-channel block.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/bf16_round.h"
#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_nhwc_layout.h"
#include "runtime/error.h"

using namespace cnn;

namespace {

Conv2dShape conv(int n, int c, int h, int w, int oc, int kh, int kw, int sh, int sw, int ph,
                 int pw) {
  Conv2dShape s;
  s.n = n, s.c = c, s.h = h, s.w = w, s.oc = oc, s.kh = kh, s.kw = kw;
  s.stride_h = sh, s.stride_w = sw, s.pad_h = ph, s.pad_w = pw;
  return s;
}

Conv2dShape dilate(Conv2dShape s, int dh, int dw) {
  s.dil_h = dh, s.dil_w = dw;
  return s;
}

// Dilated shapes: "same" padding at dilation 2 and 3, unequal dilations, a padding below and one
// beyond the dilated span (the input gradient's padding negative), stride 2.
std::vector<Conv2dShape> dilated_shapes() {
  return {
      dilate(conv(2, 17, 13, 12, 24, 3, 3, 1, 1, 2, 2), 2, 2),
      dilate(conv(1, 40, 16, 16, 8, 3, 3, 1, 1, 3, 3), 3, 3),
      dilate(conv(2, 5, 11, 14, 8, 3, 3, 1, 1, 1, 0), 2, 3),
      dilate(conv(1, 3, 20, 19, 8, 5, 3, 1, 1, 9, 1), 2, 4),
      dilate(conv(2, 4, 17, 15, 8, 3, 3, 2, 2, 2, 2), 2, 2),
  };
}

Conv2dShape grouped(Conv2dShape s, int groups) {
  s.groups = groups;
  return s;
}

// Grouped shapes: groups of 2 to 40 channels (one or two k-tile chunks a group), 1x1, stride 2,
// 32 groups, a dilated one.
std::vector<Conv2dShape> grouped_shapes() {
  return {
      grouped(conv(2, 12, 9, 7, 18, 3, 3, 1, 1, 1, 1), 3),
      grouped(conv(1, 80, 6, 5, 40, 3, 3, 1, 1, 1, 1), 2),
      grouped(conv(3, 20, 5, 5, 10, 1, 1, 1, 1, 0, 0), 5),
      grouped(conv(2, 64, 9, 9, 64, 3, 3, 2, 2, 1, 1), 8),
      grouped(conv(1, 64, 7, 7, 128, 3, 3, 1, 1, 1, 1), 32),
      grouped(dilate(conv(2, 24, 10, 10, 12, 3, 3, 1, 1, 2, 2), 2, 2), 3),
  };
}

std::vector<Conv2dShape> shapes() {
  return {
      conv(1, 3, 7, 7, 8, 1, 1, 1, 1, 0, 0),   conv(3, 17, 13, 13, 24, 3, 3, 1, 1, 1, 1),
      conv(2, 5, 33, 32, 8, 5, 5, 2, 2, 2, 2), conv(1, 1, 32, 33, 8, 7, 7, 2, 2, 3, 3),
      conv(3, 4, 13, 7, 8, 3, 5, 1, 2, 0, 2),  conv(2, 4, 7, 13, 8, 5, 3, 2, 1, 3, 0),
      conv(1, 2, 33, 33, 8, 3, 3, 2, 2, 0, 0), conv(3, 2, 13, 13, 8, 1, 1, 2, 2, 0, 0),
      conv(2, 2, 7, 7, 8, 1, 1, 1, 1, 2, 2),   conv(1, 2, 32, 32, 8, 7, 7, 1, 1, 0, 0),
      conv(1, 2, 9, 11, 8, 3, 3, 2, 2, 3, 3),
  };
}

}  // namespace

TEST(ConvNhwcLayout, KnownCorners) {
  const Im2colGeometry a = im2col_geometry(conv(1, 64, 14, 14, 8, 3, 3, 1, 1, 1, 1), "test");
  EXPECT_EQ(a.lower_w, -1);
  EXPECT_EQ(a.lower_h, -1);
  EXPECT_EQ(a.upper_w, -1);
  EXPECT_EQ(a.upper_h, -1);
  EXPECT_EQ(a.c_pad, 64);
  EXPECT_EQ(a.chunks, 2);
  EXPECT_EQ(a.ktiles, 18);
  // 32x33, 3x3, stride 2, padding 1: OH = 16, OW = 17; box x in [-1, 31], y in [-1, 29].
  const Im2colGeometry b = im2col_geometry(conv(1, 3, 32, 33, 8, 3, 3, 2, 2, 1, 1), "test");
  EXPECT_EQ(b.lower_w, -1);
  EXPECT_EQ(b.upper_w, 31 - 32);
  EXPECT_EQ(b.lower_h, -1);
  EXPECT_EQ(b.upper_h, 29 - 31);
  EXPECT_EQ(b.stride_w, 2);
  EXPECT_EQ(b.c_pad, 32);
}

TEST(ConvNhwcLayout, TraversalIsOutputOrder) {
  std::vector<Conv2dShape> cases = shapes();
  for (const Conv2dShape& s : dilated_shapes()) cases.push_back(s);
  for (const Conv2dShape& s : cases)
    for (bool fwd : {true, false}) {
      if (!fwd && (s.stride_h != 1 || s.stride_w != 1)) continue;
      const Conv2dShape g = fwd ? s : backward_data_as_forward(s);
      SCOPED_TRACE(::testing::Message()
                   << (fwd ? "forward" : "input gradient") << " N=" << g.n << " H=" << g.h
                   << " W=" << g.w << " k=" << g.kh << "x" << g.kw << " stride=" << g.stride_h
                   << "x" << g.stride_w << " pad=" << g.pad_h << "x" << g.pad_w);
      if (!fwd) {
        EXPECT_EQ(g.oh(), s.h);
        EXPECT_EQ(g.ow(), s.w);
      }
      const Im2colGeometry geo = im2col_geometry(g, "test");
      const int oh = g.oh(), ow = g.ow();
      const int64_t m_total = int64_t(g.n) * oh * ow;
      int mismatches = 0;
      for (int64_t m0 = 0; m0 < m_total; m0 += 128) {
        Im2colPixel p = im2col_start(g, geo, m0);
        for (int r = 0; r < 128 && m0 + r < m_total; ++r) {
          if (r > 0) p = im2col_walk(g, geo, p, 1);
          const int64_t m = m0 + r;
          const int n = int(m / (oh * ow)), oy = int(m % (oh * ow) / ow), ox = int(m % ow);
          const bool same =
              p.n == n && p.y == oy * g.stride_h - g.pad_h && p.x == ox * g.stride_w - g.pad_w;
          if (!same && mismatches++ < 3)
            ADD_FAILURE() << "m=" << m << ": walked to (" << p.n << ", " << p.y << ", " << p.x
                          << "), expected (" << n << ", " << oy * g.stride_h - g.pad_h << ", "
                          << ox * g.stride_w - g.pad_w << ")";
        }
      }
    }
}

TEST(ConvNhwcLayout, Refusals) {
  auto expect_one_line = [](const Conv2dShape& g, const char* part) {
    try {
      (void)im2col_geometry(g, "conv2d_forward");
      ADD_FAILURE() << "not refused: " << part;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(part), std::string::npos) << msg;
      EXPECT_NE(msg.find("wgmma-nhwc"), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  };
  expect_one_line(conv(1, 1, 4, 4, 1, 1, 1, 1, 1, 130, 0), "[-128, 127]");
  expect_one_line(conv(1, 1, 40, 40, 1, 1, 1, 9, 1, 0, 0), "strides 1..8");
  // A tap 128 pixels from the window's corner (dilation 64 on a 3x3 kernel); 127 is taken.
  expect_one_line(dilate(conv(1, 1, 300, 300, 1, 3, 3, 1, 1, 0, 0), 64, 1), "127 pixels");
  EXPECT_NO_THROW((void)im2col_geometry(dilate(conv(1, 1, 300, 300, 1, 2, 2, 1, 1, 0, 0), 127, 1),
                                        "conv2d_forward"));
}

// The dilated geometry: the box is the set of tap-(0, 0) pixels of the dilated convolution's
// output (OH, OW shrink by the span), the offsets' spacing the dilation; the input gradient's
// view pads by d (k - 1) - p and gives back H x W.
TEST(ConvNhwcLayout, DilatedCorners) {
  // 16x16, 3x3, dilation 2, padding 2: OH = OW = 16; box x in [-2, 13]: upper 13 - 15.
  const Conv2dShape s = dilate(conv(1, 8, 16, 16, 8, 3, 3, 1, 1, 2, 2), 2, 2);
  const Im2colGeometry a = im2col_geometry(s, "test");
  EXPECT_EQ(s.oh(), 16);
  EXPECT_EQ(a.lower_w, -2);
  EXPECT_EQ(a.upper_w, 13 - 15);
  EXPECT_EQ(a.dil_w, 2);
  EXPECT_EQ(a.dil_h, 2);
  const Conv2dShape g = backward_data_as_forward(s);
  EXPECT_EQ(g.pad_h, 2);
  EXPECT_EQ(g.dil_h, 2);
  EXPECT_EQ(g.oh(), 16);
  // Padding 0 at dilation 3 on 5x5 (span 13): OH = 8, the input gradient pads by 12.
  const Conv2dShape t = dilate(conv(1, 8, 20, 20, 8, 5, 5, 1, 1, 0, 0), 3, 3);
  EXPECT_EQ(t.oh(), 8);
  EXPECT_EQ(backward_data_as_forward(t).pad_w, 12);
  EXPECT_EQ(backward_data_as_forward(t).ow(), 20);
}

TEST(ConvNhwcLayout, RefusalsStrideAndLargeBox) {
  EXPECT_THROW((void)im2col_geometry(conv(1, 1, 4, 4, 1, 1, 1, 1, 1, 0, 130), "x"), Error);
  EXPECT_THROW((void)im2col_geometry(conv(1, 1, 4, 4, 1, 1, 1, 1, 1, 129, 0), "x"), Error);
  // Padding p on a 1x1 kernel: lower -p, upper p (the box runs p past the far edge too).
  EXPECT_NO_THROW((void)im2col_geometry(conv(1, 1, 4, 4, 1, 1, 1, 1, 1, 127, 0), "x"));
  EXPECT_THROW((void)im2col_geometry(conv(1, 1, 4, 4, 1, 1, 1, 1, 1, 128, 0), "x"), Error);
  // A 7x7 kernel takes 6 off the far corner: padding 133 gives upper 127, lower -133 (refused).
  EXPECT_THROW((void)im2col_geometry(conv(1, 1, 4, 4, 1, 7, 7, 1, 1, 133, 0), "x"), Error);
  // A large image is no problem: the corners depend on the padding and kernel only.
  EXPECT_NO_THROW((void)im2col_geometry(conv(1, 1, 4000, 3000, 1, 7, 7, 2, 2, 3, 3), "x"));
  // Phases: a strided input gradient of dilation 1 only, and not a stride-1 one.
  EXPECT_THROW((void)nhwc_dgrad_phases(dilate(conv(1, 4, 9, 9, 8, 3, 3, 2, 2, 2, 2), 2, 2), "x"),
               Error);
  EXPECT_THROW((void)nhwc_dgrad_phases(conv(1, 4, 9, 9, 8, 3, 3, 1, 1, 1, 1), "x"), Error);
}

// The input gradient's tap order: a permutation of the kernel's taps along each axis, each
// phase's taps one run (largest first), the runs in phase order; the plain flip at stride 1.
TEST(ConvNhwcLayout, PhaseFlippedTaps) {
  EXPECT_EQ(phase_flipped_tap(0, 3, 1, 1), 2);
  EXPECT_EQ(phase_flipped_tap(2, 3, 1, 1), 0);
  // 3 taps, stride 2, padding 1: phase 0 takes tap 1, phase 1 taps 2, 0.
  EXPECT_EQ(phase_flipped_tap(0, 3, 2, 1), 1);
  EXPECT_EQ(phase_flipped_tap(1, 3, 2, 1), 2);
  EXPECT_EQ(phase_flipped_tap(2, 3, 2, 1), 0);
  EXPECT_EQ(phase_flipped_tap(3, 3, 2, 1), -1);
  for (int k = 1; k <= 7; ++k)
    for (int st = 1; st <= 4; ++st)
      for (int pad = 0; pad <= 4; ++pad) {
        std::vector<int> seen(size_t(k), 0);
        for (int i = 0; i < k; ++i) {
          const int t = phase_flipped_tap(i, k, st, pad);
          ASSERT_TRUE(t >= 0 && t < k) << k << " " << st << " " << pad << " " << i;
          ++seen[size_t(t)];
        }
        for (int t = 0; t < k; ++t) EXPECT_EQ(seen[size_t(t)], 1) << k << " " << st << " " << pad;
      }
}

TEST(ConvNhwcLayout, RoundTf32) {
  const float ulp = std::ldexp(1.f, -10);
  EXPECT_EQ(round_tf32_cpu(1.f), 1.f);
  EXPECT_EQ(round_tf32_cpu(1.f + ulp), 1.f + ulp);
  EXPECT_EQ(round_tf32_cpu(1.f + ulp / 2), 1.f + ulp);        // tie: away from zero
  EXPECT_EQ(round_tf32_cpu(-(1.f + ulp / 2)), -(1.f + ulp));  // tie, negative
  EXPECT_EQ(round_tf32_cpu(1.f + ulp / 4), 1.f);
  EXPECT_EQ(round_tf32_cpu(1.f + ulp * 3 / 4), 1.f + ulp);
  EXPECT_EQ(round_tf32_cpu(0.f), 0.f);
  EXPECT_TRUE(std::isinf(round_tf32_cpu(INFINITY)));
  EXPECT_TRUE(std::isnan(round_tf32_cpu(NAN)));
}

namespace {

float bf16_value(uint16_t bits) {
  const uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The NHWC copy and the packed weights at one channel block, as floats: the TF32 twins, or the
// BF16 twins' bit patterns widened back to float.
struct Operands {
  std::vector<float> nhwc, packed;
};
Operands pre_passes(int block, const Conv2dShape& g, const Im2colGeometry& geo,
                    const WeightPack& wp, const std::vector<float>& a,
                    const std::vector<float>& w) {
  Operands o;
  const size_t n_copy = size_t(g.n) * g.groups * g.h * g.w * geo.c_pad;
  const size_t n_pack = size_t(wp.rows) * wp.taps * wp.k_pad;
  if (block == kNhwcChannelBlock) {
    o.nhwc.assign(n_copy, NAN);
    o.packed.assign(n_pack, NAN);
    nchw_to_nhwc_tf32_cpu(a.data(), g.n, g.cg(), int64_t(g.h) * g.w, geo.c_pad, o.nhwc.data(),
                          g.groups);
    pack_weights_tf32_cpu(wp, w.data(), o.packed.data());
    return o;
  }
  std::vector<uint16_t> copy(n_copy, 0xffff), pack(n_pack, 0xffff);  // 0xffff: a NaN
  nchw_to_nhwc_bf16_cpu(a.data(), g.n, g.cg(), int64_t(g.h) * g.w, geo.c_pad, copy.data(),
                        g.groups);
  pack_weights_bf16_cpu(wp, w.data(), pack.data());
  for (uint16_t b : copy) o.nhwc.push_back(bf16_value(b));
  for (uint16_t b : pack) o.packed.push_back(bf16_value(b));
  return o;
}

}  // namespace

TEST(ConvNhwcLayout, Bf16Bits) {
  EXPECT_EQ(bf16_bits_cpu(1.f), 0x3f80);
  EXPECT_EQ(bf16_bits_cpu(-2.f), 0xc000);
  EXPECT_EQ(bf16_bits_cpu(0.f), 0x0000);
  auto from_bits = [](uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  };
  EXPECT_EQ(bf16_bits_cpu(from_bits(0x3f808000u)), 0x3f80);  // tie: to the even 0x3f80
  EXPECT_EQ(bf16_bits_cpu(from_bits(0x3f818000u)), 0x3f82);  // tie: to the even 0x3f82
  EXPECT_EQ(bf16_bits_cpu(from_bits(0x3f808001u)), 0x3f81);  // above the tie: up
  EXPECT_EQ(bf16_bits_cpu(from_bits(0xbf807fffu)), 0xbf80);  // below the tie: down
  EXPECT_EQ(bf16_bits_cpu(INFINITY), 0x7f80);
  EXPECT_EQ(bf16_bits_cpu(from_bits(0x7f7fffffu)), 0x7f80);  // FLT_MAX overflows to infinity
  EXPECT_TRUE(std::isnan(bf16_value(bf16_bits_cpu(NAN))));
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> d(-3.f, 3.f);
  for (int i = 0; i < 1000; ++i) {
    const float v = d(rng);
    EXPECT_EQ(bf16_value(bf16_bits_cpu(v)), round_to_bf16(v)) << v;
  }
}

TEST(ConvNhwcLayout, Bf16Layouts) {
  const Conv2dShape s = conv(2, 130, 5, 3, 17, 3, 3, 1, 1, 1, 1);
  const Im2colGeometry geo = im2col_geometry(s, "test", kNhwcChannelBlockBf16);
  EXPECT_EQ(geo.c_pad, 192);
  EXPECT_EQ(geo.chunks, 3);
  EXPECT_EQ(geo.ktiles, 27);
  EXPECT_EQ(im2col_geometry(conv(1, 1, 7, 7, 8, 1, 1, 1, 1, 0, 0), "t", 64).c_pad, 64);
  EXPECT_EQ(im2col_geometry(conv(1, 64, 7, 7, 8, 1, 1, 1, 1, 0, 0), "t", 64).chunks, 1);
  EXPECT_THROW((void)im2col_geometry(s, "test", 16), Error);
  EXPECT_EQ(forward_weight_pack(s, kNhwcChannelBlockBf16).k_pad, 192);
  EXPECT_EQ(backward_data_weight_pack(s, kNhwcChannelBlockBf16).k_pad, 64);  // OC = 17
  EXPECT_EQ(forward_weight_pack(s).k_pad, 160);  // the TF32 default is unchanged

  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> d(-1.f, 1.f);
  const int64_t hw = int64_t(s.h) * s.w;
  std::vector<float> x(size_t(s.n) * s.c * hw);
  for (auto& v : x) v = d(rng);
  std::vector<uint16_t> out(size_t(s.n) * hw * geo.c_pad, 0xffff);
  nchw_to_nhwc_bf16_cpu(x.data(), s.n, s.c, hw, geo.c_pad, out.data());
  for (int n = 0; n < s.n; ++n)
    for (int64_t p = 0; p < hw; ++p)
      for (int c = 0; c < geo.c_pad; ++c) {
        const uint16_t got = out[(size_t(n) * hw + p) * geo.c_pad + c];
        const uint16_t want = c < s.c ? bf16_bits_cpu(x[(size_t(n) * s.c + c) * hw + p]) : 0;
        ASSERT_EQ(got, want) << "n=" << n << " p=" << p << " c=" << c;
      }

  // Weights exact in BF16 (and TF32): multiples of 1/8 up to 16, so that the BF16 pack must
  // equal the TF32 one value for value: the same element at the same (row, tap, k).
  std::uniform_int_distribution<int> q(-128, 128);
  std::vector<float> w(size_t(s.oc) * s.c * 9);
  for (auto& v : w) v = float(q(rng)) / 8;
  for (bool fwd : {true, false}) {
    const WeightPack wp = fwd ? forward_weight_pack(s, kNhwcChannelBlockBf16)
                              : backward_data_weight_pack(s, kNhwcChannelBlockBf16);
    std::vector<float> tf32(size_t(wp.rows) * wp.taps * wp.k_pad, NAN);
    std::vector<uint16_t> bf16(tf32.size(), 0xffff);
    pack_weights_bf16_cpu(wp, w.data(), bf16.data());
    pack_weights_tf32_cpu(wp, w.data(), tf32.data());
    for (size_t i = 0; i < bf16.size(); ++i) {
      if (int(i % wp.k_pad) >= wp.k_count) {
        ASSERT_EQ(bf16[i], 0) << i;
      }
      ASSERT_EQ(bf16_value(bf16[i]), tf32[i]) << (fwd ? "forward " : "input gradient ") << i;
    }
  }
}

// The 3xTF32 pre-passes' twins: the copy unrounded, or split as the weights; the weights as big
// = the TF32 pack and small = TF32(w - big), both TF32 values (low 13 bits zero), zero in the
// padding, summing to w within 2^-22 |w| (nearest rounding twice: 2^-11 of 2^-11).
TEST(ConvNhwcLayout, SplitTf32Packs) {
  const Conv2dShape s = conv(2, 37, 5, 6, 24, 3, 3, 1, 1, 1, 1);
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<float> d(-2.f, 2.f);
  const int64_t hw = int64_t(s.h) * s.w;
  std::vector<float> x(size_t(s.n) * s.c * hw);
  for (auto& v : x) v = d(rng);
  const int c_pad = 64;
  std::vector<float> copy(size_t(s.n) * hw * c_pad, NAN);
  nchw_to_nhwc_fp32_cpu(x.data(), s.n, s.c, hw, c_pad, copy.data());
  for (int n = 0; n < s.n; ++n)
    for (int64_t p = 0; p < hw; ++p)
      for (int c = 0; c < c_pad; ++c)
        ASSERT_EQ(copy[(size_t(n) * hw + p) * c_pad + c],
                  c < s.c ? x[(size_t(n) * s.c + c) * hw + p] : 0.f)
            << "n=" << n << " p=" << p << " c=" << c;
  // The split copy (two blocks an SM): big the TF32 copy, small TF32(x - big), summing to x.
  std::vector<float> big_x(copy.size(), NAN), small_x(copy.size(), NAN), tf32_x(copy.size(), NAN);
  nchw_to_nhwc_tf32_split_cpu(x.data(), s.n, s.c, hw, c_pad, big_x.data(), small_x.data());
  nchw_to_nhwc_tf32_cpu(x.data(), s.n, s.c, hw, c_pad, tf32_x.data());
  for (size_t i = 0; i < copy.size(); ++i) {
    ASSERT_EQ(big_x[i], tf32_x[i]) << i;
    ASSERT_EQ(round_tf32_cpu(small_x[i]), small_x[i]) << "a TF32 value " << i;
    ASSERT_LE(std::fabs(double(big_x[i]) + small_x[i] - copy[i]),
              std::ldexp(std::fabs(copy[i]), -22))
        << i;
  }

  std::vector<float> w(size_t(s.oc) * s.c * 9);
  for (auto& v : w) v = d(rng);
  for (bool fwd : {true, false}) {
    const WeightPack wp = fwd ? forward_weight_pack(s) : backward_data_weight_pack(s);
    const size_t n = size_t(wp.rows) * wp.taps * wp.k_pad;
    std::vector<float> big(n, NAN), small(n, NAN), tf32(n, NAN);
    pack_weights_tf32_split_cpu(wp, w.data(), big.data(), small.data());
    pack_weights_tf32_cpu(wp, w.data(), tf32.data());
    int64_t nonzero = 0;
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(big[i], tf32[i]) << i;
      ASSERT_EQ(round_tf32_cpu(small[i]), small[i]) << "a TF32 value " << i;
      const int k = int(i % wp.k_pad), t = int(i / wp.k_pad % wp.taps),
                r = int(i / wp.k_pad / wp.taps);
      if (k >= wp.k_count) {
        ASSERT_EQ(small[i], 0.f) << i;
        continue;
      }
      const double v = w[r * wp.ld_r + k * wp.ld_k + (wp.flip ? wp.taps - 1 - t : t)];
      ASSERT_LE(std::fabs(double(big[i]) + small[i] - v), std::ldexp(std::fabs(v), -22))
          << (fwd ? "forward " : "input gradient ") << i;
      nonzero += small[i] != 0.f;
    }
    // Random values are not TF32 values: nearly every weight has a residual.
    EXPECT_GT(nonzero, wp.rows * wp.taps * wp.k_count * 9 / 10);
  }
}

// One launch of the GPU scheme on the CPU: each group's GEMM (one without groups) over the
// launch's oh x ow output pixels, its walk starting grp N images into the group-major copy, its
// B rows and output channels the group's grp OC/G on, tap (ky, kx) reading pack tap b_tap0 +
// ky b_kw + kx, output pixel q stored where `store(q)` says in planes of `plane` pixels.
struct EmulatedLaunch {
  Conv2dShape g;
  Im2colGeometry geo;
  int oh, ow, b_tap0, b_kw;
  int64_t plane;
  std::function<int64_t(int64_t)> store;
};

void emulate_launch(const EmulatedLaunch& l, const WeightPack& wp, int block,
                    const std::vector<float>& nhwc, const std::vector<float>& packed,
                    std::vector<float>& got) {
  const Conv2dShape& g = l.g;
  const Im2colGeometry& geo = l.geo;
  const int ocg = g.ocg();
  const int64_t pix = int64_t(l.oh) * l.ow, m_total = g.n * pix;
  for (int grp = 0; grp < g.groups; ++grp)
    for (int64_t m0 = 0; m0 < m_total; m0 += 128) {
      // The copy's first pixel: im2col_start for an oh x ow output (as the kernel's corner).
      const int64_t n0 = m0 / pix, r0 = m0 - n0 * pix;
      Im2colPixel p{int(n0), geo.lower_h + int(r0 / l.ow) * geo.stride_h,
                    geo.lower_w + int(r0 % l.ow) * geo.stride_w};
      p.n += grp * g.n;
      for (int r = 0; r < 128 && m0 + r < m_total; ++r) {
        if (r > 0) p = im2col_walk(g, geo, p, 1);
        const int64_t m = m0 + r;
        for (int col = grp * ocg; col < (grp + 1) * ocg; ++col) {
          double sum = 0;
          for (int kt = 0; kt < geo.ktiles; ++kt) {
            const int tap = kt / geo.chunks, c0 = (kt % geo.chunks) * block;
            const int ky = tap / g.kw, kx = tap % g.kw;
            const int btap = l.b_tap0 + ky * l.b_kw + kx;
            const int y = p.y + ky * geo.dil_h, x = p.x + kx * geo.dil_w;
            if (p.n >= g.n * g.groups || y < 0 || y >= g.h || x < 0 || x >= g.w)
              continue;  // zero fill
            for (int cc = 0; cc < block; ++cc) {
              const float av = nhwc[((size_t(p.n) * g.h + y) * g.w + x) * geo.c_pad + c0 + cc];
              const float bv = packed[(size_t(col) * wp.taps + btap) * wp.k_pad + c0 + cc];
              sum += double(av) * bv;
            }
          }
          const int64_t img = m / pix, q = m % pix;
          got[size_t((img * g.oc + col) * l.plane + l.store(q))] = float(sum);
        }
      }
    }
}

TEST(ConvNhwcLayout, EmulatedGemm) {
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<int> d(-2, 2);
  auto ints = [&](size_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = float(d(rng));
    return v;
  };
  std::vector<Conv2dShape> cases = shapes();
  cases.push_back(conv(2, 40, 7, 9, 24, 3, 3, 1, 1, 1, 1));   // two channel chunks
  cases.push_back(conv(1, 33, 13, 7, 40, 3, 3, 2, 2, 1, 1));  // 33 channels, 40 rows
  cases.push_back(conv(2, 70, 5, 6, 24, 3, 3, 1, 1, 1, 1));   // two bf16 chunks (58 zero)
  cases.push_back(conv(1, 24, 7, 5, 130, 3, 3, 1, 1, 1, 1));  // input gradient: 3 bf16 chunks
  // Strided input gradients: stride 3 (phases of 1 and 2 taps, a 4x4 kernel), stride 4 with a
  // 2x2 kernel (phases without taps), padding beyond the kernel (a phase window starting below
  // its pixel), a 1-pixel-high input.
  cases.push_back(conv(2, 6, 11, 10, 8, 4, 4, 3, 3, 1, 2));
  cases.push_back(conv(1, 5, 9, 12, 8, 2, 2, 4, 4, 0, 1));
  cases.push_back(conv(2, 3, 8, 9, 8, 1, 1, 2, 2, 2, 1));
  cases.push_back(conv(1, 4, 1, 9, 8, 3, 3, 2, 2, 1, 1));
  for (const Conv2dShape& s : dilated_shapes()) cases.push_back(s);
  for (const Conv2dShape& s : grouped_shapes()) cases.push_back(s);
  for (int block : {kNhwcChannelBlock, kNhwcChannelBlockBf16})
    for (const Conv2dShape& s : cases)
      for (bool fwd : {true, false}) {
        const bool phased = !fwd && (s.stride_h != 1 || s.stride_w != 1);
        if (phased && s.dilated()) continue;  // refused (RefusalsStrideAndLargeBox)
        const Conv2dShape g = fwd ? s : backward_data_as_forward(s);
        const WeightPack wp =
            fwd ? forward_weight_pack(s, block) : backward_data_weight_pack(s, block);
        SCOPED_TRACE(::testing::Message()
                     << (fwd ? "forward" : "input gradient") << " C=" << s.c << " OC=" << s.oc
                     << " H=" << s.h << " W=" << s.w << " k=" << s.kh << "x" << s.kw << " stride "
                     << s.stride_h << "x" << s.stride_w << " padding " << s.pad_h << "x" << s.pad_w
                     << " dilation " << s.dil_h << "x" << s.dil_w << " groups " << s.groups
                     << " channel block " << block);
        const Im2colGeometry geo = im2col_geometry(g, "test", block);
        ASSERT_EQ(wp.rows, g.oc);
        ASSERT_EQ(wp.k_pad, geo.c_pad);
        ASSERT_EQ(wp.taps, geo.taps);
        const std::vector<float> a = ints(size_t(g.n) * g.c * g.h * g.w);
        const std::vector<float> w = ints(size_t(s.oc) * s.cg() * s.kh * s.kw);
        const Operands ops = pre_passes(block, g, geo, wp, a, w);

        const int64_t out_plane = fwd ? int64_t(s.oh()) * s.ow() : int64_t(s.h) * s.w;
        std::vector<float> got(size_t(g.n) * g.oc * out_plane, NAN);
        if (!phased) {
          emulate_launch({g, geo, g.oh(), g.ow(), 0, g.kw, out_plane, [](int64_t q) { return q; }},
                         wp, block, ops.nhwc, ops.packed, got);
        } else {
          int covered = 0;
          for (const NhwcDgradPhase& ph : nhwc_dgrad_phases(s, "test", block)) {
            covered += ph.oh * ph.ow;
            if (ph.ty == 0 || ph.tx == 0) {  // no taps: the kernel zeroes dx first
              for (int i = 0; i < g.n * g.oc; ++i)
                for (int qy = 0; qy < ph.oh; ++qy)
                  for (int qx = 0; qx < ph.ow; ++qx)
                    got[size_t(i * out_plane + (ph.py + s.stride_h * qy) * s.w + ph.px +
                               s.stride_w * qx)] = 0.f;
              continue;
            }
            ASSERT_EQ(ph.geo.taps, ph.ty * ph.tx);
            const auto store = [&](int64_t q) {
              return (ph.py + s.stride_h * (q / ph.ow)) * s.w + ph.px + s.stride_w * (q % ph.ow);
            };
            emulate_launch(
                {ph.g, ph.geo, ph.oh, ph.ow, ph.tap_y0 * s.kw + ph.tap_x0, s.kw, out_plane, store},
                wp, block, ops.nhwc, ops.packed, got);
          }
          EXPECT_EQ(covered, s.h * s.w);  // every pixel of dx in one phase
        }
        std::vector<float> ref(got.size());
        if (fwd)
          conv2d_forward_cpu(s, a.data(), w.data(), nullptr, ref.data(), false);
        else
          conv2d_backward_data_cpu(s, a.data(), w.data(), ref.data());
        int bad = 0;
        for (size_t i = 0; i < ref.size(); ++i)
          if (!(got[i] == ref[i]) && bad++ < 3)
            ADD_FAILURE() << "out[" << i << "]: " << got[i] << " vs " << ref[i];
      }
}
