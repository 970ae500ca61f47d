// Dilated convolution on the dense kernels (see conv2d_dilated_dense.h): phase layouts in the
// scratch, one undilated dense pass over the batch of phases.
#include "kernels/conv/conv2d_dilated_dense.h"

#include "kernels/conv/conv2d_dilation_phases.h"
#include "kernels/conv/conv2d_grouped_dense.h"
#include "kernels/conv/staged_scratch.h"
#include "runtime/error.h"
#include "runtime/math_util.h"

namespace cnn {
namespace {

// x's phases: the padded input, origin at (pad_h, pad_w).
DilationPhases input_phases(const Conv2dGroupedShape& s) {
  const Conv2dShape d = conv2d_dilated_phase_shape(s);
  return DilationPhases{s.n, s.c, s.h, s.w, s.dil_h, s.dil_w, s.pad_h, s.pad_w, d.h, d.w};
}
// y's (and dy's) phases: the output, origin at 0; a phase image is the dense pass's output.
DilationPhases output_phases(const Conv2dGroupedShape& s) {
  const Conv2dShape d = conv2d_dilated_phase_shape(s);
  return DilationPhases{s.n, s.oc, s.oh(), s.ow(), s.dil_h, s.dil_w, 0, 0, d.oh(), d.ow()};
}

void check_applicable(const Conv2dGroupedShape& s, const char* what) {
  check_conv2d_grouped_shape(s);
  CNN_CHECK(conv2d_dilated_dense_applicable(s),
            "{}: a dense variant runs dilated convolutions of stride 1 and one group (got stride "
            "{}x{}, groups = {}, dilation {}x{})",
            what, s.stride_h, s.stride_w, s.groups, s.dil_h, s.dil_w);
}

}  // namespace

bool conv2d_dilated_dense_applicable(const Conv2dGroupedShape& s) {
  return s.groups == 1 && s.stride_h == 1 && s.stride_w == 1 && s.dil_h >= 1 && s.dil_w >= 1 &&
         (s.dil_h > 1 || s.dil_w > 1);
}

Conv2dShape conv2d_dilated_phase_shape(const Conv2dGroupedShape& s) {
  Conv2dShape d;
  d.n = s.n * s.dil_h * s.dil_w, d.c = s.c, d.oc = s.oc, d.kh = s.kh, d.kw = s.kw;
  d.h = ceil_div(s.h + 2 * s.pad_h, s.dil_h);
  d.w = ceil_div(s.w + 2 * s.pad_w, s.dil_w);
  return d;
}

std::size_t conv2d_dilated_dense_forward_scratch_floats(const Conv2dGroupedShape& s, Algo algo,
                                                        const Exec& ex) {
  if (!conv2d_dilated_dense_applicable(s)) return 0;
  const Conv2dShape direct = conv2d_grouped_as_dense(s);
  if (conv2d_forward_runs_directly(direct, algo, ex))
    return conv2d_forward_scratch_floats(direct, algo, ex);
  return round_up4(std::size_t(input_phases(s).phase_floats())) +
         round_up4(std::size_t(output_phases(s).phase_floats())) +
         conv2d_forward_scratch_floats(conv2d_dilated_phase_shape(s), algo, ex);
}

std::size_t conv2d_dilated_dense_backward_data_scratch_floats(const Conv2dGroupedShape& s,
                                                              Algo algo, const Exec& ex) {
  if (!conv2d_dilated_dense_applicable(s)) return 0;
  const Conv2dShape direct = conv2d_grouped_as_dense(s);
  if (conv2d_backward_data_runs_directly(direct, algo, ex))
    return conv2d_backward_data_scratch_floats(direct, algo, ex);
  return round_up4(std::size_t(output_phases(s).phase_floats())) +
         round_up4(std::size_t(input_phases(s).phase_floats())) +
         conv2d_backward_data_scratch_floats(conv2d_dilated_phase_shape(s), algo, ex);
}

std::size_t conv2d_dilated_dense_backward_weight_scratch_floats(const Conv2dGroupedShape& s,
                                                                Algo algo, const Exec& ex) {
  if (!conv2d_dilated_dense_applicable(s)) return 0;
  const Conv2dShape direct = conv2d_grouped_as_dense(s);
  if (conv2d_backward_weight_runs_directly(direct, algo, ex))
    return conv2d_backward_weight_scratch_floats(direct, ex);
  return round_up4(std::size_t(input_phases(s).phase_floats())) +
         round_up4(std::size_t(output_phases(s).phase_floats())) +
         conv2d_backward_weight_scratch_floats(conv2d_dilated_phase_shape(s), ex);
}

void conv2d_dilated_dense_forward(const Conv2dGroupedShape& s, const float* x, const float* w,
                                  const float* b, float* y, bool relu, float* scratch, Algo algo,
                                  const Exec& ex) {
  check_applicable(s, "conv2d_dilated_dense_forward");
  CNN_CHECK(x && w && y, "conv2d_dilated_dense_forward: x, w and y must not be null");
  const Conv2dShape direct = conv2d_grouped_as_dense(s);
  if (conv2d_forward_runs_directly(direct, algo, ex)) {
    conv2d_forward(direct, x, w, b, y, relu, scratch, algo, ex);
    return;
  }
  const std::size_t need = conv2d_dilated_dense_forward_scratch_floats(s, algo, ex);
  const Conv2dShape d = conv2d_dilated_phase_shape(s);
  const DilationPhases in = input_phases(s), out = output_phases(s);
  const StagedScratch at = carve_staged_scratch(
      "conv2d_dilated_dense_forward", scratch, need, std::size_t(in.phase_floats()),
      std::size_t(out.phase_floats()), conv2d_forward_scratch_floats(d, algo, ex));
  dilation_phase_split(in, x, at.first, ex);
  conv2d_forward(d, at.first, w, b, at.second, relu, at.dense, algo, ex);
  dilation_phase_merge(out, at.second, y, ex);
}

void conv2d_dilated_dense_backward_data(const Conv2dGroupedShape& s, const float* dy,
                                        const float* w, float* dx, float* scratch, Algo algo,
                                        const Exec& ex) {
  check_applicable(s, "conv2d_dilated_dense_backward_data");
  CNN_CHECK(dy && w && dx, "conv2d_dilated_dense_backward_data: dy, w and dx must not be null");
  const Conv2dShape direct = conv2d_grouped_as_dense(s);
  if (conv2d_backward_data_runs_directly(direct, algo, ex)) {
    conv2d_backward_data(direct, dy, w, dx, scratch, algo, ex);
    return;
  }
  const std::size_t need = conv2d_dilated_dense_backward_data_scratch_floats(s, algo, ex);
  const Conv2dShape d = conv2d_dilated_phase_shape(s);
  const DilationPhases in = input_phases(s), out = output_phases(s);
  const StagedScratch at = carve_staged_scratch(
      "conv2d_dilated_dense_backward_data", scratch, need, std::size_t(out.phase_floats()),
      std::size_t(in.phase_floats()), conv2d_backward_data_scratch_floats(d, algo, ex));
  dilation_phase_split(out, dy, at.first, ex);
  conv2d_backward_data(d, at.first, w, at.second, at.dense, algo, ex);
  dilation_phase_merge(in, at.second, dx, ex);
}

void conv2d_dilated_dense_backward_weight(const Conv2dGroupedShape& s, const float* x,
                                          const float* dy, float* dw, float* db, float* scratch,
                                          Algo algo, const Exec& ex) {
  check_applicable(s, "conv2d_dilated_dense_backward_weight");
  CNN_CHECK(x && dy && dw, "conv2d_dilated_dense_backward_weight: x, dy and dw must not be null");
  const Conv2dShape direct = conv2d_grouped_as_dense(s);
  if (conv2d_backward_weight_runs_directly(direct, algo, ex)) {
    conv2d_backward_weight(direct, x, dy, dw, db, scratch, algo, ex);
    return;
  }
  const std::size_t need = conv2d_dilated_dense_backward_weight_scratch_floats(s, algo, ex);
  const Conv2dShape d = conv2d_dilated_phase_shape(s);
  const DilationPhases in = input_phases(s), out = output_phases(s);
  const StagedScratch at = carve_staged_scratch(
      "conv2d_dilated_dense_backward_weight", scratch, need, std::size_t(in.phase_floats()),
      std::size_t(out.phase_floats()), conv2d_backward_weight_scratch_floats(d, ex));
  dilation_phase_split(in, x, at.first, ex);
  dilation_phase_split(out, dy, at.second, ex);
  conv2d_backward_weight(d, at.first, at.second, dw, db, at.dense, algo, ex);
}

}  // namespace cnn
