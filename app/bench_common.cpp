#include "app/bench_common.h"

namespace cnn::bench {

void fill_rate(BenchRow& r, Precision p) {
  if (!(r.median_us > 0)) return;
  if (r.compute_bound) {
    r.rate = r.flops / (r.median_us * 1e6);  // TFLOP/s
    r.peak_frac = r.rate / (p == Precision::FP32 ? kPeakFp32Tflops : kPeakTf32Tflops);
  } else {
    r.rate = r.bytes / (r.median_us * 1e3);  // GB/s
    r.peak_frac = r.rate / kPeakHbmGBps;
  }
}

namespace {

LayerSpec layer(LayerKind k, const std::string& name) {
  LayerSpec s;
  s.kind = k;
  s.name = name;
  return s;
}

LayerSpec conv(const std::string& name, int oc, int k, int pad) {
  LayerSpec s = layer(LayerKind::Conv2d, name);
  s.out_channels = oc;
  s.kernel_h = s.kernel_w = k;
  s.pad_h = s.pad_w = pad;
  return s;
}

LayerSpec pool(const std::string& name, int k) {
  LayerSpec s = layer(LayerKind::MaxPool2d, name);
  s.kernel_h = s.kernel_w = k;
  s.stride_h = s.stride_w = k;
  return s;
}

LayerSpec linear(const std::string& name, int out) {
  LayerSpec s = layer(LayerKind::Linear, name);
  s.out_features = out;
  return s;
}

}  // namespace

NetDesc reference_net() {
  NetDesc n;
  n.source = "built-in reference network (configs/mnist.yaml)";
  n.input_chw = {1, 28, 28};
  n.specs = {conv("conv1", 32, 5, 2),
             layer(LayerKind::Relu, "relu1"),
             pool("pool1", 2),
             conv("conv2", 64, 5, 2),
             layer(LayerKind::Relu, "relu2"),
             pool("pool2", 2),
             layer(LayerKind::Flatten, "flatten1"),
             linear("fc1", 1024),
             layer(LayerKind::Relu, "relu3"),
             linear("fc2", 10),
             layer(LayerKind::SoftmaxCrossEntropy, "loss")};
  n.optimizer.type = OptimizerType::Sgd;
  n.optimizer.lr = 0.05;
  n.optimizer.momentum = 0.9;
  return n;
}

}  // namespace cnn::bench
