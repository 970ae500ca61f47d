#pragma once
// How the one-launch BatchNorm training passes (batchnorm_one_pass.cu) cut a channel: a
// thread-block cluster of `cluster` blocks of kBnOnePassThreads threads owns the channel, each
// thread holding `per_thread` of its M = N * HW values in registers from the load to the write.
// Plain C++ (no CUDA), so that the CPU suite checks the choice.
#include <cstdint>

#include "kernels/norm/batchnorm.h"

namespace cnn {

constexpr int kBnOnePassThreads = 256;
// Blocks of a cluster: 8 is the portable limit, 16 needs the non-portable attribute (sm_90).
constexpr int kBnOnePassMaxCluster = 16;
// The values a thread holds, one kernel instance each (groups of 4 consecutive values).
constexpr int kBnOnePassPerThread[] = {4, 8, 16, 32};
constexpr int kBnOnePassMaxPerThread = 32;
// The most values of a channel that one cluster holds: past it the three-launch passes run.
constexpr int64_t kBnOnePassMaxValues =
    int64_t(kBnOnePassMaxCluster) * kBnOnePassThreads * kBnOnePassMaxPerThread;
// Blocks of 256 threads that are resident at once on an H200 (132 SMs, 8 each): among plans of
// equal waste, the most blocks that still fit one such wave.
constexpr int64_t kBnOnePassWaveBlocks = 132 * 8;
// The grid's y extent: one row of clusters per channel.
constexpr int kBnOnePassMaxChannels = 65535;

struct BatchNormOnePassPlan {
  bool fits = false;   // false: M or C past the limits above; the three-launch passes run
  int cluster = 0;     // R: blocks per channel, 1..kBnOnePassMaxCluster
  int per_thread = 0;  // V: one of kBnOnePassPerThread
  int64_t slots() const { return int64_t(cluster) * kBnOnePassThreads * per_thread; }
};

// The plan for a training pass over s: the fewest register slots R * threads * V >= M (the
// least waste; R the fewest blocks for its V); among equal waste, the smallest V whose grid
// (C * R blocks) fits one wave, else the largest V (the fewest blocks).
BatchNormOnePassPlan plan_batchnorm_one_pass(const BatchNormShape& s);

}  // namespace cnn
