#pragma once
// Files that are never left half-written (reads: runtime/file_io.h): checkpoints go through a
// temporary file that is flushed, fsync'ed and renamed over the target, so a crash or a full disk
// leaves the previous file intact. Every failure throws cnn::Error naming the path and the system's
// reason (strerror).
#include <cstddef>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace cnn {

// Writes `path` through `writer`, which receives a FILE* open on `path.tmp.<pid>` in the same
// directory (same file system, so the final rename() is atomic). After the writer returns, the
// stream is checked, flushed and fsync'ed, then renamed over `path`, and the directory is synced
// (best effort). If anything fails, or the writer throws, the temporary file is removed, `path` is
// left as it was, and the exception propagates: a cnn::Error gets the path prefixed, any other
// exception type is rethrown unchanged.
void write_file_atomically(const std::string& path, const std::function<void(std::FILE*)>& writer);

// A process killed mid-write leaves its "<name>.tmp.<pid>" behind. Removes those in `dir` whose
// pid is no longer running (or is the caller's own: nothing of ours is in flight at start-up) and
// returns their paths; a temporary file of a live process is left alone. Call at start-up.
std::vector<std::string> remove_stale_temp_files(const std::string& dir);

// The same for a byte buffer that is already in memory.
void write_file_atomically(const std::string& path, const void* data, size_t bytes);

// fwrite that throws cnn::Error (with strerror) on a short write; writers should use it so that a
// failure is reported where it happens. Buffered errors surface later, in the final flush.
void write_bytes_checked(std::FILE* f, const void* data, size_t bytes);

// Appends `line` plus '\n' to `path` (created if missing), then flushes and fsyncs, so a metrics
// row survives a crash that follows it. On failure (a full disk) the file is cut back to its
// previous size, so no half row stays.
void append_line_durably(const std::string& path, const std::string& line);

}  // namespace cnn
