// The fast convolution kernels against the CPU references of kernels/conv2d.h:
//   implicit GEMM (conv2d_igemm.h): forward, input gradient, weight gradient; FP32 (FFMA and, for
//   the forward and input gradient, 3xTF32 too: Fp32Math) and TF32;
//   single input channel (conv2d_1ch.h): forward and weight gradient.
// Awkward shapes (batch 1/3/129/257, channels 1..40, kernels 1/3/5/7 and non-square, stride 1/2/3
// and non-square, padding 0..4, odd images) and the reference network's conv1/conv2 at batch 128.
// Weight gradients accumulate onto random dw/db, atomically and deterministically; the
// deterministic ones must repeat bitwise. The implicit-GEMM weight gradient runs both variants
// (IgemmVariant::Generic and ::Dedicated: OH*OW % 4 == 0 takes its 16-byte dy path, other shapes
// and a misaligned dy its 4-byte path, KH*KW > 32 its fallback to Generic). The input gradient runs
// both variants too (Dedicated: TF32, stride 1, KH*KW <= 25, its shared-memory limit; 16-byte
// weight copies when C*KH*KW % 4 == 0 and w is aligned, else 4-byte; everything else falls back).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "runtime/exec.h"
#include "runtime/memory.h"
#include "tests/conv_test_cases.h"
#include "tests/gemm_error_measure.h"
#include "tests/test_util.h"
#ifdef CNN_HAVE_CUDA
#include "kernels/conv/conv2d_1ch.h"
#include "kernels/conv/conv2d_igemm.h"
#include "kernels/conv/conv2d_igemm_dgrad.h"
#endif

using namespace cnn;
using conv_test::conv;
using conv_test::describe_shape;
using test::rel_to_max;
using test::tolerance;
using test::typical;

namespace {

#ifdef CNN_HAVE_CUDA

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Inputs and CPU reference results of one shape.
struct Refs {
  std::vector<float> x, w, b, dy, dw0, db0;  // inputs; dw0/db0: gradients accumulated onto
  std::vector<float> y;                      // forward with bias, relu as given
  std::vector<float> y_plain;                // forward without bias or relu (empty: not checked)
  std::vector<float> dx;                     // input gradient (empty: not checked)
  std::vector<float> dw, db;                 // dw0 + gradient, db0 + gradient
};

Refs make_refs(const Conv2dShape& s, uint64_t seed, bool relu, bool plain, bool dgrad) {
  const size_t nx = static_cast<size_t>(s.n) * s.c * s.h * s.w;
  const size_t ny = static_cast<size_t>(s.n) * s.oc * s.oh() * s.ow();
  const size_t nw = static_cast<size_t>(s.oc) * s.c * s.kh * s.kw;
  Refs r;
  r.x = test::random_vector(nx, seed);
  r.w = test::random_vector(nw, seed + 1);
  r.b = test::random_vector(s.oc, seed + 2);
  r.dy = test::random_vector(ny, seed + 3);
  r.dw0 = test::random_vector(nw, seed + 4);
  r.db0 = test::random_vector(s.oc, seed + 5);
  r.y.resize(ny);
  conv2d_forward_cpu(s, r.x.data(), r.w.data(), r.b.data(), r.y.data(), relu);
  if (plain) {
    r.y_plain.resize(ny);
    conv2d_forward_cpu(s, r.x.data(), r.w.data(), nullptr, r.y_plain.data(), false);
  }
  if (dgrad) {
    r.dx.resize(nx);
    conv2d_backward_data_cpu(s, r.dy.data(), r.w.data(), r.dx.data());
  }
  r.dw = r.dw0;
  r.db = r.db0;
  conv2d_backward_weight_cpu(s, r.x.data(), r.dy.data(), r.dw.data(), r.db.data());
  return r;
}

enum class Impl { Igemm, OneCh };

Exec exec_of(Precision p, bool deterministic) {
  Exec ex;
  ex.device = Device::CUDA;
  ex.precision = p;
  ex.deterministic = deterministic;
  return ex;
}

std::vector<float> gpu_forward(Impl impl, const Conv2dShape& s, const Refs& r, bool bias, bool relu,
                               const Exec& ex, Fp32Math fp32 = Fp32Math::Ffma) {
  Tensor d_x = test::to_device(r.x), d_w = test::to_device(r.w), d_b = test::to_device(r.b);
  Tensor d_y({static_cast<int64_t>(r.y.size())}, Device::CUDA);
  test::poison_device(d_y.data(), r.y.size());
  const float* b = bias ? d_b.data() : nullptr;
  if (impl == Impl::Igemm)
    conv2d_forward_igemm_cuda(s, d_x.data(), d_w.data(), b, d_y.data(), relu, ex, Bf16Tiles::Auto,
                              fp32);
  else
    conv2d_forward_1ch_cuda(s, d_x.data(), d_w.data(), b, d_y.data(), relu, ex);
  return d_y.to_vector();
}

// w_shift > 0 places w that many floats past a 16-byte boundary (the dedicated input gradient must
// take its 4-byte weight copies then).
std::vector<float> gpu_backward_data(const Conv2dShape& s, const Refs& r, const Exec& ex,
                                     IgemmVariant variant = IgemmVariant::Auto, int w_shift = 0,
                                     Fp32Math fp32 = Fp32Math::Ffma) {
  std::vector<float> w_host(r.w.size() + static_cast<size_t>(w_shift), 0.f);
  std::copy(r.w.begin(), r.w.end(), w_host.begin() + w_shift);
  Tensor d_dy = test::to_device(r.dy), d_w = test::to_device(w_host);
  Tensor d_dx({static_cast<int64_t>(r.x.size())}, Device::CUDA);
  test::poison_device(d_dx.data(), r.x.size());
  conv2d_backward_data_igemm_cuda(s, d_dy.data(), d_w.data() + w_shift, d_dx.data(), ex, variant,
                                  Bf16Tiles::Auto, DgradStrided::Auto, fp32);
  return d_dx.to_vector();
}

// dw0/db0 accumulated on the device; db is skipped (null) when !with_db. dy_shift > 0 places dy
// that many floats past a 16-byte boundary (the dedicated kernel must take its 4-byte path then).
void gpu_backward_weight(Impl impl, IgemmVariant variant, const Conv2dShape& s, const Refs& r,
                         bool with_db, const Exec& ex, std::vector<float>& dw,
                         std::vector<float>& db, int dy_shift = 0) {
  std::vector<float> dy_host(r.dy.size() + static_cast<size_t>(dy_shift), 0.f);
  std::copy(r.dy.begin(), r.dy.end(), dy_host.begin() + dy_shift);
  Tensor d_x = test::to_device(r.x), d_dy = test::to_device(dy_host);
  const float* dyp = d_dy.data() + dy_shift;
  Tensor d_dw = test::to_device(r.dw0), d_db = test::to_device(r.db0);
  const size_t scratch_floats = impl == Impl::Igemm
                                    ? conv2d_backward_weight_igemm_scratch_floats(s, ex)
                                    : conv2d_backward_weight_1ch_scratch_floats(s, ex);
  Tensor d_scratch({static_cast<int64_t>(std::max<size_t>(1, scratch_floats))}, Device::CUDA);
  test::poison_device(d_scratch.data(), std::max<size_t>(1, scratch_floats));
  float* scratch = scratch_floats ? d_scratch.data() : nullptr;
  float* dbp = with_db ? d_db.data() : nullptr;
  if (impl == Impl::Igemm)
    conv2d_backward_weight_igemm_cuda(s, d_x.data(), dyp, d_dw.data(), dbp, scratch, ex, variant);
  else
    conv2d_backward_weight_1ch_cuda(s, d_x.data(), dyp, d_dw.data(), dbp, scratch, ex);
  dw = d_dw.to_vector();
  db = d_db.to_vector();
}

const char* variant_name(IgemmVariant v) {
  return v == IgemmVariant::Generic     ? "generic"
         : v == IgemmVariant::Dedicated ? "dedicated"
                                        : "auto";
}

// The input gradient of one shape and precision with both variants (Dedicated twice: its in-block
// sum of the two K halves has a fixed order, so the runs must agree bitwise). Returns the worse
// error for the log line.
double check_dgrad(const Conv2dShape& s, const Refs& r, Precision prec, int w_shift = 0) {
  const int64_t k_dgrad = int64_t{s.oc} * s.kh * s.kw;
  const Exec ex = exec_of(prec, false);
  const bool v2_kernel = conv2d_dgrad_dedicated_supported(s, ex);
  double worst = 0;
  for (IgemmVariant variant : {IgemmVariant::Generic, IgemmVariant::Dedicated}) {
    SCOPED_TRACE(
        std::string("input gradient variant ") + variant_name(variant) +
        (variant == IgemmVariant::Dedicated && !v2_kernel ? " (falls back to generic)" : "") +
        " w_shift=" + std::to_string(w_shift));
    const std::vector<float> dx = gpu_backward_data(s, r, ex, variant, w_shift);
    const double e = rel_to_max(dx, r.dx, typical(k_dgrad));
    EXPECT_LE(e, tolerance(prec, k_dgrad)) << "backward_data";
    worst = std::max(worst, e);
    if (variant == IgemmVariant::Dedicated) {
      EXPECT_TRUE(bitwise_equal(dx, gpu_backward_data(s, r, ex, variant, w_shift)))
          << "input gradient differs between two runs";
    }
  }
  return worst;
}

// The weight-gradient checks of one shape, variant and precision: atomic, deterministic (twice,
// bitwise equal), deterministic without db. Returns the errors for the log line.
struct WgradErrors {
  double dw = 0, db = 0, dw_det = 0, db_det = 0;
};
WgradErrors check_wgrad(Impl impl, IgemmVariant variant, const Conv2dShape& s, const Refs& r,
                        Precision prec, int dy_shift = 0) {
  SCOPED_TRACE(std::string("weight gradient variant ") + variant_name(variant) +
               " dy_shift=" + std::to_string(dy_shift));
  const int64_t k_wgrad = int64_t{s.n} * s.oh() * s.ow();
  const Exec ex = exec_of(prec, false), ex_det = exec_of(prec, true);
  WgradErrors e;
  std::vector<float> dw, db, dw_det, db_det, dw_det2, db_det2;
  gpu_backward_weight(impl, variant, s, r, true, ex, dw, db, dy_shift);
  e.dw = rel_to_max(dw, r.dw, typical(k_wgrad));
  e.db = rel_to_max(db, r.db, typical(k_wgrad));
  EXPECT_LE(e.dw, tolerance(prec, k_wgrad)) << "backward_weight dw (atomic)";
  EXPECT_LE(e.db, tolerance(prec, k_wgrad)) << "backward_weight db (atomic)";

  gpu_backward_weight(impl, variant, s, r, true, ex_det, dw_det, db_det, dy_shift);
  gpu_backward_weight(impl, variant, s, r, true, ex_det, dw_det2, db_det2, dy_shift);
  e.dw_det = rel_to_max(dw_det, r.dw, typical(k_wgrad));
  e.db_det = rel_to_max(db_det, r.db, typical(k_wgrad));
  EXPECT_LE(e.dw_det, tolerance(prec, k_wgrad)) << "backward_weight dw (deterministic)";
  EXPECT_LE(e.db_det, tolerance(prec, k_wgrad)) << "backward_weight db (deterministic)";
  EXPECT_TRUE(bitwise_equal(dw_det, dw_det2) && bitwise_equal(db_det, db_det2))
      << "deterministic weight gradient differs between two runs";

  // Without db: dw unchanged in meaning, db left alone.
  std::vector<float> dw_nodb, db_nodb;
  gpu_backward_weight(impl, variant, s, r, false, ex_det, dw_nodb, db_nodb, dy_shift);
  EXPECT_LE(rel_to_max(dw_nodb, r.dw, typical(k_wgrad)), tolerance(prec, k_wgrad))
      << "backward_weight without db";
  EXPECT_TRUE(bitwise_equal(db_nodb, r.db0)) << "db was written although null";
  std::vector<float> dw_nodb_atomic, db_nodb_atomic;
  gpu_backward_weight(impl, variant, s, r, false, ex, dw_nodb_atomic, db_nodb_atomic, dy_shift);
  EXPECT_LE(rel_to_max(dw_nodb_atomic, r.dw, typical(k_wgrad)), tolerance(prec, k_wgrad))
      << "backward_weight without db (atomic)";
  EXPECT_TRUE(bitwise_equal(db_nodb_atomic, r.db0)) << "db was written although null (atomic)";
  return e;
}

// Every check of one shape for one implementation and precision.
void check_shape(Impl impl, const Conv2dShape& s, const Refs& r, bool relu, Precision prec) {
  const int64_t k_fwd = int64_t{s.c} * s.kh * s.kw;
  const Exec ex = exec_of(prec, false);

  const double e_y = rel_to_max(gpu_forward(impl, s, r, true, relu, ex), r.y, typical(k_fwd));
  EXPECT_LE(e_y, tolerance(prec, k_fwd)) << "forward (bias, relu=" << relu << ")";
  double e_plain = 0, e_dx = 0;
  if (!r.y_plain.empty()) {
    e_plain = rel_to_max(gpu_forward(impl, s, r, false, false, ex), r.y_plain, typical(k_fwd));
    EXPECT_LE(e_plain, tolerance(prec, k_fwd)) << "forward (no bias)";
  }
  if (impl == Impl::Igemm && !r.dx.empty()) e_dx = check_dgrad(s, r, prec);
  // FP32 as 3xTF32 (algo fast / auto): held to the FFMA tolerance.
  if (impl == Impl::Igemm && prec == Precision::FP32) {
    SCOPED_TRACE("3xTF32");
    EXPECT_LE(rel_to_max(gpu_forward(impl, s, r, true, relu, ex, Fp32Math::Tf32x3), r.y,
                         typical(k_fwd)),
              tolerance(prec, k_fwd))
        << "forward (bias, relu=" << relu << ")";
    if (!r.dx.empty()) {
      const int64_t k_dgrad = int64_t{s.oc} * s.kh * s.kw;
      const std::vector<float> dx =
          gpu_backward_data(s, r, ex, IgemmVariant::Generic, 0, Fp32Math::Tf32x3);
      EXPECT_LE(rel_to_max(dx, r.dx, typical(k_dgrad)), tolerance(prec, k_dgrad))
          << "backward_data";
    }
  }

  const std::vector<IgemmVariant> variants =
      impl == Impl::Igemm
          ? std::vector<IgemmVariant>{IgemmVariant::Generic, IgemmVariant::Dedicated}
          : std::vector<IgemmVariant>{IgemmVariant::Auto};
  for (IgemmVariant variant : variants) {
    const WgradErrors w = check_wgrad(impl, variant, s, r, prec);
    std::printf("%-5s %-4s %s: rel err y %.2g%s dx %.2g | %s dw %.2g db %.2g (det %.2g %.2g)\n",
                impl == Impl::Igemm ? "igemm" : "1ch", precision_name(prec),
                describe_shape(s).c_str(), e_y,
                r.y_plain.empty() ? "" : (" plain " + std::to_string(e_plain)).c_str(), e_dx,
                impl == Impl::Igemm ? variant_name(variant) : "", w.dw, w.db, w.dw_det, w.db_det);
  }
}

void run_shapes(Impl impl, const std::vector<Conv2dShape>& shapes, bool big) {
  int which = 0;
  for (const Conv2dShape& s : shapes) {
    ASSERT_TRUE(s.oh() >= 1 && s.ow() >= 1) << describe_shape(s);
    const uint64_t seed = test::fresh_seed();
    const bool relu = (which++ % 2) == 0 || big;
    SCOPED_TRACE(describe_shape(s) + " seed=" + std::to_string(seed));
    const Refs r = make_refs(s, seed, relu, /*plain=*/!big, /*dgrad=*/impl == Impl::Igemm);
    if (impl == Impl::Igemm) {
      for (Precision prec : {Precision::FP32, Precision::TF32}) {
        SCOPED_TRACE(precision_name(prec));
        check_shape(impl, s, r, relu, prec);
      }
    } else {
      check_shape(impl, s, r, relu, Precision::FP32);
    }
  }
}

#endif  // CNN_HAVE_CUDA

}  // namespace

TEST(GpuConv2dFast, IgemmAwkwardShapes) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  run_shapes(Impl::Igemm,
             {
                 conv(1, 1, 5, 5, 1, 1, 1, 1, 1, 0, 0),       // all ones
                 conv(3, 3, 7, 9, 5, 3, 3, 1, 1, 1, 1),       // batch 3, odd image
                 conv(2, 3, 11, 8, 7, 3, 5, 2, 2, 2, 1),      // non-square kernel, stride 2
                 conv(2, 4, 9, 10, 6, 3, 3, 2, 2, 1, 1),      // stride 2, pad 1
                 conv(2, 5, 6, 7, 3, 1, 1, 1, 1, 0, 0),       // 1x1 kernel
                 conv(2, 3, 9, 12, 4, 3, 3, 1, 2, 1, 0),      // non-square stride and pad
                 conv(129, 3, 10, 10, 32, 5, 5, 1, 1, 2, 2),  // batch 129
                 conv(3, 32, 14, 14, 64, 5, 5, 1, 1, 2, 2),   // conv2 at batch 3
                 conv(2, 40, 6, 5, 33, 3, 3, 1, 1, 1, 1),     // c > 32, oc = 33
                 conv(1, 1, 28, 28, 32, 5, 5, 1, 1, 2, 2),    // conv1 through the GEMM path
                 conv(4, 2, 5, 5, 3, 5, 5, 1, 1, 0, 0),       // kernel = image: 1x1 output
                 conv(2, 3, 4, 4, 2, 3, 3, 3, 3, 4, 4),       // pad > kernel, stride 3
             },
             false);
#endif
}

TEST(GpuConv2dFast, IgemmNetworkConv2Batch128) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  run_shapes(Impl::Igemm, {conv(test::network_batch(), 32, 14, 14, 64, 5, 5, 1, 1, 2, 2)}, true);
#endif
}

// Shapes aimed at the weight-gradient variants: batch 257, C = 7, odd images, OH*OW % 4 != 0
// (dedicated's 4-byte dy path) and == 0 (16-byte path), partial row / column tiles, the db column
// in a second column tile, stride 2, padding 0/1/2, a 7x7 kernel (49 taps: dedicated falls back to
// Generic) and a K range whose last split ends inside a k-tile.
TEST(GpuConv2dFast, IgemmWgradVariantsAwkwardShapes) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  run_shapes(Impl::Igemm,
             {
                 conv(257, 7, 9, 7, 12, 3, 3, 1, 1, 1, 1),   // OHW 63: 4-byte dy, C*9+1 = 64
                 conv(3, 7, 8, 8, 5, 5, 5, 1, 1, 2, 2),      // OHW 64: 16-byte dy, odd C
                 conv(257, 3, 6, 6, 16, 3, 3, 2, 2, 1, 1),   // stride 2, OHW 9
                 conv(1, 32, 14, 14, 64, 5, 5, 2, 2, 2, 2),  // batch 1, stride 2, OHW 49
                 conv(2, 4, 6, 6, 70, 3, 3, 1, 1, 1, 1),     // OC 70: two row tiles, OHW 36
                 conv(3, 3, 11, 13, 9, 5, 5, 1, 1, 0, 0),    // pad 0, OHW 63
                 conv(5, 32, 12, 12, 64, 5, 5, 1, 1, 2, 2),  // 801 columns, OHW 144
                 conv(2, 3, 10, 10, 4, 7, 7, 1, 1, 3, 3),    // 49 taps: Generic fallback
                 conv(257, 1, 5, 4, 3, 1, 1, 1, 1, 0, 0),    // 1x1, OHW 20, many splits
                 conv(3, 64, 6, 6, 10, 3, 3, 1, 1, 1, 1),  // C*9 = 576: 9 column tiles, 10 with db
             },
             false);
#endif
}

// dy 4 bytes past a 16-byte boundary: the dedicated kernel must not use its 16-byte copies.
TEST(GpuConv2dFast, IgemmWgradMisalignedDy) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  for (const Conv2dShape& s :
       {conv(3, 32, 14, 14, 64, 5, 5, 1, 1, 2, 2), conv(2, 5, 8, 8, 7, 3, 3, 1, 1, 1, 1)}) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(describe_shape(s) + " seed=" + std::to_string(seed));
    const Refs r = make_refs(s, seed, false, false, false);
    for (Precision prec : {Precision::FP32, Precision::TF32}) {
      SCOPED_TRACE(precision_name(prec));
      for (IgemmVariant v : {IgemmVariant::Generic, IgemmVariant::Dedicated})
        check_wgrad(Impl::Igemm, v, s, r, prec, 1);
    }
  }
#endif
}

// Generic and Dedicated agree with each other on the network's conv2 at batch 128 (both are also
// checked against the reference in IgemmNetworkConv2Batch128), atomic and deterministic.
TEST(GpuConv2dFast, IgemmWgradVariantsAgreeConv2) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  const Conv2dShape s = conv(test::network_batch(), 32, 14, 14, 64, 5, 5, 1, 1, 2, 2);
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  const Refs r = make_refs(s, seed, false, false, false);
  const int64_t k = int64_t{s.n} * s.oh() * s.ow();
  for (Precision prec : {Precision::FP32, Precision::TF32})
    for (bool det : {false, true}) {
      SCOPED_TRACE(std::string(precision_name(prec)) + (det ? " deterministic" : " atomic"));
      std::vector<float> dw_l, db_l, dw_v, db_v;
      gpu_backward_weight(Impl::Igemm, IgemmVariant::Generic, s, r, true, exec_of(prec, det), dw_l,
                          db_l);
      gpu_backward_weight(Impl::Igemm, IgemmVariant::Dedicated, s, r, true, exec_of(prec, det),
                          dw_v, db_v);
      EXPECT_LE(rel_to_max(dw_v, dw_l, typical(k)), 2 * tolerance(prec, k));
      EXPECT_LE(rel_to_max(db_v, db_l, typical(k)), 2 * tolerance(prec, k));
    }
#endif
}

// Shapes aimed at the input-gradient variants (each against the CPU with Generic and Dedicated,
// FP32 and TF32; FP32 runs Generic either way): batch 1/3/257, C 3/7/32/40, odd images, kernels
// 1/3/5 and non-square, padding 0/1/2, stride 2 and 7x7 (fallbacks), OC not a multiple of the
// 8-channel chunk, images smaller than the 64-pixel tile (a tile spans many images), a wide image
// whose slab exceeds the shared-memory limit (fallback), C*KH*KW % 4 != 0 (4-byte weight copies).
TEST(GpuConv2dFast, IgemmDgradVariantsAwkwardShapes) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  const std::vector<Conv2dShape> shapes = {
      conv(1, 3, 7, 9, 5, 3, 3, 1, 1, 1, 1),      // batch 1, C 3, OC 5 (partial chunk)
      conv(3, 7, 9, 11, 12, 5, 5, 1, 1, 2, 2),    // C 7: C*25 % 4 != 0 -> 4-byte weights
      conv(257, 7, 5, 3, 9, 3, 3, 1, 1, 1, 1),    // batch 257, 15-pixel images, OC 9
      conv(3, 32, 14, 14, 64, 5, 5, 1, 1, 2, 2),  // conv2 at batch 3
      conv(2, 32, 13, 15, 16, 1, 1, 1, 1, 0, 0),  // 1x1, pad 0
      conv(3, 40, 6, 5, 33, 3, 3, 1, 1, 0, 0),    // C 40: two column tiles, pad 0
      conv(2, 3, 11, 8, 7, 5, 3, 1, 1, 2, 1),     // non-square kernel (runtime KHW path)
      conv(3, 5, 3, 3, 4, 3, 3, 1, 1, 2, 2),      // 9-pixel images, pad 2 > needed
      conv(2, 4, 9, 10, 6, 3, 3, 2, 2, 1, 1),     // stride 2: fallback
      conv(2, 3, 10, 10, 4, 7, 7, 1, 1, 3, 3),    // 49 taps: fallback
      conv(1, 4, 6, 200, 8, 5, 5, 1, 1, 2, 2),    // slab over the limit: fallback
      conv(2, 8, 7, 7, 16, 5, 5, 1, 1, 0, 0),     // pad 0, OH = 3
  };
  for (const Conv2dShape& s : shapes) {
    ASSERT_TRUE(s.oh() >= 1 && s.ow() >= 1) << describe_shape(s);
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(describe_shape(s) + " seed=" + std::to_string(seed));
    const Refs r = make_refs(s, seed, false, false, true);
    for (Precision prec : {Precision::FP32, Precision::TF32}) {
      SCOPED_TRACE(precision_name(prec));
      const double e = check_dgrad(s, r, prec);
      std::printf("dgrad %-4s %s: rel err dx %.2g (dedicated kernel: %s)\n", precision_name(prec),
                  describe_shape(s).c_str(), e,
                  conv2d_dgrad_dedicated_supported(s, exec_of(prec, false)) ? "yes" : "no");
    }
  }
  // The dispatch is what the shapes above claim: conv2 runs the new kernel in TF32 only.
  const Conv2dShape conv2 = conv(test::network_batch(), 32, 14, 14, 64, 5, 5, 1, 1, 2, 2);
  EXPECT_TRUE(conv2d_dgrad_dedicated_supported(conv2, exec_of(Precision::TF32, false)));
  EXPECT_FALSE(conv2d_dgrad_dedicated_supported(conv2, exec_of(Precision::FP32, false)));
  EXPECT_FALSE(conv2d_dgrad_dedicated_supported(shapes[8], exec_of(Precision::TF32, false)));
  EXPECT_FALSE(conv2d_dgrad_dedicated_supported(shapes[9], exec_of(Precision::TF32, false)));
  EXPECT_FALSE(conv2d_dgrad_dedicated_supported(shapes[10], exec_of(Precision::TF32, false)));
#endif
}

// w 4 bytes past a 16-byte boundary: the dedicated input gradient must not use its 16-byte copies.
TEST(GpuConv2dFast, IgemmDgradMisalignedW) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  for (const Conv2dShape& s :
       {conv(3, 32, 14, 14, 64, 5, 5, 1, 1, 2, 2), conv(2, 4, 8, 8, 7, 3, 3, 1, 1, 1, 1)}) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(describe_shape(s) + " seed=" + std::to_string(seed));
    const Refs r = make_refs(s, seed, false, false, true);
    for (Precision prec : {Precision::FP32, Precision::TF32}) {
      SCOPED_TRACE(precision_name(prec));
      check_dgrad(s, r, prec, 1);
    }
  }
#endif
}

// Generic and Dedicated input gradients agree on the network's conv2 at batch 128 (both are also
// checked against the reference in IgemmNetworkConv2Batch128).
TEST(GpuConv2dFast, IgemmDgradVariantsAgreeConv2) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  const Conv2dShape s = conv(test::network_batch(), 32, 14, 14, 64, 5, 5, 1, 1, 2, 2);
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  const Refs r = make_refs(s, seed, false, false, false);
  const int64_t k = int64_t{s.oc} * s.kh * s.kw;
  for (Precision prec : {Precision::FP32, Precision::TF32}) {
    SCOPED_TRACE(precision_name(prec));
    const Exec ex = exec_of(prec, false);
    const std::vector<float> dx_l = gpu_backward_data(s, r, ex, IgemmVariant::Generic);
    const std::vector<float> dx_v = gpu_backward_data(s, r, ex, IgemmVariant::Dedicated);
    EXPECT_LE(rel_to_max(dx_v, dx_l, typical(k)), 2 * tolerance(prec, k));
  }
#endif
}

// `algo: igemm` names the generic implicit-GEMM gradients and `fast` the dedicated ones where they
// take the shape (conv2d.cpp, igemm_variant), and at FP32 igemm multiplies on FFMA where fast
// runs 3xTF32 (igemm_fp32_math), so that autotune weighs both: the public entry points must give
// the bits of the variant and math the algo names. The network's conv2 in TF32 is a shape both
// dedicated kernels take, whose sums run in another order than the generic ones'.
TEST(GpuConv2dFast, AlgoNamesTheIgemmVariant) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  for (const Conv2dShape& s :
       {conv(8, 32, 14, 14, 64, 5, 5, 1, 1, 2, 2), conv(3, 5, 9, 7, 6, 3, 3, 1, 1, 1, 1)}) {
    SCOPED_TRACE(describe_shape(s));
    const Refs r = make_refs(s, seed, false, false, false);
    Tensor d_x = test::to_device(r.x), d_dy = test::to_device(r.dy), d_w = test::to_device(r.w);
    for (Precision prec : {Precision::TF32, Precision::FP32}) {
      SCOPED_TRACE(precision_name(prec));
      const Exec ex = exec_of(prec, /*deterministic=*/true);  // fixed-order weight gradients
      const size_t scratch_floats =
          std::max<size_t>(1, conv2d_backward_weight_scratch_floats(s, ex));
      Tensor d_scratch({int64_t(scratch_floats)}, Device::CUDA);
      for (const auto& [algo, variant] : {std::pair{Algo::Igemm, IgemmVariant::Generic},
                                          std::pair{Algo::Fast, IgemmVariant::Auto}}) {
        SCOPED_TRACE(std::string("algo ") + algo_name(algo));
        Tensor d_dx({int64_t(r.x.size())}, Device::CUDA);
        conv2d_backward_data(s, d_dy.data(), d_w.data(), d_dx.data(), nullptr, algo, ex);
        const Fp32Math fp32 = algo == Algo::Igemm ? Fp32Math::Ffma : Fp32Math::Tf32x3;
        EXPECT_TRUE(
            bitwise_equal(d_dx.to_vector(), gpu_backward_data(s, r, ex, variant, 0, fp32)))
            << "input gradient";
        Tensor d_dw = test::to_device(r.dw0), d_db = test::to_device(r.db0);
        conv2d_backward_weight(s, d_x.data(), d_dy.data(), d_dw.data(), d_db.data(),
                               d_scratch.data(), algo, ex);
        std::vector<float> dw, db;
        gpu_backward_weight(Impl::Igemm, variant, s, r, true, ex, dw, db);
        EXPECT_TRUE(bitwise_equal(d_dw.to_vector(), dw)) << "weight gradient";
        EXPECT_TRUE(bitwise_equal(d_db.to_vector(), db)) << "bias gradient";
      }
    }
  }
#endif
}

TEST(GpuConv2dFast, SingleChannelAwkwardShapes) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  run_shapes(Impl::OneCh,
             {
                 conv(3, 1, 7, 9, 5, 3, 3, 1, 1, 1, 1),       // fast 3x3
                 conv(2, 1, 13, 6, 9, 5, 5, 1, 1, 0, 0),      // output width 2
                 conv(1, 1, 30, 70, 3, 5, 5, 1, 1, 2, 2),     // width 70 (not 4k), oc 3
                 conv(2, 1, 8, 300, 4, 3, 3, 1, 1, 1, 1),     // two column tiles
                 conv(2, 1, 9, 9, 3, 3, 3, 2, 2, 1, 1),       // stride 2: direct kernels
                 conv(2, 1, 10, 10, 4, 4, 2, 1, 1, 1, 0),     // non-square kernel: direct
                 conv(1, 1, 5, 5, 1, 5, 5, 1, 1, 4, 4),       // pad 4: mostly padding
                 conv(5, 1, 40, 40, 33, 5, 5, 1, 1, 0, 0),    // oc 33, two row tiles
                 conv(129, 1, 28, 28, 32, 5, 5, 1, 1, 2, 2),  // batch 129: partial image chunk
             },
             false);
#endif
}

TEST(GpuConv2dFast, SingleChannelNetworkConv1Batch128) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  run_shapes(Impl::OneCh, {conv(test::network_batch(), 1, 28, 28, 32, 5, 5, 1, 1, 2, 2)}, true);
#endif
}
