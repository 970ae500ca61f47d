#include <cstdlib>
#include <cstring>

namespace cnn {

bool sync_check_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("CNN_SYNC_CHECK");
    return v && std::strcmp(v, "0") != 0 && *v;
  }();
  return enabled;
}

}  // namespace cnn
