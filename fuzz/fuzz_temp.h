#pragma once
// A scratch folder per fuzz process under $TMPDIR (fuzz.sh gives each target its own), removed
// at exit: the list and folder loaders read paths, so their inputs become files first.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace cnn::fuzz {

inline const std::filesystem::path& scratch_dir(const char* target) {
  static const std::filesystem::path dir = [target] {
    const char* tmp = std::getenv("TMPDIR");
    std::filesystem::path d =
        std::filesystem::path(tmp && *tmp ? tmp : "/tmp") /
        (std::string("cnn_fuzz_") + target + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    return d;
  }();
  static const bool cleanup = std::atexit([] {
                                std::error_code ec;
                                std::filesystem::remove_all(dir, ec);
                              }) == 0;
  (void)cleanup;
  return dir;
}

}  // namespace cnn::fuzz
