#pragma once
// 2-D convolution (cross-correlation, as in PyTorch), NCHW, weights (OC, IC, KH, KW).
// Forward, input gradient, and weight/bias gradients. Each API checks the shape once, then
// dispatches to the CPU reference (conv2d_cpu.cpp) or a CUDA variant (conv2d.cu).
#include <cstddef>

#include "runtime/exec.h"

namespace cnn {

struct Conv2dShape {
  int n = 1, c = 1, h = 1, w = 1;  // input (N, C, H, W)
  int oc = 1, kh = 1, kw = 1;      // weights (OC, C / groups, KH, KW)
  int stride_h = 1, stride_w = 1;
  int pad_h = 0, pad_w = 0;
  // Dilation: tap (kh, kw) reads input pixel (oy stride_h - pad_h + dil_h kh, ...). Groups: input
  // channels [g C/G, (g+1) C/G) feed output channels [g OC/G, (g+1) OC/G). Other than 1 only on
  // CUDA where the wgmma kernels read such a window directly (conv2d_*_runs_directly below); the
  // grouped and dilated ops run the others on block-diagonal weights, one group at a time or
  // dilation phases (conv2d_grouped_dense.h, conv2d_dilated_dense.h).
  int dil_h = 1, dil_w = 1;
  int groups = 1;
  int oh() const { return (h + 2 * pad_h - dil_h * (kh - 1) - 1) / stride_h + 1; }
  int ow() const { return (w + 2 * pad_w - dil_w * (kw - 1) - 1) / stride_w + 1; }
  int cg() const { return c / groups; }    // input channels a group
  int ocg() const { return oc / groups; }  // output channels a group
  bool dilated() const { return dil_h != 1 || dil_w != 1; }
  // Dilated or grouped: the shapes only some variants take.
  bool extended() const { return dilated() || groups != 1; }
};

// Throws naming the bad field; a dilation or groups other than 1 included (the kernels that take
// them call check_conv2d_shape_any instead).
void check_conv2d_shape(const Conv2dShape& s);
// The same with any dilation >= 1 (the dilated kernel window inside the padded input) and any
// groups >= 1 dividing both channel counts.
void check_conv2d_shape_any(const Conv2dShape& s);

// Scratch floats that conv2d_forward / conv2d_backward_data need for `algo`: on CUDA, algo
// wgmma-nhwc at TF32 or BF16 writes its channels-last copy and packed weights there
// (conv2d_nhwc_scratch.h), and wgmma's input gradient its copies where it runs on them
// (conv2d_dgrad_col2im.h; without the scratch it runs the TF32 kernel, or refuses another
// precision); every other case needs none and returns 0, Auto included (its fixed
// rule picks a variant without scratch; a layer that autotunes sizes for the candidates it times,
// layers/conv2d_layer.cpp), and so do the variants' refusals (FP32, a strided input gradient).
// A function of the shape, algo, ex.device and ex.precision only, never of the device present, so
// that a size is the same on every machine (and testable on the CPU); wgmma's input gradient on
// copies excepted, whose GEMM runs on compute capability 9.0 only and sizes its split-group
// workspace for the device's SMs (as the weight gradient on copies does). The caller allocates it
// once (the Network does, before any CUDA graph capture); the ops never allocate.
std::size_t conv2d_forward_scratch_floats(const Conv2dShape& s, Algo algo, const Exec& ex);
std::size_t conv2d_backward_data_scratch_floats(const Conv2dShape& s, Algo algo, const Exec& ex);

// y (N, OC, OH, OW) = conv(x, w) + b. b may be null. relu=true applies ReLU in the epilogue.
// scratch: conv2d_forward_scratch_floats(s, algo, ex) floats, 16-byte aligned (null when 0).
void conv2d_forward(const Conv2dShape& s, const float* x, const float* w, const float* b, float* y,
                    bool relu, float* scratch, Algo algo, const Exec& ex);

// dx (N, C, H, W) = conv_transpose(dy, w). Overwrites dx.
// scratch: conv2d_backward_data_scratch_floats(s, algo, ex) floats, 16-byte aligned (null when 0).
void conv2d_backward_data(const Conv2dShape& s, const float* dy, const float* w, float* dx,
                          float* scratch, Algo algo, const Exec& ex);

// dw (OC, C, KH, KW) += sum over batch of x (*) dy; db (OC) += sum of dy (db may be null).
// ACCUMULATES into dw/db (the caller zeroes gradients once per step). Default: atomicAdd;
// ex.deterministic: fixed-order two-stage reduction through `scratch`, bitwise repeatable.
// algo wgmma-nhwc at bf16 runs the BF16 channels-last kernel (conv2d_wgmma_wgrad_nhwc.h) where it
// takes the call (a scratch given, not deterministic), at tf32 and fp32 the GEMM on explicit
// copies (conv2d_wgrad_im2col.h) where it takes the call (a scratch given), else the TF32 wgmma
// kernel; algo wgmma at bf16 runs that GEMM in BF16 where it takes the call.
std::size_t conv2d_backward_weight_scratch_floats(const Conv2dShape& s, const Exec& ex);
void conv2d_backward_weight(const Conv2dShape& s, const float* x, const float* dy, float* dw,
                            float* db, float* scratch, Algo algo, const Exec& ex);

// Whether conv2d_backward_weight(s, ..., algo, ex) with a bias gradient where db (and its
// operands 16-byte aligned) would ask for thread-block clusters (Exec::clusters:
// conv2d_wgrad_wgmma_planned_cluster of the TF32 wgmma kernel it runs): what the autotuner's
// whole-pass check of ex.clusters needs to weigh. Host code; false on a build without CUDA.
bool conv2d_backward_weight_may_cluster(const Conv2dShape& s, Algo algo, const Exec& ex, bool db);

// Both gradients in one call where that saves work: dw_algo and dx_algo both wgmma-nhwc at bf16
// on a convolution the shared-copy call takes (conv2d_backward_wgmma_nhwc_shares_dy: dy's
// channels-last copy written once, by the weight gradient, and read by the input gradient too; a
// strided one only while wgmma-nhwc takes strided input gradients, CNN_WGMMA_NHWC_PHASES=1),
// unless CNN_CONV_SHARED_DY=0. Returns true when it ran them (dw, db += as
// conv2d_backward_weight; dx = as conv2d_backward_data), false, having run nothing, otherwise.
// scratch: conv2d_backward_weight_scratch_floats(s, ex) floats.
bool conv2d_backward_shared(const Conv2dShape& s, const float* x, const float* dy, const float* w,
                            float* dw, float* db, float* dx, float* scratch, Algo dw_algo,
                            Algo dx_algo, const Exec& ex);

// Whether the ops above run the dilated or grouped shape s (s.extended()) under algo on ex
// themselves, in one pass: on CUDA, algo wgmma-nhwc, at fp32, tf32 or bf16, the forward and the
// stride-1 input gradient where the TMA im2col can express the shape (each tap's copy at its
// dilated offset, group g's channels from a group-major channels-last copy); the weight gradient
// on a CUDA build (the BF16 channels-last kernel where it takes the call: dilated, ungrouped,
// not deterministic; else the wgmma kernel's gather of x, which reads dilated taps and one group
// a block). Elsewhere the ops refuse an extended shape with cnn::Error, and conv2d_grouped_dense.h
// / conv2d_dilated_dense.h run it on their forms and phases. Host code: the same answer on any
// machine.
bool conv2d_forward_runs_directly(const Conv2dShape& s, Algo algo, const Exec& ex);
bool conv2d_backward_data_runs_directly(const Conv2dShape& s, Algo algo, const Exec& ex);
bool conv2d_backward_weight_runs_directly(const Conv2dShape& s, Algo algo, const Exec& ex);

// CPU references: plain loops, double accumulation, any dilation and groups (the twins of the
// wgmma kernels' dilated and grouped passes). Same contracts as above.
void conv2d_forward_cpu(const Conv2dShape& s, const float* x, const float* w, const float* b,
                        float* y, bool relu);
void conv2d_backward_data_cpu(const Conv2dShape& s, const float* dy, const float* w, float* dx);
void conv2d_backward_weight_cpu(const Conv2dShape& s, const float* x, const float* dy, float* dw,
                                float* db);

// Double-precision twins of the CPU references (same contracts), so that the numerical gradient
// checker can run whole networks in double. One template implements both precisions.
void conv2d_forward_cpu(const Conv2dShape& s, const double* x, const double* w, const double* b,
                        double* y, bool relu);
void conv2d_backward_data_cpu(const Conv2dShape& s, const double* dy, const double* w, double* dx);
void conv2d_backward_weight_cpu(const Conv2dShape& s, const double* x, const double* dy, double* dw,
                                double* db);

// The double forward (no ReLU) through an im2col matrix and a register-blocked product: the same
// sums as conv2d_forward_cpu in another order (equal to ~1e-15 relative; tests/test_conv2d.cpp),
// about ten times faster. The numerical gradient checks, which run a network forward twice per
// checked coordinate, use it; the references above stay the ground truth.
void conv2d_forward_im2col_cpu(const Conv2dShape& s, const double* x, const double* w,
                               const double* b, double* y);

}  // namespace cnn
