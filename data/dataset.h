#pragma once
// An in-memory labelled image dataset, stored as uint8 NCHW (what every source decodes to), plus
// the names of its classes. Uploaded once to the GPU when it fits.
#include <cstdint>
#include <string>
#include <vector>

namespace cnn {

struct Dataset {
  int n = 0, c = 1, h = 0, w = 0;
  std::vector<uint8_t> images;  // (N, C, H, W)
  std::vector<int32_t> labels;  // (N), each in [0, class_names.size())
  std::vector<std::string> class_names;
  std::string source;                         // where it came from, for the log
  int64_t skipped = 0;                        // unreadable images skipped (data.skip_bad_images)
  std::vector<std::string> skipped_examples;  // "file: reason" for the first few of them
  std::vector<std::string> skipped_reasons;   // the reason alone, for the same files

  int64_t image_size() const { return int64_t(c) * h * w; }
  int num_classes() const { return static_cast<int>(class_names.size()); }
};

// Throws naming `what` if labels fall outside [0, classes) or sizes disagree.
void validate_dataset(const Dataset& d, const std::string& what);

}  // namespace cnn
