// tests/unit/tokenizer/bpe_test.cpp: BPE merge order, byte-level BPE from GGUF metadata (added
// tokens, pre types, BOS), and tokenizer.json parsing on small vocabularies.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "models/tokenizer/builders.h"
#include "models/tokenizer/components.h"
#include "tests/unit/tokenizer/test_vocab.h"

namespace tessera::tok {
namespace {

std::vector<int32_t> run(const TokenModel& model, std::string_view piece) {
  std::vector<int32_t> ids;
  model.tokenize(piece, ids);
  return ids;
}

Vocabulary vocab_of(const std::vector<std::string>& tokens) {
  Vocabulary v;
  for (size_t i = 0; i < tokens.size(); ++i) v.add(tokens[i], static_cast<int32_t>(i));
  return v;
}

TEST(Bpe, LowestRankFirstThenLeftmost) {
  // 0 a, 1 b, 2 c, 3 ab, 4 bc, 5 abc
  const auto model = make_bpe_model(vocab_of({"a", "b", "c", "ab", "bc", "abc"}),
                                    {{"a", "b"}, {"ab", "c"}, {"b", "c"}}, BpeOptions{});
  EXPECT_EQ(run(*model, "abc"), (std::vector<int32_t>{5}));
  EXPECT_EQ(run(*model, "bcab"), (std::vector<int32_t>{4, 3}));  // "a b" (rank 0) before "b c" (rank 2)
  EXPECT_EQ(run(*model, "cba"), (std::vector<int32_t>{2, 1, 0}));
  const auto repeat = make_bpe_model(vocab_of({"a", "aa"}), {{"a", "a"}}, BpeOptions{});
  EXPECT_EQ(run(*repeat, "aaa"), (std::vector<int32_t>{1, 0}));  // leftmost pair first
  EXPECT_EQ(run(*repeat, "aaaa"), (std::vector<int32_t>{1, 1}));
}

TEST(Bpe, UnknownCharactersUseByteFallbackThenUnk) {
  BpeOptions o;
  o.unk_token = "<unk>";
  o.byte_fallback = true;
  // 0 <unk>, 1 a, 2 <0xC3>, 3 <0xA9>
  const auto model = make_bpe_model(vocab_of({"<unk>", "a", "<0xC3>", "<0xA9>"}), {}, o);
  EXPECT_EQ(run(*model, "aé"), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(run(*model, "a你"), (std::vector<int32_t>{1, 0}));  // no byte pieces for 你
  o.byte_fallback = false;
  o.fuse_unk = true;
  const auto fused = make_bpe_model(vocab_of({"<unk>", "a"}), {}, o);
  EXPECT_EQ(run(*fused, "xya"), (std::vector<int32_t>{0, 1}));
}

TEST(Bpe, MergeNamingAMissingTokenIsAnError) {
  EXPECT_THROW(make_bpe_model(vocab_of({"a", "b"}), {{"a", "b"}}, BpeOptions{}), Error);  // "ab" missing
  EXPECT_THROW(make_bpe_model(vocab_of({"a", "ab"}), {{"a", "z"}}, BpeOptions{}), Error);
}

TEST(Bpe, IgnoreMergesTakesWholeVocabularyPieces) {
  BpeOptions o;
  o.ignore_merges = true;
  // "abc" is in the vocabulary but no merge path builds it.
  const auto model = make_bpe_model(vocab_of({"a", "b", "c", "abc"}), {}, o);
  EXPECT_EQ(run(*model, "abc"), (std::vector<int32_t>{3}));
}

TEST(ByteLevelGguf, EncodesMergesAndDecodesEveryByte) {
  const auto tok = tokenizer_from_gguf(testing::byte_level_vocab());
  const Encoding e = tok->encode("hello the world", false);
  EXPECT_EQ(e.tokens, (std::vector<std::string>{"hello", "Ġthe", "Ġworld"}));
  EXPECT_TRUE(tok->lossless());
  std::string all_bytes;
  for (int b = 1; b < 256; ++b) {
    if (b < 0x80 || b >= 0xC2) all_bytes.push_back(static_cast<char>(b));
  }
  const std::string text = "Tabs\tnewlines\n🤗 你好 é " + unicode::utf8_lossy(all_bytes);
  EXPECT_EQ(tok->decode(tok->encode(text, false).ids, false), text);
}

TEST(ByteLevelGguf, ControlAndUserDefinedTokensAreSplitOutFirst) {
  const auto tok = tokenizer_from_gguf(testing::byte_level_vocab());
  const int32_t im_start = tok->token_to_id("<|im_start|>"), tool = tok->token_to_id("<tool>");
  ASSERT_EQ(im_start, 1);
  ASSERT_GT(tool, 0);
  const Encoding e = tok->encode("<|im_start|>hello<tool> the<|im_end|>", false);
  EXPECT_EQ(e.tokens, (std::vector<std::string>{"<|im_start|>", "hello", "<tool>", "Ġthe", "<|im_end|>"}));
  EXPECT_TRUE(tok->is_special(im_start));
  EXPECT_FALSE(tok->is_special(tool));  // USER_DEFINED: matched, but kept by skip_special
  EXPECT_EQ(tok->decode(e.ids, true), "hello<tool> the");
  EXPECT_EQ(tok->decode(e.ids, false), "<|im_start|>hello<tool> the<|im_end|>");
  // A partial special token is plain text.
  EXPECT_EQ(tok->encode("<|im_start|", false).ids.size(), 11u);
}

TEST(ByteLevelGguf, SmolLMPreSplitsDigitsOneByOne) {
  const auto gpt2 = tokenizer_from_gguf(testing::byte_level_vocab("gpt2"));
  const auto smollm = tokenizer_from_gguf(testing::byte_level_vocab("smollm"));
  EXPECT_EQ(gpt2->encode("123", false).tokens, (std::vector<std::string>{"12", "3"}));
  EXPECT_EQ(smollm->encode("123", false).tokens, (std::vector<std::string>{"1", "2", "3"}));
  const auto llama3 = tokenizer_from_gguf(testing::byte_level_vocab("llama-bpe"));
  EXPECT_EQ(llama3->encode("hello world", false).tokens, (std::vector<std::string>{"hello", "Ġworld"}));
}

TEST(ByteLevelGguf, AddBosFollowsTheMetadata) {
  auto data = testing::byte_level_vocab();
  EXPECT_EQ(tokenizer_from_gguf(data)->encode("hello", true).ids.size(), 1u);  // gpt2 default: no BOS
  data.add_bos = true;
  const auto with_bos = tokenizer_from_gguf(data)->encode("hello", true);
  EXPECT_EQ(with_bos.tokens, (std::vector<std::string>{"<|endoftext|>", "hello"}));
}

TEST(ByteLevelGguf, UnknownPreAndModelAreRejectedByName) {
  auto data = testing::byte_level_vocab("qwen2");
  try {
    tokenizer_from_gguf(data);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'qwen2'"), std::string::npos) << what;
    EXPECT_NE(what.find("smollm"), std::string::npos) << what;
  }
  data.pre = "";
  EXPECT_THROW(tokenizer_from_gguf(data), Error);
  data = testing::byte_level_vocab();
  data.model = "t5";
  try {
    tokenizer_from_gguf(data);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'t5'"), std::string::npos) << e.what();
  }
}

// A Llama-style tokenizer.json: Prepend + Replace normalizer, byte-fallback BPE, and the
// Replace/ByteFallback/Fuse/Strip decoder chain.
nlohmann::json llama_style_json() {
  return nlohmann::json::parse(R"({
    "added_tokens": [{"id": 1, "content": "<s>", "special": true, "normalized": false},
                     {"id": 2, "content": "</s>", "special": true, "normalized": false}],
    "normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
    "pre_tokenizer": null,
    "model": {"type": "BPE", "unk_token": "<unk>", "byte_fallback": true, "fuse_unk": true,
              "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "<0xC3>": 3, "<0xA9>": 4, "▁": 5, "h": 6, "i": 7,
                        "▁h": 8, "▁hi": 9},
              "merges": ["▁ h", "▁h i"]},
    "post_processor": {"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
    "decoder": {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
  })");
}

TEST(TokenizerJson, LlamaStylePipeline) {
  const auto tok = tokenizer_from_json(llama_style_json(), "test");
  const Encoding e = tok->encode("hi hé", true);
  EXPECT_EQ(e.tokens, (std::vector<std::string>{"<s>", "▁hi", "▁h", "<0xC3>", "<0xA9>"}));
  EXPECT_EQ(tok->decode(e.ids, true), "hi hé");
  EXPECT_EQ(tok->decode(e.ids, false), "<s> hi hé");
  EXPECT_EQ(tok->decode({3}, false), "\xEF\xBF\xBD");  // half a character
  EXPECT_EQ(tok->decode({9, 1000, -1}, false), "hi");  // ids past the vocabulary decode to nothing
  EXPECT_EQ(tok->encode("<s>hi", false).tokens, (std::vector<std::string>{"<s>", "▁hi"}));
}

TEST(TokenizerJson, UnsupportedComponentsAreNamed) {
  auto j = llama_style_json();
  j["pre_tokenizer"] = {{"type", "UnicodeScripts"}};
  try {
    tokenizer_from_json(j, "my/tokenizer.json");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("UnicodeScripts"), std::string::npos) << what;
    EXPECT_NE(what.find("my/tokenizer.json"), std::string::npos) << what;
  }
  j = llama_style_json();
  j["model"]["type"] = "Unigram";
  EXPECT_THROW(tokenizer_from_json(j, "t"), Error);
}

// Expected values are what HF tokenizers 0.23.3 gives for the same tokenizer.json.
TEST(TokenizerJson, MetaspacePrependSchemes) {
  const auto make = [](const std::string& scheme) {
    auto j = nlohmann::json::parse(R"({
      "added_tokens": [{"id": 7, "content": "[X]", "special": true, "normalized": false}],
      "model": {"type": "BPE", "unk_token": "<unk>",
                "vocab": {"<unk>": 0, "▁": 1, "h": 2, "i": 3, "▁h": 4, "▁hi": 5, "hi": 6},
                "merges": ["▁ h", "▁h i", "h i"]}
    })");
    j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", scheme}, {"split", true}};
    j["decoder"] = {{"type", "Metaspace"}, {"replacement", "▁"}, {"prepend_scheme", scheme}, {"split", true}};
    return tokenizer_from_json(j, scheme);
  };
  const auto first = make("first"), always = make("always"), never = make("never");
  using V = std::vector<std::string>;
  EXPECT_EQ(first->encode("hi hi", false).tokens, (V{"▁hi", "▁hi"}));
  EXPECT_EQ(first->encode("[X]hi", false).tokens, (V{"[X]", "hi"}));
  EXPECT_EQ(first->encode(" hi[X]hi hi", false).tokens, (V{"▁hi", "[X]", "hi", "▁hi"}));
  EXPECT_EQ(first->decode(first->encode(" hi[X]hi hi", false).ids, false), "hi[X]hi hi");
  EXPECT_EQ(always->encode("[X]hi", false).tokens, (V{"[X]", "▁hi"}));
  EXPECT_EQ(always->decode(always->encode(" hi[X]hi hi", false).ids, false), "hi[X] hi hi");
  EXPECT_EQ(never->encode("hi hi", false).tokens, (V{"hi", "▁hi"}));
  EXPECT_EQ(never->encode("hi  hi", false).tokens, (V{"hi", "▁", "▁hi"}));
  EXPECT_EQ(never->decode(never->encode(" hi[X]hi hi", false).ids, false), " hi[X]hi hi");
}

}  // namespace
}  // namespace tessera::tok
