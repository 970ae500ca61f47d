// Image decoding (BMP 8/24/32-bit written by hand, PNG gray/RGB/RGBA written with
// stb_image_write), image folders, list files, skip/stop on bad files, resize vs refuse.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "data/check_data.h"
#include "data/image_folder.h"
#include "data/load_data.h"
#include "runtime/atomic_file.h"
#include "runtime/error.h"
#include "runtime/file_io.h"
#include "tests/test_util.h"

// stb_image_write's JPEG bit writer shifts a signed int past its range (UBSan: "left shift of
// 1770700800 by 8 places"); harmless where it runs and not our code, so exempt it alone.
#ifdef __clang__
#pragma clang attribute push(__attribute__((no_sanitize("shift"))), apply_to = function)
#endif
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb_image_write.h>
#ifdef __clang__
#pragma clang attribute pop
#endif

using namespace cnn;
namespace fs = std::filesystem;

namespace {

// An HWC uint8 test image with `n` channels of random content.
struct Pixels {
  int w = 0, h = 0, n = 0;
  std::vector<uint8_t> hwc;
  uint8_t at(int y, int x, int k) const { return hwc[(size_t(y) * w + x) * n + k]; }
};

Pixels random_pixels(int w, int h, int n, uint64_t seed) {
  Pixels p{w, h, n, {}};
  auto r = test::random_labels(size_t(w) * h * n, 256, seed);
  p.hwc.assign(r.begin(), r.end());
  return p;
}

void put16(std::vector<uint8_t>& v, uint32_t x) {
  v.push_back(uint8_t(x));
  v.push_back(uint8_t(x >> 8));
}
void put32(std::vector<uint8_t>& v, uint32_t x) {
  put16(v, x & 0xffff);
  put16(v, x >> 16);
}

// A bottom-up BI_RGB BMP, written by hand so that the decoder is checked against an independent
// writer. bpp 8 uses `palette` (256 BGRA entries) and index data; 24 and 32 take RGB(A) pixels.
std::vector<uint8_t> make_bmp(const Pixels& p, int bpp, const std::vector<uint8_t>& palette = {}) {
  const int row = ((p.w * bpp / 8) + 3) / 4 * 4;  // rows padded to 4 bytes
  const uint32_t offset = 14 + 40 + (bpp == 8 ? 1024 : 0);
  std::vector<uint8_t> v = {'B', 'M'};
  put32(v, offset + uint32_t(row) * p.h);
  put32(v, 0);
  put32(v, offset);
  put32(v, 40);
  put32(v, uint32_t(p.w));
  put32(v, uint32_t(p.h));
  put16(v, 1);
  put16(v, uint16_t(bpp));
  put32(v, 0);  // BI_RGB
  put32(v, uint32_t(row) * p.h);
  put32(v, 2835);
  put32(v, 2835);
  put32(v, bpp == 8 ? 256 : 0);
  put32(v, 0);
  if (bpp == 8) v.insert(v.end(), palette.begin(), palette.end());
  for (int y = p.h - 1; y >= 0; --y) {
    const size_t start = v.size();
    for (int x = 0; x < p.w; ++x) {
      if (bpp == 8) {
        v.push_back(p.at(y, x, 0));
      } else {
        v.push_back(p.at(y, x, 2));
        v.push_back(p.at(y, x, 1));
        v.push_back(p.at(y, x, 0));
        if (bpp == 32) v.push_back(p.at(y, x, 3));
      }
    }
    v.resize(start + row, 0);
  }
  return v;
}

std::vector<uint8_t> make_png(const Pixels& p) {
  int len = 0;
  unsigned char* png = stbi_write_png_to_mem(p.hwc.data(), p.w * p.n, p.w, p.h, p.n, &len);
  EXPECT_NE(png, nullptr);
  std::vector<uint8_t> v(png, png + len);
  STBIW_FREE(png);
  return v;
}

// A minimal PNG with an arbitrary header (bit depth, size) and a small valid IDAT, to test
// refusals that happen before decoding.
std::vector<uint8_t> make_raw_png(uint32_t w, uint32_t h, uint8_t depth, uint8_t color) {
  std::vector<uint8_t> v = {0x89, 'P', 'N', 'G', 13, 10, 26, 10};
  auto chunk = [&](const char* type, const std::vector<uint8_t>& data) {
    for (int s = 24; s >= 0; s -= 8) v.push_back(uint8_t(data.size() >> s));
    std::vector<uint8_t> body(type, type + 4);
    body.insert(body.end(), data.begin(), data.end());
    v.insert(v.end(), body.begin(), body.end());
    const uint32_t crc = uint32_t(crc32(0, body.data(), uInt(body.size())));
    for (int s = 24; s >= 0; s -= 8) v.push_back(uint8_t(crc >> s));
  };
  std::vector<uint8_t> ihdr;
  for (uint32_t x : {w, h})
    for (int s = 24; s >= 0; s -= 8) ihdr.push_back(uint8_t(x >> s));
  ihdr.insert(ihdr.end(), {depth, color, 0, 0, 0});
  chunk("IHDR", ihdr);
  // One row of zeros per image row (filter byte + samples), deflated.
  const size_t row = 1 + size_t(w) * (depth / 8) * (color == 2 ? 3 : 1);
  std::vector<uint8_t> raw(std::min<size_t>(row * h, 1 << 20), 0);
  uLongf clen = compressBound(uLong(raw.size()));
  std::vector<uint8_t> z(clen);
  compress(z.data(), &clen, raw.data(), uLong(raw.size()));
  z.resize(clen);
  chunk("IDAT", z);
  chunk("IEND", {});
  return v;
}

uint8_t luma(uint8_t r, uint8_t g, uint8_t b) {  // ITU-R 601-2, PIL's rounding
  return uint8_t((r * 19595u + g * 38470u + b * 7471u + 0x8000u) >> 16);
}

std::vector<uint8_t> decode(const std::vector<uint8_t>& file, int c, int h, int w,
                            bool resize = false) {
  return decode_image(file.data(), file.size(), c, h, w, resize);
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

class ImageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "cnn_img_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    seed_ = test::fresh_seed();
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& rel) const { return (fs::path(dir_) / rel).string(); }
  void write(const std::string& rel, const std::vector<uint8_t>& bytes) const {
    fs::create_directories(fs::path(path(rel)).parent_path());
    write_file_atomically(path(rel), bytes.data(), bytes.size());
  }
  void write_text(const std::string& rel, const std::string& text) const {
    write(rel, std::vector<uint8_t>(text.begin(), text.end()));
  }
  // A gray w x h PNG whose pixels are all `value`.
  std::vector<uint8_t> flat_png(int w, int h, uint8_t value) const {
    Pixels p{w, h, 1, std::vector<uint8_t>(size_t(w) * h, value)};
    return make_png(p);
  }
  std::string dir_;
  uint64_t seed_ = 0;
};

}  // namespace

TEST_F(ImageTest, PngGrayRgbRgbaPixelExact) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const int w = 7, h = 5;
  for (int n : {1, 3, 4}) {
    SCOPED_TRACE("channels " + std::to_string(n));
    Pixels p = random_pixels(w, h, n, seed_ + n);
    const auto png = make_png(p);
    const auto rgb = decode(png, 3, h, w);
    const auto gray = decode(png, 1, h, w);
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < w; ++x) {
        const size_t i = size_t(y) * w + x, plane = size_t(h) * w;
        if (n == 1) {
          for (int k = 0; k < 3; ++k) ASSERT_EQ(rgb[k * plane + i], p.at(y, x, 0));  // replicated
          ASSERT_EQ(gray[i], p.at(y, x, 0));
        } else {
          for (int k = 0; k < 3; ++k)
            ASSERT_EQ(rgb[k * plane + i], p.at(y, x, k));  // alpha dropped
          ASSERT_EQ(gray[i], luma(p.at(y, x, 0), p.at(y, x, 1), p.at(y, x, 2)));
        }
      }
    }
  }
}

TEST_F(ImageTest, Bmp8_24_32PixelExact) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const int w = 5, h = 3;  // 5*3 = 15 bytes per 24-bit row: exercises the row padding
  const size_t plane = size_t(w) * h;
  // 24 and 32 bit.
  for (int bpp : {24, 32}) {
    SCOPED_TRACE("bpp " + std::to_string(bpp));
    Pixels p = random_pixels(w, h, bpp / 8, seed_ + bpp);
    if (bpp == 32)  // some non-zero alpha, else stb treats the channel as absent
      for (size_t i = 3; i < p.hwc.size(); i += 4) p.hwc[i] |= 1;
    const auto rgb = decode(make_bmp(p, bpp), 3, h, w);
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        for (int k = 0; k < 3; ++k) ASSERT_EQ(rgb[k * plane + y * w + x], p.at(y, x, k));
  }
  // 8 bit with a random palette (BGRA entries): the palette is applied.
  Pixels idx = random_pixels(w, h, 1, seed_ + 8);
  std::vector<uint8_t> palette(1024);
  auto r = test::random_labels(1024, 256, seed_ + 9);
  std::copy(r.begin(), r.end(), palette.begin());
  const auto rgb = decode(make_bmp(idx, 8, palette), 3, h, w);
  const auto gray = decode(make_bmp(idx, 8, palette), 1, h, w);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const uint8_t* e = &palette[idx.at(y, x, 0) * 4];  // B, G, R, reserved
      ASSERT_EQ(rgb[0 * plane + y * w + x], e[2]);
      ASSERT_EQ(rgb[1 * plane + y * w + x], e[1]);
      ASSERT_EQ(rgb[2 * plane + y * w + x], e[0]);
      ASSERT_EQ(gray[y * w + x], luma(e[2], e[1], e[0]));
    }
  }
  // A gray palette gives the index values back exactly as gray.
  for (int i = 0; i < 256; ++i)
    for (int k = 0; k < 3; ++k) palette[i * 4 + k] = uint8_t(i);
  const auto g = decode(make_bmp(idx, 8, palette), 1, h, w);
  for (size_t i = 0; i < plane; ++i) ASSERT_EQ(g[i], idx.hwc[i]);
}

std::vector<uint8_t> make_jpg(const Pixels& p) {
  std::vector<uint8_t> jpg;
  stbi_write_jpg_to_func(
      [](void* ctx, void* data, int size) {
        auto* out = static_cast<std::vector<uint8_t>*>(ctx);
        out->insert(out->end(), static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + size);
      },
      &jpg, p.w, p.h, p.n, p.hwc.data(), 95);
  return jpg;
}

TEST_F(ImageTest, JpegDecodesApproximately) {
  Pixels p{16, 8, 3, std::vector<uint8_t>(16 * 8 * 3)};
  for (size_t i = 0; i < p.hwc.size(); ++i) p.hwc[i] = uint8_t(i % 3 == 0 ? 200 : 60);
  const std::vector<uint8_t> jpg = make_jpg(p);
  write("x.jpg", jpg);
  const auto rgb = load_image_file(path("x.jpg"), 3, 8, 16, false);
  for (int i = 0; i < 16 * 8; ++i) {
    EXPECT_NEAR(rgb[i], 200, 12);
    EXPECT_NEAR(rgb[2 * 16 * 8 + i], 60, 12);
  }
}

// Found by fuzz/fuzz_image: stb_image 2.27 builds a Huffman table from its 16 code counts without
// checking that they total at most 256, and writes past the table (UBSan: index 257 out of bounds
// for 'stbi_uc[257]'). Such a file is refused before stb sees it; valid tables still decode.
TEST_F(ImageTest, JpegHuffmanTableWithTooManyCodesIsRefused) {
  const std::vector<uint8_t> jpg = make_jpg(random_pixels(8, 8, 3, seed_));
  ASSERT_EQ(decode(jpg, 3, 8, 8).size(), 3u * 8 * 8);
  size_t dht = 0;
  for (size_t i = 2; i + 21 < jpg.size() && !dht; ++i)
    if (jpg[i] == 0xFF && jpg[i + 1] == 0xC4) dht = i;
  ASSERT_NE(dht, 0u) << "no DHT segment in stb_image_write's JPEG";
  for (int table = 0; table < 2; ++table) {  // the first table of the segment, then a later one
    std::vector<uint8_t> bad = jpg;
    size_t counts = dht + 5;  // FF C4, length (2), class/id (1), then the 16 counts
    if (table == 1) {
      size_t codes = 0;
      for (int k = 0; k < 16; ++k) codes += bad[counts + k];
      counts += 16 + codes + 1;  // past the first table's values and the next class/id byte
      if (counts + 16 > dht + 2 + (size_t(bad[dht + 2]) << 8 | bad[dht + 3])) continue;
    }
    bad[counts + 14] = 200;
    bad[counts + 15] = 200;
    std::string e = error_of([&] { decode(bad, 3, 8, 8); });
    EXPECT_NE(e.find("Huffman table declares more than 256 codes"), std::string::npos) << e;
    bad.insert(bad.begin(), 0xFF);  // stb skips 0xFF fill bytes before the SOI marker too
    e = error_of([&] { decode(bad, 3, 8, 8); });
    EXPECT_NE(e.find("Huffman table declares more than 256 codes"), std::string::npos) << e;
  }
}

// Found by fuzz/fuzz_image: stb_image allocates a whole image from the header's size and reads a
// short file's missing bytes as zeros, so a 70-byte BMP claiming 16384x16384 allocated 1 GiB and
// a 671-byte JPEG decoded 268 million pixels. A header claiming more pixels than the file can hold
// is refused before stb allocates anything; the same files with honest sizes still decode.
TEST_F(ImageTest, HeaderClaimingMorePixelsThanTheFileHoldsIsRefused) {
  auto expect_refused = [&](const std::vector<uint8_t>& file, const char* what) {
    SCOPED_TRACE(what);
    const std::string e = error_of([&] { decode(file, 3, 16, 16, true); });
    EXPECT_NE(e.find("16384x16384 pixels, which need at least"), std::string::npos) << e;
    EXPECT_NE(e.find("but the file has " + std::to_string(file.size())), std::string::npos) << e;
  };
  auto set_le32 = [](std::vector<uint8_t>& v, size_t at, uint32_t x) {
    for (int k = 0; k < 4; ++k) v[at + k] = uint8_t(x >> (8 * k));
  };
  for (int bpp : {24, 32}) {
    std::vector<uint8_t> bmp = make_bmp(random_pixels(4, 2, bpp / 8, seed_), bpp);
    ASSERT_EQ(decode(bmp, 3, 2, 4).size(), 3u * 2 * 4);
    set_le32(bmp, 18, 16384);  // width
    set_le32(bmp, 22, 16384);  // height
    expect_refused(bmp, bpp == 24 ? "BMP 24" : "BMP 32");
  }
  expect_refused(make_raw_png(16384, 16384, 8, 0), "PNG, 1 MiB of zero rows deflated");
  std::vector<uint8_t> jpg = make_jpg(random_pixels(8, 8, 1, seed_));
  ASSERT_EQ(decode(jpg, 1, 8, 8).size(), 8u * 8);
  size_t sof = 0;
  for (size_t i = 2; i + 9 < jpg.size() && !sof; ++i)
    if (jpg[i] == 0xFF && jpg[i + 1] == 0xC0) sof = i;
  ASSERT_NE(sof, 0u);
  for (size_t at : {sof + 5, sof + 7}) jpg[at] = 0x40, jpg[at + 1] = 0;  // height, width 16384
  expect_refused(jpg, "JPEG");
  // An honest large image is not refused by this check (a flat PNG compresses about 100:1 here).
  const auto flat = flat_png(1024, 1024, 7);
  EXPECT_LT(flat.size(), 1024u * 1024 / 20);
  EXPECT_EQ(decode(flat, 1, 4, 4, true).size(), 16u);
}

// Found by fuzz/fuzz_image: stb_image reserves the length an IDAT chunk claims before reading it,
// so a 174-byte PNG claiming a 2 GB chunk allocated 2 GB. Refused before stb sees the data.
TEST_F(ImageTest, PngChunkClaimingMoreThanTheFileIsRefused) {
  std::vector<uint8_t> png = make_png(random_pixels(5, 3, 2, seed_));
  ASSERT_EQ(decode(png, 1, 3, 5).size(), 15u);
  size_t idat = 0;
  for (size_t i = 8; i + 8 <= png.size() && !idat; ++i)
    if (std::equal(png.begin() + i + 4, png.begin() + i + 8, "IDAT")) idat = i;
  ASSERT_NE(idat, 0u);
  png[idat] = 0x7e;  // length 0x7e0000xx: about 2 GB
  const std::string e = error_of([&] { decode(png, 1, 3, 5); });
  EXPECT_NE(e.find("IDAT) claims more bytes than the file holds"), std::string::npos) << e;
}

TEST_F(ImageTest, RefusalsWithReasons) {
  std::string e = error_of([&] { decode(make_raw_png(6, 4, 16, 0), 1, 4, 6); });
  EXPECT_NE(e.find("16-bit"), std::string::npos) << e;
  e = error_of([&] { decode(make_raw_png(20000, 3, 8, 0), 1, 3, 20000, true); });
  EXPECT_NE(e.find("20000x3"), std::string::npos) << e;
  EXPECT_NE(e.find("16384"), std::string::npos) << e;
  const std::string hdr = "#?RADIANCE\nFORMAT=32-bit_rle_rgbe\n\n-Y 2 +X 2\n";
  std::vector<uint8_t> hdr_file(hdr.begin(), hdr.end());
  hdr_file.resize(hdr_file.size() + 16, 128);
  e = error_of([&] { decode(hdr_file, 3, 2, 2); });
  EXPECT_NE(e.find("HDR"), std::string::npos) << e;
  e = error_of([&] {
    decode({'n', 'o', 't', ' ', 'a', 'n', ' ', 'i', 'm', 'a', 'g', 'e'}, 1, 2, 2);
  });
  EXPECT_NE(e.find("not a readable"), std::string::npos) << e;
  // A valid header with a truncated body: passes stbi_info, fails to decode (without its IEND
  // chunk), or is refused before decoding (cut inside the image data).
  auto png = make_png(random_pixels(9, 9, 3, seed_));
  const auto no_iend = std::vector<uint8_t>(png.begin(), png.end() - 12);
  e = error_of([&] { decode(no_iend, 3, 9, 9); });
  EXPECT_NE(e.find("cannot decode"), std::string::npos) << e;
  png.resize(png.size() / 2);
  e = error_of([&] { decode(png, 3, 9, 9); });
  EXPECT_NE(e.find("corrupt PNG"), std::string::npos) << e;
  write("t.png", png);
  e = error_of([&] { load_image_file(path("t.png"), 3, 9, 9, false); });
  EXPECT_EQ(e.rfind(path("t.png") + ": ", 0), 0u) << e;  // "file: reason"
  e = error_of([&] { load_image_file(path("missing.png"), 3, 9, 9, false); });
  EXPECT_NE(e.find("cannot open"), std::string::npos) << e;
}

TEST_F(ImageTest, ResizeOrRefuse) {
  const auto png = flat_png(10, 6, 200);
  std::string e = error_of([&] { decode(png, 1, 3, 5); });
  EXPECT_NE(e.find("10x6"), std::string::npos) << e;
  EXPECT_NE(e.find("data.resize"), std::string::npos) << e;
  const auto small = decode(png, 3, 3, 5, true);
  ASSERT_EQ(small.size(), 3u * 3 * 5);
  for (uint8_t v : small) EXPECT_NEAR(v, 200, 1);  // a flat image stays flat
  const auto big = decode(png, 1, 13, 21, true);
  ASSERT_EQ(big.size(), 13u * 21);
  for (uint8_t v : big) EXPECT_NEAR(v, 200, 1);
  // A left/right split stays a left/right split.
  Pixels p{8, 8, 1, std::vector<uint8_t>(64)};
  for (int y = 0; y < 8; ++y)
    for (int x = 0; x < 8; ++x) p.hwc[y * 8 + x] = x < 4 ? 0 : 255;
  const auto half = decode(make_png(p), 1, 4, 4, true);
  EXPECT_LT(half[0], 30);
  EXPECT_GT(half[3], 225);
}

TEST_F(ImageTest, FolderLoading) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  // Classes come sorted, files sorted by name, extensions case-insensitive, others ignored.
  write("train/zebra/b.PNG", flat_png(4, 3, 30));
  write("train/zebra/a.png", flat_png(4, 3, 20));
  write("train/apple/x.bmp", make_bmp(random_pixels(4, 3, 3, seed_), 24));
  write("train/apple/notes.txt", {'h', 'i'});
  write("train/apple/.hidden.png", {1, 2, 3});
  write("train/.git/junk.png", {1, 2, 3});
  ImageLoadOptions opt;
  opt.channels = 1;
  opt.height = 3;
  opt.width = 4;
  Dataset d = load_image_folder(path("train"), opt);
  ASSERT_EQ(d.n, 3);
  EXPECT_EQ(d.class_names, (std::vector<std::string>{"apple", "zebra"}));
  EXPECT_EQ(d.labels, (std::vector<int32_t>{0, 1, 1}));
  EXPECT_EQ(d.images[12], 20);  // zebra/a.png before zebra/b.PNG
  EXPECT_EQ(d.images[24], 30);
  // The test set takes the training classes; a class it lacks is an error, so is an extra one.
  write("test/zebra/q.png", flat_png(4, 3, 1));
  std::string e = error_of([&] { load_image_folder(path("test"), opt, d.class_names); });
  EXPECT_NE(e.find("'apple' is missing"), std::string::npos) << e;
  write("test/apple/q.png", flat_png(4, 3, 1));
  write("test/pear/q.png", flat_png(4, 3, 1));
  e = error_of([&] { load_image_folder(path("test"), opt, d.class_names); });
  EXPECT_NE(e.find("'pear' is not one of the 2 classes"), std::string::npos) << e;
}

TEST_F(ImageTest, FolderErrors) {
  ImageLoadOptions opt;
  opt.height = 3;
  opt.width = 4;
  std::string e = error_of([&] { load_image_folder(path("nowhere"), opt); });
  EXPECT_NE(e.find("does not exist"), std::string::npos) << e;
  fs::create_directories(path("root/empty"));
  write("root/full/a.png", flat_png(4, 3, 9));
  write("root/empty/readme.txt", {'x'});
  e = error_of([&] { load_image_folder(path("root"), opt); });
  EXPECT_NE(e.find("empty class folder"), std::string::npos) << e;
  EXPECT_NE(e.find("empty"), std::string::npos) << e;
  fs::create_directories(path("flat"));
  write("flat/a.png", flat_png(4, 3, 9));
  e = error_of([&] { load_image_folder(path("flat"), opt); });
  EXPECT_NE(e.find("no class subfolders"), std::string::npos) << e;
}

TEST_F(ImageTest, UndecodableFileStopsOrIsSkipped) {
  write("r/a/good1.png", flat_png(4, 3, 9));
  write("r/a/bad.png", {'j', 'u', 'n', 'k', '!', '!', '!', '!'});
  write("r/b/good2.png", flat_png(4, 3, 7));
  write("r/b/wrong_size.png", flat_png(5, 5, 7));
  ImageLoadOptions opt;
  opt.height = 3;
  opt.width = 4;
  std::string e = error_of([&] { load_image_folder(path("r"), opt); });
  EXPECT_EQ(e.rfind(path("r/a/bad.png") + ": ", 0), 0u) << e;  // "file: reason", first in order
  EXPECT_NE(e.find("skip_bad_images"), std::string::npos) << e;
  opt.skip_bad_images = true;
  opt.keep_skipped = 1;
  Dataset d = load_image_folder(path("r"), opt);
  EXPECT_EQ(d.n, 2);
  EXPECT_EQ(d.skipped, 2);
  ASSERT_EQ(d.skipped_examples.size(), 1u);
  EXPECT_NE(d.skipped_examples[0].find("bad.png"), std::string::npos);
  EXPECT_EQ(d.labels, (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(d.images[0], 9);
  EXPECT_EQ(d.images[12], 7);
  // A class whose every image is unreadable is an error even when skipping.
  write("s/a/good.png", flat_png(4, 3, 9));
  write("s/b/bad.png", {'x', 'y'});
  e = error_of([&] { load_image_folder(path("s"), opt); });
  EXPECT_NE(e.find("class 'b' has no usable images"), std::string::npos) << e;
}

TEST_F(ImageTest, ListFile) {
  write("imgs/one.png", flat_png(4, 3, 11));
  write("imgs/two.png", flat_png(4, 3, 22));
  write("abs/three.png", flat_png(4, 3, 33));  // listed by its absolute path below
  const std::string abs = path("abs/three.png");
  write_text("list.csv",
             "path,label\n# a comment\n\nimgs/one.png,1\r\n\"imgs/two.png\", 0\n" + abs + ",2\n");
  ImageLoadOptions opt;
  opt.height = 3;
  opt.width = 4;
  Dataset d = load_image_list(path("list.csv"), opt);
  ASSERT_EQ(d.n, 3);
  EXPECT_EQ(d.class_names, (std::vector<std::string>{"0", "1", "2"}));
  EXPECT_EQ(d.labels, (std::vector<int32_t>{1, 0, 2}));
  EXPECT_EQ(d.images[0], 11);
  EXPECT_EQ(d.images[12], 22);
  EXPECT_EQ(d.images[24], 33);

  // Names: sorted set when no classes are given; the given order otherwise; indices allowed then.
  write_text("names.csv", "imgs/one.png,dog\nimgs/two.png,cat\n");
  Dataset n = load_image_list(path("names.csv"), opt);
  EXPECT_EQ(n.class_names, (std::vector<std::string>{"cat", "dog"}));
  EXPECT_EQ(n.labels, (std::vector<int32_t>{1, 0}));
  write_text("mixed.csv", "imgs/one.png,dog\nimgs/two.png,0\n");
  Dataset m = load_image_list(path("mixed.csv"), opt, {"dog", "cat"});
  EXPECT_EQ(m.labels, (std::vector<int32_t>{0, 0}));
  std::string e = error_of([&] { load_image_list(path("mixed.csv"), opt); });
  EXPECT_NE(e.find("mixes class indices and class names"), std::string::npos) << e;
  EXPECT_NE(e.find("mixed.csv:2: "), std::string::npos) << e;
}

TEST_F(ImageTest, ListFileErrors) {
  write("imgs/one.png", flat_png(4, 3, 11));
  ImageLoadOptions opt;
  opt.height = 3;
  opt.width = 4;
  write_text("range.csv", "imgs/one.png,0\nimgs/one.png,5\n");
  std::string e = error_of([&] { load_image_list(path("range.csv"), opt, {"a", "b", "c"}); });
  EXPECT_NE(e.find("range.csv:2: label 5 is outside [0, 3)"), std::string::npos) << e;
  write_text("neg.csv", "imgs/one.png,-1\n");
  e = error_of([&] { load_image_list(path("neg.csv"), opt, {"a", "b"}); });
  EXPECT_NE(e.find("label -1 is outside"), std::string::npos) << e;
  write_text("unknown.csv", "imgs/one.png,horse\n");
  e = error_of([&] { load_image_list(path("unknown.csv"), opt, {"a", "b"}); });
  EXPECT_NE(e.find("unknown class \"horse\""), std::string::npos) << e;
  write_text("nocomma.csv", "imgs/one.png\n");
  e = error_of([&] { load_image_list(path("nocomma.csv"), opt); });
  EXPECT_NE(e.find("nocomma.csv:1: expected \"path,label\""), std::string::npos) << e;
  write_text("empty.csv", "# nothing\n");
  e = error_of([&] { load_image_list(path("empty.csv"), opt); });
  EXPECT_NE(e.find("no entries"), std::string::npos) << e;
  e = error_of([&] { load_image_list(path("absent.csv"), opt); });
  EXPECT_NE(e.find("cannot open"), std::string::npos) << e;

  // A missing image: stops with its line and path, or is skipped.
  write_text("missing.csv", "imgs/one.png,0\nimgs/gone.png,1\n");
  e = error_of([&] { load_image_list(path("missing.csv"), opt); });
  EXPECT_NE(e.find("missing.csv:2: "), std::string::npos) << e;
  EXPECT_NE(e.find("gone.png"), std::string::npos) << e;
  opt.skip_bad_images = true;
  Dataset d = load_image_list(path("missing.csv"), opt);
  EXPECT_EQ(d.n, 1);
  EXPECT_EQ(d.skipped, 1);
  EXPECT_EQ(d.num_classes(), 2);
}

TEST_F(ImageTest, LoadDataFolderAndListAndCheckReport) {
  write("train/a/1.png", flat_png(4, 3, 10));
  write("train/a/2.png", flat_png(4, 3, 20));
  write("train/b/1.png", flat_png(4, 3, 30));
  write("train/b/2.bmp", {'B', 'M', 0, 0});
  write("test/a/1.png", flat_png(4, 3, 40));
  write("test/b/1.png", flat_png(4, 3, 50));
  DataOptions opt;
  opt.format = DataFormat::Folder;
  opt.train = path("train");
  opt.test = path("test");
  opt.height = 3;
  opt.width = 4;
  EXPECT_THROW(load_data(opt), Error);
  opt.skip_bad_images = true;
  DataSplits s = load_data(opt);
  EXPECT_EQ(s.train.n, 3);
  EXPECT_EQ(s.test.n, 2);
  EXPECT_EQ(s.train.skipped, 1);

  opt.skip_bad_images = false;
  int64_t problems = -1;
  const std::string report = check_data_report(opt, &problems);
  EXPECT_EQ(problems, 1) << report;
  EXPECT_NE(report.find("2.bmp"), std::string::npos) << report;
  EXPECT_NE(report.find("a=2 b=1"), std::string::npos) << report;
  EXPECT_NE(report.find("4x3 gray"), std::string::npos) << report;
  EXPECT_NE(report.find("normalization"), std::string::npos) << report;

  opt.train = path("nowhere");
  const std::string bad = check_data_report(opt, &problems);
  EXPECT_EQ(problems, 1);
  EXPECT_NE(bad.find("error: "), std::string::npos) << bad;
  EXPECT_NE(bad.find("does not exist"), std::string::npos) << bad;

  write_text("l.csv", "train/a/1.png,a\ntrain/b/1.png,b\n");
  opt.format = DataFormat::List;
  opt.train = path("l.csv");
  opt.test = "";
  opt.channels = 3;
  DataSplits l = load_data(opt);
  EXPECT_EQ(l.train.n, 2);
  EXPECT_EQ(l.train.c, 3);
  EXPECT_EQ(l.test.n, 0);
  problems = -1;
  const std::string ok = check_data_report(opt, &problems);
  EXPECT_EQ(problems, 0) << ok;
  EXPECT_NE(ok.find("result: ok"), std::string::npos) << ok;
}

TEST_F(ImageTest, CropKeepsTheAspectRatio) {
  // 12x4: a black 4-pixel border left and right around a white 4x4 middle. Cropped to a square
  // the middle fills the image; stretched, the black ends stay visible at both sides.
  Pixels p{12, 4, 1, std::vector<uint8_t>(48)};
  for (int y = 0; y < 4; ++y)
    for (int x = 0; x < 12; ++x) p.hwc[size_t(y) * 12 + x] = x >= 4 && x < 8 ? 255 : 0;
  const auto png = make_png(p);
  const auto crop = decode_image(png.data(), png.size(), 1, 4, 4, true, nullptr, true);
  for (uint8_t v : crop) EXPECT_GT(v, 225);
  const auto stretch = decode_image(png.data(), png.size(), 1, 4, 4, true, nullptr, false);
  EXPECT_LT(stretch[0], 60);
  EXPECT_LT(stretch[3], 60);
  // Taller than wide: the middle rows are kept.
  Pixels t{2, 6, 1, std::vector<uint8_t>(12, 0)};
  for (int x = 0; x < 2; ++x) t.hwc[2 * 2 + x] = t.hwc[3 * 2 + x] = 255;
  const auto tall = make_png(t);
  const auto rows = decode_image(tall.data(), tall.size(), 1, 2, 2, true, nullptr, true);
  for (uint8_t v : rows) EXPECT_GT(v, 225);
}

TEST_F(ImageTest, CheckDataGroupsProblemsByCause) {
  // 7 images of other sizes (one cause, numbers vary), 2 corrupt files, 2 good ones.
  for (int i = 0; i < 7; ++i)
    write("train/" + std::string(i % 2 ? "a" : "b") + "/big" + std::to_string(i) + ".png",
          flat_png(5 + i, 3 + i, 9));
  write("train/a/bad1.png", {'x', 'y'});
  write("train/b/bad2.png", {'x', 'y', 'z'});
  write("train/a/ok.png", flat_png(4, 3, 10));
  write("train/b/ok.png", flat_png(4, 3, 20));
  DataOptions opt;
  opt.format = DataFormat::Folder;
  opt.train = path("train");
  opt.height = 3;
  opt.width = 4;
  int64_t problems = 0;
  const std::string r = check_data_report(opt, &problems);
  EXPECT_EQ(problems, 9) << r;
  EXPECT_NE(r.find("unusable: 9 file(s), 2 cause(s)"), std::string::npos) << r;
  EXPECT_NE(r.find("7 x image is 6x4 (WxH) but the model takes 4x3"), std::string::npos) << r;
  EXPECT_NE(r.find("(numbers vary by file)"), std::string::npos) << r;
  EXPECT_NE(r.find("... and 4 more"), std::string::npos) << r;
  EXPECT_NE(r.find("2 x not a readable PNG/BMP/JPEG image"), std::string::npos) << r;
  // At most 3 example files per cause: 3 + 2 of the 9 files are named.
  size_t named = 0;
  for (size_t at = r.find(path("train")); at != std::string::npos;
       at = r.find(path("train"), at + 1))
    ++named;
  EXPECT_EQ(named, 5u + 2u) << r;  // + the header line and the "from <root>" line
  EXPECT_NE(r.find("source sizes: width 4..11, height 3..9 (8 different)"), std::string::npos) << r;
}

TEST_F(ImageTest, MissingIdxFilesSayHowToFetchThem) {
  DataOptions opt;
  opt.format = DataFormat::Idx;
  opt.dir = path("data/fashion");
  std::string e = error_of([&] { load_data(opt); });
  EXPECT_NE(e.find("scripts/get_data.sh fashion-mnist " + opt.dir), std::string::npos) << e;
  EXPECT_EQ(dataset_download_hint("datasets/mnist"), "fetch it with: scripts/get_data.sh mnist");
  EXPECT_NE(dataset_download_hint("elsewhere").find("mnist|fashion-mnist elsewhere"),
            std::string::npos);
  int64_t problems = 0;
  EXPECT_NE(check_data_report(opt, &problems).find("get_data.sh"), std::string::npos);
}

TEST_F(ImageTest, NoUsableImageNamesTheCommonCauseOnce) {
  for (int i = 0; i < 4; ++i)
    write("train/" + std::string(i % 2 ? "a" : "b") + "/" + std::to_string(i) + ".png",
          flat_png(6 + i, 5, 9));
  write("train/a/bad.png", {'x'});
  DataOptions opt;
  opt.format = DataFormat::Folder;
  opt.train = path("train");
  opt.height = 3;
  opt.width = 4;
  opt.skip_bad_images = true;
  const std::string e = error_of([&] { load_data(opt); });
  EXPECT_NE(
      e.find("none of the 5 images is usable: 4 x image is 7x5 (WxH) but the model takes 4x3"),
      std::string::npos)
      << e;
  EXPECT_NE(e.find("e.g. " + path("train/a/1.png")), std::string::npos) << e;
  EXPECT_NE(e.find("and 1 other cause(s)"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  // --check-data still says what the images are.
  int64_t problems = 0;
  const std::string r = check_data_report(opt, &problems);
  EXPECT_NE(r.find("error: " + path("train") + ": none of the 5 images is usable"),
            std::string::npos)
      << r;
  EXPECT_NE(r.find("source sizes: width 6..9, height 5..5 (4 different)"), std::string::npos) << r;
}
