#include "runtime/device_identity.h"

#include <string>

#ifdef CNN_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "runtime/cuda_check.h"
#endif

namespace cnn {

std::map<std::string, std::string> device_identity(bool cuda) {
  if (!cuda) return {{"device", "CPU"}};
#ifdef CNN_HAVE_CUDA
  int dev = 0, driver = 0, runtime = 0;
  cudaDeviceProp p{};
  CNN_CUDA_CHECK(cudaGetDevice(&dev));
  CNN_CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
  CNN_CUDA_CHECK(cudaDriverGetVersion(&driver));
  CNN_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  return {{"device", p.name},
          {"compute_capability", std::to_string(p.major) + "." + std::to_string(p.minor)},
          {"driver", std::to_string(driver)},
          {"runtime", std::to_string(runtime)}};
#else
  return {{"device", "CPU"}};
#endif
}

}  // namespace cnn
