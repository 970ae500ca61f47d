#pragma once
// The one place that knows whether this build has CUDA. An op's dispatch reads
//
//   if (ex.device == Device::CPU) return relu_forward_cpu(count, x, y);
//   CNN_CUDA_BRANCH("relu_forward", relu_forward_cuda(count, x, y, ex.stream));
//
// In a build with CUDA the branch runs its statements (a braced block may hold several, and may
// return). In a CPU-only build the CUDA launchers are not compiled: the statements go into a lambda
// that is never called (so they still count as using the op's arguments, and no launcher symbol is
// ever emitted or linked) and the call fails with one line naming the op. The launchers' headers
// (<op>_cuda.h) compile in both builds and are included unconditionally.
#include "runtime/error.h"

#ifdef CNN_HAVE_CUDA
#define CNN_CUDA_BRANCH(op, ...) \
  do {                           \
    __VA_ARGS__;                 \
  } while (0)
#else
#define CNN_CUDA_BRANCH(op, ...)                                     \
  do {                                                               \
    (void)[&] {                                                      \
      __VA_ARGS__;                                                   \
    };                                                               \
    CNN_FAIL("{} on cuda: this program was built without CUDA", op); \
  } while (0)
#endif

namespace cnn {

// For values only a CUDA build can compute (scratch sizes of CUDA-only variants): `value` with
// CUDA, `fallback` without, written as CNN_CUDA_VALUE(expr, fallback).
#ifdef CNN_HAVE_CUDA
#define CNN_CUDA_VALUE(value, fallback) (value)
#else
#define CNN_CUDA_VALUE(value, fallback) (fallback)
#endif

}  // namespace cnn
