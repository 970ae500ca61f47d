#pragma once
// Fully connected layer: y (N, OUT) = x (N, IN) * w^T + b, w (OUT, IN) as in torch.nn.Linear.
// Variants: naive (one thread per output) and tiled (shared-memory GEMM with register
// micro-tiles); auto and fast pick tiled. Arithmetic is FP32 whatever ex.precision says.
#include <cstddef>

#include "runtime/exec.h"

namespace cnn {

struct LinearShape {
  int n = 1, in = 1, out = 1;
};

void check_linear_shape(const LinearShape& s);

// relu=true applies ReLU in the epilogue. b may be null. scratch (may be null) holds
// scratch_floats floats of GEMM workspace (gemm_cuda.h, GemmWorkspace): with
// linear_forward_scratch_floats(s, ex) of them the GEMM may split groups, with fewer it runs
// without. The caller passes the size it allocated, worked out once: the size asks the device
// for its cluster capacity, host work a launch should not repeat.
std::size_t linear_forward_scratch_floats(const LinearShape& s, const Exec& ex);
void linear_forward(const LinearShape& s, const float* x, const float* w, const float* b, float* y,
                    bool relu, Algo algo, const Exec& ex, float* scratch = nullptr,
                    std::size_t scratch_floats = 0);
// dx (N, IN) = dy (N, OUT) * w. Overwrites dx. scratch as for the forward.
std::size_t linear_backward_data_scratch_floats(const LinearShape& s, const Exec& ex);
void linear_backward_data(const LinearShape& s, const float* dy, const float* w, float* dx,
                          Algo algo, const Exec& ex, float* scratch = nullptr,
                          std::size_t scratch_floats = 0);
// dw (OUT, IN) += dy^T * x; db (OUT) += column sums of dy (db may be null). ACCUMULATES, except
// that overwrite_dw writes dw = dy^T * x without reading it (every variant's GEMM has one owner
// per dw element and no atomics, so each can; the bits are those of += onto zeros). db is
// always added to: its multi-chunk sums go in by atomicAdd.
// Deterministic mode uses `scratch` for a fixed-order reduction where the variant needs it; the
// GEMM's workspace follows it there, in what is left of scratch_floats (without room for it the
// GEMM runs without split groups).
std::size_t linear_backward_weight_scratch_floats(const LinearShape& s, const Exec& ex);
void linear_backward_weight(const LinearShape& s, const float* x, const float* dy, float* dw,
                            float* db, float* scratch, Algo algo, const Exec& ex,
                            bool overwrite_dw = false, std::size_t scratch_floats = 0);

void linear_forward_cpu(const LinearShape& s, const float* x, const float* w, const float* b,
                        float* y, bool relu);
void linear_backward_data_cpu(const LinearShape& s, const float* dy, const float* w, float* dx);
void linear_backward_weight_cpu(const LinearShape& s, const float* x, const float* dy, float* dw,
                                float* db, bool overwrite_dw = false);
// Double twins for the numerical gradient checker.
void linear_forward_cpu(const LinearShape& s, const double* x, const double* w, const double* b,
                        double* y, bool relu);
void linear_backward_data_cpu(const LinearShape& s, const double* dy, const double* w, double* dx);
void linear_backward_weight_cpu(const LinearShape& s, const double* x, const double* dy, double* dw,
                                double* db);

}  // namespace cnn
