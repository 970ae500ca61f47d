#pragma once
// The pre-passes of the TMA-im2col convolution (conv2d_wgmma_nhwc.h), conv2d_nhwc_prepass.cu: the
// weights into the K-major tile layout and the activations into a channels-last, channel-padded
// copy; their CPU twins are in conv2d_nhwc_layout.h.
//
// The convolution runs both in ONE launch (conv_nhwc_prepass_cuda): on the H200 each took about a
// launch's latency for little work (ncu, a LeNet training step: the pack of conv2's 51k weights
// ~3 us, the copy of a 128x32x14x14 input 4-6 us), and a ResNet step has ~14 such pairs. They
// read different inputs and write different outputs, so one grid whose first blocks pack and
// whose other blocks copy needs no synchronization between its blocks. The separate launchers
// stay for the tests (each against its CPU twin, and the fused launch against them), the bench's
// copy-alone rows, and the weight gradient's two copies (conv2d_wgmma_wgrad_nhwc.cu).
#include <cstdint>

#include "kernels/conv/conv2d_nhwc_layout.h"
#include "runtime/exec.h"
#include "runtime/stream.h"

namespace cnn {

// x (n, c, hw) -> out (n, hw, c_pad), channels >= c zero, values rounded to TF32. out must be
// 16-byte aligned (rows are stored 16 bytes at a time; x may have any alignment).
void nchw_to_nhwc_tf32_cuda(const float* d_x, int n, int c, int64_t hw, int c_pad, float* d_out,
                            cudaStream_t stream);
void pack_weights_tf32_cuda(const WeightPack& wp, const float* d_w, float* d_out,
                            cudaStream_t stream);
// The BF16 pre-passes: the same layouts with bf16 elements (written as their bit patterns),
// rounded to nearest even; c_pad a multiple of 64.
void nchw_to_nhwc_bf16_cuda(const float* d_x, int n, int c, int64_t hw, int c_pad, uint16_t* d_out,
                            cudaStream_t stream);
void pack_weights_bf16_cuda(const WeightPack& wp, const float* d_w, uint16_t* d_out,
                            cudaStream_t stream);
// The FP32 (3xTF32) pre-passes: the copy unrounded (c_pad a multiple of 32), and the weights as
// two packs, big = the TF32 pack and small = TF32(w - big) (pack_weights_tf32_split_cpu).
void nchw_to_nhwc_fp32_cuda(const float* d_x, int n, int c, int64_t hw, int c_pad, float* d_out,
                            cudaStream_t stream);
// At two blocks an SM the copy is split too (nchw_to_nhwc_tf32_split_cpu): big = the TF32 copy,
// small = TF32(x - big) at the same place; both 16-byte aligned.
void nchw_to_nhwc_tf32_split_cuda(const float* d_x, int n, int c, int64_t hw, int c_pad,
                                  float* d_big, float* d_small, cudaStream_t stream);
void pack_weights_tf32_split_cuda(const WeightPack& wp, const float* d_w, float* d_big,
                                  float* d_small, cudaStream_t stream);

// One call's weight packing: d_w packed as wp says into d_out (rows, taps, k_pad). Element type
// by precision: float (TF32, FP32), bf16 bit patterns (BF16). d_small: the FP32 residual pack
// (required at FP32, null otherwise). d_w null: no weights to pack.
struct NhwcWeightJob {
  WeightPack wp;
  const float* d_w = nullptr;
  void* d_out = nullptr;
  float* d_small = nullptr;
};
// One call's activation copy: d_x (n, c, hw) into d_out (n, hw, c_pad), 16-byte aligned, element
// type as above. At FP32 d_small null leaves d_out unrounded (nchw_to_nhwc_fp32_cuda); not null,
// d_out is the TF32 part and d_small the residual (nchw_to_nhwc_tf32_split_cuda); at TF32 and
// BF16 it must be null. d_x null: no copy.
struct NhwcCopyJob {
  const float* d_x = nullptr;
  int n = 0, c = 0;
  int64_t hw = 0;
  int c_pad = 0;
  void* d_out = nullptr;
  float* d_small = nullptr;
  // > 1: d_x (n, groups c, hw) into d_out (groups, n, hw, c_pad), c a group's channels (the
  // grouped convolution's group-major copy, nhwc_copy_image).
  int groups = 1;
};

// Both jobs in one launch at `precision` (TF32, BF16, or FP32 as 3xTF32), bitwise what the
// separate launchers above write. Either job may be empty (its input null): the launch then does
// the other alone; both empty launch nothing. Refusals as the separate launchers' (one line,
// naming conv_nhwc_prepass).
void conv_nhwc_prepass_cuda(Precision precision, const NhwcWeightJob& weights,
                            const NhwcCopyJob& copy, cudaStream_t stream);

// The BF16 channels-last weight gradient's pre-passes in one launch (each alone is a few
// microseconds of work behind a launch's latency): the BF16 copies of x and of dy (both jobs
// required, bitwise what nchw_to_nhwc_bf16_cuda writes) and, where d_db is not null, the bias
// gradient db[oc] += sum over n and pixels of the FP32 dy (dy_copy.d_x, (n, oc = dy_copy.c, hw)):
// blocks of (channel, run of images) add their sums with atomics, so db's bits vary with their
// order (the caller refuses deterministic mode).
void wgrad_nhwc_prepass_bf16_cuda(const NhwcCopyJob& x_copy, const NhwcCopyJob& dy_copy,
                                  float* d_db, cudaStream_t stream);

}  // namespace cnn
