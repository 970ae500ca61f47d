#pragma once
// Errors: libraries throw cnn::Error; only main() catches and prints one line.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace cnn {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace cnn

// CNN_CHECK(cond, "fmt {}", args...): argument and shape checks; the message says what was
// expected, not where in our code it was checked.
#define CNN_CHECK(cond, ...)                                     \
  do {                                                           \
    if (!(cond)) throw ::cnn::Error(::fmt::format(__VA_ARGS__)); \
  } while (0)

#define CNN_FAIL(...) throw ::cnn::Error(::fmt::format(__VA_ARGS__))
