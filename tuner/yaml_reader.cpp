// tuner/yaml_reader.cpp: YamlMap.
#include "tuner/yaml_reader.h"

#include <algorithm>
#include <charconv>

#include "common/error.h"

namespace tessera::tuner {

namespace {
std::string shown(const YAML::Node& n) {
  if (n.IsScalar()) return "'" + n.Scalar() + "'";
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a mapping";
  return "null";
}
}  // namespace

YamlMap::YamlMap(const YAML::Node& node, std::string file, std::string path)
    : node_(node), file_(std::move(file)), path_(std::move(path)) {
  if (node_.IsDefined() && !node_.IsNull() && !node_.IsMap()) {
    TESSERA_FAIL(file_ << ": " << (path_.empty() ? std::string("the document") : path_) << ": expected a mapping, got "
                       << shown(node_));
  }
}

std::string YamlMap::key_path(const std::string& key) const {
  if (key.empty()) return path_;
  return path_.empty() ? key : path_ + "." + key;
}

void YamlMap::fail(const std::string& key, const std::string& message) const {
  TESSERA_FAIL(file_ << ": " << key_path(key) << ": " << message);
}

YAML::Node YamlMap::node(const std::string& key) {
  known_.push_back(key);
  if (!node_.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    if (it->first.IsScalar() && it->first.Scalar() == key) return it->second;
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

bool YamlMap::has(const std::string& key) {
  const YAML::Node n = node(key);
  return n.IsDefined() && !n.IsNull();
}

void YamlMap::get(const std::string& key, std::string& out) {
  const YAML::Node n = node(key);
  if (!n.IsDefined() || n.IsNull()) return;
  if (!n.IsScalar()) fail(key, "expected a string, got " + shown(n));
  out = n.Scalar();
}

void YamlMap::get(const std::string& key, int& out) {
  const YAML::Node n = node(key);
  if (!n.IsDefined() || n.IsNull()) return;
  const std::string s = n.IsScalar() ? n.Scalar() : std::string();
  int value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (!n.IsScalar() || ec != std::errc() || end != s.data() + s.size()) fail(key, "expected an integer, got " + shown(n));
  out = value;
}

void YamlMap::get(const std::string& key, double& out) {
  const YAML::Node n = node(key);
  if (!n.IsDefined() || n.IsNull()) return;
  const std::string s = n.IsScalar() ? n.Scalar() : std::string();
  double value = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (!n.IsScalar() || ec != std::errc() || end != s.data() + s.size()) fail(key, "expected a number, got " + shown(n));
  out = value;
}

void YamlMap::get(const std::string& key, bool& out) {
  const YAML::Node n = node(key);
  if (!n.IsDefined() || n.IsNull()) return;
  if (n.IsScalar() && (n.Scalar() == "true" || n.Scalar() == "false")) {
    out = n.Scalar() == "true";
    return;
  }
  fail(key, "expected true or false, got " + shown(n));
}

void YamlMap::get_list(const std::string& key, std::vector<std::string>& out) {
  const YAML::Node n = node(key);
  if (!n.IsDefined() || n.IsNull()) return;
  std::vector<std::string> values;
  if (n.IsScalar()) {
    values.push_back(n.Scalar());
  } else if (n.IsSequence()) {
    for (size_t i = 0; i < n.size(); ++i) {
      if (!n[i].IsScalar()) fail(key + "[" + std::to_string(i) + "]", "expected a scalar, got " + shown(n[i]));
      values.push_back(n[i].Scalar());
    }
  } else {
    fail(key, "expected a value or a list, got " + shown(n));
  }
  if (values.empty()) fail(key, "the list is empty");
  for (size_t i = 0; i < values.size(); ++i) {
    if (std::find(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(i), values[i]) !=
        values.begin() + static_cast<std::ptrdiff_t>(i)) {
      fail(key + "[" + std::to_string(i) + "]", "'" + values[i] + "' is listed twice");
    }
  }
  out = std::move(values);
}

void YamlMap::get_list(const std::string& key, std::vector<int>& out) {
  std::vector<std::string> text;
  get_list(key, text);
  if (text.empty()) return;
  std::vector<int> values;
  for (size_t i = 0; i < text.size(); ++i) {
    int value = 0;
    const std::string& s = text[i];
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
    if (ec != std::errc() || end != s.data() + s.size()) {
      fail(key + "[" + std::to_string(i) + "]", "expected an integer, got '" + s + "'");
    }
    values.push_back(value);
  }
  out = std::move(values);
}

void YamlMap::finish() const {
  if (!node_.IsMap()) return;
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    const std::string key = it->first.IsScalar() ? it->first.Scalar() : std::string("?");
    if (std::find(known_.begin(), known_.end(), key) != known_.end()) continue;
    std::string allowed;
    for (const std::string& k : known_) allowed += (allowed.empty() ? "" : ", ") + k;
    TESSERA_FAIL(file_ << ": unknown key '" << key_path(key) << "' (allowed here: " << allowed << ")");
  }
}

}  // namespace tessera::tuner
