#pragma once
// Names and values from files are bytes, not text: these check them where they enter and make
// them safe to print where they leave (one error line, a JSON string, a table cell).
#include <cstddef>
#include <string>
#include <string_view>

namespace cnn {

// True when s is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool valid_utf8(std::string_view s);

// s with each byte that is not part of a well-formed UTF-8 sequence replaced by U+FFFD, as
// browsers and Python's errors="replace" do: always valid UTF-8, so a JSON writer accepts it.
std::string utf8_replace_invalid(std::string_view s);

// s for a terminal or a log line: control characters and bytes outside well-formed UTF-8 become
// \xHH (and a backslash stays itself), so a name can neither break the line nor hide its bytes.
std::string printable(std::string_view s);

// printable(s), cut to at most max_chars characters of s with "... (N bytes)" after the cut, so
// that an error message never echoes a whole hostile value.
std::string excerpt(std::string_view s, size_t max_chars = 60);

}  // namespace cnn
