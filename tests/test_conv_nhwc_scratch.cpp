// The scratch of the TMA-im2col convolution (algo wgmma-nhwc) and who sizes it: the sizes are
// shape arithmetic (kernels/conv/conv2d_nhwc_scratch.h), so they are checked here on any machine.
//   NoScratchWhereNoneIsUsed  conv2d_forward_scratch_floats / conv2d_backward_data_scratch_floats
//                             are 0 on the CPU, for every algo but wgmma-nhwc (Auto included), at
//                             FP32, and for a strided input gradient (all refused or scratch-free).
//   LayoutMatchesTheCopies    the layout against a count written out here: the packed weights
//                             (rows, taps, channels padded to 32 / 64) rounded up to whole
//                             128-byte rows, then the (N, H, W, C padded) copy.
//   ZooShapes                 every plain convolution of every config in configs/ at its batch
//                             size: the dispatch's size equals the kernel's own, BF16 never needs
//                             more than TF32, and a conv layer's scratch_floats (what the Network
//                             allocates) covers each pass it runs: wgmma-nhwc's forward and
//                             (when asked for) input gradient; algo auto needs none until it
//                             tunes, and tune_scratch_floats then covers wgmma-nhwc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "kernels/conv/conv2d.h"
#include "kernels/conv/conv2d_nhwc_scratch.h"
#include "layers/layer.h"
#include "layers/network.h"
#include "runtime/error.h"
#include "tests/nhwc_dispatch_rule.h"
#include "tests/test_util.h"

using namespace cnn;

namespace {

Exec exec_on(Device dev, Precision p) {
  Exec ex;
  ex.device = dev;
  ex.precision = p;
  return ex;
}

Conv2dShape shape(int n, int c, int h, int w, int oc, int k, int stride, int pad) {
  Conv2dShape s;
  s.n = n, s.c = c, s.h = h, s.w = w, s.oc = oc, s.kh = k, s.kw = k;
  s.stride_h = s.stride_w = stride;
  s.pad_h = s.pad_w = pad;
  return s;
}

const Algo kAllAlgos[] = {Algo::Auto, Algo::Naive, Algo::Tiled,    Algo::Igemm,
                          Algo::Fast, Algo::Wgmma, Algo::WgmmaNhwc};

// A plain convolution of a network, its input batch set to `batch`.
struct ZooConv {
  std::string where;  // "vgg_cifar.yaml conv3"
  LayerSpec spec;
  Shape in;  // (batch, C, H, W)
  Conv2dShape s;
  bool input_grad = true;  // false for a first layer (nothing before it needs a gradient)
};

std::vector<ZooConv> zoo_convs(std::vector<std::string>* skipped) {
  std::vector<ZooConv> out;
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(test::source_dir() + "/configs"))
    if (e.path().extension() == ".yaml") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    TrainConfig cfg;
    try {
      cfg = load_config(f.string());
    } catch (const Error& e) {
      // An example config over image folders that are not there cannot size its classifier.
      const bool needs_data = std::string(e.what()).find("number of classes") != std::string::npos;
      if (!test::pending_layer_error(e.what()) && !needs_data) throw;
      skipped->push_back(f.filename().string() + ": " + e.what());
      continue;
    }
    NetworkOptions no;
    no.max_batch = 1;  // the shapes only; the batch size is set below
    no.autotune = false;
    const Network net(cfg.model.layers, cfg.model.input_chw, no, Exec{});
    bool first = true;
    for (const auto& l : net.layers()) {
      const LayerSpec& sp = l->spec();
      if (sp.kind != LayerKind::Conv2d) continue;
      const bool was_first = first;
      first = false;
      if (sp.groups != 1 || sp.dil_h != 1 || sp.dil_w != 1) continue;  // never wgmma-nhwc
      ZooConv z;
      z.where = f.filename().string() + " " + sp.name;
      z.spec = sp;
      z.in = l->in_shape();
      z.in[0] = cfg.training.batch_size;
      z.s.n = int(z.in[0]), z.s.c = int(z.in[1]), z.s.h = int(z.in[2]), z.s.w = int(z.in[3]);
      z.s.oc = sp.out_channels, z.s.kh = sp.kernel_h, z.s.kw = sp.kernel_w;
      z.s.stride_h = sp.stride_h, z.s.stride_w = sp.stride_w;
      z.s.pad_h = sp.pad_h, z.s.pad_w = sp.pad_w;
      // The network's first convolution reads the image (no gradient wanted) where nothing with
      // parameters comes before it, which is how every config here begins.
      z.input_grad = !was_first;
      out.push_back(z);
    }
  }
  return out;
}

}  // namespace

TEST(ConvNhwcScratch, NoScratchWhereNoneIsUsed) {
  const Conv2dShape s = shape(3, 17, 13, 11, 24, 3, 1, 1);
  const Conv2dShape s2 = shape(3, 17, 13, 11, 24, 3, 2, 1);
  for (Precision p : {Precision::FP32, Precision::TF32, Precision::BF16})
    for (Algo a : kAllAlgos) {
      SCOPED_TRACE(std::string(algo_name(a)) + " " + precision_name(p));
      const Exec cpu = exec_on(Device::CPU, p), cuda = exec_on(Device::CUDA, p);
      EXPECT_EQ(conv2d_forward_scratch_floats(s, a, cpu), 0u);
      EXPECT_EQ(conv2d_backward_data_scratch_floats(s, a, cpu), 0u);
      const bool used = a == Algo::WgmmaNhwc;  // every precision (FP32 as 3xTF32)
      EXPECT_EQ(conv2d_forward_scratch_floats(s, a, cuda) > 0, used);
      EXPECT_EQ(conv2d_forward_scratch_floats(s2, a, cuda) > 0, used);
      EXPECT_EQ(conv2d_backward_data_scratch_floats(s, a, cuda) > 0, used);
      // Stride 2: its phases read the stride-1 view's copy and pack, of the same size, where the
      // dispatch takes them (CNN_WGMMA_NHWC_PHASES=1).
      EXPECT_EQ(conv2d_backward_data_scratch_floats(s2, a, cuda) > 0,
                used && test::nhwc_dispatch_takes_input_gradient(s2));
      Conv2dShape s2_dilated = s2;  // refused: a strided input gradient with dilation
      s2_dilated.dil_h = s2_dilated.dil_w = 2;
      if (a == Algo::WgmmaNhwc) {
        EXPECT_EQ(conv2d_backward_data_scratch_floats(s2_dilated, a, cuda), 0u);
      }
    }
  // A bad shape is named, as by the ops.
  Conv2dShape bad = s;
  bad.kh = 20;
  EXPECT_THROW(
      conv2d_forward_scratch_floats(bad, Algo::WgmmaNhwc, exec_on(Device::CUDA, Precision::TF32)),
      Error);
}

TEST(ConvNhwcScratch, LayoutMatchesTheCopies) {
  for (const Conv2dShape& s :
       {shape(1, 1, 7, 7, 8, 1, 1, 0), shape(3, 17, 13, 11, 24, 3, 1, 1),
        shape(2, 130, 33, 32, 200, 5, 2, 2), shape(4, 64, 8, 8, 64, 3, 1, 1)})
    for (Precision p : {Precision::FP32, Precision::TF32, Precision::BF16}) {
      const int64_t block = p == Precision::BF16 ? 64 : 32, bytes = p == Precision::BF16 ? 2 : 4;
      const int64_t row = 128 / bytes;                     // elements of one 128-byte row
      // 3xTF32: the weights' two TF32 parts, and two copies (x split at two blocks an SM).
      const int64_t packs = p == Precision::FP32 ? 2 : 1;
      const auto pad = [](int64_t v, int64_t to) { return (v + to - 1) / to * to; };
      const int64_t taps = int64_t(s.kh) * s.kw;
      // Forward: weights (OC, taps, C padded), copy of x (N, H, W, C padded).
      const int64_t fwd = packs * pad(s.oc * taps * pad(s.c, block), row) +
                          packs * int64_t(s.n) * s.h * s.w * pad(s.c, block);
      EXPECT_EQ(conv2d_forward_wgmma_nhwc_scratch_floats(s, p), size_t(pad(fwd * bytes, 4) / 4))
          << precision_name(p) << " c" << s.c << " oc" << s.oc;
      // Input gradient: weights (C, taps, OC padded), copy of dy (N, OH, OW, OC padded).
      const int64_t bwd = packs * pad(s.c * taps * pad(s.oc, block), row) +
                          packs * int64_t(s.n) * s.oh() * s.ow() * pad(s.oc, block);
      EXPECT_EQ(conv2d_backward_data_wgmma_nhwc_scratch_floats(s, p),
                size_t(pad(bwd * bytes, 4) / 4))
          << precision_name(p) << " c" << s.c << " oc" << s.oc;
    }
}

TEST(ConvNhwcScratch, ZooShapes) {
  std::vector<std::string> skipped;
  const std::vector<ZooConv> convs = zoo_convs(&skipped);
  for (const std::string& s : skipped) std::printf("skipped %s\n", s.c_str());
  ASSERT_GE(convs.size(), 10u) << "expected the zoo's convolutions";
  for (const ZooConv& z : convs) {
    SCOPED_TRACE(z.where);
    for (Precision p : {Precision::FP32, Precision::TF32, Precision::BF16}) {
      SCOPED_TRACE(precision_name(p));
      // Not deterministic: the weight gradient's scratch is only the TMA-box loader's copies of
      // x (0 without CUDA in the build), which the layer's one scratch covers too.
      const Exec ex = exec_on(Device::CUDA, p);
      const size_t dw = conv2d_backward_weight_scratch_floats(z.s, ex);
      const size_t fwd = conv2d_forward_wgmma_nhwc_scratch_floats(z.s, p);
      const size_t dx = test::nhwc_dispatch_takes_input_gradient(z.s)
                            ? conv2d_backward_data_wgmma_nhwc_scratch_floats(z.s, p)
                            : 0;
      EXPECT_EQ(conv2d_forward_scratch_floats(z.s, Algo::WgmmaNhwc, ex), fwd);
      EXPECT_EQ(conv2d_backward_data_scratch_floats(z.s, Algo::WgmmaNhwc, ex), dx);
      // FP32's is the largest (a scratch sized for it serves every precision).
      EXPECT_LE(fwd, conv2d_forward_wgmma_nhwc_scratch_floats(z.s, Precision::FP32));
      EXPECT_LE(dx, conv2d_backward_data_wgmma_nhwc_scratch_floats(z.s, Precision::FP32));
      if (p == Precision::BF16) {
        EXPECT_LE(fwd, conv2d_forward_wgmma_nhwc_scratch_floats(z.s, Precision::TF32));
      }
      for (Algo a : {Algo::WgmmaNhwc, Algo::Auto}) {
        SCOPED_TRACE(algo_name(a));
        LayerSpec spec = z.spec;
        spec.algo = a;
        const std::unique_ptr<Layer> layer = make_layer(spec);
        layer->setup(z.in, Device::CUDA);  // shapes only: a conv layer allocates nothing here
        const size_t need = a == Algo::WgmmaNhwc ? std::max(fwd, z.input_grad ? dx : 0) : 0;
        EXPECT_EQ(layer->scratch_floats(ex, z.input_grad), std::max(need, dw));
        EXPECT_EQ(layer->tune_scratch_floats(ex, z.input_grad),
                  std::max({fwd, z.input_grad ? dx : 0, dw}));
        // A batch below the setup batch (a partial last batch) never needs more.
        Conv2dShape smaller = z.s;
        smaller.n = std::max(1, z.s.n / 3);
        EXPECT_LE(conv2d_forward_scratch_floats(smaller, a, ex), need);
      }
    }
  }
}
