#include "data/idx_cache.h"

#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "runtime/atomic_file.h"
#include "runtime/error.h"
#include "runtime/file_io.h"

namespace cnn {
namespace {

constexpr char kMagic[8] = {'C', 'N', 'N', 'I', 'D', 'X', 'D', '1'};

// What the decoded copy was made from. Fixed-size, written and read as bytes (same machine).
struct CacheHeader {
  char magic[8];
  uint64_t source_size;
  int64_t source_mtime_ns;
  uint32_t gzip_crc32;  // the source's gzip trailer: CRC-32 of the decoded bytes
  uint32_t gzip_isize;  // and their length mod 2^32
  uint64_t payload;     // bytes of decoded IDX (header included) after this struct
};

// The source's identity, or false when it is no gzip file worth caching.
bool source_header(const std::string& path, CacheHeader* h) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
      uint64_t(st.st_size) < kMinCachedSource)
    return false;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  uint8_t magic[2] = {0, 0}, trailer[8] = {};
  const bool ok = std::fread(magic, 1, 2, f) == 2 && is_gzip(magic, 2) &&
                  std::fseek(f, -8, SEEK_END) == 0 && std::fread(trailer, 1, 8, f) == 8;
  std::fclose(f);
  if (!ok) return false;
  std::memset(h, 0, sizeof(*h));
  std::memcpy(h->magic, kMagic, sizeof(kMagic));
  h->source_size = uint64_t(st.st_size);
  h->source_mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  // gzip stores both little-endian.
  for (int i = 3; i >= 0; --i) {
    h->gzip_crc32 = (h->gzip_crc32 << 8) | trailer[i];
    h->gzip_isize = (h->gzip_isize << 8) | trailer[4 + i];
  }
  return true;
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

// The images of a copy that matches `want`, read straight into place (this is the path that has
// to be fast: one pass over the bytes); false when there is no such copy or it is inconsistent.
bool read_copy(const std::string& copy, const CacheHeader& want, IdxImages* im) {
  std::FILE* f = std::fopen(copy.c_str(), "rb");
  if (!f) return false;
  CacheHeader have{};
  uint8_t idx[16] = {};
  bool ok = std::fread(&have, sizeof(have), 1, f) == 1 &&
            std::memcmp(have.magic, want.magic, sizeof(kMagic)) == 0 &&
            have.source_size == want.source_size && have.source_mtime_ns == want.source_mtime_ns &&
            have.gzip_crc32 == want.gzip_crc32 && have.gzip_isize == want.gzip_isize &&
            uint32_t(have.payload) == want.gzip_isize && std::fread(idx, 1, 16, f) == 16 &&
            be32(idx) == 0x00000803;
  const uint64_t n = be32(idx + 4), h = be32(idx + 8), w = be32(idx + 12);
  ok = ok && n > 0 && n <= 0x7fffffff && h > 0 && h <= 65535 && w > 0 && w <= 65535 &&
       have.payload == 16 + n * h * w;
  if (ok) {
    im->pixels.resize(n * h * w);
    ok = std::fread(im->pixels.data(), 1, im->pixels.size(), f) == im->pixels.size() &&
         std::fgetc(f) == EOF;
    im->n = int(n);
    im->h = int(h);
    im->w = int(w);
  }
  std::fclose(f);
  if (!ok) *im = IdxImages{};
  return ok;
}

}  // namespace

std::string decoded_cache_path(const std::string& source) {
  return source + ".decoded";
}

IdxImages read_idx_images_cached(const std::string& path, DecodeCache* how, bool use_copy) {
  DecodeCache dummy;
  DecodeCache& result = how ? *how : dummy;
  result = DecodeCache::Off;
  CacheHeader h{};
  if (!use_copy || !source_header(path, &h)) return read_idx_images(path);
  const std::string copy = decoded_cache_path(path);
  if (IdxImages cached; read_copy(copy, h, &cached)) {
    result = DecodeCache::Hit;
    return cached;
  }
  IdxImages im = read_idx_images(path);  // a broken source fails here, naming the source
  const uint8_t idx_header[16] = {0,
                                  0,
                                  8,
                                  3,
                                  uint8_t(im.n >> 24),
                                  uint8_t(im.n >> 16),
                                  uint8_t(im.n >> 8),
                                  uint8_t(im.n),
                                  uint8_t(im.h >> 24),
                                  uint8_t(im.h >> 16),
                                  uint8_t(im.h >> 8),
                                  uint8_t(im.h),
                                  uint8_t(im.w >> 24),
                                  uint8_t(im.w >> 16),
                                  uint8_t(im.w >> 8),
                                  uint8_t(im.w)};
  h.payload = sizeof(idx_header) + im.pixels.size();
  if (uint32_t(h.payload) != h.gzip_isize) return im;  // a multi-member file: not cached
  try {
    const std::string dir = std::filesystem::path(copy).parent_path().string();
    remove_stale_temp_files(dir.empty() ? "." : dir);
    write_file_atomically(copy, [&](std::FILE* f) {
      write_bytes_checked(f, &h, sizeof(h));
      write_bytes_checked(f, idx_header, sizeof(idx_header));
      write_bytes_checked(f, im.pixels.data(), im.pixels.size());
    });
    result = DecodeCache::Written;
  } catch (const Error&) {
    result = DecodeCache::Unwritable;  // a read-only data folder: every run decodes, as before
  }
  return im;
}

}  // namespace cnn
