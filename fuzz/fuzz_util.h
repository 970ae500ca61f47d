#pragma once
// Shared by the fuzz targets: what counts as an expected refusal and what as a bug.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "runtime/error.h"

namespace cnn::fuzz {

// Runs f; an exception is the parser refusing the input, which is what hostile input should get.
// Crashes, sanitizer reports, timeouts and allocations over -malloc_limit_mb are what libFuzzer
// reports as bugs.
template <class F>
bool refused(F&& f) {
  try {
    f();
    return false;
  } catch (const std::exception&) {
    return true;
  }
}

// A broken invariant of accepted input: report it the way libFuzzer reports a crash.
[[noreturn]] inline void bug(const std::string& what) {
  std::fprintf(stderr, "FUZZ INVARIANT BROKEN: %s\n", what.c_str());
  std::abort();
}

}  // namespace cnn::fuzz
