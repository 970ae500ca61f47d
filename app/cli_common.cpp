#include "app/cli_common.h"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "runtime/device.h"
#include "runtime/env_switches.h"
#include "runtime/error.h"

namespace cnn {

namespace {

// Messages may span lines (CLI11's, a nested what()); the error format is one line.
std::string one_line(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  std::string out;
  for (char c : s) {
    if (c == '\n')
      out += "; ";
    else if (c != '\r')
      out += c;
  }
  return out;
}

// The first argument that looks like an option and that no option of `app` takes ("" if none).
std::string first_unknown_option(CLI::App& app, int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--") break;
    if (a.size() < 2 || a[0] != '-' || (a[1] >= '0' && a[1] <= '9') || a[1] == '.') continue;
    const std::string name = a.substr(0, a.find('='));
    bool known = false;
    for (const CLI::Option* o : app.get_options()) known = known || o->check_name(name);
    // A short-flag cluster (-abc) or a short option with its value attached (-n5).
    if (!known && name.size() > 2 && name[1] != '-')
      for (const CLI::Option* o : app.get_options())
        known = known || o->check_name(name.substr(0, 2));
    if (!known) return name;
  }
  return "";
}

}  // namespace

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
    std::fprintf(stderr, "%s: error: %s\n", program, one_line(e.what()).c_str());
    return 1;
  }
}

bool parse_command_line(CLI::App& app, int argc, const char* const* argv, const char* program) {
  try {
    app.parse(argc, argv);
    return true;
  } catch (const CLI::Success& e) {  // --help, --version: CLI11 prints them, exit 0
    app.exit(e);
    return false;
  } catch (const CLI::ParseError& e) {
    if (dynamic_cast<const CLI::RequiredError*>(&e) || dynamic_cast<const CLI::ExtrasError*>(&e)) {
      const std::string unknown = first_unknown_option(app, argc, argv);
      CNN_CHECK(unknown.empty(), "unknown option {} (see {} --help)", unknown, program);
    }
    CNN_FAIL("{} (see {} --help)", one_line(e.what()), program);
  }
}

}  // namespace cnn
