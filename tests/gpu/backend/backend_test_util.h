// tests/gpu/backend/backend_test_util.h: what the CUDA backend tests share: the no-GPU skip, the
// normalized error of logits, seeded host weights and prompts, and a thrown error's text.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "kernels/backend/cuda/cuda_backend.h"
#include "kernels/backend/weight_view.h"

#define REQUIRE_GPU()                                                                        \
  do {                                                                                       \
    if (::tessera::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU present";          \
  } while (0)

namespace tessera::backend_test {

// ‖got − want‖ / ‖want‖ in double; the sizes must agree.
inline double rel_l2(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

// An f32 weight held on the host, viewable as a WeightStore entry.
struct HostTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
  WeightView view() const {
    return {name, DType::kF32, shape, std::as_bytes(std::span<const float>(values)), "test"};
  }
};

inline HostTensor normal_tensor(std::string name, std::vector<int64_t> shape, float stddev, uint32_t seed) {
  HostTensor t{std::move(name), std::move(shape), {}};
  int64_t n = 1;
  for (int64_t d : t.shape) n *= d;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  t.values.resize(static_cast<size_t>(n));
  for (float& v : t.values) v = normal(rng);
  return t;
}

inline std::vector<int32_t> random_prompt(size_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(n);
  for (int32_t& id : ids) id = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return ids;
}

// The message of the tessera::Error `f` throws; "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace tessera::backend_test
