#pragma once
// What makes a timing on this machine comparable with another: the GPU model, its compute
// capability, the driver and the CUDA runtime. The autotune cache (layers/tune_cache.h) keys its
// choices by these (plus our build's git hash), so a choice is never reused on another GPU or
// software stack.
#include <map>
#include <string>

namespace cnn {

// {"device": "NVIDIA H200", "compute_capability": "9.0", "driver": "13000", "runtime": "13000"}
// for the current CUDA device; {"device": "CPU"} on the CPU or in a build without CUDA.
std::map<std::string, std::string> device_identity(bool cuda);

}  // namespace cnn
