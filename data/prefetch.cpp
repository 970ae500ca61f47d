#include "data/prefetch.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "runtime/error.h"
#include "runtime/memory.h"

#ifdef CNN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "runtime/cuda_check.h"
#endif

namespace cnn {

// One prepared batch: host memory (pinned when delivering to CUDA, so the copy is truly
// asynchronous) and, for CUDA, the event that marks its last copy as finished.
struct HostPrefetcher::Slot {
  float* x = nullptr;    // (max_batch, C, H, W)
  int32_t* y = nullptr;  // (max_batch)
  int count = 0;
  bool pinned = false;
#ifdef CNN_HAVE_CUDA
  cudaEvent_t copied = nullptr;
  bool copy_pending = false;
#endif

  Slot(size_t x_count, size_t y_count, Device dev) {
#ifdef CNN_HAVE_CUDA
    if (dev == Device::CUDA) {
      void* px = nullptr;
      void* py = nullptr;
      CNN_CUDA_CHECK(cudaHostAlloc(&px, x_count * sizeof(float), cudaHostAllocDefault));
      x = static_cast<float*>(px);
      pinned = true;
      CNN_CUDA_CHECK(cudaHostAlloc(&py, y_count * sizeof(int32_t), cudaHostAllocDefault));
      y = static_cast<int32_t*>(py);
      CNN_CUDA_CHECK(cudaEventCreateWithFlags(&copied, cudaEventDisableTiming));
      return;
    }
#endif
    (void)dev;
    x = static_cast<float*>(raw_alloc(x_count * sizeof(float), Device::CPU));
    y = static_cast<int32_t*>(raw_alloc(y_count * sizeof(int32_t), Device::CPU));
  }
  ~Slot() {
#ifdef CNN_HAVE_CUDA
    if (pinned) {
      if (copied) cudaEventDestroy(copied);
      cudaFreeHost(x);
      cudaFreeHost(y);
      return;
    }
#endif
    raw_free(x, Device::CPU);
    raw_free(y, Device::CPU);
  }
  // Blocks until the device has finished reading this slot (CUDA); a no-op otherwise.
  void wait_copy() {
#ifdef CNN_HAVE_CUDA
    if (copy_pending) {
      CNN_CUDA_CHECK(cudaEventSynchronize(copied));
      copy_pending = false;
    }
#endif
  }
};

HostPrefetcher::HostPrefetcher(const Dataset& d, int max_batch, Device dev, int depth)
    : data_(d), max_batch_(max_batch), dev_(dev) {
  validate_dataset(d, d.source.empty() ? "dataset" : d.source);
  CNN_CHECK(max_batch > 0, "prefetch: batch size {} must be > 0", max_batch);
  CNN_CHECK(depth >= 1 && depth <= 16, "prefetch: depth {} outside 1..16", depth);
  for (int i = 0; i < depth; ++i)
    slots_.push_back(
        std::make_unique<Slot>(size_t(max_batch) * size_t(d.image_size()), size_t(max_batch), dev));
}

HostPrefetcher::~HostPrefetcher() {
  try {
    stop();
    for (auto& s : slots_) s->wait_copy();
  } catch (...) {  // destructors must not throw; a failed event wait leaves nothing to undo
  }
}

void HostPrefetcher::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void HostPrefetcher::start_epoch(const GatherParams& p, const BatchSampler& sampler) {
  CNN_CHECK(sampler.batch_size() <= max_batch_,
            "prefetch: batches of {} exceed the {} the prefetcher was made for",
            sampler.batch_size(), max_batch_);
  CNN_CHECK(p.c == data_.c && p.h == data_.h && p.w == data_.w,
            "prefetch: parameters for {}x{}x{} samples, dataset holds {}x{}x{}", p.c, p.h, p.w,
            data_.c, data_.h, data_.w);
  CNN_CHECK(sampler.size() == data_.n, "prefetch: the sampler covers {} samples, dataset has {}",
            sampler.size(), data_.n);
  stop();
  stopping_ = false;
  done_ = false;
  produced_ = consumed_ = 0;
  error_ = nullptr;
  worker_ = std::thread(&HostPrefetcher::work, this, p, sampler);
}

void HostPrefetcher::work(GatherParams p, BatchSampler sampler) {
  const int depth = int(slots_.size());
  try {
    const int32_t* idx = nullptr;
    int count = 0;
    for (int64_t k = 0; sampler.next(&idx, &count); ++k) {
      Slot& slot = *slots_[k % depth];
      {  // wait until the consumer has taken the batch that used this slot `depth` batches ago
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stopping_ || k - consumed_ < depth; });
        if (stopping_) return;
      }
      slot.wait_copy();  // ... and until its copy to the device has finished
      gather_batch_cpu(p, data_.images.data(), data_.labels.data(), data_.n, idx, count, slot.x,
                       slot.y);
      slot.count = count;
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++produced_;
      }
      cv_.notify_all();
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mu_);
    error_ = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
}

int HostPrefetcher::next(float* x, int32_t* y, cudaStream_t stream) {
  CNN_CHECK(worker_.joinable(), "prefetch: next() before start_epoch()");
  Slot* slot = nullptr;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return produced_ > consumed_ || done_; });
    if (produced_ == consumed_) {  // the worker is done and everything was taken
      if (error_) std::rethrow_exception(error_);
      return 0;
    }
    slot = slots_[consumed_ % int64_t(slots_.size())].get();
  }
  const int count = slot->count;
  const size_t xs = size_t(count) * size_t(data_.image_size());
  if (dev_ == Device::CPU) {
    std::memcpy(x, slot->x, xs * sizeof(float));
    std::memcpy(y, slot->y, size_t(count) * sizeof(int32_t));
  } else {
#ifdef CNN_HAVE_CUDA
    CNN_CUDA_CHECK(cudaMemcpyAsync(x, slot->x, xs * sizeof(float), cudaMemcpyHostToDevice, stream));
    CNN_CUDA_CHECK(cudaMemcpyAsync(y, slot->y, size_t(count) * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, stream));
    CNN_CUDA_CHECK(cudaEventRecord(slot->copied, stream));
    slot->copy_pending = true;
#else
    (void)stream;
    CNN_FAIL("prefetch: Device::CUDA requested but this build has no CUDA");
#endif
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++consumed_;
  }
  cv_.notify_all();
  return count;
}

double measure_loader_images_per_s(const Dataset& d, const GatherParams& p, int batch_size,
                                   int batches, Device dev) {
  CNN_CHECK(batches > 0, "measure: {} batches, expected > 0", batches);
  HostPrefetcher pf(d, batch_size, dev);
  Buffer<float> x(size_t(batch_size) * size_t(d.image_size()), dev);  // (B, C, H, W)
  Buffer<int32_t> y(size_t(batch_size), dev);                         // (B)
  BatchSampler sampler(d.n, batch_size, true, false, p.seed);
  int64_t images = 0, epoch = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int b = 0; b < batches;) {
    sampler.start_epoch(epoch);
    GatherParams q = p;
    q.epoch = epoch++;
    pf.start_epoch(q, sampler);
    for (int n; b < batches && (n = pf.next(x.data(), y.data())) > 0; ++b) images += n;
  }
  stream_sync(dev, nullptr);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return images / std::max(s, 1e-9);
}

}  // namespace cnn
