// Average pooling's CPU reference: torch's values (count_include_pad=True), the backward as the
// forward's adjoint, and global average pooling.
#include <gtest/gtest.h>

#include <vector>

#include "kernels/pool/avgpool.h"
#include "runtime/error.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

AvgPoolShape shape(int n, int c, int h, int w, int k, int stride, int pad) {
  AvgPoolShape s;
  s.n = n, s.c = c, s.h = h, s.w = w;
  s.kh = s.kw = k;
  s.stride_h = s.stride_w = stride;
  s.pad_h = s.pad_w = pad;
  return s;
}

}  // namespace

TEST(AvgPoolCpu, TorchValuesWithPaddingCounted) {
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9};  // (1, 1, 3, 3)
  std::vector<float> y(4);
  avgpool_forward(shape(1, 1, 3, 3, 2, 1, 0), x.data(), y.data(), Exec{});
  EXPECT_EQ(y, (std::vector<float>{3, 4, 6, 7}));
  // torch.nn.AvgPool2d(3, stride=2, padding=1)(torch.arange(1., 10.).view(1, 1, 3, 3)):
  // [[1.3333, 1.7778], [2.6667, 3.1111]] -- the corner window divides 12 by 9, not by 4.
  std::vector<float> y2(4);
  avgpool_forward(shape(1, 1, 3, 3, 3, 2, 1), x.data(), y2.data(), Exec{});
  EXPECT_FLOAT_EQ(y2[0], 12.f / 9);
  EXPECT_FLOAT_EQ(y2[1], 16.f / 9);
  EXPECT_FLOAT_EQ(y2[2], 24.f / 9);
  EXPECT_FLOAT_EQ(y2[3], 28.f / 9);
}

TEST(AvgPoolCpu, BackwardIsTheForwardsAdjoint) {
  // Pooling is linear: <forward(x), dy> == <x, backward(dy)> for every x and dy.
  for (const AvgPoolShape& s : {shape(2, 3, 7, 5, 3, 2, 1), shape(1, 2, 6, 6, 2, 2, 0),
                                shape(2, 1, 5, 9, 3, 1, 1), shape(1, 17, 3, 3, 3, 1, 0)}) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    const size_t nx = size_t(s.n) * s.c * s.h * s.w, ny = size_t(s.n) * s.c * s.oh() * s.ow();
    const std::vector<float> x = test::random_vector(nx, seed),
                             dy = test::random_vector(ny, seed + 1);
    std::vector<float> y(ny), dx(nx);
    avgpool_forward(s, x.data(), y.data(), Exec{});
    avgpool_backward(s, dy.data(), dx.data(), Exec{});
    double a = 0, b = 0;
    for (size_t i = 0; i < ny; ++i) a += double(y[i]) * dy[i];
    for (size_t i = 0; i < nx; ++i) b += double(x[i]) * dx[i];
    EXPECT_NEAR(a, b, 1e-4 * (1 + std::abs(a)));
  }
}

TEST(AvgPoolCpu, RefusesPaddingBeyondHalfTheWindow) {
  std::vector<float> v(64);
  EXPECT_THROW(avgpool_forward(shape(1, 1, 8, 8, 2, 2, 2), v.data(), v.data(), Exec{}), Error);
  EXPECT_THROW(avgpool_forward(shape(1, 1, 2, 2, 5, 1, 0), v.data(), v.data(), Exec{}), Error);
}

TEST(GlobalAvgPoolCpu, MeanOfEachPlaneAndEvenSpreadBack) {
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, -6, 0};  // 2 planes of 4... as (2, 4)
  std::vector<float> y(2), dx(8);
  global_avgpool_forward(2, 4, x.data(), y.data(), Exec{});
  EXPECT_EQ(y, (std::vector<float>{2.5f, 1.25f}));
  const std::vector<float> dy = {4.f, -2.f};
  global_avgpool_backward(2, 4, dy.data(), dx.data(), Exec{});
  EXPECT_EQ(dx, (std::vector<float>{1, 1, 1, 1, -0.5f, -0.5f, -0.5f, -0.5f}));
  EXPECT_THROW(global_avgpool_forward(0, 4, x.data(), y.data(), Exec{}), Error);
}
