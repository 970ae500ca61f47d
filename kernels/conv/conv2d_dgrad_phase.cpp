#include "kernels/conv/conv2d_dgrad_phase.h"

#include "runtime/error.h"

namespace cnn {

DgradPhaseAxis dgrad_phase_axis(int size, int kernel, int stride, int pad, int phase) {
  CNN_CHECK(stride >= 1 && phase >= 0 && phase < stride && pad >= 0,
            "dgrad_phase_axis: phase {} of stride {} (pad {}): expected 0 <= phase < stride", phase,
            stride, pad);
  DgradPhaseAxis a;
  a.count = size > phase ? (size - phase + stride - 1) / stride : 0;
  a.first = (phase + pad) % stride;
  a.taps = kernel > a.first ? (kernel - a.first + stride - 1) / stride : 0;
  a.origin = (phase + pad) / stride;
  return a;
}

std::vector<DgradPhase> dgrad_phases(const Conv2dShape& s) {
  std::vector<DgradPhase> phases;
  phases.reserve(static_cast<size_t>(s.stride_h) * s.stride_w);
  for (int py = 0; py < s.stride_h; ++py) {
    for (int px = 0; px < s.stride_w; ++px) {
      DgradPhase ph;
      ph.py = py;
      ph.px = px;
      ph.y = dgrad_phase_axis(s.h, s.kh, s.stride_h, s.pad_h, py);
      ph.x = dgrad_phase_axis(s.w, s.kw, s.stride_w, s.pad_w, px);
      phases.push_back(ph);
    }
  }
  return phases;
}

}  // namespace cnn
