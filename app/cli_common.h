#pragma once
// What every program shares: the --version text and the one place that turns an exception into
// one clear line on stderr and a non-zero exit code.
#include <functional>
#include <string>

namespace cnn {

// Filled in at configure time (build_info.cpp.in).
extern const char* const kBuildVersion;
extern const char* const kBuildGitHash;
extern const char* const kBuildCudaArchs;

std::string version_string(const char* program);  // version, git hash, CUDA on/off, archs

// Runs body(); a cnn::Error or any std::exception becomes "program: error: <what>" and exit 1.
int run_main(const char* program, const std::function<int()>& body);

}  // namespace cnn
