#pragma once
// Where a computation runs, chosen at run time.
#include <string>

namespace cnn {

enum class Device { CPU, CUDA };

const char* device_name(Device d);

// True when this build has CUDA and a usable GPU is present. A machine without a driver (the
// runtime answers "insufficient driver") counts as "no GPU", never as a crash. When false, *why
// (if given) says why in a few words.
bool cuda_available(std::string* why = nullptr);

// "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)" or "CPU".
std::string device_description(Device d);

// Parses "cpu" | "cuda" | "auto" (auto: CUDA when available). Throws on anything else.
Device resolve_device(const std::string& name);

// resolve_device, then for CUDA also creates the current device's context, so that the first
// allocation or launch does not pay for it. The context is the process's (the runtime's
// primary context), so it may be opened on one thread and used on another: the trainer opens it
// on a thread of its own while it decodes the dataset.
Device open_device(const std::string& name);

bool built_with_cuda();

// The current CUDA device's SM count (grids sized to fill the GPU); 0 without CUDA.
int current_device_sm_count();

}  // namespace cnn
