#pragma once
// A classifier (a linear layer of at most kQLinearDp4aMaxCols outputs, float logits) fused into
// the linear layer before it, on that layer's linear tensor-core tile (qconv_linear_mma.cu). A
// classifier launched alone is a few microseconds at the latency floor (LeNet's fc2 at batch
// 256 on the H200: 2.76 us int8 against 2.85 us float), so it cannot be made faster, only gone:
// each block of the first layer, once its epilogue has written its int8 outputs (rows r,
// columns c of its tile), multiplies them by the classifier's weights w2[o][c] into int32
// partial sums per (r, o), atomicAdds them into an int32 accumulator (exact and
// order-independent: the bits do not depend on the scheduling), and arrives on its row tile's
// counter; the last block to arrive for a row tile (every column tile, every split rank) applies
// the classifier's epilogue (qconv.h) to the row tile's sums, writes the logits, and zeroes the
// sums and the counter again for the next call. The first layer's int8 output is still written
// (the network's stage outputs stay readable). The results equal the two layers run one after
// the other bit for bit, which is what the CPU twin does.
#include <cstdint>

#include "kernels/quant/qconv.h"

namespace cnn {

struct QClassifierFusion {
  QConvShape shape;           // the classifier's: linear, 1x1 input of the first layer's output
  const int8_t* w = nullptr;  // (OC, CGP), the classifier's weights as qconv_forward takes them
  QEpilogue ep;               // the classifier's (float logits)
  // Scratch on the device, zero before the first call and left zero by every call (so a CUDA
  // graph can replay it): qconv_classifier_acc_size and qconv_classifier_arrivals_size of the
  // largest batch. Unused on the CPU.
  int32_t* acc = nullptr;
  uint32_t* arrivals = nullptr;
  float* y = nullptr;  // the logits (N, OC)
};

// Whether the classifier `s2` can be fused into the linear layer `s1` (the fusion's shapes, not
// its kernel: the first layer must also run the linear tensor-core tile, qconv_resolve_kernel):
// both linear, s2 reads s1's output (c = s1.oc, a 1x1 input, channel stride s1.ocp), s2 has at
// most kQLinearDp4aMaxCols outputs, the same batch.
bool qconv_classifier_fusable(const QConvShape& s1, const QConvShape& s2);
// Elements of the scratch for `rows` images.
int64_t qconv_classifier_acc_size(int rows, int classes);
int64_t qconv_classifier_arrivals_size(int rows);

// y1 (int8, N x s1.ocp) and cls.y (float logits) of the two layers. CUDA: the linear
// tensor-core tile with the classifier fused (tile and splits as QConvPath's for TensorCores;
// w1_igemm the repacked weights of s1); CPU: qconv_forward_cpu then qconv_forward_float_cpu.
// Throws naming what does not fit: shapes qconv_classifier_fusable refuses, a missing pointer,
// a forced tile that is not a linear one.
void qconv_linear_classifier_forward(const QConvShape& s1, const int8_t* x, const int8_t* w1,
                                     const int8_t* w1_igemm, const QEpilogue& ep1, int8_t* y1,
                                     const QClassifierFusion& cls, const Exec& ex,
                                     QIgemmTile tile = QIgemmTile::Auto, int splits = 0);

}  // namespace cnn
