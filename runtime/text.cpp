#include "runtime/text.h"

#include <fmt/format.h>

namespace cnn {

namespace {

// Length of the well-formed UTF-8 sequence at s[i] (1..4), or 0 when the byte there starts none.
// The ranges are those of the Unicode standard's table 3-7.
size_t utf8_sequence(std::string_view s, size_t i) {
  const auto at = [&](size_t k) { return k < s.size() ? uint8_t(s[k]) : uint8_t(0); };
  const uint8_t b = at(i);
  const auto cont = [&](size_t k, uint8_t lo = 0x80, uint8_t hi = 0xBF) {
    return at(k) >= lo && at(k) <= hi && k < s.size();
  };
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return cont(i + 1) ? 2 : 0;
  if (b >= 0xE0 && b <= 0xEF) {
    const uint8_t lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
    return cont(i + 1, lo, hi) && cont(i + 2) ? 3 : 0;
  }
  if (b >= 0xF0 && b <= 0xF4) {
    const uint8_t lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
    return cont(i + 1, lo, hi) && cont(i + 2) && cont(i + 3) ? 4 : 0;
  }
  return 0;
}

}  // namespace

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string utf8_replace_invalid(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence(s, i);
    if (n == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD REPLACEMENT CHARACTER
      ++i;
    } else {
      out.append(s.substr(i, n));
      i += n;
    }
  }
  return out;
}

namespace {

// Appends the character at s[i] to out, escaped where needed; returns the bytes it consumed.
size_t append_printable(std::string_view s, size_t i, std::string& out) {
  const size_t n = utf8_sequence(s, i);
  const uint8_t b = uint8_t(s[i]);
  if (n == 0 || b < 0x20 || b == 0x7F) {
    out += fmt::format("\\x{:02X}", b);
    return 1;
  }
  out.append(s.substr(i, n));
  return n;
}

}  // namespace

std::string printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) i += append_printable(s, i, out);
  return out;
}

std::string excerpt(std::string_view s, size_t max_chars) {
  std::string out;
  size_t i = 0;
  for (size_t chars = 0; i < s.size() && chars < max_chars; ++chars)
    i += append_printable(s, i, out);
  if (i < s.size()) out += fmt::format("... ({} bytes)", s.size());
  return out;
}

}  // namespace cnn
