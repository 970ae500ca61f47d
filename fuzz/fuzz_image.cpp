// The image decode path of image folders, list files and ./infer: stb_image (PNG/BMP/JPEG) plus
// our channel conversion to (C, H, W), with the resize on (any size to the model's) and off (the
// image must already have the model's size).
#include <stb_image.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>

#include "data/image_folder.h"
#include "fuzz/fuzz_util.h"

namespace {

void decode(const uint8_t* data, size_t size, int c, int h, int w, bool resize) {
  cnn::fuzz::refused([&] {
    std::string format;
    const auto px = cnn::decode_image(data, size, c, h, w, resize, &format);
    if (px.size() != size_t(c) * h * w || format.empty())
      cnn::fuzz::bug("decode_image returned a wrong size");
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  decode(data, size, 1, 28, 28, false);  // MNIST-like model, no resize: other sizes are refused
  decode(data, size, 3, 32, 32, true);   // RGB model, resize on (./infer always resizes)
  decode(data, size, 1, 5, 7, true);     // gray, odd non-square target
  // The model's size equal to the image's: every size reaches the conversion without a resize.
  int iw = 0, ih = 0, comp = 0;
  if (size <= size_t(INT_MAX) && stbi_info_from_memory(data, int(size), &iw, &ih, &comp)) {
    decode(data, size, 1, ih, iw, false);
    decode(data, size, 3, ih, iw, false);
  }
  return 0;
}
