#pragma once
// IDX files (the MNIST format): idx3 uint8 images and idx1 uint8 labels, raw or gzip (detected by
// the gzip magic, not the name). Every size in the file is checked against the others and against
// the data actually present before anything is allocated from it.
#include <cstdint>
#include <string>
#include <vector>

#include "data/dataset.h"

namespace cnn {

struct IdxImages {
  int n = 0, h = 0, w = 0;
  std::vector<uint8_t> pixels;  // (N, H, W)
};

IdxImages read_idx_images(const std::string& path);
std::vector<uint8_t> read_idx_labels(const std::string& path);  // (N)
// The same from the bytes of a file already in memory; `name` stands for the file in messages.
IdxImages parse_idx_images(std::vector<uint8_t> file, const std::string& name);
std::vector<uint8_t> parse_idx_labels(std::vector<uint8_t> file, const std::string& name);

// Writers (for tests and tools). A path ending in ".gz" is written gzip-compressed. Files are
// written atomically (temporary file, then rename).
void write_idx_images(const std::string& path, int n, int h, int w, const uint8_t* pixels);
void write_idx_labels(const std::string& path, const std::vector<uint8_t>& labels);

// What the model takes, when known: images of another size are refused from the header alone
// unless they are to be resized. width 0: anything.
struct IdxExpect {
  int height = 0, width = 0;
  bool resize = true;
};

// Images + labels as a Dataset (C = 1). class_names empty: "0".."max label". Throws naming the
// file when the counts disagree or a label is outside [0, classes). Both headers are checked
// (counts, image size against `expect`, size against the machine's memory, against the file's
// size) before either body is read or inflated; non-regular files (FIFOs, devices) are refused.
// decoded_cache: read a gzip image file through its decoded copy (data/idx_cache.h).
Dataset load_idx_dataset(const std::string& images_path, const std::string& labels_path,
                         const std::vector<std::string>& class_names,
                         const IdxExpect& expect = IdxExpect(), bool decoded_cache = true);

// "dir/stem" if it exists, else "dir/stem.gz"; throws naming both when neither does.
std::string find_idx_file(const std::string& dir, const std::string& stem);
// Same, but returns "" when neither exists.
std::string find_idx_file_optional(const std::string& dir, const std::string& stem);

}  // namespace cnn
