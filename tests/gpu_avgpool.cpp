// Average-pool CUDA kernels against the CPU reference: padding 0/1/2, stride != kernel,
// non-square, batch 1, C = 3/17, odd sizes; NaN-poisoned outputs; the gather backward bitwise
// repeatable; global average pooling on planes of 1 to 4096 values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "kernels/pool/avgpool.h"
#include "runtime/memory.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

AvgPoolShape make_shape(int n, int c, int h, int w, int kh, int kw, int sh, int sw, int ph,
                        int pw) {
  AvgPoolShape s;
  s.n = n, s.c = c, s.h = h, s.w = w;
  s.kh = kh, s.kw = kw;
  s.stride_h = sh, s.stride_w = sw;
  s.pad_h = ph, s.pad_w = pw;
  return s;
}

void check_avgpool(const AvgPoolShape& s) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message()
               << "seed " << seed << " shape (" << s.n << ", " << s.c << ", " << s.h << ", " << s.w
               << ") k " << s.kh << "x" << s.kw << " stride " << s.stride_h << "x" << s.stride_w
               << " pad " << s.pad_h << "x" << s.pad_w);
  const size_t nx = size_t(s.n) * s.c * s.h * s.w, ny = size_t(s.n) * s.c * s.oh() * s.ow();
  const std::vector<float> x = test::random_vector(nx, seed),
                           dy = test::random_vector(ny, seed + 1);
  std::vector<float> y_ref(ny), dx_ref(nx);
  avgpool_forward_cpu(s, x.data(), y_ref.data());
  avgpool_backward_cpu(s, dy.data(), dx_ref.data());
  Exec ex;
  ex.device = Device::CUDA;
  Tensor d_x = test::to_device(x), d_dy = test::to_device(dy);
  Buffer<float> d_y(ny, Device::CUDA), d_dx(nx, Device::CUDA);
  test::poison_device(d_y.data(), ny);
  test::poison_device(d_dx.data(), nx);
  avgpool_forward(s, d_x.data(), d_y.data(), ex);
  avgpool_backward(s, d_dy.data(), d_dx.data(), ex);
  const std::vector<float> y = test::to_host(d_y.data(), ny), dx = test::to_host(d_dx.data(), nx);
  EXPECT_FALSE(test::any_nan(y));
  EXPECT_FALSE(test::any_nan(dx));
  // A window's float sum in another order than the CPU twin's: ~1e-5 on near-zero averages.
  EXPECT_LT(test::max_rel_error(y, y_ref), 1e-4);
  EXPECT_LT(test::max_rel_error(dx, dx_ref), 1e-4);
  test::poison_device(d_dx.data(), nx);
  avgpool_backward(s, d_dy.data(), d_dx.data(), ex);
  EXPECT_EQ(test::to_host(d_dx.data(), nx), dx);  // gather: fixed order, same bits
}

}  // namespace

TEST(GpuAvgPool, MatchesCpuOnAwkwardShapes) {
  CNN_REQUIRE_GPU();
  check_avgpool(make_shape(1, 3, 7, 7, 2, 2, 2, 2, 0, 0));
  check_avgpool(make_shape(2, 17, 9, 11, 3, 3, 2, 2, 1, 1));
  check_avgpool(make_shape(1, 3, 8, 5, 5, 5, 1, 1, 2, 2));
  check_avgpool(make_shape(3, 5, 13, 6, 3, 2, 1, 2, 1, 0));
  check_avgpool(make_shape(1, 1, 1, 1, 1, 1, 1, 1, 0, 0));
  check_avgpool(make_shape(128, 16, 14, 14, 2, 2, 2, 2, 0, 0));
  check_avgpool(make_shape(4, 7, 33, 17, 4, 3, 3, 2, 2, 1));
}

TEST(GpuGlobalAvgPool, MatchesCpu) {
  CNN_REQUIRE_GPU();
  for (const auto& [planes, plane] : std::vector<std::pair<int64_t, int64_t>>{
           {1, 1}, {3, 49}, {17, 7 * 7}, {2, 4096}, {128 * 64, 8 * 8}, {5, 31 * 33}}) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed) + " planes " + std::to_string(planes) + " x " +
                 std::to_string(plane));
    const size_t nx = size_t(planes * plane), ny = size_t(planes);
    const std::vector<float> x = test::random_vector(nx, seed),
                             dy = test::random_vector(ny, seed + 1);
    std::vector<float> y_ref(ny), dx_ref(nx);
    global_avgpool_forward_cpu(planes, plane, x.data(), y_ref.data());
    global_avgpool_backward_cpu(planes, plane, dy.data(), dx_ref.data());
    Exec ex;
    ex.device = Device::CUDA;
    Tensor d_x = test::to_device(x), d_dy = test::to_device(dy);
    Buffer<float> d_y(ny, Device::CUDA), d_dx(nx, Device::CUDA);
    test::poison_device(d_y.data(), ny);
    test::poison_device(d_dx.data(), nx);
    global_avgpool_forward(planes, plane, d_x.data(), d_y.data(), ex);
    global_avgpool_backward(planes, plane, d_dy.data(), d_dx.data(), ex);
    const std::vector<float> y = test::to_host(d_y.data(), ny);
    // A mean of `plane` values summed in another order: each sum is off by at most
    // (plane - 1) 2^-24 sum |x| (one rounding per add), the CPU's and the GPU's alike, so each
    // mean by 2^-24 sum |x|, plus the division's rounding. A dropped or doubled element is off by
    // |x_i| / plane, far above that. Relative to the mean itself the error is unbounded where the
    // values cancel (the H200 saw 1.1e-5 once on 8192 planes of 64), so the bound is per plane.
    int64_t over = 0;
    for (int64_t p = 0; p < planes; ++p) {
      double sum_abs = 0;
      for (int64_t i = 0; i < plane; ++i) sum_abs += std::fabs(x[size_t(p * plane + i)]);
      const double bound =
          std::ldexp(1.0, -23) * (sum_abs + 2 * std::fabs(y_ref[size_t(p)])) + 1e-30;
      if (!(std::fabs(double(y[size_t(p)]) - y_ref[size_t(p)]) <= bound)) ++over;
    }
    EXPECT_EQ(over, 0) << "planes whose mean is off by more than the summation bound";
    EXPECT_LT(test::max_rel_error(test::to_host(d_dx.data(), nx), dx_ref), 1e-6);
    global_avgpool_forward(planes, plane, d_x.data(), d_y.data(), ex);
    EXPECT_EQ(test::to_host(d_y.data(), ny), y);  // fixed shuffle order: same bits
  }
}
