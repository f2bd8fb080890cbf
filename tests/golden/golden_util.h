// tests/golden/golden_util.h: loading the committed fixtures (tiny random-weight models made by
// make_fixtures.py) and comparing float arrays.
#pragma once

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "models/model_files.h"

namespace tessera::golden {

inline std::string fixture_dir(const std::string& name) { return std::string(TESSERA_GOLDEN_FIXTURES) + "/" + name; }

inline nlohmann::json read_reference(const std::string& name) {
  std::ifstream in(fixture_dir(name) + "/reference.json");
  EXPECT_TRUE(in.good()) << "missing " << fixture_dir(name) << "/reference.json (run tests/golden/make_fixtures.py)";
  return nlohmann::json::parse(in);
}

struct FixtureModel {
  ModelConfig config;
  WeightStore weights;
};

inline FixtureModel load_fixture(const std::string& name) {
  const ModelFiles files = locate_model(fixture_dir(name));
  return FixtureModel{load_model_config(files), load_weights(files)};
}

inline std::vector<int32_t> ids_of(const nlohmann::json& j) { return j.get<std::vector<int32_t>>(); }

inline float max_abs_diff(const float* a, const float* b, size_t n) {
  float m = 0.0f;
  for (size_t i = 0; i < n; ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

}  // namespace tessera::golden
