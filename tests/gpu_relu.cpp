// ReLU CUDA kernels against the CPU reference: sizes not a multiple of 4, aligned and unaligned
// pointers (float4 and scalar paths), in-place use, NaN inputs.
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <vector>

#include "runtime/memory.h"
#include "kernels/pointwise/relu.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

// offset 0: every pointer 16-byte aligned (float4 path); offset 1: the scalar path.
void check_relu(int64_t count, int offset, bool in_place) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " count " << count << " offset " << offset
                                    << (in_place ? " in place" : ""));
  std::vector<float> x = test::random_vector(size_t(count), seed);
  x[size_t(count) / 2] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> dy = test::random_vector(size_t(count), seed + 1);
  std::vector<float> y_ref(x.size()), dx_ref(x.size());
  relu_forward_cpu(count, x.data(), y_ref.data());
  relu_backward_cpu(count, y_ref.data(), dy.data(), dx_ref.data());

  Exec ex;
  ex.device = Device::CUDA;
  Buffer<float> d_x(size_t(count + offset), Device::CUDA);   // (count) at +offset
  Buffer<float> d_y(size_t(count + offset), Device::CUDA);   // (count) at +offset
  Buffer<float> d_dy(size_t(count + offset), Device::CUDA);  // (count) at +offset
  float* px = d_x.data() + offset;
  float* py = in_place ? px : d_y.data() + offset;
  float* pdy = d_dy.data() + offset;
  raw_copy(px, Device::CUDA, x.data(), Device::CPU, x.size() * sizeof(float));
  if (!in_place) test::poison_device(py, x.size());
  relu_forward(count, px, py, ex);
  const std::vector<float> y = test::to_host(py, x.size());

  raw_copy(pdy, Device::CUDA, dy.data(), Device::CPU, dy.size() * sizeof(float));
  float* pdx = in_place ? pdy : d_x.data() + offset;  // dx aliases dy, or overwrites x
  if (!in_place) test::poison_device(pdx, x.size());
  relu_backward(count, py, pdy, pdx, ex);
  const std::vector<float> dx = test::to_host(pdx, x.size());

  const double ey = test::max_rel_error(y, y_ref), edx = test::max_rel_error(dx, dx_ref);
  std::printf("relu count %lld offset %d%s: worst rel error y %.3g dx %.3g\n", (long long)count,
              offset, in_place ? " in place" : "", ey, edx);
  EXPECT_EQ(ey, 0.0);
  EXPECT_EQ(edx, 0.0);
}

}  // namespace

TEST(GpuRelu, MatchesCpuOnAwkwardSizes) {
  CNN_REQUIRE_GPU();
  for (int64_t count : {int64_t(1), int64_t(3), int64_t(4), int64_t(1031), int64_t(4000037)})
    for (int offset : {0, 1})
      for (bool in_place : {false, true}) check_relu(count, offset, in_place);
}
