#include "app/train/checkpoint_times.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "runtime/atomic_file.h"
#include "runtime/file_io.h"

namespace cnn {

namespace fs = std::filesystem;

namespace {

constexpr const char* kTimesFile = "checkpoint_times.json";
constexpr size_t kMaxTimesBytes = 1 << 20;

nlohmann::json read_times(const std::string& path) {
  try {
    return nlohmann::json::parse(read_file(path, {kMaxTimesBytes, "checkpoint times", true}));
  } catch (const std::exception&) {
    return nlohmann::json::object();  // missing or damaged: only the metrics fallback is lost
  }
}

bool same_position(const nlohmann::json& r, const TrainPosition& pos) {
  return r.is_object() && r.value("epoch", int64_t(-1)) == pos.epoch &&
         r.value("batch_in_epoch", int64_t(-1)) == pos.batch_in_epoch &&
         r.value("global_step", int64_t(-1)) == pos.global_step && r.contains("elapsed_s") &&
         r["elapsed_s"].is_number();
}

double last_metrics_time(const std::string& csv, int64_t step) {
  std::ifstream in(csv);
  std::string line;
  double t = 0;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::stringstream ss(line);
    std::string time_s, epoch, row_step;
    if (!std::getline(ss, time_s, ',') || !std::getline(ss, epoch, ',') ||
        !std::getline(ss, row_step, ','))
      continue;
    try {
      if (std::stoll(row_step) <= step) t = std::max(t, std::stod(time_s));
    } catch (const std::exception&) {
    }
  }
  return t;
}

}  // namespace

void record_checkpoint_time(const std::string& dir, const std::string& file,
                            const TrainPosition& pos, double elapsed_s) {
  const std::string path = dir + "/" + kTimesFile;
  nlohmann::json all = read_times(path);
  if (!all.is_object()) all = nlohmann::json::object();
  all[file] = {{"epoch", pos.epoch},
               {"batch_in_epoch", pos.batch_in_epoch},
               {"global_step", pos.global_step},
               {"elapsed_s", elapsed_s}};
  const std::string text = all.dump(1) + "\n";
  write_file_atomically(path, text.data(), text.size());
}

double checkpoint_elapsed(const std::string& ckpt_path, const TrainPosition& pos,
                          const std::string& metrics_csv) {
  const fs::path p(ckpt_path);
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  const nlohmann::json all = read_times((dir / kTimesFile).string());
  const std::string file = p.filename().string();
  if (all.is_object() && all.contains(file) && same_position(all[file], pos))
    return all[file]["elapsed_s"].get<double>();
  return last_metrics_time(metrics_csv, pos.global_step);
}

}  // namespace cnn
