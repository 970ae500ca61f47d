#pragma once
// The TF32 check the wgmma convolution tests share (gpu_conv_wgmma.cpp, gpu_conv_wgmma_nhwc.cpp;
// the weight gradient's gpu_conv_wgmma_wgrad.cpp uses its bound): a pass's FP32 CPU references
// and the tolerance against the size of the terms, as gpu_gemm_wgmma.cpp derives it. Per element
//   |got - ref| <= 2 (2^-9 + K 2^-23) sum |x w| + 4 ulp (|ref| + m),
// with K the GEMM depth, sum |x w| the same pass on the absolute values and m the magnitude the
// caller adds (1, or the accumulated-into value); and
//   ||got - ref|| <= 4e-3 sqrt(sum (x w)^2),
// the scale of the terms (catches a dropped k-tile, which the per-element bound could let through).
// The 3xTF32 instance (FP32 precision on the tensor cores) gets the same check with 2^-20 for
// 2^-9 (its operands' split parts lose about 2^-22 of each product, three such terms) and a
// Frobenius limit of 3e-5 (TF32's own errors, ~3e-4, fail it): expect_close_3xtf32.
// bitwise_equal serves every test that compares two runs' bits.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "tests/conv_test_cases.h"

namespace cnn::conv_test {

// The relative Frobenius error the TF32 tests allow, and the 3xTF32 ones.
constexpr double kTf32Frobenius = 4e-3;
constexpr double k3xTf32Frobenius = 3e-5;

// The per-element TF32 bound for a GEMM depth k (see the file comment); `product`: the relative
// error of one product, 2^-9 for TF32 operands, 2^-20 for 3xTF32.
class Tf32Bound {
 public:
  explicit Tf32Bound(double k, double product = std::ldexp(1.0, -9))
      : rel_(2 * (product + k * std::ldexp(1.0, -23))) {}
  // sum_abs: the sum of |terms|; magnitude: |ref| plus what the caller adds.
  double operator()(double sum_abs, double magnitude) const {
    return rel_ * sum_abs + kUlp4 * magnitude + 1e-30;
  }

 private:
  static constexpr double kUlp4 = 4.0 / (1 << 24);  // 4 ulp of FP32 at 1
  double rel_;
};

// One case's inputs and FP32 CPU references: ref, the same pass on |inputs| (for the
// per-element bound) and on squared inputs (for the Frobenius scale).
struct Tf32Problem {
  Pass pass;
  ConvCase cc;
  Fill fill;
  uint64_t seed;
  std::vector<float> in, w, b;  // in: x (forward) or dy (input gradient)
  std::vector<float> ref, absref, sqref;
  int64_t k = 0;  // GEMM depth
  std::string what;
};

inline Tf32Problem make_tf32_problem(Pass pass, const ConvCase& cc, Fill fill, uint64_t seed) {
  const Conv2dShape& s = cc.s;
  Tf32Problem p{pass, cc, fill, seed, {}, {}, {}, {}, {}, {}, 0, {}};
  ConvOperands ops = make_operands(pass, s, fill, seed);
  p.in = std::move(ops.in);
  p.w = std::move(ops.w);
  p.b = std::move(ops.b);
  auto map = [](const std::vector<float>& v, bool square) {
    std::vector<float> r(v.size());
    std::transform(v.begin(), v.end(), r.begin(),
                   [square](float x) { return square ? x * x : std::fabs(x); });
    return r;
  };
  const bool fwd = pass == Pass::Forward;
  const size_t nout = fwd ? size_t(s.n) * s.oc * s.oh() * s.ow() : size_t(s.n) * s.c * s.h * s.w;
  p.ref.resize(nout);
  p.absref.resize(nout);
  p.sqref.resize(nout);
  if (fwd) {
    conv2d_forward_cpu(s, p.in.data(), p.w.data(), cc.bias ? p.b.data() : nullptr, p.ref.data(),
                       cc.relu);
    conv2d_forward_cpu(s, map(p.in, false).data(), map(p.w, false).data(), nullptr, p.absref.data(),
                       false);
    conv2d_forward_cpu(s, map(p.in, true).data(), map(p.w, true).data(), nullptr, p.sqref.data(),
                       false);
  } else {
    conv2d_backward_data_cpu(s, p.in.data(), p.w.data(), p.ref.data());
    conv2d_backward_data_cpu(s, map(p.in, false).data(), map(p.w, false).data(), p.absref.data());
    conv2d_backward_data_cpu(s, map(p.in, true).data(), map(p.w, true).data(), p.sqref.data());
  }
  p.k = gemm_depth(pass, s);
  p.what = describe_problem(pass, cc, fill, seed);
  return p;
}

// Checks got against the problem's references (see the file comment; small integers must come
// out exact) with one product's relative error `product` and the Frobenius limit `frobenius`;
// prints one summary line.
inline void expect_close_products(const Tf32Problem& p, const std::vector<float>& got,
                                  const std::string& how, double product, double frobenius) {
  SCOPED_TRACE(p.what + " " + how);
  ASSERT_EQ(got.size(), p.ref.size());
  const Tf32Bound bound(double(p.k), product);
  int64_t bad = 0, wrong = 0;
  std::string first;
  double diff2 = 0, scale2 = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double ref = p.ref[i], g = got[i];
    const double e = std::fabs(g - ref);
    if (!(e <= bound(p.absref[i], std::fabs(ref) + 1))) ++bad;
    if (!(g == ref)) {
      if (wrong == 0) {
        char where[120];
        std::snprintf(where, sizeof where, "out[%zu]: got %.9g, expected %.9g", i, g, ref);
        first = where;
      }
      ++wrong;
    }
    diff2 += std::isnan(g) ? INFINITY : e * e;
    scale2 += p.sqref[i];
  }
  const double frob = scale2 > 0 ? std::sqrt(diff2 / scale2) : std::sqrt(diff2);
  std::printf("%s %s: %lld inexact, %lld over the bound, rel %.3g%s%s\n", p.what.c_str(),
              how.c_str(), static_cast<long long>(wrong), static_cast<long long>(bad), frob,
              wrong ? ", first " : "", first.c_str());
  EXPECT_EQ(bad, 0) << "first differing element " << first;
  EXPECT_LE(frob, frobenius) << "relative Frobenius error";
  if (p.fill == Fill::SmallInt) {
    EXPECT_EQ(wrong, 0) << "small-integer inputs are exact in TF32; " << first;
  }
}

inline void expect_close_tf32(const Tf32Problem& p, const std::vector<float>& got,
                              const std::string& how) {
  expect_close_products(p, got, how, std::ldexp(1.0, -9), kTf32Frobenius);
}
inline void expect_close_3xtf32(const Tf32Problem& p, const std::vector<float>& got,
                                const std::string& how) {
  expect_close_products(p, got, how, std::ldexp(1.0, -20), k3xTf32Frobenius);
}

inline bool bitwise_equal(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

}  // namespace cnn::conv_test
