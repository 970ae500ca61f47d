#pragma once
// The tile configurations of the wgmma-nhwc convolution (conv2d_wgmma_nhwc.cu's NhwcPlan), shared
// by its TF32 and BF16 tests so that each runs every compiled instance.
#include <algorithm>
#include <vector>

#include "kernels/conv/conv2d_halo_layout.h"
#include "kernels/conv/conv2d_nhwc_layout.h"
#include "kernels/conv/conv2d_wgmma_nhwc.h"
#include "tests/conv_test_cases.h"
#include "tests/nhwc_dispatch_rule.h"

namespace cnn::conv_test {

// The residencies each tile width compiles for: 32-column tiles at one, two and three blocks an
// SM, 64-column at one and two, 128-column at one.
inline int max_blocks_per_sm(int block_n) {
  return block_n == 32 ? 3 : block_n == 64 ? 2 : 1;
}

// Under split-K every residency runs once: two blocks an SM at 2 splits, three at 4 and 8.
inline int split_k_blocks_per_sm(int block_n, int splits) {
  if (splits == 2) return std::min(2, max_blocks_per_sm(block_n));
  if (splits >= 4) return std::min(3, max_blocks_per_sm(block_n));
  return 1;
}

// Whether Algo::WgmmaNhwc's dispatch (conv2d_forward / conv2d_backward_data) takes `pass` of s.
inline bool nhwc_dispatch_takes(Pass pass, const Conv2dShape& s) {
  return pass == Pass::Forward || test::nhwc_dispatch_takes_input_gradient(s);
}

// The configurations a test runs at `precision` (TF32 or BF16) on `pass` of shape s, A loaded by
// im2col copies: splits 0 (picked): every (block_n, blocks_per_sm, block_m) instance, the
// 128-row tile at each width and residency and the 256 x 128 tile (one block an SM). splits > 0:
// each width at the residency split_k_blocks_per_sm gives, and the 256 x 128 tile. Then, where
// the pass's GEMM view is a shape the halo tile runs (halo_refusal), the halo tile at each width
// with 128 rows, and with 256 at widths 32 and 64.
inline std::vector<WgmmaNhwcOptions> nhwc_tile_configs(Precision precision, Pass pass,
                                                       const Conv2dShape& s, int splits = 0) {
  std::vector<WgmmaNhwcOptions> configs;
  const Conv2dShape view = pass == Pass::Forward ? s : backward_data_as_forward(s);
  // A strided input gradient runs as phases, which load A by im2col copies only.
  const bool phased = pass != Pass::Forward && (s.stride_h != 1 || s.stride_w != 1);
  for (int rows : {128, 256})
    if (!phased && halo_refusal(view, rows).empty())
      for (int bn : {32, 64, 128}) {
        if (rows == 256 && bn == 128) continue;
        WgmmaNhwcOptions o;
        o.block_n = bn;
        o.block_m = rows;
        o.splits = splits;
        o.precision = precision;
        o.a_load = NhwcALoad::Halo;
        configs.push_back(o);
      }
  for (int bn : {32, 64, 128}) {
    WgmmaNhwcOptions o;
    o.block_n = bn;
    o.splits = splits;
    o.precision = precision;
    o.a_load = NhwcALoad::Im2col;
    o.block_m = 128;
    const int first = splits ? split_k_blocks_per_sm(bn, splits) : 1;
    const int last = splits ? first : max_blocks_per_sm(bn);
    for (int per_sm = first; per_sm <= last; ++per_sm) {
      o.blocks_per_sm = per_sm;
      configs.push_back(o);
    }
    if (bn == 128) {
      o.blocks_per_sm = 1;
      o.block_m = 256;
      configs.push_back(o);
    }
  }
  return configs;
}

}  // namespace cnn::conv_test
