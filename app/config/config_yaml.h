#pragma once
// Strict reading of a YAML config tree: every value is checked for its type and range, every map
// for unknown and duplicate keys, and every failure becomes one line naming the file, the key path,
// its line and what was expected. Also applies `--set key.path=value` overrides to the tree.
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace cnn {

// The file being read plus the places where --set overrides put values, so that an error in an
// overridden value names the --set argument instead of a line of the file.
class YamlDoc {
 public:
  explicit YamlDoc(std::string file) : file_(std::move(file)) {}
  const std::string& file() const { return file_; }

  // Throws cnn::Error "<file>:<line>: <path>: <msg>" (or "<file>: --set <arg>: ..." when the
  // path lies under an override).
  [[noreturn]] void fail(const std::string& path, int line, const std::string& msg) const;

  // Applies one "key.path=value" (value parsed as YAML) to root. Map keys along the path are
  // created when missing (the schema check later rejects unknown ones); list items must exist.
  void apply_override(YAML::Node& root, const std::string& arg);

 private:
  struct Override {
    std::string root;    // first path component the override created (or its target)
    std::string target;  // the full key path it sets
    std::string arg;     // as typed, for messages
  };
  std::string file_;
  std::vector<Override> overrides_;
};

// A numeric interval for range checks; open ends exclude the bound.
struct NumRange {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false, hi_open = false;
  bool contains(double v) const;
  std::string str() const;  // "> 0", ">= 0", "in [0, 1)"
};
NumRange at_least(double lo);
NumRange greater_than(double lo);
NumRange between(double lo, double hi, bool lo_open = false, bool hi_open = false);

// One node of the tree with its key path ("model.layers[3].linear") and 1-based line.
class ConfigNode {
 public:
  ConfigNode(const YamlDoc& doc, YAML::Node node, std::string path, int line)
      : doc_(&doc), node_(std::move(node)), path_(std::move(path)), line_(line) {}

  const YAML::Node& yaml() const { return node_; }
  const std::string& path() const { return path_; }
  int line() const { return line_; }
  const YamlDoc& doc() const { return *doc_; }
  [[noreturn]] void fail(const std::string& msg) const { doc_->fail(path_, line_, msg); }

  bool is_null() const { return !node_ || node_.IsNull(); }
  bool is_scalar() const { return node_ && node_.IsScalar(); }
  bool is_map() const { return node_ && node_.IsMap(); }
  bool is_list() const { return node_ && node_.IsSequence(); }
  std::string describe() const;  // "'abc'", "a map", "a list", "nothing"

  int64_t as_int(int64_t lo = std::numeric_limits<int64_t>::min(),
                 int64_t hi = std::numeric_limits<int64_t>::max()) const;
  uint64_t as_uint64() const;
  double as_number(const NumRange& r = NumRange()) const;
  bool as_bool() const;
  std::string as_string() const;           // null reads as ""
  std::string as_nonempty_string() const;  // refuses null and ""
  std::string as_choice(const std::vector<std::string>& allowed) const;
  std::vector<ConfigNode> as_list() const;  // items with paths "<path>[i]"

  ConfigNode child(const YAML::Node& node, const std::string& key, int line) const;

 private:
  const YamlDoc* doc_;
  YAML::Node node_;
  std::string path_;
  int line_;
};

// A map whose keys must all be among `known`; no key may appear twice. A null node (a key with
// nothing after it) reads as an empty map.
class ConfigMap {
 public:
  ConfigMap(const ConfigNode& node, std::vector<std::string> known);

  const ConfigNode& node() const { return node_; }
  bool has(const std::string& key) const;
  ConfigNode at(const std::string& key) const;  // the key must be present (check has())
  // Fails "missing required key; expected <what>" at the map's line when absent.
  ConfigNode require(const std::string& key, const std::string& what) const;
  std::vector<std::string> keys() const;

  int64_t get_int(const std::string& key, int64_t def, int64_t lo,
                  int64_t hi = std::numeric_limits<int64_t>::max()) const;
  double get_number(const std::string& key, double def, const NumRange& r) const;
  bool get_bool(const std::string& key, bool def) const;
  std::string get_string(const std::string& key, const std::string& def) const;
  std::string get_choice(const std::string& key, const std::string& def,
                         const std::vector<std::string>& allowed) const;

 private:
  void check_known(const std::string& key) const;
  ConfigNode node_;
  std::vector<std::string> known_;
  std::vector<std::pair<std::string, ConfigNode>> children_;
};

// A string as a double-quoted YAML scalar, escaped so that any text survives a round trip.
std::string yaml_quote(const std::string& s);

// "a, b, c" for messages.
std::string join_names(const std::vector<std::string>& names);

}  // namespace cnn
