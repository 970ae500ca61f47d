#pragma once
// Weight gradient of a stride-1 dense convolution in TF32 on the Hopper tensor cores (sm_90a),
// reading the FP32 NCHW x and dy themselves (no copies, no scratch). Same contract as
// conv2d_backward_weight (kernels/conv/conv2d.h):
//   dw (OC, C, KH, KW) += sum over n, output pixels p of dy[n][oc][p] * x[n][c][p's tap (kh, kw)]
//   db (OC) += sum of dy (where db is given)
// as the GEMM dw^T (M = (tap, C), N = OC) += A (M, K) B (K, N), K = output pixels, TF32 operands
// (the top 19 bits of each FP32 value, as every TF32 pass) and FP32 accumulation. A k-tile is a
// few output rows of one image (conv2d_wgrad_tf32_halo_layout.h): ONE TMA box of x with its halo
// serves every filter tap, each consumer thread loading its A fragment (wgmma takes A from
// registers) at the tap's offset, and dy comes as K-major TMA boxes. The boxed TF32 kernel
// (conv2d_wgmma_wgrad.h) reads a column of B per (tap, channel): nine times the x bytes for a 3x3
// layer, the traffic that bounds it.
// Refused (cnn::Error naming why, so that the caller falls back): no compute capability 9.0
// device or sm_90a build; a precision other than TF32; deterministic mode (the K splits add with
// atomics); the shapes wgrad_tf32_halo_shape_refusal names.
#include <string>

#include "kernels/conv/conv2d.h"
#include "runtime/exec.h"

namespace cnn {

// True when this build has the sm_90a kernel and the current device is compute capability 9.0.
bool conv2d_wgrad_tf32_halo_available();

// Why this call cannot run (see above), or "" when it can.
std::string conv2d_wgrad_tf32_halo_refusal(const Conv2dShape& s, const Exec& ex);

// The K split (blocks per output tile) a call of `s` picks with splits 0; for tests and notes.
int conv2d_wgrad_tf32_halo_splits(const Conv2dShape& s);

// dw (and db unless null) += the gradients above; splits > 0 forces the K split (clamped to the
// k-tiles). Returns false, having launched nothing, where x or dy is not 16-byte aligned (the
// TMA's rule; the caller runs another kernel); throws cnn::Error with the refusal's reason where
// it is not empty.
bool conv2d_backward_weight_tf32_halo(const Conv2dShape& s, const float* d_x, const float* d_dy,
                                      float* d_dw, float* d_db, const Exec& ex, int splits = 0);

}  // namespace cnn
