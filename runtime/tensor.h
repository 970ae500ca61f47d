#pragma once
// An owning float32 tensor (NCHW when 4-D) on the host or the device. Move-only; copies between
// devices are explicit (to(), copy_from()).
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/memory.h"

namespace cnn {

using Shape = std::vector<int64_t>;

int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);  // "(128, 32, 28, 28)"

class Tensor {
 public:
  Tensor() = default;
  Tensor(Shape shape, Device dev);  // contents uninitialized
  static Tensor zeros(Shape shape, Device dev);
  static Tensor from_host(Shape shape, const std::vector<float>& values, Device dev);

  Tensor(Tensor&&) noexcept = default;
  Tensor& operator=(Tensor&&) noexcept = default;

  float* data() { return buf_.data(); }
  const float* data() const { return buf_.data(); }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(i); }
  int64_t numel() const { return static_cast<int64_t>(buf_.size()); }
  Device device() const { return buf_.device(); }
  bool empty() const { return buf_.empty(); }

  Tensor to(Device dev) const;  // synchronous copy
  std::vector<float> to_vector() const;
  void copy_from(const Tensor& src);  // same element count, any devices
  void reshape(Shape s);              // same element count
  void zero(cudaStream_t stream = nullptr) { buf_.zero(stream); }
  void fill(float v);  // host tensors: loop; device tensors: through a host staging copy

 private:
  Shape shape_;
  Buffer<float> buf_;
};

}  // namespace cnn
