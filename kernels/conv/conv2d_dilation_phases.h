#pragma once
// The layout change that lets a stride-1 dilated convolution run on the dense kernels
// (conv2d_dilated_dense.h): with dilation d, output row i reads input rows i - pad + d k, all of
// one residue modulo d, so the image splits into d_h x d_w phase images (every d-th row and
// column from a given offset), on each of which the convolution is an undilated one. A phase
// layout is (d_h * d_w, N, C, HS, WS): phase (r_h, r_w) holds
//   phases[r_h * d_w + r_w][n][c][j][k] = image[n][c][d_h j + r_h - off_h][d_w k + r_w - off_w]
// of an image (N, C, H, W), zero where that lies outside it.
#include <cstdint>

#include "runtime/exec.h"

namespace cnn {

struct DilationPhases {
  int n = 1, c = 1, h = 1, w = 1;  // the image (N, C, H, W)
  int d_h = 1, d_w = 1;            // dilation: d_h * d_w phases
  int off_h = 0, off_w = 0;        // the image's origin in phase coordinates (>= 0)
  int hs = 1, ws = 1;              // one phase image's size
  int64_t image_floats() const { return int64_t(n) * c * h * w; }
  int64_t phase_floats() const { return int64_t(d_h) * d_w * n * c * hs * ws; }
};

// phases = the phase layout of image (every phase element written, zeros outside the image).
void dilation_phase_split(const DilationPhases& p, const float* image, float* phases,
                          const Exec& ex);
// image = the image's elements read back from the phase layout (each lies in exactly one phase).
// Both directions check that the phases cover the image: d * HS >= H + off (and for W).
void dilation_phase_merge(const DilationPhases& p, const float* phases, float* image,
                          const Exec& ex);

void dilation_phase_split_cpu(const DilationPhases& p, const float* image, float* phases);
void dilation_phase_merge_cpu(const DilationPhases& p, const float* phases, float* image);

}  // namespace cnn
