#include "kernels/conv/conv2d_wgrad_window_plan.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "runtime/error.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

// The smallest v >= n with v = 4 (mod 8): a row stride whose 8 rows g = 0..7 start in the banks
// 4 g (mod 32), so that a fragment load of 8 rows x 4 consecutive words hits 32 banks.
int stride_4_mod_8(int n) {
  const int v = (n + 3) / 4 * 4;
  return v % 8 == 4 ? v : v + 4;
}

struct Tiling {
  int mtw, cgw, wm, wt;
};

// Accumulators a thread: mtw * cgw * ceil(KH*KW / wt) * 4 (<= 104). 3x3: 72 at every OC class;
// 5x5: 104 (two m-tiles a warp, so that each B fragment feeds two MMAs, and the 25 taps split
// 13 + 12 over two warps); 1x1: 16 (the channels a block are then what bounds the window, not
// the registers).
bool tiling_of(const Conv2dShape& s, Tiling& t) {
  if (s.kh != s.kw) return false;
  const int cls = s.oc <= 32 ? 0 : s.oc <= 64 ? 1 : s.oc <= 128 ? 2 : 3;
  if (cls == 3) return false;
  if (s.kh == 3) {
    t = {2, 1, 1 << cls, 1};  // OC 32: 32 channels a block; 64: 16; 128: 8
  } else if (s.kh == 5) {
    if (cls == 2) return false;
    t = {2, 1, 1 << cls, 2};  // OC 32: 16 channels; 64: 8
  } else if (s.kh == 1) {
    t = {2, 2, 1 << cls, 1};  // OC 32: 64 channels; 64: 32; 128: 16
  } else {
    return false;
  }
  return true;
}

// The geometry for `rows` output rows a unit; kstep 16 sizes the shared memory for either
// precision, so that rows (and with it the split and the scratch) do not depend on it.
void geometry(const Conv2dShape& s, WgradWindowPlan& p, int rows, int kstep) {
  const int ow = s.ow();
  p.rows = rows;
  p.bands = ceil_div(s.oh(), rows);
  p.ww = ow + s.kw - 1;
  // ws = OW (mod 4): the window offsets of 4 consecutive positions are then distinct mod 4 even
  // across a row end (the jump is ws - OW + 1 = 1 mod 4), which the bank argument of the B
  // fragments needs (see the kernel).
  p.ws = p.ww + ((ow - p.ww) % 4 + 4) % 4;
  p.wr = rows + s.kh - 1;
  p.cs = stride_4_mod_8(p.wr * p.ws);
  p.p = rows * ow;
  p.kp = ceil_div(p.p, kstep) * kstep;
  p.ds = stride_4_mod_8(p.kp);
  p.stage_floats = p.cb * p.cs + p.oc_pad * p.ds;
  p.smem = sizeof(float) * (2 * static_cast<std::size_t>(p.stage_floats) + p.kp);
}

}  // namespace

std::string wgrad_window_refusal(const Conv2dShape& s, Precision prec) {
  if (prec != Precision::TF32 && prec != Precision::BF16) return "precision not TF32 or BF16";
  if (s.stride_h != 1 || s.stride_w != 1) return "stride not 1";
  Tiling t{};
  if (!tiling_of(s, t)) return "kernel not 1x1/3x3 (OC <= 128) or 5x5 (OC <= 64)";
  if (s.oh() < 1 || s.ow() < 1 || s.n < 1 || s.c < 1) return "empty output";
  const int64_t x = int64_t{s.n} * s.c * s.h * s.w;
  const int64_t y = int64_t{s.n} * s.oc * s.oh() * s.ow();
  const int64_t w = int64_t{s.oc} * s.c * s.kh * s.kw + s.oc;
  if (x >= INT_MAX || y >= INT_MAX || w >= INT_MAX) return "tensor of 2^31 elements or more";
  WgradWindowPlan p{};
  p.oc_pad = 16 * t.mtw * t.wm;
  p.cb = 8 * t.cgw * (4 / (t.wm * t.wt));
  geometry(s, p, 1, 16);
  if (p.smem > kWgradWindowMaxSmem) return "a one-row band does not fit in shared memory";
  if (int64_t{s.n} * p.bands >= INT_MAX) return "too many units";
  return {};
}

WgradWindowPlan wgrad_window_plan(const Conv2dShape& s, Precision prec) {
  const std::string why = wgrad_window_refusal(s, prec);
  CNN_CHECK(why.empty(), "wgrad_window_plan: shape N={} C={} {}x{} OC={} {}x{}: {}", s.n, s.c, s.h,
            s.w, s.oc, s.kh, s.kw, why);
  Tiling t{};
  tiling_of(s, t);
  WgradWindowPlan p{};
  p.mtw = t.mtw;
  p.cgw = t.cgw;
  p.wm = t.wm;
  p.wt = t.wt;
  p.wc = 4 / (t.wm * t.wt);
  p.oc_pad = 16 * p.mtw * p.wm;
  p.cb = 8 * p.cgw * p.wc;
  p.chunks = ceil_div(s.c, p.cb);
  // Rows a band: as many as keep a unit within the target positions, evened out over the bands
  // (28 rows, at most 4 a band: 7 bands of 4, not 5 + 5 + 5 + 5 + 5 + 3), fewer where the two
  // stages would not fit. Where an image's dy plane is whole float4s, a band's rows are too
  // (a multiple of `step`), so that every band starts 16-byte aligned and dy is copied in
  // 16-byte pieces (14 columns: bands of an even number of rows).
  const int oh = s.oh(), ow = s.ow();
  const auto fit_rows = [&](int step) {
    int rows = std::clamp(kWgradWindowTargetPositions / ow, 1, oh);
    rows = std::max(step, rows / step * step);
    for (;;) {
      const int bands = ceil_div(oh, rows);
      geometry(s, p, std::min(rows, ceil_div(ceil_div(oh, bands), step) * step), 16);
      if (p.smem <= kWgradWindowMaxSmem || rows <= step) return p.smem <= kWgradWindowMaxSmem;
      rows -= step;
    }
  };
  p.dy_vec = int64_t{oh} * ow % 4 == 0 && fit_rows(4 / std::gcd(ow, 4));
  if (!p.dy_vec) fit_rows(1);  // fits: the refusal checked one-row bands
  p.units = s.n * p.bands;
  // Units a block: the fewest that keep about kWgradWindowTargetBlocks blocks, then as few splits
  // as that many units a block needs (every split gets the same count, the last perhaps fewer).
  const int target_splits = std::max(1, kWgradWindowTargetBlocks / p.chunks);
  p.units_per_split = ceil_div(p.units, target_splits);
  p.splits = ceil_div(p.units, p.units_per_split);
  p.slots = int64_t{s.oc} * s.c * s.kh * s.kw + s.oc;
  p.kstep = prec == Precision::BF16 ? 16 : 8;
  geometry(s, p, p.rows, p.kstep);
  return p;
}

std::size_t wgrad_window_scratch_floats(const Conv2dShape& s, const Exec& ex) {
  if (!ex.deterministic || !wgrad_window_supported(s, Precision::TF32)) return 0;
  const WgradWindowPlan p = wgrad_window_plan(s, Precision::TF32);
  return static_cast<std::size_t>(p.splits) * static_cast<std::size_t>(p.slots);
}

void wgrad_window_model_cpu(const Conv2dShape& s, Precision prec, const float* x, const float* dy,
                            float* dw, float* db) {
  const WgradWindowPlan p = wgrad_window_plan(s, prec);
  const int oh = s.oh(), ow = s.ow(), taps = s.kh * s.kw;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // The position table (the kernel's tab[]): positions past the band read window cell 0.
  std::vector<int> table(p.kp);
  for (int q = 0; q < p.kp; ++q) table[q] = q < p.p ? (q / ow) * p.ws + q % ow : 0;
  std::vector<float> win, dyt;
  for (int chunk = 0; chunk < p.chunks; ++chunk) {
    const int c0 = chunk * p.cb;
    for (int split = 0; split < p.splits; ++split) {
      const int u0 = split * p.units_per_split;
      const int u1 = std::min(p.units, u0 + p.units_per_split);
      std::vector<double> acc(static_cast<std::size_t>(p.oc_pad) * p.cb * taps, 0.0);
      std::vector<double> dbacc(p.oc_pad, 0.0);
      for (int u = u0; u < u1; ++u) {
        const int n = u / p.bands, oy0 = (u % p.bands) * p.rows;
        const int pvalid = std::min(p.rows, oh - oy0) * ow;
        // Shared memory as the kernel writes it: the window's cells [c][wr][col < ww], dy rows
        // oc < OC at positions < kp (zeros past the valid ones), zero rows OC..oc_pad; the rest
        // (row and channel padding) is never written.
        win.assign(static_cast<std::size_t>(p.cb) * p.cs, nan);
        dyt.assign(static_cast<std::size_t>(p.oc_pad) * p.ds, nan);
        for (int c = 0; c < p.cb; ++c)
          for (int wr = 0; wr < p.wr; ++wr)
            for (int col = 0; col < p.ww; ++col) {
              const int cg = c0 + c, iy = oy0 + wr - s.pad_h, ix = col - s.pad_w;
              const bool v = cg < s.c && iy >= 0 && iy < s.h && ix >= 0 && ix < s.w;
              win[c * p.cs + wr * p.ws + col] =
                  v ? x[((int64_t{n} * s.c + cg) * s.h + iy) * s.w + ix] : 0.f;
            }
        for (int oc = 0; oc < p.oc_pad; ++oc)
          for (int q = 0; q < p.kp; ++q) {
            const bool v = oc < s.oc && q < pvalid;
            dyt[oc * p.ds + q] = v ? dy[((int64_t{n} * s.oc + oc) * oh + oy0) * ow + q] : 0.f;
          }
        for (int q = 0; q < p.kp; ++q)
          for (int m = 0; m < p.oc_pad; ++m) {
            const double a = dyt[m * p.ds + q];
            dbacc[m] += a;
            for (int c = 0; c < p.cb; ++c)
              for (int ky = 0; ky < s.kh; ++ky)
                for (int kx = 0; kx < s.kw; ++kx)
                  acc[(static_cast<std::size_t>(m) * p.cb + c) * taps + ky * s.kw + kx] +=
                      a * win[c * p.cs + table[q] + ky * p.ws + kx];
          }
      }
      for (int m = 0; m < s.oc; ++m) {
        for (int c = 0; c < p.cb && c0 + c < s.c; ++c)
          for (int tap = 0; tap < taps; ++tap)
            dw[(int64_t{m} * s.c + c0 + c) * taps + tap] +=
                static_cast<float>(acc[(static_cast<std::size_t>(m) * p.cb + c) * taps + tap]);
        if (db && chunk == 0) db[m] += static_cast<float>(dbacc[m]);
      }
    }
  }
}

}  // namespace cnn
