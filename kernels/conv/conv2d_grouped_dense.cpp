// Grouped convolution as one dense convolution a group (see conv2d_grouped_dense.h): group-major
// copies in the scratch, then the dense op of conv2d.h on each group's slices.
#include "kernels/conv/conv2d_grouped_dense.h"

#include <algorithm>
#include <cstdint>

#include "kernels/conv/conv2d_group_major.h"
#include "runtime/error.h"

namespace cnn {
namespace {

std::size_t round4(std::size_t floats) {
  return (floats + 3) / 4 * 4;
}
std::size_t input_floats(const Conv2dGroupedShape& s) {
  return std::size_t(s.n) * s.c * s.h * s.w;
}
std::size_t output_floats(const Conv2dGroupedShape& s) {
  return std::size_t(s.n) * s.oc * s.oh() * s.ow();
}

void check_applicable(const Conv2dGroupedShape& s, const char* what) {
  check_conv2d_grouped_shape(s);
  CNN_CHECK(conv2d_grouped_dense_applicable(s),
            "{}: a dense variant runs grouped convolutions of dilation 1 with 2 to {} groups of "
            "at least 2 input channels (got groups = {}, {} input channels, dilation {}x{})",
            what, kGroupedDenseMaxGroups, s.groups, s.c, s.dil_h, s.dil_w);
}

void check_scratch(const char* what, const float* scratch, std::size_t need) {
  CNN_CHECK(scratch || need == 0,
            "{}: needs a scratch buffer of {} floats (the _scratch_floats function), got null",
            what, need);
}

// The scratch as [first copy][second copy][the dense pass's scratch], each 16-byte aligned.
struct Slots {
  float* first;
  float* second;
  float* dense;  // null when the dense pass needs none
};
Slots slots(float* scratch, std::size_t first, std::size_t second, std::size_t dense) {
  float* a = scratch;
  float* b = a + round4(first);
  float* c = b + round4(second);
  return {a, b, dense > 0 ? c : nullptr};
}

}  // namespace

bool conv2d_grouped_dense_applicable(const Conv2dGroupedShape& s) {
  return s.dil_h == 1 && s.dil_w == 1 && s.groups >= 2 && s.groups <= kGroupedDenseMaxGroups &&
         s.cg() >= 2;
}

Conv2dShape conv2d_group_shape(const Conv2dGroupedShape& s) {
  Conv2dShape d;
  d.n = s.n, d.c = s.cg(), d.h = s.h, d.w = s.w, d.oc = s.ocg(), d.kh = s.kh, d.kw = s.kw;
  d.stride_h = s.stride_h, d.stride_w = s.stride_w, d.pad_h = s.pad_h, d.pad_w = s.pad_w;
  return d;
}

std::size_t conv2d_grouped_dense_forward_scratch_floats(const Conv2dGroupedShape& s, Algo algo,
                                                        const Exec& ex) {
  if (!conv2d_grouped_dense_applicable(s)) return 0;
  return round4(input_floats(s)) + round4(output_floats(s)) +
         conv2d_forward_scratch_floats(conv2d_group_shape(s), algo, ex);
}

std::size_t conv2d_grouped_dense_backward_data_scratch_floats(const Conv2dGroupedShape& s,
                                                              Algo algo, const Exec& ex) {
  if (!conv2d_grouped_dense_applicable(s)) return 0;
  return round4(output_floats(s)) + round4(input_floats(s)) +
         conv2d_backward_data_scratch_floats(conv2d_group_shape(s), algo, ex);
}

std::size_t conv2d_grouped_dense_backward_weight_scratch_floats(const Conv2dGroupedShape& s,
                                                                Algo /*algo*/, const Exec& ex) {
  if (!conv2d_grouped_dense_applicable(s)) return 0;
  return round4(input_floats(s)) + round4(output_floats(s)) +
         conv2d_backward_weight_scratch_floats(conv2d_group_shape(s), ex);
}

void conv2d_grouped_dense_forward(const Conv2dGroupedShape& s, const float* x, const float* w,
                                  const float* b, float* y, bool relu, float* scratch, Algo algo,
                                  const Exec& ex) {
  check_applicable(s, "conv2d_grouped_dense_forward");
  CNN_CHECK(x && w && y, "conv2d_grouped_dense_forward: x, w and y must not be null");
  const Conv2dShape d = conv2d_group_shape(s);
  const std::size_t dense = conv2d_forward_scratch_floats(d, algo, ex);
  check_scratch("conv2d_grouped_dense_forward", scratch,
                conv2d_grouped_dense_forward_scratch_floats(s, algo, ex));
  const Slots at = slots(scratch, input_floats(s), output_floats(s), dense);
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
                                        const Exec& ex) {
  check_applicable(s, "conv2d_grouped_dense_backward_data");
  CNN_CHECK(dy && w && dx, "conv2d_grouped_dense_backward_data: dy, w and dx must not be null");
  const Conv2dShape d = conv2d_group_shape(s);
  const std::size_t dense = conv2d_backward_data_scratch_floats(d, algo, ex);
  check_scratch("conv2d_grouped_dense_backward_data", scratch,
                conv2d_grouped_dense_backward_data_scratch_floats(s, algo, ex));
  const Slots at = slots(scratch, output_floats(s), input_floats(s), dense);
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
                                          Algo algo, const Exec& ex) {
  check_applicable(s, "conv2d_grouped_dense_backward_weight");
  CNN_CHECK(x && dy && dw, "conv2d_grouped_dense_backward_weight: x, dy and dw must not be null");
  const Conv2dShape d = conv2d_group_shape(s);
  const std::size_t dense = conv2d_backward_weight_scratch_floats(d, ex);
  check_scratch("conv2d_grouped_dense_backward_weight", scratch,
                conv2d_grouped_dense_backward_weight_scratch_floats(s, algo, ex));
  const Slots at = slots(scratch, input_floats(s), output_floats(s), dense);
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
