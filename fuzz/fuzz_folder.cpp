// The image-folder walk (data.format: folder, and ./infer's folder arguments) over trees that the
// input describes: class folders with any byte in their names, images, garbage, links to
// /dev/zero, to siblings and to themselves, and FIFOs. One entry per input line:
//   d<class>            a class folder
//   f<class>/<file>     a valid 2x2 PNG          g<class>/<file>  a file holding the line's bytes
//   z<class>/<file>     a link to /dev/zero      p<class>/<file>  a FIFO
//   l<class>/<file>|<target>   a link to <target> (relative; ".." refused)
//   L<class>            a class folder that is a link to itself
// Nothing may hang (a FIFO), read endlessly (/dev/zero) or crash; an accepted dataset must be
// consistent, and its class names valid UTF-8 (they go into a JSON checkpoint).
#include <sys/stat.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "app/image_paths.h"
#include "data/image_folder.h"
#include "fuzz/fuzz_temp.h"
#include "fuzz/fuzz_util.h"
#include "runtime/text.h"

namespace {

namespace fs = std::filesystem;

// A 2x2 gray PNG (pixels 0, 64 / 128, 255; zlib level 6), checksums valid.
const uint8_t kPng[] = {0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d,
                        0x49, 0x48, 0x44, 0x52, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x02,
                        0x08, 0x00, 0x00, 0x00, 0x00, 0x57, 0xdd, 0x52, 0xf8, 0x00, 0x00, 0x00,
                        0x0e, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0x60, 0x70, 0x60, 0x68,
                        0xf8, 0x0f, 0x00, 0x03, 0x05, 0x01, 0xc0, 0x4e, 0x33, 0x5b, 0xe9, 0x00,
                        0x00, 0x00, 0x00, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82};

constexpr size_t kMaxEntries = 32;

// One path component: non-empty, not "." or "..", no '/' or NUL, at most 64 bytes.
bool component_ok(const std::string& c) {
  return !c.empty() && c.size() <= 64 && c != "." && c != ".." &&
         c.find_first_of(std::string("/\0", 2)) == std::string::npos;
}

// "<class>/<file>" or "<class>" split into its components; empty when not acceptable.
std::vector<std::string> split_path(const std::string& s, size_t parts) {
  std::vector<std::string> out;
  size_t pos = 0;
  for (size_t k = 0; k < parts; ++k) {
    const size_t slash = k + 1 < parts ? s.find('/', pos) : s.size();
    if (slash == std::string::npos) return {};
    out.push_back(s.substr(pos, slash - pos));
    if (!component_ok(out.back())) return {};
    pos = slash + 1;
  }
  return out;
}

void build(const fs::path& root, const std::string& text) {
  size_t pos = 0, entries = 0;
  std::error_code ec;
  while (pos < text.size() && entries++ < kMaxEntries) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty()) continue;
    const char op = line[0];
    std::string rest = line.substr(1), target;
    if (op == 'l') {
      const size_t bar = rest.find('|');
      if (bar == std::string::npos) continue;
      target = rest.substr(bar + 1);
      rest.resize(bar);
      if (target.empty() || target[0] == '/' || target.find("..") != std::string::npos) continue;
    }
    const bool is_class = op == 'd' || op == 'L';
    const std::vector<std::string> parts = split_path(rest, is_class ? 1 : 2);
    if (parts.empty()) continue;
    const fs::path cls = root / parts[0];
    if (op == 'd') {
      fs::create_directories(cls, ec);
      continue;
    }
    if (op == 'L') {
      fs::create_symlink(parts[0], cls, ec);
      continue;
    }
    fs::create_directories(cls, ec);
    const fs::path file = cls / parts[1];
    if (op == 'f' || op == 'g') {
      std::ofstream out(file, std::ios::binary | std::ios::trunc);
      if (op == 'f')
        out.write(reinterpret_cast<const char*>(kPng), sizeof(kPng));
      else
        out << line;
    } else if (op == 'z') {
      fs::create_symlink("/dev/zero", file, ec);
    } else if (op == 'p') {
      ::mkfifo(file.c_str(), 0600);
    } else if (op == 'l') {
      fs::create_symlink(target, file, ec);
    }
  }
}

void check(const cnn::Dataset& d) {
  if (d.n < 1 || d.labels.size() != size_t(d.n) || d.num_classes() < 1)
    cnn::fuzz::bug("folder accepted with inconsistent counts");
  for (const auto& name : d.class_names)
    if (!cnn::valid_utf8(name)) cnn::fuzz::bug("a class name that is not UTF-8 was accepted");
  for (int32_t l : d.labels)
    if (l < 0 || l >= d.num_classes()) cnn::fuzz::bug("label outside the classes");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const fs::path root = cnn::fuzz::scratch_dir("folder") / "root";
  std::error_code ec;
  fs::remove_all(root, ec);
  fs::create_directories(root);
  build(root, std::string(reinterpret_cast<const char*>(data), size));

  cnn::ImageLoadOptions opt;
  opt.height = opt.width = 2;
  cnn::fuzz::refused([&] { check(cnn::load_image_folder(root.string(), opt)); });
  opt.skip_bad_images = true;
  cnn::fuzz::refused([&] { check(cnn::load_image_folder(root.string(), opt)); });
  // ./infer's walk: every file it lists is loaded (and refused) the way ./infer does it.
  const cnn::ExpandedPaths paths = cnn::expand_image_paths({root.string()});
  for (const auto& f : paths.files)
    cnn::fuzz::refused([&] { cnn::load_image_file(f, 1, 2, 2, true); });
  return 0;
}
