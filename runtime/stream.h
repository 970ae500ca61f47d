#pragma once
// cudaStream_t for APIs that must also compile without the CUDA toolkit (CPU-only builds).
#ifdef CNN_HAVE_CUDA
#include <cuda_runtime_api.h>
#else
struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;
#endif
