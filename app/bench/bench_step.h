#pragma once
// Whole-step mode of ./bench: the Network of the config at each batch size and precision runs
// forward + backward + optimizer update on random data already on the GPU, timed as plain
// launches and as one captured CUDA graph per step.
#include <cstdint>
#include <vector>

#include "app/bench/bench_common.h"

namespace cnn::bench {

// FLOPs of one trained image: forward, input gradient and weight gradient of every conv and
// linear layer (multiply-add = 2), without the input gradient of the first layer, which the
// Network does not compute. The reference network: 82 MFLOP.
double trained_flops_per_image(const NetDesc& net);

std::vector<BenchRow> bench_steps(const BenchContext& ctx, const NetDesc& net);

}  // namespace cnn::bench
