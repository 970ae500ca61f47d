// CPU twin of split_k_reduce_cuda: plain loops, the kernel's float operations in its order.
#include <cmath>

#include "kernels/gemm/split_k_reduce.h"
#include "runtime/error.h"

namespace cnn {

std::size_t split_k_work_floats(int groups, int m, int n) {
  CNN_CHECK(groups >= 1 && m >= 1 && n >= 1, "split_k_work_floats: groups={} m={} n={}", groups, m,
            n);
  return std::size_t(groups) * std::size_t(m) * ((std::size_t(n) + 3) / 4 * 4);
}

void split_k_reduce_cpu(const SplitKReduceShape& s, const float* work, const GemmEpilogue& e,
                        float* c) {
  for (int i = 0; i < s.m; ++i)
    for (int j = 0; j < s.n; ++j) {
      float sum = work[int64_t(i) * s.ldw + j];
      for (int g = 1; g < s.groups; ++g) sum += work[(int64_t(g) * s.m + i) * s.ldw + j];
      float& out = c[int64_t(i) * s.ldc + j];
      float v = e.alpha * sum;
      if (e.beta != 0.f) v = std::fma(e.beta, out, v);
      if (e.bias) v += e.bias[j];
      if (e.relu) v = (v <= 0.f) ? 0.f : v;  // NaN passes
      out = v;
    }
}

}  // namespace cnn
