#include "kernels/conv/conv2d_nhwc_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "kernels/common/bf16_round.h"
#include "kernels/conv/conv2d_dgrad_phase.h"
#include "runtime/error.h"

namespace cnn {

Im2colGeometry im2col_geometry(const Conv2dShape& g, const char* what, int channel_block) {
  return im2col_geometry(g, g.oh(), g.ow(), what, channel_block);
}

Im2colGeometry im2col_geometry(const Conv2dShape& g, int oh, int ow, const char* what,
                               int channel_block) {
  CNN_CHECK(channel_block == kNhwcChannelBlock || channel_block == kNhwcChannelBlockBf16,
            "{}: im2col channel block {} (expected {} or {})", what, channel_block,
            kNhwcChannelBlock, kNhwcChannelBlockBf16);
  Im2colGeometry geo;
  CNN_CHECK(oh >= 1 && ow >= 1, "{}: empty output ({}x{})", what, oh, ow);
  CNN_CHECK(g.stride_h >= 1 && g.stride_h <= 8 && g.stride_w >= 1 && g.stride_w <= 8,
            "{}: algo wgmma-nhwc handles strides 1..8 (TMA traversal strides; got {}x{})", what,
            g.stride_h, g.stride_w);
  geo.lower_w = -g.pad_w;
  geo.lower_h = -g.pad_h;
  geo.upper_w = (ow - 1) * g.stride_w - g.pad_w - (g.w - 1);
  geo.upper_h = (oh - 1) * g.stride_h - g.pad_h - (g.h - 1);
  for (int v : {geo.lower_w, geo.lower_h, geo.upper_w, geo.upper_h})
    CNN_CHECK(v >= -128 && v <= 127,
              "{}: algo wgmma-nhwc: the im2col box corner {} is outside the TMA's [-128, 127] "
              "(padding {}x{}, kernel {}x{})",
              what, v, g.pad_h, g.pad_w, g.kh, g.kw);
  // The copy's im2col offsets are the tap's dilated position (dil kx, dil ky), kept within the
  // corners' range.
  const int reach_w = g.dil_w * (g.kw - 1), reach_h = g.dil_h * (g.kh - 1);
  CNN_CHECK(g.dil_w >= 1 && g.dil_h >= 1 && reach_w <= 127 && reach_h <= 127,
            "{}: algo wgmma-nhwc reads filter taps at most 127 pixels from the window's corner "
            "(dilation {}x{}, kernel {}x{})",
            what, g.dil_h, g.dil_w, g.kh, g.kw);
  geo.stride_w = g.stride_w;
  geo.stride_h = g.stride_h;
  geo.dil_w = g.dil_w;
  geo.dil_h = g.dil_h;
  geo.chunks = (g.cg() + channel_block - 1) / channel_block;
  geo.c_pad = geo.chunks * channel_block;
  geo.taps = g.kh * g.kw;
  geo.ktiles = geo.taps * geo.chunks;
  return geo;
}

Im2colPixel im2col_start(const Conv2dShape& g, const Im2colGeometry& geo, int64_t m0) {
  const int64_t pix = int64_t(g.oh()) * g.ow();
  const int64_t n = m0 / pix, r = m0 - n * pix;
  const int oy = int(r / g.ow()), ox = int(r % g.ow());
  return {int(n), geo.lower_h + oy * geo.stride_h, geo.lower_w + ox * geo.stride_w};
}

Im2colPixel im2col_walk(const Conv2dShape& g, const Im2colGeometry& geo, Im2colPixel p, int steps) {
  const int right = g.w - 1 + geo.upper_w, bottom = g.h - 1 + geo.upper_h;
  for (int i = 0; i < steps; ++i) {
    p.x += geo.stride_w;
    if (p.x > right) {
      p.x = geo.lower_w;
      p.y += geo.stride_h;
      if (p.y > bottom) {
        p.y = geo.lower_h;
        ++p.n;
      }
    }
  }
  return p;
}

float round_tf32_cpu(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) {  // finite: add half a TF32 ulp to the magnitude
    u += 0x1000u;
    u &= ~0x1fffu;
  }
  float r;
  std::memcpy(&r, &u, 4);
  return r;
}

uint16_t bf16_bits_cpu(float v) {
  const float r = round_to_bf16(v);
  uint32_t u;
  std::memcpy(&u, &r, 4);
  return uint16_t(u >> 16);
}

namespace {

// x (n, groups c, hw) -> out (groups, n, hw, c_pad), each value through `convert`, zeros past c.
template <class T, class Convert>
void nchw_to_nhwc_cpu(const float* x, int n, int c, int64_t hw, int c_pad, int groups, T* out,
                      Convert convert) {
  for (int i = 0; i < n * groups; ++i) {  // image i / groups, group i % groups of x
    const int64_t o = int64_t(nhwc_copy_image(i, n, groups));
    for (int64_t p = 0; p < hw; ++p)
      for (int ch = 0; ch < c_pad; ++ch)
        out[(o * hw + p) * c_pad + ch] =
            ch < c ? convert(x[(int64_t(i) * c + ch) * hw + p]) : convert(0.f);
  }
}

}  // namespace

void nchw_to_nhwc_tf32_cpu(const float* x, int n, int c, int64_t hw, int c_pad, float* out,
                           int groups) {
  nchw_to_nhwc_cpu(x, n, c, hw, c_pad, groups, out, round_tf32_cpu);
}

void nchw_to_nhwc_bf16_cpu(const float* x, int n, int c, int64_t hw, int c_pad, uint16_t* out,
                           int groups) {
  nchw_to_nhwc_cpu(x, n, c, hw, c_pad, groups, out, bf16_bits_cpu);
}

void nchw_to_nhwc_fp32_cpu(const float* x, int n, int c, int64_t hw, int c_pad, float* out,
                           int groups) {
  nchw_to_nhwc_cpu(x, n, c, hw, c_pad, groups, out, [](float v) { return v; });
}

void nchw_to_nhwc_tf32_split_cpu(const float* x, int n, int c, int64_t hw, int c_pad, float* big,
                                 float* small, int groups) {
  nchw_to_nhwc_tf32_cpu(x, n, c, hw, c_pad, big, groups);
  nchw_to_nhwc_fp32_cpu(x, n, c, hw, c_pad, small, groups);
  for (int64_t i = 0; i < int64_t(n) * groups * hw * c_pad; ++i)
    small[i] = round_tf32_cpu(small[i] - big[i]);
}

WeightPack forward_weight_pack(const Conv2dShape& s, int k_block) {
  WeightPack wp;
  wp.rows = s.oc;
  wp.taps = s.kh * s.kw;
  wp.k_count = s.cg();
  wp.k_pad = (s.cg() + k_block - 1) / k_block * k_block;
  wp.ld_r = int64_t(s.cg()) * wp.taps;
  wp.ld_k = wp.taps;
  wp.flip = false;
  wp.kh = s.kh;
  wp.kw = s.kw;
  return wp;
}

WeightPack backward_data_weight_pack(const Conv2dShape& s, int k_block) {
  WeightPack wp;
  wp.rows = s.c;
  wp.taps = s.kh * s.kw;
  wp.k_count = s.ocg();
  wp.k_pad = (s.ocg() + k_block - 1) / k_block * k_block;
  wp.ld_r = wp.taps;
  wp.ld_k = int64_t(s.cg()) * wp.taps;
  wp.rows_per_group = s.cg();
  wp.ld_g = int64_t(s.ocg()) * s.cg() * wp.taps;
  wp.flip = true;
  wp.kh = s.kh;
  wp.kw = s.kw;
  wp.stride_h = s.stride_h;
  wp.stride_w = s.stride_w;
  wp.pad_h = s.pad_h;
  wp.pad_w = s.pad_w;
  return wp;
}

int64_t weight_pack_source(const WeightPack& wp, int r, int k, int t) {
  const int rpg = wp.rows_per_group > 0 ? wp.rows_per_group : wp.rows;
  return int64_t(r / rpg) * wp.ld_g + int64_t(r % rpg) * wp.ld_r + k * wp.ld_k +
         weight_pack_tap(wp, t);
}

void pack_weights_tf32_cpu(const WeightPack& wp, const float* w, float* out) {
  for (int r = 0; r < wp.rows; ++r)
    for (int t = 0; t < wp.taps; ++t)
      for (int k = 0; k < wp.k_pad; ++k) {
        out[(int64_t(r) * wp.taps + t) * wp.k_pad + k] =
            k < wp.k_count ? round_tf32_cpu(w[weight_pack_source(wp, r, k, t)]) : 0.f;
      }
}

void pack_weights_bf16_cpu(const WeightPack& wp, const float* w, uint16_t* out) {
  for (int r = 0; r < wp.rows; ++r)
    for (int t = 0; t < wp.taps; ++t)
      for (int k = 0; k < wp.k_pad; ++k) {
        out[(int64_t(r) * wp.taps + t) * wp.k_pad + k] =
            k < wp.k_count ? bf16_bits_cpu(w[weight_pack_source(wp, r, k, t)]) : uint16_t(0);
      }
}

void pack_weights_tf32_split_cpu(const WeightPack& wp, const float* w, float* big, float* small) {
  pack_weights_tf32_cpu(wp, w, big);
  for (int r = 0; r < wp.rows; ++r)
    for (int t = 0; t < wp.taps; ++t)
      for (int k = 0; k < wp.k_pad; ++k) {
        const int64_t i = (int64_t(r) * wp.taps + t) * wp.k_pad + k;
        small[i] =
            k < wp.k_count ? round_tf32_cpu(w[weight_pack_source(wp, r, k, t)] - big[i]) : 0.f;
      }
}

Conv2dShape backward_data_as_forward(const Conv2dShape& s) {
  Conv2dShape g;
  g.n = s.n;
  g.c = s.oc;
  g.h = s.oh();
  g.w = s.ow();
  g.oc = s.c;
  g.kh = s.kh;
  g.kw = s.kw;
  g.stride_h = 1;
  g.stride_w = 1;
  g.dil_h = s.dil_h;
  g.dil_w = s.dil_w;
  g.groups = s.groups;
  g.pad_h = s.dil_h * (s.kh - 1) - s.pad_h;
  g.pad_w = s.dil_w * (s.kw - 1) - s.pad_w;
  return g;
}

std::string nhwc_input_gradient_refusal(const Conv2dShape& s) {
  if (s.stride_h == 1 && s.stride_w == 1) return "";
  if (s.dilated())
    return fmt::format(
        "algo wgmma-nhwc runs strided input gradients of dilation 1 only (got stride {}x{}, "
        "dilation {}x{}); expected igemm, fast or auto",
        s.stride_h, s.stride_w, s.dil_h, s.dil_w);
  return "";
}

std::vector<NhwcDgradPhase> nhwc_dgrad_phases(const Conv2dShape& s, const char* what,
                                              int channel_block) {
  CNN_CHECK(s.stride_h > 1 || s.stride_w > 1, "{}: phases of a stride-1 input gradient", what);
  CNN_CHECK(!s.dilated(), "{}: the phases of a strided input gradient need dilation 1 (got {}x{})",
            what, s.dil_h, s.dil_w);
  const Conv2dShape base = backward_data_as_forward(s);
  std::vector<NhwcDgradPhase> out;
  // A phase's taps start where the earlier phases' end along each axis (phase_flipped_tap).
  int tap_y0 = 0;
  for (int py = 0; py < s.stride_h; ++py) {
    const DgradPhaseAxis ay = dgrad_phase_axis(s.h, s.kh, s.stride_h, s.pad_h, py);
    int tap_x0 = 0;
    for (int px = 0; px < s.stride_w; ++px) {
      const DgradPhaseAxis ax = dgrad_phase_axis(s.w, s.kw, s.stride_w, s.pad_w, px);
      if (ay.count > 0 && ax.count > 0) {
        NhwcDgradPhase ph;
        ph.py = py;
        ph.px = px;
        ph.oh = ay.count;
        ph.ow = ax.count;
        ph.ty = ay.taps;
        ph.tx = ax.taps;
        ph.tap_y0 = tap_y0;
        ph.tap_x0 = tap_x0;
        ph.g = base;
        ph.g.kh = std::max(ay.taps, 1);
        ph.g.kw = std::max(ax.taps, 1);
        // Tap u of the phase (its taps last to first) reads dy row q + origin - (ty - 1 - u):
        // a stride-1 window starting origin - ty + 1 rows below q.
        ph.g.pad_h = ay.taps - 1 - ay.origin;
        ph.g.pad_w = ax.taps - 1 - ax.origin;
        if (ph.ty > 0 && ph.tx > 0)
          ph.geo = im2col_geometry(ph.g, ph.oh, ph.ow, what, channel_block);
        out.push_back(ph);
      }
      tap_x0 += ax.taps;
    }
    tap_y0 += ay.taps;
  }
  return out;
}

}  // namespace cnn
