#include "runtime/env_switches.h"

namespace cnn {

bool sync_check_enabled() {
  return process_env_switches().sync_check;
}

}  // namespace cnn
