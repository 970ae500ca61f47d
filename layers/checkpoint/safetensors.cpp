#include "layers/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <new>
#include <nlohmann/json.hpp>
#include <set>

#include "runtime/atomic_file.h"
#include "runtime/error.h"
#include "runtime/text.h"

// The data section is little-endian; copying floats with memcpy is only right on such a host.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes little-endian");

namespace cnn {
namespace {

using Json = nlohmann::json;
using OrderedJson = nlohmann::ordered_json;

constexpr const char* kMetadataKey = "__metadata__";
constexpr size_t kLengthPrefixBytes = 8;
constexpr size_t kHeaderAlign = 8;  // the header is padded so that the data starts 8-aligned

// Bytes per element of the dtypes the format defines (sub-byte types are refused as unknown).
size_t dtype_bytes(const std::string& dtype) {
  static const std::map<std::string, size_t> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  const auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

// a * b, or false when it does not fit in uint64.
bool mul_overflows(uint64_t a, uint64_t b, uint64_t* out) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) return true;
  *out = a * b;
  return false;
}

// A value for an error message: never the whole of it (a header may hold megabytes of it).
std::string json_excerpt(const Json& j) {
  return excerpt(j.dump());
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string header_json(const std::vector<NamedTensor>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  OrderedJson header = OrderedJson::object();
  if (!metadata.empty()) {
    OrderedJson meta = OrderedJson::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header[kMetadataKey] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    const uint64_t bytes = t.int64  ? t.ints.size() * sizeof(int64_t)
                           : t.int8 ? t.bytes.size()
                                    : t.data.size() * sizeof(float);
    OrderedJson entry = OrderedJson::object();
    entry["dtype"] = t.int64 ? "I64" : t.int8 ? "I8" : "F32";
    entry["shape"] = t.shape;
    entry["data_offsets"] = {offset, offset + bytes};
    header[t.name] = std::move(entry);
    offset += bytes;
  }
  try {
    return header.dump();  // strict UTF-8: a name that is not valid UTF-8 throws here
  } catch (const Json::exception& e) {
    CNN_FAIL("cannot write safetensors header: {}", e.what());
  }
}

void check_tensors_for_writing(const std::string& path, const std::vector<NamedTensor>& tensors) {
  std::set<std::string> names;
  for (const NamedTensor& t : tensors) {
    CNN_CHECK(!t.name.empty(), "cannot write '{}': a tensor has an empty name", path);
    CNN_CHECK(t.name != kMetadataKey, "cannot write '{}': '{}' is reserved for metadata", path,
              kMetadataKey);
    CNN_CHECK(names.insert(t.name).second, "cannot write '{}': tensor name '{}' appears twice",
              path, t.name);
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      CNN_CHECK(d >= 0, "cannot write '{}': tensor '{}' has shape {} with a negative dimension",
                path, t.name, shape_text(t.shape));
      CNN_CHECK(!mul_overflows(numel, static_cast<uint64_t>(d), &numel),
                "cannot write '{}': tensor '{}' shape {} overflows", path, t.name,
                shape_text(t.shape));
    }
    CNN_CHECK(numel == t.count(),
              "cannot write '{}': tensor '{}' has shape {} ({} elements) but {} values", path,
              t.name, shape_text(t.shape), numel, t.count());
  }
}

// Records the first key that repeats within one JSON object: nlohmann would silently keep the last
// one, and a checkpoint with two different "conv1.w" must not load either.
struct DuplicateKeyFinder {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;

  bool on_event(nlohmann::json::parse_event_t event, const Json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (event == E::object_start) {
      open_objects.emplace_back();
    } else if (event == E::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (event == E::key && !open_objects.empty() && duplicate.empty()) {
      const std::string key = parsed.get<std::string>();
      if (!open_objects.back().insert(key).second) duplicate = key;
    }
    return true;
  }
};

// A non-negative JSON integer that fits in int64 (shapes) / uint64 (offsets).
bool json_uint(const Json& j, uint64_t* out) {
  if (!j.is_number_unsigned()) return false;
  *out = j.get<uint64_t>();
  return true;
}

// Everything read_safetensors learns about the file before touching the data section.
class Reader {
 public:
  explicit Reader(std::string path) : path_(std::move(path)) {}

  template <typename... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) const {
    CNN_FAIL("safetensors file '{}': {}", path_, fmt::format(format, std::forward<Args>(args)...));
  }

  void parse_entry(const std::string& name, const Json& value, SafetensorsEntry* e) const {
    if (!value.is_object())
      fail("tensor '{}' is described by {}, expected an object", name, json_excerpt(value));
    for (const auto& [field, _] : value.items()) {
      if (field != "dtype" && field != "shape" && field != "data_offsets") {
        fail("tensor '{}' has unknown field '{}' (expected dtype, shape, data_offsets)", name,
             field);
      }
    }
    if (!value.contains("dtype") || !value.contains("shape") || !value.contains("data_offsets")) {
      fail("tensor '{}' lacks one of dtype, shape, data_offsets", name);
    }
    e->name = name;
    const Json& dtype = value["dtype"];
    if (!dtype.is_string())
      fail("tensor '{}' has dtype {}, expected a string", name, json_excerpt(dtype));
    e->dtype = dtype.get<std::string>();
    const size_t elem = dtype_bytes(e->dtype);
    if (elem == 0) fail("tensor '{}' has unknown dtype '{}'", name, e->dtype);

    const Json& shape = value["shape"];
    if (!shape.is_array())
      fail("tensor '{}' has shape {}, expected an array", name, json_excerpt(shape));
    uint64_t bytes = elem;
    for (const Json& d : shape) {
      uint64_t dim = 0;
      if (!json_uint(d, &dim) || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        fail("tensor '{}' has shape {}, expected non-negative integers", name, json_excerpt(shape));
      }
      if (mul_overflows(bytes, dim, &bytes)) {
        fail("tensor '{}' has shape {} whose byte size overflows 64 bits", name,
             json_excerpt(shape));
      }
      e->shape.push_back(static_cast<int64_t>(dim));
    }

    const Json& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !json_uint(offsets[0], &e->begin) ||
        !json_uint(offsets[1], &e->end) || e->begin > e->end) {
      fail("tensor '{}' has data_offsets {}, expected [begin, end] with 0 <= begin <= end", name,
           json_excerpt(offsets));
    }
    if (e->end - e->begin != bytes) {
      fail(
          "tensor '{}' of dtype {} and shape {} needs {} bytes, but its data_offsets [{}, {}] "
          "span {}",
          name, e->dtype, json_excerpt(shape), bytes, e->begin, e->end, e->end - e->begin);
    }
  }

  void parse_metadata(const Json& value, std::map<std::string, std::string>* metadata) const {
    if (!value.is_object())
      fail("'{}' is {}, expected an object", kMetadataKey, json_excerpt(value));
    for (const auto& [key, v] : value.items()) {
      if (!v.is_string()) fail("metadata '{}' is {}, expected a string", key, json_excerpt(v));
      (*metadata)[key] = v.get<std::string>();
    }
  }

  // Offsets sorted by position must tile [0, data_bytes) exactly, as the reference reader demands.
  void check_layout(std::vector<SafetensorsEntry>* entries, uint64_t data_bytes) const {
    std::sort(entries->begin(), entries->end(), [](const auto& a, const auto& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    for (const SafetensorsEntry& e : *entries) {
      if (e.end > data_bytes) {
        fail(
            "tensor '{}' has data_offsets [{}, {}] outside the {}-byte data section (file "
            "truncated?)",
            e.name, e.begin, e.end, data_bytes);
      }
    }
    uint64_t covered = 0;
    const SafetensorsEntry* prev = nullptr;
    for (const SafetensorsEntry& e : *entries) {
      if (e.begin < covered) {
        fail("tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", prev->name, prev->begin, prev->end,
             e.name, e.begin, e.end);
      }
      if (e.begin > covered) {
        fail("data bytes [{}, {}) before tensor '{}' belong to no tensor", covered, e.begin,
             e.name);
      }
      covered = e.end;
      prev = &e;
    }
    if (covered != data_bytes) {
      fail("data bytes [{}, {}) at the end belong to no tensor", covered, data_bytes);
    }
  }

 private:
  std::string path_;
};

}  // namespace

size_t json_nesting_depth(std::string_view text) {
  size_t depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;  // the escaped character cannot end the string
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

uint64_t SafetensorsEntry::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);  // validated not to overflow on reading
  return n;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

NamedTensor SafetensorsFile::tensor_f32(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  CNN_CHECK(e != nullptr, "safetensors file '{}': no tensor named '{}'", path_, name);
  CNN_CHECK(e->dtype == "F32", "safetensors file '{}': tensor '{}' has dtype {}, expected F32",
            path_, name, e->dtype);
  NamedTensor t{e->name, e->shape, std::vector<float>(e->numel())};
  if (!t.data.empty()) std::memcpy(t.data.data(), bytes(*e), t.data.size() * sizeof(float));
  return t;
}

NamedTensor SafetensorsFile::tensor_i64(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  CNN_CHECK(e != nullptr, "safetensors file '{}': no tensor named '{}'", path_, name);
  CNN_CHECK(e->dtype == "I64", "safetensors file '{}': tensor '{}' has dtype {}, expected I64",
            path_, name, e->dtype);
  NamedTensor t = NamedTensor::i64(e->name, e->shape, std::vector<int64_t>(e->numel()));
  if (!t.ints.empty()) std::memcpy(t.ints.data(), bytes(*e), t.ints.size() * sizeof(int64_t));
  return t;
}

NamedTensor SafetensorsFile::tensor_i8(const std::string& name) const {
  const SafetensorsEntry* e = find(name);
  CNN_CHECK(e != nullptr, "safetensors file '{}': no tensor named '{}'", path_, name);
  CNN_CHECK(e->dtype == "I8", "safetensors file '{}': tensor '{}' has dtype {}, expected I8", path_,
            name, e->dtype);
  NamedTensor t = NamedTensor::i8(e->name, e->shape, std::vector<int8_t>(e->numel()));
  if (!t.bytes.empty()) std::memcpy(t.bytes.data(), bytes(*e), t.bytes.size());
  return t;
}

const std::string* SafetensorsFile::find_metadata(const std::string& key) const {
  const auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

const std::string& SafetensorsFile::metadata_value(const std::string& key) const {
  const std::string* v = find_metadata(key);
  CNN_CHECK(v != nullptr, "safetensors file '{}': no metadata key '{}'", path_, key);
  return *v;
}

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  check_tensors_for_writing(path, tensors);
  std::string header = header_json(tensors, metadata);
  header.append((kHeaderAlign - header.size() % kHeaderAlign) % kHeaderAlign, ' ');
  uint8_t prefix[kLengthPrefixBytes];
  uint64_t n = header.size();
  for (size_t i = 0; i < kLengthPrefixBytes; ++i, n >>= 8) prefix[i] = static_cast<uint8_t>(n);

  write_file_atomically(path, [&](std::FILE* f) {
    write_bytes_checked(f, prefix, sizeof(prefix));
    write_bytes_checked(f, header.data(), header.size());
    for (const NamedTensor& t : tensors) {
      if (t.int64)
        write_bytes_checked(f, t.ints.data(), t.ints.size() * sizeof(int64_t));
      else if (t.int8)
        write_bytes_checked(f, t.bytes.data(), t.bytes.size());
      else
        write_bytes_checked(f, t.data.data(), t.data.size() * sizeof(float));
    }
  });
}

SafetensorsFile read_safetensors(const std::string& path) {
  Reader r(path);
  // O_NONBLOCK: opening a FIFO otherwise waits for a writer forever, before fstat can refuse it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) CNN_FAIL("cannot open safetensors file '{}': {}", path, std::strerror(errno));
  std::FILE* f = ::fdopen(fd, "rb");
  if (f == nullptr) {
    ::close(fd);
    CNN_FAIL("cannot open safetensors file '{}': {}", path, std::strerror(errno));
  }
  struct FileCloser {
    std::FILE* f;
    ~FileCloser() { std::fclose(f); }
  } closer{f};

  struct stat st {};
  if (::fstat(::fileno(f), &st) != 0) r.fail("cannot stat: {}", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) r.fail("not a regular file (a directory, FIFO or device)");
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);

  auto read_exactly = [&](void* dst, size_t n, const char* what) {
    if (n > 0 && std::fread(dst, 1, n, f) != n) {
      r.fail("the file ended early while reading the {} ({})", what,
             std::ferror(f) ? std::strerror(errno) : "file changed or truncated");
    }
  };

  if (file_bytes < kLengthPrefixBytes) {
    r.fail(
        "{} bytes long, shorter than the 8-byte header length prefix (truncated or not a "
        "safetensors file)",
        file_bytes);
  }
  uint8_t prefix[kLengthPrefixBytes];
  read_exactly(prefix, sizeof(prefix), "header length");
  uint64_t header_bytes = 0;
  for (size_t i = kLengthPrefixBytes; i-- > 0;) header_bytes = (header_bytes << 8) | prefix[i];
  if (header_bytes > kSafetensorsMaxHeaderBytes) {
    r.fail("header length {} exceeds the limit of {} bytes (corrupt or not a safetensors file)",
           header_bytes, kSafetensorsMaxHeaderBytes);
  }
  if (header_bytes > file_bytes - kLengthPrefixBytes) {
    r.fail(
        "header length {} is larger than the {} bytes that follow the length prefix "
        "(truncated or not a safetensors file)",
        header_bytes, file_bytes - kLengthPrefixBytes);
  }
  if (header_bytes == 0) r.fail("header length is 0, expected a JSON object");
  std::string header(header_bytes, '\0');
  read_exactly(header.data(), header.size(), "header");

  // nlohmann's lexer takes a NUL byte for the end of input and would ignore whatever follows it;
  // JSON text cannot contain a raw NUL, so one means the header is not what it claims to be.
  if (const size_t nul = header.find('\0'); nul != std::string::npos) {
    r.fail("header is not valid JSON: NUL byte at offset {}", nul);
  }
  // Deep nesting is refused before parsing: nlohmann's parser, dump() and destructor recurse per
  // level, and 70,000 nested arrays overflowed the stack.
  if (const size_t depth = json_nesting_depth(header); depth > kSafetensorsMaxJsonDepth) {
    r.fail("header nests {} levels of arrays/objects, more than the limit of {}", depth,
           kSafetensorsMaxJsonDepth);
  }
  DuplicateKeyFinder dup;
  Json root;
  try {
    root = Json::parse(header, [&dup](int, Json::parse_event_t event, Json& parsed) {
      return dup.on_event(event, parsed);
    });
  } catch (const Json::exception& e) {
    r.fail("header is not valid JSON: {}", excerpt(e.what(), 200));
  }
  if (!dup.duplicate.empty()) r.fail("header has the key '{}' twice", dup.duplicate);
  if (!root.is_object()) r.fail("header is {}, expected a JSON object", root.type_name());

  SafetensorsFile file;
  file.path_ = path;
  for (const auto& [key, value] : root.items()) {
    if (key == kMetadataKey) {
      r.parse_metadata(value, &file.metadata_);
    } else {
      SafetensorsEntry e;
      r.parse_entry(key, value, &e);
      file.entries_.push_back(std::move(e));
    }
  }
  const uint64_t data_bytes = file_bytes - kLengthPrefixBytes - header_bytes;
  r.check_layout(&file.entries_, data_bytes);
  for (size_t i = 0; i < file.entries_.size(); ++i) file.index_[file.entries_[i].name] = i;

  try {
    file.data_.resize(data_bytes);
  } catch (const std::bad_alloc&) {
    r.fail("cannot allocate {} bytes for the data section", data_bytes);
  }
  read_exactly(file.data_.data(), file.data_.size(), "tensor data");
  return file;
}

}  // namespace cnn
