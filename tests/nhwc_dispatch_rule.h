#pragma once
// What the tests expect of algo wgmma-nhwc's dispatch of an input gradient (conv2d_backward_data,
// and the calls that size its scratch or share its dy copy): it takes a stride-1 one, and a
// strided one of dilation 1 under CNN_WGMMA_NHWC_PHASES=1 only. The kernel's own entry point
// (conv2d_backward_data_wgmma_nhwc) runs strided ones either way.
#include "kernels/conv/conv2d.h"
#include "runtime/env_switches.h"

namespace cnn::test {

inline bool nhwc_dispatch_takes_input_gradient(const Conv2dShape& s) {
  if (s.stride_h == 1 && s.stride_w == 1) return true;
  return process_env_switches().wgmma_nhwc_phases && !s.dilated();
}

}  // namespace cnn::test
