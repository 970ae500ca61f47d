#include "kernels/conv/conv2d_wgrad_direct_plan.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "runtime/math_util.h"

namespace cnn {

namespace {

// Rounds a stride in floats up to a multiple of 4 (16-byte loads) that is an odd number of 16-byte
// words: the 4 input channels (or 8 output channels) a warp reads at one offset then fall in
// distinct 16-byte bank groups.
int odd_words(int floats) {
  int words = ceil_div(floats, 4);
  if (words % 2 == 0) ++words;
  return 4 * words;
}

// The strides and sizes of a band of `rows` output rows.
WgradDirectPlan layout(const Conv2dShape& s, int rows) {
  WgradDirectPlan p;
  p.rows = rows;
  p.bands = ceil_div(s.oh(), rows);
  p.runs = ceil_div(s.ow(), 4);
  p.dy_row = 4 * p.runs;
  p.x_row = 4 * p.runs + 4;
  p.x_rows = rows + 2;
  p.x_chan = odd_words(p.x_rows * p.x_row);
  p.dy_chan = odd_words(rows * p.dy_row);
  p.stage_floats = kWgradDirectCTile * p.x_chan + kWgradDirectOcTile * p.dy_chan;
  p.tiles_oc = ceil_div(s.oc, kWgradDirectOcTile);
  p.tiles_c = ceil_div(s.c, kWgradDirectCTile);
  p.units = int64_t{s.n} * p.bands;
  const int64_t tiles = int64_t{p.tiles_oc} * p.tiles_c;
  const int64_t want = std::max<int64_t>(1, ceil_div<int64_t>(kWgradDirectTargetBlocks, tiles));
  p.splits = static_cast<int>(std::min<int64_t>(p.units, want));
  // The epilogue's tile: 32 output-channel rows of 32 * 9 weights (stride 289: no bank
  // conflicts between the rows) and the 32 biases.
  const std::size_t tile_floats = kWgradDirectOcTile * (kWgradDirectCTile * 9 + 1) + 32;
  p.smem = std::max<std::size_t>(2 * std::size_t(p.stage_floats), tile_floats) * sizeof(float);
  p.slots = int64_t{s.oc} * s.c * 9 + s.oc;
  return p;
}

bool stage_fits(const WgradDirectPlan& p) {
  return std::size_t(p.stage_floats) * sizeof(float) <= kWgradDirectMaxStageBytes;
}

}  // namespace

std::string wgrad_direct_refusal(const Conv2dShape& s) {
  if (s.stride_h != 1 || s.stride_w != 1) return "stride above 1";
  if (s.kh != 3 || s.kw != 3) return "not a 3x3 kernel";
  if (!stage_fits(layout(s, 1))) return "image rows too wide for a shared-memory stage";
  if (int64_t{ceil_div(s.oc, kWgradDirectOcTile)} * ceil_div(s.c, kWgradDirectCTile) > 65535)
    return "more than 65535 channel tiles (grid y)";
  const int64_t max = std::numeric_limits<int32_t>::max();
  if (int64_t{s.n} * s.c * s.h * s.w > max || int64_t{s.n} * s.oc * s.oh() * s.ow() > max)
    return "a tensor of 2^31 elements or more";
  return {};
}

WgradDirectPlan wgrad_direct_plan(const Conv2dShape& s) {
  WgradDirectPlan best = layout(s, 1);
  double best_cost = std::numeric_limits<double>::max();
  for (int rows = 1; rows <= std::min(kWgradDirectMaxRows, s.oh()); ++rows) {
    const WgradDirectPlan p = layout(s, rows);
    if (!stage_fits(p)) break;  // the stage only grows with rows
    // The busiest block's units, each costing its rows of runs plus about a row and a half of
    // fixed work (staging the halo, two barriers, the pipeline's start).
    const double cost = double(ceil_div<int64_t>(p.units, p.splits)) * (rows + 1.5);
    if (cost < best_cost) {
      best = p;
      best_cost = cost;
    }
  }
  return best;
}

std::size_t wgrad_direct_scratch_floats(const Conv2dShape& s, bool deterministic) {
  if (!deterministic || !wgrad_direct_supported(s)) return 0;
  const WgradDirectPlan p = wgrad_direct_plan(s);
  return std::size_t(p.splits) * std::size_t(p.slots);
}

void wgrad_direct_model_cpu(const Conv2dShape& s, const float* x, const float* dy, float* dw,
                            float* db) {
  const WgradDirectPlan p = wgrad_direct_plan(s);
  const int oh = s.oh(), ow = s.ow();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> stage(p.stage_floats);
  std::vector<float> acc(std::size_t(kWgradDirectOcTile) * kWgradDirectCTile * 9);
  std::vector<float> bias(kWgradDirectOcTile);
  for (int tile = 0; tile < p.tiles_oc * p.tiles_c; ++tile) {
    const int oc0 = tile / p.tiles_c * kWgradDirectOcTile,
              c0 = tile % p.tiles_c * kWgradDirectCTile;
    for (int split = 0; split < p.splits; ++split) {
      std::fill(acc.begin(), acc.end(), 0.f);
      std::fill(bias.begin(), bias.end(), 0.f);
      for (int64_t u = split * p.units / p.splits; u < (split + 1) * p.units / p.splits; ++u) {
        const int n = static_cast<int>(u / p.bands), oy0 = static_cast<int>(u % p.bands) * p.rows;
        std::fill(stage.begin(), stage.end(), nan);
        float* xs = stage.data();
        float* ds = xs + kWgradDirectCTile * p.x_chan;
        for (int cl = 0; cl < kWgradDirectCTile; ++cl)
          for (int r = 0; r < p.x_rows; ++r)
            for (int j = 0; j < p.x_row; ++j) {
              const int c = c0 + cl, iy = oy0 - s.pad_h + r, ix = j - s.pad_w;
              const bool ok = c < s.c && iy >= 0 && iy < s.h && ix >= 0 && ix < s.w;
              xs[cl * p.x_chan + r * p.x_row + j] =
                  ok ? x[((int64_t{n} * s.c + c) * s.h + iy) * s.w + ix] : 0.f;
            }
        for (int ol = 0; ol < kWgradDirectOcTile; ++ol)
          for (int r = 0; r < p.rows; ++r)
            for (int j = 0; j < p.dy_row; ++j) {
              const int o = oc0 + ol, oy = oy0 + r;
              const bool ok = o < s.oc && oy < oh && j < ow;
              ds[ol * p.dy_chan + r * p.dy_row + j] =
                  ok ? dy[((int64_t{n} * s.oc + o) * oh + oy) * ow + j] : 0.f;
            }
        const int pairs = std::min(p.rows, oh - oy0) * p.runs;
        for (int group = 0; group < 2; ++group) {
          int row = group / p.runs, run = group - row * p.runs;
          for (int pr = group; pr < pairs; pr += 2) {
            for (int ol = 0; ol < kWgradDirectOcTile; ++ol) {
              const float* g = ds + ol * p.dy_chan + row * p.dy_row + 4 * run;
              if (c0 == 0) bias[ol] += (g[0] + g[1]) + (g[2] + g[3]);
              for (int cl = 0; cl < kWgradDirectCTile; ++cl)
                for (int ky = 0; ky < 3; ++ky) {
                  const float* q = xs + cl * p.x_chan + row * p.x_row + 4 * run + ky * p.x_row;
                  for (int kx = 0; kx < 3; ++kx)
                    for (int i = 0; i < 4; ++i)
                      acc[(ol * kWgradDirectCTile + cl) * 9 + ky * 3 + kx] += g[i] * q[i + kx];
                }
            }
            for (run += 2; run >= p.runs; run -= p.runs) ++row;
          }
        }
      }
      for (int ol = 0; ol < std::min(kWgradDirectOcTile, s.oc - oc0); ++ol) {
        for (int k = 0; k < std::min(kWgradDirectCTile, s.c - c0) * 9; ++k)
          dw[(int64_t{oc0 + ol} * s.c + c0) * 9 + k] += acc[ol * kWgradDirectCTile * 9 + k];
        if (db && c0 == 0) db[oc0 + ol] += bias[ol];
      }
    }
  }
}

}  // namespace cnn
