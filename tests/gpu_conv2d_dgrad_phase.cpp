// The implicit-GEMM input gradient of strided convolutions by phases (DgradStrided::Phases: one
// dense GEMM per phase of the input, conv2d_dgrad_phase.h; up to 4 phases with taps, as at strides
// 2 and 2x1, stacked in one launch, more, as at stride 3, one launch each) against the CPU twin and
// against the division path (DgradStrided::Division), in every precision the generic kernel serves
// (FP32 FFMA and 3xTF32, TF32, BF16 on float and packed tiles). Awkward shapes: strides 2, 3 and
// 2x1, kernels 1, 2, 3, 5, 7 (and, falling back to the division path, 11x11 at stride 2x1: 66 taps
// a phase, and OC * taps beyond 4096), padding 0..3, odd images, channels 1..64, batch 1..3, phases
// without taps (1x1 stride 2 and 3, 2x2 stride 3), ResNet's stride-2 layers at a small batch. dx is
// poisoned first, so a pixel that no phase writes fails; two runs must agree bitwise (no atomics).
//
// Bound per element, S = the twin on |dy|, |w|: |got - ref| <= (e + (k + 8) 2^-23) S, where e is
// the relative error of one product of rounded operands (FP32: 0; TF32, cvt.rna to 11 bits:
// 2^-10, doubled for margin; BF16, 8 bits: 2^-7) and k + 8 counts the FP32 additions of the sum
// and of up to 8 split-K partials. A wrong tap or pixel misses it by orders of magnitude. The
// division path is held to twice the bound against the phases.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "runtime/exec.h"
#include "runtime/memory.h"
#include "tests/conv_test_cases.h"
#include "tests/test_util.h"
#ifdef CNN_HAVE_CUDA
#include "kernels/conv/conv2d_igemm.h"
#endif

using namespace cnn;
using conv_test::conv;
using conv_test::describe_shape;

namespace {

#ifdef CNN_HAVE_CUDA

std::vector<Conv2dShape> strided_cases() {
  return {
      conv(2, 3, 28, 28, 5, 3, 3, 2, 2, 1, 1),     // ResNet-like, small
      conv(1, 1, 7, 7, 1, 1, 1, 2, 2, 0, 0),       // 1x1: 3 of 4 phases without taps
      conv(3, 17, 13, 29, 3, 5, 5, 2, 2, 2, 2),    // odd sizes, 5x5
      conv(1, 3, 29, 13, 17, 7, 7, 3, 3, 3, 3),    // stride 3, 7x7
      conv(2, 1, 13, 7, 3, 2, 2, 2, 2, 0, 1),      // even kernel, unequal padding
      conv(1, 3, 28, 13, 1, 3, 3, 2, 1, 0, 2),     // stride 2x1
      conv(2, 17, 7, 29, 3, 1, 1, 3, 3, 0, 0),     // 1x1 stride 3: 8 of 9 phases without taps
      conv(1, 3, 29, 29, 3, 5, 3, 3, 2, 1, 0),     // non-square kernel and stride
      conv(1, 2, 13, 13, 3, 2, 2, 3, 3, 3, 0),     // 2x2 stride 3: tapless phases, pad 3
      conv(3, 64, 13, 13, 17, 3, 3, 2, 2, 1, 1),   // C = 64: the wide tile
      conv(1, 17, 29, 28, 64, 5, 5, 2, 2, 2, 2),   // OC = 64
      conv(1, 3, 13, 13, 5, 11, 11, 2, 1, 5, 5),   // 66 taps a phase: division path
      conv(1, 3, 13, 13, 300, 7, 7, 2, 2, 3, 3),   // K = 300 * 16 > 4096: division path
      conv(1, 3, 13, 13, 255, 7, 7, 2, 2, 3, 3),   // K = 255 * 16 = 4080: the largest table
      conv(4, 32, 28, 28, 64, 3, 3, 2, 2, 1, 1),   // ResNet conv 32 -> 64, 28 -> 14
      conv(4, 64, 14, 14, 128, 3, 3, 2, 2, 1, 1),  // ResNet conv 64 -> 128, 14 -> 7
      conv(4, 32, 28, 28, 64, 1, 1, 2, 2, 0, 0),   // ResNet shortcut
  };
}

struct Case {
  Precision precision;
  Bf16Tiles tiles;
  Fp32Math fp32;
  const char* name;
};

const Case kCases[] = {
    {Precision::FP32, Bf16Tiles::Auto, Fp32Math::Ffma, "fp32"},
    {Precision::FP32, Bf16Tiles::Auto, Fp32Math::Tf32x3, "fp32 as 3xtf32"},
    {Precision::TF32, Bf16Tiles::Auto, Fp32Math::Ffma, "tf32"},
    {Precision::BF16, Bf16Tiles::Float, Fp32Math::Ffma, "bf16 float tiles"},
    {Precision::BF16, Bf16Tiles::Packed, Fp32Math::Ffma, "bf16 packed tiles"}};

// 3xTF32: big + small hold each operand to about 2^-22 of it and the dropped small * small term
// is about 2^-22 of the product; 2^-20 leaves a margin.
double product_error(const Case& c) {
  return c.precision == Precision::TF32   ? std::ldexp(1.0, -9)
         : c.precision == Precision::BF16 ? std::ldexp(1.0, -7)
         : c.fp32 == Fp32Math::Tf32x3     ? std::ldexp(1.0, -20)
                                          : 0.0;
}

std::vector<float> abs_of(const std::vector<float>& v) {
  std::vector<float> a(v.size());
  for (size_t i = 0; i < v.size(); ++i) a[i] = std::fabs(v[i]);
  return a;
}

std::vector<float> run_dgrad(const Conv2dShape& s, const std::vector<float>& dy,
                             const std::vector<float>& w, const Case& c, DgradStrided strided) {
  Exec ex;
  ex.device = Device::CUDA;
  ex.precision = c.precision;
  Tensor d_dy = test::to_device(dy), d_w = test::to_device(w);
  const size_t nx = static_cast<size_t>(s.n) * s.c * s.h * s.w;
  Tensor d_dx({static_cast<int64_t>(nx)}, Device::CUDA);
  test::poison_device(d_dx.data(), nx);
  conv2d_backward_data_igemm_cuda(s, d_dy.data(), d_w.data(), d_dx.data(), ex,
                                  IgemmVariant::Generic, c.tiles, strided, c.fp32);
  return d_dx.to_vector();
}

// Elements of got outside factor * bound of ref (NaN counts); the first one described in `first`.
int64_t count_outside(const std::vector<float>& got, const std::vector<float>& ref,
                      const std::vector<float>& scale, double e, int64_t k, double factor,
                      std::string& first) {
  const double per_s = factor * (e + static_cast<double>(k + 8) * std::ldexp(1.0, -23));
  int64_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (!(diff <= per_s * scale[i] + 1e-30)) {
      if (bad++ == 0)
        first = "element " + std::to_string(i) + ": got " + std::to_string(got[i]) + ", want " +
                std::to_string(ref[i]) + " (S " + std::to_string(scale[i]) + ")";
    }
  }
  return bad;
}

#endif  // CNN_HAVE_CUDA

}  // namespace

TEST(GpuConvDgradPhase, MatchesTwinAndDivisionPath) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  for (const Conv2dShape& s : strided_cases()) {
    const uint64_t seed = test::fresh_seed();
    const size_t ny = static_cast<size_t>(s.n) * s.oc * s.oh() * s.ow();
    const size_t nw = static_cast<size_t>(s.oc) * s.c * s.kh * s.kw;
    const size_t nx = static_cast<size_t>(s.n) * s.c * s.h * s.w;
    const std::vector<float> dy = test::random_vector(ny, seed),
                             w = test::random_vector(nw, seed + 1);
    std::vector<float> ref(nx), scale(nx);
    conv2d_backward_data_cpu(s, dy.data(), w.data(), ref.data());
    conv2d_backward_data_cpu(s, abs_of(dy).data(), abs_of(w).data(), scale.data());
    const int64_t k = int64_t{s.oc} * s.kh * s.kw;
    for (const Case& c : kCases) {
      SCOPED_TRACE(describe_shape(s) + " " + c.name + " seed " + std::to_string(seed));
      const double e = product_error(c);
      const std::vector<float> phases = run_dgrad(s, dy, w, c, DgradStrided::Phases);
      std::string first;
      EXPECT_EQ(count_outside(phases, ref, scale, e, k, 1.0, first), 0)
          << "phases vs twin: " << first;
      const std::vector<float> division = run_dgrad(s, dy, w, c, DgradStrided::Division);
      EXPECT_EQ(count_outside(division, ref, scale, e, k, 1.0, first), 0)
          << "division vs twin: " << first;
      EXPECT_EQ(count_outside(phases, division, scale, e, k, 2.0, first), 0)
          << "phases vs division: " << first;
      const std::vector<float> again = run_dgrad(s, dy, w, c, DgradStrided::Phases);
      EXPECT_EQ(std::memcmp(phases.data(), again.data(), nx * sizeof(float)), 0)
          << "two runs by phases differ";
    }
  }
#endif
}

// Unit stride has one phase: Phases and Division are the same kernel there, bitwise.
TEST(GpuConvDgradPhase, UnitStrideIgnoresTheChoice) {
  CNN_REQUIRE_GPU();
#ifdef CNN_HAVE_CUDA
  const Conv2dShape s = conv(2, 5, 13, 11, 7, 3, 3, 1, 1, 1, 1);
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const std::vector<float> dy =
      test::random_vector(static_cast<size_t>(s.n) * s.oc * s.oh() * s.ow(), seed);
  const std::vector<float> w =
      test::random_vector(static_cast<size_t>(s.oc) * s.c * s.kh * s.kw, seed + 1);
  for (const Case& c : kCases) {
    const std::vector<float> a = run_dgrad(s, dy, w, c, DgradStrided::Phases);
    const std::vector<float> b = run_dgrad(s, dy, w, c, DgradStrided::Division);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << c.name;
  }
#endif
}
