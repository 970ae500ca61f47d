#include "app/config/config_yaml.h"

#include <fmt/format.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

#include "app/config/did_you_mean.h"
#include "runtime/error.h"
#include "runtime/text.h"

namespace cnn {

namespace {

// True when `prefix` is `path` or one of its ancestors ("a.b" of "a.b.c" and "a.b[2]").
bool path_under(const std::string& path, const std::string& prefix) {
  if (path.compare(0, prefix.size(), prefix) != 0) return false;
  return path.size() == prefix.size() || path[prefix.size()] == '.' || path[prefix.size()] == '[';
}

int mark_line(const YAML::Node& n, int fallback) {
  if (!n) return fallback;
  const YAML::Mark m = n.Mark();
  return m.is_null() ? fallback : m.line + 1;
}

std::string int_range_str(int64_t lo, int64_t hi) {
  const bool no_lo = lo == std::numeric_limits<int64_t>::min();
  // 32-bit fields cap at INT_MAX; saying so in every message would only be noise.
  const bool no_hi = hi >= std::numeric_limits<int>::max();
  if (no_lo && no_hi) return "";
  if (no_hi) return fmt::format(" >= {}", lo);
  if (no_lo) return fmt::format(" <= {}", hi);
  return fmt::format(" in [{}, {}]", lo, hi);
}

// One step of a --set key path: a map key or a list index.
struct PathStep {
  bool is_index = false;
  std::string key;
  size_t index = 0;
};

}  // namespace

// ---- YamlDoc ------------------------------------------------------------------------------------

void YamlDoc::fail(const std::string& path, int line, const std::string& msg) const {
  for (auto it = overrides_.rbegin(); it != overrides_.rend(); ++it) {
    if (!path_under(path, it->root)) continue;
    if (path == it->target) CNN_FAIL("{}: --set {}: {}", file_, it->arg, msg);
    CNN_FAIL("{}: --set {}: {}: {}", file_, it->arg, path, msg);
  }
  const std::string where = line > 0 ? fmt::format("{}:{}", file_, line) : file_;
  if (path.empty()) CNN_FAIL("{}: {}", where, msg);
  CNN_FAIL("{}: {}: {}", where, path, msg);
}

void YamlDoc::apply_override(YAML::Node& root, const std::string& arg) {
  auto fail_set = [&](const std::string& msg) { CNN_FAIL("{}: --set {}: {}", file_, arg, msg); };
  const size_t eq = arg.find('=');
  if (eq == std::string::npos || eq == 0)
    fail_set("expected key.path=value, e.g. --set optimizer.lr=0.01");
  const std::string key = arg.substr(0, eq), value = arg.substr(eq + 1);

  // Parse the key path: name ('[' index ']')* ('.' name ('[' index ']')*)*.
  std::vector<PathStep> steps;
  for (size_t i = 0; i < key.size();) {
    if (key[i] == '[') {
      const size_t close = key.find(']', i);
      const std::string digits = close == std::string::npos ? "" : key.substr(i + 1, close - i - 1);
      if (steps.empty() || digits.empty() || digits.size() > 9 ||
          digits.find_first_not_of("0123456789") != std::string::npos)
        fail_set(fmt::format("bad key path '{}': expected a list index like layers[3]", key));
      PathStep s;
      s.is_index = true;
      s.index = std::stoul(digits);
      steps.push_back(s);
      i = close + 1;
    } else {
      const size_t end = key.find_first_of(".[", i);
      PathStep s;
      s.key = key.substr(i, end == std::string::npos ? std::string::npos : end - i);
      if (s.key.empty() || s.key.find(']') != std::string::npos)
        fail_set(fmt::format("bad key path '{}': expected names separated by dots", key));
      steps.push_back(s);
      i = end == std::string::npos ? key.size() : end;
    }
    if (i < key.size() && key[i] == '.') {
      ++i;
      if (i == key.size() || key[i] == '.' || key[i] == '[')
        fail_set(fmt::format("bad key path '{}': expected a name after '.'", key));
    }
  }

  YAML::Node parsed;
  if (value.empty()) {
    parsed = YAML::Node(std::string());
  } else {
    try {
      parsed = YAML::Load(value);
    } catch (const YAML::Exception& e) {
      fail_set(fmt::format("the value is not valid YAML: {}", e.msg));
    }
  }

  // Walk down, creating missing map keys; yaml-cpp nodes are references into the tree, so
  // reset() rebinds `cur` where plain assignment would overwrite the node it points at.
  // A null root (an empty file) has no node to write into yet.
  if (!root || root.IsNull()) root = YAML::Node(YAML::NodeType::Map);
  YAML::Node cur;
  cur.reset(root);
  std::string path, created_root;
  for (size_t si = 0; si < steps.size(); ++si) {
    const PathStep& s = steps[si];
    const bool last = si + 1 == steps.size();
    const std::string step_path = s.is_index ? fmt::format("{}[{}]", path, s.index)
                                             : (path.empty() ? s.key : path + "." + s.key);
    YAML::Node next;
    if (s.is_index) {
      if (!cur.IsSequence())
        fail_set(fmt::format("{} is not a list, so it has no item [{}]", path, s.index));
      if (s.index >= cur.size())
        fail_set(
            fmt::format("{} has {} items, so there is no item [{}]", path, cur.size(), s.index));
      if (last) {
        cur[s.index] = parsed;
        break;
      }
      next.reset(cur[s.index]);
    } else {
      if (cur.IsNull()) cur = YAML::Node(YAML::NodeType::Map);
      if (!cur.IsMap())
        fail_set(fmt::format("{} is {}, not a map, so it has no key '{}'",
                             path.empty() ? "the config" : path,
                             cur.IsSequence() ? "a list" : "a single value", s.key));
      bool exists = false;
      for (const auto& kv : cur)
        if (kv.first.IsScalar() && kv.first.Scalar() == s.key) exists = true;
      if (!exists && created_root.empty()) created_root = step_path;
      if (last) {
        cur[s.key] = parsed;
        break;
      }
      if (!exists) cur[s.key] = YAML::Node(YAML::NodeType::Map);
      next.reset(cur[s.key]);
    }
    cur.reset(next);
    path = step_path;
  }
  std::string target;
  for (const auto& s : steps)
    target += s.is_index ? fmt::format("[{}]", s.index) : (target.empty() ? s.key : "." + s.key);
  overrides_.push_back({created_root.empty() ? target : created_root, target, arg});
}

// ---- NumRange -----------------------------------------------------------------------------------

bool NumRange::contains(double v) const {
  if (lo_open ? !(v > lo) : !(v >= lo)) return false;
  if (hi_open ? !(v < hi) : !(v <= hi)) return false;
  return true;
}

std::string NumRange::str() const {
  const bool no_lo = std::isinf(lo), no_hi = std::isinf(hi);
  if (no_lo && no_hi) return "";
  if (no_hi) return fmt::format("{} {}", lo_open ? ">" : ">=", lo);
  if (no_lo) return fmt::format("{} {}", hi_open ? "<" : "<=", hi);
  return fmt::format("in {}{}, {}{}", lo_open ? "(" : "[", lo, hi, hi_open ? ")" : "]");
}

NumRange at_least(double lo) {
  return between(lo, std::numeric_limits<double>::infinity());
}
NumRange greater_than(double lo) {
  return between(lo, std::numeric_limits<double>::infinity(), true, false);
}
NumRange between(double lo, double hi, bool lo_open, bool hi_open) {
  NumRange r;
  r.lo = lo;
  r.hi = hi;
  r.lo_open = lo_open;
  r.hi_open = hi_open;
  return r;
}

// ---- ConfigNode ---------------------------------------------------------------------------------

std::string ConfigNode::describe() const {
  if (is_null()) return "nothing";
  if (is_map()) return "a map";
  if (is_list()) return "a list";
  return "'" + excerpt(node_.Scalar()) + "'";
}

int64_t ConfigNode::as_int(int64_t lo, int64_t hi) const {
  const std::string range = int_range_str(lo, hi);
  if (!is_scalar()) fail(fmt::format("expected an integer{}, got {}", range, describe()));
  const std::string& s = node_.Scalar();
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0])) || *end != '\0' ||
      errno == ERANGE)
    fail(fmt::format("expected an integer{}, got {}", range, describe()));
  if (v < lo) fail(fmt::format("expected an integer{}, got {}", range, excerpt(s)));
  if (v > hi) fail(fmt::format("expected an integer in [{}, {}], got {}", lo, hi, excerpt(s)));
  return v;
}

uint64_t ConfigNode::as_uint64() const {
  const char* what = "expected an integer in [0, 18446744073709551615]";
  if (!is_scalar()) fail(fmt::format("{}, got {}", what, describe()));
  const std::string& s = node_.Scalar();
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (s.empty() || !std::isdigit(static_cast<unsigned char>(s[0])) || *end != '\0' ||
      errno == ERANGE)
    fail(fmt::format("{}, got {}", what, describe()));
  return v;
}

double ConfigNode::as_number(const NumRange& r) const {
  const std::string range = r.str().empty() ? "" : " " + r.str();
  if (!is_scalar()) fail(fmt::format("expected a number{}, got {}", range, describe()));
  const std::string& s = node_.Scalar();
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || std::isspace(static_cast<unsigned char>(s[0])) || *end != '\0' ||
      !std::isfinite(v))
    fail(fmt::format("expected a number{}, got {}", range, describe()));
  if (!r.contains(v)) fail(fmt::format("expected a number{}, got {}", range, excerpt(s)));
  return v;
}

bool ConfigNode::as_bool() const {
  if (is_scalar()) {
    const std::string& s = node_.Scalar();
    for (const char* t : {"true", "True", "TRUE", "yes", "on"})
      if (s == t) return true;
    for (const char* f : {"false", "False", "FALSE", "no", "off"})
      if (s == f) return false;
  }
  fail(fmt::format("expected true or false, got {}", describe()));
}

std::string ConfigNode::as_string() const {
  if (is_null()) return "";
  if (!is_scalar()) fail(fmt::format("expected a string, got {}", describe()));
  return node_.Scalar();
}

std::string ConfigNode::as_nonempty_string() const {
  if (!is_scalar() || node_.Scalar().empty())
    fail(fmt::format("expected a non-empty string, got {}", is_scalar() ? "''" : describe()));
  return node_.Scalar();
}

std::string ConfigNode::as_choice(const std::vector<std::string>& allowed) const {
  if (is_scalar()) {
    for (const auto& a : allowed)
      if (node_.Scalar() == a) return a;
    fail(fmt::format("expected one of {}, got {}{}", join_names(allowed), describe(),
                     did_you_mean(node_.Scalar(), allowed)));
  }
  fail(fmt::format("expected one of {}, got {}", join_names(allowed), describe()));
}

std::vector<ConfigNode> ConfigNode::as_list() const {
  if (!is_list()) fail(fmt::format("expected a list, got {}", describe()));
  std::vector<ConfigNode> items;
  for (size_t i = 0; i < node_.size(); ++i)
    items.emplace_back(*doc_, node_[i], fmt::format("{}[{}]", path_, i),
                       mark_line(node_[i], line_));
  return items;
}

ConfigNode ConfigNode::child(const YAML::Node& node, const std::string& key, int line) const {
  return ConfigNode(*doc_, node, path_.empty() ? key : path_ + "." + key, line > 0 ? line : line_);
}

// ---- ConfigMap ----------------------------------------------------------------------------------

ConfigMap::ConfigMap(const ConfigNode& node, std::vector<std::string> known)
    : node_(node), known_(std::move(known)) {
  if (node_.is_null()) return;
  if (!node_.is_map())
    node_.fail(
        fmt::format("expected a map with keys {}, got {}", join_names(known_), node_.describe()));
  for (const auto& kv : node_.yaml()) {
    const int line = mark_line(kv.first, node_.line());
    if (!kv.first.IsScalar())
      node_.doc().fail(node_.path(), line, "expected a plain name as the key, got a map or list");
    const std::string& key = kv.first.Scalar();
    // A key is echoed in every message about it: a hostile one only as an excerpt.
    ConfigNode child = node_.child(kv.second, excerpt(key), line);
    for (const auto& prev : children_)
      if (prev.first == key)
        child.fail(fmt::format("duplicate key (first given at line {})", prev.second.line()));
    bool is_known = false;
    for (const auto& k : known_) is_known = is_known || k == key;
    if (!is_known)
      child.fail(fmt::format("unknown key{} (known keys: {})", did_you_mean(key, known_),
                             join_names(known_)));
    children_.emplace_back(key, child);
  }
}

void ConfigMap::check_known(const std::string& key) const {
  for (const auto& k : known_)
    if (k == key) return;
  throw std::logic_error("ConfigMap: key '" + key + "' is not in the schema of " + node_.path());
}

bool ConfigMap::has(const std::string& key) const {
  check_known(key);
  for (const auto& c : children_)
    if (c.first == key) return true;
  return false;
}

ConfigNode ConfigMap::at(const std::string& key) const {
  check_known(key);
  for (const auto& c : children_)
    if (c.first == key) return c.second;
  throw std::logic_error("ConfigMap::at: '" + key + "' is absent from " + node_.path());
}

ConfigNode ConfigMap::require(const std::string& key, const std::string& what) const {
  if (!has(key)) {
    const std::string path = node_.path().empty() ? key : node_.path() + "." + key;
    node_.doc().fail(path, node_.line(), "missing required key; expected " + what);
  }
  return at(key);
}

std::vector<std::string> ConfigMap::keys() const {
  std::vector<std::string> k;
  for (const auto& c : children_) k.push_back(c.first);
  return k;
}

int64_t ConfigMap::get_int(const std::string& key, int64_t def, int64_t lo, int64_t hi) const {
  return has(key) ? at(key).as_int(lo, hi) : def;
}
double ConfigMap::get_number(const std::string& key, double def, const NumRange& r) const {
  return has(key) ? at(key).as_number(r) : def;
}
bool ConfigMap::get_bool(const std::string& key, bool def) const {
  return has(key) ? at(key).as_bool() : def;
}
std::string ConfigMap::get_string(const std::string& key, const std::string& def) const {
  return has(key) ? at(key).as_string() : def;
}
std::string ConfigMap::get_choice(const std::string& key, const std::string& def,
                                  const std::vector<std::string>& allowed) const {
  return has(key) ? at(key).as_choice(allowed) : def;
}

// ---- helpers ------------------------------------------------------------------------------------

std::string yaml_quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      out += fmt::format("\\x{:02X}", u);
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) out += (i ? ", " : "") + names[i];
  return out;
}

}  // namespace cnn
