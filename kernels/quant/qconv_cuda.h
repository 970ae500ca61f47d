#pragma once
// CUDA launchers for qconv.h, quantize.h, qadd.h and qavgpool.h (kernels/quant/qconv.cu,
// qconv_igemm.cu, qconv_linear_mma.cu, qconv_linear.cu, qadd.cu, qavgpool.cu).
#include <cstdint>

#include "kernels/quant/qadd.h"
#include "kernels/quant/qavgpool.h"
#include "kernels/quant/qconv.h"
#include "kernels/quant/qconv_fused_classifier.h"
#include "kernels/quant/quantize.h"
#include "runtime/stream.h"

namespace cnn {

// Each launcher of a qconv kernel comes in two overloads: an int8 y (requantized, row stride
// OCP) and a float y (dequantized, row stride OC).
void qconv_forward_cuda(const QConvShape& s, const int8_t* d_x, const int8_t* d_w,
                        const QEpilogue& ep, int8_t* d_y, cudaStream_t stream);
void qconv_forward_cuda(const QConvShape& s, const int8_t* d_x, const int8_t* d_w,
                        const QEpilogue& ep, float* d_y, cudaStream_t stream);
// The tensor-core kernels (qconv_igemm.cu, and qconv_linear_mma.cu for the linear tiles);
// w_packed from qconv_pack_igemm_weights; tile Auto and splits 0: qconv_igemm_plan's (splits 1
// on a GPU without thread-block clusters).
void qconv_igemm_forward_cuda(const QConvShape& s, const int8_t* d_x, const int8_t* d_w_packed,
                              const QEpilogue& ep, int8_t* d_y, QIgemmTile tile, int splits,
                              cudaStream_t stream);
void qconv_igemm_forward_cuda(const QConvShape& s, const int8_t* d_x, const int8_t* d_w_packed,
                              const QEpilogue& ep, float* d_y, QIgemmTile tile, int splits,
                              cudaStream_t stream);
// The linear tiles alone (qconv_linear_mma.cu): qconv_is_linear(s), tile a Linear* one, splits
// 1, 2, 4 or 8 (halved where the device cannot place such a cluster).
void qconv_linear_mma_forward_cuda(const QConvShape& s, const int8_t* d_x, const int8_t* d_w_packed,
                                   const QEpilogue& ep, int8_t* d_y, QIgemmTile tile, int splits,
                                   cudaStream_t stream);
void qconv_linear_mma_forward_cuda(const QConvShape& s, const int8_t* d_x, const int8_t* d_w_packed,
                                   const QEpilogue& ep, float* d_y, QIgemmTile tile, int splits,
                                   cudaStream_t stream);
// The linear tiles with the classifier fused (qconv_fused_classifier.h): tile Auto and splits 0:
// qconv_igemm_plan's (splits 1 without clusters); the plan's tile must be a linear one.
void qconv_linear_classifier_forward_cuda(const QConvShape& s, const int8_t* d_x,
                                          const int8_t* d_w_packed, const QEpilogue& ep,
                                          int8_t* d_y, const QClassifierFusion& cls,
                                          QIgemmTile tile, int splits, cudaStream_t stream);
// Whether this device runs the tensor-core kernels' thread-block clusters (sm_90 and later).
bool qconv_clusters_available();
// The warp kernels of linear layers (qconv_linear.cu); qconv_is_linear(s). overlap_launch:
// QConvPath::overlap_launch (the few-column kernels only; ignored by the others).
void qconv_linear_forward_cuda(const QConvShape& s, const int8_t* d_x, const int8_t* d_w,
                               const QEpilogue& ep, int8_t* d_y, cudaStream_t stream,
                               bool overlap_launch = false);
void qconv_linear_forward_cuda(const QConvShape& s, const int8_t* d_x, const int8_t* d_w,
                               const QEpilogue& ep, float* d_y, cudaStream_t stream,
                               bool overlap_launch = false);
void quantize_nchw_to_nhwc_cuda(const QuantizeShape& s, const float* d_x, float inv_scale,
                                int8_t* d_y, cudaStream_t stream);
// d_a, d_b, d_y 4-byte aligned (Buffer allocations are).
void qadd_forward_cuda(const QAddShape& s, const int8_t* d_a, const int8_t* d_b,
                       const QAddScales& k, int8_t* d_y, cudaStream_t stream);
void qavgpool_forward_cuda(const QAvgPoolShape& s, const int8_t* d_x, float mult, bool relu,
                           int8_t* d_y, cudaStream_t stream);

}  // namespace cnn
