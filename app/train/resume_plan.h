#pragma once
// What a --resume will do, said before it does it: whether anything is left to train, which
// config keys differ from the checkpoint's own config and what that changes, and a refusal where
// continuing would give a wrong result (another optimizer's state, a new batch size inside an
// epoch).
#include <optional>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "layers/checkpoint/checkpoint.h"

namespace cnn {

// The config stored in a checkpoint, with --set overrides applied (--resume without --config).
TrainConfig config_from_checkpoint(const std::string& ckpt, const std::vector<std::string>& sets);

class ResumePlan {
 public:
  // Compares cfg with the config stored in the checkpoint at `ckpt` (whose metadata is `meta`);
  // throws cnn::Error naming the key, both values and what to do instead where the resume would
  // be wrong.
  ResumePlan(const TrainConfig& cfg, const CheckpointMeta& meta, const std::string& ckpt);

  // True when the checkpoint already reached training.epochs (or training.max_steps).
  bool finished() const;
  // For a finished run: that there is nothing to do, and the command that trains longer.
  std::string finished_message(const std::string& resume_command) const;

  // One line per changed key ("training.epochs: 3 -> 6") and per consequence, once the number of
  // steps per epoch is known (the learning rate at the resume point under both configs).
  std::vector<std::string> change_notes(int64_t steps_per_epoch) const;

  // The optimizer state tensors found in the checkpoint against what cfg's optimizer keeps:
  // another optimizer's state is refused; none at all is a note (the moments start from zero).
  static std::string check_optimizer_state(const OptimizerOptions& opt,
                                           const std::vector<std::string>& state_names,
                                           const std::string& ckpt);

 private:
  const TrainConfig& cfg_;
  TrainPosition pos_;
  std::string ckpt_;
  std::optional<TrainConfig> old_;  // the checkpoint's config, when it still parses
  std::string old_error_;           // why it did not
  std::vector<std::pair<std::string, std::string>> diffs_;  // key, "old -> new"
};

}  // namespace cnn
