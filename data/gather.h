#pragma once
// The batch gather: from a uint8 (N, C, H, W) dataset resident on the device (or the host), one
// call picks the batch's samples by index, augments them (random shift with zero padding =
// pad + random crop, optional horizontal flip; see augment.h), normalizes them to float NCHW as
// torchvision does ((x / 255 - mean) / std) and copies their labels. The CPU and CUDA versions
// produce bitwise identical batches.
#include <cstdint>

#include "data/data_options.h"
#include "data/dataset.h"
#include "data/normalize.h"
#include "runtime/exec.h"
#include "runtime/memory.h"

namespace cnn {

constexpr int kMaxGatherChannels = 4;

struct GatherParams {
  int c = 1, h = 0, w = 0;  // sample shape, input and output alike
  float mean[kMaxGatherChannels] = {0, 0, 0, 0};
  float stdev[kMaxGatherChannels] = {1, 1, 1, 1};
  int shift = 0;      // 0: no translation
  bool flip = false;  // random horizontal flip
  // Mirror every sample (evaluation's test-time augmentation); on top of a drawn flip it undoes it.
  bool mirror = false;
  uint64_t seed = 0;
  int64_t epoch = 0;
  // When set, the epoch is read from here at run time (device memory for CUDA, host memory for
  // the CPU) instead of `epoch`, so a captured CUDA graph follows the current epoch.
  const int64_t* epoch_ptr = nullptr;
  // When set (same memory as epoch_ptr), the batch's indices start at
  // indices + (*batch_ptr) * batch_stride, read at run time: `indices` is then the whole epoch
  // order (n entries) and a captured CUDA graph gathers each step's batch from its counter. A
  // batch reaching past the order throws on the CPU and poisons the batch (NaN, label -1) on the
  // GPU.
  const int64_t* batch_ptr = nullptr;
  int64_t batch_stride = 0;
};

// The first order entry of the batch that p.batch_ptr selects (0 without one); host memory only.
inline int64_t gather_batch_offset(const GatherParams& p) {
  return p.batch_ptr ? *p.batch_ptr * p.batch_stride : 0;
}

// Parameters for a dataset of (c, h, w); augment = nullptr (evaluation) draws no augmentation.
GatherParams make_gather_params(int c, int h, int w, const Normalization& norm,
                                const AugmentOptions* augment, uint64_t seed, int64_t epoch = 0);

// x (batch, C, H, W) float and y (batch) int32 from images (n, C, H, W) uint8, labels (n) and
// indices (batch); all pointers on ex.device. On the CPU an index outside [0, n) throws; on the
// GPU (which cannot throw) that sample becomes NaN with label -1, which the loss then reports.
void gather_batch(const GatherParams& p, const uint8_t* images, const int32_t* labels, int64_t n,
                  const int32_t* indices, int batch, float* x, int32_t* y, const Exec& ex);

// The reference: plain loops over the output.
void gather_batch_cpu(const GatherParams& p, const uint8_t* images, const int32_t* labels,
                      int64_t n, const int32_t* indices, int batch, float* x, int32_t* y);

// A dataset uploaded once (images and labels) to a device. Move-only; frees on destruction.
class DeviceDataset {
 public:
  DeviceDataset() = default;
  DeviceDataset(const Dataset& d, Device dev);

  Device device() const { return images_.device(); }
  int64_t n() const { return n_; }
  int c() const { return c_; }
  int h() const { return h_; }
  int w() const { return w_; }
  const uint8_t* images() const { return images_.data(); }  // (N, C, H, W)
  const int32_t* labels() const { return labels_.data(); }  // (N)
  size_t bytes() const { return images_.bytes() + labels_.bytes(); }

  // gather_batch over this dataset; indices, x and y live on the dataset's device.
  void gather(const GatherParams& p, const int32_t* indices, int batch, float* x, int32_t* y,
              cudaStream_t stream = nullptr) const;

 private:
  Buffer<uint8_t> images_;  // (N, C, H, W)
  Buffer<int32_t> labels_;  // (N)
  int64_t n_ = 0;
  int c_ = 0, h_ = 0, w_ = 0;
};

}  // namespace cnn
