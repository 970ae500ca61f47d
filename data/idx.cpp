#include "data/idx.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <limits>

#include "data/idx_cache.h"
#include "data/image_folder.h"  // kMaxImageSide
#include "runtime/atomic_file.h"
#include "runtime/error.h"
#include "runtime/file_io.h"

namespace cnn {

namespace fs = std::filesystem;

namespace {

constexpr uint32_t kIdxUint8 = 0x08;  // the IDX type byte for unsigned bytes
constexpr uint32_t kMagicImages = 0x00000803;
constexpr uint32_t kMagicLabels = 0x00000801;
// A cap well above any real dataset that keeps every product below 2^63.
constexpr uint64_t kMaxPayload = uint64_t(1) << 40;
// Enough of a file's start to hold its IDX header, also behind a gzip header with a long name.
constexpr size_t kHeadBytes = 1 << 16;

uint32_t read_be32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}
void put_be32(std::vector<uint8_t>& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(uint8_t(v >> s));
}

const char* idx_kind(uint32_t ndims) {
  return ndims == 3 ? "images (idx3)" : "labels (idx1)";
}

// Deflate expands at most about 1032:1, so n bytes of gzip hold no more than this.
uint64_t gzip_capacity(uint64_t n) {
  return n * 1032 + (1 << 16);
}

// What the header of an IDX uint8 file of `ndims` dimensions says, read from the file's first
// bytes (all of them or a prefix of at least the header; for gzip enough to inflate it), with
// every check that needs no more than the header and the file's size.
struct IdxHeader {
  std::vector<uint32_t> dims;
  std::string dims_str;  // "60000x28x28"
  uint64_t header = 0, payload = 0;
  bool gz = false;
};

IdxHeader parse_idx_header(const uint8_t* data, size_t n, uint64_t file_bytes,
                           const std::string& path, uint32_t ndims) {
  IdxHeader h;
  const uint32_t expected_magic = (kIdxUint8 << 8) | ndims;
  h.header = 4 + 4 * uint64_t(ndims);
  h.gz = is_gzip(data, n);
  const char* how = h.gz ? " (after gunzip)" : "";

  // For gzip, inflate just enough for the header.
  std::vector<uint8_t> head;
  if (h.gz) {
    head = gunzip(data, n, size_t(h.header), path).data;
  } else {
    head.assign(data, data + std::min<size_t>(size_t(h.header), n));
  }
  if (head.size() >= 4) {
    const uint32_t magic = read_be32(head.data());
    if (magic != expected_magic) {
      std::string hint;
      if (magic == kMagicImages || magic == kMagicLabels)
        hint = fmt::format(" - this looks like an IDX {} file", idx_kind(magic & 0xff));
      else if ((magic >> 8) == 0 || (magic >> 16) != 0)
        hint = " - not an IDX file";
      else
        hint = fmt::format(" - IDX type 0x{:02x} with {} dims; only uint8 (0x08) is supported",
                           (magic >> 8) & 0xff, magic & 0xff);
      CNN_FAIL("{}: wrong magic 0x{:08x}{}, expected 0x{:08x} for IDX {}{}", path, magic, how,
               expected_magic, idx_kind(ndims), hint);
    }
  }
  CNN_CHECK(head.size() == h.header,
            "{}: short file: {} bytes{}, an IDX {} header alone needs {} bytes", path, head.size(),
            how, idx_kind(ndims), h.header);

  h.dims.assign(ndims, 0);
  h.payload = 1;
  for (uint32_t d = 0; d < ndims; ++d) {
    h.dims[d] = read_be32(head.data() + 4 + 4 * d);
    h.dims_str += (d ? "x" : "") + std::to_string(h.dims[d]);
  }
  for (uint32_t d = 0; d < ndims; ++d) {
    CNN_CHECK(h.dims[d] > 0, "{}: dimension {} is 0 (dims {}): the file holds no data", path, d,
              h.dims_str);
    // Every dim is < 2^32 and the running product stays <= 2^40, so this cannot overflow.
    h.payload *= h.dims[d];
    CNN_CHECK(h.payload <= kMaxPayload,
              "{}: dims {} describe more than 2^40 bytes - an absurd or corrupt header", path,
              h.dims_str);
  }
  CNN_CHECK(h.dims[0] <= uint32_t(std::numeric_limits<int>::max()),
            "{}: {} items is more than this loader supports", path, h.dims[0]);
  if (ndims == 3)
    CNN_CHECK(h.dims[1] <= uint32_t(kMaxImageSide) && h.dims[2] <= uint32_t(kMaxImageSide),
              "{}: images of {}x{} pixels are absurd (sides above {} are refused)", path, h.dims[1],
              h.dims[2], kMaxImageSide);
  // The file's size bounds what it can hold, before a byte of the body is read or inflated.
  const uint64_t total = h.header + h.payload;
  if (!h.gz) {
    CNN_CHECK(file_bytes >= total,
              "{}: short file: the header says {} ({} bytes of data) but only {} bytes follow it",
              path, h.dims_str, h.payload, file_bytes - std::min(file_bytes, h.header));
    CNN_CHECK(file_bytes == total,
              "{}: {} bytes follow the {} bytes of data that the header ({}) announces - a wrong "
              "header or not an IDX file",
              path, file_bytes - total, h.payload, h.dims_str);
  } else {
    CNN_CHECK(total <= gzip_capacity(file_bytes),
              "{}: short file: the header says {} ({} bytes of data), more than {} bytes of gzip "
              "can hold",
              path, h.dims_str, h.payload, file_bytes);
  }
  return h;
}

// Parses the bytes of an IDX uint8 file of `ndims` dimensions: returns the dims and the payload
// (header stripped). Raw or gzip by magic. `path` names the file in messages.
std::vector<uint8_t> parse_idx(std::vector<uint8_t> file, const std::string& path, uint32_t ndims,
                               std::vector<uint32_t>& dims) {
  const IdxHeader h = parse_idx_header(file.data(), file.size(), file.size(), path, ndims);
  dims = h.dims;
  const char* how = h.gz ? " (after gunzip)" : "";
  const uint64_t total = h.header + h.payload;

  std::vector<uint8_t> all;
  if (h.gz) {
    // Ask for one byte more than the header promises, to notice extra data.
    Gunzipped g = gunzip(file.data(), file.size(), size_t(total + 1), path);
    all = std::move(g.data);
    file.clear();
    file.shrink_to_fit();
  } else {
    all = std::move(file);
  }
  const uint64_t have = all.size();
  CNN_CHECK(have >= total,
            "{}: short file: the header says {} ({} bytes of data) but only {} bytes follow it{}",
            path, h.dims_str, h.payload, have - h.header, how);
  CNN_CHECK(have == total,
            "{}: {} bytes{} follow the {} bytes of data that the header ({}) announces - a wrong "
            "header or not an IDX file",
            path, h.gz ? "more" : std::to_string(have - total).c_str(), how, h.payload, h.dims_str);
  all.erase(all.begin(), all.begin() + h.header);
  all.shrink_to_fit();
  return all;
}

// The header of the file at `path`, from its first bytes only.
IdxHeader peek_idx_header(const std::string& path, uint32_t ndims) {
  const FileHead head = read_file_head(path, kHeadBytes);
  return parse_idx_header(head.bytes.data(), head.bytes.size(), head.file_bytes, path, ndims);
}

// Physical memory: a dataset announced larger than this cannot be loaded whole.
uint64_t memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : kMaxPayload;
}

void write_idx(const std::string& path, uint32_t ndims, const std::vector<uint32_t>& dims,
               const uint8_t* data, size_t bytes) {
  std::vector<uint8_t> out;
  out.reserve(4 + 4 * ndims + bytes);
  put_be32(out, (kIdxUint8 << 8) | ndims);
  for (uint32_t d : dims) put_be32(out, d);
  out.insert(out.end(), data, data + bytes);
  if (ends_with(path, ".gz")) out = gzip_compress(out.data(), out.size());
  write_file_atomically(path, out.data(), out.size());
}

}  // namespace

IdxImages read_idx_images(const std::string& path) {
  return parse_idx_images(read_file(path), path);
}

std::vector<uint8_t> read_idx_labels(const std::string& path) {
  return parse_idx_labels(read_file(path), path);
}

IdxImages parse_idx_images(std::vector<uint8_t> file, const std::string& path) {
  std::vector<uint32_t> dims;
  IdxImages im;
  im.pixels = parse_idx(std::move(file), path, 3, dims);
  im.n = int(dims[0]);
  im.h = int(dims[1]);
  im.w = int(dims[2]);
  return im;
}

std::vector<uint8_t> parse_idx_labels(std::vector<uint8_t> file, const std::string& path) {
  std::vector<uint32_t> dims;
  return parse_idx(std::move(file), path, 1, dims);
}

void write_idx_images(const std::string& path, int n, int h, int w, const uint8_t* pixels) {
  CNN_CHECK(n > 0 && h > 0 && w > 0, "{}: cannot write {}x{}x{} images", path, n, h, w);
  write_idx(path, 3, {uint32_t(n), uint32_t(h), uint32_t(w)}, pixels, size_t(n) * h * w);
}

void write_idx_labels(const std::string& path, const std::vector<uint8_t>& labels) {
  CNN_CHECK(!labels.empty(), "{}: cannot write an empty label file", path);
  write_idx(path, 1, {uint32_t(labels.size())}, labels.data(), labels.size());
}

Dataset load_idx_dataset(const std::string& images_path, const std::string& labels_path,
                         const std::vector<std::string>& class_names, const IdxExpect& expect,
                         bool decoded_cache) {
  // Both headers first, against each other, the model and the memory: a gzip bomb whose header
  // matches its body (1 x 65535 x 65535) inflated 4.3 GB before the label count was compared.
  const IdxHeader hi = peek_idx_header(images_path, 3);
  const IdxHeader hl = peek_idx_header(labels_path, 1);
  CNN_CHECK(hl.dims[0] == hi.dims[0], "{}: count mismatch: {} labels, but {} has {} images",
            labels_path, hl.dims[0], images_path, hi.dims[0]);
  CNN_CHECK(expect.width == 0 || expect.resize ||
                (int64_t(hi.dims[1]) == expect.height && int64_t(hi.dims[2]) == expect.width),
            "{}: images are {}x{} (WxH) but data.width/height say {}x{} (set data.resize: true "
            "to resize them)",
            images_path, hi.dims[2], hi.dims[1], expect.width, expect.height);
  const uint64_t memory = memory_bytes();
  CNN_CHECK(hi.payload <= memory,
            "{}: the header announces {} images ({} bytes), more than this machine's {} bytes of "
            "memory",
            images_path, hi.dims_str, hi.payload, memory);

  IdxImages im = read_idx_images_cached(images_path, nullptr, decoded_cache);
  std::vector<uint8_t> lab = read_idx_labels(labels_path);
  CNN_CHECK(lab.size() == size_t(im.n), "{}: count mismatch: {} labels, but {} has {} images",
            labels_path, lab.size(), images_path, im.n);
  Dataset d;
  d.n = im.n;
  d.c = 1;
  d.h = im.h;
  d.w = im.w;
  d.images = std::move(im.pixels);
  d.class_names = class_names;
  const int max_label = *std::max_element(lab.begin(), lab.end());
  if (d.class_names.empty())
    for (int k = 0; k <= max_label; ++k) d.class_names.push_back(std::to_string(k));
  const int classes = d.num_classes();
  d.labels.resize(lab.size());
  for (size_t i = 0; i < lab.size(); ++i) {
    CNN_CHECK(lab[i] < classes, "{}: label {} of item {} is outside [0, {}) ({} class names given)",
              labels_path, int(lab[i]), i, classes, classes);
    d.labels[i] = lab[i];
  }
  d.source = images_path;
  return d;
}

std::string find_idx_file_optional(const std::string& dir, const std::string& stem) {
  const fs::path base = fs::path(dir) / stem;
  std::error_code ec;
  if (fs::is_regular_file(base, ec)) return base.string();
  const fs::path gz = fs::path(dir) / (stem + ".gz");
  if (fs::is_regular_file(gz, ec)) return gz.string();
  return "";
}

std::string find_idx_file(const std::string& dir, const std::string& stem) {
  std::string p = find_idx_file_optional(dir, stem);
  CNN_CHECK(!p.empty(), "{}: missing IDX file: neither {} nor {}.gz exists there{}", dir, stem,
            stem, dir.empty() ? " (data.dir is empty)" : "");
  return p;
}

}  // namespace cnn
