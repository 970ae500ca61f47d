#include "app/bench/bench_depthwise.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace cnn::bench {

const std::vector<DepthwiseCase>& depthwise_cases() {
  static const std::vector<DepthwiseCase> cases = {{"dw3x3_1x64x32x32", 1, 64, 32, 32, 3},
                                                   {"dw3x3_1x64x128x128", 1, 64, 128, 128, 3},
                                                   {"dw3x3_8x64x128x128", 8, 64, 128, 128, 3},
                                                   {"dw3x3_1x256x128x128", 1, 256, 128, 128, 3},
                                                   {"dw5x5_8x12x64x64", 8, 12, 64, 64, 5}};
  return cases;
}

namespace {

std::string us(double v) {
  return std::isfinite(v) ? fmt::format("{:.1f}", v) : "-";
}

std::string ratio(double v) {
  return std::isfinite(v) ? fmt::format("{:.2f}x", v) : "-";
}

}  // namespace

std::string format_depthwise(const std::vector<BenchRow>& rows, const BenchOptions& opt,
                             double seconds, bool markdown) {
  const std::vector<std::string> titles = {"shape",  "pass",     "variant",   "P50 us",
                                           "P95 us", "floor us", "P50/floor", "cuDNN/ours"};
  std::vector<std::vector<std::string>> table;
  std::vector<std::string> ops;
  for (const auto& r : rows)
    if (r.section == "op" && std::find(ops.begin(), ops.end(), r.op) == ops.end())
      ops.push_back(r.op);
  for (const auto& op : ops) {
    const BenchRow* lib = nullptr;
    const BenchRow* best = nullptr;
    std::vector<const BenchRow*> ours;
    for (const auto& r : rows) {
      if (r.op != op) continue;
      if (r.variant == "cudnn") {
        lib = &r;
        continue;
      }
      ours.push_back(&r);
      if (r.status == "ok" && (!best || r.median_us < best->median_us)) best = &r;
    }
    const BenchRow& any = ours.empty() ? *lib : *ours.front();
    const std::string pass = op.substr(op.rfind('.') + 1);
    const double floor_us = any.bytes / (kPeakHbmGBps * 1e3);  // bytes / (GB/s) in us
    const double lib_us = lib && lib->status == "ok" ? lib->median_us : kNaN;
    auto line = [&](const std::string& variant, const BenchRow* r) {
      const bool ok = r && r->status == "ok";
      const double p50 = ok ? r->median_us : kNaN, p95 = ok ? r->p95_us : kNaN;
      table.push_back({any.shape, pass, ok || !r ? variant : variant + " (" + r->status + ")",
                       us(p50), us(p95), us(floor_us), ratio(p50 / floor_us),
                       variant == "cudnn" ? "1.00x" : ratio(lib_us / p50)});
    };
    for (const BenchRow* r : ours) line(r->variant, r);
    line(best ? "ours-best (" + best->variant + ")" : "ours-best", best);
    line("cudnn", lib);
  }

  std::vector<size_t> w(titles.size());
  for (size_t c = 0; c < titles.size(); ++c) w[c] = titles[c].size();
  for (const auto& r : table)
    for (size_t c = 0; c < r.size(); ++c) w[c] = std::max(w[c], r[c].size());
  std::string out;
  auto emit = [&](const std::vector<std::string>& cells) {
    if (markdown) {
      out += "|";
      for (const auto& cell : cells) out += " " + cell + " |";
    } else {
      for (size_t c = 0; c < cells.size(); ++c) {
        const std::string pad(w[c] - cells[c].size(), ' ');
        out += c < 3 ? cells[c] + pad : pad + cells[c];  // text left, numbers right
        if (c + 1 < cells.size()) out += "  ";
      }
      while (!out.empty() && out.back() == ' ') out.pop_back();
    }
    out += "\n";
  };
  // How the rows were timed, and what that cost.
  std::string timing = fmt::format(
      "up to {} samples of {} launches per row", opt.repeats, opt.launches);
  if (opt.budget_s > 0)
    timing += fmt::format(
        "; a row whose samples would take over {:g} s gets fewer launches per sample and "
        "fewer samples (at least 5), its note says how many",
        opt.budget_s);
  if (opt.lib_retime_within > 0)
    timing += fmt::format(
        "; cuDNN: the algorithms cudnnFind timed within {:g}x of its fastest are checked and "
        "timed, the others listed with Find's time",
        opt.lib_retime_within);
  timing += fmt::format("; the table took {:.0f} s", seconds);
  out += markdown ? "\n### Depthwise convolution (the seed article's table)\n\nFP32; floor = "
                    "bytes moved / 4.8 TB/s; " +
                        timing + ".\n\n"
                  : "\nDepthwise convolution (the seed article's table), FP32; floor = bytes "
                    "moved / 4.8 TB/s;\n" +
                        timing + "\n";
  emit(titles);
  if (markdown) {
    out += "|";
    for (size_t c = 0; c < titles.size(); ++c) out += c < 3 ? "---|" : "---:|";
    out += "\n";
  } else {
    std::string rule;
    for (size_t c = 0; c < titles.size(); ++c)
      rule += std::string(w[c], '-') + (c + 1 < titles.size() ? "  " : "");
    out += rule + "\n";
  }
  for (const auto& r : table) emit(r);
  return out;
}

}  // namespace cnn::bench
