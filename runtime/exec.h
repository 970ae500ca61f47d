#pragma once
// How one op call executes: where, on which stream, at which precision, and whether reductions
// must be bitwise repeatable. Passed explicitly to every kernel API; no globals.
#include <cstdint>
#include <string>

#include "runtime/device.h"
#include "runtime/stream.h"

namespace cnn {

enum class Precision { FP32, TF32 };

// Kernel variant. Each op supports a subset; Auto picks (and may time) the best one.
enum class Algo { Auto, Naive, Tiled, Igemm, Fast };

const char* algo_name(Algo a);
Algo parse_algo(const std::string& s);  // throws naming the value and the allowed ones
const char* precision_name(Precision p);
Precision parse_precision(const std::string& s);

struct Exec {
  Device device = Device::CPU;
  cudaStream_t stream = nullptr;
  Precision precision = Precision::FP32;
  bool deterministic = false;  // fixed-order reductions instead of atomicAdd
  // Training-mode forward (batch statistics in batchnorm, dropout masks); eval otherwise. Set by
  // the Network for the passes that train, so that layers nested in other layers see it too.
  bool training = false;
  // The run's seed and a step counter in memory of `device` (the trainer's, advanced by the
  // step's last launch, so a captured CUDA graph sees it move): dropout draws its mask from
  // them. Null reads as step 0.
  uint64_t seed = 0;
  const int64_t* step = nullptr;
};

}  // namespace cnn
