#include "kernels/conv/conv2d_wgrad_tf32_halo_layout.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <vector>

#include "runtime/error.h"

namespace cnn {
namespace {

// The geometry without the checks.
WgradTf32HaloGeometry layout(const Conv2dShape& s) {
  WgradTf32HaloGeometry h;
  const int oh = s.oh(), ow = s.ow();
  h.rows = std::max(1, std::min(oh, 64 / ow));
  h.k = h.rows * ow;
  h.ksteps = h.k / 8;
  h.dy_boxes = (h.k + 31) / 32;
  h.bands = (oh + h.rows - 1) / h.rows;
  h.ktiles = int64_t(s.n) * h.bands;
  h.pitch = (s.w + s.pad_w + 3) / 4 * 4;
  if ((h.pitch / 4) % 2 == 0) h.pitch += 4;
  h.rows_x = h.rows + s.kh - 1;
  if (h.rows_x % 2 == 0) ++h.rows_x;
  h.chan_stride = h.rows_x * h.pitch;
  h.stages = int(std::min<int64_t>(8, kWgradTf32HaloRingBytes / h.stage_bytes()));
  return h;
}

}  // namespace

std::string wgrad_tf32_halo_shape_refusal(const Conv2dShape& s) {
  if (s.stride_h != 1 || s.stride_w != 1)
    return fmt::format("the TF32 halo k-tile handles stride 1 only (got {}x{})", s.stride_h,
                       s.stride_w);
  if (s.extended())
    return fmt::format(
        "the TF32 halo k-tile reads undilated taps of one group (got dilation {}x{}, groups {})",
        s.dil_h, s.dil_w, s.groups);
  const int oh = s.oh(), ow = s.ow();
  if (oh < 1 || ow < 1) return fmt::format("empty output ({}x{})", oh, ow);
  if (ow % 8 != 0 || ow > 64)
    return fmt::format("the TF32 halo k-tile takes OW a multiple of 8 up to 64 (got {})", ow);
  if (s.w % 4 != 0)
    return fmt::format("the TF32 halo x box needs W a multiple of 4 (16-byte rows; got {})", s.w);
  if (s.c < 16)
    return fmt::format("the TF32 halo kernel wants at least 16 input channels (got {})", s.c);
  if (s.kh * s.kw < 4)
    return fmt::format("the TF32 halo kernel wants at least 4 taps (got {}x{})", s.kh, s.kw);
  if (s.pad_w > kWgradTf32HaloGuardFloats)
    return fmt::format("the TF32 halo guard covers a padding of {} columns (got {})",
                       kWgradTf32HaloGuardFloats, s.pad_w);
  if (int64_t(s.n) * s.c * s.h * s.w > INT32_MAX || int64_t(s.n) * s.oc * oh * ow > INT32_MAX)
    return "tensors past 2^31-1 elements";
  const WgradTf32HaloGeometry h = layout(s);
  if (h.pitch > 256 || h.rows_x > 256)
    return fmt::format("the TF32 halo x box of {} rows x {} columns is past the TMA's 256",
                       h.rows_x, h.pitch);
  if (h.stages < 2)
    return fmt::format("the TF32 halo stage of {} bytes leaves fewer than 2 in {} bytes",
                       h.stage_bytes(), kWgradTf32HaloRingBytes);
  return {};
}

WgradTf32HaloGeometry wgrad_tf32_halo_geometry(const Conv2dShape& s, const char* what) {
  const std::string why = wgrad_tf32_halo_shape_refusal(s);
  CNN_CHECK(why.empty(), "{}: {}", what, why);
  return layout(s);
}

void wgrad_tf32_halo_model(const Conv2dShape& s, const float* x, const float* dy, double* dw) {
  const WgradTf32HaloGeometry h = wgrad_tf32_halo_geometry(s, "wgrad_tf32_halo_model");
  const int oh = s.oh(), ow = s.ow(), taps = s.kh * s.kw;
  const int64_t ohw = int64_t(oh) * ow;
  const int guard = kWgradTf32HaloGuardFloats;
  std::vector<float> slot(guard + size_t(64) * h.chan_stride);
  std::vector<float> dyb(size_t(64) * 32 * h.dy_boxes);
  for (int n = 0; n < s.n; ++n)
    for (int b = 0; b < h.bands; ++b) {
      const int oy0 = b * h.rows;
      for (int oc0 = 0; oc0 < s.oc; oc0 += 64) {
        // The dy boxes: 64 output channels x 32 pixels each, zero past OH OW and OC.
        for (int o = 0; o < 64; ++o)
          for (int kk = 0; kk < 32 * h.dy_boxes; ++kk) {
            const int64_t p = int64_t(oy0) * ow + kk;
            dyb[size_t(o) * 32 * h.dy_boxes + kk] =
                oc0 + o < s.oc && p < ohw ? dy[(int64_t(n) * s.oc + oc0 + o) * ohw + p] : 0.f;
          }
        for (int c0 = 0; c0 < s.c; c0 += 64) {
          // The x box: 64 channels x rows_x rows from oy0 - pad_h x pitch columns from 0.
          std::fill(slot.begin(), slot.end(), 0.f);
          for (int c = 0; c < 64 && c0 + c < s.c; ++c)
            for (int i = 0; i < h.rows_x; ++i) {
              const int iy = oy0 - s.pad_h + i;
              if (iy < 0 || iy >= s.h) continue;
              for (int j = 0; j < std::min(h.pitch, s.w); ++j)
                slot[guard + size_t(c) * h.chan_stride + size_t(i) * h.pitch + j] =
                    x[((int64_t(n) * s.c + c0 + c) * s.h + iy) * s.w + j];
            }
          for (int tap = 0; tap < taps; ++tap) {
            const int ky = tap / s.kw, kx = tap % s.kw;
            const int toff = h.tap_offset(ky, kx, s.pad_w);
            for (int c = 0; c < 64 && c0 + c < s.c; ++c)
              for (int o = 0; o < 64 && oc0 + o < s.oc; ++o) {
                double sum = 0;
                for (int kk = 0; kk < h.k; ++kk) {
                  const int64_t at = guard + int64_t(c) * h.chan_stride + h.pixel_offset(kk, ow) +
                                     toff;
                  CNN_CHECK(at >= 0 && at < int64_t(slot.size()),
                            "wgrad_tf32_halo_model: offset {} outside the slot", at);
                  sum += double(slot[size_t(at)]) * dyb[size_t(o) * 32 * h.dy_boxes + kk];
                }
                dw[(int64_t(oc0 + o) * s.c + c0 + c) * taps + tap] += sum;
              }
          }
        }
      }
    }
}

}  // namespace cnn
