#pragma once
// `./bench --depthwise`: the seed article's depthwise-convolution table. Shapes 1x64x32x32,
// 1x64x128x128, 8x64x128x128 and 1x256x128x128 with a 3x3 kernel, stride 1, pad 1, plus the
// article's motivating 12-channel 5x5 case (8x12x64x64); FP32; forward, input gradient and
// weight gradient; rows naive, tiled, fast, the fast variant's kernels one by one (fast:tile,
// fast:rows, fast:stream, and where stream is the pick its strips of 4, 8, 16 and 32 rows per
// thread, fast:stream r4 .. r32), ours-best and cuDNN (groups = C), with P50, P95 and the HBM
// floor (bytes moved / 4.8 TB/s).
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

// The table's defaults unless --time-budget / --lib-retime-within say otherwise. Its ~200 rows
// at the op rows' 0.25 s each, cuDNN's slow algorithms (many milliseconds a call on these
// shapes) timed in full like the fast ones, took over 80 s on the H200. Rows of our fast
// kernels and cuDNN's best (under ~50 us a launch) still get their 50 samples of 20 launches;
// slower ones get fewer launches per sample and fewer samples, never under 5.
constexpr double kDepthwiseRowBudgetS = 0.05;
constexpr double kDepthwiseLibRetimeWithin = 4;  // cudnnFind once ranked one 1.7x off

// The seed's table from bench_depthwise's rows: aligned text, or Markdown; its note says how
// the rows were timed (opt) and how long the table took.
std::string format_depthwise(const std::vector<BenchRow>& rows, const BenchOptions& opt,
                             double seconds, bool markdown);

}  // namespace cnn::bench
