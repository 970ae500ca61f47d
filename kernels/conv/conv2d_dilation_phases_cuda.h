#pragma once
// CUDA launchers of conv2d_dilation_phases.h (conv2d_dilation_phases.cu), called after the checks.
#include "kernels/conv/conv2d_dilation_phases.h"
#include "runtime/stream.h"

namespace cnn {

void dilation_phase_split_cuda(const DilationPhases& p, const float* d_image, float* d_phases,
                               cudaStream_t stream);
void dilation_phase_merge_cuda(const DilationPhases& p, const float* d_phases, float* d_image,
                               cudaStream_t stream);

}  // namespace cnn
