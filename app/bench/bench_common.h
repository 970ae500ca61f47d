#pragma once
// What the parts of ./bench share: its options, the device facts it reports against, and one row
// of results (an op variant, a library call or a whole training step).
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "layers/layer_spec.h"
#include "layers/optim_options.h"
#include "runtime/exec.h"
#include "runtime/stream.h"
#include "runtime/tensor.h"

namespace cnn::bench {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Datasheet peaks of the H200 SXM, the card the results are claimed on. Fractions of peak are
// against these (printed in the header); the measured ceilings are printed beside them.
constexpr double kPeakFp32Tflops = 67.0;
constexpr double kPeakTf32Tflops = 495.0;  // dense
constexpr double kPeakBf16Tflops = 989.0;  // dense
constexpr double kPeakHbmGBps = 4800.0;

// Validation: worst |ours - ref| / max|ref| over the output, against the float64-accumulating CPU
// reference. FP32 sums of a few thousand terms land near 1e-6; TF32 rounds every operand to a
// 10-bit mantissa and lands near 1e-3; BF16 keeps 7 stored bits (2^-8 relative per operand, 8x
// TF32's 2^-11) and lands near 8e-3. Element-wise ops must be exact up to float rounding.
constexpr double kTolFp32 = 1e-4;
constexpr double kTolTf32 = 1e-2;
constexpr double kTolBf16 = 4e-2;
constexpr double kTolElementwise = 1e-5;

struct BenchOptions {
  std::string config;  // empty: the reference network of configs/mnist.yaml
  int batch = 128;     // op mode
  std::vector<Precision> precisions = {Precision::FP32, Precision::TF32};
  std::vector<std::string> ops;  // filters (substring of the op name); empty = all
  std::vector<Algo> algos = {Algo::Naive, Algo::Tiled,     Algo::Igemm, Algo::Fast,
                             Algo::Wgmma, Algo::WgmmaNhwc, Algo::Auto};
  int repeats = 50;   // graph replays (timing samples) per op
  int launches = 20;  // launches captured per graph
  int warmup = 3;     // plain rounds of `launches` before capture
  // Op rows: seconds the timed samples of one row may take (TimerOptions::budget_s); 0 = always
  // `repeats` x `launches`. Slow rows (naive kernels on large shapes) keep >= 5 samples.
  double budget_s = 0.25;
  // Library calls with several algorithms (cuDNN's convolutions): > 0 checks and times only
  // those that the library's own search timed within this factor of its fastest (the others are
  // listed with that time, and timed only when none of the first is correct); 0 = every one.
  double lib_retime_within = 0;
  int rotate = -1;  // input sets to rotate among; -1 = enough to exceed 2x L2
  bool run_ops = true;
  bool run_step = true;
  bool depthwise = false;  // --depthwise: only the seed article's depthwise-convolution table
  std::vector<int> step_batches = {64, 128, 512};
  bool infer = false;  // --infer: only the inference table (bench_infer.h)
  std::vector<int> infer_batches = {1, 32, 256};
  int step_repeats = 200;
  bool use_library = true;     // cuDNN / cuBLAS yardstick
  bool measure_peaks = true;   // copy bandwidth and SGEMM rate, once
  bool deterministic = false;  // Exec::deterministic for our kernels
  // Step mode: time every batch size with atomicAdd reductions and deterministic ones, and note
  // the deterministic step's cost relative to the atomicAdd one.
  bool compare_deterministic = false;
  bool algo_override = false;  // step mode: every conv/linear layer runs `step_algo`
  Algo step_algo = Algo::Auto;
  uint64_t seed = 1234;
  std::string markdown, csv;
};

// Facts about the GPU that the rotation and the header need.
struct DeviceFacts {
  std::string name;
  int sm_count = 0;
  int l2_bytes = 0;
  double mem_gib = 0;
  int cc_major = 0, cc_minor = 0;
  int driver_version = 0, runtime_version = 0;
};

// Ceilings measured once at start-up (0 when not measured).
struct MeasuredPeaks {
  double copy_GBps = 0;  // device-to-device copy, bytes read + written
  double sgemm_fp32_tflops = 0;
  double sgemm_tf32_tflops = 0;
};

struct BenchRow {
  std::string section;    // "op" | "step"
  std::string op;         // "conv2.fwd", "relu1.bwd", "sgd", "step"
  std::string shape;      // human-readable problem size
  std::string variant;    // our algo name, "cudnn", "cublas", or step mode "graph" / "launches"
  std::string precision;  // "fp32" | "tf32" | "bf16"
  std::string status;     // "ok" | "WRONG" | "n/a" | "error"
  double err = kNaN;      // max |out - ref| / max |ref|
  double median_us = kNaN, p95_us = kNaN;
  double flops = 0, bytes = 0;  // per launch (per step for step rows)
  bool compute_bound = true;    // rate in TFLOP/s, else GB/s
  double rate = kNaN;           // TFLOP/s or GB/s
  double peak_frac = kNaN;
  double lib_us = kNaN;         // the library's median on the same op and precision
  double lib_over_ours = kNaN;  // lib_us / median_us: > 1 means ours is faster
  bool graph = false;           // timed by CUDA graph replay
  int batch = 0;
  double images_per_s = kNaN;  // step rows
  std::string note;

  const char* rate_unit() const { return compute_bound ? "TFLOP/s" : "GB/s"; }
};

class Library;

// The network being measured: from --config, or the reference network of configs/mnist.yaml.
struct NetDesc {
  std::string source;  // the config path, or "built-in reference network"
  std::vector<LayerSpec> specs;
  Shape input_chw;
  OptimizerOptions optimizer;
};

// The reference network (configs/mnist.yaml): conv 5x5 1->32 pad 2, relu, pool 2 | conv 5x5
// 32->64 pad 2, relu, pool 2 | flatten | linear 3136->1024, relu | linear 1024->10 | softmax-xent;
// SGD lr 0.05 momentum 0.9.
NetDesc reference_net();

// What every measurement needs. `lib` is null when the yardstick is off.
struct BenchContext {
  const BenchOptions* opt = nullptr;
  DeviceFacts dev;
  cudaStream_t stream = nullptr;
  Library* lib = nullptr;
};

// Fills rate and peak_frac from median_us, flops/bytes and the precision.
void fill_rate(BenchRow& r, Precision p);

}  // namespace cnn::bench
