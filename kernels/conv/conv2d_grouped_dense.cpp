// Grouped convolution on the dense kernels (see conv2d_grouped_dense.h): per group on group-major
// copies, or all groups at once on block-diagonal weights.
#include "kernels/conv/conv2d_grouped_dense.h"

#include <algorithm>
#include <cstdint>

#include "kernels/conv/conv2d_grouped_layout.h"
#include "kernels/conv/staged_scratch.h"
#include "runtime/env_switches.h"
#include "runtime/error.h"

namespace cnn {
namespace {

std::size_t input_floats(const Conv2dGroupedShape& s) {
  return std::size_t(s.n) * s.c * s.h * s.w;
}
std::size_t output_floats(const Conv2dGroupedShape& s) {
  return std::size_t(s.n) * s.oc * s.oh() * s.ow();
}
BlockDiagonal block_diagonal(const Conv2dGroupedShape& s) {
  return BlockDiagonal{s.oc, s.c, s.groups, s.kh * s.kw};
}
std::size_t dense_weight_floats(const Conv2dGroupedShape& s) {
  return round_up4(std::size_t(block_diagonal(s).dense_floats()));
}

void check_applicable(const Conv2dGroupedShape& s, const char* what) {
  check_conv2d_grouped_shape(s);
  CNN_CHECK(conv2d_grouped_dense_applicable(s),
            "{}: a dense variant runs grouped convolutions of dilation 1 with 2 to {} groups of "
            "at least 2 input channels (got groups = {}, {} input channels, dilation {}x{})",
            what, kGroupedDenseMaxGroups, s.groups, s.c, s.dil_h, s.dil_w);
}

void check_direct(bool runs_directly, const char* what, Algo algo) {
  CNN_CHECK(runs_directly,
            "{}: the direct form runs where wgmma-nhwc takes the grouped shape itself (got algo "
            "{}; conv2d_*_runs_directly)",
            what, algo_name(algo));
}

}  // namespace

bool conv2d_grouped_dense_applicable(const Conv2dGroupedShape& s) {
  return s.dil_h == 1 && s.dil_w == 1 && s.groups >= 2 && s.groups <= kGroupedDenseMaxGroups &&
         s.cg() >= 2;
}

GroupedDenseForm conv2d_grouped_dense_form(const Conv2dGroupedShape& s) {
  switch (process_env_switches().grouped_dense) {
    case GroupedDenseSwitch::PerGroup:
      return GroupedDenseForm::PerGroup;
    case GroupedDenseSwitch::BlockDiagonal:
      return GroupedDenseForm::BlockDiagonal;
    default:
      return std::max(s.c, s.oc) <= kBlockDiagonalMaxChannels ||
                     std::min(s.cg(), s.ocg()) < kPerGroupMinChannels
                 ? GroupedDenseForm::BlockDiagonal
                 : GroupedDenseForm::PerGroup;
  }
}

GroupedDenseForm conv2d_grouped_dense_pass_form(const Conv2dGroupedShape& s, GroupedPass pass,
                                                Precision precision, bool runs_directly) {
  const GroupedDenseSwitch forced = process_env_switches().grouped_dense;
  if (!runs_directly || forced == GroupedDenseSwitch::PerGroup ||
      forced == GroupedDenseSwitch::BlockDiagonal)
    return conv2d_grouped_dense_form(s);
  if (forced == GroupedDenseSwitch::Direct) return GroupedDenseForm::Direct;
  const int k_block = precision == Precision::BF16 ? 64 : 32;
  // k channels fill at least 3/4 of their k-tiles.
  const auto fills = [&](int k) { return 4 * k >= 3 * ((k + k_block - 1) / k_block * k_block); };
  bool wide = false;
  switch (pass) {
    case GroupedPass::Forward:
      wide = fills(s.cg()) && s.ocg() >= 16;
      break;
    case GroupedPass::BackwardData:
      wide = fills(s.ocg()) && s.cg() >= 16;
      break;
    case GroupedPass::BackwardWeight:
      // At BF16 the block-diagonal form's weight gradient runs the BF16 channels-last kernel
      // (twice TF32's rate), which the TF32 gather beats only where it does G-fold work.
      wide = std::min(s.cg(), s.ocg()) >= 8 && (precision != Precision::BF16 || s.groups >= 8);
      break;
  }
  return wide ? GroupedDenseForm::Direct : conv2d_grouped_dense_form(s);
}

bool conv2d_grouped_pass_runs_directly(const Conv2dGroupedShape& s, GroupedPass pass, Algo algo,
                                       const Exec& ex) {
  const Conv2dShape d = conv2d_grouped_as_dense(s);
  switch (pass) {
    case GroupedPass::Forward:
      return conv2d_forward_runs_directly(d, algo, ex);
    case GroupedPass::BackwardData:
      return conv2d_backward_data_runs_directly(d, algo, ex);
    default:
      return conv2d_backward_weight_runs_directly(d, algo, ex);
  }
}

GroupedDenseForm conv2d_grouped_dense_form_for(const Conv2dGroupedShape& s, GroupedPass pass,
                                               Algo algo, const Exec& ex) {
  return conv2d_grouped_dense_pass_form(s, pass, ex.precision,
                                        conv2d_grouped_pass_runs_directly(s, pass, algo, ex));
}

const char* grouped_dense_form_name(GroupedDenseForm f) {
  switch (f) {
    case GroupedDenseForm::BlockDiagonal:
      return "diagonal";
    case GroupedDenseForm::Direct:
      return "direct";
    default:
      return "groups";
  }
}

Conv2dShape conv2d_grouped_as_dense(const Conv2dGroupedShape& s) {
  Conv2dShape d;
  d.n = s.n, d.c = s.c, d.h = s.h, d.w = s.w, d.oc = s.oc, d.kh = s.kh, d.kw = s.kw;
  d.stride_h = s.stride_h, d.stride_w = s.stride_w, d.pad_h = s.pad_h, d.pad_w = s.pad_w;
  d.dil_h = s.dil_h, d.dil_w = s.dil_w, d.groups = s.groups;
  return d;
}

Conv2dShape conv2d_group_shape(const Conv2dGroupedShape& s) {
  Conv2dShape d = conv2d_block_diagonal_shape(s);
  d.c = s.cg(), d.oc = s.ocg();
  return d;
}

Conv2dShape conv2d_block_diagonal_shape(const Conv2dGroupedShape& s) {
  Conv2dShape d = conv2d_grouped_as_dense(s);
  d.groups = 1;
  return d;
}

std::size_t conv2d_grouped_dense_forward_scratch_floats(const Conv2dGroupedShape& s, Algo algo,
                                                        const Exec& ex, GroupedDenseForm form) {
  if (!conv2d_grouped_dense_applicable(s)) return 0;
  if (form == GroupedDenseForm::Direct)
    return conv2d_forward_scratch_floats(conv2d_grouped_as_dense(s), algo, ex);
  if (form == GroupedDenseForm::BlockDiagonal)
    return dense_weight_floats(s) +
           conv2d_forward_scratch_floats(conv2d_block_diagonal_shape(s), algo, ex);
  return round_up4(input_floats(s)) + round_up4(output_floats(s)) +
         conv2d_forward_scratch_floats(conv2d_group_shape(s), algo, ex);
}

std::size_t conv2d_grouped_dense_backward_data_scratch_floats(const Conv2dGroupedShape& s,
                                                              Algo algo, const Exec& ex,
                                                              GroupedDenseForm form) {
  if (!conv2d_grouped_dense_applicable(s)) return 0;
  if (form == GroupedDenseForm::Direct)
    return conv2d_backward_data_scratch_floats(conv2d_grouped_as_dense(s), algo, ex);
  if (form == GroupedDenseForm::BlockDiagonal)
    return dense_weight_floats(s) +
           conv2d_backward_data_scratch_floats(conv2d_block_diagonal_shape(s), algo, ex);
  return round_up4(output_floats(s)) + round_up4(input_floats(s)) +
         conv2d_backward_data_scratch_floats(conv2d_group_shape(s), algo, ex);
}

std::size_t conv2d_grouped_dense_backward_weight_scratch_floats(const Conv2dGroupedShape& s,
                                                                Algo /*algo*/, const Exec& ex,
                                                                GroupedDenseForm form) {
  if (!conv2d_grouped_dense_applicable(s)) return 0;
  if (form == GroupedDenseForm::Direct)
    return conv2d_backward_weight_scratch_floats(conv2d_grouped_as_dense(s), ex);
  if (form == GroupedDenseForm::BlockDiagonal)
    return dense_weight_floats(s) +
           conv2d_backward_weight_scratch_floats(conv2d_block_diagonal_shape(s), ex);
  return round_up4(input_floats(s)) + round_up4(output_floats(s)) +
         conv2d_backward_weight_scratch_floats(conv2d_group_shape(s), ex);
}

void conv2d_grouped_dense_forward(const Conv2dGroupedShape& s, const float* x, const float* w,
                                  const float* b, float* y, bool relu, float* scratch, Algo algo,
                                  const Exec& ex, GroupedDenseForm form) {
  check_applicable(s, "conv2d_grouped_dense_forward");
  CNN_CHECK(x && w && y, "conv2d_grouped_dense_forward: x, w and y must not be null");
  if (form == GroupedDenseForm::Direct) {
    check_direct(conv2d_forward_runs_directly(conv2d_grouped_as_dense(s), algo, ex),
                 "conv2d_grouped_dense_forward", algo);
    conv2d_forward(conv2d_grouped_as_dense(s), x, w, b, y, relu, scratch, algo, ex);
    return;
  }
  const std::size_t need = conv2d_grouped_dense_forward_scratch_floats(s, algo, ex, form);
  if (form == GroupedDenseForm::BlockDiagonal) {
    const Conv2dShape d = conv2d_block_diagonal_shape(s);
    const StagedScratch at =
        carve_staged_scratch("conv2d_grouped_dense_forward", scratch, need, dense_weight_floats(s),
                             0, conv2d_forward_scratch_floats(d, algo, ex));
    block_diagonal_expand(block_diagonal(s), w, at.first, ex);
    conv2d_forward(d, x, at.first, b, y, relu, at.dense, algo, ex);
    return;
  }
  const Conv2dShape d = conv2d_group_shape(s);
  const StagedScratch at =
      carve_staged_scratch("conv2d_grouped_dense_forward", scratch, need, input_floats(s),
                           output_floats(s), conv2d_forward_scratch_floats(d, algo, ex));
  const int64_t x_plane = int64_t(d.c) * d.h * d.w, y_plane = int64_t(d.oc) * d.oh() * d.ow();
  const int64_t w_group = int64_t(d.oc) * d.c * d.kh * d.kw;
  group_major_copy(x, at.first, s.n, s.groups, x_plane, true, ex);
  for (int g = 0; g < s.groups; ++g)
    conv2d_forward(d, at.first + int64_t(g) * s.n * x_plane, w + g * w_group,
                   b ? b + g * d.oc : nullptr, at.second + int64_t(g) * s.n * y_plane, relu,
                   at.dense, algo, ex);
  group_major_copy(at.second, y, s.n, s.groups, y_plane, false, ex);
}

void conv2d_grouped_dense_backward_data(const Conv2dGroupedShape& s, const float* dy,
                                        const float* w, float* dx, float* scratch, Algo algo,
                                        const Exec& ex, GroupedDenseForm form) {
  check_applicable(s, "conv2d_grouped_dense_backward_data");
  CNN_CHECK(dy && w && dx, "conv2d_grouped_dense_backward_data: dy, w and dx must not be null");
  if (form == GroupedDenseForm::Direct) {
    check_direct(conv2d_backward_data_runs_directly(conv2d_grouped_as_dense(s), algo, ex),
                 "conv2d_grouped_dense_backward_data", algo);
    conv2d_backward_data(conv2d_grouped_as_dense(s), dy, w, dx, scratch, algo, ex);
    return;
  }
  const std::size_t need = conv2d_grouped_dense_backward_data_scratch_floats(s, algo, ex, form);
  if (form == GroupedDenseForm::BlockDiagonal) {
    const Conv2dShape d = conv2d_block_diagonal_shape(s);
    const StagedScratch at = carve_staged_scratch("conv2d_grouped_dense_backward_data", scratch,
                                                  need, dense_weight_floats(s), 0,
                                                  conv2d_backward_data_scratch_floats(d, algo, ex));
    block_diagonal_expand(block_diagonal(s), w, at.first, ex);
    conv2d_backward_data(d, dy, at.first, dx, at.dense, algo, ex);
    return;
  }
  const Conv2dShape d = conv2d_group_shape(s);
  const StagedScratch at =
      carve_staged_scratch("conv2d_grouped_dense_backward_data", scratch, need, output_floats(s),
                           input_floats(s), conv2d_backward_data_scratch_floats(d, algo, ex));
  const int64_t x_plane = int64_t(d.c) * d.h * d.w, y_plane = int64_t(d.oc) * d.oh() * d.ow();
  const int64_t w_group = int64_t(d.oc) * d.c * d.kh * d.kw;
  group_major_copy(dy, at.first, s.n, s.groups, y_plane, true, ex);
  for (int g = 0; g < s.groups; ++g)
    conv2d_backward_data(d, at.first + int64_t(g) * s.n * y_plane, w + g * w_group,
                         at.second + int64_t(g) * s.n * x_plane, at.dense, algo, ex);
  group_major_copy(at.second, dx, s.n, s.groups, x_plane, false, ex);
}

void conv2d_grouped_dense_backward_weight(const Conv2dGroupedShape& s, const float* x,
                                          const float* dy, float* dw, float* db, float* scratch,
                                          Algo algo, const Exec& ex, GroupedDenseForm form) {
  check_applicable(s, "conv2d_grouped_dense_backward_weight");
  CNN_CHECK(x && dy && dw, "conv2d_grouped_dense_backward_weight: x, dy and dw must not be null");
  if (form == GroupedDenseForm::Direct) {
    check_direct(conv2d_backward_weight_runs_directly(conv2d_grouped_as_dense(s), algo, ex),
                 "conv2d_grouped_dense_backward_weight", algo);
    conv2d_backward_weight(conv2d_grouped_as_dense(s), x, dy, dw, db, scratch, algo, ex);
    return;
  }
  const std::size_t need = conv2d_grouped_dense_backward_weight_scratch_floats(s, algo, ex, form);
  if (form == GroupedDenseForm::BlockDiagonal) {
    // The dense gradient starts from zero in the scratch; db is the dense pass's own (OC).
    const Conv2dShape d = conv2d_block_diagonal_shape(s);
    const BlockDiagonal bd = block_diagonal(s);
    const StagedScratch at = carve_staged_scratch("conv2d_grouped_dense_backward_weight", scratch,
                                                  need, dense_weight_floats(s), 0,
                                                  conv2d_backward_weight_scratch_floats(d, ex));
    zero_floats(at.first, bd.dense_floats(), ex);
    conv2d_backward_weight(d, x, dy, at.first, db, at.dense, algo, ex);
    block_diagonal_add_back(bd, at.first, dw, ex);
    return;
  }
  const Conv2dShape d = conv2d_group_shape(s);
  const StagedScratch at =
      carve_staged_scratch("conv2d_grouped_dense_backward_weight", scratch, need, input_floats(s),
                           output_floats(s), conv2d_backward_weight_scratch_floats(d, ex));
  const int64_t x_plane = int64_t(d.c) * d.h * d.w, y_plane = int64_t(d.oc) * d.oh() * d.ow();
  const int64_t w_group = int64_t(d.oc) * d.c * d.kh * d.kw;
  group_major_copy(x, at.first, s.n, s.groups, x_plane, true, ex);
  group_major_copy(dy, at.second, s.n, s.groups, y_plane, true, ex);
  for (int g = 0; g < s.groups; ++g)
    conv2d_backward_weight(d, at.first + int64_t(g) * s.n * x_plane,
                           at.second + int64_t(g) * s.n * y_plane, dw + g * w_group,
                           db ? db + g * d.oc : nullptr, at.dense, algo, ex);
}

}  // namespace cnn
