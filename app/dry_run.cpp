#include "app/dry_run.h"

#include <fmt/format.h>

#include "app/config.h"
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
  const int64_t batch_flops = sum.total_flops * cfg.training.batch_size;
  std::string out = fmt::format("run '{}' from {}: input {}\n", cfg.name, cfg.source_path,
                                shape_str(cfg.model.input_chw));
  out += format_network_summary(sum);
  out += fmt::format("batch size: {}\n", cfg.training.batch_size);
  out += fmt::format("forward FLOPs per batch: {} ({:.3f} GFLOP)\n", with_commas(batch_flops),
                     batch_flops * 1e-9);
  return out;
}

}  // namespace cnn
