#include "app/bench/bench_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "runtime/atomic_file.h"

namespace cnn::bench {

namespace {

std::string num(double v, const char* fmt_spec) {
  if (!std::isfinite(v)) return std::isinf(v) ? "inf" : "-";
  return fmt::format(fmt::runtime(fmt_spec), v);
}

std::string rate_str(const BenchRow& r) {
  return num(r.rate, r.compute_bound ? "{:.2f}" : "{:.0f}");
}

struct Column {
  std::string title;
  bool right = false;  // numbers are right-aligned
};

using Table = std::vector<std::vector<std::string>>;

std::string truncate(const std::string& s, size_t n) {
  return s.size() <= n ? s : s.substr(0, n - 3) + "...";
}

std::string aligned(const std::vector<Column>& cols, const Table& rows) {
  std::vector<size_t> w(cols.size());
  for (size_t c = 0; c < cols.size(); ++c) w[c] = cols[c].title.size();
  for (const auto& r : rows)
    for (size_t c = 0; c < cols.size(); ++c) w[c] = std::max(w[c], r[c].size());
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (size_t c = 0; c < cols.size(); ++c) {
      const bool last = c + 1 == cols.size();
      const std::string pad(w[c] - cells[c].size(), ' ');
      out += cols[c].right ? pad + cells[c] : cells[c] + (last ? "" : pad);
      if (!last) out += "  ";
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out + "\n";
  };
  std::vector<std::string> titles;
  for (const auto& c : cols) titles.push_back(c.title);
  std::string out = line(titles);
  std::string rule;
  for (size_t c = 0; c < cols.size(); ++c)
    rule += std::string(w[c], '-') + (c + 1 < cols.size() ? "  " : "");
  out += rule + "\n";
  for (const auto& r : rows) out += line(r);
  return out;
}

std::string md_cell(std::string s) {
  std::string out;
  for (char ch : s) {
    if (ch == '|')
      out += "\\|";
    else if (ch == '\n')
      out += ' ';
    else
      out += ch;
  }
  return out;
}

std::string markdown(const std::vector<Column>& cols, const Table& rows) {
  std::string out = "|";
  for (const auto& c : cols) out += " " + c.title + " |";
  out += "\n|";
  for (const auto& c : cols) out += c.right ? "---:|" : "---|";
  out += "\n";
  for (const auto& r : rows) {
    out += "|";
    for (const auto& cell : r) out += " " + md_cell(cell) + " |";
    out += "\n";
  }
  return out;
}

// ---- the three sections ----

const std::vector<Column> kOpCols = {
    {"op"},           {"shape"},           {"variant"},      {"prec"},       {"status"},
    {"err", true},    {"median us", true}, {"p95 us", true}, {"rate", true}, {"unit"},
    {"% peak", true}, {"lib/ours", true},  {"note"}};

Table op_table(const std::vector<BenchRow>& rows, size_t note_width) {
  Table t;
  for (const auto& r : rows) {
    if (r.section != "op") continue;
    t.push_back({r.op, r.shape, r.variant, r.precision, r.status, num(r.err, "{:.1e}"),
                 num(r.median_us, "{:.1f}"), num(r.p95_us, "{:.1f}"), rate_str(r),
                 std::isfinite(r.rate) ? r.rate_unit() : "", num(100 * r.peak_frac, "{:.1f}"),
                 num(r.lib_over_ours, "{:.2f}x"), truncate(r.note, note_width)});
  }
  return t;
}

const std::vector<Column> kSummaryCols = {
    {"op"},      {"prec"},         {"best ours"},      {"us", true},
    {"library"}, {"lib us", true}, {"lib/ours", true}, {"% peak", true}};

// Per op and precision: our fastest correct variant beside the library's time.
Table summary_table(const std::vector<BenchRow>& rows) {
  std::vector<std::pair<std::string, std::string>> order;
  std::map<std::pair<std::string, std::string>, const BenchRow*> best, lib;
  for (const auto& r : rows) {
    if (r.section != "op") continue;
    const auto key = std::make_pair(r.op, r.precision);
    if (std::find(order.begin(), order.end(), key) == order.end()) order.push_back(key);
    if (r.status != "ok") continue;
    const bool is_lib = r.variant == "cudnn" || r.variant == "cublas";
    auto& slot = is_lib ? lib[key] : best[key];
    if (!slot || r.median_us < slot->median_us) slot = &r;
  }
  Table t;
  for (const auto& key : order) {
    const BenchRow* b = best.count(key) ? best[key] : nullptr;
    const BenchRow* l = lib.count(key) ? lib[key] : nullptr;
    t.push_back({key.first, key.second, b ? b->variant : "(none correct)",
                 b ? num(b->median_us, "{:.1f}") : "-", l ? l->variant : "-",
                 l ? num(l->median_us, "{:.1f}") : "-",
                 b && l ? num(l->median_us / b->median_us, "{:.2f}x") : "-",
                 b ? num(100 * b->peak_frac, "{:.1f}") : "-"});
  }
  return t;
}

const std::vector<Column> kStepCols = {
    {"batch", true},  {"prec"},        {"mode"},          {"status"},       {"us/step", true},
    {"p95 us", true}, {"img/s", true}, {"TFLOP/s", true}, {"% peak", true}, {"note"}};

Table step_table(const std::vector<BenchRow>& rows, size_t note_width) {
  Table t;
  for (const auto& r : rows) {
    if (r.section != "step") continue;
    t.push_back({std::to_string(r.batch), r.precision, r.variant, r.status,
                 num(r.median_us, "{:.1f}"), num(r.p95_us, "{:.1f}"), num(r.images_per_s, "{:.0f}"),
                 num(r.rate, "{:.2f}"), num(100 * r.peak_frac, "{:.1f}"),
                 truncate(r.note, note_width)});
  }
  return t;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string csv_num(double v) {
  return std::isfinite(v) ? fmt::format("{}", v) : "";
}

}  // namespace

std::string format_text(const std::vector<std::string>& header, const std::vector<BenchRow>& rows) {
  std::string out;
  for (const auto& h : header) out += h + "\n";
  const Table ops = op_table(rows, 90);
  if (!ops.empty()) {
    out +=
        "\nPer op (err = max|ours - ref| / max|ref| against the CPU reference; lib/ours > 1: "
        "ours is faster)\n";
    out += aligned(kOpCols, ops);
    out += "\nSummary: our fastest correct variant per op\n";
    out += aligned(kSummaryCols, summary_table(rows));
  }
  const Table steps = step_table(rows, 90);
  if (!steps.empty()) {
    out += "\nWhole training step (forward + backward + optimizer, data on the GPU)\n";
    out += aligned(kStepCols, steps);
  }
  return out;
}

std::string format_markdown(const std::vector<std::string>& header,
                            const std::vector<BenchRow>& rows) {
  std::string out = "# ./bench results\n\n";
  for (const auto& h : header) out += h.empty() ? "\n" : "    " + h + "\n";
  const Table ops = op_table(rows, 100000);
  if (!ops.empty()) {
    out +=
        "\n## Per op\n\nerr = max|ours - ref| / max|ref| against the CPU reference; "
        "lib/ours > 1 means ours is faster.\n\n";
    out += markdown(kOpCols, ops);
    out += "\n## Summary: our fastest correct variant per op\n\n";
    out += markdown(kSummaryCols, summary_table(rows));
  }
  const Table steps = step_table(rows, 100000);
  if (!steps.empty()) {
    out +=
        "\n## Whole training step\n\nForward + backward + optimizer update on random data "
        "already on the GPU.\n\n";
    out += markdown(kStepCols, steps);
  }
  return out;
}

std::string format_csv(const std::vector<BenchRow>& rows) {
  std::string out =
      "section,op,shape,variant,precision,status,max_rel_err,median_us,p95_us,flops,bytes,rate,"
      "rate_unit,peak_frac,lib_median_us,lib_over_ours,graph,batch,images_per_s,note\n";
  for (const auto& r : rows) {
    const std::vector<std::string> f = {r.section,
                                        r.op,
                                        r.shape,
                                        r.variant,
                                        r.precision,
                                        r.status,
                                        csv_num(r.err),
                                        csv_num(r.median_us),
                                        csv_num(r.p95_us),
                                        csv_num(r.flops),
                                        csv_num(r.bytes),
                                        csv_num(r.rate),
                                        r.rate_unit(),
                                        csv_num(r.peak_frac),
                                        csv_num(r.lib_us),
                                        csv_num(r.lib_over_ours),
                                        r.graph ? "1" : "0",
                                        r.batch ? std::to_string(r.batch) : "",
                                        csv_num(r.images_per_s),
                                        r.note};
    for (size_t i = 0; i < f.size(); ++i) out += (i ? "," : "") + csv_field(f[i]);
    out += "\n";
  }
  return out;
}

void write_text_file(const std::string& path, const std::string& text) {
  write_file_atomically(path, text.data(), text.size());
}

}  // namespace cnn::bench
