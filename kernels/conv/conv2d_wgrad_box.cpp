// Host geometry and CPU model of the box-tiled wgmma weight gradient (conv2d_wgrad_box.h).
#include "kernels/conv/conv2d_wgrad_box.h"

#include <algorithm>
#include <climits>
#include <vector>

#include "runtime/error.h"
#include "runtime/math_util.h"

namespace cnn {

namespace {

// The sizes the kernel indexes in 32 bits: planes of the copies' view, one copy plane, k-tiles
// of the batch. Computed in 64 bits before any of them is narrowed.
struct BoxSizes {
  int64_t copies, copy_h, copy_w, kt_img;
};

BoxSizes box_sizes(const Conv2dShape& s, int bw) {
  const int64_t oh = s.oh(), ow = s.ow();
  BoxSizes z;
  z.copies = int64_t{std::min(s.kh, s.stride_h)} * std::min(s.kw, 4 * s.stride_w);
  z.copy_h = oh + (s.kh - 1) / s.stride_h;
  z.copy_w = ceil_div<int64_t>(ow + 4 * ((s.kw - 1) / (4 * s.stride_w)), 4) * 4;
  z.kt_img = ceil_div<int64_t>(ow, bw) * ceil_div<int64_t>(oh, kWgradBoxPixels / bw);
  return z;
}

// The smallest box row that covers OW, at most one 128-byte swizzle row (the copies took the
// stride out of the row, so it does not cap the width).
int box_width(const Conv2dShape& s) {
  int bw = 8;
  while (bw < s.ow() && bw < kWgradBoxPixels) bw *= 2;
  return bw;
}

}  // namespace

std::string wgrad_box_refusal(const Conv2dShape& s) {
  const BoxSizes z = box_sizes(s, box_width(s));
  if (z.copies * s.n > INT_MAX || z.copy_h * z.copy_w > INT_MAX || z.kt_img * s.n > INT_MAX)
    return fmt::format(
        "conv2d_backward_weight: the TMA-box weight gradient: N={} C={} {}x{} k={}x{} stride "
        "{}x{} is over its 32-bit limits ({} copies of {}x{} a plane, {} boxes an image)",
        s.n, s.c, s.h, s.w, s.kh, s.kw, s.stride_h, s.stride_w, z.copies, z.copy_h, z.copy_w,
        z.kt_img);
  return {};
}

WgradBoxGeometry wgrad_box_geometry(const Conv2dShape& s) {
  const std::string why = wgrad_box_refusal(s);
  CNN_CHECK(why.empty(), "{}", why);
  WgradBoxGeometry g;
  g.bw = box_width(s);
  g.br = kWgradBoxPixels / g.bw;
  g.boxes_x = ceil_div(s.ow(), g.bw);
  g.boxes_y = ceil_div(s.oh(), g.br);
  g.kt_img = g.boxes_x * g.boxes_y;
  g.cgroups = ceil_div(s.c, kWgradBoxChannels);
  g.taps = s.kh * s.kw;
  g.groups = g.taps * g.cgroups;
  g.bias_col = kWgradBoxChannels * g.groups;
  const BoxSizes z = box_sizes(s, g.bw);
  g.copies_h = std::min(s.kh, s.stride_h);
  g.copies_w = std::min(s.kw, 4 * s.stride_w);
  g.copies = static_cast<int>(z.copies);
  g.copy_h = static_cast<int>(z.copy_h);
  g.copy_w = static_cast<int>(z.copy_w);
  g.reads_x = g.copies == 1 && s.stride_h == 1 && s.stride_w == 1 && s.pad_h == 0 && s.pad_w == 0 &&
              g.copy_h == s.h && g.copy_w == s.w;
  g.copy_floats = g.reads_x ? 0 : z.copies * s.n * s.c * z.copy_h * z.copy_w;
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

void wgrad_box_copies_cpu(const Conv2dShape& s, const WgradBoxGeometry& g, const float* x,
                          float* copies) {
  if (g.reads_x) return;
  float* out = copies;
  for (int qh = 0; qh < g.copies_h; ++qh)
    for (int qw = 0; qw < g.copies_w; ++qw)
      for (int n = 0; n < s.n; ++n)
        for (int c = 0; c < s.c; ++c) {
          const float* plane = x + (int64_t{n} * s.c + c) * s.h * s.w;
          for (int hp = 0; hp < g.copy_h; ++hp)
            for (int wp = 0; wp < g.copy_w; ++wp) {
              const int ih = hp * s.stride_h + qh - s.pad_h;
              const int iw = wp * s.stride_w + qw - s.pad_w;
              const bool in = ih >= 0 && ih < s.h && iw >= 0 && iw < s.w;
              *out++ = in ? plane[int64_t{ih} * s.w + iw] : 0.f;
            }
        }
}

void wgrad_box_model_cpu(const Conv2dShape& s, const float* x, const float* dy, float* dw,
                         float* db) {
  const WgradBoxGeometry g = wgrad_box_geometry(s);
  const int oh = s.oh(), ow = s.ow();
  const int64_t ckhw = int64_t{s.c} * g.taps;
  const int ncols = g.bias_col + 1;
  std::vector<double> acc(size_t(s.oc) * ncols, 0.0);
  std::vector<double> a(size_t(s.oc) * kWgradBoxPixels), b(size_t(ncols) * kWgradBoxPixels);
  // What B's boxes read: the copies, or x itself (W, H, C, N).
  std::vector<float> copies(size_t(g.copy_floats));
  wgrad_box_copies_cpu(s, g, x, copies.data());
  const float* src = g.reads_x ? x : copies.data();
  const int src_w = g.reads_x ? s.w : g.copy_w, src_h = g.reads_x ? s.h : g.copy_h;
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
      // B^T: one box per group of the copies' (Wc, Hc, C, R N) view at its corner, unit
      // traversal strides; the ones row for db; zeros past it.
      for (int group = 0; group < g.groups; ++group) {
        const WgradBoxCorner k = wgrad_box_corner(s, g, o, group);
        const int plane = k.copy * s.n + n;
        for (int i = 0; i < kWgradBoxChannels; ++i)
          for (int r = 0; r < g.br; ++r)
            for (int col = 0; col < g.bw; ++col)
              b[size_t(group * kWgradBoxChannels + i) * kWgradBoxPixels + r * g.bw + col] =
                  at(src, src_w, src_h, s.c, k.x + col, k.y + r, k.c + i, plane);
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
