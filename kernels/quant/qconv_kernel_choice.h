#pragma once
// Which CUDA kernel runs an int8 convolution/linear stage: the one rule that ./infer,
// ./quantize --evaluate and ./bench --infer all follow (through Int8Network).
#include "kernels/quant/qconv.h"

namespace cnn {

enum class QConvKernel {
  Direct,       // qconv.cu: one thread per output, dp4a over the channels; takes every shape
  TensorCore,   // qconv_igemm.cu: mma.sync implicit GEMM
  FewChannels,  // qconv_few_channels.cu: C <= 4, dp4a over 4 taps or 4 channels
};

const char* qconv_kernel_name(QConvKernel k);

// specialized false: every stage on the direct kernel (CNN_INT8_DIRECT=1, for comparisons and
// bisecting). Otherwise, in this order:
//   C <= 4 and qconv_few_channels_supported  -> FewChannels  (the tensor-core kernel pads such a
//       reduction to 4 channels and 64-wide k steps, and wastes most of its work on zeros)
//   qconv_igemm_supported                    -> TensorCore
//   else                                     -> Direct       (groups > 1, huge pool windows)
QConvKernel qconv_pick_kernel(const QConvShape& s, bool specialized);

}  // namespace cnn
