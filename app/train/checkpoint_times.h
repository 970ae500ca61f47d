#pragma once
// How long a run had trained when each of its checkpoints was written, kept beside them in
// <checkpoint folder>/checkpoint_times.json, so that a resumed run's time_s continues where the
// checkpoint left it. Not in the checkpoint itself: checkpoints of the same config and seed stay
// byte-identical (no time, path or host inside).
#include <string>

#include "layers/checkpoint/checkpoint.h"

namespace cnn {

// Records that <dir>/<file> holds position pos, reached after elapsed_s seconds (atomic write).
void record_checkpoint_time(const std::string& dir, const std::string& file,
                            const TrainPosition& pos, double elapsed_s);

// The seconds recorded for the checkpoint at ckpt_path when the record matches its position;
// else the time_s of the last row at or before that step in metrics_csv (a checkpoint whose
// record was not written, e.g. a kill between the two renames); else 0.
double checkpoint_elapsed(const std::string& ckpt_path, const TrainPosition& pos,
                          const std::string& metrics_csv);

}  // namespace cnn
