#include "runtime/file_io.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>

#include "runtime/error.h"

namespace cnn {

namespace fs = std::filesystem;

namespace {

const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// An open file: a regular one, or with allow_streams also a pipe, FIFO or device. O_NONBLOCK:
// opening a FIFO for reading otherwise waits for a writer, so the type check after the open would
// never run; a stream that is allowed gets blocking reads back once it is known to be one. A FIFO
// keeps its non-blocking descriptor and waits in poll() before each read: closing it and
// reopening blocking would wait forever for a writer that already came, wrote into the pipe and
// left between the two opens (its data went with the first descriptor).
struct OpenFile {
  int fd = -1;
  bool regular = false;
  bool fifo = false;
  uint64_t size = 0;  // st_size of a regular file (0 for /proc files, whose size is unknown)
  OpenFile(const std::string& path, bool allow_streams) {
    fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    CNN_CHECK(fd >= 0, "{}: cannot open ({})", path, std::strerror(errno));
    struct stat st {};
    const int stat_err = ::fstat(fd, &st) == 0 ? 0 : errno;
    regular = stat_err == 0 && S_ISREG(st.st_mode);
    const bool stream_ok = stat_err == 0 && allow_streams && !S_ISDIR(st.st_mode);
    if (!regular && !stream_ok) {
      ::close(fd);
      if (stat_err != 0) CNN_FAIL("{}: cannot stat ({})", path, std::strerror(stat_err));
      CNN_FAIL("{}: is {}, expected a regular file", path, file_kind(st.st_mode));
    }
    fifo = S_ISFIFO(st.st_mode);
    if (!regular && !fifo) {
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    }
    size = regular ? uint64_t(st.st_size) : 0;
  }
  ~OpenFile() { ::close(fd); }
  OpenFile(const OpenFile&) = delete;
  OpenFile& operator=(const OpenFile&) = delete;

  // Up to n bytes from offset `at` on; fewer only at the end of the file (it may shrink meanwhile).
  size_t read_into(uint8_t* dst, size_t n, size_t at, const std::string& path) const {
    size_t used = 0;
    while (used < n) {
      const size_t want = std::min<size_t>(n - used, 1 << 30);
      if (fifo) {
        // Until a writer has opened the FIFO, poll() waits (the kernel reports no hang-up to a
        // reader that has not seen one); then data (POLLIN) or the writer's close (POLLHUP).
        pollfd p{fd, POLLIN, 0};
        const int ready = ::poll(&p, 1, -1);
        if (ready < 0 && errno == EINTR) continue;
        CNN_CHECK(ready >= 0, "{}: poll error after {} bytes ({})", path, at + used,
                  std::strerror(errno));
      }
      const ssize_t got =
          regular ? ::pread(fd, dst + used, want, off_t(at + used)) : ::read(fd, dst + used, want);
      if (got < 0 && (errno == EINTR || (fifo && errno == EAGAIN))) continue;
      CNN_CHECK(got >= 0, "{}: read error after {} bytes ({})", path, at + used,
                std::strerror(errno));
      if (got == 0) break;
      used += size_t(got);
    }
    return used;
  }
};

}  // namespace

std::vector<uint8_t> read_file(const std::string& path, const ReadFileOptions& options) {
  const OpenFile f(path, options.allow_streams);
  const uint64_t cap = options.max_bytes;
  CNN_CHECK(f.size <= cap, "{}: {} of {} bytes is larger than the limit of {} bytes", path,
            options.what, f.size, cap);
  CNN_CHECK(f.size <= std::numeric_limits<size_t>::max() / 2, "{}: {} bytes cannot be held", path,
            f.size);
  // A known size is read in one go, asking for one byte more to notice a file that grew meanwhile.
  // An unknown size (a stream, a /proc file) is read in growing chunks, up to one byte past the
  // cap.
  const bool size_known = f.regular && f.size > 0;
  const uint64_t most =
      size_known ? f.size + 1 : (cap == std::numeric_limits<uint64_t>::max() ? cap : cap + 1);
  std::vector<uint8_t> out(size_t(size_known ? f.size + 1 : std::min<uint64_t>(most, 1 << 16)));
  size_t used = 0;
  for (;;) {
    const size_t got = f.read_into(out.data() + used, out.size() - used, used, path);
    used += got;
    CNN_CHECK(used <= cap, "{}: {} is larger than the limit of {} bytes", path, options.what, cap);
    if (used < out.size() || used >= most) break;
    out.resize(size_t(std::min<uint64_t>(most, uint64_t(out.size()) * 2)));
  }
  CNN_CHECK(!size_known || used <= f.size,
            "{}: the file grew while it was read (expected {} bytes)", path, f.size);
  out.resize(used);
  return out;
}

FileHead read_file_head(const std::string& path, size_t max_bytes) {
  const OpenFile f(path, false);
  FileHead h;
  h.file_bytes = f.size;
  h.bytes.resize(size_t(std::min<uint64_t>(f.size, max_bytes)));
  h.bytes.resize(f.read_into(h.bytes.data(), h.bytes.size(), 0, path));
  return h;
}

uint64_t regular_file_size(const std::string& path) {
  return OpenFile(path, false).size;
}

bool is_gzip(const uint8_t* data, size_t bytes) {
  return bytes >= 2 && data[0] == 0x1f && data[1] == 0x8b;
}

namespace {

// RAII for a z_stream in inflate mode.
struct Inflater {
  z_stream zs{};
  bool live = false;
  ~Inflater() {
    if (live) inflateEnd(&zs);
  }
};

}  // namespace

Gunzipped gunzip(const uint8_t* data, size_t bytes, size_t max_out, const std::string& name) {
  CNN_CHECK(is_gzip(data, bytes), "{}: bad gzip data: no gzip magic", name);
  Gunzipped out;
  Inflater inf;
  // 16 + MAX_WBITS: gzip wrapper only (header and CRC-32/size trailer checked by zlib).
  CNN_CHECK(inflateInit2(&inf.zs, 16 + MAX_WBITS) == Z_OK, "{}: cannot start zlib", name);
  inf.live = true;

  size_t in_pos = 0, used = 0;
  auto feed = [&] {  // zlib counts in uInt: feed at most 1 GiB at a time
    const size_t n = std::min<size_t>(bytes - in_pos, size_t(1) << 30);
    inf.zs.next_in = const_cast<Bytef*>(data + in_pos);
    inf.zs.avail_in = static_cast<uInt>(n);
  };
  feed();
  for (;;) {
    if (used == max_out) {  // the caller asked for no more; `complete` stays false
      out.data.resize(used);
      return out;
    }
    if (out.data.size() == used)
      out.data.resize(std::min(max_out, std::max<size_t>(used * 2, 1 << 16)));
    const size_t room = std::min<size_t>(out.data.size() - used, size_t(1) << 30);
    inf.zs.next_out = out.data.data() + used;
    inf.zs.avail_out = static_cast<uInt>(room);
    const uInt avail_before = inf.zs.avail_in;
    const int rc = inflate(&inf.zs, Z_NO_FLUSH);
    used += room - inf.zs.avail_out;
    in_pos += avail_before - inf.zs.avail_in;
    if (rc == Z_STREAM_END) {
      // Another member may follow (as `cat a.gz b.gz` makes); zero padding is tolerated as gzip
      // itself does; anything else is garbage.
      if (in_pos == bytes) break;
      if (is_gzip(data + in_pos, bytes - in_pos)) {
        CNN_CHECK(inflateReset(&inf.zs) == Z_OK, "{}: zlib reset failed", name);
        feed();
        continue;
      }
      const bool zeros = std::all_of(data + in_pos, data + bytes, [](uint8_t b) { return b == 0; });
      CNN_CHECK(zeros, "{}: bad gzip data: {} bytes of garbage after the compressed stream", name,
                bytes - in_pos);
      break;
    }
    if (rc == Z_OK) {
      if (inf.zs.avail_in == 0 && in_pos < bytes) feed();
      continue;
    }
    if (rc == Z_BUF_ERROR && in_pos == bytes)
      CNN_FAIL("{}: bad gzip data: truncated (the compressed stream ends early after {} bytes)",
               name, used);
    if (rc == Z_BUF_ERROR && inf.zs.avail_in == 0) {
      feed();
      continue;
    }
    CNN_FAIL("{}: bad gzip data: {}", name, inf.zs.msg ? inf.zs.msg : zError(rc));
  }
  out.data.resize(used);
  out.complete = true;
  return out;
}

std::vector<uint8_t> gzip_compress(const uint8_t* data, size_t bytes) {
  z_stream zs{};
  CNN_CHECK(deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK,
            "cannot start zlib deflate");
  std::vector<uint8_t> out;
  size_t in_pos = 0, used = 0;
  int rc = Z_OK;
  while (rc != Z_STREAM_END) {
    if (zs.avail_in == 0 && in_pos < bytes) {
      const size_t n = std::min<size_t>(bytes - in_pos, size_t(1) << 30);
      zs.next_in = const_cast<Bytef*>(data + in_pos);
      zs.avail_in = static_cast<uInt>(n);
      in_pos += n;
    }
    out.resize(std::max<size_t>(used + (1 << 16), used * 3 / 2));
    zs.next_out = out.data() + used;
    zs.avail_out = static_cast<uInt>(out.size() - used);
    const size_t room = zs.avail_out;
    rc = deflate(&zs, in_pos == bytes && zs.avail_in == 0 ? Z_FINISH : Z_NO_FLUSH);
    used += room - zs.avail_out;
    if (rc != Z_OK && rc != Z_STREAM_END && rc != Z_BUF_ERROR) {
      deflateEnd(&zs);
      CNN_FAIL("gzip compression failed ({})", zError(rc));
    }
  }
  deflateEnd(&zs);
  out.resize(used);
  return out;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace cnn
