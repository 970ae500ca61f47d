#pragma once
// CUDA launcher of the batch gather (see gather.h); only built with CUDA.
#include <cstdint>

#include "data/gather.h"
#include "runtime/stream.h"

namespace cnn {

void gather_batch_cuda(const GatherParams& p, const uint8_t* d_images, const int32_t* d_labels,
                       int64_t n, const int32_t* d_indices, int batch, float* d_x, int32_t* d_y,
                       cudaStream_t stream);

}  // namespace cnn
