#pragma once
// ./bench output: aligned tables for the terminal, Markdown and CSV files.
#include <string>
#include <vector>

#include "app/bench/bench_common.h"

namespace cnn::bench {

// The header lines (device, libraries, peaks, method) come first in the text and Markdown forms.
// Sections: op rows, a summary (best of our variants per op and precision against the library),
// and step rows; empty sections are left out.
std::string format_text(const std::vector<std::string>& header, const std::vector<BenchRow>& rows);
std::string format_markdown(const std::vector<std::string>& header,
                            const std::vector<BenchRow>& rows);
// One line per row, every field; numbers unrounded, NaN as an empty field.
std::string format_csv(const std::vector<BenchRow>& rows);

// Writes through a temporary file and a rename, so a failed run never leaves half a file.
void write_text_file(const std::string& path, const std::string& text);

}  // namespace cnn::bench
