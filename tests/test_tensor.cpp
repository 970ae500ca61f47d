#include <gtest/gtest.h>

#include "runtime/error.h"
#include "runtime/exec.h"
#include "runtime/tensor.h"
#include "tests/test_util.h"

using namespace cnn;

TEST(Tensor, ShapeAndNumel) {
  Tensor t({2, 3, 4, 5}, Device::CPU);
  EXPECT_EQ(t.numel(), 120);
  EXPECT_EQ(shape_str(t.shape()), "(2, 3, 4, 5)");
  t.reshape({6, 20});
  EXPECT_EQ(t.dim(1), 20);
  EXPECT_THROW(t.reshape({7, 20}), Error);
}

TEST(Tensor, HostRoundTripAndMove) {
  auto v = test::random_vector(37, test::fresh_seed());
  Tensor t = Tensor::from_host({37}, v, Device::CPU);
  Tensor moved = std::move(t);
  EXPECT_TRUE(t.empty());
  EXPECT_EQ(moved.to_vector(), v);
  Tensor copy = moved.to(Device::CPU);
  copy.data()[0] += 1.f;
  EXPECT_NE(copy.to_vector()[0], moved.to_vector()[0]);  // explicit copies do not alias
}

TEST(Tensor, ZerosAndFill) {
  Tensor z = Tensor::zeros({3, 3}, Device::CPU);
  for (float x : z.to_vector()) EXPECT_EQ(x, 0.f);
  z.fill(2.5f);
  for (float x : z.to_vector()) EXPECT_EQ(x, 2.5f);
}

TEST(Device, ResolveNames) {
  EXPECT_EQ(resolve_device("cpu"), Device::CPU);
  EXPECT_THROW(resolve_device("tpu"), Error);
  Device d = resolve_device("auto");
  EXPECT_EQ(d == Device::CUDA, cuda_available());
  if (!cuda_available()) {
    EXPECT_THROW(resolve_device("cuda"), Error);
  }
}

TEST(Device, NoGpuIsReportedNotCrashed) {
  std::string why;
  bool ok = cuda_available(&why);
  if (!ok) {
    EXPECT_NE(why.find("CUDA"), std::string::npos) << why;
  }
}

TEST(Exec, AlgoNames) {
  EXPECT_EQ(parse_algo("tiled"), Algo::Tiled);
  EXPECT_EQ(parse_algo("wgmma"), Algo::Wgmma);
  EXPECT_STREQ(algo_name(Algo::Wgmma), "wgmma");
  EXPECT_EQ(parse_algo("wgmma-nhwc"), Algo::WgmmaNhwc);
  EXPECT_STREQ(algo_name(Algo::WgmmaNhwc), "wgmma-nhwc");
  EXPECT_THROW(parse_algo("fastest"), Error);
  EXPECT_EQ(parse_precision("tf32"), Precision::TF32);
}
