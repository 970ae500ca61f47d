#pragma once
// The checks the grouped and dilated convolution tests on the dense kernels share
// (test_conv2d_{grouped,dilated}_dense.cpp, gpu_conv2d_{grouped,dilated}_dense.cpp): one random
// problem and its double references (with the same passes on |values| for the bound), the bound
// of a pass at a precision, and the CPU composition's tolerance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_grouped.h"
#include "kernels/conv/conv2d_grouped_dense.h"
#include "runtime/exec.h"
#include "tests/test_util.h"

namespace cnn::grouped_test {

// A k x k grouped convolution (dilation 1) and a dilated one (one group, stride 1).
inline Conv2dGroupedShape grouped_shape(int n, int c, int h, int w, int oc, int k, int stride,
                                        int pad, int groups) {
  Conv2dGroupedShape s;
  s.n = n, s.c = c, s.h = h, s.w = w, s.oc = oc, s.kh = s.kw = k;
  s.stride_h = s.stride_w = stride, s.pad_h = s.pad_w = pad, s.groups = groups;
  return s;
}
inline Conv2dGroupedShape dilated_shape(int n, int c, int h, int w, int oc, int k, int pad_h,
                                        int pad_w, int dil_h, int dil_w) {
  Conv2dGroupedShape s;
  s.n = n, s.c = c, s.h = h, s.w = w, s.oc = oc, s.kh = s.kw = k;
  s.pad_h = pad_h, s.pad_w = pad_w, s.dil_h = dil_h, s.dil_w = dil_w;
  return s;
}

// Random x, w, b, dy and the dw0 / db0 a weight gradient accumulates onto, and the double
// references: y (no bias, no ReLU), dx, dw0 + dw, db0 + db, each also on |values|.
struct Problem {
  std::vector<float> x, w, b, dy, dw0, db0;
  std::vector<double> y, y_abs, dx, dx_abs, dw, dw_abs, db, db_abs;
};

inline std::vector<double> widen(const std::vector<float>& v, bool absolute) {
  std::vector<double> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = absolute ? std::fabs(double(v[i])) : double(v[i]);
  return r;
}

inline Problem make_problem(const Conv2dGroupedShape& s) {
  const size_t nx = size_t(s.n) * s.c * s.h * s.w, ny = size_t(s.n) * s.oc * s.oh() * s.ow();
  const size_t nw = size_t(s.oc) * s.cg() * s.kh * s.kw;
  Problem p;
  p.x = test::random_vector(nx, 21), p.w = test::random_vector(nw, 22);
  p.b = test::random_vector(s.oc, 23), p.dy = test::random_vector(ny, 24);
  p.dw0 = test::random_vector(nw, 25), p.db0 = test::random_vector(s.oc, 26);
  p.y.resize(ny), p.y_abs.resize(ny), p.dx.resize(nx), p.dx_abs.resize(nx);
  p.dw.resize(nw), p.dw_abs.resize(nw), p.db.resize(s.oc), p.db_abs.resize(s.oc);
  for (bool a : {false, true}) {
    const std::vector<double> x = widen(p.x, a), w = widen(p.w, a), b = widen(p.b, a),
                              dy = widen(p.dy, a);
    conv2d_grouped_forward_cpu(s, x.data(), w.data(), b.data(), (a ? p.y_abs : p.y).data(), false);
    conv2d_grouped_backward_data_cpu(s, dy.data(), w.data(), (a ? p.dx_abs : p.dx).data());
    conv2d_grouped_backward_weight_cpu(s, x.data(), dy.data(), (a ? p.dw_abs : p.dw).data(),
                                       (a ? p.db_abs : p.db).data());
  }
  for (size_t i = 0; i < nw; ++i) p.dw[i] += p.dw0[i], p.dw_abs[i] += std::fabs(p.dw0[i]);
  for (int i = 0; i < s.oc; ++i) p.db[i] += p.db0[i], p.db_abs[i] += std::fabs(p.db0[i]);
  return p;
}

// Per element |got - ref| <= 2 (u + K 2^-23) sum|terms| + 1e-6 (|ref| + 1), u the error of one
// product: 2^-20 at FP32 (3xTF32 or FFMA), 2^-9 TF32, 2^-8 BF16 (both operands rounded); K the
// reduction depth.
inline void expect_within(const std::vector<float>& got, const std::vector<double>& ref,
                          const std::vector<double>& abs_terms, double depth, Precision p,
                          const std::string& what) {
  const double u = p == Precision::BF16   ? std::ldexp(1.0, -8)
                   : p == Precision::TF32 ? std::ldexp(1.0, -9)
                                          : std::ldexp(1.0, -20);
  const double rel = 2 * (u + depth * std::ldexp(1.0, -23));
  ASSERT_EQ(got.size(), ref.size()) << what;
  size_t bad = 0, first = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    if (!(std::fabs(double(got[i]) - ref[i]) <=
          rel * abs_terms[i] + 1e-6 * (std::fabs(ref[i]) + 1)))
      if (bad++ == 0) first = i;
  EXPECT_EQ(bad, 0u) << what << ": first at " << first << " got " << got[first] << " want "
                     << ref[first];
}

// The CPU's float composition against the float reference loops.
inline void expect_near_all(const std::vector<float>& got, const std::vector<float>& ref,
                            const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (size_t i = 0; i < ref.size(); ++i)
    ASSERT_NEAR(got[i], ref[i], 1e-4 * (1 + std::fabs(ref[i]))) << what << " at " << i;
}

// The host predicates on an extended shape s (dilated or grouped, stride 1, a shape wgmma-nhwc
// takes) at FP32, TF32 and BF16: wgmma-nhwc runs every pass directly (the weight gradient on a
// CUDA build, deterministic mode too), no other variant does, and the grouped op's scratch is the
// dense op's on the shape itself.
inline void expect_every_pass_runs_directly(const Conv2dGroupedShape& s) {
  const Conv2dShape d = conv2d_grouped_as_dense(s);
  Exec ex;
  ex.device = Device::CUDA;
  for (Precision p : {Precision::FP32, Precision::TF32, Precision::BF16}) {
    ex.precision = p;
    SCOPED_TRACE(precision_name(p));
    EXPECT_TRUE(conv2d_forward_runs_directly(d, Algo::WgmmaNhwc, ex));
    EXPECT_TRUE(conv2d_backward_data_runs_directly(d, Algo::WgmmaNhwc, ex));
    for (bool deterministic : {false, true}) {
      ex.deterministic = deterministic;
      EXPECT_EQ(conv2d_backward_weight_runs_directly(d, Algo::WgmmaNhwc, ex), test::kCudaBuild);
    }
    ex.deterministic = false;
    for (Algo a : {Algo::Igemm, Algo::Wgmma, Algo::Auto, Algo::Fast}) {
      EXPECT_FALSE(conv2d_forward_runs_directly(d, a, ex)) << algo_name(a);
      EXPECT_FALSE(conv2d_backward_weight_runs_directly(d, a, ex)) << algo_name(a);
    }
    EXPECT_EQ(conv2d_grouped_forward_scratch_floats(s, Algo::WgmmaNhwc, ex),
              conv2d_forward_scratch_floats(d, Algo::WgmmaNhwc, ex));
    EXPECT_EQ(conv2d_grouped_backward_data_scratch_floats(s, Algo::WgmmaNhwc, ex),
              conv2d_backward_data_scratch_floats(d, Algo::WgmmaNhwc, ex));
    if (test::kCudaBuild) {
      EXPECT_EQ(conv2d_grouped_backward_weight_scratch_floats(s, Algo::WgmmaNhwc, ex),
                conv2d_backward_weight_scratch_floats(d, ex));
    }
  }
}

}  // namespace cnn::grouped_test
