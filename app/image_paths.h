#pragma once
// Expands ./infer's PATH arguments: an image file, a folder (searched recursively, sorted), or a
// glob pattern. Paths that match nothing are reported, not fatal. Files without an image
// extension inside folders or matched by a pattern are counted as skipped (a file named
// explicitly is always tried).
#include <cstdint>
#include <string>
#include <vector>

namespace cnn {

bool has_image_extension(const std::string& path);  // .png .bmp .jpg .jpeg, any case

struct ExpandedPaths {
  std::vector<std::string> files;
  std::vector<std::string> errors;  // "PATH: no such file or directory" ...
  int64_t skipped = 0;              // files without an image extension, left out
  std::string skipped_example;      // the first of them
};
ExpandedPaths expand_image_paths(const std::vector<std::string>& args);

}  // namespace cnn
