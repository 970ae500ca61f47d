#include "data/image_folder.h"

#include <spdlog/spdlog.h>
#include <stb_image.h>
#include <stb_image_resize.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <climits>
#include <filesystem>
#include <memory>
#include <set>
#include <thread>
#include <unordered_map>

#include "runtime/error.h"
#include "runtime/file_io.h"
#include "runtime/text.h"

namespace cnn {

namespace fs = std::filesystem;

namespace {

std::string lower(std::string s) {
  for (char& ch : s) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

bool has_image_extension(const fs::path& p) {
  const std::string ext = lower(p.extension().string());
  return ext == ".png" || ext == ".bmp" || ext == ".jpg" || ext == ".jpeg";
}

bool hidden(const fs::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name[0] == '.';
}

const char* channel_word(int n) {
  switch (n) {
    case 1:
      return "gray";
    case 2:
      return "gray+alpha";
    case 3:
      return "RGB";
    default:
      return "RGBA";
  }
}

// The bytes of one image file, its size checked against its header first (defined below).
std::vector<uint8_t> read_image_file(const std::string& path);

// One file to decode, with where it was listed (for messages) and its label.
struct ImageJob {
  std::string path;
  std::string where;  // "" or "list.csv:12: "
  int32_t label = 0;
};

// Decodes the jobs (in parallel: decoding dominates and the jobs are independent) into a Dataset
// in job order, then applies the skip policy.
Dataset decode_jobs(const std::vector<ImageJob>& jobs, const ImageLoadOptions& opt,
                    std::vector<std::string> class_names, const std::string& source) {
  CNN_CHECK(opt.channels == 1 || opt.channels == 3, "data.channels is {}, expected 1 or 3",
            opt.channels);
  CNN_CHECK(
      opt.height > 0 && opt.width > 0 && opt.height <= kMaxImageSide && opt.width <= kMaxImageSide,
      "data.height/width are {}x{}, expected 1..{}", opt.height, opt.width, kMaxImageSide);
  const size_t n = jobs.size();
  const size_t image_size = size_t(opt.channels) * opt.height * opt.width;
  std::vector<uint8_t> images(n * image_size);  // (N, C, H, W)
  std::vector<std::string> errors(n), reasons(n), formats(n);

  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < n; i = next++) {
      try {
        const std::vector<uint8_t> bytes = read_image_file(jobs[i].path);
        try {
          std::vector<uint8_t> px =
              decode_image(bytes.data(), bytes.size(), opt.channels, opt.height, opt.width,
                           opt.resize, &formats[i], opt.crop);
          std::copy(px.begin(), px.end(), images.begin() + i * image_size);
        } catch (const std::exception& e) {
          errors[i] = jobs[i].path + ": " + e.what();
          reasons[i] = e.what();
        }
      } catch (const std::exception& e) {  // read_file's message already names the file
        errors[i] = e.what();
        reasons[i] = "cannot read the file";
      }
      if (!errors[i].empty()) errors[i] = jobs[i].where + errors[i];
    }
  };
  const size_t hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t threads = std::min<size_t>({hw, 16, n / 32 + 1});
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();

  Dataset d;
  d.c = opt.channels;
  d.h = opt.height;
  d.w = opt.width;
  d.class_names = std::move(class_names);
  d.source = source;
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!errors[i].empty()) {
      CNN_CHECK(opt.skip_bad_images, "{} (set data.skip_bad_images: true to skip such files)",
                errors[i]);
      if (d.skipped_examples.size() < opt.keep_skipped) {
        d.skipped_examples.push_back(errors[i]);
        d.skipped_reasons.push_back(reasons[i]);
      }
      ++d.skipped;
      // A file refused for its size still has one (read from its header): it counts.
      if (opt.source_formats && !formats[i].empty()) ++(*opt.source_formats)[formats[i]];
      continue;
    }
    if (opt.source_formats) ++(*opt.source_formats)[formats[i]];
    if (kept != i)
      std::copy_n(images.begin() + i * image_size, image_size, images.begin() + kept * image_size);
    d.labels.push_back(jobs[i].label);
    ++kept;
  }
  images.resize(kept * image_size);
  d.images = std::move(images);
  d.n = int(kept);
  if (kept == 0) {
    // Usually one cause for all (every image of another size, with data.resize off): say it
    // once, with its count, instead of the first file's reason alone.
    std::map<std::string, size_t> count;
    std::string top;
    for (const std::string& r : reasons) {
      const size_t c = ++count[cause_of(r)];
      if (top.empty() || c > count[cause_of(top)]) top = r;
    }
    const size_t top_count = count[cause_of(top)];
    const size_t first =
        size_t(std::find_if(reasons.begin(), reasons.end(),
                            [&](const std::string& r) { return cause_of(r) == cause_of(top); }) -
               reasons.begin());
    CNN_FAIL("{}: none of the {} images is usable: {} x {}, e.g. {}{}", source, n, top_count, top,
             jobs[first].where + jobs[first].path,
             count.size() > 1 ? fmt::format("; and {} other cause(s) (--check-data lists them)",
                                            count.size() - 1)
                              : "");
  }
  if (d.skipped) {
    spdlog::warn("{}: skipped {} unreadable image(s) of {}; first: {}", source, d.skipped, n,
                 d.skipped_examples.front());
  }
  return d;
}

int32_t parse_label_index(const std::string& s, bool* ok) {
  *ok = !s.empty() && s.size() <= 9 &&
        std::all_of(s.begin(), s.end(), [](char ch) { return std::isdigit((unsigned char)ch); });
  return *ok ? int32_t(std::stol(s)) : -1;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::string unquote(const std::string& s) {
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') return s.substr(1, s.size() - 2);
  return s;
}

std::string join(const std::vector<std::string>& v, size_t max_items = 12) {
  std::string out;
  for (size_t i = 0; i < v.size() && i < max_items; ++i) out += (i ? ", " : "") + excerpt(v[i]);
  if (v.size() > max_items) out += fmt::format(", ... ({} in all)", v.size());
  return out;
}

// stb_image 2.27 (Debian 12's libstb-dev) trusts the code counts of a JPEG Huffman table (DHT):
// more than 256 codes in one table write past the decoder's arrays (upstream checks this since
// 2.28). Walks the markers the way stb reads them, including the tables between progressive
// scans, and says whether every table declares at most 256 codes. Not a JPEG: true.
// Where a JPEG's data starts after its SOI marker, which stb also finds after 0xFF fill bytes
// (FF FF D8); 0 when the bytes are not a JPEG.
size_t jpeg_after_soi(const uint8_t* p, size_t n) {
  size_t i = 0;
  if (n == 0 || p[i++] != 0xFF) return 0;
  while (i < n && p[i] == 0xFF) ++i;
  return i < n && p[i] == 0xD8 ? i + 1 : 0;
}

bool jpeg_huffman_tables_fit(const uint8_t* p, size_t n) {
  size_t i = jpeg_after_soi(p, n);
  if (i == 0) return true;
  auto byte = [&](size_t k) -> size_t { return k < n ? p[k] : 0; };  // stb reads 0 past the end
  while (i + 1 < n) {
    if (p[i] != 0xFF) {  // entropy-coded data or junk: stb scans it for the next marker
      ++i;
      continue;
    }
    while (i < n && p[i] == 0xFF) ++i;  // fill bytes
    if (i >= n) break;
    const uint8_t m = p[i++];
    if (m == 0x00 || (m >= 0xD0 && m <= 0xD7)) continue;  // stuffed zero, restart marker
    const size_t len = byte(i) << 8 | byte(i + 1);
    if (m == 0xC4) {  // the tables of one segment, read as stb does: by their counts
      int64_t left = int64_t(len) - 2;
      for (size_t t = i + 2; left > 0;) {
        size_t codes = 0;
        for (size_t k = 1; k <= 16; ++k) codes += byte(t + k);
        if (codes > 256) return false;
        t += 17 + codes;
        left -= int64_t(17 + codes);
      }
    }
    const bool has_length = (m >= 0xC0 && m <= 0xCF) || (m >= 0xDA && m <= 0xDD) ||
                            (m >= 0xE0 && m <= 0xEF) || m == 0xFE;
    if (!has_length) break;  // EOI, or a marker stb refuses: it reads no further
    i += len;
  }
  return true;
}

// stb_image 2.27 reserves the length an IDAT chunk claims before reading it: a 174-byte PNG
// claiming a 2 GB chunk made it allocate 2 GB (found by fuzz/fuzz_image). Says whether every
// IDAT chunk up to IEND lies within the file (true for other formats).
bool png_idat_chunks_fit(const uint8_t* p, size_t n) {
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', 13, 10, 26, 10};
  if (n < 8 || !std::equal(kPng, kPng + 8, p)) return true;
  for (size_t i = 8; i + 8 <= n;) {
    const uint64_t len = uint64_t(p[i]) << 24 | uint64_t(p[i + 1]) << 16 | p[i + 2] << 8 | p[i + 3];
    const std::string type(reinterpret_cast<const char*>(p + i + 4), 4);
    if (type == "IDAT" && len > n - (i + 8)) return false;
    if (type == "IEND") break;
    i += 12 + len;  // length, type, data, CRC; len < 2^32 cannot overflow
  }
  return true;
}

// The fewest bytes in which a file of this format can hold a w x h image (0: not known).
// stb_image allocates the whole image from the header's size and reads past the end of a short
// file as zeros: a 70-byte BMP header claiming 16384x16384 made it allocate 1 GiB, and a 671-byte
// JPEG decode 268 million pixels (found by fuzz/fuzz_image). No valid file is smaller than this.
uint64_t min_file_bytes(const uint8_t* p, size_t n, uint64_t w, uint64_t h) {
  auto le16 = [&](size_t i) { return i + 1 < n ? uint64_t(p[i]) | uint64_t(p[i + 1]) << 8 : 0; };
  if (n >= 2 && p[0] == 'B' && p[1] == 'M') {  // stb reads no RLE: every pixel is in the file
    const uint64_t bpp = std::max<uint64_t>(le16(14) == 12 ? le16(24) : le16(28), 1);
    return h * ((w * bpp + 7) / 8);
  }
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', 13, 10, 26, 10};
  if (n >= 8 && std::equal(kPng, kPng + 8, p)) {  // deflate compresses at most 1032:1
    const uint8_t* end = p + std::min<size_t>(n, 64);
    static const uint8_t kIhdr[4] = {'I', 'H', 'D', 'R'};  // first, or after Apple's CgBI chunk
    const uint8_t* ihdr = std::search(p, end, kIhdr, kIhdr + 4);
    if (end - ihdr < 14) return 0;
    const uint64_t depth = std::max<uint8_t>(ihdr[12], 1), color = ihdr[13];
    const uint64_t channels = color == 2 ? 3 : color == 4 ? 2 : color == 6 ? 4 : 1;
    return h * (1 + (w * channels * depth + 7) / 8) / 1032;
  }
  // Huffman-coded: at least one bit per 8x8 block of a coded component, which may be subsampled
  // up to 4x in each direction: 1/16 bit per full-resolution block (as dense as 1-bit PNG).
  if (jpeg_after_soi(p, n)) return (w + 7) / 8 * ((h + 7) / 8) / 128;
  return 0;
}

uint32_t be32(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

// stb_image checks neither the CRC of a PNG chunk nor the Adler-32 of the zlib stream in IDAT:
// a PNG with flipped bits trained, passed --check-data and was classified with rc 0. Walks the
// chunks up to IEND, checks each one's CRC-32 (type and data), then inflates the concatenated
// IDAT data with zlib, which checks the Adler-32 at the stream's end. Throws "corrupt PNG: ...".
// Not a PNG: nothing to check. Apple's CgBI PNGs hold raw deflate (no Adler-32): CRCs only.
void check_png_checksums(const uint8_t* p, size_t n) {
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', 13, 10, 26, 10};
  if (n < 8 || !std::equal(kPng, kPng + 8, p)) return;
  std::vector<std::pair<size_t, size_t>> idat;  // (offset, length) of each IDAT's data
  bool cgbi = false;
  size_t i = 8;
  for (; i + 12 <= n;) {
    const uint64_t len = be32(p + i);
    const std::string type(reinterpret_cast<const char*>(p + i + 4), 4);
    CNN_CHECK(len <= n - i - 12, "corrupt PNG: chunk '{}' at byte {} runs past the end of the file",
              printable(type), i);
    const uint32_t want = be32(p + i + 8 + len);
    const uint32_t got = uint32_t(crc32(0, p + i + 4, uInt(4 + len)));
    CNN_CHECK(got == want,
              "corrupt PNG: chunk '{}' at byte {} fails its CRC check (stored 0x{:08x}, computed "
              "0x{:08x})",
              printable(type), i, want, got);
    if (type == "CgBI") cgbi = true;
    if (type == "IDAT") idat.emplace_back(i + 8, size_t(len));
    i += 12 + len;
    if (type == "IEND") break;
  }
  if (cgbi || idat.empty()) return;  // no image data: stb refuses it on its own

  z_stream zs{};
  CNN_CHECK(inflateInit(&zs) == Z_OK, "cannot start zlib");
  std::vector<uint8_t> sink(1 << 16);  // the pixels are stb's to decode: only the check counts
  int rc = Z_OK;
  for (size_t k = 0; k < idat.size() && rc != Z_STREAM_END; ++k) {
    zs.next_in = const_cast<Bytef*>(p + idat[k].first);
    zs.avail_in = uInt(idat[k].second);
    while (rc == Z_OK && zs.avail_in > 0) {
      zs.next_out = sink.data();
      zs.avail_out = uInt(sink.size());
      rc = inflate(&zs, Z_NO_FLUSH);
      if (rc == Z_BUF_ERROR) rc = Z_OK;  // needs the next chunk's bytes
    }
  }
  while (rc == Z_OK) {  // all input given: drain what zlib still holds
    zs.next_out = sink.data();
    zs.avail_out = uInt(sink.size());
    rc = inflate(&zs, Z_NO_FLUSH);
    if (rc == Z_OK && zs.avail_out == sink.size()) rc = Z_BUF_ERROR;
  }
  const std::string why = zs.msg ? zs.msg : zError(rc);
  inflateEnd(&zs);
  CNN_CHECK(rc != Z_DATA_ERROR || why != "incorrect data check",
            "corrupt PNG: the image data fails its Adler-32 check");
  CNN_CHECK(rc == Z_STREAM_END, "corrupt PNG: the image data (zlib) is {}",
            rc == Z_BUF_ERROR ? "truncated" : why);
}

// Files up to this size are read whole; a larger one first has its header read, which must
// describe an image that can need a file that large (an 8 GB file named .png was read whole).
constexpr uint64_t kSmallImageFile = uint64_t(16) << 20;

// The largest file an image of w x h pixels plausibly needs: 8 bytes per pixel (uncompressed
// 32-bit BMP, or PNG's stored deflate of RGBA, twice over) plus room for metadata.
uint64_t max_image_file_bytes(uint64_t w, uint64_t h) {
  return 8 * w * h + kSmallImageFile;
}

std::vector<uint8_t> read_image_file(const std::string& path) {
  const uint64_t size = regular_file_size(path);
  if (size <= kSmallImageFile) return read_file(path, {kSmallImageFile, "image file"});
  // Every format's size is in its first bytes (JPEG's after its APP segments, 64 KB each).
  const FileHead head = read_file_head(path, size_t(1) << 20);
  int iw = 0, ih = 0, comp = 0;
  CNN_CHECK(stbi_info_from_memory(head.bytes.data(), int(head.bytes.size()), &iw, &ih, &comp),
            "{}: not a readable PNG/BMP/JPEG image ({}; the file has {} bytes)", path,
            stbi_failure_reason(), head.file_bytes);
  const uint64_t most = max_image_file_bytes(uint64_t(iw), uint64_t(ih));
  CNN_CHECK(head.file_bytes <= most,
            "{}: the file has {} bytes, but a {}x{} image never needs more than {} (corrupt, or "
            "not an image)",
            path, head.file_bytes, iw, ih, most);
  return read_file(path, {most, "image file"});
}

}  // namespace

std::string cause_of(const std::string& reason) {
  std::string key;
  for (char c : reason)
    if (!std::isdigit(static_cast<unsigned char>(c)))
      key += c;
    else if (key.empty() || key.back() != '#')
      key += '#';
  return key;
}

std::vector<uint8_t> decode_image(const uint8_t* bytes, size_t size, int c, int h, int w,
                                  bool resize, std::string* format, bool crop) {
  CNN_CHECK(c == 1 || c == 3, "cannot convert images to {} channels, expected 1 or 3", c);
  CNN_CHECK(size > 0, "empty file");
  CNN_CHECK(size <= size_t(INT_MAX), "file of {} bytes is too large for an image", size);
  const int len = int(size);
  CNN_CHECK(jpeg_huffman_tables_fit(bytes, size),
            "corrupt JPEG: a Huffman table declares more than 256 codes");
  int iw = 0, ih = 0, comp = 0;
  CNN_CHECK(stbi_info_from_memory(bytes, len, &iw, &ih, &comp),
            "not a readable PNG/BMP/JPEG image ({})", stbi_failure_reason());
  CNN_CHECK(!stbi_is_hdr_from_memory(bytes, len),
            "HDR (floating-point) images are not supported, expected 8-bit PNG/BMP/JPEG");
  CNN_CHECK(!stbi_is_16_bit_from_memory(bytes, len),
            "16-bit images are not supported, expected 8 bits per channel");
  CNN_CHECK(iw > 0 && ih > 0 && iw <= kMaxImageSide && ih <= kMaxImageSide,
            "{}x{} pixels: sides above {} are refused", iw, ih, kMaxImageSide);
  if (format) *format = fmt::format("{}x{} {}", iw, ih, channel_word(comp));
  const uint64_t need = min_file_bytes(bytes, size, uint64_t(iw), uint64_t(ih));
  CNN_CHECK(png_idat_chunks_fit(bytes, size),
            "corrupt PNG: an image data chunk (IDAT) claims more bytes than the file holds");
  check_png_checksums(bytes, size);
  CNN_CHECK(size >= need,
            "the header says {}x{} pixels, which need at least {} bytes, but the file has {} "
            "(truncated or corrupt)",
            iw, ih, need, size);
  CNN_CHECK(resize || (iw == w && ih == h),
            "image is {}x{} (WxH) but the model takes {}x{} (set data.resize: stretch or crop to "
            "resize)",
            iw, ih, w, h);

  int dw = 0, dh = 0, n = 0;
  std::unique_ptr<stbi_uc, void (*)(void*)> px(stbi_load_from_memory(bytes, len, &dw, &dh, &n, 0),
                                               stbi_image_free);
  CNN_CHECK(px, "cannot decode ({})", stbi_failure_reason());
  CNN_CHECK(dw == iw && dh == ih && n >= 1 && n <= 4,
            "decoder returned {}x{}x{}, header said {}x{}", dw, dh, n, iw, ih);
  if (format) *format = fmt::format("{}x{} {}", iw, ih, channel_word(n));

  // Channel conversion first (the resize then touches fewer channels). HWC, c channels.
  const size_t pixels = size_t(iw) * ih;
  std::vector<uint8_t> hwc(pixels * c);
  const stbi_uc* p = px.get();
  for (size_t i = 0; i < pixels; ++i, p += n) {
    if (n <= 2) {  // gray (+ alpha, dropped)
      for (int k = 0; k < c; ++k) hwc[i * c + k] = p[0];
    } else if (c == 3) {  // RGB (+ alpha, dropped)
      for (int k = 0; k < 3; ++k) hwc[i * 3 + k] = p[k];
    } else {  // ITU-R 601-2 luma in 16-bit fixed point, rounded: PIL's convert("L")
      hwc[i] = uint8_t((p[0] * 19595u + p[1] * 38470u + p[2] * 7471u + 0x8000u) >> 16);
    }
  }
  if (iw != w || ih != h) {
    // The region that is scaled: all of the image, or (crop) its centered part of the target's
    // aspect ratio, compared as iw/ih vs w/h in integers.
    int rw = iw, rh = ih, x0 = 0, y0 = 0;
    if (crop && int64_t(iw) * h > int64_t(ih) * w) {  // wider than the target
      rw = std::max(1, int((int64_t(ih) * w + h / 2) / h));
      x0 = (iw - rw) / 2;
    } else if (crop && int64_t(iw) * h < int64_t(ih) * w) {  // taller
      rh = std::max(1, int((int64_t(iw) * h + w / 2) / w));
      y0 = (ih - rh) / 2;
    }
    std::vector<uint8_t> resized(size_t(w) * h * c);
    const uint8_t* region = hwc.data() + (size_t(y0) * iw + x0) * c;
    CNN_CHECK(stbir_resize_uint8(region, rw, rh, iw * c, resized.data(), w, h, 0, c),
              "resizing {}x{} to {}x{} failed", rw, rh, w, h);
    hwc = std::move(resized);
  }
  std::vector<uint8_t> chw(size_t(c) * h * w);  // (C, H, W)
  const size_t plane = size_t(h) * w;
  for (size_t i = 0; i < plane; ++i)
    for (int k = 0; k < c; ++k) chw[k * plane + i] = hwc[i * c + k];
  return chw;
}

std::vector<uint8_t> resize_chw(const uint8_t* src, int c, int h, int w, int oh, int ow) {
  CNN_CHECK(c > 0 && h > 0 && w > 0 && oh > 0 && ow > 0, "cannot resize {}x{}x{} to {}x{}", c, h, w,
            oh, ow);
  std::vector<uint8_t> out(size_t(c) * oh * ow);  // (C, OH, OW)
  for (int k = 0; k < c; ++k)
    CNN_CHECK(stbir_resize_uint8(src + size_t(k) * h * w, w, h, 0, out.data() + size_t(k) * oh * ow,
                                 ow, oh, 0, 1),
              "resizing {}x{} to {}x{} failed", w, h, ow, oh);
  return out;
}

std::vector<uint8_t> load_image_file(const std::string& path, int c, int h, int w, bool resize,
                                     bool crop) {
  const std::vector<uint8_t> bytes = read_image_file(path);
  try {
    return decode_image(bytes.data(), bytes.size(), c, h, w, resize, nullptr, crop);
  } catch (const Error& e) {
    CNN_FAIL("{}: {}", path, e.what());
  }
}

Dataset load_image_folder(const std::string& root, const ImageLoadOptions& opt,
                          const std::vector<std::string>& class_names) {
  std::error_code ec;
  CNN_CHECK(fs::exists(root, ec), "{}: image folder does not exist", root);
  CNN_CHECK(fs::is_directory(root, ec), "{}: is not a folder (expected root/<class>/*.png)", root);
  std::vector<std::string> subdirs;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code type_ec;
    if (!it->is_directory(type_ec) || hidden(it->path())) continue;
    std::string name = it->path().filename().string();
    // Class names go into the checkpoint (JSON): a folder named with bytes that are not UTF-8
    // failed there, after a whole epoch of training.
    CNN_CHECK(valid_utf8(name),
              "{}: class folder '{}' is not named in UTF-8; class names must be text (rename it)",
              root, printable(name));
    subdirs.push_back(std::move(name));
  }
  CNN_CHECK(!ec, "{}: cannot list the folder ({})", root, ec.message());
  std::sort(subdirs.begin(), subdirs.end());
  CNN_CHECK(!subdirs.empty(), "{}: no class subfolders (expected root/<class>/*.png|bmp|jpg)",
            root);

  std::vector<std::string> classes = class_names.empty() ? subdirs : class_names;
  const std::set<std::string> known(classes.begin(), classes.end());
  for (const auto& s : subdirs)
    CNN_CHECK(known.count(s), "{}: class folder '{}' is not one of the {} classes ({})", root, s,
              classes.size(), join(classes));

  std::vector<ImageJob> jobs;
  for (size_t k = 0; k < classes.size(); ++k) {
    const fs::path dir = fs::path(root) / classes[k];
    CNN_CHECK(fs::is_directory(dir, ec), "{}: class folder '{}' is missing", root,
              printable(classes[k]));
    std::vector<std::string> files;
    size_t ignored = 0;
    // Links, FIFOs and devices with an image extension are listed too: reading one refuses it
    // by its type (one line naming it; skippable), never blocks on it or reads it endlessly.
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      std::error_code type_ec;
      if (hidden(it->path()) || it->is_directory(type_ec)) continue;
      if (has_image_extension(it->path()))
        files.push_back(it->path().string());
      else
        ++ignored;
    }
    CNN_CHECK(!ec, "{}: cannot list the folder ({})", printable(dir.string()), ec.message());
    std::sort(files.begin(), files.end());
    CNN_CHECK(!files.empty(), "{}: empty class folder: no .png/.bmp/.jpg/.jpeg files{}",
              dir.string(), ignored ? fmt::format(" ({} other files)", ignored) : "");
    if (ignored)
      spdlog::info("{}: ignored {} files without an image extension", dir.string(), ignored);
    for (auto& f : files) jobs.push_back({std::move(f), "", int32_t(k)});
  }
  Dataset d = decode_jobs(jobs, opt, classes, root);
  std::vector<int64_t> per_class(d.class_names.size(), 0);
  for (int32_t l : d.labels) ++per_class[l];
  for (size_t k = 0; k < per_class.size(); ++k)
    CNN_CHECK(per_class[k] > 0, "{}: class '{}' has no usable images (all were unreadable)", root,
              d.class_names[k]);
  return d;
}

Dataset load_image_list(const std::string& csv_path, const ImageLoadOptions& opt,
                        const std::vector<std::string>& class_names) {
  const std::vector<uint8_t> raw = read_file(csv_path, {kMaxListFileBytes, "list file"});
  const std::string text(raw.begin(), raw.end());
  const fs::path base = fs::path(csv_path).parent_path();

  struct Row {
    std::string path, label, where;
  };
  std::vector<Row> rows;
  size_t line_no = 0, pos = 0;
  bool first = true;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = trim(text.substr(pos, end - pos));
    pos = end + 1;
    ++line_no;
    if (line.empty() || line[0] == '#') continue;
    const std::string where = fmt::format("{}:{}: ", csv_path, line_no);
    if (first && lower(line) == "path,label") {
      first = false;
      continue;
    }
    first = false;
    const size_t comma = line.rfind(',');
    CNN_CHECK(comma != std::string::npos, "{}expected \"path,label\", got \"{}\"", where,
              excerpt(line));
    Row r{unquote(trim(line.substr(0, comma))), unquote(trim(line.substr(comma + 1))), where};
    CNN_CHECK(!r.path.empty(), "{}the path is empty", where);
    CNN_CHECK(!r.label.empty(), "{}the label is empty", where);
    rows.push_back(std::move(r));
  }
  CNN_CHECK(!rows.empty(), "{}: the list file has no entries (expected \"path,label\" lines)",
            csv_path);

  std::vector<std::string> classes = class_names;
  if (classes.empty()) {  // derive: all indices, or all names
    bool numeric = true, named = true;
    int32_t max_index = 0;
    std::set<std::string> names;
    for (const Row& r : rows) {
      bool ok = false;
      const int32_t v = parse_label_index(r.label, &ok);
      numeric = numeric && ok;
      named = named && !ok;
      CNN_CHECK(numeric || named,
                "{}label \"{}\" mixes class indices and class names in one file; list the names in "
                "data.classes to mix them",
                r.where, r.label);
      if (ok) {
        max_index = std::max(max_index, v);
      } else {
        CNN_CHECK(valid_utf8(r.label), "{}the class name \"{}\" is not valid UTF-8", r.where,
                  printable(r.label));
        names.insert(r.label);
      }
    }
    // Every class index up to the largest becomes a class name: one row labelled 99999999 made
    // 10^8 of them. More classes than rows (and than kMaxListClasses) is a typo or a corrupt file.
    const size_t most = std::max(rows.size(), kMaxListClasses);
    CNN_CHECK(!numeric || size_t(max_index) < most,
              "{}: label {} would make {} classes, but the file has {} rows; list the class names "
              "in data.classes if that is meant",
              csv_path, max_index, int64_t(max_index) + 1, rows.size());
    if (numeric)
      for (int32_t k = 0; k <= max_index; ++k) classes.push_back(std::to_string(k));
    else
      classes.assign(names.begin(), names.end());
  }
  std::unordered_map<std::string, int32_t> index_of;
  for (size_t k = 0; k < classes.size(); ++k) index_of.emplace(classes[k], int32_t(k));

  std::vector<ImageJob> jobs;
  jobs.reserve(rows.size());
  for (const Row& r : rows) {
    int32_t label = -1;
    if (auto it = index_of.find(r.label); it != index_of.end()) {  // a name (or "3" named "3")
      label = it->second;
    } else {
      bool ok = false;
      const bool negative = r.label.size() > 1 && r.label[0] == '-';
      label = parse_label_index(negative ? r.label.substr(1) : r.label, &ok);
      CNN_CHECK(!(ok && negative), "{}label {} is outside [0, {})", r.where, r.label,
                classes.size());
      CNN_CHECK(ok, "{}unknown class \"{}\" (classes: {})", r.where, excerpt(r.label),
                join(classes));
      CNN_CHECK(label < int32_t(classes.size()), "{}label {} is outside [0, {})", r.where, label,
                classes.size());
    }
    fs::path p(r.path);
    if (p.is_relative()) p = base / p;
    jobs.push_back({p.string(), r.where, label});
  }
  return decode_jobs(jobs, opt, classes, csv_path);
}

}  // namespace cnn
