#pragma once
// CNN_CUDA_CHECK(expr): throws cnn::Error naming file:line, the expression and CUDA's message.
// With CNN_SYNC_CHECK=1 in the environment, CNN_LAUNCH_CHECK() also synchronizes so that an
// asynchronous fault is reported by the launch that caused it.
#include <cuda_runtime_api.h>

#include "runtime/error.h"

namespace cnn {
bool sync_check_enabled();  // CNN_SYNC_CHECK (runtime/env_switches.h)
}

#define CNN_CUDA_CHECK(expr)                                                                     \
  do {                                                                                           \
    cudaError_t cnn_err_ = (expr);                                                               \
    if (cnn_err_ != cudaSuccess)                                                                 \
      throw ::cnn::Error(::fmt::format("CUDA error at {}:{}: {} failed: {}", __FILE__, __LINE__, \
                                       #expr, cudaGetErrorString(cnn_err_)));                    \
  } while (0)

// After every kernel launch: checks the launch, and in debug mode waits for the kernel.
#define CNN_LAUNCH_CHECK(name)                                                                \
  do {                                                                                        \
    cudaError_t cnn_err_ = cudaGetLastError();                                                \
    if (cnn_err_ == cudaSuccess && ::cnn::sync_check_enabled())                               \
      cnn_err_ = cudaDeviceSynchronize();                                                     \
    if (cnn_err_ != cudaSuccess)                                                              \
      throw ::cnn::Error(::fmt::format("CUDA error in kernel {} ({}:{}): {}", name, __FILE__, \
                                       __LINE__, cudaGetErrorString(cnn_err_)));              \
  } while (0)
