// Host geometry and CPU model of the box-tiled wgmma weight gradient (conv2d_wgrad_box.h).
#include "kernels/conv/conv2d_wgrad_box.h"

#include <algorithm>
#include <vector>

#include "runtime/error.h"
#include "runtime/math_util.h"

namespace cnn {

namespace {
constexpr int kMaxStride = 4;  // bw sw <= 32 with bw >= 8 (the header's driver rules)
}  // namespace

std::string wgrad_box_refusal(const Conv2dShape& s) {
  if (s.stride_w > kMaxStride || s.stride_h > kMaxStride)
    return fmt::format(
        "conv2d_backward_weight: the TMA-box weight gradient takes strides up to {}, got {}x{}",
        kMaxStride, s.stride_h, s.stride_w);
  return {};
}

WgradBoxGeometry wgrad_box_geometry(const Conv2dShape& s) {
  const std::string why = wgrad_box_refusal(s);
  CNN_CHECK(why.empty(), "{}", why);
  WgradBoxGeometry g;
  // The widest box row whose traversal (bw sw floats) fits the 128-byte swizzle row.
  const int cap = s.stride_w == 1 ? 32 : s.stride_w == 2 ? 16 : 8;
  int bw = 8;
  while (bw < s.ow() && bw < cap) bw *= 2;
  g.bw = bw;
  g.br = kWgradBoxPixels / g.bw;
  g.boxes_x = ceil_div(s.ow(), g.bw);
  g.boxes_y = ceil_div(s.oh(), g.br);
  g.kt_img = g.boxes_x * g.boxes_y;
  g.cgroups = ceil_div(s.c, kWgradBoxChannels);
  g.taps = s.kh * s.kw;
  g.groups = g.taps * g.cgroups;
  g.bias_col = kWgradBoxChannels * g.groups;
  return g;
}

int64_t wgrad_box_column_slot(const Conv2dShape& s, const WgradBoxGeometry& g, int col) {
  if (col == g.bias_col) return -1;
  if (col < 0 || col > g.bias_col) return -2;
  const int group = col / kWgradBoxChannels;
  const int tap = group / g.cgroups, cg = group - tap * g.cgroups;
  const int c = cg * kWgradBoxChannels + (col - group * kWgradBoxChannels);
  if (c >= s.c) return -2;
  return int64_t{c} * g.taps + tap;
}

void wgrad_box_model_cpu(const Conv2dShape& s, const float* x, const float* dy, float* dw,
                         float* db) {
  const WgradBoxGeometry g = wgrad_box_geometry(s);
  const int oh = s.oh(), ow = s.ow();
  const int64_t ckhw = int64_t{s.c} * g.taps;
  const int ncols = g.bias_col + 1;
  std::vector<double> acc(size_t(s.oc) * ncols, 0.0);
  std::vector<double> a(size_t(s.oc) * kWgradBoxPixels), b(size_t(ncols) * kWgradBoxPixels);
  // One box element of a tensor viewed (inner, rows, planes, images), zero out of bounds.
  auto at = [](const float* t, int inner, int rows, int planes, int xi, int yi, int p, int n) {
    if (xi < 0 || xi >= inner || yi < 0 || yi >= rows || p < 0 || p >= planes) return 0.0;
    return double(t[((int64_t(n) * planes + p) * rows + yi) * inner + xi]);
  };
  for (int n = 0; n < s.n; ++n)
    for (int t = 0; t < g.kt_img; ++t) {
      const WgradBoxOrigin o = wgrad_box_origin(g, t);
      // A: box (bw, br, OC) of dy at (ox0, oy0, 0): row oc, pixel q = r bw + col.
      for (int oc = 0; oc < s.oc; ++oc)
        for (int r = 0; r < g.br; ++r)
          for (int col = 0; col < g.bw; ++col)
            a[size_t(oc) * kWgradBoxPixels + r * g.bw + col] =
                at(dy, ow, oh, s.oc, o.ox0 + col, o.oy0 + r, oc, n);
      // B^T: one box per group, traversal strides (sw, sh); the ones row for db; zeros past it.
      for (int group = 0; group < g.groups; ++group) {
        const WgradBoxCorner k = wgrad_box_corner(s, g, o, group);
        for (int i = 0; i < kWgradBoxChannels; ++i)
          for (int r = 0; r < g.br; ++r)
            for (int col = 0; col < g.bw; ++col)
              b[size_t(group * kWgradBoxChannels + i) * kWgradBoxPixels + r * g.bw + col] =
                  at(x, s.w, s.h, s.c, k.x + col * s.stride_w, k.y + r * s.stride_h, k.c + i, n);
      }
      for (int q = 0; q < kWgradBoxPixels; ++q) b[size_t(g.bias_col) * kWgradBoxPixels + q] = 1.0;
      for (int oc = 0; oc < s.oc; ++oc)
        for (int j = 0; j < ncols; ++j) {
          double sum = 0;
          for (int q = 0; q < kWgradBoxPixels; ++q)
            sum += a[size_t(oc) * kWgradBoxPixels + q] * b[size_t(j) * kWgradBoxPixels + q];
          acc[size_t(oc) * ncols + j] += sum;
        }
    }
  for (int oc = 0; oc < s.oc; ++oc)
    for (int j = 0; j < ncols; ++j) {
      const int64_t slot = wgrad_box_column_slot(s, g, j);
      const double v = acc[size_t(oc) * ncols + j];
      if (slot >= 0)
        dw[oc * ckhw + slot] += float(v);
      else if (slot == -1 && db)
        db[oc] += float(v);
    }
}

}  // namespace cnn
