#pragma once
// The Hugging Face safetensors format, for checkpoints that PyTorch/NumPy can open directly:
//
//   [8 bytes]  N, little-endian uint64: the header length
//   [N bytes]  JSON object, padded with spaces to a multiple of 8:
//              {"__metadata__": {"key": "string value", ...},
//               "name": {"dtype": "F32", "shape": [d0, d1, ...], "data_offsets": [begin, end]},
//               ...}
//   [rest]     the tensors' raw little-endian bytes; data_offsets are relative to this section's
//              start, and together the tensors tile it exactly (no gap, no overlap, no tail).
//
// The writer emits F32, I64 and I8 tensors, offsets in the order given (any order is valid for
// readers). The reader knows every byte-sized dtype of the format and trusts none of the sizes in
// the file.
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cnn {

// One tensor, row-major: F32 (data), with int8 set I8 (bytes), or with int64 set I64 (ints, as
// torch's int64 buffers such as BatchNorm's num_batches_tracked); the values' count equals the
// product of shape (1 for shape {}).
struct NamedTensor {
  NamedTensor() = default;
  NamedTensor(std::string n, std::vector<int64_t> s, std::vector<float> d)
      : name(std::move(n)), shape(std::move(s)), data(std::move(d)) {}
  static NamedTensor i8(std::string n, std::vector<int64_t> s, std::vector<int8_t> v) {
    NamedTensor t(std::move(n), std::move(s), {});
    t.int8 = true;
    t.bytes = std::move(v);
    return t;
  }
  static NamedTensor i64(std::string n, std::vector<int64_t> s, std::vector<int64_t> v) {
    NamedTensor t(std::move(n), std::move(s), {});
    t.int64 = true;
    t.ints = std::move(v);
    return t;
  }
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
  bool int64 = false;
  std::vector<int64_t> ints;
  bool int8 = false;  // I8 (quantized weights), values in `bytes`
  std::vector<int8_t> bytes;
  size_t count() const { return int64 ? ints.size() : int8 ? bytes.size() : data.size(); }
};

// Where one tensor lies in a file that has been read and validated.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // as spelled in the file: "F32", "I64", "BF16", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range within the data section
  uint64_t numel() const;
};

class SafetensorsFile {
 public:
  const std::string& path() const { return path_; }
  // Sorted by data offset, i.e. in the order of the bytes in the file.
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

  const SafetensorsEntry* find(const std::string& name) const;  // nullptr when absent
  // The tensor as floats; throws cnn::Error naming the file when it is absent or not F32.
  NamedTensor tensor_f32(const std::string& name) const;
  // The tensor as int64 values (int64 set); throws naming the file when it is absent or not I64.
  NamedTensor tensor_i64(const std::string& name) const;
  // The tensor as int8 values (int8 set); throws naming the file when it is absent or not I8.
  NamedTensor tensor_i8(const std::string& name) const;
  // The raw bytes of an entry of this file (end - begin of them).
  const uint8_t* bytes(const SafetensorsEntry& e) const { return data_.data() + e.begin; }

  const std::string* find_metadata(const std::string& key) const;  // nullptr when absent
  // The value for `key`; throws cnn::Error naming the file and the key when it is absent.
  const std::string& metadata_value(const std::string& key) const;

 private:
  friend SafetensorsFile read_safetensors(const std::string& path);
  std::string path_;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;  // name -> position in entries_
  std::map<std::string, std::string> metadata_;
  std::vector<uint8_t> data_;  // (data section bytes)
};

// Headers beyond this are refused before any allocation (the reference reader's limit is similar).
constexpr uint64_t kSafetensorsMaxHeaderBytes = 100ull << 20;

// Headers nesting arrays/objects deeper than this are refused before parsing (ours nest 3 deep).
constexpr size_t kSafetensorsMaxJsonDepth = 64;

// The deepest nesting of arrays and objects in JSON text (brackets inside strings not counted);
// a linear scan, safe on any bytes.
size_t json_nesting_depth(std::string_view text);

// Writes the tensors (offsets in the given order) and the metadata atomically (temporary file,
// fsync, rename). Throws cnn::Error for an empty, reserved ("__metadata__") or repeated name, a
// negative dimension, or a shape whose product differs from data.size().
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Reads and validates the whole file. Throws cnn::Error naming the file and the problem for:
// a file shorter than the length prefix, a header length beyond the file or the 100 MiB limit,
// JSON that does not parse or is not an object, a repeated key, an unknown dtype or field, a
// non-integer or negative dimension or offset, a shape whose byte size overflows or differs from
// its data_offsets, offsets outside the data section, overlapping, or leaving bytes uncovered.
SafetensorsFile read_safetensors(const std::string& path);

}  // namespace cnn
