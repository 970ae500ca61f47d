#pragma once
// `./bench --depthwise`: the seed article's depthwise-convolution table. Shapes 1x64x32x32,
// 1x64x128x128, 8x64x128x128 and 1x256x128x128 with a 3x3 kernel, stride 1, pad 1, plus the
// article's motivating 12-channel 5x5 case (8x12x64x64); FP32; forward, input gradient and
// weight gradient; rows naive, tiled, fast, ours-best and cuDNN (groups = C), with P50, P95 and
// the HBM floor (bytes moved / 4.8 TB/s).
#include <string>
#include <vector>

#include "app/bench/bench_common.h"

namespace cnn::bench {

struct DepthwiseCase {
  std::string name;  // op prefix, e.g. "dw3x3_1x64x32x32" (the --ops filter matches it)
  int n, c, h, w, k;
};
const std::vector<DepthwiseCase>& depthwise_cases();

// Measures every case (bench_ops.cpp: the same validation and timing as the network's ops).
std::vector<BenchRow> bench_depthwise(const BenchContext& ctx);

// The seed's table from bench_depthwise's rows: aligned text, or Markdown.
std::string format_depthwise(const std::vector<BenchRow>& rows, bool markdown);

}  // namespace cnn::bench
