// Writes the seed corpora in fuzz/corpus/<target>/ with the repository's own writers (IDX,
// checkpoint) and stb_image_write (PNG, JPEG), BMPs by hand. Run once from the fuzz build:
//   build-asan/fuzz/fuzz_make_corpus fuzz/corpus
// The files are committed; fuzz.sh fuzzes copies of them, so they never grow. Each is < 4 KB.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "runtime/file_io.h"
#include "data/idx.h"
#include "fuzz/seed_network.h"
#include "layers/checkpoint/checkpoint.h"
#include "layers/network.h"
#include "layers/param_optimizer.h"

// stb_image_write's JPEG bit writer shifts a signed int past its range (UBSan: left shift of
// 1770700800 by 8 places); harmless on every compiler we use, and not our code to fix.
#ifdef __clang__
#pragma clang attribute push(__attribute__((no_sanitize("shift"))), apply_to = function)
#endif
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb_image_write.h>
#ifdef __clang__
#pragma clang attribute pop
#endif

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

namespace {

void save(const fs::path& path, const Bytes& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

Bytes pattern(int w, int h, int n) {  // a gradient with some texture, HWC
  Bytes px(size_t(w) * h * n);
  for (size_t i = 0; i < px.size(); ++i) px[i] = uint8_t(i * 37 + (i / 7) * 11);
  return px;
}

void put16(Bytes& v, uint32_t x) {
  v.push_back(uint8_t(x));
  v.push_back(uint8_t(x >> 8));
}
void put32(Bytes& v, uint32_t x) {
  put16(v, x & 0xffff);
  put16(v, x >> 16);
}

// A bottom-up BI_RGB BMP: bpp 8 with a 256-entry gray palette, or 24 / 32 bits.
Bytes make_bmp(int w, int h, int bpp) {
  const Bytes px = pattern(w, h, bpp / 8);
  const int row = (w * bpp / 8 + 3) / 4 * 4;
  const uint32_t offset = 14 + 40 + (bpp == 8 ? 1024 : 0);
  Bytes v = {'B', 'M'};
  put32(v, offset + uint32_t(row) * h);
  put32(v, 0);
  put32(v, offset);
  put32(v, 40);
  put32(v, uint32_t(w));
  put32(v, uint32_t(h));
  put16(v, 1);
  put16(v, uint16_t(bpp));
  put32(v, 0);
  put32(v, uint32_t(row) * h);
  put32(v, 2835);
  put32(v, 2835);
  put32(v, bpp == 8 ? 256 : 0);
  put32(v, 0);
  if (bpp == 8)
    for (int k = 0; k < 256; ++k) v.insert(v.end(), {uint8_t(k), uint8_t(k), uint8_t(k), 0});
  for (int y = h - 1; y >= 0; --y) {
    const size_t start = v.size();
    const size_t stride = size_t(w) * bpp / 8;
    v.insert(v.end(), px.begin() + y * stride, px.begin() + (y + 1) * stride);
    v.resize(start + row, 0);
  }
  return v;
}

void to_vector(void* ctx, void* data, int size) {
  auto* out = static_cast<Bytes*>(ctx);
  out->insert(out->end(), static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + size);
}

Bytes make_png(int w, int h, int n) {
  const Bytes px = pattern(w, h, n);
  Bytes out;
  stbi_write_png_to_func(to_vector, &out, w, h, n, px.data(), w * n);
  return out;
}

Bytes make_jpg(int w, int h, int n) {
  const Bytes px = pattern(w, h, n);
  Bytes out;
  stbi_write_jpg_to_func(to_vector, &out, w, h, n, px.data(), 75);
  return out;
}

Bytes read_all(const fs::path& p) {
  return cnn::read_file(p.string());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (fuzz/corpus)\n", argv[0]);
    return 2;
  }
  const fs::path root = argv[1];
  const fs::path src = fs::path(CNN_SOURCE_DIR);

  // idx: a 3-image 4x5 set and its labels, raw and gzip.
  const Bytes images = pattern(5, 4, 3);
  fs::create_directories(root / "idx");
  cnn::write_idx_images((root / "idx/images-idx3-ubyte").string(), 3, 4, 5, images.data());
  cnn::write_idx_images((root / "idx/images-idx3-ubyte.gz").string(), 3, 4, 5, images.data());
  cnn::write_idx_labels((root / "idx/labels-idx1-ubyte").string(), {1, 0, 2});
  cnn::write_idx_labels((root / "idx/labels-idx1-ubyte.gz").string(), {1, 0, 2});

  // image: PNG gray / gray+alpha / RGB / RGBA, BMP 8 / 24 / 32, JPEG gray / RGB; 28x28 reaches
  // the no-resize path of the 28x28 model, the others are resized.
  save(root / "image/gray28.png", make_png(28, 28, 1));
  save(root / "image/graya.png", make_png(5, 3, 2));
  save(root / "image/rgb.png", make_png(6, 4, 3));
  save(root / "image/rgba.png", make_png(3, 5, 4));
  save(root / "image/pal8.bmp", make_bmp(7, 3, 8));
  save(root / "image/rgb24.bmp", make_bmp(5, 4, 24));
  save(root / "image/rgba32.bmp", make_bmp(4, 3, 32));
  save(root / "image/gray.jpg", make_jpg(8, 8, 1));
  save(root / "image/rgb.jpg", make_jpg(9, 7, 3));

  // config: the shipped configs, and one with --set overrides after "#--set".
  for (const char* name : {"tiny.yaml", "mnist.yaml", "fashion_mnist.yaml"})
    save(root / "config" / name, read_all(src / "configs" / name));
  Bytes with_sets = read_all(src / "configs/tiny.yaml");
  const std::string sets =
      "#--set\ntraining.epochs=2\nmodel.layers[4].linear.out_features=4\noptimizer.type=adam\n";
  with_sets.insert(with_sets.end(), sets.begin(), sets.end());
  save(root / "config/tiny_with_sets.yaml", with_sets);

  // safetensors: a checkpoint of the seed network with its SGD momentum, as ./train writes it.
  const cnn::TrainConfig cfg = cnn::parse_config(cnn::fuzz::kSeedConfig, "seed.yaml");
  cnn::NetworkOptions nopt;
  nopt.max_batch = 1;
  cnn::Network net(cfg.model.layers, cfg.model.input_chw, nopt, cnn::Exec{});
  cnn::ParamOptimizer opt(cfg.optimizer, net);
  cnn::CheckpointMeta meta;
  meta.config_yaml = cfg.resolved_yaml;
  meta.class_names = {"0", "1"};
  meta.input_chw = cfg.model.input_chw;
  meta.mean = {0.5f};
  meta.std = {0.25f};
  meta.position = {1, 2, 3, 0.75};
  meta.seed = 7;
  fs::create_directories(root / "safetensors");
  cnn::save_checkpoint((root / "safetensors/seed.safetensors").string(), net, &opt, meta);
  return 0;
}
