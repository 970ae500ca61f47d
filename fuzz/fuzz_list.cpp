// The CSV list reader (data.format: list): the input is the list file, next to two small valid
// PNGs (a.png, b.png) that its rows may name. Read with derived classes, with given class names,
// and with bad images skipped; an accepted list must give labels inside its classes.
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "data/image_folder.h"
#include "fuzz/fuzz_temp.h"
#include "fuzz/fuzz_util.h"
#include "runtime/file_io.h"

namespace {

namespace fs = std::filesystem;

void write(const fs::path& p, const uint8_t* data, size_t size) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), std::streamsize(size));
  if (!out.flush()) cnn::fuzz::bug("cannot write " + p.string());
}

// A 2x2 gray PNG (pixels 0, 64 / 128, 255; zlib level 6), checksums valid.
const uint8_t kPng[] = {0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d,
                        0x49, 0x48, 0x44, 0x52, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x02,
                        0x08, 0x00, 0x00, 0x00, 0x00, 0x57, 0xdd, 0x52, 0xf8, 0x00, 0x00, 0x00,
                        0x0e, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0x60, 0x70, 0x60, 0x68,
                        0xf8, 0x0f, 0x00, 0x03, 0x05, 0x01, 0xc0, 0x4e, 0x33, 0x5b, 0xe9, 0x00,
                        0x00, 0x00, 0x00, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82};

void check(const cnn::Dataset& d) {
  const int classes = d.num_classes();
  if (classes < 1 || d.n < 1 || d.labels.size() != size_t(d.n))
    cnn::fuzz::bug("list accepted with inconsistent counts");
  for (int32_t l : d.labels)
    if (l < 0 || l >= classes) cnn::fuzz::bug("label outside the classes");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fs::path& dir = cnn::fuzz::scratch_dir("list");
  static const bool images = [&] {
    write(dir / "a.png", kPng, sizeof(kPng));
    write(dir / "b.png", kPng, sizeof(kPng));
    return true;
  }();
  (void)images;
  const fs::path list = dir / "list.csv";
  write(list, data, size);
  cnn::ImageLoadOptions opt;
  opt.height = opt.width = 2;
  cnn::fuzz::refused([&] { check(cnn::load_image_list(list.string(), opt)); });
  cnn::fuzz::refused([&] { check(cnn::load_image_list(list.string(), opt, {"cat", "dog", "7"})); });
  opt.skip_bad_images = true;
  opt.resize = true;
  cnn::fuzz::refused([&] { check(cnn::load_image_list(list.string(), opt)); });
  return 0;
}
