#pragma once
// Whole-file reads (atomic writes: runtime/atomic_file.h), and gzip (de)compression with zlib.
// Every error names the file and says what is wrong with it.
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace cnn {

// What read_file accepts. By default only a regular file of any size: anything else is refused
// before a byte is read ("path: is a directory" / "is a FIFO" / "is a device"), since a FIFO
// blocks forever and /dev/zero never ends.
struct ReadFileOptions {
  // A larger file is refused with "path: <what> of N bytes is larger than the limit of M bytes",
  // by its size before reading, and while reading where the size is unknown (a /proc file, a pipe).
  uint64_t max_bytes = std::numeric_limits<uint64_t>::max();
  const char* what = "file";  // names the content in the size error
  // Also read pipes, FIFOs and devices (not directories) up to max_bytes: for a JSON file that a
  // user may hand over as /dev/stdin. Opening a FIFO then waits for its writer.
  bool allow_streams = false;
};

// The whole content of `path`; throws "path: cannot open (...)" and the refusals above.
std::vector<uint8_t> read_file(const std::string& path, const ReadFileOptions& options = {});

// The first max_bytes of a regular file, and the file's size: for checking a header before
// deciding to read the rest.
struct FileHead {
  std::vector<uint8_t> bytes;
  uint64_t file_bytes = 0;
};
FileHead read_file_head(const std::string& path, size_t max_bytes);

// The size of a regular file (throws as read_file does for anything else).
uint64_t regular_file_size(const std::string& path);

// True when the bytes start with the gzip magic 1f 8b.
bool is_gzip(const uint8_t* data, size_t bytes);

struct Gunzipped {
  std::vector<uint8_t> data;
  bool complete = false;  // the whole stream was inflated (false: stopped at max_out)
};

// Inflates gzip data (one or more members) into at most max_out bytes. The output grows as data
// arrives, so memory follows what the file really holds, never a size it claims. Throws
// "name: bad gzip data: ..." for corrupt or truncated streams and trailing garbage.
Gunzipped gunzip(const uint8_t* data, size_t bytes, size_t max_out, const std::string& name);

// gzip-compresses (level 6) into a single member.
std::vector<uint8_t> gzip_compress(const uint8_t* data, size_t bytes);

bool ends_with(const std::string& s, const std::string& suffix);

}  // namespace cnn
