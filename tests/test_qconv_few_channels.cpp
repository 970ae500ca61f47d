// The few-channel int8 convolution's host side: which shapes it takes, the dispatch rule, its
// tiling (within shared memory, tiles covering the output), and its CPU dispatch (qconv_forward
// with the kernel forced runs the twin; the fused quantization runs the input quantization first).
// The kernel itself is compared with the twin in gpu_quant.cpp.
#include <gtest/gtest.h>

#include <random>

#include "kernels/quant/qconv_few_channels.h"
#include "kernels/quant/qconv_few_channels_cuda.h"
#include "kernels/quant/quantize.h"
#include "runtime/error.h"
#include "tests/test_util.h"

namespace cnn {
namespace {

QConvShape conv(int n, int c, int h, int w, int oc, int k, int stride, int pad, int pool) {
  QConvShape s;
  s.n = n, s.c = c, s.h = h, s.w = w, s.oc = oc, s.kh = s.kw = k;
  s.stride_h = s.stride_w = stride, s.pad_h = s.pad_w = pad;
  if (pool) s.pool_kh = s.pool_kw = s.pool_sh = s.pool_sw = pool;
  s.cp = round_up4(c), s.ocp = round_up4(oc), s.cgp = qconv_weight_inner(c, 1);
  return s;
}

TEST(QConvFewChannels, TakesFirstLayersOnly) {
  EXPECT_TRUE(qconv_few_channels_supported(conv(256, 1, 28, 28, 32, 5, 1, 2, 2)));  // LeNet
  QConvShape stem = conv(64, 3, 224, 224, 64, 7, 2, 3, 0);  // ResNet's stem + 3x3/2 pool
  stem.pool_kh = stem.pool_kw = 3, stem.pool_sh = stem.pool_sw = 2, stem.pool_ph = 1;
  stem.pool_pw = 1;
  EXPECT_TRUE(qconv_few_channels_supported(stem));
  EXPECT_FALSE(qconv_few_channels_supported(conv(8, 5, 28, 28, 32, 3, 1, 1, 0)));   // c > 4
  EXPECT_FALSE(qconv_few_channels_supported(conv(8, 1, 28, 28, 32, 13, 1, 6, 0)));  // kernel
  EXPECT_FALSE(qconv_few_channels_supported(conv(8, 3, 28, 28, 32, 3, 1, 1, 4)));   // pool 4
  QConvShape dil = conv(8, 3, 28, 28, 32, 3, 1, 2, 0);
  dil.dil_h = dil.dil_w = 2;
  EXPECT_FALSE(qconv_few_channels_supported(dil));
  QConvShape grouped = conv(8, 4, 28, 28, 4, 3, 1, 1, 0);
  grouped.groups = 2, grouped.cgp = qconv_weight_inner(4, 2);
  EXPECT_FALSE(qconv_few_channels_supported(grouped));
  // A linear layer over a 1-channel image (a 28x28 "kernel") goes elsewhere (the rule's other
  // cases are in test_quant.cpp).
  EXPECT_EQ(qconv_pick_kernel(conv(256, 1, 28, 28, 32, 28, 1, 0, 0), true),
            QConvKernel::TensorCores);
  EXPECT_EQ(qconv_pick_kernel(stem, true), QConvKernel::FewChannels);
  EXPECT_EQ(qconv_pick_kernel(stem, false), QConvKernel::Direct);
}

TEST(QConvFewChannels, TilesCoverTheOutputWithinSharedMemory) {
  for (const QConvShape& s :
       {conv(256, 1, 28, 28, 32, 5, 1, 2, 2), conv(3, 3, 96, 83, 64, 7, 2, 3, 0),
        conv(1, 1, 17, 29, 72, 5, 2, 2, 2), conv(2, 4, 300, 7, 1, 11, 1, 5, 3)}) {
    const QFewTiling t = qconv_few_channels_tiling(s);
    EXPECT_LE(t.smem_bytes, kQFewMaxSmem);
    EXPECT_GE(int64_t(t.tiles_h) * t.tph, s.ph());
    EXPECT_GE(int64_t(t.tiles_w) * t.tpw, s.pw());
    EXPECT_GE(int64_t(t.chunks) * t.ocb, s.ocp);  // padded channels are written too
    EXPECT_EQ(t.ocb % 8, 0);
  }
  // LeNet's conv1: 1 channel, so a 5-tap row is 2 words (the third, fourth... taps share one).
  const QFewTiling lenet = qconv_few_channels_tiling(conv(256, 1, 28, 28, 32, 5, 1, 2, 2));
  EXPECT_EQ(lenet.taps_per_word, 4);
  EXPECT_EQ(lenet.kww, 2);
}

TEST(QConvFewChannels, CpuDispatchQuantizesThenRunsTheTwin) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const QConvShape s = conv(3, 3, 9, 11, 7, 3, 1, 1, 2);
  const std::vector<float> xf = test::random_vector(size_t(s.n) * s.c * s.h * s.w, seed, -2, 2);
  QuantizeShape qs;
  qs.n = s.n, qs.c = s.c, qs.h = s.h, qs.w = s.w, qs.cp = s.cp;
  std::vector<int8_t> x(size_t(s.n) * s.h * s.w * s.cp);
  quantize_nchw_to_nhwc_cpu(qs, xf.data(), 50.f, x.data());
  std::mt19937_64 rng(seed + 1);
  std::uniform_int_distribution<int> d(-127, 127);
  std::vector<int8_t> w(size_t(s.oc) * s.kh * s.kw * s.cgp);
  for (size_t i = 0; i < w.size(); ++i) w[i] = int(i % 4) < s.c ? int8_t(d(rng)) : 0;
  const std::vector<float> mult(size_t(s.oc), 2e-3f), add(size_t(s.oc), 0.25f);
  const QEpilogue ep{mult.data(), add.data(), true};
  const size_t out = size_t(s.n) * s.ph() * s.pw() * s.ocp;
  std::vector<int8_t> ref(out), got(out, 99), fused(out, 99);
  qconv_forward_cpu(s, x.data(), w.data(), ep, ref.data());
  const QConvPath few(nullptr, QConvKernel::FewChannels);
  qconv_forward(s, x.data(), w.data(), ep, got.data(), Exec{}, few);
  qconv_few_channels_forward_quantize(s, xf.data(), 50.f, w.data(), ep, fused.data(), Exec{});
  EXPECT_EQ(got, ref);
  EXPECT_EQ(fused, ref);
  QConvShape bad = s;
  bad.c = 5, bad.cp = 8, bad.cgp = 8;
  EXPECT_THROW(qconv_forward(bad, x.data(), w.data(), ep, got.data(), Exec{}, few), Error);
  EXPECT_THROW(
      qconv_few_channels_forward_quantize(bad, xf.data(), 50.f, w.data(), ep, got.data(), Exec{}),
      Error);
}

}  // namespace
}  // namespace cnn
