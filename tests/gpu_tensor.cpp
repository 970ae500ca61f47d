#include <gtest/gtest.h>

#include "runtime/tensor.h"
#include "tests/test_util.h"

using namespace cnn;

TEST(GpuTensor, RoundTripThroughDevice) {
  CNN_REQUIRE_GPU();
  auto v = test::random_vector(1001, test::fresh_seed());
  Tensor h = Tensor::from_host({1001}, v, Device::CPU);
  Tensor d = h.to(Device::CUDA);
  EXPECT_EQ(d.device(), Device::CUDA);
  EXPECT_EQ(d.to_vector(), v);
  Tensor z = Tensor::zeros({1001}, Device::CUDA);
  for (float x : z.to_vector()) EXPECT_EQ(x, 0.f);
}
