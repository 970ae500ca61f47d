#include "app/train/resume_plan.h"

#include <fmt/format.h>

#include <map>
#include <set>

#include "layers/lr_schedule.h"
#include "layers/param_optimizer.h"
#include "runtime/error.h"

namespace cnn {
namespace {

// The resolved config (config_to_yaml's fixed layout) as "section.key" -> value, with the model's
// layers as model.layers[i]: two configs compare key by key.
std::vector<std::pair<std::string, std::string>> flat_keys(const std::string& yaml) {
  std::vector<std::pair<std::string, std::string>> out;
  std::string section;
  int layer = 0;
  size_t pos = 0;
  while (pos < yaml.size()) {
    size_t end = yaml.find('\n', pos);
    if (end == std::string::npos) end = yaml.size();
    const std::string line = yaml.substr(pos, end - pos);
    pos = end + 1;
    const size_t indent = line.find_first_not_of(' ');
    if (indent == std::string::npos || line[indent] == '#') continue;
    const std::string text = line.substr(indent);
    if (indent >= 4 && text.rfind("- ", 0) == 0) {
      out.emplace_back(fmt::format("model.layers[{}]", layer++), text.substr(2));
      continue;
    }
    const size_t colon = text.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = text.substr(0, colon);
    const std::string value = colon + 1 < text.size() ? text.substr(colon + 2) : "";
    if (indent == 0) {
      if (value.empty())
        section = key;
      else
        out.emplace_back(key, value);
    } else if (!value.empty()) {
      out.emplace_back(section + "." + key, value);
    }
  }
  return out;
}

const char* optimizer_kind(OptimizerType t) {
  return t == OptimizerType::Sgd ? "SGD" : t == OptimizerType::Adam ? "Adam" : "AdamW";
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::vector<std::string> expected_state(const OptimizerOptions& o) {
  if (o.type == OptimizerType::Sgd) return {"optimizer.momentum"};
  return {"optimizer.adam_m", "optimizer.adam_v"};
}

}  // namespace

TrainConfig config_from_checkpoint(const std::string& ckpt, const std::vector<std::string>& sets) {
  const CheckpointMeta meta = read_checkpoint_meta(ckpt);
  CNN_CHECK(!meta.config_yaml.empty(), "{}: the checkpoint holds no config; pass --config", ckpt);
  TrainConfig cfg;
  try {
    cfg = parse_config(meta.config_yaml, ckpt + " (its stored config)", sets);
  } catch (const Error& e) {
    CNN_FAIL("{} (pass --config FILE to resume with another config)", e.what());
  }
  // Before the network is built from it: a stored input of 4096x4096 would allocate first.
  check_checkpoint_can_hold(ckpt, meta, cfg.model.layers, cfg.model.input_chw);
  return cfg;
}

ResumePlan::ResumePlan(const TrainConfig& cfg, const CheckpointMeta& meta, const std::string& ckpt)
    : cfg_(cfg), pos_(meta.position), ckpt_(ckpt) {
  try {
    old_ = parse_config(meta.config_yaml, ckpt + " (its stored config)");
  } catch (const Error& e) {
    old_error_ = e.what();
  }
  if (!old_) return;
  const auto before = flat_keys(old_->resolved_yaml), after = flat_keys(cfg.resolved_yaml);
  std::map<std::string, std::string> was(before.begin(), before.end());
  std::set<std::string> seen;
  for (const auto& [key, value] : after) {
    seen.insert(key);
    const auto it = was.find(key);
    const std::string old_value = it == was.end() ? "(absent)" : it->second;
    if (old_value != value) diffs_.emplace_back(key, old_value + " -> " + value);
  }
  for (const auto& [key, value] : before)
    if (!seen.count(key)) diffs_.emplace_back(key, value + " -> (absent)");

  const OptimizerType from = old_->optimizer.type, to = cfg.optimizer.type;
  CNN_CHECK((from == OptimizerType::Sgd) == (to == OptimizerType::Sgd),
            "--resume {}: optimizer.type {} -> {} would load {}'s state as {}'s moments; to "
            "train these weights with {} from a fresh optimizer, use --init-weights {} instead "
            "of --resume (or keep optimizer.type {})",
            ckpt, optimizer_name(from), optimizer_name(to), optimizer_kind(from),
            optimizer_kind(to), optimizer_name(to), ckpt, optimizer_name(from));
  // The global batch is what the position counts: a different number of GPUs changes it too.
  const TrainingOptions &ot = old_->training, &nt = cfg.training;
  const std::string change =
      ot.gpus == 1 && nt.gpus == 1
          ? fmt::format("training.batch_size {} -> {}", ot.batch_size, nt.batch_size)
          : fmt::format("the global batch (batch_size x gpus) {} x {} -> {} x {}", ot.batch_size,
                        ot.gpus, nt.batch_size, nt.gpus);
  CNN_CHECK(int64_t(ot.batch_size) * ot.gpus == int64_t(nt.batch_size) * nt.gpus ||
                pos_.batch_in_epoch == 0,
            "--resume {}: {} inside epoch {} (the checkpoint is at its batch {}): the rest of "
            "that epoch's images cannot be split into the new batches; finish the epoch as it "
            "was (--set training.epochs={}), then resume with the new batch",
            ckpt, change, pos_.epoch + 1, pos_.batch_in_epoch, pos_.epoch + 1);
}

bool ResumePlan::finished() const {
  const TrainingOptions& t = cfg_.training;
  return pos_.epoch >= t.epochs || (t.max_steps > 0 && pos_.global_step >= t.max_steps);
}

std::string ResumePlan::finished_message(const std::string& resume_command) const {
  const TrainingOptions& t = cfg_.training;
  if (t.max_steps > 0 && pos_.global_step >= t.max_steps && pos_.epoch < t.epochs)
    return fmt::format(
        "{} is finished: it stopped at training.max_steps={} (step {}, epoch {} of {}); nothing "
        "to do. To train further: {} --set training.max_steps=0 (no limit) or a larger value",
        ckpt_, t.max_steps, pos_.global_step, pos_.epoch + 1, t.epochs, resume_command);
  return fmt::format(
      "{} is finished: {} of {} epochs trained (step {}){}; nothing to do. To train longer: {} "
      "--set training.epochs={}",
      ckpt_, pos_.epoch, t.epochs, pos_.global_step,
      pos_.best_accuracy >= 0 ? fmt::format(", best accuracy {:.2f}%", 100 * pos_.best_accuracy)
                              : "",
      resume_command, std::max<int64_t>(pos_.epoch, t.epochs) * 2);
}

std::vector<std::string> ResumePlan::change_notes(int64_t steps_per_epoch) const {
  std::vector<std::string> notes;
  if (!old_) {
    notes.push_back(fmt::format(
        "cannot compare with the checkpoint's own config, which no longer reads ({}); the run "
        "continues with the given config",
        old_error_));
    return notes;
  }
  for (const auto& [key, change] : diffs_) notes.push_back(key + ": " + change);
  if (diffs_.empty()) return notes;
  const TrainConfig& o = *old_;
  if (o.optimizer.type != cfg_.optimizer.type)
    notes.push_back(fmt::format(
        "the Adam moments carry over; weight decay is now {} (optimizer.type {})",
        cfg_.optimizer.type == OptimizerType::AdamW ? "decoupled" : "added to the gradient",
        optimizer_name(cfg_.optimizer.type)));
  const int64_t old_global = int64_t(o.training.batch_size) * o.training.gpus;
  const int64_t new_global = int64_t(cfg_.training.batch_size) * cfg_.training.gpus;
  if (old_global != new_global)
    notes.push_back(fmt::format(
        "batch size {} -> {}: {} steps per epoch from epoch {} on; the step count continues from "
        "{} and the schedule follows epochs (the learning rate is not rescaled)",
        old_global, new_global, steps_per_epoch, pos_.epoch + 1, pos_.global_step));
  // The schedule is a function of the fractional epoch: compare both configs at the resume point.
  const double t = double(pos_.epoch) + double(pos_.batch_in_epoch) / double(steps_per_epoch);
  const double lr_old = learning_rate(o.schedule, o.optimizer.lr, t, o.training.epochs);
  const double lr_new = learning_rate(cfg_.schedule, cfg_.optimizer.lr, t, cfg_.training.epochs);
  const bool schedule_changed = o.training.epochs != cfg_.training.epochs ||
                                o.optimizer.lr != cfg_.optimizer.lr ||
                                o.schedule.type != cfg_.schedule.type;
  if (lr_old != lr_new)
    notes.push_back(fmt::format(
        "learning rate at the resume point (epoch {:.2f}): {:.6g} ({} schedule over {} epochs), "
        "where the checkpoint's config ({} over {} epochs) gives {:.6g}",
        t, lr_new, schedule_name(cfg_.schedule.type), cfg_.training.epochs,
        schedule_name(o.schedule.type), o.training.epochs, lr_old));
  else if (schedule_changed)
    notes.push_back(fmt::format(
        "learning rate at the resume point (epoch {:.2f}): {:.6g}, as before ({} schedule, now "
        "over {} epochs)",
        t, lr_new, schedule_name(cfg_.schedule.type), cfg_.training.epochs));
  return notes;
}

std::string ResumePlan::check_optimizer_state(const OptimizerOptions& opt,
                                              const std::vector<std::string>& state_names,
                                              const std::string& ckpt) {
  if (state_names.empty())
    return fmt::format(
        "{} holds no optimizer state: the {} state starts from zero (the weights, step count "
        "and schedule continue)",
        ckpt, optimizer_kind(opt.type));
  const std::vector<std::string> want = expected_state(opt);
  const std::set<std::string> got(state_names.begin(), state_names.end());
  const std::set<std::string> need(want.begin(), want.end());
  CNN_CHECK(got == need,
            "--resume {}: the checkpoint's optimizer state ({}) is not {}'s ({}); use "
            "--init-weights {} to start a fresh optimizer from its weights",
            ckpt, joined(state_names), optimizer_name(opt.type), joined(want), ckpt);
  return "";
}

}  // namespace cnn
