// cuDNN and cuBLAS for ./bench, opened with dlopen. The headers give the types and the function
// signatures (decltype of each function); the symbols come from the shared libraries found at run
// time, so nothing here is linked into the binary.
#include "app/bench/bench_cudnn.h"

#include "runtime/error.h"

namespace cnn::bench {

const char* pass_name(Pass p) {
  switch (p) {
    case Pass::Forward:
      return "fwd";
    case Pass::BackwardData:
      return "dgrad";
    case Pass::BackwardWeight:
      return "wgrad";
  }
  return "?";
}

}  // namespace cnn::bench

#if defined(CNN_HAVE_CUDA) && defined(CNN_BENCH_HAVE_CUDNN_H)

#include <cublas_v2.h>
#include <cudnn.h>
#include <dlfcn.h>

#include <array>
#include <cstdlib>
#include <vector>

#include "runtime/cuda_check.h"
#include "runtime/memory.h"

namespace cnn::bench {

namespace {

// Workspace for every cuDNN call, allocated once: cudnnFind*Ex only considers algorithms that fit.
constexpr size_t kCudnnWorkspaceBytes = size_t(512) << 20;
// cuBLAS wants a user workspace so that graph capture never allocates (32 MiB suits Hopper).
constexpr size_t kCublasWorkspaceBytes = size_t(64) << 20;

#define CNN_CUDNN_FUNCTIONS(X)                                                                     \
  X(cudnnGetVersion)                                                                               \
  X(cudnnGetErrorString)                                                                           \
  X(cudnnCreate)                                                                                   \
  X(cudnnDestroy)                                                                                  \
  X(cudnnSetStream)                                                                                \
  X(cudnnCreateTensorDescriptor) X(cudnnSetTensor4dDescriptor) X(cudnnDestroyTensorDescriptor)     \
      X(cudnnCreateFilterDescriptor) X(cudnnSetFilter4dDescriptor) X(cudnnDestroyFilterDescriptor) \
          X(cudnnCreateConvolutionDescriptor) X(cudnnSetConvolution2dDescriptor)                   \
              X(cudnnSetConvolutionMathType) X(cudnnDestroyConvolutionDescriptor)                  \
                  X(cudnnFindConvolutionForwardAlgorithmEx) X(                                     \
                      cudnnFindConvolutionBackwardDataAlgorithmEx)                                 \
                      X(cudnnFindConvolutionBackwardFilterAlgorithmEx) X(cudnnConvolutionForward)  \
                          X(cudnnConvolutionBackwardData) X(cudnnConvolutionBackwardFilter)        \
                              X(cudnnCreateActivationDescriptor) X(cudnnSetActivationDescriptor)   \
                                  X(cudnnDestroyActivationDescriptor) X(cudnnActivationForward)    \
                                      X(cudnnActivationBackward) X(cudnnCreatePoolingDescriptor)   \
                                          X(cudnnSetPooling2dDescriptor)                           \
                                              X(cudnnDestroyPoolingDescriptor)                     \
                                                  X(cudnnPoolingForward) X(cudnnPoolingBackward)   \
                                                      X(cudnnSetConvolutionGroupCount)

#define CNN_CUBLAS_FUNCTIONS(X) \
  X(cublasCreate_v2)            \
  X(cublasDestroy_v2)           \
  X(cublasSetStream_v2)         \
  X(cublasSetMathMode)          \
  X(cublasSetWorkspace_v2) X(cublasSgemm_v2) X(cublasGetVersion_v2) X(cublasGetStatusString)

#define CNN_DECLARE_FN(name) decltype(&::name) name = nullptr;

struct CudnnApi {
  CNN_CUDNN_FUNCTIONS(CNN_DECLARE_FN)
};
struct CublasApi {
  CNN_CUBLAS_FUNCTIONS(CNN_DECLARE_FN)
  // The exported cublasGemmEx; C++ sees an inline overload of the same name besides it (taking a
  // cudaDataType compute type), so its type is spelled out.
  cublasStatus_t (*cublasGemmEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                 int, const void*, const void*, cudaDataType, int, const void*,
                                 cudaDataType, int, const void*, void*, cudaDataType, int,
                                 cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
};

// Opens the first library of `names` that loads (an environment variable may name a path to
// try first). Returns null and says why otherwise.
void* open_library(const char* env, const std::vector<std::string>& names, std::string* loaded,
                   std::string* why) {
  std::vector<std::string> tries;
  if (const char* p = std::getenv(env); p && *p) tries.emplace_back(p);
  tries.insert(tries.end(), names.begin(), names.end());
  std::string errors;
  for (const auto& n : tries) {
    if (void* h = dlopen(n.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      *loaded = n;
      return h;
    }
    const char* e = dlerror();
    errors += (errors.empty() ? "" : "; ") + std::string(e ? e : n + ": dlopen failed");
  }
  *why = errors;
  return nullptr;
}

// Fills every function pointer; returns the first missing symbol's name, or "".
template <class Api>
std::string resolve(void* lib, Api& api);

#define CNN_RESOLVE_FN(name)                                          \
  api.name = reinterpret_cast<decltype(api.name)>(dlsym(lib, #name)); \
  if (!api.name) return #name;

template <>
std::string resolve(void* lib, CudnnApi& api) {
  CNN_CUDNN_FUNCTIONS(CNN_RESOLVE_FN)
  return "";
}
template <>
std::string resolve(void* lib, CublasApi& api) {
  CNN_CUBLAS_FUNCTIONS(CNN_RESOLVE_FN)
  CNN_RESOLVE_FN(cublasGemmEx)
  return "";
}

std::string version_str(size_t v) {
  return fmt::format("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100);
}

const char* math_name(cudnnMathType_t m) {
  switch (m) {
    case CUDNN_DEFAULT_MATH:
      return "default math";
    case CUDNN_TENSOR_OP_MATH:
      return "tensor-op math";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION:
      return "tensor-op math, conversion allowed";
    case CUDNN_FMA_MATH:
      return "fma math";
  }
  return "unknown math";
}

const char* fwd_algo_name(cudnnConvolutionFwdAlgo_t a) {
  static const char* const kNames[] = {
      "IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING",
      "WINOGRAD",      "WINOGRAD_NONFUSED"};
  const int i = static_cast<int>(a);
  return i >= 0 && i < 8 ? kNames[i] : "UNKNOWN";
}
const char* dgrad_algo_name(cudnnConvolutionBwdDataAlgo_t a) {
  static const char* const kNames[] = {"ALGO_0",     "ALGO_1",   "FFT",
                                       "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
  const int i = static_cast<int>(a);
  return i >= 0 && i < 6 ? kNames[i] : "UNKNOWN";
}
const char* wgrad_algo_name(cudnnConvolutionBwdFilterAlgo_t a) {
  static const char* const kNames[] = {
      "ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"};
  const int i = static_cast<int>(a);
  return i >= 0 && i < 7 ? kNames[i] : "UNKNOWN";
}

}  // namespace

struct Library::Impl {
  cudaStream_t stream = nullptr;
  CudnnApi dnn;
  CublasApi blas;
  bool dnn_ok = false, blas_ok = false;
  std::string dnn_status, blas_status;
  cudnnHandle_t dnn_handle = nullptr;
  std::array<cublasHandle_t, 2> blas_handle = {nullptr, nullptr};  // FP32, TF32 math
  Buffer<unsigned char> dnn_ws, blas_ws;

  void dnn_check(cudnnStatus_t st, const char* what) const {
    if (st != CUDNN_STATUS_SUCCESS)
      CNN_FAIL("cuDNN: {} failed: {} (status {})", what, dnn.cudnnGetErrorString(st),
               static_cast<int>(st));
  }
  void blas_check(cublasStatus_t st, const char* what) const {
    if (st != CUBLAS_STATUS_SUCCESS)
      CNN_FAIL("cuBLAS: {} failed: {} (status {})", what, blas.cublasGetStatusString(st),
               static_cast<int>(st));
  }
  const void* dnn_workspace() {
    if (dnn_ws.empty()) dnn_ws = Buffer<unsigned char>(kCudnnWorkspaceBytes, Device::CUDA);
    return dnn_ws.data();
  }

  void open_cudnn();
  void open_cublas();
};

// Every cuDNN / cuBLAS call goes through these, so a failure names the call and the status.
#define CNN_DNN(fn, ...) im.dnn_check(im.dnn.fn(__VA_ARGS__), #fn)
#define CNN_BLAS(fn, ...) im.blas_check(im.blas.fn(__VA_ARGS__), #fn)

void Library::Impl::open_cudnn() {
  auto& im = *this;
  std::string loaded, why;
  void* lib = open_library("CNN_CUDNN_LIBRARY", {"libcudnn.so.9", "libcudnn.so"}, &loaded, &why);
  if (!lib) {
    dnn_status = "cuDNN unavailable (" + why +
                 "); put the folder holding libcudnn.so.9 (e.g. the PyTorch venv's "
                 "nvidia/cudnn/lib) on LD_LIBRARY_PATH";
    return;
  }
  if (std::string missing = resolve(lib, dnn); !missing.empty()) {
    dnn_status = "cuDNN unavailable: " + loaded + " has no symbol " + missing;
    return;
  }
  try {
    CNN_DNN(cudnnCreate, &dnn_handle);
    CNN_DNN(cudnnSetStream, dnn_handle, stream);
  } catch (const Error& e) {
    dnn_status = std::string("cuDNN could not be initialized: ") + e.what();
    return;
  }
  dnn_ok = true;
  dnn_status = "cuDNN " + version_str(dnn.cudnnGetVersion()) + " (" + loaded + ")";
}

void Library::Impl::open_cublas() {
  auto& im = *this;
  std::string loaded, why;
  void* lib = open_library("CNN_CUBLAS_LIBRARY",
                           {"libcublas.so.13", "libcublas.so.12", "libcublas.so"}, &loaded, &why);
  if (!lib) {
    blas_status = "cuBLAS unavailable (" + why +
                  "); put the folder holding libcublas.so.13 (e.g. the PyTorch venv's nvidia "
                  "cublas lib folder) on LD_LIBRARY_PATH";
    return;
  }
  if (std::string missing = resolve(lib, blas); !missing.empty()) {
    blas_status = "cuBLAS unavailable: " + loaded + " has no symbol " + missing;
    return;
  }
  int version = 0;
  try {
    blas_ws = Buffer<unsigned char>(kCublasWorkspaceBytes, Device::CUDA);
    const cublasMath_t modes[2] = {CUBLAS_DEFAULT_MATH, CUBLAS_TF32_TENSOR_OP_MATH};
    for (int i = 0; i < 2; ++i) {
      CNN_BLAS(cublasCreate_v2, &blas_handle[i]);
      CNN_BLAS(cublasSetStream_v2, blas_handle[i], stream);
      CNN_BLAS(cublasSetMathMode, blas_handle[i], modes[i]);
      CNN_BLAS(cublasSetWorkspace_v2, blas_handle[i], blas_ws.data(), blas_ws.bytes());
    }
    CNN_BLAS(cublasGetVersion_v2, blas_handle[0], &version);
  } catch (const Error& e) {
    blas_status = std::string("cuBLAS could not be initialized: ") + e.what();
    return;
  }
  blas_ok = true;
  blas_status = "cuBLAS " + version_str(static_cast<size_t>(version)) + " (" + loaded + ")";
}

Library::Library(cudaStream_t stream) : impl_(std::make_unique<Impl>()) {
  impl_->stream = stream;
  impl_->open_cudnn();
  impl_->open_cublas();
  cudaGetLastError();  // a failed library start must not leave an error for our next check
}

Library::~Library() {
  // The libraries stay loaded (no dlclose): their exit handlers may still run.
  auto& im = *impl_;
  if (im.dnn_handle) im.dnn.cudnnDestroy(im.dnn_handle);
  for (auto h : im.blas_handle)
    if (h) im.blas.cublasDestroy_v2(h);
}

bool Library::cudnn_ok() const {
  return impl_->dnn_ok;
}
bool Library::cublas_ok() const {
  return impl_->blas_ok;
}
std::string Library::cudnn_status() const {
  return impl_->dnn_status;
}
std::string Library::cublas_status() const {
  return impl_->blas_status;
}

namespace {

// Owning cuDNN descriptors (the Impl, and so the function table, outlives every op).
struct TensorDesc {
  Library::Impl* owner = nullptr;
  cudnnTensorDescriptor_t d = nullptr;
  TensorDesc(Library::Impl& impl, int n, int c, int h, int w) : owner(&impl) {
    auto& im = impl;
    CNN_DNN(cudnnCreateTensorDescriptor, &d);
    CNN_DNN(cudnnSetTensor4dDescriptor, d, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, h, w);
  }
  ~TensorDesc() {
    if (d) owner->dnn.cudnnDestroyTensorDescriptor(d);
  }
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
};

struct FilterDesc {
  Library::Impl* owner = nullptr;
  cudnnFilterDescriptor_t d = nullptr;
  FilterDesc(Library::Impl& impl, int k, int c, int h, int w) : owner(&impl) {
    auto& im = impl;
    CNN_DNN(cudnnCreateFilterDescriptor, &d);
    CNN_DNN(cudnnSetFilter4dDescriptor, d, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, k, c, h, w);
  }
  ~FilterDesc() {
    if (d) owner->dnn.cudnnDestroyFilterDescriptor(d);
  }
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
};

struct ConvDesc {
  Library::Impl* owner = nullptr;
  cudnnConvolutionDescriptor_t d = nullptr;
  explicit ConvDesc(Library::Impl& impl) : owner(&impl) {
    auto& im = impl;
    CNN_DNN(cudnnCreateConvolutionDescriptor, &d);
  }
  ~ConvDesc() {
    if (d) owner->dnn.cudnnDestroyConvolutionDescriptor(d);
  }
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
};

class CudnnConv final : public LibOp {
 public:
  CudnnConv(Library::Impl& im, const Conv2dShape& s, int groups, Pass pass, Precision p,
            const LibArgs& find)
      : im_(im),
        pass_(pass),
        x_(im, s.n, s.c, s.h, s.w),
        y_(im, s.n, s.oc, s.oh(), s.ow()),
        w_(im, s.oc, s.c / groups, s.kh, s.kw),
        desc_conv_(im),
        conv_(desc_conv_.d) {
    CNN_DNN(cudnnSetConvolution2dDescriptor, conv_, s.pad_h, s.pad_w, s.stride_h, s.stride_w, 1, 1,
            CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT);
    if (groups != 1) CNN_DNN(cudnnSetConvolutionGroupCount, conv_, groups);
    // FP32: FMA only. DEFAULT_MATH would let cuDNN pick TF32 tensor-core kernels on sm_80+.
    const cudnnMathType_t math = p == Precision::FP32 ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
    CNN_DNN(cudnnSetConvolutionMathType, conv_, math);
    ws_ = const_cast<void*>(im.dnn_workspace());
    find_algo(find, math, p);
  }
  void run(const LibArgs& a) override {
    auto& im = im_;
    const float one = 1.f, zero = 0.f;
    switch (pass_) {
      case Pass::Forward:
        CNN_DNN(cudnnConvolutionForward, im.dnn_handle, &one, x_.d, a.a, w_.d, a.b, conv_, fwd_,
                ws_, kCudnnWorkspaceBytes, &zero, y_.d, a.out);
        break;
      case Pass::BackwardData:
        CNN_DNN(cudnnConvolutionBackwardData, im.dnn_handle, &one, w_.d, a.b, y_.d, a.a, conv_,
                dgrad_, ws_, kCudnnWorkspaceBytes, &zero, x_.d, a.out);
        break;
      case Pass::BackwardWeight:
        CNN_DNN(cudnnConvolutionBackwardFilter, im.dnn_handle, &one, x_.d, a.a, y_.d, a.b, conv_,
                wgrad_, ws_, kCudnnWorkspaceBytes, &one, w_.d, a.out);
        break;
    }
  }
  std::string describe() const override { return desc_; }

 private:
  struct Algo {
    int algo;
    cudnnMathType_t math;
    double find_us;  // Find's own one-shot time
  };

  // Every successful algorithm of cudnnFind*AlgorithmEx, in Find's order (fastest first by its
  // own one-shot timing). In FP32 the Winograd algorithms are left out: their transforms lose
  // precision (5e-3 against the CPU on conv2, over the 1e-4 FP32 tolerance every variant must
  // meet). TF32 runs each with the math type it was found with (cuDNN's advice); FP32 keeps FMA
  // whatever Find reports, so that no tensor-core kernel can slip in.
  template <class Perf>
  void collect(const Perf* perf, int count, const char* fn, Precision p, cudnnMathType_t math,
               int winograd, int winograd_nonfused) {
    for (int i = 0; i < count; ++i) {
      if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
      const int algo = static_cast<int>(perf[i].algo);
      if (p == Precision::FP32 && (algo == winograd || algo == winograd_nonfused)) {
        skipped_ += fmt::format("{}{} {:.1f} us", skipped_.empty() ? "" : ", ",
                                algo == winograd ? "WINOGRAD" : "WINOGRAD_NONFUSED",
                                1000.0 * perf[i].time);
        continue;
      }
      algos_.push_back(
          {algo, p == Precision::TF32 ? perf[i].mathType : math, 1000.0 * perf[i].time});
    }
    CNN_CHECK(!algos_.empty(), "cuDNN: {} found no working algorithm among {} for {}", fn, count,
              pass_name(pass_));
  }

 public:
  int algo_count() const override { return static_cast<int>(algos_.size()); }
  double find_us(int i) const override { return algos_.at(static_cast<size_t>(i)).find_us; }
  void use_algo(int i) override {
    auto& im = im_;
    const Algo& a = algos_.at(static_cast<size_t>(i));
    CNN_DNN(cudnnSetConvolutionMathType, conv_, a.math);
    std::string name;
    switch (pass_) {
      case Pass::Forward:
        fwd_ = static_cast<cudnnConvolutionFwdAlgo_t>(a.algo);
        name = fwd_algo_name(fwd_);
        break;
      case Pass::BackwardData:
        dgrad_ = static_cast<cudnnConvolutionBwdDataAlgo_t>(a.algo);
        name = dgrad_algo_name(dgrad_);
        break;
      case Pass::BackwardWeight:
        wgrad_ = static_cast<cudnnConvolutionBwdFilterAlgo_t>(a.algo);
        name = wgrad_algo_name(wgrad_);
        break;
    }
    // ", FP32-inexact skipped: WINOGRAD_NONFUSED 61.2 us" when collect() passed any over.
    desc_ = fmt::format("cudnn {} ({}){}", name, math_name(a.math),
                        skipped_.empty() ? "" : "; FP32-inexact skipped: " + skipped_);
  }

 private:
  void find_algo(const LibArgs& f, cudnnMathType_t math, Precision p) {
    auto& im = im_;
    int n = 0;
    switch (pass_) {
      case Pass::Forward: {
        cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        CNN_DNN(cudnnFindConvolutionForwardAlgorithmEx, im.dnn_handle, x_.d, f.a, w_.d, f.b, conv_,
                y_.d, f.out, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, perf, ws_, kCudnnWorkspaceBytes);
        collect(perf, n, "cudnnFindConvolutionForwardAlgorithmEx", p, math,
                CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD, CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED);
        break;
      }
      case Pass::BackwardData: {
        cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        CNN_DNN(cudnnFindConvolutionBackwardDataAlgorithmEx, im.dnn_handle, w_.d, f.b, y_.d, f.a,
                conv_, x_.d, f.out, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf, ws_,
                kCudnnWorkspaceBytes);
        collect(perf, n, "cudnnFindConvolutionBackwardDataAlgorithmEx", p, math,
                CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD,
                CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED);
        break;
      }
      case Pass::BackwardWeight: {
        cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        CNN_DNN(cudnnFindConvolutionBackwardFilterAlgorithmEx, im.dnn_handle, x_.d, f.a, y_.d, f.b,
                conv_, w_.d, f.out, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf, ws_,
                kCudnnWorkspaceBytes);
        collect(perf, n, "cudnnFindConvolutionBackwardFilterAlgorithmEx", p, math, -1,
                CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED);
        break;
      }
    }
    use_algo(0);
  }

  Library::Impl& im_;
  Pass pass_;
  TensorDesc x_, y_;
  FilterDesc w_;
  ConvDesc desc_conv_;
  cudnnConvolutionDescriptor_t conv_;
  void* ws_ = nullptr;
  cudnnConvolutionFwdAlgo_t fwd_{};
  cudnnConvolutionBwdDataAlgo_t dgrad_{};
  cudnnConvolutionBwdFilterAlgo_t wgrad_{};
  std::vector<Algo> algos_;  // what use_algo() chooses from
  std::string desc_;
  std::string skipped_;  // algorithms collect() passed over, with Find's times
};

// Row-major (as our kernels) in cuBLAS's column-major terms: a row-major (r x c) matrix is the
// column-major (c x r) one with leading dimension c.
//   fwd:   y^T (OUT x N)  = W^T' (OUT x IN) * x^T (IN x N)  -> gemm(T, N, OUT, N, IN)
//   dgrad: dx^T (IN x N)  = W^T (IN x OUT) * dy^T (OUT x N) -> gemm(N, N, IN, N, OUT)
//   wgrad: dW^T (IN x OUT) += x^T (IN x N) * dy (N x OUT)   -> gemm(N, T, IN, OUT, N), beta 1
class CublasGemm final : public LibOp {
 public:
  CublasGemm(Library::Impl& im, const LinearShape& s, Pass pass, Precision p)
      : im_(im), s_(s), pass_(pass), p_(p) {}
  void run(const LibArgs& a) override {
    const float one = 1.f, zero = 0.f;
    switch (pass_) {
      case Pass::Forward:
        gemm(CUBLAS_OP_T, CUBLAS_OP_N, s_.out, s_.n, s_.in, a.b, s_.in, a.a, s_.in, zero, a.out,
             s_.out);
        break;
      case Pass::BackwardData:
        gemm(CUBLAS_OP_N, CUBLAS_OP_N, s_.in, s_.n, s_.out, a.b, s_.in, a.a, s_.out, zero, a.out,
             s_.in);
        break;
      case Pass::BackwardWeight:
        gemm(CUBLAS_OP_N, CUBLAS_OP_T, s_.in, s_.out, s_.n, a.a, s_.in, a.b, s_.out, one, a.out,
             s_.in);
        break;
    }
  }
  std::string describe() const override {
    switch (p_) {
      case Precision::FP32:
        return "cublasSgemm (default math)";
      case Precision::TF32:
        return "cublasSgemm (tf32 tensor-op)";
      case Precision::BF16:
        break;
    }
    return "cublasGemmEx (fp32 data, CUBLAS_COMPUTE_32F_FAST_16BF)";
  }

 private:
  // BF16: FP32 matrices, operands rounded to BF16 inside cuBLAS, FP32 accumulation; the same
  // problem our BF16 kernels solve.
  void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* A,
            int lda, const float* B, int ldb, float beta, float* C, int ldc) {
    auto& im = im_;
    const float one = 1.f;
    if (p_ == Precision::BF16) {
      CNN_BLAS(cublasGemmEx, im.blas_handle[0], ta, tb, m, n, k, &one, A, CUDA_R_32F, lda, B,
               CUDA_R_32F, ldb, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F_FAST_16BF,
               CUBLAS_GEMM_DEFAULT);
      return;
    }
    CNN_BLAS(cublasSgemm_v2, im.blas_handle[p_ == Precision::FP32 ? 0 : 1], ta, tb, m, n, k, &one,
             A, lda, B, ldb, &beta, C, ldc);
  }

  Library::Impl& im_;
  LinearShape s_;
  Pass pass_;
  Precision p_;
};

class CudnnRelu final : public LibOp {
 public:
  CudnnRelu(Library::Impl& im, int n, int c, int h, int w, bool backward)
      : im_(im), t_(im, n, c, h, w), backward_(backward) {
    CNN_DNN(cudnnCreateActivationDescriptor, &act_);
    CNN_DNN(cudnnSetActivationDescriptor, act_, CUDNN_ACTIVATION_RELU, CUDNN_NOT_PROPAGATE_NAN,
            0.0);
  }
  ~CudnnRelu() override {
    if (act_) im_.dnn.cudnnDestroyActivationDescriptor(act_);
  }
  void run(const LibArgs& a) override {
    auto& im = im_;
    const float one = 1.f, zero = 0.f;
    if (!backward_) {
      CNN_DNN(cudnnActivationForward, im.dnn_handle, act_, &one, t_.d, a.a, &zero, t_.d, a.out);
    } else {
      CNN_DNN(cudnnActivationBackward, im.dnn_handle, act_, &one, t_.d, a.a, t_.d, a.b, t_.d, a.c,
              &zero, t_.d, a.out);
    }
  }
  std::string describe() const override { return "cudnnActivation (relu)"; }

 private:
  Library::Impl& im_;
  TensorDesc t_;
  bool backward_;
  cudnnActivationDescriptor_t act_ = nullptr;
};

class CudnnMaxPool final : public LibOp {
 public:
  CudnnMaxPool(Library::Impl& im, const MaxPoolShape& s, bool backward)
      : im_(im), x_(im, s.n, s.c, s.h, s.w), y_(im, s.n, s.c, s.oh(), s.ow()), backward_(backward) {
    CNN_DNN(cudnnCreatePoolingDescriptor, &pool_);
    CNN_DNN(cudnnSetPooling2dDescriptor, pool_, CUDNN_POOLING_MAX, CUDNN_NOT_PROPAGATE_NAN, s.kh,
            s.kw, s.pad_h, s.pad_w, s.stride_h, s.stride_w);
  }
  ~CudnnMaxPool() override {
    if (pool_) im_.dnn.cudnnDestroyPoolingDescriptor(pool_);
  }
  void run(const LibArgs& a) override {
    auto& im = im_;
    const float one = 1.f, zero = 0.f;
    if (!backward_) {
      CNN_DNN(cudnnPoolingForward, im.dnn_handle, pool_, &one, x_.d, a.a, &zero, y_.d, a.out);
    } else {
      CNN_DNN(cudnnPoolingBackward, im.dnn_handle, pool_, &one, y_.d, a.a, y_.d, a.b, x_.d, a.c,
              &zero, x_.d, a.out);
    }
  }
  std::string describe() const override { return "cudnnPooling (max)"; }

 private:
  Library::Impl& im_;
  TensorDesc x_, y_;
  bool backward_;
  cudnnPoolingDescriptor_t pool_ = nullptr;
};

}  // namespace

std::unique_ptr<LibOp> Library::conv(const Conv2dShape& s, Pass pass, Precision p,
                                     const LibArgs& find, int groups) {
  CNN_CHECK(impl_->dnn_ok, "{}", impl_->dnn_status);
  return std::make_unique<CudnnConv>(*impl_, s, groups, pass, p, find);
}

std::unique_ptr<LibOp> Library::gemm(const LinearShape& s, Pass pass, Precision p) {
  CNN_CHECK(impl_->blas_ok, "{}", impl_->blas_status);
  return std::make_unique<CublasGemm>(*impl_, s, pass, p);
}

std::unique_ptr<LibOp> Library::relu(int n, int c, int h, int w, bool backward) {
  CNN_CHECK(impl_->dnn_ok, "{}", impl_->dnn_status);
  return std::make_unique<CudnnRelu>(*impl_, n, c, h, w, backward);
}

std::unique_ptr<LibOp> Library::maxpool(const MaxPoolShape& s, bool backward) {
  CNN_CHECK(impl_->dnn_ok, "{}", impl_->dnn_status);
  return std::make_unique<CudnnMaxPool>(*impl_, s, backward);
}

void Library::sgemm(int m, int n, int k, const float* a, const float* b, float* c, Precision p) {
  auto& im = *impl_;
  CNN_CHECK(im.blas_ok, "{}", im.blas_status);
  const float one = 1.f, zero = 0.f;
  CNN_BLAS(cublasSgemm_v2, im.blas_handle[p == Precision::FP32 ? 0 : 1], CUBLAS_OP_N, CUBLAS_OP_N,
           m, n, k, &one, a, m, b, k, &zero, c, m);
}

}  // namespace cnn::bench

#elif defined(CNN_HAVE_CUDA)

// Built without cudnn.h: the same interface, always unavailable.
namespace cnn::bench {

struct Library::Impl {};

Library::Library(cudaStream_t) {}
Library::~Library() = default;
bool Library::cudnn_ok() const {
  return false;
}
bool Library::cublas_ok() const {
  return false;
}
std::string Library::cudnn_status() const {
  return "cuDNN unavailable: built without cudnn.h";
}
std::string Library::cublas_status() const {
  return "cuBLAS unavailable: built without cudnn.h";
}
std::unique_ptr<LibOp> Library::conv(const Conv2dShape&, Pass, Precision, const LibArgs&, int) {
  CNN_FAIL("{}", cudnn_status());
}
std::unique_ptr<LibOp> Library::gemm(const LinearShape&, Pass, Precision) {
  CNN_FAIL("{}", cublas_status());
}
std::unique_ptr<LibOp> Library::relu(int, int, int, int, bool) {
  CNN_FAIL("{}", cudnn_status());
}
std::unique_ptr<LibOp> Library::maxpool(const MaxPoolShape&, bool) {
  CNN_FAIL("{}", cudnn_status());
}
void Library::sgemm(int, int, int, const float*, const float*, float*, Precision) {
  CNN_FAIL("{}", cublas_status());
}

}  // namespace cnn::bench

#endif
