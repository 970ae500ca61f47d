#pragma once
// Raw host/device memory and an owning, move-only typed buffer on either device.
#include <cstddef>
#include <cstdint>
#include <utility>

#include "runtime/device.h"
#include "runtime/stream.h"

namespace cnn {

// Throws cnn::Error on failure, one line: the MiB requested, the device's free/total memory
// (cudaMemGetInfo) and the hint to lower training.batch_size; callers add what it was for.
void* raw_alloc(std::size_t bytes, Device dev);
void raw_free(void* p, Device dev) noexcept;
// Copies between any two devices; with a stream the copy is asynchronous on it (device side).
void raw_copy(void* dst, Device dst_dev, const void* src, Device src_dev, std::size_t bytes,
              cudaStream_t stream = nullptr);
// Sets bytes to zero on the device or the host (asynchronous on the stream for CUDA).
void raw_zero(void* p, Device dev, std::size_t bytes, cudaStream_t stream = nullptr);
// Waits for all work on the stream (no-op on the CPU).
void stream_sync(Device dev, cudaStream_t stream);

template <class T>
class Buffer {
 public:
  Buffer() = default;
  Buffer(std::size_t count, Device dev) : count_(count), dev_(dev) {
    if (count_) data_ = static_cast<T*>(raw_alloc(count_ * sizeof(T), dev_));
  }
  ~Buffer() { raw_free(data_, dev_); }
  Buffer(Buffer&& o) noexcept { swap(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    Buffer tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  T* data() { return data_; }
  const T* data() const { return data_; }
  std::size_t size() const { return count_; }
  std::size_t bytes() const { return count_ * sizeof(T); }
  Device device() const { return dev_; }
  bool empty() const { return count_ == 0; }

  // Explicit, synchronous copy to another device (or the same one).
  Buffer to(Device dev) const {
    Buffer out(count_, dev);
    raw_copy(out.data_, dev, data_, dev_, bytes());
    return out;
  }
  void copy_from(const T* src, Device src_dev, std::size_t count, cudaStream_t stream = nullptr) {
    raw_copy(data_, dev_, src, src_dev, count * sizeof(T), stream);
  }
  void zero(cudaStream_t stream = nullptr) { raw_zero(data_, dev_, bytes(), stream); }

 private:
  void swap(Buffer& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(count_, o.count_);
    std::swap(dev_, o.dev_);
  }
  T* data_ = nullptr;
  std::size_t count_ = 0;
  Device dev_ = Device::CPU;
};

}  // namespace cnn
