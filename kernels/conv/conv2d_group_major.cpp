// Group-major copy dispatch and its CPU reference.
#include "kernels/conv/conv2d_group_major.h"

#include <algorithm>

#include "kernels/conv/conv2d_group_major_cuda.h"
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

}  // namespace cnn
