// The image decode path of image folders, list files and ./infer: stb_image (PNG/BMP/JPEG) plus
// our channel conversion to (C, H, W), with the resize on (any size to the model's) and off (the
// image must already have the model's size).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "data/image_folder.h"
#include "fuzz/fuzz_util.h"

namespace {

// Decodes as the loaders do; returns the source format ("WxH RGB", empty when refused).
std::string decode(const uint8_t* data, size_t size, int c, int h, int w, bool resize) {
  std::string format;
  cnn::fuzz::refused([&] {
    const auto px = cnn::decode_image(data, size, c, h, w, resize, &format);
    if (px.size() != size_t(c) * h * w || format.empty())
      cnn::fuzz::bug("decode_image returned a wrong size");
  });
  return format;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  decode(data, size, 1, 28, 28, false);  // MNIST-like model, no resize: other sizes are refused
  decode(data, size, 1, 5, 7, true);     // gray, odd non-square target
  // RGB model, resize on (./infer always resizes); then, for a decodable image, a model of the
  // image's own size, so that every size reaches the channel conversion without a resize.
  const std::string format = decode(data, size, 3, 32, 32, true);
  int iw = 0, ih = 0;
  if (std::sscanf(format.c_str(), "%dx%d", &iw, &ih) == 2) {
    decode(data, size, 1, ih, iw, false);
    decode(data, size, 3, ih, iw, false);
  }
  return 0;
}
