#include "app/batch_source.h"

#include "kernels/error.h"

namespace cnn {

BatchSource::BatchSource(const Dataset& d, const Normalization& norm, const AugmentOptions* augment,
                         uint64_t seed, int batch, bool shuffle, bool drop_last, const Exec& ex,
                         bool keep_host_labels)
    : ex_(ex),
      host_(d),
      params_(make_gather_params(d.c, d.h, d.w, norm, augment, seed)),
      sampler_(d.n, batch, shuffle, drop_last, seed),
      x_(size_t(batch) * size_t(d.image_size()), ex.device),
      y_(size_t(batch), ex.device),
      keep_host_labels_(keep_host_labels) {
  if (ex.device == Device::CUDA) {
    device_data_ = DeviceDataset(d, ex.device);
    d_order_ = Buffer<int32_t>(size_t(d.n), ex.device);
  }
}

void BatchSource::start_epoch(int64_t epoch, int64_t position) {
  sampler_.start_epoch(epoch, position);
  params_.epoch = epoch;
  if (ex_.device == Device::CUDA)
    d_order_.copy_from(sampler_.order().data(), Device::CPU, sampler_.order().size(), ex_.stream);
}

bool BatchSource::next(int* n) {
  const int64_t first = sampler_.position() * sampler_.batch_size();
  const int32_t* indices = nullptr;
  if (!sampler_.next(&indices, n)) return false;
  if (keep_host_labels_) {
    last_labels_host_.resize(size_t(*n));
    for (int i = 0; i < *n; ++i) last_labels_host_[size_t(i)] = host_.labels[size_t(indices[i])];
    last_labels_ = last_labels_host_.data();
  }
  if (ex_.device == Device::CUDA) {
    device_data_.gather(params_, d_order_.data() + first, *n, x_.data(), y_.data(), ex_.stream);
  } else {
    gather_batch_cpu(params_, host_.images.data(), host_.labels.data(), host_.n, indices, *n,
                     x_.data(), y_.data());
  }
  return true;
}

}  // namespace cnn
