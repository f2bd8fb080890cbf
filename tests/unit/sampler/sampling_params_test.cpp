// tests/unit/sampler/sampling_params_test.cpp: SamplingParams::validate names the field and range.
#include "engine/sampler/sampling_params.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "common/error.h"

namespace tessera {
namespace {

std::string error_of(const std::function<void(SamplingParams&)>& edit) {
  SamplingParams p;
  edit(p);
  try {
    p.validate();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The message starts with the user-facing part; the check location follows in brackets.
void expect_message(const std::function<void(SamplingParams&)>& edit, const std::string& expected) {
  const std::string msg = error_of(edit);
  EXPECT_EQ(msg.rfind(expected, 0), 0u) << "got: " << msg;
}

TEST(SamplingParams, DefaultsAreValid) {
  EXPECT_EQ(error_of([](SamplingParams&) {}), "");
  EXPECT_EQ(error_of([](SamplingParams& p) {
              p.temperature = 0.0f;
              p.top_k = -1;
              p.top_p = 1.0f;
              p.min_p = 1.0f;
              p.presence_penalty = -2.0f;
              p.frequency_penalty = 2.0f;
              p.logprobs = 20;
              p.stop = {"\n\n", "END"};
              p.stop_token_ids = {0, 2};
            }),
            "");
}

TEST(SamplingParams, EachFieldNamesItsRange) {
  expect_message([](SamplingParams& p) { p.top_p = 1.5f; }, "top_p must be in (0, 1], got 1.5");
  expect_message([](SamplingParams& p) { p.top_p = 0.0f; }, "top_p must be in (0, 1], got 0");
  expect_message([](SamplingParams& p) { p.temperature = -0.5f; }, "temperature must be in [0, 100], got -0.5");
  expect_message([](SamplingParams& p) { p.temperature = std::nanf(""); }, "temperature must be in [0, 100], got nan");
  expect_message([](SamplingParams& p) { p.top_k = -2; }, "top_k must be -1 or 0 (disabled) or >= 1, got -2");
  expect_message([](SamplingParams& p) { p.min_p = 1.25f; }, "min_p must be in [0, 1], got 1.25");
  expect_message([](SamplingParams& p) { p.repetition_penalty = 0.0f; },
                 "repetition_penalty must be in (0, 10], got 0");
  expect_message([](SamplingParams& p) { p.presence_penalty = 2.5f; }, "presence_penalty must be in [-2, 2], got 2.5");
  expect_message([](SamplingParams& p) { p.frequency_penalty = -3.0f; },
                 "frequency_penalty must be in [-2, 2], got -3");
  expect_message([](SamplingParams& p) { p.max_tokens = 0; }, "max_tokens must be >= 1, got 0");
  expect_message([](SamplingParams& p) { p.stop = {"a", ""}; }, "stop[1] must be a non-empty string");
  expect_message([](SamplingParams& p) { p.stop.assign(17, "x"); }, "stop must hold at most 16 strings, got 17");
  expect_message([](SamplingParams& p) { p.stop_token_ids = {5, -1}; }, "stop_token_ids[1] must be >= 0, got -1");
  expect_message([](SamplingParams& p) { p.logprobs = 21; }, "logprobs must be in [0, 20], got 21");
  expect_message([](SamplingParams& p) { p.logprobs = -1; }, "logprobs must be in [0, 20], got -1");
  expect_message([](SamplingParams& p) { p.min_tokens = 17; }, "min_tokens must be in [0, max_tokens = 16], got 17");
  expect_message([](SamplingParams& p) { p.min_tokens = -1; }, "min_tokens must be in [0, max_tokens = 16], got -1");
  expect_message([](SamplingParams& p) { p.eos_token_ids = {-3}; }, "eos_token_ids[0] must be >= 0, got -3");
  expect_message([](SamplingParams& p) { p.prompt_logprobs = 21; }, "prompt_logprobs must be in [0, 20], got 21");
}

TEST(SamplingParams, MaxTokensZeroOnlyScoresThePrompt) {
  EXPECT_EQ(error_of([](SamplingParams& p) {
              p.max_tokens = 0;
              p.prompt_logprobs = 0;
            }),
            "");
  expect_message([](SamplingParams& p) { p.max_tokens = 0; }, "max_tokens must be >= 1, got 0 (0 only with prompt_logprobs");
}

TEST(SamplingParams, Greedy) {
  SamplingParams p;
  EXPECT_FALSE(p.greedy());
  p.temperature = 0.0f;
  EXPECT_TRUE(p.greedy());
}

}  // namespace
}  // namespace tessera
