#pragma once
// Inference mode of ./bench (--infer): the config's network forward only (eval mode, no loss) on
// random images already on the GPU, one forward per CUDA-graph replay, at each batch size in
// FP32, TF32 and BF16 (Network) and int8 (Int8Network on a model quantized in the bench, on
// random calibration images: the speed does not depend on the values), on the tensor-core int8
// kernel and on the direct dp4a one (each first checked bit for bit against the CPU twin on 8
// images); then every int8 stage alone at the largest batch, both kernels; then every
// conv/linear stage's faster int8 kernel next to the same pass of the float network (BatchNorm
// folded, autotuned, in FP32 and in TF32: the layer's forward with the ReLU and pool the int8
// pass fuses, as the whole forward runs them), the ratio answering "int8 >= 1.5x our fastest
// float kernel of the same pass". Rows are images/s; a network int8 cannot run gets a row
// without a number whose note names the layer.
#include <string>
#include <vector>

#include "app/bench/bench_common.h"

namespace cnn::bench {

struct InferRow {
  std::string what;  // "fp32", "int8 tensor cores", "conv2 int8 (direct)", ...
  int batch = 0;
  double median_us = kNaN, p95_us = kNaN;
  double images_per_s = kNaN;
  std::string note;  // why there is no number, or the graph fallback
  // A per-pass comparison row (what = the stage, median/p95 = the faster int8 kernel's): the
  // float network's same pass in FP32 and TF32, medians in microseconds.
  bool vs_float = false;
  double fp32_us = kNaN, tf32_us = kNaN;
};

// The speed-up of a comparison row over the faster float precision (min of FP32, TF32 over the
// int8 time; NaN when a time is missing) and whether it meets the goal.
constexpr double kInt8GoalSpeedup = 1.5;
double int8_speedup_over_float(const InferRow& r);

std::vector<InferRow> bench_infer(const BenchContext& ctx, const NetDesc& net,
                                  const std::vector<int>& batches);

// One Markdown table: the network rows (images/s, one column per batch size), the int8 stage
// rows (microseconds at the largest batch) and the per-pass int8-vs-float rows.
std::string format_infer_markdown(const std::vector<std::string>& header,
                                  const std::vector<InferRow>& rows,
                                  const std::vector<int>& batches);

// One line per row: what,batch,median_us,p95_us,images_per_s,note (scripts/bench_infer.sh).
std::string format_infer_csv(const std::vector<InferRow>& rows);

}  // namespace cnn::bench
