#pragma once
// How one op call executes: where, on which stream, at which precision, and whether reductions
// must be bitwise repeatable. Passed explicitly to every kernel API; no globals.
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
};

}  // namespace cnn
