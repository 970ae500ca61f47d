#include "app/image_paths.h"

#include <glob.h>

#include <algorithm>
#include <cctype>
#include <filesystem>

namespace cnn {

namespace fs = std::filesystem;

bool has_image_extension(const std::string& path) {
  std::string ext = fs::path(path).extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  return ext == ".png" || ext == ".bmp" || ext == ".jpg" || ext == ".jpeg";
}

namespace {

void note_skipped(const std::string& path, ExpandedPaths& out) {
  if (out.skipped++ == 0) out.skipped_example = path;
}

void add_folder(const std::string& dir, ExpandedPaths& out) {
  std::vector<std::string> found;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec),
       end;
       !ec && it != end; it.increment(ec))
    if (it->is_regular_file(ec)) {
      if (has_image_extension(it->path().string()))
        found.push_back(it->path().string());
      else
        note_skipped(it->path().string(), out);
    }
  if (ec) out.errors.push_back(dir + ": " + ec.message());
  std::sort(found.begin(), found.end());
  if (found.empty()) out.errors.push_back(dir + ": no PNG, BMP or JPG images inside");
  out.files.insert(out.files.end(), found.begin(), found.end());
}

}  // namespace

ExpandedPaths expand_image_paths(const std::vector<std::string>& args) {
  ExpandedPaths out;
  for (const auto& a : args) {
    std::error_code ec;
    if (fs::is_directory(a, ec)) {
      add_folder(a, out);
    } else if (fs::exists(a, ec)) {
      out.files.push_back(a);
    } else if (a.find_first_of("*?[") != std::string::npos) {
      glob_t g{};
      // Patterns are matched, never executed (no GLOB_BRACE/tilde or shell involvement).
      if (glob(a.c_str(), 0, nullptr, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; ++i) {
          std::string p = g.gl_pathv[i];
          if (fs::is_directory(p, ec))
            add_folder(p, out);
          else if (has_image_extension(p))
            out.files.push_back(p);
          else
            note_skipped(p, out);
        }
      } else {
        out.errors.push_back(a + ": the pattern matches no file");
      }
      globfree(&g);
    } else {
      out.errors.push_back(a + ": no such file or directory");
    }
  }
  return out;
}

}  // namespace cnn
