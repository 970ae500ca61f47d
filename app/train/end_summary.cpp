#include "app/train/end_summary.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

namespace cnn {

namespace fs = std::filesystem;

namespace {

struct EvalRow {
  int64_t epoch = 0;
  double loss = 0, accuracy = -1;
};

// The best evaluation row (highest accuracy, the earliest of equals); accuracy < 0 when none.
EvalRow best_eval(const std::string& metrics_csv) {
  std::ifstream in(metrics_csv);
  std::string line;
  std::getline(in, line);  // header: time_s,epoch,step,phase,loss,accuracy,lr,images_per_s
  EvalRow best;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    for (std::string x; std::getline(ss, x, ',');) f.push_back(x);
    if (f.size() < 6 || f[3] != "eval") continue;
    EvalRow r{std::atoll(f[1].c_str()), std::atof(f[4].c_str()), std::atof(f[5].c_str())};
    if (r.accuracy > best.accuracy) best = r;
  }
  return best;
}

std::string size_str(uintmax_t bytes) {
  return bytes >= (1u << 20) ? fmt::format("{:.1f} MiB", double(bytes) / (1 << 20))
                             : fmt::format("{:.1f} KiB", double(bytes) / 1024);
}

// Quoted for a POSIX shell when it holds anything but plain path characters.
std::string shell_word(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                        "0123456789_-./=:+@,") == std::string::npos)
    return s;
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

}  // namespace

std::string format_end_summary(const EndSummaryInput& in) {
  std::string out = fmt::format("run finished: {} epochs, {} steps in {:.1f} s{}\n", in.epochs,
                                in.steps, in.seconds, in.target);
  const EvalRow best = best_eval(in.metrics_csv);
  if (best.accuracy >= 0)
    out += fmt::format("  best: epoch {}, {} accuracy {:.2f}% (loss {:.4f})\n", best.epoch,
                       in.eval_name, 100 * best.accuracy, best.loss);
  else
    out += "  best: no evaluation ran (no test or validation set)\n";
  std::string files;
  for (const char* name : {"best.safetensors", "last.safetensors"}) {
    const fs::path p = fs::path(in.ckpt_dir) / name;
    std::error_code ec;
    const uintmax_t size = fs::file_size(p, ec);
    if (!ec)
      files += fmt::format("{}{} ({})", files.empty() ? "" : ", ", p.string(), size_str(size));
  }
  out += "  checkpoints: " + (files.empty() ? std::string("none written") : files) + "\n";
  out += "  next:\n";
  out += fmt::format("    classify images: ./infer --checkpoint {} images/\n",
                     shell_word(in.ckpt_dir));
  out += fmt::format("    plot the curves: python3 scripts/plot_metrics.py {} -o {}\n",
                     shell_word(in.metrics_csv),
                     shell_word((fs::path(in.run_dir) / "metrics.png").string()));
  out += fmt::format("    train longer:    {} --set training.epochs={}\n", in.resume_command,
                     2 * in.epochs);
  return out;
}

}  // namespace cnn
