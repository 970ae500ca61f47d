#include "app/train/batch_source.h"

#include "runtime/error.h"

namespace cnn {

BatchSource::BatchSource(const Dataset& d, const Normalization& norm, const AugmentOptions* augment,
                         uint64_t seed, int batch, bool shuffle, bool drop_last, const Exec& ex,
                         bool keep_host_labels, int rank, int world)
    : ex_(ex),
      host_(d),
      params_(make_gather_params(d.c, d.h, d.w, norm, augment, seed)),
      sampler_(d.n, batch, shuffle, drop_last, seed, rank, world),
      x_(size_t(batch) * size_t(d.image_size()), ex.device),
      y_(size_t(batch), ex.device),
      keep_host_labels_(keep_host_labels) {
  if (ex.device == Device::CUDA) {
    device_data_ = DeviceDataset(d, ex.device);
    d_order_ = Buffer<int32_t>(size_t(d.n), ex.device);
  }
}

void BatchSource::use_batch_counter(const int64_t* batch_counter) {
  CNN_CHECK(batch_counter, "BatchSource: null batch counter");
  epoch_ = Buffer<int64_t>(1, ex_.device);
  host_epoch_ = params_.epoch;
  epoch_.copy_from(&host_epoch_, Device::CPU, 1, ex_.stream);
  params_.epoch_ptr = epoch_.data();
  params_.batch_ptr = batch_counter;
  params_.batch_stride = sampler_.global_batch();
}

void BatchSource::start_epoch(int64_t epoch, int64_t position) {
  sampler_.start_epoch(epoch, position);
  params_.epoch = epoch;
  if (!epoch_.empty()) {
    host_epoch_ = epoch;
    epoch_.copy_from(&host_epoch_, Device::CPU, 1, ex_.stream);
  }
  if (ex_.device == Device::CUDA)
    d_order_.copy_from(sampler_.order().data(), Device::CPU, sampler_.order().size(), ex_.stream);
}

bool BatchSource::take(int* n) {
  first_ = sampler_.slice_begin(sampler_.position());
  if (!sampler_.next(&indices_, n)) return false;
  if (keep_host_labels_) {
    last_labels_host_.resize(size_t(*n));
    for (int i = 0; i < *n; ++i) last_labels_host_[size_t(i)] = host_.labels[size_t(indices_[i])];
    last_labels_ = last_labels_host_.data();
  }
  return true;
}

void BatchSource::gather(int n) {
  // With a batch counter the gather finds the batch in the whole order itself.
  // (This rank's slice starts rank * batch entries into each global batch.)
  if (n == 0) return;  // a rank past the end of a final partial global batch
  const bool counted = params_.batch_ptr != nullptr;
  const int64_t slice = sampler_.slice_begin(0);
  if (ex_.device == Device::CUDA) {
    device_data_.gather(params_, d_order_.data() + (counted ? slice : first_), n, x_.data(),
                        y_.data(), ex_.stream);
  } else {
    gather_batch_cpu(params_, host_.images.data(), host_.labels.data(), host_.n,
                     counted ? sampler_.order().data() + slice : indices_, n, x_.data(), y_.data());
  }
}

void BatchSource::gather_mirrored(int n) {
  params_.mirror = true;
  gather(n);
  params_.mirror = false;
}

bool BatchSource::next(int* n) {
  if (!take(n)) return false;
  gather(*n);
  return true;
}

}  // namespace cnn
