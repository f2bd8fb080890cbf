// tests/unit/scheduler/grammar_engine_test.cpp: constrained decoding through EngineLoop on the CPU
// backend with the tiny Llama fixture. Its weights are random, so only the grammar makes an output
// match: regex and choice outputs match and end with "stop" once the grammar is complete, max_tokens
// cuts a constrained output with "length", constrained sequences that are preempted resume where
// their grammar stood, and unconstrained sequences in the same steps produce what they produce alone.
#include <chrono>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/grammar/grammar.h"
#include "engine_test_util.h"
#include "kernels/backend/cpu/cpu_backend.h"
#include "letter_tokenizer.h"

namespace tessera::test {
namespace {

using namespace std::chrono_literals;

constexpr int32_t kVocab = 128;  // the fixture's; LetterTokenizer spells id i as 'a' + i % 26
constexpr int32_t kEos = 2;

class GrammarEngineTest : public ::testing::Test {
 protected:
  GrammarEngineTest() : tokenizer_(kVocab), compiler_(tokenizer_, compiler_config()) {}

  static GrammarCompilerConfig compiler_config() {
    GrammarCompilerConfig c;
    c.stop_token_ids = {kEos};
    c.vocab_size = kVocab;
    return c;
  }

  std::unique_ptr<EngineLoop> engine(EngineConfig config = {}) {
    return make_tiny_llama_engine(backend_, nullptr, config);
  }

  GenerateRequest request(OutputConstraint::Kind kind, std::string text, uint64_t seed, int32_t max_tokens = 40) {
    GenerateRequest r;
    r.model = "tiny-llama";
    r.prompt = {1, 17, 33, 9, 60, 4};
    r.sampling.temperature = 1.0f;
    r.sampling.seed = seed;
    r.sampling.max_tokens = max_tokens;
    OutputConstraint c;
    c.kind = kind;
    if (kind == OutputConstraint::Kind::kChoice) {
      c.choices = {"dog", "bird", "fish"};
    } else {
      c.text = std::move(text);
    }
    r.grammar = compiler_.compile(c);
    return r;
  }

  static Collected run(EngineLoop& engine, const GenerateRequest& r) {
    SubmitResult s = engine.submit_generate(r);
    EXPECT_EQ(s.error, SubmitError::kNone) << s.message;
    return collect(*s.stream);
  }

  CpuBackend backend_;
  LetterTokenizer tokenizer_;
  GrammarCompiler compiler_;
};

constexpr const char* kPattern = "ab(ba){1,3}d?e";

TEST_F(GrammarEngineTest, RegexOutputsMatchAndStopWhenComplete) {
  auto e = engine();
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const Collected c = run(*e, request(OutputConstraint::Kind::kRegex, kPattern, seed));
    EXPECT_TRUE(std::regex_match(c.text, std::regex(kPattern))) << "seed " << seed << ": '" << c.text << "'";
    EXPECT_EQ(c.final_event.finish_reason, RequestFinishReason::kStop) << "seed " << seed;
    ASSERT_FALSE(c.tokens.empty());
    EXPECT_EQ(c.tokens.back(), kEos) << "a complete grammar is followed by its stop token";
  }
}

TEST_F(GrammarEngineTest, ChoiceOutputsAreOneOfTheChoices) {
  auto e = engine();
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    const Collected c = run(*e, request(OutputConstraint::Kind::kChoice, "", seed));
    EXPECT_TRUE(c.text == "dog" || c.text == "bird" || c.text == "fish") << "seed " << seed << ": '" << c.text << "'";
  }
}

TEST_F(GrammarEngineTest, MaxTokensCutsAConstrainedOutputWithLength) {
  auto e = engine();
  const Collected c = run(*e, request(OutputConstraint::Kind::kRegex, "[a-e]{30}", 3, 5));
  EXPECT_EQ(c.final_event.finish_reason, RequestFinishReason::kLength);
  EXPECT_EQ(c.tokens.size(), 5u);
  EXPECT_TRUE(std::regex_match(c.text, std::regex("[a-e]{5}"))) << c.text;
}

TEST_F(GrammarEngineTest, UnconstrainedRowsBesideConstrainedOnesAreUnchanged) {
  auto e = engine();
  GenerateRequest free_run;
  free_run.model = "tiny-llama";
  free_run.prompt = {1, 5, 9, 44, 70};
  free_run.sampling.temperature = 0.0f;
  free_run.sampling.max_tokens = 16;
  free_run.sampling.ignore_eos = true;
  const Collected alone = run(*e, free_run);

  std::vector<std::shared_ptr<RequestStream>> constrained;
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    constrained.push_back(e->submit_generate(request(OutputConstraint::Kind::kRegex, kPattern, seed)).stream);
  }
  SubmitResult beside = e->submit_generate(free_run);
  ASSERT_EQ(beside.error, SubmitError::kNone) << beside.message;
  EXPECT_EQ(collect(*beside.stream).tokens, alone.tokens);
  for (auto& s : constrained) EXPECT_TRUE(std::regex_match(collect(*s).text, std::regex(kPattern)));
}

TEST_F(GrammarEngineTest, PreemptedSequencesResumeWhereTheirGrammarStood) {
  EngineConfig config;
  config.kv_block_size = 4;
  config.kv_num_blocks = 12;  // 48 tokens: fewer than the requests below need at once
  config.max_batch_tokens = 16;
  RecordingObserver observer;
  auto e = make_tiny_llama_engine(backend_, &observer, config);
  constexpr const char* kLong = "(ab|ba|dd){8,9}e";
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    streams.push_back(e->submit_generate(request(OutputConstraint::Kind::kRegex, kLong, seed)).stream);
  }
  for (auto& s : streams) {
    const Collected c = collect(*s);
    EXPECT_TRUE(std::regex_match(c.text, std::regex(kLong))) << "'" << c.text << "'";
  }
  EXPECT_GT(observer.preemptions.load(), 0) << "the pool was meant to run out";
}

TEST_F(GrammarEngineTest, SpeculationKeepsConstrainedOutputsValidAndGreedyOnesUnchanged) {
  EngineConfig speculative;
  speculative.speculative.method = "ngram";
  speculative.speculative.ngram = NgramDrafterConfig{1, 3};
  speculative.speculative.untimed_row_cost = 0;  // every draft verified, whatever it costs
  auto off = engine();
  auto on = engine(speculative);
  constexpr const char* kLong = "(ab|ba|dd){8,9}e";
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    GenerateRequest greedy = request(OutputConstraint::Kind::kRegex, kLong, seed);
    greedy.sampling.temperature = 0.0f;
    greedy.prompt.push_back(static_cast<int32_t>(seed));  // six different greedy answers
    const Collected want = run(*off, greedy);
    const Collected got = run(*on, greedy);
    EXPECT_EQ(got.tokens, want.tokens) << "seed " << seed;
    const Collected sampled = run(*on, request(OutputConstraint::Kind::kRegex, kLong, seed));
    EXPECT_TRUE(std::regex_match(sampled.text, std::regex(kLong))) << "seed " << seed << ": '" << sampled.text << "'";
  }
  ASSERT_TRUE(on->wait_idle(std::chrono::seconds(5)));
  EXPECT_GT(on->stats().spec_accepted_tokens, 0) << "no draft was kept: the grammar path is not exercised";
}

}  // namespace
}  // namespace tessera::test
