#include "app/bench/bench_common.h"

namespace cnn::bench {

void fill_rate(BenchRow& r, Precision p) {
  if (!(r.median_us > 0)) return;
  if (r.compute_bound) {
    r.rate = r.flops / (r.median_us * 1e6);  // TFLOP/s
    r.peak_frac = r.rate / (p == Precision::FP32   ? kPeakFp32Tflops
                            : p == Precision::TF32 ? kPeakTf32Tflops
                                                   : kPeakBf16Tflops);
  } else {
    r.rate = r.bytes / (r.median_us * 1e3);  // GB/s
    r.peak_frac = r.rate / kPeakHbmGBps;
  }
}

NetDesc reference_net() {
  NetDesc n;
  n.source = "built-in reference network (configs/mnist.yaml)";
  n.input_chw = {1, 28, 28};
  n.specs = conv_net_specs();
  n.optimizer.type = OptimizerType::Sgd;
  n.optimizer.lr = 0.05;
  n.optimizer.momentum = 0.9;
  return n;
}

}  // namespace cnn::bench
