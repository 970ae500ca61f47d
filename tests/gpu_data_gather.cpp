// The CUDA gather against the CPU reference: bitwise equal batches and labels.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "data/gather.h"
#include "data/normalize.h"
#include "runtime/memory.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

// Gathers `idx` on the GPU (into NaN-poisoned buffers) and on the CPU; expects identical bits.
void compare(const Dataset& d, const GatherParams& p, const std::vector<int32_t>& idx) {
  const size_t sz = size_t(d.image_size()), b = idx.size();
  DeviceDataset dev(d, Device::CUDA);
  Buffer<int32_t> d_idx(b, Device::CUDA);  // (B)
  d_idx.copy_from(idx.data(), Device::CPU, b);
  Buffer<float> d_x(b * sz, Device::CUDA);  // (B, C, H, W)
  Buffer<int32_t> d_y(b, Device::CUDA);     // (B)
  test::poison_device(d_x.data(), d_x.size());
  std::vector<int32_t> minus(b, -7);
  d_y.copy_from(minus.data(), Device::CPU, b);
  dev.gather(p, d_idx.data(), int(b), d_x.data(), d_y.data());
  stream_sync(Device::CUDA, nullptr);
  std::vector<float> gx = test::to_host(d_x.data(), b * sz);
  std::vector<int32_t> gy(b);
  raw_copy(gy.data(), Device::CPU, d_y.data(), Device::CUDA, b * sizeof(int32_t));

  std::vector<float> cx(b * sz, std::numeric_limits<float>::quiet_NaN());
  std::vector<int32_t> cy(b, -7);
  gather_batch_cpu(p, d.images.data(), d.labels.data(), d.n, idx.data(), int(b), cx.data(),
                   cy.data());
  EXPECT_FALSE(test::any_nan(gx));
  size_t mismatches = 0;
  for (size_t i = 0; i < gx.size(); ++i) {
    uint32_t a, c;
    std::memcpy(&a, &gx[i], 4);
    std::memcpy(&c, &cx[i], 4);
    mismatches += a != c;
  }
  std::printf(
      "gather %zux%dx%dx%d shift %d flip %d: worst relative error %.3g, %zu bit mismatches\n", b,
      d.c, d.h, d.w, p.shift, int(p.flip), test::max_rel_error(gx, cx), mismatches);
  EXPECT_EQ(mismatches, 0u);
  EXPECT_EQ(gy, cy);
}

}  // namespace

TEST(GpuDataGather, MatchesCpuBitwise) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  struct Case {
    int n, c, h, w, batch, shift;
    bool flip;
  };
  for (const Case& k : {Case{37, 3, 13, 11, 29, 3, true}, Case{100, 1, 28, 28, 1, 0, false},
                        Case{1000, 1, 28, 28, 777, 4, true}, Case{5, 3, 33, 47, 64, 2, false},
                        Case{9, 4, 7, 5, 9, 0, true}}) {
    SCOPED_TRACE(::testing::Message() << "n " << k.n << " c " << k.c << " " << k.h << "x" << k.w);
    Dataset d = test::random_dataset(k.n, k.c, k.h, k.w, 10, seed + k.n);
    auto m = test::random_vector(k.c, seed + 1, 0.05f, 0.7f);
    auto s = test::random_vector(k.c, seed + 2, 0.1f, 0.6f);
    AugmentOptions aug{k.shift, k.flip};
    GatherParams p = make_gather_params(k.c, k.h, k.w, Normalization{m, s}, &aug, seed, 3);
    auto idx = test::random_labels(k.batch, k.n, seed + 3);  // repeats allowed
    compare(d, p, idx);
    p.mirror = true;  // evaluation's test-time flip, on top of the drawn flips
    compare(d, p, idx);
  }
}

TEST(GpuDataGather, EpochFromDeviceMemory) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Dataset d = test::random_dataset(50, 1, 12, 12, 4, seed);
  AugmentOptions aug{3, true};
  GatherParams p = make_gather_params(1, 12, 12, Normalization{{0.3f}, {0.2f}}, &aug, seed, 0);
  auto idx = test::random_labels(40, 50, seed + 1);
  const int64_t epoch = 9;
  Buffer<int64_t> d_epoch(1, Device::CUDA);
  d_epoch.copy_from(&epoch, Device::CPU, 1);
  DeviceDataset dev(d, Device::CUDA);
  Buffer<int32_t> d_idx(40, Device::CUDA);
  d_idx.copy_from(idx.data(), Device::CPU, 40);
  Buffer<float> d_x(40 * 144, Device::CUDA);
  Buffer<int32_t> d_y(40, Device::CUDA);
  test::poison_device(d_x.data(), d_x.size());
  GatherParams q = p;
  q.epoch_ptr = d_epoch.data();
  dev.gather(q, d_idx.data(), 40, d_x.data(), d_y.data());
  stream_sync(Device::CUDA, nullptr);
  std::vector<float> cx(40 * 144);
  std::vector<int32_t> cy(40);
  GatherParams r = p;
  r.epoch = 9;
  gather_batch_cpu(r, d.images.data(), d.labels.data(), 50, idx.data(), 40, cx.data(), cy.data());
  auto gx = test::to_host(d_x.data(), 40 * 144);
  EXPECT_EQ(std::memcmp(gx.data(), cx.data(), gx.size() * sizeof(float)), 0);
}

TEST(GpuDataGather, OutOfRangeIndexPoisonsTheSample) {
  CNN_REQUIRE_GPU();
  Dataset d = test::random_dataset(6, 1, 4, 4, 2, test::fresh_seed());
  GatherParams p = make_gather_params(1, 4, 4, Normalization{{0.f}, {1.f}}, nullptr, 1);
  DeviceDataset dev(d, Device::CUDA);
  std::vector<int32_t> idx = {1, 6, -1};
  Buffer<int32_t> d_idx(3, Device::CUDA);
  d_idx.copy_from(idx.data(), Device::CPU, 3);
  Buffer<float> d_x(3 * 16, Device::CUDA);
  Buffer<int32_t> d_y(3, Device::CUDA);
  d_x.zero();
  dev.gather(p, d_idx.data(), 3, d_x.data(), d_y.data());
  stream_sync(Device::CUDA, nullptr);
  auto x = test::to_host(d_x.data(), 48);
  std::vector<int32_t> y(3);
  raw_copy(y.data(), Device::CPU, d_y.data(), Device::CUDA, 3 * sizeof(int32_t));
  EXPECT_EQ(y[0], d.labels[1]);
  EXPECT_EQ(y[1], -1);
  EXPECT_EQ(y[2], -1);
  EXPECT_FALSE(std::isnan(x[0]));
  for (int i = 16; i < 48; ++i) EXPECT_TRUE(std::isnan(x[i]));
}
