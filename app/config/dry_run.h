#pragma once
// What ./train --dry-run prints: the network table, the batch size and the forward FLOPs of one
// batch, computed from the config alone (no data is read, nothing is allocated).
#include <string>

namespace cnn {

struct TrainConfig;

std::string format_dry_run(const TrainConfig& cfg);

}  // namespace cnn
