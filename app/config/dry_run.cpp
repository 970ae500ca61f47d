#include "app/config/dry_run.h"

#include <fmt/format.h>

#include "app/config/config.h"
#include "layers/layer_spec.h"

namespace cnn {

namespace {
std::string with_commas(int64_t v) {
  const std::string digits = std::to_string(v < 0 ? -v : v);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}
}  // namespace

std::string format_dry_run(const TrainConfig& cfg) {
  const NetworkSummary sum = summarize_network(cfg.model.layers, cfg.model.input_chw);
  int64_t batch_flops = 0;  // beyond 2^63 (an absurd but valid config) only the GFLOP are shown
  const bool exact =
      !__builtin_mul_overflow(sum.total_flops, int64_t(cfg.training.batch_size), &batch_flops);
  std::string out = fmt::format("run '{}' from {}: input {}\n", cfg.name, cfg.source_path,
                                shape_str(cfg.model.input_chw));
  out += format_network_summary(sum);
  out += fmt::format("batch size: {}\n", cfg.training.batch_size);
  const double gflop = double(sum.total_flops) * cfg.training.batch_size * 1e-9;
  out += fmt::format("forward FLOPs per batch: {} ({:.3f} GFLOP)\n",
                     exact ? with_commas(batch_flops) : "more than 2^63", gflop);
  return out;
}

}  // namespace cnn
