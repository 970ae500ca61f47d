// Grouped convolution API: checks the shape once, then dispatches on the device and the variant.
// igemm / wgmma / wgmma-nhwc, and auto from 4 channels a group on CUDA (unless the narrow-group
// kernels take every pass of a group of at most 4): the dense kernels, on
// block-diagonal weights or a group at a time (conv2d_grouped_dense.h), or on the phases of a
// dilated convolution (conv2d_dilated_dense.h), on either device. Otherwise
// the CPU runs the reference loops and CUDA naive / tiled / fast (conv2d_grouped.cu); auto is then
// fast, which falls back to tiled where neither the depthwise nor the narrow-group kernels apply.
#include "kernels/conv/conv2d_grouped.h"

#include <algorithm>
#include <cstdint>

#include "kernels/conv/conv2d_depthwise_flat.h"
#include "kernels/conv/conv2d_dilated_dense.h"
#include "kernels/conv/conv2d_grouped_cuda.h"
#include "kernels/conv/conv2d_grouped_dense.h"
#include "kernels/conv/conv2d_grouped_narrow.h"
#include "kernels/conv/conv_window_check.h"
#include "runtime/dispatch.h"
#include "runtime/env_switches.h"
#include "runtime/error.h"
#include "runtime/math_util.h"

namespace cnn {

void check_conv2d_grouped_shape(const Conv2dGroupedShape& s) {
  check_conv_window({s.n, s.c, s.h, s.w, s.oc, s.kh, s.kw, s.stride_h, s.stride_w, s.pad_h, s.pad_w,
                     s.dil_h, s.dil_w});
  CNN_CHECK(s.groups > 0, "conv2d: groups = {} must be positive", s.groups);
  CNN_CHECK(s.c % s.groups == 0, "conv2d: groups = {} does not divide the {} input channels",
            s.groups, s.c);
  CNN_CHECK(s.oc % s.groups == 0, "conv2d: groups = {} does not divide the {} output channels",
            s.groups, s.oc);
}

bool conv2d_grouped_fast_applicable(const Conv2dGroupedShape& s) {
  return s.groups == s.c && s.kh == s.kw && (s.kh == 3 || s.kh == 5 || s.kh == 7) &&
         s.stride_h == 1 && s.stride_w == 1 && s.pad_h == s.kh / 2 && s.pad_w == s.kw / 2 &&
         s.dil_h == 1 && s.dil_w == 1;
}

bool depthwise_flat_applicable(const Conv2dGroupedShape& s) {
  return s.groups == s.c && s.kh == s.kw && (s.kh == 3 || s.kh == 5 || s.kh == 7) &&
         s.stride_h == s.stride_w && (s.stride_h == 1 || s.stride_h == 2) && s.pad_h >= 0 &&
         s.pad_h < s.kh && s.pad_w >= 0 && s.pad_w < s.kw && s.dil_h == 1 && s.dil_w == 1;
}

bool conv2d_grouped_strided_applicable(const Conv2dGroupedShape& s) {
  return s.stride_h == 2 && depthwise_flat_applicable(s);
}

namespace {
bool stream_wins(const Conv2dGroupedShape& s) {
  const int64_t outputs = int64_t(s.n) * s.oc * s.oh() * s.ow();
  return outputs >= kDepthwiseStreamMinOutputs && s.oc == s.c && s.w >= kDepthwiseStreamMinW;
}
}  // namespace

const char* depthwise_kernel_name(DepthwiseKernel k) {
  switch (k) {
    case DepthwiseKernel::Tile:
      return "tile";
    case DepthwiseKernel::Rows:
      return "rows";
    case DepthwiseKernel::Stream:
      return "stream";
    case DepthwiseKernel::Flat:
      return "flat";
    default:
      return "auto";
  }
}

DepthwiseKernel conv2d_grouped_fast_kernel(const Conv2dGroupedShape& s) {
  const int64_t outputs = int64_t(s.n) * s.oc * s.oh() * s.ow();
  if ((outputs <= kDepthwiseRowsMaxOutputs || s.w <= kDepthwiseRowsMaxW) && depthwise_rows_fits(s))
    return DepthwiseKernel::Rows;
  return stream_wins(s) ? DepthwiseKernel::Stream : DepthwiseKernel::Tile;
}

DepthwiseKernel conv2d_grouped_fast_wgrad_kernel(const Conv2dGroupedShape& s) {
  return stream_wins(s) ? DepthwiseKernel::Stream : DepthwiseKernel::Tile;
}

bool depthwise_rows_fits(const Conv2dGroupedShape& s) {
  // As the launcher strips the plane: one quad of 4 outputs per thread.
  const int64_t rows = std::min<int64_t>(
      s.h, std::max<int64_t>(1, kDepthwiseRowsThreads / ceil_div<int64_t>(s.w, 4)));
  return int64_t(s.n) * s.c * ceil_div<int64_t>(s.h, rows) < (int64_t(1) << 30);
}

DepthwiseTiling depthwise_tiling(const Conv2dGroupedShape& s, int max_rows, int64_t planes) {
  // Enough blocks for two waves on a 132-SM H200; a constant rather than the device's count so
  // that the tiling, and with it the deterministic reduction order, is a function of the shape.
  constexpr int64_t kTargetBlocks = 264;
  constexpr int64_t kMaxSmemBytes = 40 * 1024;
  DepthwiseTiling t;
  const int h = s.oh(), w = s.ow();
  t.tx = 1;
  while (t.tx < 32 && 4 * t.tx < w) t.tx *= 2;
  t.ty = 256 / t.tx;
  t.rows = max_rows;
  const auto update = [&] {
    t.tiles_x = ceil_div(w, t.tile_w());
    t.tiles_y = ceil_div(h, t.tile_h());
    return planes * t.tiles_x * t.tiles_y;
  };
  const auto smem = [&] { return int64_t(t.tile_h() + s.kh - 1) * (t.tile_w() + 8) * 4; };
  // Never below one warp per block: the reductions shuffle across whole warps.
  while (t.tx * t.ty > 32 && (t.ty * t.rows >= 2 * h || smem() > kMaxSmemBytes)) t.ty /= 2;
  while (update() < kTargetBlocks && t.rows > 1) t.rows /= 2;
  while (update() < kTargetBlocks && t.tx * t.ty > 64) t.ty /= 2;
  update();
  return t;
}

const char* depthwise_stream_strips_name(DepthwiseStreamStrips p) {
  return p == DepthwiseStreamStrips::Long ? "long" : "fill";
}

DepthwiseStreamStrips depthwise_stream_strips(bool weight_gradient) {
  switch (process_env_switches().depthwise_stream_strips) {
    case DepthwiseStreamStripsSwitch::Fill:
      return DepthwiseStreamStrips::Fill;
    case DepthwiseStreamStripsSwitch::Long:
      return DepthwiseStreamStrips::Long;
    default:
      return weight_gradient ? DepthwiseStreamStrips::Long : DepthwiseStreamStrips::Fill;
  }
}

DepthwiseStreamTiling depthwise_stream_tiling(const Conv2dGroupedShape& s, int rows,
                                              DepthwiseStreamStrips plan) {
  // Fill: about 2^18 threads before the strips get short (down to 4 rows). The 3x3 kernels take
  // 70-110 registers (sm_90, ptxas -v), so an SM holds 2-3 blocks of 256: the seed's
  // 8x64x128x128 then runs 1024 blocks of 8-row strips in ~2.6 waves of 396 rather than 512
  // whole planes in 1.3 (the last wave a third full), for 25% more halo rows read from L2.
  // Constants, not the device's size, so that the tiling, and with it the deterministic
  // reduction order, is a function of the shape.
  DepthwiseStreamTiling t;
  const int qw = ceil_div(s.w, 4);
  t.tx = 1;
  while (t.tx < 32 && t.tx < qw) t.tx *= 2;
  t.tiles_x = ceil_div(s.w, t.tile_w());
  const int64_t planes = int64_t(s.n) * s.oc;
  const auto threads = [&](int r) { return planes * t.tiles_x * t.tx * ceil_div(s.h, r); };
  t.rows = 32;
  while (t.rows > 4 && threads(t.rows) < kDepthwiseStreamFillThreads) t.rows /= 2;
  if (plan == DepthwiseStreamStrips::Long && t.rows < kDepthwiseStreamMinRows) {
    // Too few planes for several waves of long strips: one wave of them instead (the
    // seed's 1x256x128x128: 256 blocks of 16-row strips where Fill ran 1024 of 4 rows).
    t.rows = kDepthwiseStreamMinRows;
    while (t.rows < 32 && threads(t.rows) > kDepthwiseStreamWaveThreads) t.rows *= 2;
  }
  if (rows > 0) t.rows = rows;
  // ty strips per block, at most kDepthwiseStreamThreads threads, never below one warp (the
  // weight gradient's reduction shuffles across whole warps).
  t.ty = 1;
  while (t.tx * t.ty < kDepthwiseStreamThreads && t.ty * t.rows < s.h) t.ty *= 2;
  while (t.tx * t.ty < 32) t.ty *= 2;
  t.strips = ceil_div(s.h, t.tile_h());
  return t;
}

namespace {
// The dense variant each dense pass runs: auto keeps the dense op's fixed rule.
Algo dense_variant(Algo algo) {
  return conv2d_grouped_dense_variant(algo) ? algo : Algo::Auto;
}
bool dilated(const Conv2dGroupedShape& s) {
  return !conv2d_grouped_dense_applicable(s) && conv2d_dilated_dense_applicable(s);
}
// Each pass's form: Direct where the dense op runs the grouped shape itself under the pass's
// variant and the groups are wide enough (conv2d_grouped_dense_form_for).
GroupedDenseForm forward_form(const Conv2dGroupedShape& s, Algo algo, const Exec& ex) {
  return conv2d_grouped_dense_form_for(s, GroupedPass::Forward, dense_variant(algo), ex);
}
GroupedDenseForm backward_data_form(const Conv2dGroupedShape& s, Algo algo, const Exec& ex) {
  return conv2d_grouped_dense_form_for(s, GroupedPass::BackwardData, dense_variant(algo), ex);
}
GroupedDenseForm backward_weight_form(const Conv2dGroupedShape& s, Algo algo, const Exec& ex) {
  return conv2d_grouped_dense_form_for(s, GroupedPass::BackwardWeight, dense_variant(algo), ex);
}
}  // namespace

bool conv2d_grouped_dense_variant(Algo algo) {
  return algo == Algo::Igemm || algo == Algo::Wgmma || algo == Algo::WgmmaNhwc;
}

void check_conv2d_grouped_algo(const char* what, const Conv2dGroupedShape& s, Algo algo) {
  CNN_CHECK(!conv2d_grouped_dense_variant(algo) || conv2d_grouped_takes_dense(s),
            "{}: algo {} runs grouped convolutions of dilation 1 (2 to {} groups of at least 2 "
            "input channels) and dilated ones of stride 1 and one group on the dense kernels "
            "(got groups = {}, {} input channels, stride {}x{}, dilation {}x{}); expected naive, "
            "tiled, fast or auto",
            what, algo_name(algo), kGroupedDenseMaxGroups, s.groups, s.c, s.stride_h, s.stride_w,
            s.dil_h, s.dil_w);
}

bool conv2d_grouped_takes_dense(const Conv2dGroupedShape& s) {
  return conv2d_grouped_dense_applicable(s) || conv2d_dilated_dense_applicable(s);
}

bool conv2d_grouped_runs_dense(const Conv2dGroupedShape& s, Algo algo, const Exec& ex) {
  if (conv2d_grouped_dense_variant(algo)) return true;
  if (algo != Algo::Auto || ex.device != Device::CUDA) return false;
  if (conv2d_grouped_dense_applicable(s))
    return s.cg() >= kGroupedDenseAutoChannels && s.ocg() >= kGroupedDenseAutoChannels &&
           !(s.cg() <= kGroupedNarrowAutoChannels && grouped_narrow_forward_applicable(s) &&
             grouped_narrow_backward_data_applicable(s) &&
             grouped_narrow_backward_weight_applicable(s));
  return conv2d_dilated_dense_applicable(s) && s.c >= kGroupedDenseAutoChannels &&
         s.oc >= kGroupedDenseAutoChannels;
}

std::size_t conv2d_grouped_forward_scratch_floats(const Conv2dGroupedShape& s, Algo algo,
                                                  const Exec& ex) {
  check_conv2d_grouped_shape(s);
  if (!conv2d_grouped_runs_dense(s, algo, ex)) return 0;
  if (dilated(s)) return conv2d_dilated_dense_forward_scratch_floats(s, dense_variant(algo), ex);
  return conv2d_grouped_dense_forward_scratch_floats(s, dense_variant(algo), ex,
                                                     forward_form(s, algo, ex));
}

std::size_t conv2d_grouped_backward_data_scratch_floats(const Conv2dGroupedShape& s, Algo algo,
                                                        const Exec& ex) {
  check_conv2d_grouped_shape(s);
  if (!conv2d_grouped_runs_dense(s, algo, ex)) return 0;
  if (dilated(s))
    return conv2d_dilated_dense_backward_data_scratch_floats(s, dense_variant(algo), ex);
  return conv2d_grouped_dense_backward_data_scratch_floats(s, dense_variant(algo), ex,
                                                           backward_data_form(s, algo, ex));
}

std::size_t conv2d_grouped_backward_weight_scratch_floats(const Conv2dGroupedShape& s, Algo algo,
                                                          const Exec& ex) {
  check_conv2d_grouped_shape(s);
  if (conv2d_grouped_runs_dense(s, algo, ex))
    return dilated(s)
               ? conv2d_dilated_dense_backward_weight_scratch_floats(s, dense_variant(algo), ex)
               : conv2d_grouped_dense_backward_weight_scratch_floats(
                     s, dense_variant(algo), ex, backward_weight_form(s, algo, ex));
  if (ex.device == Device::CPU) return 0;
  return CNN_CUDA_VALUE(conv2d_grouped_backward_weight_scratch_floats_cuda(s, ex.deterministic),
                        std::size_t(0));
}

void conv2d_grouped_forward(const Conv2dGroupedShape& s, const float* x, const float* w,
                            const float* b, float* y, bool relu, float* scratch, Algo algo,
                            const Exec& ex) {
  check_conv2d_grouped_shape(s);
  CNN_CHECK(x && w && y, "conv2d_grouped_forward: x, w and y must not be null");
  if (conv2d_grouped_runs_dense(s, algo, ex)) {
    check_conv2d_grouped_algo("conv2d_grouped_forward", s, algo);
    if (dilated(s))
      return conv2d_dilated_dense_forward(s, x, w, b, y, relu, scratch, dense_variant(algo), ex);
    return conv2d_grouped_dense_forward(s, x, w, b, y, relu, scratch, dense_variant(algo), ex,
                                        forward_form(s, algo, ex));
  }
  if (ex.device == Device::CPU) return conv2d_grouped_forward_cpu(s, x, w, b, y, relu);
  CNN_CUDA_BRANCH("conv2d_grouped_forward",
                  conv2d_grouped_forward_cuda(s, x, w, b, y, relu, algo, ex.stream));
}

void conv2d_grouped_backward_data(const Conv2dGroupedShape& s, const float* dy, const float* w,
                                  float* dx, float* scratch, Algo algo, const Exec& ex) {
  check_conv2d_grouped_shape(s);
  CNN_CHECK(dy && w && dx, "conv2d_grouped_backward_data: dy, w and dx must not be null");
  if (conv2d_grouped_runs_dense(s, algo, ex)) {
    check_conv2d_grouped_algo("conv2d_grouped_backward_data", s, algo);
    if (dilated(s))
      return conv2d_dilated_dense_backward_data(s, dy, w, dx, scratch, dense_variant(algo), ex);
    return conv2d_grouped_dense_backward_data(s, dy, w, dx, scratch, dense_variant(algo), ex,
                                              backward_data_form(s, algo, ex));
  }
  if (ex.device == Device::CPU) return conv2d_grouped_backward_data_cpu(s, dy, w, dx);
  CNN_CUDA_BRANCH("conv2d_grouped_backward_data",
                  conv2d_grouped_backward_data_cuda(s, dy, w, dx, algo, ex.stream));
}

void conv2d_grouped_backward_weight(const Conv2dGroupedShape& s, const float* x, const float* dy,
                                    float* dw, float* db, float* scratch, Algo algo,
                                    const Exec& ex) {
  check_conv2d_grouped_shape(s);
  CNN_CHECK(x && dy && dw, "conv2d_grouped_backward_weight: x, dy and dw must not be null");
  if (conv2d_grouped_runs_dense(s, algo, ex)) {
    check_conv2d_grouped_algo("conv2d_grouped_backward_weight", s, algo);
    if (dilated(s))
      return conv2d_dilated_dense_backward_weight(s, x, dy, dw, db, scratch, dense_variant(algo),
                                                  ex);
    return conv2d_grouped_dense_backward_weight(s, x, dy, dw, db, scratch, dense_variant(algo), ex,
                                                backward_weight_form(s, algo, ex));
  }
  if (ex.device == Device::CPU) return conv2d_grouped_backward_weight_cpu(s, x, dy, dw, db);
  CNN_CUDA_BRANCH("conv2d_grouped_backward_weight", {
    const std::size_t need = conv2d_grouped_backward_weight_scratch_floats(s, algo, ex);
    CNN_CHECK(scratch || need == 0,
              "conv2d_grouped_backward_weight: deterministic mode needs a scratch buffer of {} "
              "floats (conv2d_grouped_backward_weight_scratch_floats), got null",
              need);
    conv2d_grouped_backward_weight_cuda(s, x, dy, dw, db, scratch, algo, ex.deterministic,
                                        ex.stream);
  });
}

}  // namespace cnn
