// tuner/yaml_reader.h: YamlMap, strict reading of one YAML mapping for the tuner's space and profile
// files: typed getters whose errors name the dotted key, and finish() refusing every key not read.
#pragma once

#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

namespace tessera::tuner {

class YamlMap {
 public:
  // `path` is the dotted key of this mapping ("" for the document); `file` prefixes every message.
  YamlMap(const YAML::Node& node, std::string file, std::string path);

  bool has(const std::string& key);
  YAML::Node node(const std::string& key);  // undefined node when absent; marks the key as known
  std::string key_path(const std::string& key) const;  // "fusions.qkv"

  void get(const std::string& key, std::string& out);
  void get(const std::string& key, int& out);
  void get(const std::string& key, double& out);
  void get(const std::string& key, bool& out);
  // A scalar or a list of scalars (a scalar reads as a list of one); absent leaves `out` as it is.
  void get_list(const std::string& key, std::vector<std::string>& out);
  void get_list(const std::string& key, std::vector<int>& out);
  // Throws naming the first key that no getter asked for, and the keys that are allowed.
  void finish() const;

  [[noreturn]] void fail(const std::string& key, const std::string& message) const;

 private:
  YAML::Node node_;
  std::string file_;
  std::string path_;
  std::vector<std::string> known_;
};

}  // namespace tessera::tuner
