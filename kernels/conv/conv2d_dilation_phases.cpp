// Dilation phase layout: dispatch and CPU references.
#include "kernels/conv/conv2d_dilation_phases.h"

#include "kernels/conv/conv2d_dilation_phases_cuda.h"
#include "runtime/dispatch.h"
#include "runtime/error.h"

namespace cnn {
namespace {

void check_phases(const char* what, const DilationPhases& p, const void* a, const void* b) {
  CNN_CHECK(p.n >= 1 && p.c >= 1 && p.h >= 1 && p.w >= 1 && p.d_h >= 1 && p.d_w >= 1 && p.hs >= 1 &&
                p.ws >= 1 && p.off_h >= 0 && p.off_w >= 0,
            "{}: sizes must be positive and offsets non-negative (image {}x{}x{}x{}, dilation "
            "{}x{}, offset {}x{}, phase {}x{})",
            what, p.n, p.c, p.h, p.w, p.d_h, p.d_w, p.off_h, p.off_w, p.hs, p.ws);
  CNN_CHECK(int64_t(p.d_h) * p.hs >= int64_t(p.h) + p.off_h &&
                int64_t(p.d_w) * p.ws >= int64_t(p.w) + p.off_w,
            "{}: phases of {}x{} at dilation {}x{} do not cover a {}x{} image at offset {}x{}",
            what, p.hs, p.ws, p.d_h, p.d_w, p.h, p.w, p.off_h, p.off_w);
  CNN_CHECK(a && b, "{}: null pointer", what);
}

}  // namespace

void dilation_phase_split_cpu(const DilationPhases& p, const float* image, float* phases) {
  int64_t o = 0;
  for (int rh = 0; rh < p.d_h; ++rh)
    for (int rw = 0; rw < p.d_w; ++rw)
      for (int n = 0; n < p.n; ++n)
        for (int c = 0; c < p.c; ++c)
          for (int j = 0; j < p.hs; ++j)
            for (int k = 0; k < p.ws; ++k, ++o) {
              const int i = p.d_h * j + rh - p.off_h, l = p.d_w * k + rw - p.off_w;
              phases[o] = i >= 0 && i < p.h && l >= 0 && l < p.w
                              ? image[((int64_t(n) * p.c + c) * p.h + i) * p.w + l]
                              : 0.f;
            }
}

void dilation_phase_merge_cpu(const DilationPhases& p, const float* phases, float* image) {
  for (int n = 0; n < p.n; ++n)
    for (int c = 0; c < p.c; ++c)
      for (int i = 0; i < p.h; ++i)
        for (int l = 0; l < p.w; ++l) {
          const int ih = i + p.off_h, lw = l + p.off_w;
          const int phase = (ih % p.d_h) * p.d_w + lw % p.d_w;
          image[((int64_t(n) * p.c + c) * p.h + i) * p.w + l] =
              phases[(((int64_t(phase) * p.n + n) * p.c + c) * p.hs + ih / p.d_h) * p.ws +
                     lw / p.d_w];
        }
}

void dilation_phase_split(const DilationPhases& p, const float* image, float* phases,
                          const Exec& ex) {
  check_phases("dilation_phase_split", p, image, phases);
  if (ex.device == Device::CPU) return dilation_phase_split_cpu(p, image, phases);
  CNN_CUDA_BRANCH("dilation_phase_split", dilation_phase_split_cuda(p, image, phases, ex.stream));
}

void dilation_phase_merge(const DilationPhases& p, const float* phases, float* image,
                          const Exec& ex) {
  check_phases("dilation_phase_merge", p, phases, image);
  if (ex.device == Device::CPU) return dilation_phase_merge_cpu(p, phases, image);
  CNN_CUDA_BRANCH("dilation_phase_merge", dilation_phase_merge_cuda(p, phases, image, ex.stream));
}

}  // namespace cnn
