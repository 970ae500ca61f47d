// The config loader and validator as ./train runs it on --config text and --set arguments.
// Input: YAML text, optionally followed by a line "#--set" and then one override per line.
// Accepted configs must also survive what the trainer does next with them: their resolved YAML
// (saved as logs/<run>/config.yaml and in every checkpoint) must read back to itself, and the
// --dry-run table must be computable.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "app/config/config.h"
#include "app/config/dry_run.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> sets;
  static const std::string kMarker = "#--set\n";
  const size_t cut = text.rfind(kMarker);
  if (cut != std::string::npos && (cut == 0 || text[cut - 1] == '\n')) {
    const std::string rest = text.substr(cut + kMarker.size());
    text.resize(cut);
    size_t pos = 0;
    while (pos < rest.size()) {
      size_t end = rest.find('\n', pos);
      if (end == std::string::npos) end = rest.size();
      sets.push_back(rest.substr(pos, end - pos));
      pos = end + 1;
    }
  }
  cnn::TrainConfig cfg;
  if (cnn::fuzz::refused([&] { cfg = cnn::parse_config(text, "fuzz.yaml", sets); })) return 0;

  cnn::TrainConfig again;
  std::string why;
  try {
    again = cnn::parse_config(cfg.resolved_yaml, "resolved.yaml");
  } catch (const std::exception& e) {
    why = e.what();
  }
  if (!why.empty())
    cnn::fuzz::bug("the resolved config does not read back: " + why + "\n" + cfg.resolved_yaml);
  if (again.resolved_yaml != cfg.resolved_yaml)
    cnn::fuzz::bug("the resolved config reads back differently:\n" + cfg.resolved_yaml +
                   "---- read back as ----\n" + again.resolved_yaml);
  if (cnn::format_dry_run(cfg).empty()) cnn::fuzz::bug("empty dry-run table");
  return 0;
}
