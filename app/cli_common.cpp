#include "app/cli_common.h"

#include <fmt/format.h>

#include <cstdio>
#include <exception>

#include "runtime/device.h"
#include "runtime/env_switches.h"

namespace cnn {

std::string version_string(const char* program) {
  return fmt::format("{} {} (git {}), CUDA {}, architectures {}", program, kBuildVersion,
                     kBuildGitHash, built_with_cuda() ? "on" : "off", kBuildCudaArchs);
}

int run_main(const char* program, const std::function<int()>& body) {
  try {
    // Every CNN_* variable is read and checked before any work (runtime/env_switches.h).
    process_env_switches();
    return body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace cnn
