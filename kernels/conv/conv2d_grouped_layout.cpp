// Grouped-convolution layout changes: dispatch and CPU references.
#include "kernels/conv/conv2d_grouped_layout.h"

#include <algorithm>

#include "kernels/conv/conv2d_grouped_layout_cuda.h"
#include "runtime/dispatch.h"
#include "runtime/error.h"

namespace cnn {

void group_major_copy_cpu(const float* src, float* dst, int n, int groups, int64_t plane,
                          bool to_group_major) {
  for (int i = 0; i < n; ++i)
    for (int g = 0; g < groups; ++g) {
      const int64_t sample_major = (int64_t(i) * groups + g) * plane;
      const int64_t group_major = (int64_t(g) * n + i) * plane;
      const float* from = src + (to_group_major ? sample_major : group_major);
      std::copy(from, from + plane, dst + (to_group_major ? group_major : sample_major));
    }
}

void group_major_copy(const float* src, float* dst, int n, int groups, int64_t plane,
                      bool to_group_major, const Exec& ex) {
  CNN_CHECK(n >= 1 && groups >= 1 && plane >= 1,
            "group_major_copy: n = {}, groups = {} and plane = {} must be positive", n, groups,
            plane);
  CNN_CHECK(src && dst, "group_major_copy: null pointer");
  const int64_t count = int64_t(n) * groups * plane;
  CNN_CHECK(src + count <= dst || dst + count <= src,
            "group_major_copy: source and destination overlap");
  if (ex.device == Device::CPU)
    return group_major_copy_cpu(src, dst, n, groups, plane, to_group_major);
  CNN_CUDA_BRANCH("group_major_copy",
                  group_major_copy_cuda(src, dst, n, groups, plane, to_group_major, ex.stream));
}

namespace {
void check_block_diagonal(const char* what, const BlockDiagonal& b, const float* from,
                          const float* to) {
  CNN_CHECK(b.oc >= 1 && b.c >= 1 && b.taps >= 1 && b.groups >= 1 && b.oc % b.groups == 0 &&
                b.c % b.groups == 0,
            "{}: oc = {}, c = {}, taps = {} in {} groups (expected positive sizes the groups "
            "divide)",
            what, b.oc, b.c, b.taps, b.groups);
  CNN_CHECK(from && to, "{}: null pointer", what);
}
}  // namespace

void block_diagonal_expand_cpu(const BlockDiagonal& b, const float* w, float* wd) {
  const int cg = b.c / b.groups, ocg = b.oc / b.groups;
  for (int o = 0; o < b.oc; ++o)
    for (int c = 0; c < b.c; ++c)
      for (int t = 0; t < b.taps; ++t)
        wd[(int64_t(o) * b.c + c) * b.taps + t] =
            c / cg == o / ocg ? w[(int64_t(o) * cg + c % cg) * b.taps + t] : 0.f;
}

void block_diagonal_add_back_cpu(const BlockDiagonal& b, const float* dwd, float* dw) {
  const int cg = b.c / b.groups, ocg = b.oc / b.groups;
  for (int o = 0; o < b.oc; ++o)
    for (int c = 0; c < cg; ++c)
      for (int t = 0; t < b.taps; ++t)
        dw[(int64_t(o) * cg + c) * b.taps + t] +=
            dwd[(int64_t(o) * b.c + (o / ocg) * cg + c) * b.taps + t];
}

void block_diagonal_expand(const BlockDiagonal& b, const float* w, float* wd, const Exec& ex) {
  check_block_diagonal("block_diagonal_expand", b, w, wd);
  if (ex.device == Device::CPU) return block_diagonal_expand_cpu(b, w, wd);
  CNN_CUDA_BRANCH("block_diagonal_expand", block_diagonal_expand_cuda(b, w, wd, ex.stream));
}

void block_diagonal_add_back(const BlockDiagonal& b, const float* dwd, float* dw, const Exec& ex) {
  check_block_diagonal("block_diagonal_add_back", b, dwd, dw);
  if (ex.device == Device::CPU) return block_diagonal_add_back_cpu(b, dwd, dw);
  CNN_CUDA_BRANCH("block_diagonal_add_back", block_diagonal_add_back_cuda(b, dwd, dw, ex.stream));
}

void zero_floats(float* p, int64_t count, const Exec& ex) {
  CNN_CHECK(count >= 0 && (p || count == 0), "zero_floats: {} floats at a null pointer", count);
  if (count == 0) return;
  if (ex.device == Device::CPU) return std::fill(p, p + count, 0.f);
  CNN_CUDA_BRANCH("zero_floats", zero_floats_cuda(p, count, ex.stream));
}

}  // namespace cnn
