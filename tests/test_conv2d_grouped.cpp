// Grouped and dilated conv2d on the CPU: the reference loops against an independent
// construction (each group as a plain conv2d over its channel slice, with the dilated kernel
// written out with zeros between the taps), a hand-computed depthwise example in torch's channel
// order, numerical gradient checks in double of networks holding grouped/depthwise/dilated conv
// layers (and of the float Network), and the config keys `groups` and `dilation`.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_grouped.h"
#include "kernels/conv/conv2d_grouped_narrow.h"
#include "layers/gradcheck/gradcheck.h"
#include "layers/layer_spec.h"
#include "runtime/error.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

struct Case {
  int n, c, h, w, oc, kh, kw, stride, pad, dil, groups;
};

Conv2dGroupedShape shape_of(const Case& k) {
  Conv2dGroupedShape s;
  s.n = k.n, s.c = k.c, s.h = k.h, s.w = k.w, s.oc = k.oc, s.kh = k.kh, s.kw = k.kw;
  s.stride_h = s.stride_w = k.stride;
  s.pad_h = s.pad_w = k.pad;
  s.dil_h = s.dil_w = k.dil;
  s.groups = k.groups;
  return s;
}

std::vector<double> random_doubles(size_t n, uint64_t seed) {
  const std::vector<float> f = test::random_vector(n, seed);
  return std::vector<double>(f.begin(), f.end());
}

// The independent construction: group g is a plain conv2d of input channels [g*cg, (g+1)*cg)
// with a kernel of (K-1)*dil + 1 taps per side, zero except at multiples of dil.
struct BySlices {
  const Conv2dGroupedShape& s;
  Conv2dShape plain() const {
    Conv2dShape p;
    p.n = s.n, p.c = s.cg(), p.h = s.h, p.w = s.w, p.oc = s.ocg();
    p.kh = (s.kh - 1) * s.dil_h + 1, p.kw = (s.kw - 1) * s.dil_w + 1;
    p.stride_h = s.stride_h, p.stride_w = s.stride_w, p.pad_h = s.pad_h, p.pad_w = s.pad_w;
    return p;
  }
  // (N, C, H, W) -> group g's (N, cg, H, W); `to` = the reverse.
  std::vector<double> slice(const std::vector<double>& t, int g, int ch, int hh, int ww) const {
    const int per = ch / s.groups;
    std::vector<double> out(size_t(s.n) * per * hh * ww);
    for (int n = 0; n < s.n; ++n)
      for (int c = 0; c < per; ++c)
        for (int i = 0; i < hh * ww; ++i)
          out[(size_t(n) * per + c) * hh * ww + i] =
              t[(size_t(n) * ch + g * per + c) * hh * ww + i];
    return out;
  }
  void unslice(const std::vector<double>& part, int g, int ch, int hh, int ww,
               std::vector<double>& t) const {
    const int per = ch / s.groups;
    for (int n = 0; n < s.n; ++n)
      for (int c = 0; c < per; ++c)
        for (int i = 0; i < hh * ww; ++i)
          t[(size_t(n) * ch + g * per + c) * hh * ww + i] =
              part[(size_t(n) * per + c) * hh * ww + i];
  }
  // Group g's weights (ocg, cg, KH, KW) written out dilated.
  std::vector<double> dilated_w(const std::vector<double>& w, int g) const {
    const Conv2dShape p = plain();
    std::vector<double> out(size_t(p.oc) * p.c * p.kh * p.kw, 0.0);
    for (int o = 0; o < p.oc; ++o)
      for (int c = 0; c < p.c; ++c)
        for (int ky = 0; ky < s.kh; ++ky)
          for (int kx = 0; kx < s.kw; ++kx)
            out[((size_t(o) * p.c + c) * p.kh + ky * s.dil_h) * p.kw + kx * s.dil_w] =
                w[((size_t(g * p.oc + o) * p.c + c) * s.kh + ky) * s.kw + kx];
    return out;
  }
};

void expect_near_all(const std::vector<double>& got, const std::vector<double>& ref,
                     const char* what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(got[i] - ref[i]));
  EXPECT_LT(worst, 1e-12) << what;
}

void check_against_slices(const Case& k) {
  const Conv2dGroupedShape s = shape_of(k);
  check_conv2d_grouped_shape(s);
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int oh = s.oh(), ow = s.ow();
  const size_t nx = size_t(s.n) * s.c * s.h * s.w, ny = size_t(s.n) * s.oc * oh * ow;
  const size_t nw = size_t(s.oc) * s.cg() * s.kh * s.kw;
  const std::vector<double> x = random_doubles(nx, seed), w = random_doubles(nw, seed + 1);
  const std::vector<double> b = random_doubles(s.oc, seed + 2), dy = random_doubles(ny, seed + 3);

  std::vector<double> y(ny), dx(nx), dw(nw, 0.0), db(s.oc, 0.0);
  conv2d_grouped_forward_cpu(s, x.data(), w.data(), b.data(), y.data(), false);
  conv2d_grouped_backward_data_cpu(s, dy.data(), w.data(), dx.data());
  conv2d_grouped_backward_weight_cpu(s, x.data(), dy.data(), dw.data(), db.data());

  const BySlices bs{s};
  const Conv2dShape p = bs.plain();
  ASSERT_EQ(p.oh(), oh);
  ASSERT_EQ(p.ow(), ow);
  std::vector<double> y_ref(ny), dx_ref(nx), dw_ref(nw), db_ref(s.oc);
  for (int g = 0; g < s.groups; ++g) {
    const std::vector<double> xg = bs.slice(x, g, s.c, s.h, s.w);
    const std::vector<double> dyg = bs.slice(dy, g, s.oc, oh, ow);
    const std::vector<double> wg = bs.dilated_w(w, g);
    const std::vector<double> bg(b.begin() + g * s.ocg(), b.begin() + (g + 1) * s.ocg());
    std::vector<double> yg(size_t(s.n) * s.ocg() * oh * ow), dxg(xg.size());
    std::vector<double> dwg(wg.size(), 0.0), dbg(s.ocg(), 0.0);
    conv2d_forward_cpu(p, xg.data(), wg.data(), bg.data(), yg.data(), false);
    conv2d_backward_data_cpu(p, dyg.data(), wg.data(), dxg.data());
    conv2d_backward_weight_cpu(p, xg.data(), dyg.data(), dwg.data(), dbg.data());
    bs.unslice(yg, g, s.oc, oh, ow, y_ref);
    bs.unslice(dxg, g, s.c, s.h, s.w, dx_ref);
    for (int o = 0; o < s.ocg(); ++o) {
      db_ref[g * s.ocg() + o] = dbg[o];
      for (int c = 0; c < s.cg(); ++c)
        for (int ky = 0; ky < s.kh; ++ky)
          for (int kx = 0; kx < s.kw; ++kx)
            dw_ref[((size_t(g * s.ocg() + o) * s.cg() + c) * s.kh + ky) * s.kw + kx] =
                dwg[((size_t(o) * p.c + c) * p.kh + ky * s.dil_h) * p.kw + kx * s.dil_w];
    }
  }
  expect_near_all(y, y_ref, "forward");
  expect_near_all(dx, dx_ref, "backward_data");
  expect_near_all(dw, dw_ref, "backward_weight dw");
  expect_near_all(db, db_ref, "backward_weight db");
}

}  // namespace

TEST(Conv2dGroupedCpu, MatchesPlainConvPerGroupWithDilatedKernel) {
  const Case cases[] = {
      // n  c   h   w  oc kh kw  s  p  d  groups
      {1, 8, 13, 17, 8, 3, 3, 1, 1, 1, 8},     // depthwise
      {2, 6, 9, 7, 12, 3, 3, 1, 1, 1, 6},      // multiplier 2
      {1, 12, 13, 17, 12, 5, 5, 1, 2, 1, 12},  // 12 channels 5x5
      {2, 8, 13, 17, 16, 3, 3, 1, 1, 1, 4},    // groups 4 of 8 channels
      {2, 8, 13, 11, 8, 5, 3, 2, 2, 1, 4},     // rectangular kernel, stride 2
      {1, 8, 13, 17, 8, 3, 3, 1, 2, 2, 8},     // dilation 2
      {2, 3, 11, 9, 5, 3, 3, 2, 0, 3, 1},      // dilation 3, no groups, stride 2, pad 0
      {1, 4, 5, 6, 4, 1, 1, 1, 0, 1, 2},       // 1x1
  };
  for (const Case& k : cases) check_against_slices(k);
}

// torch.nn.Conv2d(2, 4, 1, groups=2): output channels 0,1 read input channel 0, 2,3 read 1.
TEST(Conv2dGroupedCpu, DepthwiseMultiplierChannelOrderAsTorch) {
  Conv2dGroupedShape s;
  s.c = 2, s.h = 1, s.w = 2, s.oc = 4, s.groups = 2;
  const std::vector<float> x = {1, 2, 10, 20}, w = {1, 2, 3, 4}, b = {0, 0, 0, 0.5f};
  std::vector<float> y(8);
  conv2d_grouped_forward_cpu(s, x.data(), w.data(), b.data(), y.data(), false);
  EXPECT_EQ(y, (std::vector<float>{1, 2, 2, 4, 30, 60, 40.5f, 80.5f}));
}

// The fast variant's kernel choice: the seed's launch-bound 1x64x32x32 reads rows without shared
// memory, the bandwidth-bound seed shapes (2^21 outputs and more) stream, the ones between tile,
// and a channel multiplier or a plane narrower than 32 columns keeps the tile kernel; the weight
// gradient streams where the forward does and tiles everywhere else; a block count of 2^30 or more
// never picks rows.
TEST(Conv2dGroupedCpu, FastKernelPickedByProblemSize) {
  const auto pick = [](int n, int c, int h, int w, int m = 1) {
    return conv2d_grouped_fast_kernel(shape_of({n, c, h, w, c * m, 3, 3, 1, 1, 1, c}));
  };
  const auto pick_wgrad = [](int n, int c, int h, int w, int m = 1) {
    return conv2d_grouped_fast_wgrad_kernel(shape_of({n, c, h, w, c * m, 3, 3, 1, 1, 1, c}));
  };
  EXPECT_EQ(pick(1, 64, 32, 32), DepthwiseKernel::Rows);
  EXPECT_EQ(pick(1, 64, 64, 64), DepthwiseKernel::Rows);  // 2^18 outputs, the bound
  EXPECT_EQ(pick(1, 65, 64, 64), DepthwiseKernel::Tile);
  EXPECT_EQ(pick(1, 64, 128, 128), DepthwiseKernel::Tile);     // 2^20 outputs
  EXPECT_EQ(pick(1, 128, 128, 128), DepthwiseKernel::Stream);  // 2^21, the bound
  EXPECT_EQ(pick(1, 127, 128, 128), DepthwiseKernel::Tile);
  EXPECT_EQ(pick(8, 64, 128, 128), DepthwiseKernel::Stream);
  EXPECT_EQ(pick(1, 256, 128, 128), DepthwiseKernel::Stream);
  EXPECT_EQ(pick(8, 12, 64, 64), DepthwiseKernel::Tile);
  EXPECT_EQ(pick(8, 64, 128, 128, 2), DepthwiseKernel::Tile);  // multiplier 2
  EXPECT_EQ(pick(64, 64, 256, 27), DepthwiseKernel::Tile);     // W < 28
  EXPECT_EQ(pick(64, 64, 256, 28), DepthwiseKernel::Stream);
  EXPECT_EQ(pick(128, 256, 7, 7), DepthwiseKernel::Rows);      // narrow planes: rows at any size
  EXPECT_EQ(pick(128, 256, 9, 9), DepthwiseKernel::Tile);
  EXPECT_EQ(pick_wgrad(1, 64, 32, 32), DepthwiseKernel::Tile);  // no rows weight gradient
  EXPECT_EQ(pick_wgrad(1, 64, 128, 128), DepthwiseKernel::Tile);
  EXPECT_EQ(pick_wgrad(8, 64, 128, 128), DepthwiseKernel::Stream);
  EXPECT_EQ(pick_wgrad(1, 256, 128, 128), DepthwiseKernel::Stream);
  EXPECT_EQ(pick_wgrad(8, 64, 128, 128, 2), DepthwiseKernel::Tile);
  EXPECT_EQ(pick_wgrad(64, 64, 256, 27), DepthwiseKernel::Tile);
  EXPECT_EQ(pick_wgrad(128, 256, 7, 7), DepthwiseKernel::Tile);  // no rows weight gradient
  EXPECT_TRUE(depthwise_rows_fits(shape_of({1, 64, 32, 32, 64, 3, 3, 1, 1, 1, 64})));
  // 2^15 images of 2^15 channels of one row: 2^30 blocks.
  EXPECT_FALSE(
      depthwise_rows_fits(shape_of({1 << 15, 1 << 15, 1, 4, 1 << 15, 3, 3, 1, 1, 1, 1 << 15})));
  EXPECT_TRUE(depthwise_rows_fits(
      shape_of({(1 << 15) - 1, 1 << 15, 1, 4, 1 << 15, 3, 3, 1, 1, 1, 1 << 15})));
}

// The fast variant runs stride 2 on the flat kernels for C/G == 1, square 3/5/7, stride 2 both
// ways, padding below the kernel, dilation 1; the stride-1 fast kernels never take such a shape.
TEST(Conv2dGroupedCpu, StridedKernelsTakeDepthwiseStrideTwo) {
  // {n, c, h, w, oc, kh, kw, stride, pad, dil, groups}
  const auto strided = [](const Case& k) { return conv2d_grouped_strided_applicable(shape_of(k)); };
  EXPECT_TRUE(strided({2, 64, 28, 28, 64, 3, 3, 2, 1, 1, 64}));
  EXPECT_TRUE(strided({2, 64, 28, 28, 128, 5, 5, 2, 2, 1, 64}));  // multiplier 2
  EXPECT_TRUE(strided({1, 3, 9, 9, 3, 7, 7, 2, 6, 1, 3}));        // pad K - 1
  EXPECT_TRUE(strided({1, 3, 9, 9, 3, 3, 3, 2, 0, 1, 3}));
  EXPECT_FALSE(conv2d_grouped_fast_applicable(shape_of({2, 64, 28, 28, 64, 3, 3, 2, 1, 1, 64})));
  EXPECT_FALSE(strided({2, 64, 28, 28, 64, 3, 3, 1, 1, 1, 64}));  // stride 1: the fast kernels
  EXPECT_FALSE(strided({2, 64, 28, 28, 64, 3, 3, 3, 1, 1, 64}));  // stride 3
  EXPECT_FALSE(strided({2, 64, 28, 28, 64, 3, 5, 2, 1, 1, 64}));  // not square
  EXPECT_FALSE(strided({2, 64, 28, 28, 64, 1, 1, 2, 0, 1, 64}));  // 1x1
  EXPECT_FALSE(strided({2, 64, 28, 28, 64, 3, 3, 2, 3, 1, 64}));  // pad K
  EXPECT_FALSE(strided({2, 64, 28, 28, 64, 3, 3, 2, 2, 2, 64}));  // dilation 2
  EXPECT_FALSE(strided({2, 64, 28, 28, 64, 3, 3, 2, 1, 1, 32}));  // 2 channels a group
}

// The narrow-group kernels take groups of 2 to 16 channels (the input gradient: up to 16 output
// channels), square odd kernels up to 7x7 (the weight gradient up to 3x3), stride 1 or 2, equal
// padding both ways (the input gradient at most K - 1), dilation 1.
TEST(Conv2dGroupedCpu, NarrowKernelsTakeNarrowGroups) {
  // {n, c, h, w, oc, kh, kw, stride, pad, dil, groups}
  const auto all = [](const Case& k) {
    const Conv2dGroupedShape s = shape_of(k);
    return grouped_narrow_forward_applicable(s) && grouped_narrow_backward_data_applicable(s) &&
           grouped_narrow_backward_weight_applicable(s);
  };
  EXPECT_TRUE(all({2, 128, 32, 32, 128, 3, 3, 1, 1, 1, 32}));  // ResNeXt's 32 groups of 4
  EXPECT_TRUE(all({2, 64, 8, 8, 64, 1, 1, 1, 0, 1, 4}));       // 1x1, 16 in and out
  EXPECT_FALSE(all({2, 8, 9, 9, 8, 3, 3, 1, 0, 1, 8}));        // depthwise: its own kernels
  EXPECT_FALSE(all({2, 68, 8, 8, 68, 3, 3, 1, 1, 1, 4}));      // 17 a group
  EXPECT_FALSE(all({2, 64, 8, 8, 64, 3, 5, 1, 1, 1, 16}));     // not square
  EXPECT_FALSE(all({2, 64, 8, 8, 64, 4, 4, 1, 1, 1, 16}));     // even
  EXPECT_FALSE(all({2, 64, 8, 8, 64, 3, 3, 1, 1, 2, 16}));     // dilation 2
  EXPECT_FALSE(all({2, 64, 8, 8, 64, 3, 3, 3, 1, 1, 16}));     // stride 3
  EXPECT_TRUE(all({2, 64, 16, 16, 64, 3, 3, 2, 1, 1, 8}));     // stride 2
  const Conv2dGroupedShape wide_out = shape_of({2, 16, 8, 8, 128, 3, 3, 1, 1, 1, 4});
  EXPECT_TRUE(grouped_narrow_forward_applicable(wide_out));
  EXPECT_TRUE(grouped_narrow_backward_data_applicable(wide_out));  // 32 output channels a group
  EXPECT_FALSE(grouped_narrow_backward_data_applicable(
      shape_of({2, 16, 8, 8, 256, 3, 3, 2, 1, 1, 4})));  // 64
  EXPECT_FALSE(grouped_narrow_forward_applicable(
      shape_of({2, 256, 16, 16, 256, 3, 3, 2, 1, 1, 8})));  // 32 input channels a group
  EXPECT_TRUE(grouped_narrow_backward_data_applicable(
      shape_of({2, 256, 16, 16, 256, 3, 3, 2, 1, 1, 8})));  // ResNeXt's stride-2 8 groups of 32
  const Conv2dGroupedShape k5 = shape_of({2, 16, 8, 8, 16, 5, 5, 1, 2, 1, 4});
  EXPECT_TRUE(grouped_narrow_backward_data_applicable(k5));
  EXPECT_FALSE(grouped_narrow_backward_weight_applicable(k5));
  EXPECT_FALSE(grouped_narrow_backward_data_applicable(
      shape_of({2, 16, 8, 8, 16, 3, 3, 1, 3, 1, 4})));  // padding beyond K - 1
}

// The narrow weight gradient's split covers every output position once: 32 lane segments a
// tile, runs of whole tiles, a chunk count that depends on the shape only.
TEST(Conv2dGroupedCpu, NarrowWeightGradientPlanCoversThePlane) {
  for (const Case& k :
       {Case{128, 128, 32, 32, 128, 3, 3, 1, 1, 1, 32}, Case{1, 8, 1, 1, 8, 1, 1, 1, 0, 1, 2},
        Case{3, 32, 40, 300, 40, 3, 3, 2, 1, 1, 2}, Case{7, 48, 9, 13, 24, 3, 3, 1, 1, 1, 3},
        Case{5, 16, 7, 7, 16, 3, 3, 1, 1, 1, 4}, Case{9, 8, 16, 16, 8, 3, 3, 2, 1, 1, 2}}) {
    const Conv2dGroupedShape s = shape_of(k);
    const NarrowWgradPlan p = grouped_narrow_wgrad_plan(s);
    EXPECT_EQ(p.th * p.segs_x, 32);
    EXPECT_EQ(p.tw, 8 * p.segs_x);
    EXPECT_GE(int64_t(p.tiles_x) * p.tw, s.ow());
    EXPECT_LT(int64_t(p.tiles_x - 1) * p.tw, s.ow());
    // A tile's images' rows fit its lanes' rows; a plane of at most th / 2 rows shares its tile.
    EXPECT_LE(p.ipt * p.rows, p.th);
    EXPECT_EQ(p.ipt > 1, 2 * s.oh() <= p.th);
    if (p.ipt > 1) {
      EXPECT_EQ(p.rows, s.oh());
    }
    EXPECT_GE(int64_t(p.tiles_y) * p.rows, s.oh());
    EXPECT_LT(int64_t(p.tiles_y - 1) * p.rows, s.oh());
    EXPECT_EQ(p.units, (s.n + p.ipt - 1) / p.ipt * int64_t(p.tiles_x) * p.tiles_y);
    EXPECT_GE(p.chunks * p.chunk_units, p.units);
    EXPECT_LT((p.chunks - 1) * p.chunk_units, p.units);
    EXPECT_GE(p.warps * p.c_blocks, s.cg());
    EXPECT_GE(4 * p.oc_chunks, s.ocg());
    EXPECT_EQ(grouped_narrow_wgrad_scratch_floats(s),
              p.chunks * (int64_t(s.oc) * s.cg() * s.kh * s.kw + s.oc));
  }
  // ResNeXt's layer at batch 128: 32 groups x 32 runs of 16 tiles of 8 x 32.
  const NarrowWgradPlan r =
      grouped_narrow_wgrad_plan(shape_of({128, 128, 32, 32, 128, 3, 3, 1, 1, 1, 32}));
  EXPECT_EQ(r.tw, 32);
  EXPECT_EQ(r.ipt, 1);
  EXPECT_EQ(r.chunks, 32);
  EXPECT_EQ(r.chunk_units, 16);
  // An 8 x 8 output (32 groups of 8 at stride 2): 8-wide tiles of 4 images' 8 rows.
  const NarrowWgradPlan m =
      grouped_narrow_wgrad_plan(shape_of({128, 256, 16, 16, 256, 3, 3, 2, 1, 1, 32}));
  EXPECT_EQ(m.tw, 8);
  EXPECT_EQ(m.ipt, 4);
  EXPECT_EQ(m.rows, 8);
  EXPECT_EQ(m.units, 32);
}

TEST(Conv2dGroupedCpu, ShapeChecksNameTheField) {
  Conv2dGroupedShape s;
  s.c = 6, s.oc = 6, s.h = s.w = 5, s.kh = s.kw = 3, s.groups = 4;
  try {
    check_conv2d_grouped_shape(s);
    ADD_FAILURE() << "groups 4 of 6 channels accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(test::contains(e.what(), "groups = 4")) << e.what();
  }
  s.groups = 3;
  s.dil_h = s.dil_w = 3;  // span 7 > 5
  EXPECT_THROW(check_conv2d_grouped_shape(s), Error);
  s.dil_h = s.dil_w = 1;
  EXPECT_THROW(conv2d_grouped_forward(s, nullptr, nullptr, nullptr, nullptr, false, nullptr,
                                      Algo::Igemm, Exec{}),
               Error);
}

namespace {

LayerSpec grouped_spec(const std::string& name, int out, int k, int stride, int pad, int dil,
                       int groups) {
  LayerSpec s = conv2d_spec(name, out, k, k, stride, pad);
  s.dil_h = s.dil_w = dil;
  s.groups = groups;
  return s;
}

// A grouped layer between a 1x1 conv (so the input gradient is exercised) and a linear head.
std::vector<GradcheckCase> grouped_cases() {
  auto wrap = [](const std::string& title, const LayerSpec& conv, const Shape& chw) {
    std::vector<LayerSpec> s = {conv2d_spec("prefix", int(chw[0]), 1, 1, 1, 0), conv,
                                layer_spec(LayerKind::Flatten, "flatten"), linear_spec("fc", 5),
                                layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")};
    return GradcheckCase{title, s, chw};
  };
  LayerSpec nobias = grouped_spec("conv", 8, 3, 1, 1, 1, 4);
  nobias.bias = false;
  return {wrap("depthwise 3x3 pad 1", grouped_spec("conv", 6, 3, 1, 1, 1, 6), {6, 7, 6}),
          wrap("depthwise 5x5 multiplier 2 stride 2", grouped_spec("conv", 8, 5, 2, 2, 1, 4),
               {4, 9, 8}),
          wrap("groups 2 of 4, 3x3, dilation 2", grouped_spec("conv", 6, 3, 1, 2, 2, 2), {4, 7, 9}),
          wrap("groups 4 of 8 no bias", nobias, {8, 5, 6}),
          wrap("dilation 2 without groups", grouped_spec("conv", 3, 3, 1, 1, 2, 1), {2, 7, 7})};
}

}  // namespace

TEST(Conv2dGroupedGradcheck, ReferenceInDouble) {
  for (const auto& c : grouped_cases()) {
    GradcheckOptions o;
    o.seed = test::fresh_seed();
    SCOPED_TRACE(c.title + " seed " + std::to_string(o.seed));
    const GradcheckResult r = gradcheck_reference(c.specs, c.input_chw, o);
    std::printf("%s\n%s", c.title.c_str(), format_gradcheck(r).c_str());
    EXPECT_TRUE(r.passed()) << format_gradcheck(r);
  }
}

TEST(Conv2dGroupedGradcheck, FloatNetworkOnCpu) {
  for (const auto& c : grouped_cases()) {
    GradcheckOptions o;
    o.seed = test::fresh_seed();
    SCOPED_TRACE(c.title + " seed " + std::to_string(o.seed));
    const GradcheckResult r = gradcheck_network(c.specs, c.input_chw, o, Exec{}, true);
    EXPECT_TRUE(r.passed()) << format_gradcheck(r);
  }
}

TEST(Conv2dGroupedLayerSpec, ShapesCountsAndErrors) {
  LayerSpec dw = grouped_spec("conv1", 64, 3, 1, 1, 1, 32);
  EXPECT_EQ(layer_output_shape(dw, {2, 32, 10, 12}), (Shape{2, 64, 10, 12}));
  EXPECT_EQ(layer_param_count(dw, {1, 32, 10, 12}), 64 * 1 * 9 + 64);
  EXPECT_EQ(layer_forward_flops(dw, {1, 32, 10, 12}), 2LL * 64 * 10 * 12 * 9);
  LayerSpec dil = grouped_spec("conv2", 4, 3, 1, 0, 2, 1);  // spans 5x5
  EXPECT_EQ(layer_output_shape(dil, {1, 2, 9, 9}), (Shape{1, 4, 5, 5}));
  LayerSpec bad = grouped_spec("conv3", 8, 3, 1, 1, 1, 3);
  try {
    layer_output_shape(bad, {1, 6, 8, 8});
    ADD_FAILURE() << "groups 3 with 8 outputs accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(test::contains(e.what(), "groups = 3")) << e.what();
  }
}

namespace {

const char* kGroupedConfig = R"(name: t
model:
  input: {channels: 3, height: 8, width: 8}
  layers:
    - conv2d: {out_channels: 6, kernel: 1}
    - conv2d: {out_channels: 12, kernel: 3, padding: 2, dilation: 2, groups: 6}
    - relu
    - flatten
    - linear: {out_features: 3}
    - softmax_cross_entropy
data:
  format: synthetic
  classes: [a, b, c]
  synthetic: {train: 10, test: 5, classes: 3}
optimizer:
  lr: 0.1
training:
  epochs: 1
  batch_size: 4
)";

}  // namespace

TEST(Conv2dGroupedConfig, GroupsAndDilationParseAndRoundTrip) {
  const TrainConfig c = parse_config(kGroupedConfig, "t.yaml");
  const LayerSpec& s = c.model.layers.at(1);
  EXPECT_EQ(s.groups, 6);
  EXPECT_EQ(s.dil_h, 2);
  EXPECT_EQ(s.dil_w, 2);
  const TrainConfig again = parse_config(c.resolved_yaml, "resolved.yaml");
  EXPECT_EQ(again.model.layers.at(1).groups, 6);
  EXPECT_EQ(again.model.layers.at(1).dil_w, 2);
}

TEST(Conv2dGroupedConfig, GroupsNotDividingChannelsNamesKeyAndLine) {
  std::string text = kGroupedConfig;
  const std::string from = "groups: 6}";
  text.replace(text.find(from), from.size(), "groups: 4}");
  try {
    parse_config(text, "t.yaml");
    ADD_FAILURE() << "groups 4 of 6 channels accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_TRUE(test::contains(msg, "groups = 4")) << msg;
    EXPECT_TRUE(test::contains(msg, "line 6")) << msg;
  }
  std::string zero = kGroupedConfig;
  zero.replace(zero.find(from), from.size(), "groups: 0}");
  EXPECT_THROW(parse_config(zero, "t.yaml"), Error);
}
