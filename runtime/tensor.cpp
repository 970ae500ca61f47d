#include "runtime/tensor.h"

#include <algorithm>

#include "runtime/error.h"

namespace cnn {

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    CNN_CHECK(d >= 0, "negative dimension in shape {}", shape_str(s));
    n *= d;
  }
  return n;
}

std::string shape_str(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + ")";
}

Tensor::Tensor(Shape shape, Device dev)
    : shape_(std::move(shape)), buf_(static_cast<size_t>(shape_numel(shape_)), dev) {}

Tensor Tensor::zeros(Shape shape, Device dev) {
  Tensor t(std::move(shape), dev);
  t.zero();
  return t;
}

Tensor Tensor::from_host(Shape shape, const std::vector<float>& values, Device dev) {
  Tensor t(std::move(shape), dev);
  CNN_CHECK(static_cast<int64_t>(values.size()) == t.numel(), "from_host: {} values for shape {}",
            values.size(), shape_str(t.shape()));
  t.buf_.copy_from(values.data(), Device::CPU, values.size());
  return t;
}

Tensor Tensor::to(Device dev) const {
  Tensor t(shape_, dev);
  t.buf_.copy_from(buf_.data(), buf_.device(), buf_.size());
  return t;
}

std::vector<float> Tensor::to_vector() const {
  std::vector<float> v(buf_.size());
  raw_copy(v.data(), Device::CPU, buf_.data(), buf_.device(), buf_.bytes());
  return v;
}

void Tensor::copy_from(const Tensor& src) {
  CNN_CHECK(src.numel() == numel(), "copy_from: {} elements into {}", shape_str(src.shape()),
            shape_str(shape_));
  buf_.copy_from(src.data(), src.device(), src.buf_.size());
}

void Tensor::reshape(Shape s) {
  CNN_CHECK(shape_numel(s) == numel(), "reshape {} to {} changes the element count",
            shape_str(shape_), shape_str(s));
  shape_ = std::move(s);
}

void Tensor::fill(float v) {
  std::vector<float> host(buf_.size(), v);
  buf_.copy_from(host.data(), Device::CPU, host.size());
}

}  // namespace cnn
