// The int8 CUDA kernels against their CPU twin, bit for bit: int8 outputs, dequantized floats,
// the input quantization, the residual add, the average pool, and whole quantized networks'
// logits (a ResNet's too); and calibration on the GPU against calibration on the CPU.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "kernels/quant/qadd.h"
#include "kernels/quant/qavgpool.h"
#include "kernels/quant/qconv.h"
#include "kernels/quant/qconv_few_channels.h"
#include "kernels/quant/qconv_fused_classifier.h"
#include "kernels/quant/quantize.h"
#include "layers/fold_batchnorm.h"
#include "layers/network.h"
#include "layers/quant/int8_network.h"
#include "layers/quant/quant_model.h"
#include "runtime/memory.h"
#include "tests/test_util.h"
#ifdef CNN_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace cnn {
namespace {

template <class T>
Buffer<T> upload(const std::vector<T>& v) {
  Buffer<T> b(v.size(), Device::CUDA);
  b.copy_from(v.data(), Device::CPU, v.size());
  return b;
}

template <class T>
std::vector<T> download(const Buffer<T>& b) {
  std::vector<T> v(b.size());
  raw_copy(v.data(), Device::CPU, b.data(), Device::CUDA, b.bytes());
  return v;
}

QConvShape shape(int n, int c, int h, int w, int oc, int k, int stride, int pad, int groups,
                 int pool, int dil = 1) {
  QConvShape s;
  s.n = n, s.c = c, s.h = h, s.w = w, s.oc = oc, s.kh = s.kw = k;
  s.stride_h = s.stride_w = stride, s.pad_h = s.pad_w = pad, s.groups = groups;
  s.dil_h = s.dil_w = dil;
  if (pool) s.pool_kh = s.pool_kw = s.pool_sh = s.pool_sw = pool;
  s.cp = round_up4(c), s.ocp = round_up4(oc), s.cgp = qconv_weight_inner(c, groups);
  return s;
}

// A kernel and split count forced on a check's call (QConvPath with the repacked weights).
struct Forced {
  QConvKernel kernel;
  int splits = 0;
  QIgemmTile tile = QIgemmTile::Auto;
};

// The direct kernel always; the rule's choice (QConvKernel::Auto with the repacked weights: the
// few-channel, linear dp4a or tensor-core kernel) where the tensor-core path takes the shape;
// then each of `forced`. All must agree with the CPU twin bit for bit.
void check_qconv(const QConvShape& s, uint64_t seed, bool relu,
                 const std::vector<Forced>& forced = {}) {
  SCOPED_TRACE(::testing::Message()
               << "seed " << seed << " n=" << s.n << " c=" << s.c << " " << s.h << "x" << s.w
               << " oc=" << s.oc << " k=" << s.kh << " stride=" << s.stride_h
               << " groups=" << s.groups << " pool=" << s.pool_kh << " relu=" << relu);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> d(-127, 127);
  std::vector<int8_t> x(size_t(s.n) * s.h * s.w * s.cp), w(size_t(s.oc) * s.kh * s.kw * s.cgp);
  for (size_t i = 0; i < x.size(); ++i) x[i] = int(i % size_t(s.cp)) < s.c ? int8_t(d(rng)) : 0;
  for (size_t i = 0; i < w.size(); ++i) w[i] = int(i % size_t(s.cgp)) < s.cg() ? int8_t(d(rng)) : 0;
  std::uniform_real_distribution<float> m(1e-4f, 3e-3f), a(-20.f, 20.f);
  std::vector<float> mult, add;
  for (int o = 0; o < s.oc; ++o) mult.push_back(m(rng)), add.push_back(a(rng));
  const QEpilogue ep{mult.data(), add.data(), relu};
  std::vector<int8_t> ref(size_t(s.n) * s.ph() * s.pw() * s.ocp);
  std::vector<float> ref_f(size_t(s.n) * s.ph() * s.pw() * s.oc);
  qconv_forward_cpu(s, x.data(), w.data(), ep, ref.data());
  qconv_forward_float_cpu(s, x.data(), w.data(), ep, ref_f.data());

  Exec ex;
  ex.device = Device::CUDA;
  Buffer<int8_t> d_x = upload(x), d_w = upload(w);
  Buffer<float> d_mult = upload(mult), d_add = upload(add);
  const QEpilogue d_ep{d_mult.data(), d_add.data(), relu};
  Buffer<int8_t> d_packed;
  if (qconv_igemm_supported(s)) {
    std::vector<int8_t> packed(size_t(qconv_igemm_weight_size(s)));
    qconv_pack_igemm_weights(s, w.data(), packed.data());
    d_packed = upload(packed);
  }
  std::vector<QConvPath> paths = {QConvPath{}};
  if (!d_packed.empty()) paths.emplace_back(d_packed.data());
  for (const Forced& f : forced) paths.emplace_back(d_packed.data(), f.kernel, f.splits, f.tile);
  for (const QConvPath& p : paths) {
    const std::string path = std::string(qconv_kernel_name(qconv_resolve_kernel(s, p))) +
                             (p.splits ? " splits " + std::to_string(p.splits) : "") + " tile " +
                             qigemm_tile_name(p.tile);
    Buffer<int8_t> d_y = upload(std::vector<int8_t>(ref.size(), int8_t(99)));  // poisoned
    Buffer<float> d_yf(ref_f.size(), Device::CUDA);
    test::poison_device(d_yf.data(), d_yf.size());
    qconv_forward(s, d_x.data(), d_w.data(), d_ep, d_y.data(), ex, p);
    qconv_forward_float(s, d_x.data(), d_w.data(), d_ep, d_yf.data(), ex, p);
    const std::vector<int8_t> got = download(d_y);
    const std::vector<float> got_f = download(d_yf);
    size_t bad = 0;
    for (size_t i = 0; i < ref.size(); ++i) bad += got[i] != ref[i];
    EXPECT_EQ(bad, 0u) << path << ": int8 outputs differ from the CPU twin";
    bad = 0;
    for (size_t i = 0; i < ref_f.size(); ++i)
      bad += std::memcmp(&got_f[i], &ref_f[i], sizeof(float)) != 0;
    EXPECT_EQ(bad, 0u) << path << ": dequantized outputs differ from the CPU twin";
  }
}

TEST(GpuQuant, ConvMatchesCpuTwinBitForBit) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  for (int n : {1, 2, 257})
    for (bool relu : {false, true}) {
      check_qconv(shape(n, 1, 28, 28, 32, 5, 1, 2, 1, 2), seed, relu);       // LeNet conv1 + pool
      check_qconv(shape(n, 32, 14, 14, 64, 5, 1, 2, 1, 2), seed, relu);      // LeNet conv2 + pool
      check_qconv(shape(n, 6, 9, 7, 7, 3, 2, 1, 1, 0), seed + 1, relu);      // stride 2, odd
      check_qconv(shape(n, 8, 7, 11, 12, 3, 1, 1, 2, 2), seed + 2, relu);    // groups of 4
      check_qconv(shape(n, 9, 5, 6, 6, 1, 1, 0, 3, 0), seed + 3, relu);      // groups of 3
      check_qconv(shape(n, 13, 9, 9, 13, 3, 2, 1, 13, 0), seed + 4, relu);   // depthwise
      check_qconv(shape(n, 5, 10, 9, 3, 3, 1, 2, 1, 0, 2), seed + 5, relu);  // dilation 2
      check_qconv(shape(n, 7, 3, 3, 10, 3, 1, 0, 1, 0), seed + 6, relu);     // a linear layer
      check_qconv(shape(n, 1027, 1, 1, 33, 1, 1, 0, 1, 0), seed + 7, relu);  // wide linear
    }
}

// The tensor-core kernel's awkward cases: channels not a multiple of 4, 16 or 32 (the 4-byte
// gather) and multiples of 16 (the 16-byte one), odd output channels and more than one column
// tile, stride 2, kernels 1/3/5/7, overlapping and padded pool windows, a window of 9 that does
// not divide the 128-row tile, a channel stride larger than needed, batch 1 and 3; each whole and
// split 2 and 8 ways over a cluster.
TEST(GpuQuant, TensorCoreConvMatchesCpuTwinBitForBit) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  // Split-K forced as well: the pooled windows' banded epilogue, splits without k-tiles.
  const std::vector<Forced> kSplits = {
      {QConvKernel::TensorCores, 1}, {QConvKernel::TensorCores, 2}, {QConvKernel::TensorCores, 8}};
  uint64_t k = 0;
  for (int n : {1, 3})
    for (bool relu : {false, true}) {
      check_qconv(shape(n, 3, 11, 13, 7, 3, 1, 1, 1, 0), seed + k++, relu, kSplits);
      check_qconv(shape(n, 5, 9, 10, 9, 5, 2, 2, 1, 0), seed + k++, relu, kSplits);
      check_qconv(shape(n, 37, 8, 7, 65, 1, 1, 0, 1, 0), seed + k++, relu,
                  kSplits);  // 1x1, 2 tiles
      check_qconv(shape(n, 16, 15, 9, 33, 7, 2, 3, 1, 0), seed + k++, relu,
                  kSplits);  // 16-byte loads
      check_qconv(shape(n, 48, 6, 6, 131, 3, 1, 1, 1, 2), seed + k++, relu,
                  kSplits);  // 3 tiles, pool
      check_qconv(shape(n, 33, 7, 9, 17, 3, 2, 1, 1, 0), seed + k++, relu, kSplits);  // K tail
      check_qconv(shape(n, 64, 7, 7, 129, 7, 1, 0, 1, 0), seed + k++, relu,
                  kSplits);  // linear 3136
      check_qconv(shape(n, 2, 12, 12, 5, 3, 1, 1, 1, 0, 2), seed + k++, relu,
                  kSplits);  // dilation 2
      QConvShape s = shape(n, 6, 13, 11, 11, 3, 1, 1, 1, 0);
      s.pool_kh = s.pool_kw = 3, s.pool_sh = s.pool_sw = 2, s.pool_ph = s.pool_pw = 1;  // 9
      check_qconv(s, seed + k++, relu, kSplits);
      s = shape(n, 32, 9, 8, 20, 3, 1, 1, 1, 0);
      s.pool_kh = 2, s.pool_kw = 3, s.pool_sh = 1, s.pool_sw = 2;  // overlapping, not square
      check_qconv(s, seed + k++, relu, kSplits);
      s = shape(n, 20, 5, 5, 6, 3, 1, 1, 1, 0);
      s.cp = 32, s.ocp = 12;  // wider strides than the channels need
      check_qconv(s, seed + k++, relu, kSplits);
    }
  // The shapes all ran on the tensor-core kernel, so the test tests it.
  EXPECT_TRUE(qconv_igemm_supported(shape(3, 3, 11, 13, 7, 3, 1, 1, 1, 0)));
  EXPECT_FALSE(qconv_igemm_supported(shape(3, 13, 9, 9, 13, 3, 2, 1, 13, 0)));  // depthwise
}

QConvShape linear_shape(int n, int c, int h, int w, int oc) {
  QConvShape s = shape(n, c, h, w, oc, 1, 1, 0, 1, 0);
  s.kh = h, s.kw = w;
  return s;
}

// Linear layers on every kernel that takes them: the linear dp4a kernel (its few-columns tile for
// N <= 16, its few-rows tile otherwise), the tensor-core kernel whole and split 2, 4 and 8 ways,
// and the automatic choice. K not a multiple of 64 (324, 1028 with 4-byte loads; 272, 288 with
// 16-byte ones), LeNet's 3136 and 1024; N = 1, 10, 16, 33, 1000; batch 1, 3, 257; and LeNet's fc1
// and fc2 at batch 256.
TEST(GpuQuant, LinearKernelsMatchCpuTwinBitForBit) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  const std::vector<Forced> all = {{QConvKernel::LinearDp4a},
                                   {QConvKernel::TensorCores, 1},
                                   {QConvKernel::TensorCores, 2},
                                   {QConvKernel::TensorCores, 4},
                                   {QConvKernel::TensorCores, 8}};
  struct In {
    int c, h, w;
  };
  const std::vector<In> inputs = {{36, 3, 3}, {1027, 1, 1}, {48, 2, 3},
                                  {65, 2, 2}, {64, 7, 7},   {1024, 1, 1}};
  uint64_t k = 0;
  for (int n : {1, 3, 257})
    for (const In& in : inputs)
      for (int oc : {1, 10, 16, 33, 1000}) {
        if (n == 257 && oc == 1000 && in.c * in.h * in.w > 1100) continue;  // CPU twin time
        check_qconv(linear_shape(n, in.c, in.h, in.w, oc), seed + k, k % 2 == 1, all);
        ++k;
      }
  check_qconv(linear_shape(256, 64, 7, 7, 1024), seed + k++, true, all);   // LeNet fc1
  check_qconv(linear_shape(256, 1024, 1, 1, 10), seed + k++, false, all);  // LeNet fc2
  EXPECT_TRUE(qconv_is_linear(linear_shape(3, 65, 4, 4, 10)));
}

// The tensor-core linear tiles (qconv_linear_mma.cu), each forced whole and split 2, 4 and 8
// ways, and the 128x64 conv tile, on awkward linear shapes: M = 1, 3, 17, 64, 100, 256, 300
// (partial row tiles), N = 1, 10, 16, 17, 64, 100, 1024 (partial column tiles, int8 padding
// columns, N past the 64-row packing under a 128-wide tile), K = 4, 16, 52, 3136, 4100 (16-byte
// loads for 16 and 3136, 4-byte ones otherwise; fewer k-tiles than splits); int8 and float
// outputs, ReLU on and off. The few-column dp4a kernel joins for N <= 16 (K 3136 and 4100 take
// two and three slabs of its staged weights). Shapes whose CPU twin would take long are left out.
TEST(GpuQuant, LinearTensorCoreTilesMatchCpuTwinBitForBit) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  std::vector<Forced> tiles;
  for (QIgemmTile t : {QIgemmTile::Conv128x64, QIgemmTile::Linear64x64, QIgemmTile::Linear64x128,
                       QIgemmTile::Linear128x128})
    for (int splits : {1, 2, 4, 8}) tiles.push_back({QConvKernel::TensorCores, splits, t});
  struct In {
    int c, h, w;
  };
  const std::vector<In> ks = {{4, 1, 1}, {16, 1, 1}, {52, 1, 1}, {64, 7, 7}, {4100, 1, 1}};
  uint64_t k = 0;
  for (int m : {1, 3, 17, 64, 100, 256, 300})
    for (int n : {1, 10, 16, 17, 64, 100, 1024})
      for (const In& in : ks) {
        const QConvShape s = linear_shape(m, in.c, in.h, in.w, n);
        if (double(m) * n * s.cp * s.h * s.w > 1.5e8) continue;  // CPU twin time
        std::vector<Forced> forced = tiles;
        if (n <= kQLinearDp4aMaxCols) forced.push_back({QConvKernel::LinearDp4a});
        check_qconv(s, seed + k, k % 2 == 1, forced);
        ++k;
      }
  check_qconv(linear_shape(256, 64, 7, 7, 1024), seed + k++, true, tiles);  // LeNet fc1
  check_qconv(linear_shape(256, 1024, 1, 1, 10), seed + k++, false,
              {{QConvKernel::LinearDp4a}});  // LeNet fc2
}

// The few-column dp4a kernels (qconv_linear.cu) across their split: the register kernel in one
// pass (K 4 and 52 in words, 16 and 1024 in int4) and two (516 and 1012 in words, 1040 and 2048
// in int4; 1040's second pass partial), the staged kernel past it (1028, 2052 and 4100 in words,
// 4096 and 8192 in int4: one to four slabs, partial last ones); M = 1, 3, 255, 256, 300 (a
// partial last block), N = 1, 10, 16; int8 and float outputs, ReLU on and off.
TEST(GpuQuant, LinearFewColumnKernelsMatchCpuTwinBitForBit) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  uint64_t k = 0;
  for (int m : {1, 3, 255, 256, 300})
    for (int n : {1, 10, 16})
      for (int c : {4, 16, 52, 516, 1012, 1024, 1028, 1040, 2048, 2052, 4096, 4100, 8192}) {
        check_qconv(linear_shape(m, c, 1, 1, n), seed + k, k % 2 == 1, {{QConvKernel::LinearDp4a}});
        ++k;
      }
}

// The classifier fused into the linear layer before it (qconv_fused_classifier.h) on s1 and a
// classifier of oc2 outputs: for each forced tile and split, two calls in a row (the scratch must
// be left zero by the first) and a CUDA graph of one call replayed twice, the layer's int8
// outputs and the logits against the CPU twin (the two layers one after the other) bit for bit.
void check_fused_classifier(const QConvShape& s1, int oc2, uint64_t seed, bool relu1, bool relu2,
                            const std::vector<Forced>& forced) {
  SCOPED_TRACE(::testing::Message()
               << "seed " << seed << " rows=" << s1.n << " k=" << s1.c << "x" << s1.h << "x" << s1.w
               << " cols=" << s1.oc << " classes=" << oc2 << " relu " << relu1 << "/" << relu2);
  const QConvShape s2 = linear_shape(s1.n, s1.oc, 1, 1, oc2);
  ASSERT_TRUE(qconv_classifier_fusable(s1, s2));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> d(-127, 127);
  // x (N, H, W, CP) and w1 (OC, KH, KW, CGP): the layer's kernel covers its whole input image.
  std::vector<int8_t> x(size_t(s1.n) * s1.h * s1.w * s1.cp),
      w1(size_t(s1.oc) * s1.kh * s1.kw * s1.cgp), w2(size_t(oc2) * s2.cgp);
  for (size_t i = 0; i < x.size(); ++i) x[i] = int(i % size_t(s1.cp)) < s1.c ? int8_t(d(rng)) : 0;
  for (size_t i = 0; i < w1.size(); ++i)
    w1[i] = int(i % size_t(s1.cgp)) < s1.c ? int8_t(d(rng)) : 0;
  for (size_t i = 0; i < w2.size(); ++i)
    w2[i] = int(i % size_t(s2.cgp)) < s2.c ? int8_t(d(rng)) : 0;
  // Multipliers that spread the layer's outputs over the int8 range (some saturate, some are 0
  // after ReLU), and negative ones for a few classes.
  std::uniform_real_distribution<float> m(2e-4f, 2e-3f), a(-20.f, 20.f);
  std::vector<float> mult1, add1, mult2, add2;
  for (int o = 0; o < s1.oc; ++o)
    mult1.push_back(m(rng) * 1024.f / float(s1.c * s1.h * s1.w)), add1.push_back(a(rng));
  for (int o = 0; o < oc2; ++o)
    mult2.push_back(o % 3 == 2 ? -m(rng) : m(rng)), add2.push_back(a(rng));
  std::vector<int8_t> ref1(size_t(s1.n) * s1.ocp);
  std::vector<float> ref2(size_t(s1.n) * oc2);
  QClassifierFusion cpu;
  cpu.shape = s2, cpu.w = w2.data(), cpu.ep = QEpilogue{mult2.data(), add2.data(), relu2};
  cpu.y = ref2.data();
  qconv_linear_classifier_forward(s1, x.data(), w1.data(), nullptr,
                                  QEpilogue{mult1.data(), add1.data(), relu1}, ref1.data(), cpu,
                                  Exec{});

  Exec ex;
  ex.device = Device::CUDA;
  std::vector<int8_t> packed(size_t(qconv_igemm_weight_size(s1)));
  qconv_pack_igemm_weights(s1, w1.data(), packed.data());
  Buffer<int8_t> d_x = upload(x), d_w1 = upload(w1), d_packed = upload(packed), d_w2 = upload(w2);
  Buffer<float> d_m1 = upload(mult1), d_a1 = upload(add1), d_m2 = upload(mult2),
                d_a2 = upload(add2);
  Buffer<int32_t> acc(size_t(qconv_classifier_acc_size(s1.n, oc2)), Device::CUDA);
  Buffer<uint32_t> arrivals(size_t(qconv_classifier_arrivals_size(s1.n)), Device::CUDA);
  acc.zero();
  arrivals.zero();
  Buffer<int8_t> d_y1(ref1.size(), Device::CUDA);
  Buffer<float> d_y2(ref2.size(), Device::CUDA);
  QClassifierFusion cls;
  cls.shape = s2, cls.w = d_w2.data(), cls.ep = QEpilogue{d_m2.data(), d_a2.data(), relu2};
  cls.acc = acc.data(), cls.arrivals = arrivals.data(), cls.y = d_y2.data();
  const QEpilogue ep1{d_m1.data(), d_a1.data(), relu1};
  // The layer, then the classifier on the few-column kernel launched overlapped.
  const auto two_launches = [&](const Exec& e, const QConvPath& path1) {
    QConvPath path2(nullptr, QConvKernel::LinearDp4a);
    path2.overlap_launch = true;
    qconv_forward(s1, d_x.data(), d_w1.data(), ep1, d_y1.data(), e, path1);
    qconv_forward_float(s2, d_y1.data(), d_w2.data(), cls.ep, d_y2.data(), e, path2);
  };
  // The copies come from pageable memory on the legacy stream: they return before their DMA lands
  // and do not order a non-blocking stream's launches, so the poison waits for them.
  const auto poison = [&] {
    d_y1.copy_from(std::vector<int8_t>(ref1.size(), int8_t(99)).data(), Device::CPU, ref1.size());
    test::poison_device(d_y2.data(), d_y2.size());
    stream_sync(Device::CUDA, nullptr);
  };
  const auto compare = [&](const std::string& what) {
    const std::vector<int8_t> got1 = download(d_y1);
    const std::vector<float> got2 = download(d_y2);
    size_t bad = 0;
    for (size_t i = 0; i < ref1.size(); ++i) bad += got1[i] != ref1[i];
    EXPECT_EQ(bad, 0u) << what << ": the layer's int8 outputs differ from the CPU twin";
    bad = 0;
    for (size_t i = 0; i < ref2.size(); ++i)
      bad += std::memcmp(&got2[i], &ref2[i], sizeof(float)) != 0;
    EXPECT_EQ(bad, 0u) << what << ": the logits differ from the CPU twin, of " << ref2.size();
    EXPECT_EQ(download(acc), std::vector<int32_t>(acc.size(), 0)) << what << ": sums left behind";
    EXPECT_EQ(download(arrivals), std::vector<uint32_t>(arrivals.size(), 0u))
        << what << ": arrivals left behind";
  };
  std::vector<Forced> paths = {{QConvKernel::TensorCores, 0, QIgemmTile::Auto}};
  paths.insert(paths.end(), forced.begin(), forced.end());
  for (const Forced& f : paths) {
    const std::string what =
        std::string("tile ") + qigemm_tile_name(f.tile) + " splits " + std::to_string(f.splits);
    for (int call = 0; call < 2; ++call) {
      poison();
      qconv_linear_classifier_forward(s1, d_x.data(), d_w1.data(), d_packed.data(), ep1,
                                      d_y1.data(), cls, ex, f.tile, f.splits);
      compare(what + " call " + std::to_string(call + 1));
    }
    // Unfused, as the network runs them: the classifier's launch overlapping the layer's end.
    if (f.kernel == QConvKernel::TensorCores && oc2 <= kQLinearDp4aMaxCols) {
      poison();
      two_launches(ex, QConvPath(d_packed.data(), f.kernel, f.splits, f.tile));
      compare(what + " unfused, overlapped launch");
    }
  }
#ifdef CNN_HAVE_CUDA
  // Captured once, replayed twice (what Int8Network's callers do).
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  Exec gex = ex;
  gex.stream = stream;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  for (bool fused : {true, false}) {
    if (!fused && oc2 > kQLinearDp4aMaxCols) continue;
    ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    if (fused)
      qconv_linear_classifier_forward(s1, d_x.data(), d_w1.data(), d_packed.data(), ep1,
                                      d_y1.data(), cls, gex);
    else
      two_launches(gex, QConvPath(d_packed.data(), QConvKernel::TensorCores));
    ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
    ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    for (int replay = 0; replay < 2; ++replay) {
      poison();
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      compare(std::string(fused ? "fused" : "overlapped") + " graph replay " +
              std::to_string(replay + 1));
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
#endif
}

// The fused classifier on awkward shapes: rows 1, 3, 17, 64, 100, 256, 300 (partial row tiles,
// several row tiles), the layer's K 16, 52, 3136, 4100 (16-byte and 4-byte loads, fewer k-tiles
// than splits), its columns 10, 64, 100, 1024 (partial column tiles, int8 padding columns the
// classifier's weights cover as zeros), classes 1, 10, 16; every linear tile forced whole and
// split 2, 4 and 8 ways; ReLU on and off on both; and each unfused, the classifier's launch
// overlapping the layer's end (QConvPath::overlap_launch), as the network runs them. Shapes whose
// CPU twin would take long are left out; LeNet's fc1 + fc2 at batch 256 last.
TEST(GpuQuant, FusedClassifierMatchesCpuTwinBitForBit) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  std::vector<Forced> tiles;
  for (QIgemmTile t :
       {QIgemmTile::Linear64x64, QIgemmTile::Linear64x128, QIgemmTile::Linear128x128})
    for (int splits : {1, 2, 4, 8}) tiles.push_back({QConvKernel::TensorCores, splits, t});
  const int classes[] = {1, 10, 16};
  uint64_t k = 0;
  for (int m : {1, 3, 17, 64, 100, 256, 300})
    for (int cols : {10, 64, 100, 1024})
      for (int c : {16, 52, 3136, 4100}) {
        const QConvShape s1 = linear_shape(m, c, 1, 1, cols);
        if (double(m) * cols * s1.cp > 1.5e8) continue;  // CPU twin time
        // Under the sanitizers every fifth shape (each tile and split still runs on several).
        if (!test::light_sweeps() || k % 5 == 0)
          check_fused_classifier(s1, classes[k % 3], seed + k, k % 2 == 0, k % 4 == 3, tiles);
        ++k;
      }
  check_fused_classifier(linear_shape(256, 64, 7, 7, 1024), 10, seed + k, true, false, tiles);
}

// The few-channel kernels on s (the dp4a one, and the tensor-core one where it takes the shape;
// `mma` says whether it must): from int8 input (int8 and float outputs) and from the float input
// they quantize themselves, against the CPU twin (quantize, then qconv_forward_cpu) bit for bit.
// Mult is negative for some channels (the tensor-core kernel then pools the smallest sum).
void check_few_channels(const QConvShape& s, uint64_t seed, bool relu, bool mma = true) {
  SCOPED_TRACE(::testing::Message()
               << "seed " << seed << " n=" << s.n << " c=" << s.c << " cp=" << s.cp << " " << s.h
               << "x" << s.w << " oc=" << s.oc << " ocp=" << s.ocp << " k=" << s.kh << "x" << s.kw
               << " stride=" << s.stride_h << "x" << s.stride_w << " pad=" << s.pad_h << "x"
               << s.pad_w << " pool=" << s.pool_kh << "x" << s.pool_kw << " s" << s.pool_sh << " p"
               << s.pool_ph << " relu=" << relu);
  ASSERT_TRUE(qconv_few_channels_supported(s));
  ASSERT_EQ(qconv_few_channels_mma_supported(s), mma);
  std::mt19937_64 rng(seed);
  // A power-of-two inv_scale so that the values set to k + 0.5 steps below are exact ties after
  // the multiply (both sides round them to even), and a range that saturates at +-127.
  const float inv_scale = 32.f;
  std::uniform_real_distribution<float> u(-4.5f, 4.5f);
  std::vector<float> xf(size_t(s.n) * s.c * s.h * s.w);
  for (size_t i = 0; i < xf.size(); ++i)
    xf[i] = i % 7 == 3 ? (float(int(i % 61) - 30) + 0.5f) / inv_scale : u(rng);
  QuantizeShape qs;
  qs.n = s.n, qs.c = s.c, qs.h = s.h, qs.w = s.w, qs.cp = s.cp;
  std::vector<int8_t> x(size_t(s.n) * s.h * s.w * s.cp);
  quantize_nchw_to_nhwc_cpu(qs, xf.data(), inv_scale, x.data());
  std::uniform_int_distribution<int> d(-127, 127);
  std::vector<int8_t> w(size_t(s.oc) * s.kh * s.kw * s.cgp);
  for (size_t i = 0; i < w.size(); ++i) w[i] = int(i % size_t(s.cgp)) < s.c ? int8_t(d(rng)) : 0;
  std::uniform_real_distribution<float> m(1e-4f, 3e-3f), a(-20.f, 20.f);
  std::vector<float> mult, add;
  for (int o = 0; o < s.oc; ++o)
    mult.push_back(o % 5 == 4 ? -m(rng) : m(rng)), add.push_back(a(rng));
  const QEpilogue ep{mult.data(), add.data(), relu};
  std::vector<int8_t> ref(size_t(s.n) * s.ph() * s.pw() * s.ocp);
  std::vector<float> ref_f(size_t(s.n) * s.ph() * s.pw() * s.oc);
  qconv_forward_cpu(s, x.data(), w.data(), ep, ref.data());
  qconv_forward_float_cpu(s, x.data(), w.data(), ep, ref_f.data());

  Exec ex;
  ex.device = Device::CUDA;
  Buffer<int8_t> d_x = upload(x), d_w = upload(w);
  Buffer<float> d_xf = upload(xf), d_mult = upload(mult), d_add = upload(add);
  const QEpilogue d_ep{d_mult.data(), d_add.data(), relu};
  std::vector<QConvKernel> kernels = {QConvKernel::FewChannels};
  if (mma) kernels.push_back(QConvKernel::FewChannelsTensorCores);
  for (QConvKernel k : kernels) {
    // Forced, though the rule picks one of them too: the kernels, not the rule, are under test.
    const QConvPath few(nullptr, k);
    for (bool quantize : {false, true}) {
      Buffer<int8_t> d_y = upload(std::vector<int8_t>(ref.size(), int8_t(99)));  // poisoned
      if (quantize)
        qconv_few_channels_forward_quantize(s, d_xf.data(), inv_scale, d_w.data(), d_ep, d_y.data(),
                                            ex, k);
      else
        qconv_forward(s, d_x.data(), d_w.data(), d_ep, d_y.data(), ex, few);
      const std::vector<int8_t> got = download(d_y);
      size_t bad = 0;
      for (size_t i = 0; i < ref.size(); ++i) bad += got[i] != ref[i];
      EXPECT_EQ(bad, 0u) << qconv_kernel_name(k)
                         << (quantize ? " from float input" : " from int8 input")
                         << ": int8 outputs differ from the CPU twin, of " << ref.size();
    }
    Buffer<float> d_yf(ref_f.size(), Device::CUDA);
    test::poison_device(d_yf.data(), d_yf.size());
    qconv_forward_float(s, d_x.data(), d_w.data(), d_ep, d_yf.data(), ex, few);
    const std::vector<float> got_f = download(d_yf);
    size_t bad = 0;
    for (size_t i = 0; i < ref_f.size(); ++i)
      bad += std::memcmp(&got_f[i], &ref_f[i], sizeof(float)) != 0;
    EXPECT_EQ(bad, 0u) << qconv_kernel_name(k)
                       << ": dequantized outputs differ from the CPU twin, of " << ref_f.size();
  }
}

// The few-channel kernels' awkward cases: 1 (4 taps per word) and 2, 3, 4 channels (a pixel per
// word), a channel stride wider than needed, kernels 3/5/7 and a non-square one, stride 2, odd
// sizes (29, 17) and images of several tiles, output channels 1, 32, 33, 64 and 72 (two channel
// blocks), no pool, 2x2, the 3x3 stride-2 padded one, an overlapping non-square one.
TEST(GpuQuant, FewChannelConvMatchesCpuTwinBitForBit) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  uint64_t k = 0;
  const auto pool3 = [](QConvShape s) {
    s.pool_kh = s.pool_kw = 3, s.pool_sh = s.pool_sw = 2, s.pool_ph = s.pool_pw = 1;
    return s;
  };
  for (int n : {1, 3, 257})
    for (bool relu : {false, true}) {
      check_few_channels(shape(n, 1, 28, 28, 32, 5, 1, 2, 1, 2), seed + k++, relu);  // LeNet
      check_few_channels(shape(n, 1, 29, 17, 33, 3, 1, 1, 1, 0), seed + k++, relu);
      check_few_channels(shape(n, 3, 17, 29, 64, 7, 2, 3, 1, 0), seed + k++, relu);
      check_few_channels(pool3(shape(n, 3, 29, 29, 1, 7, 2, 3, 1, 0)), seed + k++, relu);
      check_few_channels(pool3(shape(n, 1, 17, 29, 72, 5, 2, 2, 1, 0)), seed + k++, relu);
      check_few_channels(shape(n, 3, 29, 17, 32, 3, 1, 1, 1, 2), seed + k++, relu);
      check_few_channels(shape(n, 1, 17, 17, 1, 7, 1, 3, 1, 2), seed + k++, relu);
      if (n == 257) continue;  // the larger images at batch 1 and 3
      check_few_channels(shape(n, 2, 61, 45, 20, 5, 1, 0, 1, 2), seed + k++, relu);
      check_few_channels(pool3(shape(n, 3, 96, 83, 64, 7, 2, 3, 1, 0)), seed + k++, relu);
      QConvShape s = shape(n, 4, 23, 19, 13, 3, 1, 1, 1, 0);
      s.cp = 8, s.ocp = 20;  // wider strides than the channels need
      s.kw = 5, s.pad_w = 2;
      check_few_channels(s, seed + k++, relu);
      s = shape(n, 1, 19, 23, 9, 3, 1, 0, 1, 0);
      s.kh = 6, s.kw = 4;                                          // even, non-square kernel
      s.pool_kh = 2, s.pool_kw = 3, s.pool_sh = 1, s.pool_sw = 2;  // overlapping, not square
      check_few_channels(s, seed + k++, relu);
      s = shape(n, 3, 27, 29, 5, 3, 1, 1, 1, 0);
      s.pool_kh = 6, s.pool_kw = 3, s.pool_sh = s.pool_sw = 2;  // 18 outputs: dp4a only
      check_few_channels(s, seed + k++, relu, /*mma=*/false);
    }
  // The rule: few channels go to the tensor-core few-channel kernel, the rest elsewhere.
  EXPECT_EQ(qconv_pick_kernel(shape(256, 1, 28, 28, 32, 5, 1, 2, 1, 2), true),
            QConvKernel::FewChannelsTensorCores);
  EXPECT_EQ(qconv_pick_kernel(shape(256, 1, 28, 28, 32, 5, 1, 2, 1, 2), false),
            QConvKernel::Direct);
  EXPECT_EQ(qconv_pick_kernel(shape(256, 32, 14, 14, 64, 5, 1, 2, 1, 2), true),
            QConvKernel::TensorCores);
}

// The tensor-core few-channel kernel (and the dp4a one beside it) over a sweep of awkward shapes:
// C = 1..4; OC = 1, 5, 32, 40, 70 (one column tile, a partial one, 4, 5 of 8 and two channel
// blocks); kernels 1, 3, 5, 7, 11 and a non-square one; stride 1 and 2 (and 2x1); padding 0..3;
// no pool, 2x2 stride 2, 3x3 stride 2 padded, 2x3 overlapping; images 27x29, 1x1, 5x3, 28x28;
// batch 1..3; ReLU on and off. Shapes whose output would be empty are skipped, and every kind of
// case is checked to have run.
TEST(GpuQuant, FewChannelTensorCoreSweepMatchesCpuTwinBitForBit) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  struct Image {
    int h, w;
  };
  const std::vector<Image> images = {{27, 29}, {1, 1}, {5, 3}, {28, 28}};
  const std::vector<int> ocs = {1, 5, 32, 40, 70}, kernels = {1, 3, 5, 7, 11};
  uint64_t k = 0;
  int ran = 0, pooled = 0, pool3_ran = 0, strided = 0;
  for (int c = 1; c <= 4; ++c)
    for (size_t im = 0; im < images.size(); ++im)
      for (int pool = 0; pool < 4; ++pool) {
        // One kernel size, output channel count, stride and padding per case, cycling so that
        // each value meets each channel count and pool.
        const size_t i = size_t(c) * 7 + im * 3 + size_t(pool) * 5;
        const int ks = kernels[i % kernels.size()], oc = ocs[(i / 2) % ocs.size()];
        const int stride = 1 + int(i % 3 == 2), pad = int((i / 3) % 4);
        QConvShape s = shape(1 + int(i % 3), c, images[im].h, images[im].w, oc, ks, stride,
                             std::max(pad, (ks - images[im].h + 1) / 2), 1, 0);
        s.pad_w = std::max(pad, (ks - images[im].w + 1) / 2);
        if (i % 4 == 1) s.stride_w = 1;  // 2x1 strides too
        if (pool == 1) s.pool_kh = s.pool_kw = s.pool_sh = s.pool_sw = 2;
        if (pool == 2)
          s.pool_kh = s.pool_kw = 3, s.pool_sh = s.pool_sw = 2, s.pool_ph = s.pool_pw = 1;
        if (pool == 3) s.pool_kh = 2, s.pool_kw = 3, s.pool_sh = 1, s.pool_sw = 2;
        if (s.oh() < 1 || s.ow() < 1 || s.ph() < 1 || s.pw() < 1 ||
            s.oh() + 2 * s.pool_ph < s.pool_kh || s.ow() + 2 * s.pool_pw < s.pool_kw)
          continue;
        check_few_channels(s, seed + k, k % 2 == 1);
        ++k, ++ran;
        pooled += pool > 0;
        pool3_ran += pool == 2;
        strided += s.stride_h == 2;
      }
  // Non-square kernels with 4 taps a word and without.
  for (int c : {1, 3}) {
    QConvShape s = shape(2, c, 27, 29, 40, 3, 1, 0, 1, 2);
    s.kh = 11, s.kw = 5, s.pad_h = 5, s.pad_w = 1;
    check_few_channels(s, seed + k++, true);
  }
  EXPECT_GE(ran, 40);
  EXPECT_GE(pooled, 25);
  EXPECT_GE(pool3_ran, 8);
  EXPECT_GE(strided, 10);
}

TEST(GpuQuant, InputQuantizationMatchesCpuTwin) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  QuantizeShape s;
  s.n = 37, s.c = 3, s.h = 13, s.w = 9, s.cp = 4;
  std::vector<float> x = test::random_vector(size_t(s.n) * s.c * s.h * s.w, seed, -3.f, 3.f);
  x[0] = 2.5f / 40.f;  // ties after scaling are rounded to even on both sides
  std::vector<int8_t> ref(size_t(s.n) * s.h * s.w * s.cp);
  quantize_nchw_to_nhwc_cpu(s, x.data(), 40.f, ref.data());
  Exec ex;
  ex.device = Device::CUDA;
  Buffer<float> d_x = upload(x);
  Buffer<int8_t> d_y = upload(std::vector<int8_t>(ref.size(), int8_t(99)));
  quantize_nchw_to_nhwc(s, d_x.data(), 40.f, d_y.data(), ex);
  EXPECT_EQ(download(d_y), ref);
}

// The residual add: awkward shapes (C not a multiple of 4, odd H and W, batch 1 and 3, a channel
// stride wider than needed), multipliers above and below 1, ReLU on and off, inputs that
// saturate, and exact ties (multipliers 0.25, a = b = 1: 0.5 rounds to 0; a = b = 3: 1.5 to 2) so
// the rounding is exercised where the twins could differ.
TEST(GpuQuant, ResidualAddMatchesCpuTwinBitForBit) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> d(-127, 127);
  std::uniform_real_distribution<float> m(0.05f, 2.5f);
  Exec ex;
  ex.device = Device::CUDA;
  const std::vector<QAddShape> shapes = {{1, 7, 5, 3, 4},   {3, 9, 11, 10, 12},
                                         {1, 1, 1, 1, 4},   {3, 14, 14, 33, 36},
                                         {1, 13, 3, 6, 16}, {3, 28, 28, 32, 32}};
  uint64_t k = 0;
  for (const QAddShape& s : shapes)
    for (bool relu : {false, true})
      for (int variant = 0; variant < 3; ++variant) {
        SCOPED_TRACE(::testing::Message()
                     << "seed " << seed << " n=" << s.n << " " << s.h << "x" << s.w << " c=" << s.c
                     << " cp=" << s.cp << " relu=" << relu << " variant " << variant);
        const size_t size = size_t(s.n) * s.h * s.w * s.cp;
        std::vector<int8_t> a(size), b(size);
        for (size_t i = 0; i < size; ++i) {
          const bool real = int(i % size_t(s.cp)) < s.c;
          a[i] = real ? int8_t(d(rng)) : int8_t(0);
          b[i] = real ? int8_t(d(rng)) : int8_t(0);
          if (variant == 2 && real && i % 3 == 0) a[i] = b[i] = int8_t(i % 2 ? 1 : 3);  // ties
        }
        QAddScales sc{m(rng), m(rng), relu};
        if (variant == 1) sc.mult_a = 3.f, sc.mult_b = 2.5f;  // saturates
        if (variant == 2) sc.mult_a = sc.mult_b = 0.25f;
        std::vector<int8_t> ref(size, int8_t(99));
        qadd_forward_cpu(s, a.data(), b.data(), sc, ref.data());
        Buffer<int8_t> d_a = upload(a), d_b = upload(b);
        Buffer<int8_t> d_y = upload(std::vector<int8_t>(size, int8_t(99)));  // poisoned
        qadd_forward(s, d_a.data(), d_b.data(), sc, d_y.data(), ex);
        const std::vector<int8_t> got = download(d_y);
        size_t bad = 0;
        for (size_t i = 0; i < size; ++i) bad += got[i] != ref[i];
        EXPECT_EQ(bad, 0u) << "of " << size;
        ++k;
      }
  EXPECT_EQ(k, shapes.size() * 6);
}

// A quantized network (random weights, calibrated on random images) on the GPU against the same
// on the CPU: the logits and every int8 stage output, bit for bit, with the kernels of
// qconv_pick_kernel's rule and with every stage on the direct kernel. kernels: what the rule
// should pick for the conv/linear stages (adds and average pools skipped), in order, at batch 257.
constexpr QConvKernel kFewTc = QConvKernel::FewChannelsTensorCores, kDirect = QConvKernel::Direct,
                      kTc = QConvKernel::TensorCores, kLinear = QConvKernel::LinearDp4a;

// fuses: whether the GPU network runs its classifier inside the stage before it at batch 257
// (never at 1 and 5, where that stage runs the linear dp4a kernel); a third GPU network with the
// fusion off must give the same bits.
void check_network(const std::vector<LayerSpec>& specs, const Shape& input,
                   const std::vector<QConvKernel>& kernels, uint64_t seed, bool fuses = false) {
  SCOPED_TRACE("seed " + std::to_string(seed));
  NetworkOptions o;
  o.max_batch = 1;
  o.seed = seed;
  const Network net(specs, input, o, Exec{});
  const FoldedNetwork folded =
      fold_batchnorm(specs, input, net.params_to_host(), net.buffers_to_host());
  const int64_t image = shape_numel(input);
  const std::vector<float> x = test::random_vector(size_t(257 * image), seed + 1, -2.f, 2.f);
  const QuantizedModel m = quantize_network(folded, input, x.data(), 64, kDefaultCalibration);
  const int classes = m.num_classes();
  Int8Network cpu(m, 257, Exec{});
  Exec ex;
  ex.device = Device::CUDA;
  Int8Network gpu_tc(m, 257, ex, /*tensor_cores=*/true, /*fuse_classifier=*/true),
      gpu_direct(m, 257, ex, /*tensor_cores=*/false);
  Int8Network gpu_unfused(m, 257, ex, /*tensor_cores=*/true, /*fuse_classifier=*/false);
  EXPECT_EQ(gpu_tc.fuses_classifier(257), fuses);
  EXPECT_FALSE(gpu_tc.fuses_classifier(1));
  EXPECT_FALSE(gpu_tc.fuses_classifier(5));
  EXPECT_FALSE(gpu_unfused.fuses_classifier(257));
  EXPECT_FALSE(gpu_direct.fuses_classifier(257));
  EXPECT_FALSE(cpu.fuses_classifier(257));
  // Every test network reads images of at most 4 channels: its first stage runs the few-channel
  // kernel, which quantizes the input itself.
  EXPECT_TRUE(gpu_tc.fuses_input_quantization());
  EXPECT_FALSE(gpu_direct.fuses_input_quantization());
  EXPECT_FALSE(cpu.fuses_input_quantization());
  std::vector<QConvKernel> got_kernels;
  for (size_t i = 0; i < m.stages.size(); ++i) {
    if (gpu_tc.stage_is_add(i) || gpu_tc.stage_is_avgpool(i)) continue;
    got_kernels.push_back(gpu_tc.stage_kernel(i, 257));
    for (int n : {1, 5, 257}) {
      QConvShape s = gpu_tc.stage_shape(i);
      s.n = n;  // the network follows the one rule at every batch
      EXPECT_EQ(gpu_tc.stage_kernel(i, n), qconv_pick_kernel(s, true)) << "stage " << i;
      EXPECT_EQ(gpu_direct.stage_kernel(i, n), QConvKernel::Direct) << "stage " << i;
    }
  }
  const auto names = [](const std::vector<QConvKernel>& ks) {
    std::string s;
    for (QConvKernel k : ks) s += std::string(s.empty() ? "" : ", ") + qconv_kernel_name(k);
    return s;
  };
  EXPECT_EQ(names(got_kernels), names(kernels));
  Buffer<float> d_x = upload(x);
  // 257 twice: a fused classifier must leave its scratch zero for the next call.
  for (int n : {1, 5, 257, 257}) {
    const float* y = cpu.forward(n, x.data());
    const std::vector<float> ref(y, y + size_t(n) * size_t(classes));
    for (Int8Network* gpu : {&gpu_tc, &gpu_unfused, &gpu_direct}) {
      const char* path = gpu == &gpu_tc        ? "the rule's kernels"
                         : gpu == &gpu_unfused ? "the rule's kernels, classifier not fused"
                                               : "direct";
      std::vector<float> got(ref.size());
      raw_copy(got.data(), Device::CPU, gpu->forward(n, d_x.data()), Device::CUDA,
               got.size() * sizeof(float));
      EXPECT_EQ(got, ref) << path << " batch " << n;
      for (size_t i = 0; i + 1 < m.stages.size(); ++i)
        EXPECT_EQ(gpu->stage_output_to_host(i, n), cpu.stage_output_to_host(i, n))
            << path << " stage " << i << " (" << m.stages[i].name << ") batch " << n;
    }
  }
}

TEST(GpuQuant, NetworkLogitsEqualCpu) {
  CNN_REQUIRE_GPU();
  LayerSpec dw = conv2d_spec("conv2", 8, 3, 3, 1, 1);
  dw.groups = 8;
  const std::vector<LayerSpec> specs = {conv2d_spec("conv1", 8, 3, 3, 1, 1),
                                        batchnorm_spec(LayerKind::BatchNorm2d, "bn1"),
                                        layer_spec(LayerKind::Relu, "relu1"),
                                        maxpool2d_spec("pool1", 2, 2),
                                        dw,
                                        layer_spec(LayerKind::Relu, "relu2"),
                                        conv2d_spec("conv3", 12, 3, 3, 2, 1),
                                        layer_spec(LayerKind::Relu, "relu3"),
                                        layer_spec(LayerKind::Flatten, "flatten1"),
                                        linear_spec("fc1", 21),
                                        layer_spec(LayerKind::Relu, "relu4"),
                                        linear_spec("fc2", 10),
                                        layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")};
  // conv1, conv2 (depthwise), conv3, fc1 (21 columns at batch 257), fc2 (10 columns)
  check_network(specs, Shape{3, 17, 15}, {kFewTc, kDirect, kTc, kTc, kLinear}, test::fresh_seed(),
                /*fuses=*/true);
}

// Global average pooling inside the classifier's int8 sum (MobileNet's tail), and a 1x1 conv.
TEST(GpuQuant, GlobalPoolNetworkLogitsEqualCpu) {
  CNN_REQUIRE_GPU();
  LayerSpec dw = conv2d_spec("conv2", 16, 3, 3, 2, 1);
  dw.groups = 16;
  const std::vector<LayerSpec> specs = {conv2d_spec("conv1", 16, 3, 3, 1, 1),
                                        batchnorm_spec(LayerKind::BatchNorm2d, "bn1"),
                                        layer_spec(LayerKind::Relu, "relu1"),
                                        dw,
                                        batchnorm_spec(LayerKind::BatchNorm2d, "bn2"),
                                        layer_spec(LayerKind::Relu, "relu2"),
                                        conv2d_spec("conv3", 35, 1, 1, 1, 0),
                                        layer_spec(LayerKind::Relu, "relu3"),
                                        layer_spec(LayerKind::GlobalAvgPool, "gap1"),
                                        layer_spec(LayerKind::Flatten, "flatten1"),
                                        dropout_spec("drop1", 0.2),
                                        linear_spec("fc1", 7),
                                        layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")};
  // conv1, conv2 (depthwise), conv3, fc1
  check_network(specs, Shape{3, 19, 13}, {kFewTc, kDirect, kTc, kLinear}, test::fresh_seed());
}

// A BatchNorm ResNet as configs/resnet_fashion.yaml builds it (a stem, identity blocks, a
// projection block with a stride-2 1x1 conv + BN shortcut, a ReLU after each block, global
// average pooling), at awkward sizes: odd input 15x13, channels 6 and 10 (not multiples of 4).
// The whole int8 forward on the GPU (tensor-core convs, the add kernel) equals the CPU twin's bit
// for bit, logits and every int8 tensor, at batch 1, 5 and 257; and once more with every conv on
// the direct kernel.
TEST(GpuQuant, ResNetLogitsEqualCpu) {
  CNN_REQUIRE_GPU();
  const auto bn = [](const std::string& n) { return batchnorm_spec(LayerKind::BatchNorm2d, n); };
  const auto relu = [](const std::string& n) { return layer_spec(LayerKind::Relu, n); };
  const std::vector<LayerSpec> specs = {
      conv2d_spec("conv1", 6, 3, 3, 1, 1),
      bn("bn1"),
      relu("relu1"),
      residual_spec("res1", {conv2d_spec("conv2", 6, 3, 3, 1, 1), bn("bn2"), relu("relu2"),
                             conv2d_spec("conv3", 6, 3, 3, 1, 1), bn("bn3")}),
      relu("relu3"),
      residual_spec("res2",
                    {conv2d_spec("conv4", 10, 3, 3, 2, 1), bn("bn4"), relu("relu4"),
                     conv2d_spec("conv5", 10, 3, 3, 1, 1), bn("bn5")},
                    {conv2d_spec("conv6", 10, 1, 1, 2, 0), bn("bn6")}),
      relu("relu5"),
      residual_spec("res3", {conv2d_spec("conv7", 10, 3, 3, 1, 1), bn("bn7"), relu("relu6"),
                             conv2d_spec("conv8", 10, 3, 3, 1, 1), bn("bn8")}),
      layer_spec(LayerKind::GlobalAvgPool, "gap1"),  // res3 without a ReLU after it
      layer_spec(LayerKind::Flatten, "flatten1"),
      linear_spec("fc1", 7),
      layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")};
  // conv1, conv2, conv3, conv4, conv5, conv6, conv7, conv8, fc1 (the adds res1-res3 skipped)
  const std::vector<QConvKernel> kernels = {kFewTc, kTc, kTc, kTc, kTc, kTc, kTc, kTc, kLinear};
  check_network(specs, Shape{3, 15, 13}, kernels, test::fresh_seed());
}

// The int8 average pool against its CPU twin bit for bit: awkward sizes, channels not multiples
// of 4, padded windows, overlapping and non-dividing strides, batch 257, random multipliers,
// exact ties (a 2x2 window's 1/4) and saturation.
TEST(GpuQuant, AvgPoolMatchesCpuTwinBitForBit) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> d(-127, 127);
  Exec ex;
  ex.device = Device::CUDA;
  struct Case {
    int n, h, w, c, cp, kh, kw, stride_h, stride_w, pad_h, pad_w;
  };
  const std::vector<Case> cases = {
      {1, 7, 5, 3, 4, 2, 2, 2, 2, 0, 0},   {3, 9, 11, 10, 12, 3, 3, 2, 2, 1, 1},
      {1, 1, 1, 1, 4, 1, 1, 1, 1, 0, 0},   {2, 14, 14, 33, 36, 3, 3, 1, 1, 1, 1},
      {257, 6, 5, 6, 8, 2, 3, 1, 2, 1, 1}, {2, 28, 28, 64, 64, 7, 7, 7, 7, 0, 0},
      {3, 13, 9, 5, 16, 5, 4, 3, 2, 2, 2}};
  int runs = 0;
  for (const Case& k : cases)
    for (bool relu : {false, true})
      for (int variant = 0; variant < 3; ++variant) {
        QAvgPoolShape s;
        s.n = k.n, s.h = k.h, s.w = k.w, s.c = k.c, s.cp = k.cp, s.kh = k.kh, s.kw = k.kw;
        s.stride_h = k.stride_h, s.stride_w = k.stride_w, s.pad_h = k.pad_h, s.pad_w = k.pad_w;
        SCOPED_TRACE(::testing::Message()
                     << "seed " << seed << " n=" << s.n << " " << s.h << "x" << s.w << " c=" << s.c
                     << " cp=" << s.cp << " window " << s.kh << "x" << s.kw << " stride "
                     << s.stride_h << "x" << s.stride_w << " pad " << s.pad_h << "x" << s.pad_w
                     << " relu=" << relu << " variant " << variant);
        std::vector<int8_t> x(size_t(s.n) * s.h * s.w * s.cp);
        for (size_t i = 0; i < x.size(); ++i)
          x[i] = int(i % size_t(s.cp)) < s.c ? int8_t(d(rng)) : int8_t(0);
        std::uniform_real_distribution<float> m(0.2f, 2.f);
        float mult = m(rng) / float(s.kh * s.kw);
        if (variant == 1) mult = 3.f;  // saturates
        if (variant == 2) {            // ties: small sums over 1/4
          mult = 0.25f;
          for (size_t i = 0; i < x.size(); ++i)
            if (int(i % size_t(s.cp)) < s.c) x[i] = int8_t(d(rng) % 3);
        }
        std::vector<int8_t> ref(size_t(s.n) * s.oh() * s.ow() * s.cp, int8_t(99));
        qavgpool_forward_cpu(s, x.data(), mult, relu, ref.data());
        Buffer<int8_t> d_x = upload(x);
        Buffer<int8_t> d_y = upload(std::vector<int8_t>(ref.size(), int8_t(99)));  // poisoned
        qavgpool_forward(s, d_x.data(), mult, relu, d_y.data(), ex);
        const std::vector<int8_t> got = download(d_y);
        size_t bad = 0;
        for (size_t i = 0; i < ref.size(); ++i) bad += got[i] != ref[i];
        EXPECT_EQ(bad, 0u) << "of " << ref.size();
        ++runs;
      }
  EXPECT_EQ(runs, int(cases.size()) * 6);
}

// A net with every kind of int8 stage: a first conv(1 channel) + BN + ReLU + 2x2 max-pool (the
// float network fuses it into one conv-relu-pool pass on the GPU), an identity residual block
// with BN, an avgpool2d between a BN'd conv and its ReLU (padded, stride 2), a projection block
// (stride-2 1x1 conv + BN shortcut), global average pooling into the classifier. Odd sizes,
// channels not multiples of 4.
std::vector<LayerSpec> every_stage_specs() {
  const auto bn = [](const std::string& n) { return batchnorm_spec(LayerKind::BatchNorm2d, n); };
  const auto relu = [](const std::string& n) { return layer_spec(LayerKind::Relu, n); };
  return {conv2d_spec("conv1", 6, 5, 5, 1, 2),
          bn("bn1"),
          relu("relu1"),
          maxpool2d_spec("pool1", 2, 2),
          residual_spec("res1", {conv2d_spec("conv2", 6, 3, 3, 1, 1), bn("bn2"), relu("relu2"),
                                 conv2d_spec("conv3", 6, 3, 3, 1, 1), bn("bn3")}),
          relu("relu3"),
          conv2d_spec("conv4", 10, 3, 3, 1, 1),
          bn("bn4"),
          avgpool2d_spec("avg1", 3, 2, 1),
          relu("relu4"),
          residual_spec("res2",
                        {conv2d_spec("conv5", 9, 3, 3, 2, 1), bn("bn5"), relu("relu5"),
                         conv2d_spec("conv6", 9, 3, 3, 1, 1), bn("bn6")},
                        {conv2d_spec("conv7", 9, 1, 1, 2, 0), bn("bn7")}),
          relu("relu6"),
          layer_spec(LayerKind::GlobalAvgPool, "gap1"),
          layer_spec(LayerKind::Flatten, "flatten1"),
          linear_spec("fc1", 7),
          layer_spec(LayerKind::SoftmaxCrossEntropy, "loss")};
}

// BatchNorm running statistics away from (0, 1), so that folding changes the weights.
std::vector<float> random_bn_buffers(const Network& net, uint64_t seed) {
  std::vector<float> b = net.buffers_to_host();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> mean(-0.5f, 0.5f), var(0.3f, 3.f);
  for (const ParamInfo& p : net.buffer_infos()) {
    const bool is_var = p.name.find("running_var") != std::string::npos;
    const bool is_mean = p.name.find("running_mean") != std::string::npos;
    for (int64_t i = 0; i < p.numel(); ++i)
      if (is_var || is_mean) b[size_t(p.offset + i)] = is_var ? var(rng) : mean(rng);
  }
  return b;
}

TEST(GpuQuant, AvgPoolNetworkLogitsEqualCpu) {
  CNN_REQUIRE_GPU();
  // conv1, conv2, conv3, conv4, conv5, conv6, conv7, fc1 (res1, avg1, res2 skipped)
  const std::vector<QConvKernel> kernels = {kFewTc, kTc, kTc, kTc, kTc, kTc, kTc, kLinear};
  check_network(every_stage_specs(), Shape{1, 18, 14}, kernels, test::fresh_seed());
}

// Calibration on the GPU (the training Network's forward in FP32, the stage outputs copied back)
// gives the CPU's scales for every int8 tensor: max and percentile within a relative 1e-4 (float
// summation order, through ~10 layers), mse within one step of its 200-candidate search (a near
// tie that rounding tips); the weights, biases and plan are the same. 300 images: a full chunk of
// 256 and a partial one.
TEST(GpuQuant, CalibrationOnGpuEqualsCpu) {
  CNN_REQUIRE_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const std::vector<LayerSpec> specs = every_stage_specs();
  const Shape input{1, 18, 14};
  NetworkOptions o;
  o.max_batch = 1;
  o.seed = seed;
  const Network net(specs, input, o, Exec{});
  const FoldedNetwork folded =
      fold_batchnorm(specs, input, net.params_to_host(), random_bn_buffers(net, seed + 2));
  ASSERT_EQ(folded.folded.size(), 7u);
  const int n = 300;
  const std::vector<float> x =
      test::random_vector(size_t(n) * size_t(shape_numel(input)), seed + 1, -2.f, 2.f);
  Exec gpu;
  gpu.device = Device::CUDA;
  const QuantizedModel cpu_max =
      quantize_network(folded, input, x.data(), n, CalibrationMethod::Max);
  for (CalibrationMethod method :
       {CalibrationMethod::Max, CalibrationMethod::Percentile, CalibrationMethod::Mse}) {
    const QuantizedModel a = method == CalibrationMethod::Max
                                 ? cpu_max
                                 : quantize_network(folded, input, x.data(), n, method);
    const QuantizedModel b = quantize_network(folded, input, x.data(), n, method, gpu);
    ASSERT_EQ(a.stages.size(), 11u);
    ASSERT_EQ(b.stages.size(), a.stages.size());
    for (size_t i = 0; i < a.stages.size(); ++i) {
      const QuantStage &p = a.stages[i], &q = b.stages[i];
      SCOPED_TRACE(::testing::Message()
                   << calibration_method_name(method) << " stage " << i << " (" << p.name << ")");
      EXPECT_EQ(q.weight, p.weight);
      EXPECT_EQ(q.weight_scale, p.weight_scale);
      EXPECT_EQ(q.bias, p.bias);
      const auto near = [&](float got, float want, float max_scale, const char* what) {
        const double tol =
            method == CalibrationMethod::Mse ? max_scale / 200.0 * 1.001 : 1e-4 * want;
        EXPECT_NEAR(got, want, tol) << what;
        EXPECT_NE(want, 1.f) << what << ": a tensor of zeros proves nothing";
      };
      const QuantStage& m = cpu_max.stages[i];
      near(q.input_scale, p.input_scale, m.input_scale, "input_scale");
      if (p.add) near(q.shortcut_scale, p.shortcut_scale, m.shortcut_scale, "shortcut_scale");
      if (p.add || p.avgpool) near(q.output_scale, p.output_scale, m.output_scale, "output_scale");
    }
  }
}

}  // namespace
}  // namespace cnn
