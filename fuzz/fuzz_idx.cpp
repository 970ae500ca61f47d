// The IDX reader through the entry points behind read_idx_images/read_idx_labels (they only read
// the file first): the input as it is (raw, or gzip when it starts with the gzip magic), and the
// input gzip-compressed, so that the gzip path sees the same structured payloads.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/file_io.h"
#include "data/idx.h"
#include "fuzz/fuzz_util.h"

namespace {

void parse_both(const std::vector<uint8_t>& bytes) {
  cnn::fuzz::refused([&] {
    const cnn::IdxImages im = cnn::parse_idx_images(bytes, "fuzz-images");
    if (im.n <= 0 || im.h <= 0 || im.w <= 0 || im.pixels.size() != size_t(im.n) * im.h * im.w)
      cnn::fuzz::bug("idx3 accepted with inconsistent sizes");
  });
  cnn::fuzz::refused([&] {
    if (cnn::parse_idx_labels(bytes, "fuzz-labels").empty()) cnn::fuzz::bug("idx1 accepted empty");
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  parse_both(std::vector<uint8_t>(data, data + size));
  if (!cnn::is_gzip(data, size)) parse_both(cnn::gzip_compress(data, size));
  return 0;
}
