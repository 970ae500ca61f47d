// The CPU gather (the reference for the GPU kernel) and the normalization statistics.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "data/augment.h"
#include "data/gather.h"
#include "data/normalize.h"
#include "runtime/error.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

Normalization random_norm(int c, uint64_t seed) {
  auto m = test::random_vector(c, seed, 0.1f, 0.6f);
  auto s = test::random_vector(c, seed + 1, 0.2f, 0.5f);
  return {m, s};
}

struct Batch {
  std::vector<float> x;
  std::vector<int32_t> y;
};

Batch gather_cpu(const Dataset& d, const GatherParams& p, const std::vector<int32_t>& idx) {
  Batch b{std::vector<float>(idx.size() * d.image_size(), NAN),
          std::vector<int32_t>(idx.size(), -7)};
  gather_batch_cpu(p, d.images.data(), d.labels.data(), d.n, idx.data(), int(idx.size()),
                   b.x.data(), b.y.data());
  return b;
}

}  // namespace

TEST(DataGather, NoAugmentationIsExactNormalization) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Dataset d = test::random_dataset(23, 3, 7, 9, 5, seed);
  Normalization norm = random_norm(3, seed + 2);
  GatherParams p = make_gather_params(3, 7, 9, norm, nullptr, seed);
  std::vector<int32_t> idx = {22, 0, 5, 5, 13};
  Batch b = gather_cpu(d, p, idx);
  const size_t sz = d.image_size();
  std::vector<float> ref(sz);
  for (size_t j = 0; j < idx.size(); ++j) {
    normalize_image(d.images.data() + idx[j] * sz, 3, 7, 9, norm, ref.data());
    EXPECT_EQ(std::memcmp(ref.data(), b.x.data() + j * sz, sz * sizeof(float)), 0);  // bitwise
    EXPECT_EQ(b.y[j], d.labels[idx[j]]);
    // torchvision's formula, in double, within float rounding.
    for (size_t e = 0; e < sz; ++e) {
      const int k = int(e / (7 * 9));
      const double want = (d.images[idx[j] * sz + e] / 255.0 - norm.mean[k]) / norm.std[k];
      ASSERT_NEAR(b.x[j * sz + e], want, 1e-5);
    }
  }
}

TEST(DataGather, FlipMirrorsOrKeeps) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Dataset d = test::random_dataset(64, 1, 5, 6, 3, seed);
  Normalization norm{{0.f}, {1.f}};
  AugmentOptions aug;
  aug.flip = true;
  GatherParams p = make_gather_params(1, 5, 6, norm, &aug, seed, 3);
  std::vector<int32_t> idx(64);
  for (int i = 0; i < 64; ++i) idx[i] = i;
  Batch b = gather_cpu(d, p, idx);
  int flipped = 0;
  for (int i = 0; i < 64; ++i) {
    const AugmentDraw a = draw_augment(seed, 3, i, 0, true);
    EXPECT_EQ(a.dx, 0);
    flipped += a.flip;
    for (int y = 0; y < 5; ++y)
      for (int x = 0; x < 6; ++x) {
        const int sx = a.flip ? 5 - x : x;
        ASSERT_EQ(b.x[i * 30 + y * 6 + x], d.images[i * 30 + y * 6 + sx] / 255.f);
      }
  }
  EXPECT_GT(flipped, 10);  // about half of 64
  EXPECT_LT(flipped, 54);
}

// Test-time flipping mirrors every sample; on top of a drawn flip it gives the plain image.
TEST(DataGather, MirrorFlipsEverySampleOnTopOfTheDrawnFlip) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Dataset d = test::random_dataset(64, 2, 4, 7, 3, seed);
  Normalization norm{{0.f, 0.f}, {1.f, 1.f}};
  std::vector<int32_t> idx(64);
  for (int i = 0; i < 64; ++i) idx[i] = i;
  for (const bool drawn : {false, true}) {
    AugmentOptions aug;
    aug.flip = drawn;
    GatherParams p = make_gather_params(2, 4, 7, norm, &aug, seed, 5);
    p.mirror = true;
    Batch b = gather_cpu(d, p, idx);
    for (int i = 0; i < 64; ++i) {
      const bool flipped = !draw_augment(seed, 5, i, 0, drawn).flip;
      for (int e = 0; e < 2 * 4 * 7; ++e) {
        const int x = e % 7, rest = e - x;
        const int sx = flipped ? 6 - x : x;
        ASSERT_EQ(b.x[i * 56 + e], d.images[i * 56 + rest + sx] / 255.f)
            << "sample " << i << " drawn flip " << !flipped << " element " << e;
      }
    }
  }
}

TEST(DataGather, ShiftIsPadAndCrop) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const int h = 8, w = 11, shift = 3;
  Dataset d = test::random_dataset(300, 2, h, w, 4, seed);
  for (uint8_t& v : d.images) v = std::max<uint8_t>(v, 1);  // so padding (0) is recognizable
  Normalization norm{{0.f, 0.f}, {1.f, 1.f}};
  AugmentOptions aug;
  aug.shift = shift;
  GatherParams p = make_gather_params(2, h, w, norm, &aug, seed, 0);
  std::vector<int32_t> idx(300);
  for (int i = 0; i < 300; ++i) idx[i] = i;
  Batch b = gather_cpu(d, p, idx);
  std::vector<int> seen_dy(2 * shift + 1, 0), seen_dx(2 * shift + 1, 0);
  for (int i = 0; i < 300; ++i) {
    const AugmentDraw a = draw_augment(seed, 0, i, shift, false);
    ASSERT_TRUE(a.dy >= -shift && a.dy <= shift && a.dx >= -shift && a.dx <= shift);
    ++seen_dy[a.dy + shift];
    ++seen_dx[a.dx + shift];
    for (int k = 0; k < 2; ++k)
      for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) {
          const int sy = y + a.dy, sx = x + a.dx;
          const bool in = sy >= 0 && sy < h && sx >= 0 && sx < w;
          const float want = in ? d.images[((i * 2 + k) * h + sy) * w + sx] / 255.f : 0.f;
          ASSERT_EQ(b.x[((i * 2 + k) * h + y) * w + x], want);
        }
  }
  for (int s = 0; s <= 2 * shift; ++s) {  // every offset occurs (300 draws over 7 values)
    EXPECT_GT(seen_dy[s], 10);
    EXPECT_GT(seen_dx[s], 10);
  }
}

TEST(DataGather, DrawsDependOnSeedEpochAndIndexOnly) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Dataset d = test::random_dataset(40, 1, 9, 9, 3, seed);
  Normalization norm = random_norm(1, seed);
  AugmentOptions aug{2, true};
  GatherParams p = make_gather_params(1, 9, 9, norm, &aug, seed, 4);
  // The same sample in another batch position / batch gives the same augmented image.
  Batch a = gather_cpu(d, p, {3, 17, 25});
  Batch b = gather_cpu(d, p, {25, 8, 3});
  EXPECT_EQ(std::memcmp(a.x.data(), b.x.data() + 2 * 81, 81 * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(a.x.data() + 2 * 81, b.x.data(), 81 * sizeof(float)), 0);
  // Another epoch redraws: across 40 samples, some augmentation differs.
  int differ = 0;
  for (int i = 0; i < 40; ++i) {
    AugmentDraw x = draw_augment(seed, 4, i, 2, true), y = draw_augment(seed, 5, i, 2, true);
    differ += x.dx != y.dx || x.dy != y.dy || x.flip != y.flip;
  }
  EXPECT_GT(differ, 20);
  // epoch_ptr overrides epoch.
  int64_t epoch = 5;
  GatherParams q = p;
  q.epoch_ptr = &epoch;
  GatherParams r = p;
  r.epoch = 5;
  EXPECT_EQ(gather_cpu(d, q, {1, 2, 3}).x, gather_cpu(d, r, {1, 2, 3}).x);
}

TEST(DataGather, DispatchChecks) {
  Dataset d = test::random_dataset(5, 1, 4, 4, 2, 1);
  Normalization norm{{0.5f}, {0.25f}};
  GatherParams p = make_gather_params(1, 4, 4, norm, nullptr, 1);
  std::vector<float> x(16 * 2);
  std::vector<int32_t> y(2);
  std::vector<int32_t> bad = {0, 5};
  Exec cpu;
  EXPECT_THROW(
      gather_batch(p, d.images.data(), d.labels.data(), 5, bad.data(), 2, x.data(), y.data(), cpu),
      Error);
  DeviceDataset host(d, Device::CPU);
  EXPECT_EQ(host.n(), 5);
  std::vector<int32_t> ok = {4, 0};
  host.gather(p, ok.data(), 2, x.data(), y.data());
  EXPECT_EQ(y[0], d.labels[4]);
  EXPECT_EQ(x[0], (d.images[64] / 255.f - 0.5f) / 0.25f);
  GatherParams wrong = make_gather_params(1, 4, 5, norm, nullptr, 1);
  EXPECT_THROW(host.gather(wrong, ok.data(), 2, x.data(), y.data()), Error);
  AugmentOptions huge{99, false};
  EXPECT_THROW(make_gather_params(1, 4, 4, norm, &huge, 1), Error);
  EXPECT_THROW(make_gather_params(3, 4, 4, norm, nullptr, 1), Error);  // norm has 1 channel
}

TEST(DataNormalize, ComputedStatistics) {
  Dataset d;
  d.n = 2;
  d.c = 2;
  d.h = 1;
  d.w = 2;
  // channel 0: 0, 255, 0, 255 -> mean 0.5, std 0.5; channel 1 constant 51 -> mean 0.2, std 1.
  d.images = {0, 255, 51, 51, 0, 255, 51, 51};
  d.labels = {0, 0};
  d.class_names = {"a"};
  Normalization n = compute_normalization(d);
  EXPECT_FLOAT_EQ(n.mean[0], 0.5f);
  EXPECT_FLOAT_EQ(n.std[0], 0.5f);
  EXPECT_FLOAT_EQ(n.mean[1], 0.2f);
  EXPECT_FLOAT_EQ(n.std[1], 1.f);
  EXPECT_EQ(resolve_normalization({}, {}, d).mean, n.mean);
  Normalization given = resolve_normalization({0.1f, 0.2f}, {0.3f, 0.4f}, d);
  EXPECT_EQ(given.std[1], 0.4f);
  EXPECT_THROW(resolve_normalization({0.1f}, {0.3f}, d), Error);             // one per channel
  EXPECT_THROW(resolve_normalization({0.1f, 0.1f}, {0.3f, 0.f}, d), Error);  // std > 0
  EXPECT_THROW(resolve_normalization({0.1f, 0.1f}, {}, d), Error);           // both or neither
  EXPECT_NE(normalization_str(n).find("0.5000"), std::string::npos);
}
