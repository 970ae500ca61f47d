// Fully connected dispatch: checks the shape once, picks the variant, then runs the CPU
// reference or the CUDA launcher.
#include "kernels/linear.h"

#include <algorithm>
#include <cstdint>

#include "kernels/error.h"
#ifdef CNN_HAVE_CUDA
#include "kernels/linear_cuda.h"
#endif

namespace cnn {
namespace {

// True for the tiled GEMM, false for the naive one; throws for variants linear does not have.
bool use_tiled(Algo algo) {
  switch (algo) {
    case Algo::Naive:
      return false;
    case Algo::Auto:
    case Algo::Tiled:
    case Algo::Fast:
      return true;
    case Algo::Igemm:
      break;
  }
  CNN_FAIL("linear: algorithm '{}' is not available (expected naive, tiled, fast or auto)",
           algo_name(algo));
}

}  // namespace

void check_linear_shape(const LinearShape& s) {
  CNN_CHECK(s.n >= 1 && s.in >= 1 && s.out >= 1,
            "linear: shape (N, IN, OUT) = ({}, {}, {}) must be positive", s.n, s.in, s.out);
  const int64_t biggest =
      std::max({int64_t(s.n) * s.in, int64_t(s.n) * s.out, int64_t(s.out) * s.in});
  CNN_CHECK(
      biggest <= INT32_MAX,
      "linear: shape (N, IN, OUT) = ({}, {}, {}) has a matrix of {} elements (at most 2^31-1)", s.n,
      s.in, s.out, biggest);
}

void linear_forward(const LinearShape& s, const float* x, const float* w, const float* b, float* y,
                    bool relu, Algo algo, const Exec& ex) {
  check_linear_shape(s);
  CNN_CHECK(x && w && y, "linear_forward: x, w and y must not be null");
  const bool tiled = use_tiled(algo);
  if (ex.device == Device::CPU) return linear_forward_cpu(s, x, w, b, y, relu);
#ifdef CNN_HAVE_CUDA
  linear_forward_cuda(s, x, w, b, y, relu, tiled, ex.stream);
#else
  (void)tiled;
  CNN_FAIL("linear_forward on cuda: built without CUDA");
#endif
}

void linear_backward_data(const LinearShape& s, const float* dy, const float* w, float* dx,
                          Algo algo, const Exec& ex) {
  check_linear_shape(s);
  CNN_CHECK(dy && w && dx, "linear_backward_data: dy, w and dx must not be null");
  const bool tiled = use_tiled(algo);
  if (ex.device == Device::CPU) return linear_backward_data_cpu(s, dy, w, dx);
#ifdef CNN_HAVE_CUDA
  linear_backward_data_cuda(s, dy, w, dx, tiled, ex.stream);
#else
  (void)tiled;
  CNN_FAIL("linear_backward_data on cuda: built without CUDA");
#endif
}

std::size_t linear_backward_weight_scratch_floats(const LinearShape& s, const Exec& ex) {
  check_linear_shape(s);
  if (ex.device == Device::CPU || !ex.deterministic) return 0;
#ifdef CNN_HAVE_CUDA
  return linear_db_scratch_floats(s);
#else
  return 0;
#endif
}

void linear_backward_weight(const LinearShape& s, const float* x, const float* dy, float* dw,
                            float* db, float* scratch, Algo algo, const Exec& ex) {
  check_linear_shape(s);
  CNN_CHECK(x && dy && dw, "linear_backward_weight: x, dy and dw must not be null");
  CNN_CHECK(!db || scratch || linear_backward_weight_scratch_floats(s, ex) == 0,
            "linear_backward_weight: deterministic mode needs a scratch buffer of {} floats",
            linear_backward_weight_scratch_floats(s, ex));
  const bool tiled = use_tiled(algo);
  if (ex.device == Device::CPU) return linear_backward_weight_cpu(s, x, dy, dw, db);
#ifdef CNN_HAVE_CUDA
  linear_backward_weight_cuda(s, x, dy, dw, db, scratch, tiled, ex.deterministic, ex.stream);
#else
  (void)scratch;
  (void)tiled;
  CNN_FAIL("linear_backward_weight on cuda: built without CUDA");
#endif
}

}  // namespace cnn
