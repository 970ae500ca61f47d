#include "runtime/device.h"

#include "runtime/error.h"

#ifdef CNN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace cnn {

const char* device_name(Device d) {
  return d == Device::CUDA ? "cuda" : "cpu";
}

bool built_with_cuda() {
#ifdef CNN_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

bool cuda_available(std::string* why) {
#ifdef CNN_HAVE_CUDA
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky error so later calls start clean
    if (why) *why = fmt::format("no CUDA device ({})", cudaGetErrorString(err));
    return false;
  }
  if (count == 0) {
    if (why) *why = "no CUDA device";
    return false;
  }
  return true;
#else
  if (why) *why = "this build has no CUDA (nvcc was not found at configure time)";
  return false;
#endif
}

std::string device_description(Device d) {
  if (d == Device::CPU) return "CPU";
#ifdef CNN_HAVE_CUDA
  int dev = 0;
  cudaDeviceProp p{};
  if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&p, dev) != cudaSuccess)
    return "CUDA (unknown device)";
  return fmt::format("{} (sm_{}{}, {} SMs, {:.1f} GiB)", p.name, p.major, p.minor,
                     p.multiProcessorCount, p.totalGlobalMem / double(1ull << 30));
#else
  return "CUDA (not built)";
#endif
}

int current_device_sm_count() {
#ifdef CNN_HAVE_CUDA
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    CNN_FAIL("cannot read the current GPU's SM count");
  }
  return sms;
#else
  return 0;
#endif
}

Device resolve_device(const std::string& name) {
  if (name == "cpu") return Device::CPU;
  std::string why;
  if (name == "cuda") {
    CNN_CHECK(cuda_available(&why), "device 'cuda' requested but {}", why);
    return Device::CUDA;
  }
  if (name == "auto") return cuda_available() ? Device::CUDA : Device::CPU;
  CNN_FAIL("device '{}' is not one of cpu, cuda, auto", name);
}

Device open_device(const std::string& name) {
  const Device d = resolve_device(name);
#ifdef CNN_HAVE_CUDA
  if (d == Device::CUDA) {
    const cudaError_t err = cudaFree(nullptr);  // the documented way to create the context
    CNN_CHECK(err == cudaSuccess, "cannot create a CUDA context: {}", cudaGetErrorString(err));
  }
#endif
  return d;
}

}  // namespace cnn
