#pragma once
// What every program shares: the --version text, the command-line parse that turns CLI11's
// mistakes into one line, and the one place that turns an exception into one clear line on
// stderr and exit code 1 ("prog: error: <what>").
#include <functional>
#include <string>

namespace CLI {
class App;
}

namespace cnn {

// Filled in at configure time (build_info.cpp.in).
extern const char* const kBuildVersion;
extern const char* const kBuildGitHash;
extern const char* const kBuildCudaArchs;

std::string version_string(const char* program);  // version, git hash, CUDA on/off, archs

// Runs body(); a cnn::Error or any std::exception becomes "program: error: <what>" (one line)
// on stderr and exit code 1.
int run_main(const char* program, const std::function<int()>& body);

// Parses argv into `app`. Returns false when --help or --version was printed (the program then
// exits 0). A mistake throws cnn::Error of one line ending in "(see PROGRAM --help)", so that
// run_main reports it like every other error; an unknown option is named even when a required
// one is also missing (CLI11 checks requirements first and would report only those).
bool parse_command_line(CLI::App& app, int argc, const char* const* argv, const char* program);

}  // namespace cnn
