#pragma once
// The phase decomposition of a strided convolution's input gradient (host-side geometry, used by
// the implicit GEMM in conv2d_igemm.cu and testable without a GPU).
//
// Along one axis (stride s, padding p, kernel k): input index i = ph + s q (phase ph in [0, s))
// receives tap t from output o = (i + p - t) / s only when s divides i + p - t, that is only the
// taps t = first + s j (first = (ph + p) mod s, j = 0, 1, ...), and then from
// o = q + (ph + p) / s - j. For a fixed phase the input gradient is therefore a unit-stride
// relation in q with one constant offset per tap: a dense implicit GEMM with no tap that is zero
// by construction (the division path gathers s^2 times the (pixel, tap) pairs of a 2-D stride-s
// convolution, all but one in s^2 of them predicated zeros).
#include <vector>

#include "kernels/conv/conv2d.h"

namespace cnn {

// One axis of one phase.
struct DgradPhaseAxis {
  int count = 0;   // input indices of the phase: ph, ph + s, ... below the input size
  int first = 0;   // its first tap: (ph + p) mod s
  int taps = 0;    // its taps first, first + s, ... below the kernel size
  int origin = 0;  // output index of tap j at q: q + origin - j (origin = (ph + p) / s)
};

// Axis geometry of phase `phase` for input size `size`, kernel `kernel`, stride, padding.
DgradPhaseAxis dgrad_phase_axis(int size, int kernel, int stride, int pad, int phase);

// One phase (py, px) of a 2-D input gradient: input pixels (py + sh qy, px + sw qx) for qy <
// y.count, qx < x.count, taps (y.first + sh jy, x.first + sw jx) for jy < y.taps, jx < x.taps.
struct DgradPhase {
  int py = 0, px = 0;
  DgradPhaseAxis y, x;
  int pixels() const { return y.count * x.count; }  // per image
  int taps() const { return y.taps * x.taps; }
};

// The stride_h * stride_w phases of s, py-major. Every input pixel is in exactly one of them.
std::vector<DgradPhase> dgrad_phases(const Conv2dShape& s);

}  // namespace cnn
