#pragma once
// The yardstick: cuDNN and cuBLAS calls on the same shapes as our kernels. Both libraries are
// opened at run time (dlopen, found through LD_LIBRARY_PATH), so ./bench runs without them and
// says why the library columns are empty. Only ./bench uses this; train/infer never link them.
#include <cstdint>
#include <limits>
#include <memory>
#include <string>

#include "kernels/conv/conv2d.h"
#include "runtime/exec.h"
#include "kernels/gemm/linear.h"
#include "kernels/pool/maxpool.h"
#include "runtime/stream.h"

namespace cnn::bench {

enum class Pass { Forward, BackwardData, BackwardWeight };
const char* pass_name(Pass p);  // "fwd", "dgrad", "wgrad"

// Device pointers of one library call. Which role is which, per op:
//   conv/linear fwd:   a = x,  b = w,  out = y               (no bias: ours runs without too)
//   conv/linear dgrad: a = dy, b = w,  out = dx
//   conv/linear wgrad: a = x,  b = dy, out = dw (ACCUMULATES, beta = 1, as ours does; no db)
//   relu fwd / maxpool fwd: a = x, out = y
//   relu bwd / maxpool bwd: a = y, b = dy, c = x, out = dx
struct LibArgs {
  const float* a = nullptr;
  const float* b = nullptr;
  const float* c = nullptr;
  float* out = nullptr;
};

// One prepared library call (descriptors made, algorithm chosen, workspace bound).
class LibOp {
 public:
  virtual ~LibOp() = default;
  virtual void run(const LibArgs& args) = 0;  // enqueues once on the library's stream
  virtual std::string describe() const = 0;   // "cudnn IMPLICIT_PRECOMP_GEMM (fma)"
  // A call with several algorithms (cuDNN's convolutions) offers them all, so that the bench
  // checks and times each its own way and keeps the fastest correct one: cudnnFind's one-shot
  // timings once put an algorithm 1.7x slower than the best first. use_algo(i) switches run()
  // and describe() to algorithm i (0: the one Find ranked first).
  virtual int algo_count() const { return 1; }
  virtual void use_algo(int /*i*/) {}
  // Algorithm i's time by the library's own search (cudnnFind), microseconds; NaN where none.
  virtual double find_us(int /*i*/) const { return std::numeric_limits<double>::quiet_NaN(); }
};

class Library {
 public:
  // Opens what it can and never throws for a missing or broken library: *_ok() say what works
  // and *_status() why not. Everything runs on `stream`.
  explicit Library(cudaStream_t stream);
  ~Library();
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;

  bool cudnn_ok() const;
  bool cublas_ok() const;
  std::string cudnn_status() const;  // "cuDNN 9.19.0 (libcudnn.so.9)" or why it is missing
  std::string cublas_status() const;

  // Each throws cnn::Error naming the library call and its status on failure. The conv offers
  // every algorithm that cudnnFind*AlgorithmEx runs successfully on `find` (buffers of the right
  // sizes; their output is overwritten), starting on the one Find ranks first. Math: FP32 = CUDNN_FMA_MATH / CUBLAS_DEFAULT_MATH (no
  // tensor cores, as PyTorch with allow_tf32 off); TF32 = CUDNN_DEFAULT_MATH (TF32 allowed, as
  // PyTorch with allow_tf32 on) / CUBLAS_TF32_TENSOR_OP_MATH.
  // groups > 1: a grouped convolution (cudnnSetConvolutionGroupCount), weights (OC, C/groups,
  // KH, KW); groups == C is depthwise.
  std::unique_ptr<LibOp> conv(const Conv2dShape& s, Pass pass, Precision p, const LibArgs& find,
                              int groups = 1);
  std::unique_ptr<LibOp> gemm(const LinearShape& s, Pass pass, Precision p);
  std::unique_ptr<LibOp> relu(int n, int c, int h, int w, bool backward);
  std::unique_ptr<LibOp> maxpool(const MaxPoolShape& s, bool backward);

  // A plain cublasSgemm of m x n x k on caller buffers (column-major, no transposes), for the
  // measured matrix-multiply ceiling.
  void sgemm(int m, int n, int k, const float* a, const float* b, float* c, Precision p);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace cnn::bench
