#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "runtime/atomic_file.h"
#include "runtime/error.h"
#include "runtime/file_io.h"
#include "tests/test_util.h"

using namespace cnn;
namespace fs = std::filesystem;

namespace {

// The file as text, refused above max_bytes.
std::string read_text(const std::string& path, uint64_t max_bytes) {
  const std::vector<uint8_t> bytes = cnn::read_file(path, {max_bytes});
  return std::string(bytes.begin(), bytes.end());
}

// A fresh directory per test, removed afterwards, so tests never see each other's files.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "cnn_atomic_XXXXXX").string();
    const char* made = ::mkdtemp(pattern.data());
    if (made == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = made;
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  // Leftover temporary files would mean a failed write did not clean up after itself.
  int leftover_temporaries() const {
    int n = 0;
    for (const auto& e : fs::directory_iterator(path_)) {
      if (e.path().filename().string().find(".tmp.") != std::string::npos) ++n;
    }
    return n;
  }

 private:
  fs::path path_;
};

void expect_error_mentions(const std::function<void()>& f, const std::string& a,
                           const std::string& b) {
  try {
    f();
    ADD_FAILURE() << "expected cnn::Error mentioning '" << a << "' and '" << b << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(a), std::string::npos) << msg;
    EXPECT_NE(msg.find(b), std::string::npos) << msg;
  }
}

void write_string(const std::string& path, const std::string& s) {
  write_file_atomically(path, s.data(), s.size());
}

// Runs in a death-test child: caps the file size, tries a larger atomic write, prints the error
// and exits 0 when it was a cnn::Error, 1 when the write unexpectedly succeeded.
void write_under_file_size_limit(const std::string& path, size_t bytes) {
  std::signal(SIGXFSZ, SIG_IGN);  // the write fails with EFBIG instead of killing the process
  rlimit limit{};
  limit.rlim_cur = limit.rlim_max = 4096;
  ::setrlimit(RLIMIT_FSIZE, &limit);
  const std::string big(bytes, 'x');
  try {
    write_string(path, big);
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::_Exit(0);
  }
  std::_Exit(1);
}

}  // namespace

TEST(AtomicFile, WritesAndReplaces) {
  TempDir dir;
  const std::string path = dir.file("out.bin");
  write_string(path, "first version");
  EXPECT_EQ(read_text(path, 1 << 20), "first version");
  write_string(path, "second");
  EXPECT_EQ(read_text(path, 1 << 20), "second");
  write_string(path, "");
  EXPECT_EQ(read_text(path, 1 << 20), "");
  EXPECT_EQ(dir.leftover_temporaries(), 0);
}

TEST(AtomicFile, WriterThrowingMidwayLeavesOldFileIntact) {
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  write_string(path, "the old checkpoint");

  // A foreign exception type passes through unchanged.
  EXPECT_THROW(write_file_atomically(path,
                                     [](std::FILE* f) {
                                       write_bytes_checked(f, "partial new", 11);
                                       throw std::runtime_error("interrupted");
                                     }),
               std::runtime_error);
  EXPECT_EQ(read_text(path, 1 << 20), "the old checkpoint");
  EXPECT_EQ(dir.leftover_temporaries(), 0);

  // A cnn::Error comes back with the path in front of it.
  expect_error_mentions(
      [&] {
        write_file_atomically(path, [](std::FILE* f) {
          write_bytes_checked(f, "partial", 7);
          CNN_FAIL("tensor 'fc.w' is not finite");
        });
      },
      path, "tensor 'fc.w' is not finite");
  EXPECT_EQ(read_text(path, 1 << 20), "the old checkpoint");
  EXPECT_EQ(dir.leftover_temporaries(), 0);
}

TEST(AtomicFile, DirectoryThatIsARegularFileGivesClearError) {
  // Works even as root, where permission bits are not enforced.
  TempDir dir;
  write_string(dir.file("plain"), "x");
  const std::string path = dir.file("plain") + "/out.bin";
  expect_error_mentions([&] { write_string(path, "data"); }, path, "Not a directory");
  expect_error_mentions([&] { append_line_durably(path, "1,2"); }, path, "Not a directory");
}

TEST(AtomicFile, ReadOnlyDirectoryGivesClearError) {
  if (::geteuid() == 0) GTEST_SKIP() << "running as root: permission bits are not enforced";
  TempDir dir;
  const std::string sub = dir.file("ro");
  fs::create_directory(sub);
  fs::permissions(sub, fs::perms::owner_read | fs::perms::owner_exec);
  const std::string path = sub + "/out.bin";
  expect_error_mentions([&] { write_string(path, "data"); }, path, "Permission denied");
  fs::permissions(sub, fs::perms::owner_all);
}

TEST(AtomicFile, WriteFailingMidwayLeavesOldFileIntact) {
  // A file-size limit makes the kernel refuse the write part-way (EFBIG), as a full disk would.
  // It runs in a child process so that the limit does not leak into other tests.
  TempDir dir;
  const std::string path = dir.file("big.bin");
  write_string(path, "old contents");
  EXPECT_EXIT(write_under_file_size_limit(path, 1 << 20), ::testing::ExitedWithCode(0),
              "big\\.bin.*File too large");
  EXPECT_EQ(read_text(path, 1 << 20), "old contents");
  EXPECT_EQ(dir.leftover_temporaries(), 0);
}

TEST(AtomicFile, AppendLineDurably) {
  TempDir dir;
  const std::string path = dir.file("metrics.csv");
  append_line_durably(path, "epoch,loss");
  append_line_durably(path, "1,0.5");
  append_line_durably(path, "2,0.25");
  EXPECT_EQ(read_text(path, 1 << 20), "epoch,loss\n1,0.5\n2,0.25\n");
}

TEST(AtomicFile, AppendToFullDeviceFails) {
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
  expect_error_mentions([] { append_line_durably("/dev/full", "1,0.5"); }, "/dev/full",
                        "No space left on device");
}

TEST(AtomicFile, ReadFileLimitsAndErrors) {
  TempDir dir;
  const std::string path = dir.file("ten.txt");
  write_string(path, "0123456789");
  EXPECT_EQ(read_text(path, 10), "0123456789");
  expect_error_mentions([&] { read_text(path, 9); }, path,
                        "10 bytes is larger than the limit of 9");

  const std::string missing = dir.file("missing.txt");
  expect_error_mentions([&] { read_text(missing, 100); }, missing, "No such file");
  expect_error_mentions([&] { read_text(dir.file(""), 100); }, "cnn_atomic_", "directory");

  // /proc files report size 0, so only the limit while reading can catch them.
  if (fs::exists("/proc/self/status")) {
    expect_error_mentions([] { read_text("/proc/self/status", 16); }, "/proc/self/status",
                          "larger than the limit of 16");
  }
}

TEST(AtomicFile, ReadFileStreamsOnlyWhenAllowed) {
  TempDir dir;
  const std::string fifo = dir.file("pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Refused before anything blocks: no writer is ever opened here.
  expect_error_mentions([&] { read_file(fifo, {100}); }, fifo, "FIFO");

  // Allowed: the content comes through the pipe, and the cap still holds while reading.
  for (const auto& [text, cap] : {std::pair<std::string, uint64_t>{"through the pipe", 100},
                                  std::pair<std::string, uint64_t>{std::string(300, 'x'), 64}}) {
    std::thread writer([&fifo, text = text] {
      std::ofstream out(fifo, std::ios::binary);
      out << text;
    });
    std::string got, error;
    const uint64_t limit = cap;  // a structured binding cannot be captured in C++17 (clang)
    try {
      got = [&] {
        const std::vector<uint8_t> b = read_file(fifo, {limit, "stream", true});
        return std::string(b.begin(), b.end());
      }();
    } catch (const Error& e) {
      error = e.what();
    }
    writer.join();
    if (text.size() <= cap) {
      EXPECT_EQ(got, text);
    } else {
      EXPECT_NE(error.find("larger than the limit of 64"), std::string::npos) << error;
    }
  }
}
