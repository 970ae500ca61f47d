#include "data/gather.h"

#include <algorithm>

#include "data/gather_cuda.h"
#include "runtime/dispatch.h"
#include "runtime/error.h"

namespace cnn {

GatherParams make_gather_params(int c, int h, int w, const Normalization& norm,
                                const AugmentOptions* augment, uint64_t seed, int64_t epoch) {
  CNN_CHECK(c >= 1 && c <= kMaxGatherChannels, "gather: {} channels, expected 1..{}", c,
            kMaxGatherChannels);
  validate_normalization(norm, c);
  GatherParams p;
  p.c = c;
  p.h = h;
  p.w = w;
  for (int k = 0; k < c; ++k) {
    p.mean[k] = norm.mean[k];
    p.stdev[k] = norm.std[k];
  }
  if (augment) {
    CNN_CHECK(augment->shift >= 0 && augment->shift <= std::max(h, w),
              "data.augment.shift is {}, expected 0..{} for {}x{} images", augment->shift,
              std::max(h, w), h, w);
    p.shift = augment->shift;
    p.flip = augment->flip;
  }
  p.seed = seed;
  p.epoch = epoch;
  return p;
}

void gather_batch(const GatherParams& p, const uint8_t* images, const int32_t* labels, int64_t n,
                  const int32_t* indices, int batch, float* x, int32_t* y, const Exec& ex) {
  CNN_CHECK(p.c >= 1 && p.c <= kMaxGatherChannels && p.h > 0 && p.w > 0,
            "gather: sample shape {}x{}x{} is invalid (channels 1..{})", p.c, p.h, p.w,
            kMaxGatherChannels);
  CNN_CHECK(p.shift >= 0, "gather: shift {} is negative", p.shift);
  CNN_CHECK(batch >= 0 && n >= 0, "gather: batch {} of {} samples", batch, n);
  if (batch == 0) return;
  CNN_CHECK(n > 0 && images && labels && indices && x && y,
            "gather: null buffer or empty dataset (n = {})", n);
  if (ex.device == Device::CPU) {
    gather_batch_cpu(p, images, labels, n, indices, batch, x, y);
    return;
  }
  CNN_CUDA_BRANCH("gather_batch",
                  gather_batch_cuda(p, images, labels, n, indices, batch, x, y, ex.stream));
}

DeviceDataset::DeviceDataset(const Dataset& d, Device dev) {
  validate_dataset(d, d.source.empty() ? "dataset" : d.source);
  images_ = Buffer<uint8_t>(d.images.size(), dev);
  images_.copy_from(d.images.data(), Device::CPU, d.images.size());
  labels_ = Buffer<int32_t>(d.labels.size(), dev);
  labels_.copy_from(d.labels.data(), Device::CPU, d.labels.size());
  n_ = d.n;
  c_ = d.c;
  h_ = d.h;
  w_ = d.w;
}

void DeviceDataset::gather(const GatherParams& p, const int32_t* indices, int batch, float* x,
                           int32_t* y, cudaStream_t stream) const {
  CNN_CHECK(p.c == c_ && p.h == h_ && p.w == w_,
            "gather: parameters for {}x{}x{} samples, but the dataset holds {}x{}x{}", p.c, p.h,
            p.w, c_, h_, w_);
  Exec ex;
  ex.device = device();
  ex.stream = stream;
  gather_batch(p, images(), labels(), n_, indices, batch, x, y, ex);
}

}  // namespace cnn
