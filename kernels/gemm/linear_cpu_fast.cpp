// Fast CPU fully connected layer: each pass is one gemm_cpu call, which spreads the work over the
// thread pool by output tiles (every output element summed by one thread, in a fixed order).
#include "kernels/gemm/linear_cpu_fast.h"

#include <cstdint>
#include <vector>

#include "kernels/gemm/gemm_cpu.h"
#include "runtime/thread_pool.h"

namespace cnn {

void linear_forward_cpu_fast(const LinearShape& s, const float* x, const float* w, const float* b,
                             float* y, bool relu) {
  // y (N, OUT) = x (N, IN) * w^T, w stored (OUT, IN).
  gemm_cpu(false, true, s.n, s.out, s.in, 1.f, x, s.in, w, s.in, 0.f, y, s.out);
  if (b == nullptr && !relu) return;
  parallel_for(0, s.n, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      float* row = y + i * s.out;
      for (int o = 0; o < s.out; ++o) {
        const float v = row[o] + (b ? b[o] : 0.f);
        row[o] = relu && v <= 0.f ? 0.f : v;  // NaN passes, as in the reference
      }
    }
  });
}

void linear_backward_data_cpu_fast(const LinearShape& s, const float* dy, const float* w,
                                   float* dx) {
  // dx (N, IN) = dy (N, OUT) * w (OUT, IN).
  gemm_cpu(false, false, s.n, s.in, s.out, 1.f, dy, s.out, w, s.in, 0.f, dx, s.in);
}

void linear_backward_weight_cpu_fast(const LinearShape& s, const float* x, const float* dy,
                                     float* dw, float* db, bool overwrite_dw) {
  // dw (OUT, IN) += dy^T (OUT, N) * x (N, IN); dy stored (N, OUT). beta = 0 does not read dw.
  gemm_cpu(true, false, s.out, s.in, s.n, 1.f, dy, s.out, x, s.in, overwrite_dw ? 0.f : 1.f, dw,
           s.in);
  if (db == nullptr) return;
  std::vector<double> acc(static_cast<size_t>(s.out), 0.0);  // (OUT), rows added in order
  for (int i = 0; i < s.n; ++i) {
    const float* row = dy + int64_t(i) * s.out;
    for (int o = 0; o < s.out; ++o) acc[static_cast<size_t>(o)] += row[o];
  }
  for (int o = 0; o < s.out; ++o) db[o] = static_cast<float>(db[o] + acc[static_cast<size_t>(o)]);
}

}  // namespace cnn
