#pragma once
// Whole-file reads and atomic writes, and gzip (de)compression with zlib. Every error names the
// file and says what is wrong with it.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cnn {

// The whole file; throws "path: cannot open (...)" or "path: is a directory".
std::vector<uint8_t> read_file(const std::string& path);

// Writes to "path.tmp-<pid>", flushes, then renames over `path`, so that a failed write never
// leaves a half file behind.
void write_file_atomic(const std::string& path, const uint8_t* data, size_t bytes);

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
