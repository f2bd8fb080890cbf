// OpenAI body parsing: malformed JSON, invalid UTF-8, wrong types named, unsupported fields named,
// harmless fields accepted, every prompt / input form.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "server/http/openai_request.h"
#include "tests/unit/http/api_error_of.h"

namespace tessera::http {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

Caught completion_error(const std::string& body) {
  return catch_api_error([&] { parse_completion_request(parse_body(body)); });
}
Caught chat_error(const std::string& body) {
  return catch_api_error([&] { parse_chat_request(parse_body(body)); });
}

TEST(OpenAiBody, MalformedJsonAndUtf8) {
  Caught e = catch_api_error([] { parse_body("{\"model\": \"m\", "); });
  EXPECT_EQ(e.kind, ErrorKind::kInvalidRequest);
  EXPECT_THAT(e.message, HasSubstr("not valid JSON"));
  e = catch_api_error([] { parse_body("{\"prompt\": \"caf\xC3\x28\"}"); });
  EXPECT_THAT(e.message, HasSubstr("not valid UTF-8 (invalid byte at offset 15)"));
  e = catch_api_error([] { parse_body("[1, 2]"); });
  EXPECT_THAT(e.message, HasSubstr("must be a JSON object, got array"));
  // Found by fuzz_openai_request: a number no double holds escaped as a JSON library error (a 500).
  e = catch_api_error([] { parse_body(R"({"model": "m", "temperature": 1e309})"); });
  EXPECT_EQ(e.kind, ErrorKind::kInvalidRequest);
  EXPECT_THAT(e.message, HasSubstr("number out of range"));
}

TEST(OpenAiBody, Utf8Validator) {
  EXPECT_EQ(find_invalid_utf8("plain ascii"), std::string_view::npos);
  EXPECT_EQ(find_invalid_utf8("h\xC3\xA9llo \xE2\x82\xAC \xF0\x9F\x98\x80"), std::string_view::npos);
  EXPECT_EQ(find_invalid_utf8("\xC0\xAF"), 0u);              // overlong
  EXPECT_EQ(find_invalid_utf8("ab\xED\xA0\x80"), 2u);        // surrogate
  EXPECT_EQ(find_invalid_utf8("\xF4\x90\x80\x80"), 0u);      // past U+10FFFF
  EXPECT_EQ(find_invalid_utf8("abc\xE2\x82"), 3u);           // truncated
  EXPECT_EQ(find_invalid_utf8("\x80"), 0u);                  // lone continuation
}

TEST(OpenAiCompletions, Fields) {
  const ParsedGenerate p = parse_completion_request(json::parse(R"({
    "model": "m", "prompt": "Hello", "max_tokens": 8, "temperature": 0, "top_p": 0.9, "top_k": 5,
    "stop": ["\n", "END"], "seed": 42, "stream": true, "stream_options": {"include_usage": true},
    "logprobs": 2, "user": "u-1", "metadata": {"a": "b"}, "service_tier": "auto", "n": 1, "best_of": 1,
    "logit_bias": {}, "presence_penalty": 0.5, "frequency_penalty": -0.5, "ignore_eos": true,
    "tessera": {"attention": {"sliding_window": {"window": 256, "sinks": 4}}}})"));
  EXPECT_EQ(p.input.model, "m");
  EXPECT_EQ(*p.input.prompt_text, "Hello");
  EXPECT_EQ(*p.input.max_tokens, 8);
  EXPECT_EQ(p.input.sampling.temperature, 0.0f);
  EXPECT_FLOAT_EQ(p.input.sampling.top_p, 0.9f);
  EXPECT_EQ(p.input.sampling.top_k, 5);
  EXPECT_EQ(p.input.sampling.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_EQ(*p.input.sampling.seed, 42u);
  EXPECT_TRUE(p.stream);
  EXPECT_TRUE(p.include_usage);
  EXPECT_EQ(*p.input.sampling.logprobs, 2);
  EXPECT_TRUE(p.input.sampling.ignore_eos);
  ASSERT_TRUE(p.input.attention.has_value());
  EXPECT_EQ(p.input.attention->kind, MaskPolicy::Kind::kSlidingWindow);
  EXPECT_EQ(p.input.attention->window, 256);
  EXPECT_EQ(p.input.attention->sinks, 4);
}

TEST(OpenAiCompletions, PromptForms) {
  EXPECT_EQ(*parse_completion_request(json::parse(R"({"model":"m","prompt":["one"]})")).input.prompt_text, "one");
  EXPECT_EQ(*parse_completion_request(json::parse(R"({"model":"m","prompt":[1,2,3]})")).input.prompt_tokens,
            (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(*parse_completion_request(json::parse(R"({"model":"m","prompt":[[4,5]]})")).input.prompt_tokens,
            (std::vector<int32_t>{4, 5}));
  ParsedGenerate batch = parse_completion_request(json::parse(R"({"model":"m","prompt":["a","b"],"n":2})"));
  ASSERT_EQ(batch.prompts.size(), 2u);
  EXPECT_EQ(*batch.prompts[1].text, "b");
  EXPECT_EQ(batch.n, 2);
  batch = parse_completion_request(json::parse(R"({"model":"m","prompt":[[1,2],[3]]})"));
  ASSERT_EQ(batch.prompts.size(), 2u);
  EXPECT_EQ(*batch.prompts[1].tokens, (std::vector<int32_t>{3}));
  Caught mixed = completion_error(R"({"model":"m","prompt":["a",[1]]})");
  EXPECT_EQ(mixed.param, "prompt");
  EXPECT_THAT(mixed.message, HasSubstr("prompt[1]: expected a string like prompt[0], got array"));
  EXPECT_THAT(completion_error(R"({"model":"m","prompt":[[1],[]]})").message,
              HasSubstr("prompt[1]: expected a non-empty list of token ids like prompt[0], got an empty list"));
  EXPECT_THAT(completion_error(R"({"model":"m","prompt":[]})").message, HasSubstr("prompt: expected a string"));
  EXPECT_EQ(completion_error(R"({"model":"m"})").param, "prompt");
  EXPECT_EQ(completion_error(R"({"prompt":"x"})").param, "model");
  EXPECT_THAT(completion_error(R"({"model":"m","prompt":[1,"a"]})").message, HasSubstr("prompt[1]: expected a token id"));
  EXPECT_THAT(completion_error(R"({"model":"m","prompt":[-1]})").message, HasSubstr("out of range"));
}

TEST(OpenAiCompletions, WrongTypesNameTheField) {
  Caught e = completion_error(R"({"model":"m","prompt":"x","temperature":"hot"})");
  EXPECT_EQ(e.kind, ErrorKind::kInvalidRequest);
  EXPECT_EQ(e.param, "temperature");
  EXPECT_THAT(e.message, HasSubstr("temperature: expected a number, got string"));
  e = completion_error(R"({"model":"m","prompt":"x","max_tokens":"10"})");
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_THAT(e.message, HasSubstr("expected an integer, got string"));
  e = completion_error(R"({"model":"m","prompt":"x","max_tokens":1.5})");
  EXPECT_THAT(e.message, HasSubstr("max_tokens: expected an integer, got number 1.5"));
  e = completion_error(R"({"model":"m","prompt":"x","max_tokens":99999999999999999999})");
  EXPECT_EQ(e.param, "max_tokens");
  e = completion_error(R"({"model":"m","prompt":"x","stream":"yes"})");
  EXPECT_THAT(e.message, HasSubstr("stream: expected a boolean"));
  e = completion_error(R"({"model":"m","prompt":"x","stop":5})");
  EXPECT_THAT(e.message, HasSubstr("stop: expected a string or a list of strings"));
  e = completion_error(R"({"model":7,"prompt":"x"})");
  EXPECT_THAT(e.message, HasSubstr("model: expected a string, got integer"));
  // max_tokens 10.0 is an integer in JSON's eyes.
  EXPECT_EQ(*parse_completion_request(json::parse(R"({"model":"m","prompt":"x","max_tokens":10.0})")).input.max_tokens, 10);
}

TEST(OpenAiCompletions, UnsupportedFieldsAreNamed) {
  Caught e = completion_error(R"({"model":"m","prompt":"x","n":0})");
  EXPECT_EQ(e.param, "n");
  EXPECT_THAT(e.message, HasSubstr("n must be in [1, 128], got 0"));
  e = completion_error(R"({"model":"m","prompt":["a","b","c"],"n":50})");
  EXPECT_EQ(e.param, "n");
  EXPECT_THAT(e.message, HasSubstr("prompts times n must be at most 128, got 3 x 50"));
  EXPECT_EQ(completion_error(R"({"model":"m","prompt":"x","best_of":3})").param, "best_of");
  EXPECT_EQ(parse_completion_request(json::parse(R"({"model":"m","prompt":"x","best_of":3,"n":3})")).n, 3);
  EXPECT_EQ(completion_error(R"({"model":"m","prompt":"x","logit_bias":{"50256":-100}})").param, "logit_bias");
  EXPECT_EQ(completion_error(R"({"model":"m","prompt":"x","suffix":"end"})").param, "suffix");
  e = completion_error(R"({"model":"m","prompt":"x","frobnicate":1,"zeta":2})");
  EXPECT_EQ(e.param, "frobnicate");
  EXPECT_THAT(e.message, HasSubstr("Unrecognized request argument supplied: frobnicate, zeta"));
  // null means "not given".
  EXPECT_NO_THROW(parse_completion_request(json::parse(R"({"model":"m","prompt":"x","n":null,"logit_bias":null})")));
}

TEST(OpenAiCompletions, EchoLogprobsAndMaxTokensZero) {
  // lm-evaluation-harness's log-likelihood request.
  ParsedGenerate p = parse_completion_request(
      json::parse(R"({"model":"m","prompt":[[1,2,3]],"max_tokens":0,"echo":true,"logprobs":1,"temperature":0})"));
  EXPECT_TRUE(p.echo);
  EXPECT_EQ(*p.input.max_tokens, 0);
  EXPECT_EQ(*p.input.sampling.prompt_logprobs, 1);
  EXPECT_EQ(*p.input.sampling.logprobs, 1);
  // Echo alone asks for no prompt logprobs; max_tokens 0 without echo is refused by name.
  EXPECT_FALSE(parse_completion_request(json::parse(R"({"model":"m","prompt":"x","echo":true})")).input.sampling.prompt_logprobs);
  Caught e = completion_error(R"({"model":"m","prompt":"x","max_tokens":0})");
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_THAT(e.message, HasSubstr("0 is accepted with echo"));
}

TEST(OpenAiCompletions, MinTokensStopTokenIdsIgnoreEos) {
  ParsedGenerate p = parse_completion_request(
      json::parse(R"({"model":"m","prompt":"x","min_tokens":4,"stop_token_ids":[7,9],"ignore_eos":true})"));
  EXPECT_EQ(p.input.sampling.min_tokens, 4);
  EXPECT_EQ(p.input.sampling.stop_token_ids, (std::vector<int32_t>{7, 9}));
  EXPECT_TRUE(p.input.sampling.ignore_eos);
  EXPECT_EQ(completion_error(R"({"model":"m","prompt":"x","min_tokens":-2})").param, "min_tokens");
  EXPECT_EQ(completion_error(R"({"model":"m","prompt":"x","stop_token_ids":[7,"a"]})").param, "stop_token_ids");
  EXPECT_EQ(completion_error(R"({"model":"m","prompt":"x","stop_token_ids":5})").param, "stop_token_ids");
}

TEST(OpenAiCompletions, TesseraExtensionErrors) {
  Caught e = completion_error(R"({"model":"m","prompt":"x","tessera":{"attention":{"sliding_window":{"window":-3}}}})");
  EXPECT_EQ(e.param, "tessera.attention");
  EXPECT_THAT(e.message, HasSubstr("tessera.attention"));
  e = completion_error(R"({"model":"m","prompt":"x","tessera":{"attention":{"diagonal":{}}}})");
  EXPECT_EQ(e.param, "tessera.attention");
  e = completion_error(R"({"model":"m","prompt":"x","tessera":{"colour":"red"}})");
  EXPECT_EQ(e.param, "tessera.colour");
  e = completion_error(R"({"model":"m","prompt":"x","tessera":5})");
  EXPECT_EQ(e.param, "tessera");
}

TEST(OpenAiChat, MessagesAndFields) {
  const ParsedGenerate p = parse_chat_request(json::parse(R"({
    "model": "m", "messages": [
      {"role": "developer", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}], "name": "bob"},
      {"role": "assistant", "content": "Hello."},
      {"role": "user", "content": "Again"}],
    "max_completion_tokens": 12, "logprobs": true, "top_logprobs": 3, "parallel_tool_calls": true,
    "response_format": {"type": "text"}, "tools": [], "tool_choice": "none", "store": false})"));
  ASSERT_TRUE(p.chat);
  const auto& m = *p.input.messages;
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0].role, "system");
  EXPECT_EQ(m[1].content, "Hi there");
  EXPECT_EQ(*p.input.max_tokens, 12);
  EXPECT_TRUE(p.chat_logprobs);
  EXPECT_EQ(*p.input.sampling.logprobs, 3);
}

TEST(OpenAiChat, RejectsWhatTesseraCannotHonour) {
  const std::string head = R"({"model":"m","messages":[{"role":"user","content":"x"}],)";
  EXPECT_EQ(chat_error(head + R"("functions":[{"name":"f"}]})").param, "functions");
  EXPECT_EQ(chat_error(head + R"("n":-1})").param, "n");
  EXPECT_EQ(chat_error(head + R"("audio":{"voice":"x"}})").param, "audio");
  EXPECT_EQ(chat_error(head + R"("top_logprobs":2})").param, "top_logprobs");  // needs logprobs=true
  EXPECT_EQ(chat_error(R"({"model":"m","messages":[]})").param, "messages");
  EXPECT_EQ(chat_error(R"({"model":"m","messages":"hi"})").param, "messages");
  EXPECT_EQ(chat_error(R"({"model":"m","messages":[{"role":"critic","content":"x"}]})").param, "messages[0].role");
  EXPECT_EQ(chat_error(R"({"model":"m","messages":[{"role":"user"}]})").param, "messages[0].content");
  EXPECT_EQ(chat_error(R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})")
                .param,
            "messages[0].content[0].type");
  EXPECT_THAT(chat_error(R"({"model":"m","messages":[{"role":"user","content":"x","mood":"happy"}]})").message,
              HasSubstr("messages[0]: Unrecognized request argument supplied: mood"));
}

TEST(OpenAiEmbeddings, InputForms) {
  ParsedEmbeddings p = parse_embeddings_request(json::parse(R"({"model":"e","input":"hello"})"));
  EXPECT_EQ(p.input.texts, (std::vector<std::string>{"hello"}));
  EXPECT_FALSE(p.base64);
  p = parse_embeddings_request(json::parse(R"({"model":"e","input":["a","b"],"encoding_format":"base64","user":"u"})"));
  EXPECT_EQ(p.input.texts.size(), 2u);
  EXPECT_TRUE(p.base64);
  p = parse_embeddings_request(json::parse(R"({"model":"e","input":[101,102]})"));
  EXPECT_EQ(p.input.token_inputs, (std::vector<std::vector<int32_t>>{{101, 102}}));
  p = parse_embeddings_request(json::parse(R"({"model":"e","input":[[1],[2,3]]})"));
  EXPECT_EQ(p.input.token_inputs.size(), 2u);
  EXPECT_EQ(catch_api_error([] { parse_embeddings_request(json::parse(R"({"model":"e","input":["a",[1]]})")); }).param,
            "input");
  EXPECT_EQ(catch_api_error([] { parse_embeddings_request(json::parse(R"({"model":"e","input":[]})")); }).param, "input");
  EXPECT_EQ(catch_api_error([] {
              parse_embeddings_request(json::parse(R"({"model":"e","input":"x","encoding_format":"int8"})"));
            }).param,
            "encoding_format");
  EXPECT_EQ(catch_api_error([] { parse_embeddings_request(json::parse(R"({"model":"e","input":"x","dimensions":8})")); })
                .param,
            "dimensions");
}

TEST(OpenAiEmbeddings, TruncateIsABoolDefaultingToTrue) {
  EXPECT_TRUE(parse_embeddings_request(json::parse(R"({"model":"e","input":"x"})")).input.truncate);
  EXPECT_TRUE(parse_embeddings_request(json::parse(R"({"model":"e","input":"x","truncate":null})")).input.truncate);
  EXPECT_FALSE(parse_embeddings_request(json::parse(R"({"model":"e","input":"x","truncate":false})")).input.truncate);
  EXPECT_TRUE(parse_embeddings_request(json::parse(R"({"model":"e","input":"x","truncate":true})")).input.truncate);
  for (const char* bad : {R"("yes")", "1", "[true]"}) {
    const Caught e = catch_api_error([&] {
      parse_embeddings_request(json::parse(std::string(R"({"model":"e","input":"x","truncate":)") + bad + "}"));
    });
    EXPECT_EQ(e.kind, ErrorKind::kInvalidRequest) << bad;
    EXPECT_EQ(e.param, "truncate") << bad;
    EXPECT_THAT(e.message, HasSubstr("truncate: expected a boolean")) << bad;
  }
}

TEST(OpenAiTokenize, Forms) {
  const ParsedTokenize t = parse_tokenize_request(json::parse(R"({"model":"m","prompt":"hi","add_special_tokens":false})"));
  EXPECT_EQ(*t.prompt, "hi");
  EXPECT_FALSE(t.add_special_tokens);
  EXPECT_EQ(catch_api_error([] { parse_tokenize_request(json::parse(R"({"model":"m"})")); }).param, "prompt");
  const ParsedDetokenize d = parse_detokenize_request(json::parse(R"({"tokens":[1,2]})"));
  EXPECT_EQ(d.tokens, (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(catch_api_error([] { parse_detokenize_request(json::parse(R"({"tokens":"12"})")); }).param, "tokens");
}

}  // namespace
}  // namespace tessera::http
