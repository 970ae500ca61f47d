// Host geometry and CPU model of the box-tiled wgmma weight gradient (conv2d_wgrad_box.h).
#include "kernels/conv/conv2d_wgrad_box.h"

#include <algorithm>
#include <climits>
#include <limits>
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

// Columns of the pieces of `run` channels: what the tensor cores multiply, zeros included.
int64_t run_columns(const Conv2dShape& s, int run) {
  return int64_t{s.kh} * s.kw * ceil_div(s.c, run) * run;
}

// The fewest boxes of B a stage among the runs whose columns stay within a quarter more than run
// 8's: the rule, which the cost model below may override.
int fewest_boxes_run(const Conv2dShape& s, int bw) {
  const int64_t base = run_columns(s, 8);
  int best = 8;
  for (int run : {16, 32, 64, 128}) {
    if (4 * run_columns(s, run) > 5 * base) continue;
    if (wgrad_box_b_boxes(bw, run) < wgrad_box_b_boxes(bw, best)) best = run;
  }
  return best;
}

// The cost model of a run: column tiles x (100 + 6 x boxes of B a stage), in hundredths of a
// one-box stage (the file comment of conv2d_wgrad_box.h: boxes set the pace).
int64_t run_cost(const Conv2dShape& s, int bw, int run) {
  return ceil_div<int64_t>(run_columns(s, run), 128) * (100 + 6 * wgrad_box_b_boxes(bw, run));
}

}  // namespace

int wgrad_box_b_boxes(int bw, int run) {
  const WgradBoxBLayout l = wgrad_box_b_layout(bw, run);
  return l.run == 128 ? 1 : 128 / l.run * l.boxes_per_piece;
}

int wgrad_box_choose_run(const Conv2dShape& s) {
  const int bw = box_width(s), br = kWgradBoxPixels / bw;
  const int rule = fewest_boxes_run(s, bw);
  // Boxes mostly inside the output (at least 3/4 of their pixels): the model, where it predicts
  // at least 7% less than the rule's run.
  const int64_t ow = s.ow(), oh = s.oh();
  const int64_t inside = ow * oh,
                boxed = ceil_div<int64_t>(ow, bw) * bw * ceil_div<int64_t>(oh, br) * br;
  if (4 * inside < 3 * boxed) return rule;
  const int64_t rule_cost = run_cost(s, bw, rule);
  int best = rule;
  int64_t best_cost = rule_cost;
  for (int run : {8, 16, 32, 64, 128}) {
    const int64_t cost = run_cost(s, bw, run);
    if (cost < best_cost) {
      best = run;
      best_cost = cost;
    }
  }
  return 100 * best_cost <= 93 * rule_cost ? best : rule;
}

std::string wgrad_box_refusal(const Conv2dShape& s) {
  if (s.extended())
    return fmt::format(
        "conv2d_backward_weight: the TMA-box weight gradient copies undilated taps of every "
        "channel (got dilation {}x{}, groups {}); the gather reads dilated and grouped ones",
        s.dil_h, s.dil_w, s.groups);
  const BoxSizes z = box_sizes(s, box_width(s));
  if (z.copies * s.n > INT_MAX || z.copy_h * z.copy_w > INT_MAX || z.kt_img * s.n > INT_MAX)
    return fmt::format(
        "conv2d_backward_weight: the TMA-box weight gradient: N={} C={} {}x{} k={}x{} stride "
        "{}x{} is over its 32-bit limits ({} copies of {}x{} a plane, {} boxes an image)",
        s.n, s.c, s.h, s.w, s.kh, s.kw, s.stride_h, s.stride_w, z.copies, z.copy_h, z.copy_w,
        z.kt_img);
  return {};
}

WgradBoxGeometry wgrad_box_geometry(const Conv2dShape& s, int run) {
  const std::string why = wgrad_box_refusal(s);
  CNN_CHECK(why.empty(), "{}", why);
  CNN_CHECK(
      run == kWgradBoxRunAuto || run == 8 || run == 16 || run == 32 || run == 64 || run == 128,
      "wgrad_box_geometry: run {} channels a piece; expected 8, 16, 32, 64, 128 or auto (0)", run);
  WgradBoxGeometry g;
  g.bw = box_width(s);
  g.br = kWgradBoxPixels / g.bw;
  g.boxes_x = ceil_div(s.ow(), g.bw);
  g.boxes_y = ceil_div(s.oh(), g.br);
  g.kt_img = g.boxes_x * g.boxes_y;
  g.run = run == kWgradBoxRunAuto ? wgrad_box_choose_run(s) : run;
  g.b = wgrad_box_b_layout(g.bw, g.run);
  g.b_boxes = wgrad_box_b_boxes(g.bw, g.run);
  g.cgroups = ceil_div(s.c, g.run);
  g.taps = s.kh * s.kw;
  g.groups = g.taps * g.cgroups;
  g.bias_col = g.run * g.groups;
  const BoxSizes z = box_sizes(s, g.bw);
  g.copies_h = std::min(s.kh, s.stride_h);
  g.copies_w = std::min(s.kw, 4 * s.stride_w);
  g.copies = static_cast<int>(z.copies);
  g.copy_h = static_cast<int>(z.copy_h);
  g.copy_w = static_cast<int>(z.copy_w);
  g.reads_x = g.copies == 1 && s.stride_h == 1 && s.stride_w == 1 && s.pad_h == 0 && s.pad_w == 0 &&
              g.copy_h == s.h && g.copy_w == s.w;
  g.copy_floats = g.reads_x ? 0 : z.copies * s.n * s.c * z.copy_h * z.copy_w;
  if (!g.reads_x && s.stride_h == 1 && s.stride_w == 1 && s.w % 4 == 0 && s.pad_w < g.copies_w)
    g.direct_copy = s.pad_w;  // class (0, pw): copies_h = 1 at stride 1
  return g;
}

int64_t wgrad_box_column_slot(const Conv2dShape& s, const WgradBoxGeometry& g, int col) {
  if (col == g.bias_col) return -1;
  if (col < 0 || col > g.bias_col) return -2;
  const int group = col / g.run;
  const int tap = group / g.cgroups, cg = group - tap * g.cgroups;
  const int c = cg * g.run + (col - group * g.run);
  if (c >= s.c) return -2;
  return int64_t{c} * g.taps + tap;
}

void wgrad_box_copies_cpu(const Conv2dShape& s, const WgradBoxGeometry& g, const float* x,
                          float* copies, int skip) {
  if (g.reads_x) return;
  float* out = copies;
  const int64_t copy_size = int64_t{s.n} * s.c * g.copy_h * g.copy_w;
  for (int qh = 0; qh < g.copies_h; ++qh)
    for (int qw = 0; qw < g.copies_w; ++qw) {
      if (qh * g.copies_w + qw == skip) {
        out += copy_size;
        continue;
      }
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
}

uint32_t tma_box_landing_offset(int row_floats, uint32_t span, int row, int col) {
  const uint32_t row_bytes = uint32_t(row_floats) * 4u;
  const uint32_t pitch = span > row_bytes ? span : row_bytes;
  const uint32_t off = uint32_t(row) * pitch + uint32_t(col) * 4u;
  return span == 0 ? off : wgrad_swizzle(off, span);
}

uint32_t wgmma_kmajor_read_address(uint64_t desc, int row, int k) {
  const uint32_t start = uint32_t(desc & 0x3FFFu) << 4;
  const uint32_t sbo = uint32_t((desc >> 32) & 0x3FFFu) << 4;
  const uint32_t layout = uint32_t(desc >> 62);
  CNN_CHECK(layout != 0, "wgmma_kmajor_read_address: descriptor {:#x} has no swizzle", desc);
  const uint32_t span = layout == 1 ? 128u : layout == 2 ? 64u : 32u;
  const uint32_t addr =
      start + uint32_t(row / 8) * sbo + uint32_t(row % 8) * span + uint32_t(k) * 4u;
  return wgrad_swizzle(addr, span);
}

void wgrad_box_model_cpu(const Conv2dShape& s, const float* x, const float* dy, float* dw,
                         float* db, int run, bool direct) {
  const WgradBoxGeometry g = wgrad_box_geometry(s, run);
  const int oh = s.oh(), ow = s.ow(), bm = wgrad_box_bm(s);
  constexpr int kBN = 128, kK = kWgradBoxPixels;
  const int64_t ckhw = int64_t{s.c} * g.taps;
  const int ncols = g.bias_col + 1;
  const int tiles_m = ceil_div(s.oc, bm), tiles_n = ceil_div(ncols, kBN);
  std::vector<double> acc(size_t(s.oc) * ncols, 0.0);
  // What B's boxes read: the copies, or x itself.
  std::vector<float> copies(size_t(g.copy_floats));
  // The direct class's copy unwritten (NaN): a box that read it would poison the sums.
  std::fill(copies.begin(), copies.end(), std::numeric_limits<float>::quiet_NaN());
  wgrad_box_copies_cpu(s, g, x, copies.data(), direct ? g.direct_copy : -1);
  const float* src = g.reads_x ? x : copies.data();
  const int64_t src_w = g.reads_x ? s.w : g.copy_w, src_h = g.reads_x ? s.h : g.copy_h;
  const int64_t planes = g.reads_x ? s.n : int64_t{g.copies} * s.n;
  // One element of a 4-D view (dims and element strides innermost first), 0 out of bounds:
  // TMA's fill, dimensions in any order of memory.
  struct View {
    const float* t;
    int64_t dim[4], stride[4];
    double at(const int64_t (&c)[4]) const {
      int64_t off = 0;
      for (int d = 0; d < 4; ++d) {
        if (c[d] < 0 || c[d] >= dim[d]) return 0.0;
        off += c[d] * stride[d];
      }
      return double(t[off]);
    }
  };
  const View dy_view{dy, {ow, s.oc, oh, s.n}, {1, int64_t{oh} * ow, ow, int64_t{s.oc} * oh * ow}};
  const View x_view{
      src, {src_w, s.c, src_h, planes}, {1, src_h * src_w, src_w, s.c * src_h * src_w}};
  // x itself (W, C, H, N), for the direct class's boxes.
  const int64_t hw = int64_t{s.h} * s.w;
  const View x_itself{x, {s.w, s.c, s.h, s.n}, {1, hw, s.w, s.c * hw}};
  // One stage: A at byte 0 (BM x 32 floats), B after it; both 1024-byte aligned as in the kernel.
  const uint32_t span = wgrad_span_bytes(g.bw);
  const uint32_t b_base = uint32_t(bm) * kK * 4;
  std::vector<float> stage(size_t(bm + kBN) * kK);
  auto put = [&](uint32_t byte, double v) { stage[byte / 4] = float(v); };
  // The addresses the consumers' wgmmas read, through the kernel's descriptors: tile row i (of
  // BM) or column j (of 128) at pixel q = 8 step + k.
  std::vector<uint32_t> a_addr(size_t(bm) * kK), b_addr(size_t(kBN) * kK);
  for (int step = 0; step < kK / 8; ++step) {
    for (int wg = 0; wg < bm / 64; ++wg) {
      const uint64_t da =
          wgrad_smem_desc(uint32_t(wg) * 64 * span + wgrad_box_step_offset(g.bw, bm, step), span,
                          wgrad_a_sbo(g.bw));
      for (int i = 0; i < 64; ++i)
        for (int k = 0; k < 8; ++k)
          a_addr[size_t(wg * 64 + i) * kK + 8 * step + k] = wgmma_kmajor_read_address(da, i, k);
    }
    const uint64_t dB = wgrad_smem_desc(b_base + wgrad_box_step_offset(g.bw, g.b.slab_rows, step),
                                        span, wgrad_b_sbo(g.bw, g.b.slab_rows));
    for (int j = 0; j < kBN; ++j)
      for (int k = 0; k < 8; ++k)
        b_addr[size_t(j) * kK + 8 * step + k] = wgmma_kmajor_read_address(dB, j, k);
  }
  std::vector<double> a(size_t(bm) * kK), b(size_t(kBN) * kK);
  for (int n = 0; n < s.n; ++n)
    for (int t = 0; t < g.kt_img; ++t) {
      const WgradBoxOrigin o = wgrad_box_origin(g, t);
      for (int tm = 0; tm < tiles_m; ++tm)
        for (int tn = 0; tn < tiles_n; ++tn) {
          const int m0 = tm * bm, n0 = tn * kBN;
          std::fill(stage.begin(), stage.end(), std::numeric_limits<float>::quiet_NaN());
          // A: box (bw, BM, br, 1) of dy at (ox0, m0, oy0, n): row r * BM + m of the box.
          for (int r = 0; r < g.br; ++r)
            for (int m = 0; m < bm; ++m)
              for (int col = 0; col < g.bw; ++col)
                put(tma_box_landing_offset(g.bw, span, r * bm + m, col),
                    dy_view.at({o.ox0 + col, m0 + m, o.oy0 + r, n}));
          // B: the tile's pieces, each one box (bw, run, box_rows, 1) or br of them, landing at
          // wgrad_box_b_dst; the constant columns (db's ones, zeros past it) written column by
          // column as the kernel does.
          const int per_tile = kBN / g.run;
          const int live = std::max(0, std::min(per_tile, g.groups - n0 / g.run));
          for (int piece = 0; piece < live; ++piece) {
            const WgradBoxCorner k = wgrad_box_corner(s, g, o, n0 / g.run + piece, direct);
            const View& view = k.copy < 0 ? x_itself : x_view;
            const int64_t plane = k.copy < 0 ? n : int64_t{k.copy} * s.n + n;
            for (int br = 0; br < g.b.boxes_per_piece; ++br) {
              const uint32_t dst = b_base + wgrad_box_b_dst(g.bw, g.b, piece, br);
              for (int r = 0; r < g.b.box_rows; ++r)
                for (int i = 0; i < g.run; ++i)
                  for (int col = 0; col < g.bw; ++col)
                    put(dst + tma_box_landing_offset(g.bw, span, r * g.run + i, col),
                        view.at({k.x + col, k.c + i, k.y + br + r, plane}));
            }
          }
          for (int j = live * g.run; j < kBN; ++j) {
            const double v = n0 + j == g.bias_col ? 1.0 : 0.0;
            for (int q = 0; q < kK; ++q)
              put(b_base + wgrad_box_b_offset(g.bw, g.b.slab_rows, j, q), v);
          }
          for (size_t e = 0; e < a.size(); ++e) a[e] = stage[a_addr[e] / 4];
          for (size_t e = 0; e < b.size(); ++e) b[e] = stage[b_addr[e] / 4];
          for (int m = 0; m < bm && m0 + m < s.oc; ++m)
            for (int j = 0; j < kBN && n0 + j < ncols; ++j) {
              double sum = 0;
              for (int q = 0; q < kK; ++q) sum += a[size_t(m) * kK + q] * b[size_t(j) * kK + q];
              acc[size_t(m0 + m) * ncols + n0 + j] += sum;
            }
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
