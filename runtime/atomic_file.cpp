#include "runtime/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <vector>

#include "runtime/error.h"

namespace cnn {
namespace {

std::string errno_text(int err) {
  return std::strerror(err);
}

// The directory part of `path` ("." when there is none), for the fsync after the rename.
std::string directory_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// A rename is only durable once the directory entry itself reaches the disk. Best effort: some file
// systems refuse fsync on a directory, and the data file is already complete at this point.
void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

// Flushes the stdio buffer and forces the data to the device; returns 0 or the errno of the first
// failure.
int flush_and_sync(std::FILE* f) {
  if (std::ferror(f)) return errno != 0 ? errno : EIO;
  if (std::fflush(f) != 0) return errno;
  if (::fsync(::fileno(f)) != 0) {
    // Character devices and pipes cannot be synced; their data is already handed over.
    if (errno != EINVAL && errno != EROFS) return errno;
  }
  return 0;
}

}  // namespace

void write_bytes_checked(std::FILE* f, const void* data, size_t bytes) {
  if (bytes == 0) return;
  errno = 0;
  const size_t written = std::fwrite(data, 1, bytes, f);
  if (written != bytes) {
    const int err = errno != 0 ? errno : EIO;
    CNN_FAIL("write failed after {} of {} bytes: {}", written, bytes, errno_text(err));
  }
}

void write_file_atomically(const std::string& path, const std::function<void(std::FILE*)>& writer) {
  CNN_CHECK(!path.empty(), "write_file_atomically: empty path");
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    CNN_FAIL("cannot write '{}': cannot create temporary file '{}': {}", path, tmp,
             errno_text(errno));
  }
  // From here on, every exit path either renames the temporary file or removes it.
  try {
    writer(f);
  } catch (const Error& e) {
    std::fclose(f);
    std::remove(tmp.c_str());
    CNN_FAIL("cannot write '{}': {}", path, e.what());
  } catch (...) {
    std::fclose(f);
    std::remove(tmp.c_str());
    throw;
  }
  const int flush_err = flush_and_sync(f);
  const int close_rc = std::fclose(f);
  const int close_err = errno;
  if (flush_err != 0 || close_rc != 0) {
    std::remove(tmp.c_str());
    CNN_FAIL("cannot write '{}': writing temporary file '{}' failed: {}", path, tmp,
             errno_text(flush_err != 0 ? flush_err : close_err));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    CNN_FAIL("cannot write '{}': renaming '{}' over it failed: {}", path, tmp, errno_text(err));
  }
  sync_directory(directory_of(path));
}

std::vector<std::string> remove_stale_temp_files(const std::string& dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::filesystem::directory_entry& entry = *it;
    const std::string name = entry.path().filename().string();
    const size_t at = name.rfind(".tmp.");
    if (at == std::string::npos || at == 0) continue;
    const std::string pid_text = name.substr(at + 5);
    if (pid_text.empty() || pid_text.size() > 9 ||
        pid_text.find_first_not_of("0123456789") != std::string::npos)
      continue;
    const pid_t pid = static_cast<pid_t>(std::stol(pid_text));
    const bool alive = pid != ::getpid() && (::kill(pid, 0) == 0 || errno == EPERM);
    std::error_code type_ec;
    if (alive || !entry.is_regular_file(type_ec)) continue;
    if (std::remove(entry.path().c_str()) == 0) removed.push_back(entry.path().string());
  }
  return removed;
}

void write_file_atomically(const std::string& path, const void* data, size_t bytes) {
  write_file_atomically(path, [&](std::FILE* f) { write_bytes_checked(f, data, bytes); });
}

void append_line_durably(const std::string& path, const std::string& line) {
  std::FILE* f = std::fopen(path.c_str(), "ab");
  if (f == nullptr) CNN_FAIL("cannot append to '{}': {}", path, errno_text(errno));
  struct stat st {};
  const off_t old_size = ::fstat(::fileno(f), &st) == 0 ? st.st_size : -1;
  std::string row = line;
  row += '\n';
  errno = 0;
  const bool wrote = std::fwrite(row.data(), 1, row.size(), f) == row.size();
  const int write_err = wrote ? 0 : (errno != 0 ? errno : EIO);
  const int flush_err = wrote ? flush_and_sync(f) : 0;
  const int close_rc = std::fclose(f);
  const int close_err = errno;
  const int err = write_err != 0   ? write_err
                  : flush_err != 0 ? flush_err
                  : close_rc != 0  ? close_err
                                   : 0;
  if (err != 0) {
    // No torn row: cut the file back to its last whole line (a full disk wrote part of it).
    if (old_size >= 0) (void)::truncate(path.c_str(), old_size);
    CNN_FAIL("cannot append to '{}': {}", path, errno_text(err));
  }
}

}  // namespace cnn
