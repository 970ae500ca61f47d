#pragma once
#include <cstdint>

namespace cnn {

template <class T>
constexpr T ceil_div(T a, T b) {
  return (a + b - 1) / b;
}

}  // namespace cnn
