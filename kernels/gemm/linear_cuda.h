#pragma once
// CUDA launchers for linear.h (kernels/linear.cu). Called by linear.cpp after the checks.
#include <cstddef>

#include "kernels/gemm/linear.h"
#include "runtime/stream.h"

namespace cnn {

// Rows of dy that one thread sums for db before the partial sums are combined.
constexpr int kLinearDbRowsPerChunk = 64;
// Scratch for db in deterministic mode: one partial row of OUT per chunk of rows (0 if one chunk,
// or if the batch is small enough for the single-launch fixed-order column sum).
std::size_t linear_db_scratch_floats(const LinearShape& s);

void linear_forward_cuda(const LinearShape& s, const float* d_x, const float* d_w, const float* d_b,
                         float* d_y, bool relu, bool tiled, cudaStream_t stream);
void linear_backward_data_cuda(const LinearShape& s, const float* d_dy, const float* d_w,
                               float* d_dx, bool tiled, cudaStream_t stream);
// overwrite_dw: dw = dy^T x (not read) instead of +=.
void linear_backward_weight_cuda(const LinearShape& s, const float* d_x, const float* d_dy,
                                 float* d_dw, float* d_db, float* d_scratch, bool tiled,
                                 bool deterministic, bool overwrite_dw, cudaStream_t stream);

// db (out) += column sums of dy (n, out): for n <= 1024 one fixed-order launch (no atomics, no
// scratch, the same bits in both modes); beyond, atomicAdd per chunk, or fixed-order through
// scratch when deterministic.
void linear_bias_grad_cuda(const LinearShape& s, const float* d_dy, float* d_db, float* d_scratch,
                           bool deterministic, cudaStream_t stream);

}  // namespace cnn
