#pragma once
// Skips a GPU test unless its Hopper wgmma kernels can run: a GPU (CNN_REQUIRE_GPU, which fails
// instead under CNN_REQUIRE_GPU=1) of compute capability 9.0 and a build with their sm_90a code.
// One macro per kernel family, each naming the family in its skip message.
#ifdef CNN_HAVE_CUDA
#include "kernels/conv/conv2d_wgmma.h"
#include "kernels/conv/conv2d_wgmma_nhwc.h"
#include "kernels/conv/conv2d_wgmma_wgrad.h"
#include "kernels/gemm/gemm_wgmma.h"
#include "tests/test_util.h"

#define CNN_REQUIRE_WGMMA_KERNEL(available, what)                                     \
  do {                                                                                \
    CNN_REQUIRE_GPU();                                                                \
    if (!(available))                                                                 \
      GTEST_SKIP() << what " needs a compute capability 9.0 GPU and an sm_90a build"; \
  } while (0)

#define CNN_REQUIRE_WGMMA() CNN_REQUIRE_WGMMA_KERNEL(gemm_wgmma_available(), "wgmma GEMM")
#define CNN_REQUIRE_WGMMA_CONV() \
  CNN_REQUIRE_WGMMA_KERNEL(conv2d_wgmma_available(), "wgmma convolution")
#define CNN_REQUIRE_WGMMA_NHWC() \
  CNN_REQUIRE_WGMMA_KERNEL(conv2d_wgmma_nhwc_available(), "wgmma-nhwc convolution")
#define CNN_REQUIRE_WGMMA_WGRAD() \
  CNN_REQUIRE_WGMMA_KERNEL(conv2d_wgrad_wgmma_available(), "the wgmma weight gradient")
#endif
