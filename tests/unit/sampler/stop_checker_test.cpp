// tests/unit/sampler/stop_checker_test.cpp: stop strings across token boundaries, stop tokens, EOS,
// ignore_eos, max_tokens, and the text that may be streamed at each step.
#include "engine/sampler/stop_checker.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/error.h"

namespace tessera {
namespace {

constexpr int32_t kEos = 2;

SamplingParams with_stop(std::vector<std::string> stop, int32_t max_tokens = 100) {
  SamplingParams p;
  p.stop = std::move(stop);
  p.max_tokens = max_tokens;
  return p;
}

// Feeds text pieces as tokens 100, 101, ...; returns the streamed text and the last step.
struct Streamed {
  std::vector<std::string> streamed;
  StopStep last;
  std::string joined() const {
    std::string s;
    for (const std::string& x : streamed) s += x;
    return s;
  }
};

Streamed feed(StopChecker& c, const std::vector<std::string>& pieces) {
  Streamed r;
  int32_t token = 100;
  for (const std::string& piece : pieces) {
    r.last = c.append(token++, piece);
    r.streamed.push_back(r.last.text);
    if (r.last.finish != FinishReason::kNone) break;
  }
  return r;
}

TEST(StopChecker, StopStringSpanningTwoTokens) {
  StopChecker c(with_stop({"\n\n"}), {kEos});
  const Streamed r = feed(c, {"Hello", "\n", "\n", "never"});
  EXPECT_EQ(r.streamed, (std::vector<std::string>{"Hello", "", ""}));
  EXPECT_EQ(r.last.finish, FinishReason::kStop);
  EXPECT_EQ(r.last.stop_string, "\n\n");
  EXPECT_FALSE(r.last.stop_token.has_value());
  EXPECT_TRUE(c.finished());
  EXPECT_EQ(c.num_generated(), 3);
}

TEST(StopChecker, HeldTextIsReleasedWhenItCannotMatch) {
  StopChecker c(with_stop({"\n\n"}), {kEos});
  const Streamed r = feed(c, {"a\n", "b", "\n", "c"});
  EXPECT_EQ(r.streamed, (std::vector<std::string>{"a", "\nb", "", "\nc"}));
  EXPECT_EQ(r.last.finish, FinishReason::kNone);
  EXPECT_EQ(c.held_text(), "");
}

TEST(StopChecker, StopAtTheVeryStart) {
  StopChecker c(with_stop({"STOP"}), {kEos});
  const Streamed r = feed(c, {"STOP", "more"});
  EXPECT_EQ(r.joined(), "");
  EXPECT_EQ(r.last.finish, FinishReason::kStop);
  EXPECT_EQ(c.num_generated(), 1);
}

TEST(StopChecker, StopInsideOneTokenCutsTheRest) {
  StopChecker c(with_stop({"END"}), {kEos});
  const Streamed r = feed(c, {"foo ", "x END bar"});
  EXPECT_EQ(r.streamed, (std::vector<std::string>{"foo ", "x "}));
  EXPECT_EQ(r.last.finish, FinishReason::kStop);
}

TEST(StopChecker, OverlappingPrefixes) {
  // "abcab" could start "abcabd"; after "c" only the suffix "abc" still can.
  StopChecker c(with_stop({"abcabd"}), {kEos});
  const Streamed r = feed(c, {"abcab", "c", "abd"});
  EXPECT_EQ(r.streamed, (std::vector<std::string>{"", "abc", ""}));
  EXPECT_EQ(r.last.finish, FinishReason::kStop);
  EXPECT_EQ(r.joined(), "abc");
}

TEST(StopChecker, EarliestMatchWinsAmongSeveralStopStrings) {
  StopChecker c(with_stop({"world", "lo w"}), {kEos});
  const Streamed r = feed(c, {"hel", "lo", " ", "wor", "ld"});
  EXPECT_EQ(r.last.finish, FinishReason::kStop);
  EXPECT_EQ(r.last.stop_string, "lo w");
  EXPECT_EQ(r.joined(), "hel");
}

TEST(StopChecker, IncludeStopStringInOutput) {
  SamplingParams p = with_stop({"\n\n"});
  p.include_stop_str_in_output = true;
  StopChecker c(p, {kEos});
  const Streamed r = feed(c, {"Hi", "\n", "\nrest"});
  EXPECT_EQ(r.joined(), "Hi\n\n");
}

TEST(StopChecker, MultiByteStopString) {
  StopChecker c(with_stop({"\xC3\xA9t\xC3\xA9"}), {kEos});  // "été"
  const Streamed r = feed(c, {"un \xC3\xA9", "t", "\xC3\xA9 chaud"});
  EXPECT_EQ(r.joined(), "un ");
  EXPECT_EQ(r.last.finish, FinishReason::kStop);
}

TEST(StopChecker, MaxTokensFinishesWithLengthAndFlushesHeldText) {
  StopChecker c(with_stop({"\n\n"}, /*max_tokens=*/3), {kEos});
  const Streamed r = feed(c, {"a", "b", "\n", "never"});
  EXPECT_EQ(r.streamed, (std::vector<std::string>{"a", "b", "\n"}));
  EXPECT_EQ(r.last.finish, FinishReason::kLength);
  EXPECT_STREQ(finish_reason_name(r.last.finish), "length");
  EXPECT_THROW(c.append(9, "x"), Error);
}

TEST(StopChecker, StopStringBeatsLengthOnTheLastToken) {
  StopChecker c(with_stop({"\n\n"}, /*max_tokens=*/2), {kEos});
  const Streamed r = feed(c, {"\n", "\n"});
  EXPECT_EQ(r.last.finish, FinishReason::kStop);
}

TEST(StopChecker, StopTokenIdsAndEos) {
  SamplingParams p = with_stop({"\n\n"});
  p.stop_token_ids = {7};
  {
    StopChecker c(p, {kEos});
    c.append(100, "x\n");  // "\n" held
    const StopStep s = c.append(7, "<|end|>");
    EXPECT_EQ(s.finish, FinishReason::kStop);
    EXPECT_EQ(s.stop_token, 7);
    EXPECT_FALSE(s.stop_string.has_value());
    EXPECT_EQ(s.text, "\n");  // held text released, the stop token's own text dropped
  }
  {
    StopChecker c(p, {kEos, 3});
    EXPECT_EQ(c.append(100, "x").finish, FinishReason::kNone);
    const StopStep s = c.append(3, "</s>");
    EXPECT_EQ(s.finish, FinishReason::kStop);
    EXPECT_EQ(s.stop_token, 3);
    EXPECT_EQ(s.text, "");
    EXPECT_STREQ(finish_reason_name(s.finish), "stop");
  }
  {
    SamplingParams q = p;
    q.include_stop_str_in_output = true;
    StopChecker c(q, {kEos});
    EXPECT_EQ(c.append(7, "<|end|>").text, "<|end|>");
  }
}

TEST(StopChecker, IgnoreEosKeepsGoingUntilMaxTokens) {
  SamplingParams p;
  p.ignore_eos = true;
  p.max_tokens = 3;
  StopChecker c(p, {kEos});
  EXPECT_EQ(c.append(kEos, "").finish, FinishReason::kNone);
  EXPECT_EQ(c.append(kEos, "").finish, FinishReason::kNone);
  EXPECT_EQ(c.append(kEos, "").finish, FinishReason::kLength);
  // ignore_eos does not disable explicit stop_token_ids.
  p.stop_token_ids = {kEos};
  StopChecker d(p, {kEos});
  EXPECT_EQ(d.append(kEos, "").finish, FinishReason::kStop);
}

TEST(StopChecker, IgnoreEosCoversTheRequestsEosIdsToo) {
  // A chat template's end-of-turn token (sampling.eos_token_ids) stops like the model's EOS, and
  // ignore_eos ignores both.
  SamplingParams p;
  p.eos_token_ids = {7};
  p.max_tokens = 3;
  {
    StopChecker c(p, {kEos});
    EXPECT_EQ(c.append(7, "<|im_end|>").finish, FinishReason::kStop);
  }
  p.ignore_eos = true;
  StopChecker c(p, {kEos});
  EXPECT_EQ(c.append(7, "").finish, FinishReason::kNone);
  EXPECT_EQ(c.append(kEos, "").finish, FinishReason::kNone);
  EXPECT_EQ(c.append(7, "").finish, FinishReason::kLength);
  EXPECT_TRUE(c.stopping_ids().empty());
}

TEST(StopChecker, MinTokensHoldsOffEveryStop) {
  SamplingParams p;
  p.eos_token_ids = {7};
  p.stop_token_ids = {9};
  p.stop = {"END"};
  p.min_tokens = 3;
  p.max_tokens = 10;
  StopChecker c(p, {kEos});
  EXPECT_EQ(c.stopping_ids(), (std::vector<int32_t>{kEos, 7, 9}));
  EXPECT_EQ(c.append(kEos, "").finish, FinishReason::kNone);
  EXPECT_EQ(c.append(9, "").finish, FinishReason::kNone);
  const StopStep third = c.append(100, "END");  // the third token: still too early for a stop string
  EXPECT_EQ(third.finish, FinishReason::kNone);
  EXPECT_EQ(third.text, "END");
  const StopStep fourth = c.append(101, "xEND");
  EXPECT_EQ(fourth.finish, FinishReason::kStop);
  EXPECT_EQ(fourth.text, "x");
  StopChecker d(p, {kEos});
  for (int i = 0; i < 3; ++i) d.append(100, "a");
  EXPECT_EQ(d.append(7, "").finish, FinishReason::kStop);
}

TEST(StopChecker, FinishReleasesHeldTextAndChecksTrailingText) {
  {
    StopChecker c(with_stop({"\n\n"}), {kEos});
    c.append(100, "bye\n");
    const StopStep s = c.finish();  // e.g. the client went away
    EXPECT_EQ(s.text, "\n");
    EXPECT_EQ(s.finish, FinishReason::kNone);
    EXPECT_THROW(c.finish(), Error);
  }
  {
    StopChecker c(with_stop({"\n\n"}), {kEos});
    EXPECT_EQ(c.append(100, "a\n").text, "a");
    const StopStep s = c.finish("\nb");  // the decoder's trailing text completes the stop
    EXPECT_EQ(s.text, "");
    EXPECT_EQ(s.finish, FinishReason::kStop);
    EXPECT_EQ(c.finish_reason(), FinishReason::kStop);
  }
  {
    StopChecker c(with_stop({"X"}), {kEos});
    c.append(100, "X");
    EXPECT_EQ(c.finish("tail").text, "");  // nothing after a stop
  }
  {
    SamplingParams p;
    p.max_tokens = 1;
    StopChecker c(p, {kEos});
    EXPECT_EQ(c.append(100, "a").finish, FinishReason::kLength);
    EXPECT_EQ(c.finish("\xEF\xBF\xBD").text, "\xEF\xBF\xBD");  // a partial character flushed by the decoder
  }
}

TEST(StopChecker, NoStopStringsStreamsEverythingAtOnce) {
  StopChecker c(SamplingParams{}, {kEos});
  const Streamed r = feed(c, {"a", "\n", "b"});
  EXPECT_EQ(r.streamed, (std::vector<std::string>{"a", "\n", "b"}));
  EXPECT_STREQ(finish_reason_name(FinishReason::kNone), "");
}

}  // namespace
}  // namespace tessera
