#pragma once
// For datasets too large to live on the device: batches are gathered on the host (the CPU gather,
// so they are bitwise the batches the resident GPU path makes) by a worker thread into pinned
// buffers, `depth` batches ahead, and copied to the device asynchronously on the caller's
// stream while the previous batch trains.
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "data/batch_sampler.h"
#include "data/dataset.h"
#include "data/gather.h"
#include "runtime/device.h"
#include "runtime/stream.h"

namespace cnn {

class HostPrefetcher {
 public:
  // `d` must outlive the prefetcher. dev is where next() delivers batches; max_batch bounds the
  // batch size; depth (>= 1) is how many batches are prepared ahead.
  HostPrefetcher(const Dataset& d, int max_batch, Device dev, int depth = 2);
  ~HostPrefetcher();
  HostPrefetcher(const HostPrefetcher&) = delete;
  HostPrefetcher& operator=(const HostPrefetcher&) = delete;

  // Starts producing the batches `sampler` has left in its current epoch (call
  // sampler.start_epoch(epoch, position) first; the prefetcher works on its own copy). Any epoch
  // still in flight is abandoned.
  void start_epoch(const GatherParams& p, const BatchSampler& sampler);

  // Delivers the next batch into x (batch, C, H, W) and y (batch) on the device: for CUDA the
  // copy is queued on `stream` (the buffer is reused only after it completes). Returns the batch
  // size, 0 at the end of the epoch. Rethrows an error of the worker.
  int next(float* x, int32_t* y, cudaStream_t stream = nullptr);

 private:
  struct Slot;
  void stop();
  void work(GatherParams p, BatchSampler sampler);

  const Dataset& data_;
  int max_batch_;
  Device dev_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false, done_ = false;
  int64_t produced_ = 0, consumed_ = 0;  // batches handed over / taken this epoch
  std::exception_ptr error_;
};

// Loader-only throughput: runs `batches` batches of the prefetch path (host gather + copy to
// `dev`) with no training, and returns images per second.
double measure_loader_images_per_s(const Dataset& d, const GatherParams& p, int batch_size,
                                   int batches, Device dev);

}  // namespace cnn
