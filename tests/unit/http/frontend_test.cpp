// Frontend: the validation both protocols share (no engine): API keys, model lookup, max_tokens
// against the context with OpenAI's wording, sampling ranges by field, mask policies, drain, and the
// error-kind mappings to HTTP and gRPC.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "models/tokenizer/tokenizer.h"
#include "server/frontend/frontend.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

// One id per byte (id = byte + 1); id 0 is BOS, added with add_special.
class ByteTokenizer final : public Tokenizer {
 public:
  Encoding encode(std::string_view text, bool add_special) const override {
    Encoding e;
    if (add_special) e.ids.push_back(0);
    for (unsigned char c : text) e.ids.push_back(static_cast<int32_t>(c) + 1);
    return e;
  }
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override {
    std::string out;
    for (int32_t id : ids) {
      if (id == 0) {
        if (!skip_special) out += "<s>";
      } else {
        out += static_cast<char>(id - 1);
      }
    }
    return out;
  }
  int64_t vocab_size() const override { return 257; }
  std::string id_to_token(int32_t id) const override { return id == 0 ? "<s>" : std::string(1, char(id - 1)); }
  int32_t token_to_id(std::string_view token) const override {
    if (token == "<s>") return 0;
    if (token == "<|im_end|>") return 256;  // stands in for a chat model's end-of-turn token
    return token.size() == 1 ? static_cast<unsigned char>(token[0]) + 1 : -1;
  }
  bool lossless() const override { return true; }
  bool is_special(int32_t id) const override { return id == 0; }
};

ServerConfig test_config(std::vector<std::string> keys = {}) {
  ServerConfig c;
  c.models.push_back({"lm", "lm", ServedModelSpec::Kind::kLlm, "", false, ""});
  c.auth.api_keys = std::move(keys);
  c.limits.max_model_len = 64;
  return c;
}

class FrontendTest : public ::testing::Test {
 protected:
  void SetUp() override { add_models(frontend_); }

  static void add_models(Frontend& f) {
    auto tokenizer = std::make_shared<ByteTokenizer>();
    FrontendModel lm;
    lm.name = "lm";
    lm.kind = ModelKind::kLlm;
    lm.config.arch = Architecture::kLlama;
    lm.config.max_position_embeddings = 2048;  // the config's limit (64) is lower and wins
    lm.config.bos_token_id = 0;
    lm.tokenizer = tokenizer;
    lm.chat_template = ChatTemplate{};  // ChatML
    f.add_model(lm);
    FrontendModel emb;
    emb.name = "emb";
    emb.kind = ModelKind::kEmbedding;
    emb.config.arch = Architecture::kBert;
    emb.config.max_position_embeddings = 16;
    emb.tokenizer = tokenizer;
    f.add_model(emb);
  }

  GenerateInput completion(std::string prompt, std::optional<int64_t> max_tokens = std::nullopt) {
    GenerateInput in;
    in.model = "lm";
    in.prompt_text = std::move(prompt);
    in.max_tokens = max_tokens;
    return in;
  }

  template <typename Fn>
  static ApiError expect_error(Fn&& fn) {
    try {
      fn();
    } catch (const ApiError& e) {
      return e;
    }
    ADD_FAILURE() << "no ApiError";
    return ApiError(ErrorKind::kInternal, "none");
  }

  ServerConfig config_ = test_config();
  Frontend frontend_{config_, nullptr, nullptr};
};

TEST_F(FrontendTest, PreparesACompletion) {
  const PreparedGenerate p = frontend_.prepare_generate(completion("hi", 5));
  EXPECT_EQ(p.request.model, "lm");
  EXPECT_EQ(p.request.prompt, (std::vector<int32_t>{0, 'h' + 1, 'i' + 1}));
  EXPECT_EQ(p.request.sampling.max_tokens, 5);
  EXPECT_EQ(p.policy_name, "causal");
  EXPECT_FALSE(p.request.request_id.empty());
  EXPECT_LT(p.request.deadline, Clock::time_point::max());  // the server's request timeout applies
  EXPECT_EQ(frontend_.prepare_generate(completion("hi")).request.sampling.max_tokens, 16);  // OpenAI's default
}

TEST_F(FrontendTest, ChatUsesTheTemplateAndTheRestOfTheContext) {
  GenerateInput in;
  in.model = "lm";
  in.messages = std::vector<ChatMessage>{{"user", "Hi"}};
  const PreparedGenerate p = frontend_.prepare_generate(in);
  const std::string rendered = ByteTokenizer().decode(p.request.prompt, false);
  EXPECT_EQ(rendered, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(p.request.sampling.max_tokens, 64 - static_cast<int32_t>(p.request.prompt.size()));
}

TEST_F(FrontendTest, MaxTokensAndContextLength) {
  ApiError e = expect_error([&] { frontend_.prepare_generate(completion("hi", -1)); });
  EXPECT_EQ(e.kind(), ErrorKind::kInvalidRequest);
  EXPECT_EQ(e.param(), "max_tokens");
  EXPECT_THAT(e.what(), HasSubstr("max_tokens: must be at least 1, got -1"));
  e = expect_error([&] { frontend_.prepare_generate(completion("hi", 0)); });
  EXPECT_EQ(e.param(), "max_tokens");
  EXPECT_THAT(e.what(), HasSubstr("0 is accepted with echo"));
  // max_tokens 0 scores the prompt only: accepted with prompt logprobs.
  GenerateInput scoring = completion("hi", 0);
  scoring.sampling.prompt_logprobs = 1;
  EXPECT_EQ(frontend_.prepare_generate(scoring).request.sampling.max_tokens, 0);
  // min_tokens past max_tokens names min_tokens.
  GenerateInput min = completion("hi", 4);
  min.sampling.min_tokens = 5;
  e = expect_error([&] { frontend_.prepare_generate(min); });
  EXPECT_EQ(e.param(), "min_tokens");
  e = expect_error([&] { frontend_.prepare_generate(completion("hello", 1000000000000)); });
  EXPECT_EQ(e.kind(), ErrorKind::kContextLengthExceeded);
  EXPECT_EQ(e.code(), "context_length_exceeded");
  EXPECT_EQ(std::string(e.what()),
            "This model's maximum context length is 64 tokens. However, you requested 1000000000006 tokens (6 in your "
            "prompt; 1000000000000 for the completion). Please reduce your prompt; or completion length.");
  GenerateInput chat;
  chat.model = "lm";
  chat.messages = std::vector<ChatMessage>{{"user", std::string(10, 'x')}};
  chat.max_tokens = 40;
  e = expect_error([&] { frontend_.prepare_generate(chat); });
  EXPECT_EQ(e.kind(), ErrorKind::kContextLengthExceeded);
  EXPECT_THAT(e.what(), HasSubstr("However, you requested 100 tokens (60 in the messages, 40 in the completion). "
                                  "Please reduce the length of the messages or completion."));
  chat.max_tokens.reset();
  chat.messages = std::vector<ChatMessage>{{"user", std::string(100, 'x')}};
  e = expect_error([&] { frontend_.prepare_generate(chat); });
  EXPECT_THAT(e.what(), HasSubstr("your messages resulted in 150 tokens"));
  EXPECT_EQ(http_status(e.kind()), 400);
}

TEST_F(FrontendTest, ChatEndOfTurnIsAnEosIdNotAStopTokenId) {
  GenerateInput in;
  in.model = "lm";
  in.messages = std::vector<ChatMessage>{{"user", "Hi"}};
  const PreparedGenerate p = frontend_.prepare_generate(in);
  // As an EOS id, ignore_eos and min_tokens apply to it; stop_token_ids stay the client's.
  EXPECT_EQ(p.request.sampling.eos_token_ids, (std::vector<int32_t>{256}));
  EXPECT_TRUE(p.request.sampling.stop_token_ids.empty());
}

TEST_F(FrontendTest, StopTokenIdsMustBeInTheVocabulary) {
  GenerateInput in = completion("hi", 4);
  in.sampling.stop_token_ids = {5, 9999};
  const ApiError e = expect_error([&] { frontend_.prepare_generate(in); });
  EXPECT_EQ(e.param(), "stop_token_ids");
  EXPECT_THAT(e.what(), HasSubstr("stop_token_ids[1]: token id 9999 is outside the vocabulary [0, 257)"));
}

TEST_F(FrontendTest, ChoicesDrawFromSuccessiveSeeds) {
  GenerateInput in = completion("hi", 4);
  in.request_id = "r";
  in.sampling.seed = 10;
  const std::vector<PreparedGenerate> choices = frontend_.prepare_choices(in, 3);
  ASSERT_EQ(choices.size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(*choices[k].request.sampling.seed, 10 + k);
    EXPECT_EQ(choices[k].request.request_id, "r-" + std::to_string(k));
    EXPECT_EQ(choices[k].request.prompt, choices[0].request.prompt);
  }
  EXPECT_EQ(frontend_.prepare_choices(in, 1)[0].request.request_id, "r");
}

TEST_F(FrontendTest, SamplingErrorsNameTheField) {
  GenerateInput in = completion("hi", 4);
  in.sampling.top_p = 1.5f;
  ApiError e = expect_error([&] { frontend_.prepare_generate(in); });
  EXPECT_EQ(e.param(), "top_p");
  EXPECT_THAT(e.what(), HasSubstr("top_p"));
  EXPECT_THAT(e.what(), ::testing::Not(HasSubstr("[check")));  // developer detail stays out
  in = completion("hi", 4);
  in.sampling.temperature = -1;
  EXPECT_EQ(expect_error([&] { frontend_.prepare_generate(in); }).param(), "temperature");
  in = completion("hi", 4);
  in.sampling.top_k = -5;
  EXPECT_EQ(expect_error([&] { frontend_.prepare_generate(in); }).param(), "top_k");
}

TEST_F(FrontendTest, ModelsPromptsAndPolicies) {
  GenerateInput in = completion("hi", 4);
  in.model = "nope";
  ApiError e = expect_error([&] { frontend_.prepare_generate(in); });
  EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
  EXPECT_EQ(e.code(), "model_not_found");
  EXPECT_EQ(http_status(e.kind()), 404);
  in.model = "emb";
  EXPECT_EQ(expect_error([&] { frontend_.prepare_generate(in); }).param(), "model");
  in = completion("", 4);
  in.prompt_text.reset();
  in.prompt_tokens = std::vector<int32_t>{1, 999};
  e = expect_error([&] { frontend_.prepare_generate(in); });
  EXPECT_THAT(e.what(), HasSubstr("prompt[1]: token id 999 is outside the vocabulary [0, 257)"));
  in.prompt_tokens = std::vector<int32_t>{};
  EXPECT_THAT(expect_error([&] { frontend_.prepare_generate(in); }).what(), HasSubstr("empty"));
  in = completion("hello there", 4);
  in.attention = MaskPolicy::sliding_window(4, 1);
  EXPECT_EQ(frontend_.prepare_generate(in).policy_name, "sliding_window");
  in.attention = MaskPolicy::segments({100});  // longer than the prompt
  e = expect_error([&] { frontend_.prepare_generate(in); });
  EXPECT_EQ(e.param(), "tessera.attention");
}

TEST_F(FrontendTest, ToolsAndConstraintsAreCheckedAgainstTheModel) {
  ToolDefinition weather{"get_weather", "", R"({"type":"object"})"};
  GenerateInput in = completion("hi", 4);
  in.tools = {weather};
  ApiError e = expect_error([&] { frontend_.prepare_generate(in); });
  EXPECT_EQ(e.param(), "tools");
  EXPECT_THAT(e.what(), HasSubstr("only chat requests take tools"));

  // Llama-2's template has no tool-call format.
  Frontend llama2{config_, nullptr, nullptr};
  FrontendModel lm;
  lm.name = "lm";
  lm.config.arch = Architecture::kLlama;
  lm.config.max_position_embeddings = 2048;
  lm.tokenizer = std::make_shared<ByteTokenizer>();
  lm.chat_template = ChatTemplate{};
  lm.chat_template->kind = ChatTemplateKind::kLlama2;
  llama2.add_model(lm);
  in.prompt_text.reset();
  in.messages = std::vector<ChatMessage>{{"user", "Weather?"}};
  e = expect_error([&] { llama2.prepare_generate(in); });
  EXPECT_EQ(e.param(), "tools");
  EXPECT_THAT(e.what(), HasSubstr("has no tool-call format (its chat template: llama2)"));

  in.tool_choice.mode = ToolChoice::Mode::kFunction;
  in.tool_choice.function = "get_time";
  EXPECT_EQ(expect_error([&] { frontend_.prepare_generate(in); }).param(), "tool_choice");

  // A model without a grammar compiler cannot constrain its output.
  in = completion("hi", 4);
  in.constraint = OutputConstraint{};
  in.constraint_param = "structured_outputs";
  e = expect_error([&] { frontend_.prepare_generate(in); });
  EXPECT_EQ(e.param(), "structured_outputs");
  EXPECT_THAT(e.what(), HasSubstr("cannot constrain its output"));
}

TEST_F(FrontendTest, EmbeddingInputsAreChecked) {
  EmbedInput in;
  in.model = "emb";
  in.texts = {"ok", std::string(40, 'x')};  // 3 and 41 tokens; the limit is 16
  in.truncate = false;
  ApiError e = expect_error([&] { frontend_.embed(in); });
  EXPECT_EQ(e.kind(), ErrorKind::kContextLengthExceeded);
  EXPECT_EQ(e.param(), "input");
  EXPECT_STREQ(e.what(), "input[1] has 41 tokens, over this model's limit of 16 (max_position_embeddings); set "
                         "truncate to true or shorten it");
  // Truncated by default: validation passes and only the missing engine stops it.
  in.truncate = true;
  EXPECT_EQ(expect_error([&] { frontend_.embed(in); }).kind(), ErrorKind::kInternal);
  in.texts = {"ok"};
  in.model = "lm";
  EXPECT_EQ(expect_error([&] { frontend_.embed(in); }).param(), "model");
}

TEST_F(FrontendTest, EmbeddingModelsReportTheirInputLimit) {
  // limits.max_model_len (64) is for generation; an embedding model reports its own input limit.
  EXPECT_EQ(frontend_.find_model("emb", ModelKind::kEmbedding).max_model_len, 16);
  Frontend f(config_, nullptr, nullptr);
  FrontendModel st;
  st.name = "st";
  st.kind = ModelKind::kEmbedding;
  st.config.arch = Architecture::kBert;
  st.config.max_position_embeddings = 16;
  st.config.max_seq_length = 8;  // sentence_bert_config.json
  st.tokenizer = std::make_shared<ByteTokenizer>();
  f.add_model(st);
  EXPECT_EQ(f.find_model("st", ModelKind::kEmbedding).max_model_len, 8);
  EmbedInput in;
  in.model = "st";
  in.texts = {std::string(8, 'x')};
  in.truncate = false;
  EXPECT_THAT(expect_error([&] { f.embed(in); }).what(), HasSubstr("9 tokens, over this model's limit of 8 (max_seq_length)"));
}

TEST_F(FrontendTest, DrainRefusesNewWork) {
  EXPECT_FALSE(frontend_.ready());  // no engine
  frontend_.begin_drain();
  const ApiError e = expect_error([&] { frontend_.prepare_generate(completion("hi", 2)); });
  EXPECT_EQ(e.kind(), ErrorKind::kDraining);
  EXPECT_EQ(http_status(e.kind()), 503);
  EXPECT_EQ(grpc_status_code(e.kind()), 14);  // UNAVAILABLE
}

TEST(FrontendAuth, BearerKeys) {
  const ServerConfig config = test_config({"sk-one", "sk-two"});
  Frontend f(config, nullptr, nullptr);
  EXPECT_TRUE(f.keys_required());
  EXPECT_NO_THROW(f.check_api_key("Bearer sk-one"));
  EXPECT_NO_THROW(f.check_api_key("bearer sk-two"));
  for (const char* bad : {"", "Bearer", "Bearer sk-on", "Bearer sk-one-more", "sk-one", "Basic sk-one"}) {
    try {
      f.check_api_key(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const ApiError& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUnauthorized) << bad;
      EXPECT_EQ(http_status(e.kind()), 401);
      EXPECT_EQ(grpc_status_code(e.kind()), 16);
    }
  }
  Frontend open(test_config(), nullptr, nullptr);
  EXPECT_NO_THROW(open.check_api_key(""));
}

TEST(ErrorMapping, EveryKind) {
  struct Row {
    ErrorKind kind;
    int http;
    int grpc;
    const char* name;
  };
  const Row rows[] = {
      {ErrorKind::kInvalidRequest, 400, 3, "invalid_request"},
      {ErrorKind::kContextLengthExceeded, 400, 3, "context_length_exceeded"},
      {ErrorKind::kUnauthorized, 401, 16, "unauthorized"},
      {ErrorKind::kNotFound, 404, 5, "not_found"},
      {ErrorKind::kTooLarge, 413, 8, "too_large"},
      {ErrorKind::kQueueFull, 429, 8, "queue_full"},
      {ErrorKind::kDraining, 503, 14, "draining"},
      {ErrorKind::kDeadline, 504, 4, "deadline"},
      {ErrorKind::kCancelled, 499, 1, "cancelled"},
      {ErrorKind::kInternal, 500, 13, "internal"},
  };
  for (const Row& r : rows) {
    EXPECT_EQ(http_status(r.kind), r.http) << r.name;
    EXPECT_EQ(grpc_status_code(r.kind), r.grpc) << r.name;
    EXPECT_STREQ(error_kind_name(r.kind), r.name);
  }
  EXPECT_EQ(ApiError(ErrorKind::kQueueFull, "busy").retry_after_seconds(), 1);
  EXPECT_EQ(ApiError(ErrorKind::kInvalidRequest, "bad").retry_after_seconds(), 0);
}

TEST(ErrorMapping, AnInternalErrorShowsTheClientOnlyItsRequestId) {
  const ApiError detail(ErrorKind::kInternal,
                        "embedding forward failed: cpu attention: tensor qkv [4, 96] at /work/main/kernels/cpu/x.cpp:12");
  const ApiError sent = client_facing(detail, "req-7");
  EXPECT_EQ(sent.kind(), ErrorKind::kInternal);
  EXPECT_NE(std::string(sent.what()).find("req-7"), std::string::npos) << sent.what();
  for (const char* leak : {"/work", ".cpp", "forward", "tensor"}) {
    EXPECT_EQ(std::string(sent.what()).find(leak), std::string::npos) << leak << " in " << sent.what();
  }
  const ApiError client_fault(ErrorKind::kInvalidRequest, "temperature: must be >= 0", "temperature");
  EXPECT_STREQ(client_facing(client_fault, "req-8").what(), client_fault.what());
  EXPECT_EQ(client_facing(client_fault, "req-8").param(), "temperature");
}

TEST(RequestIds, HonouredOrGenerated) {
  EXPECT_EQ(Frontend::request_id_or_new("abc-123"), "abc-123");
  const std::string fresh = Frontend::request_id_or_new("");
  EXPECT_EQ(fresh.rfind("req-", 0), 0u);
  EXPECT_EQ(fresh.size(), 28u);
  EXPECT_NE(fresh, Frontend::request_id_or_new(""));
  EXPECT_NE(Frontend::request_id_or_new("has space"), "has space");
  EXPECT_NE(Frontend::request_id_or_new(std::string(200, 'a')), std::string(200, 'a'));
}

}  // namespace
}  // namespace tessera
