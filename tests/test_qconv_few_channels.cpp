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
  EXPECT_EQ(qconv_pick_kernel(stem, true), QConvKernel::FewChannelsTensorCores);
  EXPECT_EQ(qconv_pick_kernel(stem, false), QConvKernel::Direct);
}

// The tensor-core version takes the same shapes but for pool windows over 16 outputs.
TEST(QConvFewChannels, TensorCoreKernelTakesPoolWindowsUpTo16) {
  EXPECT_TRUE(qconv_few_channels_mma_supported(conv(256, 1, 28, 28, 32, 5, 1, 2, 2)));
  EXPECT_TRUE(qconv_few_channels_mma_supported(conv(2, 4, 300, 7, 1, 11, 1, 5, 3)));
  QConvShape s = conv(2, 3, 40, 40, 70, 3, 1, 1, 0);
  s.pool_kh = 5, s.pool_kw = 3;  // 15 outputs
  EXPECT_TRUE(qconv_few_channels_supported(s));
  EXPECT_TRUE(qconv_few_channels_mma_supported(s));
  s.pool_kh = 6;  // 18
  EXPECT_TRUE(qconv_few_channels_supported(s));
  EXPECT_FALSE(qconv_few_channels_mma_supported(s));
  EXPECT_FALSE(qconv_few_channels_mma_supported(conv(8, 5, 28, 28, 32, 3, 1, 1, 0)));  // c > 4
  EXPECT_FALSE(qconv_few_channels_mma_supported(conv(8, 1, 28, 28, 32, 13, 1, 6, 0)));
  EXPECT_TRUE(qconv_is_few_channel_kernel(QConvKernel::FewChannels));
  EXPECT_TRUE(qconv_is_few_channel_kernel(QConvKernel::FewChannelsTensorCores));
  EXPECT_FALSE(qconv_is_few_channel_kernel(QConvKernel::TensorCores));
}

// The tensor-core layout of the dp4a kernel's tiles: windows padded to a power of two dividing
// the 16 rows of an mma tile, the kernel's words to 8-word k steps, rows of 9 words mod 32, all
// within the shared memory budget.
TEST(QConvFewChannels, TensorCoreTilingPadsWindowsAndWords) {
  const auto pool3 = [](QConvShape s) {
    s.pool_kh = s.pool_kw = 3, s.pool_sh = s.pool_sw = 2, s.pool_ph = s.pool_pw = 1;
    return s;
  };
  for (const QConvShape& s :
       {conv(256, 1, 28, 28, 32, 5, 1, 2, 2), conv(3, 3, 96, 83, 64, 7, 2, 3, 0),
        conv(1, 1, 17, 29, 72, 5, 2, 2, 2), conv(2, 4, 300, 7, 1, 11, 1, 5, 3),
        pool3(conv(64, 3, 224, 224, 64, 7, 2, 3, 0)), conv(1, 2, 1, 1, 5, 1, 1, 0, 0)}) {
    const QFewMmaTiling m = qconv_few_channels_mma_tiling(s);
    const QFewTiling& t = m.few;
    EXPECT_LE(m.smem_bytes, kQFewMaxSmem);
    EXPECT_EQ(m.n_tiles * 8, t.ocb);
    EXPECT_GE(int64_t(t.tiles_h) * t.tph, s.ph());
    EXPECT_GE(int64_t(t.tiles_w) * t.tpw, s.pw());
    EXPECT_GE(m.k_steps * 8, s.kh * t.kww);
    EXPECT_LT((m.k_steps - 1) * 8, s.kh * t.kww);
    EXPECT_GE(m.slots, s.pool_kh * s.pool_kw);
    EXPECT_EQ(m.slots, 1 << m.slot_shift);
    EXPECT_EQ(16 % m.slots, 0);
    EXPECT_GE(m.m_tiles * 16, t.tph * t.tpw * m.slots);
    EXPECT_GE(m.row_words, t.in_words);
    EXPECT_EQ(m.row_words % 32, 9);
    if (s.c == 1) {
      EXPECT_GE(4 * m.word_groups, t.in_words);  // a thread stages 4 words of a row
    }
  }
  // LeNet's conv1: 5x5 over 1 channel = 5 rows x 2 words = 10 words, 2 k steps; 2x2 windows in
  // 4 rows; 7 x 14 pooled outputs a block in 26 mma tiles (25 rounded up to whole pairs: 416
  // window slots of 8 bytes); 18 input rows of 32 words (stride 41); 2 KiB of B fragments: 8648
  // bytes of shared memory a block. The tiles are
  // the dp4a kernel's where they fit, halved where they do not.
  const QFewMmaTiling lenet = qconv_few_channels_mma_tiling(conv(256, 1, 28, 28, 32, 5, 1, 2, 2));
  EXPECT_EQ(lenet.k_steps, 2);
  EXPECT_EQ(lenet.slots, 4);
  EXPECT_EQ(lenet.few.tph * lenet.few.tpw, 98);
  EXPECT_EQ(lenet.m_tiles, 26);
  EXPECT_EQ(lenet.few.in_rows, 18);
  EXPECT_EQ(lenet.few.in_words, 32);
  EXPECT_EQ(lenet.row_words, 41);
  EXPECT_EQ(lenet.smem_bytes, 8648);
  const QFewTiling dp4a = qconv_few_channels_tiling(conv(256, 1, 28, 28, 32, 5, 1, 2, 2));
  EXPECT_EQ(lenet.few.tph, dp4a.tph);
  EXPECT_EQ(lenet.few.tpw, dp4a.tpw);
  // A tall, narrow image: the dp4a kernel's 100-window column of 310 input rows, padded to 41
  // words a row, does not fit; halved, it does.
  const QConvShape tall = conv(2, 4, 300, 7, 1, 11, 1, 5, 3);
  const QFewMmaTiling halved = qconv_few_channels_mma_tiling(tall);
  EXPECT_EQ(qconv_few_channels_tiling(tall).tph, 100);
  EXPECT_EQ(halved.few.tph, 50);
  EXPECT_EQ(halved.few.tiles_h, 2);
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
  // Either few-channel kernel forced: the CPU twin all the same.
  for (QConvKernel k : {QConvKernel::FewChannels, QConvKernel::FewChannelsTensorCores}) {
    std::vector<int8_t> forced(out, 99), forced_fused(out, 99);
    qconv_forward(s, x.data(), w.data(), ep, forced.data(), Exec{}, QConvPath(nullptr, k));
    qconv_few_channels_forward_quantize(s, xf.data(), 50.f, w.data(), ep, forced_fused.data(),
                                        Exec{}, k);
    EXPECT_EQ(forced, ref) << qconv_kernel_name(k);
    EXPECT_EQ(forced_fused, ref) << qconv_kernel_name(k);
  }
  // Only a few-channel kernel quantizes its input.
  EXPECT_THROW(qconv_few_channels_forward_quantize(s, xf.data(), 50.f, w.data(), ep, got.data(),
                                                   Exec{}, QConvKernel::TensorCores),
               Error);
  QConvShape bad = s;
  bad.c = 5, bad.cp = 8, bad.cgp = 8;
  EXPECT_THROW(qconv_forward(bad, x.data(), w.data(), ep, got.data(), Exec{}, few), Error);
  EXPECT_THROW(
      qconv_few_channels_forward_quantize(bad, xf.data(), 50.f, w.data(), ep, got.data(), Exec{}),
      Error);
}

}  // namespace
}  // namespace cnn
