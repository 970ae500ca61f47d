#pragma once
// How one op call executes: where, on which stream, at which precision, and whether reductions
// must be bitwise repeatable. Passed explicitly to every kernel API; no globals.
#include <cstdint>
#include <string>

#include "runtime/device.h"
#include "runtime/stream.h"

namespace cnn {

// The multiply precision of the tensor-core passes (conv forward / input gradient / weight
// gradient on igemm, the linear layer's GEMM tiles): FP32 FFMA, TF32 or BF16 operands on
// mma.sync, FP32 accumulation in every case. Storage, weights and optimizer stay FP32.
enum class Precision { FP32, TF32, BF16 };

// How Precision::FP32 multiplies where a kernel offers both: Ffma on the CUDA cores, or Tf32x3
// on the tensor cores (each operand split into two TF32 parts, three MMAs a product, FP32
// accumulation: FP32 accuracy). The conv and linear layers' algo igemm keeps FFMA, fast and auto
// take 3xTF32 where a kernel has it; autotune weighs the two per pass.
enum class Fp32Math { Ffma, Tf32x3 };

// Kernel variant. Each op supports a subset; Auto picks (and may time) the best one.
// WgmmaNhwc: the Hopper convolution with TMA im2col on a channels-last copy (forward, stride-1
// input gradient; its weight gradient is wgmma's).
enum class Algo { Auto, Naive, Tiled, Igemm, Fast, Wgmma, WgmmaNhwc };

const char* algo_name(Algo a);
Algo parse_algo(const std::string& s);  // throws naming the value and the allowed ones
const char* precision_name(Precision p);
Precision parse_precision(const std::string& s);

struct Exec {
  Device device = Device::CPU;
  cudaStream_t stream = nullptr;
  Precision precision = Precision::FP32;
  bool deterministic = false;  // fixed-order reductions instead of atomicAdd
  // Kernels with a thread-block-cluster form (TMA multicast: the TF32 wgmma weight gradient's
  // boxed loads) may take it. A layer turns it off for its own pass where the whole backward
  // pass measured faster without (Network::check_backward); CNN_WGMMA_WGRAD_MULTICAST=0 turns it
  // off everywhere.
  bool clusters = true;
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
