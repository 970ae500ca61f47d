// Fully connected dispatch: checks the shape once, picks the variant, then runs the CPU
// reference or the CUDA launcher.
#include "kernels/gemm/linear.h"

#include <algorithm>
#include <cstdint>

#include "kernels/gemm/gemm_cuda.h"
#include "kernels/gemm/linear_cpu_fast.h"
#include "kernels/gemm/linear_cuda.h"
#include "runtime/dispatch.h"
#include "runtime/error.h"

namespace cnn {
namespace {

// True for the tiled GEMM, false for the naive one (naive and tiled are linear.cu's kernels).
bool use_tiled(Algo algo) {
  return algo != Algo::Naive;
}

// fast / auto / igemm: the register-tiled FP32 or TF32 tensor-core GEMM of gemm_cuda.cu.
[[maybe_unused]] bool use_gemm_cuda(Algo algo) {
  return algo != Algo::Naive && algo != Algo::Tiled;
}

// How FP32 multiplies in gemm_cuda: igemm keeps FFMA, fast and auto take 3xTF32 where gemm_cuda
// has it (the wgmma kernel), so autotune weighs the two per pass, as for the convolutions.
[[maybe_unused]] Fp32Math fp32_math(Algo algo) {
  return algo == Algo::Igemm ? Fp32Math::Ffma : Fp32Math::Tf32x3;
}

// wgmma names the Hopper convolution kernels; the linear layer's GEMM picks its own path
// (CNN_GEMM_PATH), so it refuses the name instead of running another variant under it.
void check_algo(const char* op, Algo algo) {
  CNN_CHECK(algo != Algo::Wgmma && algo != Algo::WgmmaNhwc,
            "{}: algo {} is for convolutions; expected naive, tiled, igemm, fast or auto", op,
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

namespace {

// Floats of GEMM workspace an (m, n, k) pass can use on ex's device.
std::size_t gemm_work_floats([[maybe_unused]] int m, [[maybe_unused]] int n, [[maybe_unused]] int k,
                             const Exec& ex) {
  if (ex.device == Device::CPU) return 0;
  return CNN_CUDA_VALUE(gemm_cuda_work_floats(m, n, k, ex.precision), std::size_t(0));
}

// The db scratch's floats rounded up to 4, where the GEMM workspace starts (16-byte aligned).
std::size_t db_scratch_floats([[maybe_unused]] const LinearShape& s, const Exec& ex) {
  if (ex.device == Device::CPU || !ex.deterministic) return 0;
  return CNN_CUDA_VALUE((linear_db_scratch_floats(s) + 3) / 4 * 4, std::size_t(0));
}

// The most workspace a pass whose GEMM has the batch as its m (n, k fixed) takes at any batch up
// to s.n: a layer sized at setup also runs smaller batches, whose fewer tile rows may take more
// split groups (128 rows in one tile and 16 groups can outweigh 129 rows in two tiles and 8). The
// workspace is groups x m, so the largest is at a tile boundary or at s.n itself.
std::size_t batch_m_work_floats(const LinearShape& s, int n, int k, const Exec& ex) {
  std::size_t most = 0;
  for (int m = kGemmWorkRowStep; m < s.n; m += kGemmWorkRowStep)
    most = std::max(most, gemm_work_floats(m, n, k, ex));
  return std::max(most, gemm_work_floats(s.n, n, k, ex));
}

}  // namespace

std::size_t linear_forward_scratch_floats(const LinearShape& s, const Exec& ex) {
  check_linear_shape(s);
  return batch_m_work_floats(s, s.out, s.in, ex);
}

std::size_t linear_backward_data_scratch_floats(const LinearShape& s, const Exec& ex) {
  check_linear_shape(s);
  return batch_m_work_floats(s, s.in, s.out, ex);
}

void linear_forward(const LinearShape& s, const float* x, const float* w, const float* b, float* y,
                    bool relu, Algo algo, const Exec& ex, float* scratch,
                    std::size_t scratch_floats) {
  check_linear_shape(s);
  CNN_CHECK(x && w && y, "linear_forward: x, w and y must not be null");
  check_algo("linear_forward", algo);
  const bool tiled = use_tiled(algo);
  if (ex.device == Device::CPU) {
    if (algo == Algo::Naive) return linear_forward_cpu(s, x, w, b, y, relu);
    return linear_forward_cpu_fast(s, x, w, b, y, relu);
  }
  CNN_CUDA_BRANCH("linear_forward", {
    if (use_gemm_cuda(algo))
      return gemm_cuda(false, true, s.n, s.out, s.in, 1.f, x, s.in, w, s.in, 0.f, y, s.out, b, relu,
                       ex.precision, ex.stream, fp32_math(algo),
                       GemmWorkspace{scratch, scratch ? scratch_floats : 0});
    linear_forward_cuda(s, x, w, b, y, relu, tiled, ex.stream);
  });
}

void linear_backward_data(const LinearShape& s, const float* dy, const float* w, float* dx,
                          Algo algo, const Exec& ex, float* scratch, std::size_t scratch_floats) {
  check_linear_shape(s);
  CNN_CHECK(dy && w && dx, "linear_backward_data: dy, w and dx must not be null");
  check_algo("linear_backward_data", algo);
  const bool tiled = use_tiled(algo);
  if (ex.device == Device::CPU) {
    if (algo == Algo::Naive) return linear_backward_data_cpu(s, dy, w, dx);
    return linear_backward_data_cpu_fast(s, dy, w, dx);
  }
  CNN_CUDA_BRANCH("linear_backward_data", {
    if (use_gemm_cuda(algo))
      return gemm_cuda(false, false, s.n, s.in, s.out, 1.f, dy, s.out, w, s.in, 0.f, dx, s.in,
                       nullptr, false, ex.precision, ex.stream, fp32_math(algo),
                       GemmWorkspace{scratch, scratch ? scratch_floats : 0});
    linear_backward_data_cuda(s, dy, w, dx, tiled, ex.stream);
  });
}

std::size_t linear_backward_weight_scratch_floats(const LinearShape& s, const Exec& ex) {
  check_linear_shape(s);
  const std::size_t work = gemm_work_floats(s.out, s.in, s.n, ex);
  return work > 0 ? db_scratch_floats(s, ex) + work : db_scratch_floats(s, ex);
}

void linear_backward_weight(const LinearShape& s, const float* x, const float* dy, float* dw,
                            float* db, float* scratch, Algo algo, const Exec& ex, bool overwrite_dw,
                            std::size_t scratch_floats) {
  check_linear_shape(s);
  CNN_CHECK(x && dy && dw, "linear_backward_weight: x, dy and dw must not be null");
  check_algo("linear_backward_weight", algo);
  CNN_CHECK(!db || scratch || db_scratch_floats(s, ex) == 0,
            "linear_backward_weight: deterministic mode needs a scratch buffer of {} floats",
            linear_backward_weight_scratch_floats(s, ex));
  const bool tiled = use_tiled(algo);
  if (ex.device == Device::CPU) {
    if (algo == Algo::Naive) return linear_backward_weight_cpu(s, x, dy, dw, db, overwrite_dw);
    return linear_backward_weight_cpu_fast(s, x, dy, dw, db, overwrite_dw);
  }
  CNN_CUDA_BRANCH("linear_backward_weight", {
    if (use_gemm_cuda(algo)) {
      // gemm_cuda has no atomics on any path (split-K sums in a cluster, then one epilogue), so
      // beta = 0 writes every dw element once without reading it.
      const std::size_t work_at = db_scratch_floats(s, ex);
      const std::size_t work_floats =
          scratch && scratch_floats > work_at ? scratch_floats - work_at : 0;
      gemm_cuda(true, false, s.out, s.in, s.n, 1.f, dy, s.out, x, s.in, overwrite_dw ? 0.f : 1.f,
                dw, s.in, nullptr, false, ex.precision, ex.stream, fp32_math(algo),
                GemmWorkspace{work_floats > 0 ? scratch + work_at : nullptr, work_floats});
      if (db) linear_bias_grad_cuda(s, dy, db, scratch, ex.deterministic, ex.stream);
      return;
    }
    linear_backward_weight_cuda(s, x, dy, dw, db, scratch, tiled, ex.deterministic, overwrite_dw,
                                ex.stream);
  });
}

}  // namespace cnn
