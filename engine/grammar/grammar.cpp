// engine/grammar/grammar.cpp: grammar.h over xgrammar's C++ core: the tokenizer's vocabulary as an
// xgrammar TokenizerInfo, each constraint kind compiled by xgrammar, our own cache of compiled
// grammars, and the matcher over a DLTensor view of the caller's bitmask row.
#include "engine/grammar/grammar.h"

#include <algorithm>
#include <list>
#include <map>
#include <mutex>
#include <regex>
#include <unordered_map>

#include <dlpack/dlpack.h>
#include <nlohmann/json.hpp>
#include <xgrammar/compiler.h>
#include <xgrammar/matcher.h>
#include <xgrammar/tokenizer_info.h>

#include "common/error.h"
#include "engine/grammar/json_schema_check.h"
#include "engine/grammar/vocabulary.h"
#include "models/tokenizer/tokenizer.h"

namespace tessera {

class CompiledGrammar {
 public:
  explicit CompiledGrammar(xgrammar::CompiledGrammar grammar) : xgrammar(std::move(grammar)) {}
  xgrammar::CompiledGrammar xgrammar;
};

namespace {

using grammar_detail::VocabEncoding;
using grammar_detail::Vocabulary;

xgrammar::VocabType xgrammar_vocab_type(VocabEncoding encoding) {
  switch (encoding) {
    case VocabEncoding::kByteFallback: return xgrammar::VocabType::BYTE_FALLBACK;
    case VocabEncoding::kByteLevel: return xgrammar::VocabType::BYTE_LEVEL;
    case VocabEncoding::kRaw: break;
  }
  return xgrammar::VocabType::RAW;
}

// xgrammar's fatal errors read "[hh:mm:ss] /path/file.cc:123: Check failed: (...) is false: reason";
// a user needs the reason only.
std::string xgrammar_reason(const std::exception& error) {
  static const std::regex kLocation(R"(^\[[0-9:]+\] \S+:[0-9]+: )");
  static const std::regex kCheck(R"(^Check failed: \(.*?\) is false: ?)");
  std::string reason = std::regex_replace(error.what(), kLocation, "");
  reason = std::regex_replace(reason, kCheck, "");
  while (!reason.empty() && (reason.back() == '\n' || reason.back() == ' ')) reason.pop_back();
  return reason;
}

// An EBNF string literal matching `text` exactly.
std::string ebnf_literal(const std::string& text) {
  static const char* kHex = "0123456789abcdef";
  std::string out = "\"";
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (byte < 0x20 || byte == 0x7f) {
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 15];
    } else {
      out += c;  // UTF-8 passes through: xgrammar reads literals as UTF-8
    }
  }
  return out + "\"";
}

std::string choice_grammar(const std::vector<std::string>& choices) {
  if (choices.empty()) throw GrammarError("choices", "a choice constraint needs at least one choice");
  std::string rule = "root ::= ";
  for (size_t i = 0; i < choices.size(); ++i) {
    if (choices[i].empty()) {
      throw GrammarError("choices." + std::to_string(i), "a choice must not be empty");
    }
    rule += (i ? " | " : "") + ebnf_literal(choices[i]);
  }
  return rule;
}

// Everything compile() reads from a constraint, unambiguously: the cache key.
std::string cache_key(const OutputConstraint& c) {
  std::string key = constraint_kind_name(c.kind);
  key += c.any_whitespace ? "|ws|" : "|compact|";
  key += std::to_string(c.text.size()) + ":" + c.text;
  for (const std::string& choice : c.choices) key += "|" + std::to_string(choice.size()) + ":" + choice;
  return key;
}

// Compiled grammars kept by key, least recently used evicted first once over the byte budget.
class GrammarCache {
 public:
  explicit GrammarCache(int64_t capacity_bytes) : capacity_bytes_(capacity_bytes) {}

  std::shared_ptr<const CompiledGrammar> find(const std::string& key) {
    std::lock_guard lock(mutex_);
    const auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    entries_.splice(entries_.begin(), entries_, it->second);
    return it->second->grammar;
  }

  // Returns the grammar cached under `key`: `grammar`, or one another thread inserted first.
  std::shared_ptr<const CompiledGrammar> insert(const std::string& key,
                                                std::shared_ptr<const CompiledGrammar> grammar) {
    std::lock_guard lock(mutex_);
    if (const auto it = index_.find(key); it != index_.end()) return it->second->grammar;
    const auto bytes = static_cast<int64_t>(grammar->xgrammar.MemorySizeBytes() + key.size());
    entries_.push_front({key, grammar, bytes});
    index_[key] = entries_.begin();
    used_bytes_ += bytes;
    while (used_bytes_ > capacity_bytes_ && entries_.size() > 1) {
      used_bytes_ -= entries_.back().bytes;
      index_.erase(entries_.back().key);
      entries_.pop_back();
    }
    return grammar;
  }

 private:
  struct Entry {
    std::string key;
    std::shared_ptr<const CompiledGrammar> grammar;
    int64_t bytes;
  };
  std::mutex mutex_;
  std::list<Entry> entries_;  // most recently used first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  int64_t capacity_bytes_;
  int64_t used_bytes_ = 0;
};

}  // namespace

const char* constraint_kind_name(OutputConstraint::Kind kind) {
  switch (kind) {
    case OutputConstraint::Kind::kJsonObject: return "json_object";
    case OutputConstraint::Kind::kJsonSchema: return "json_schema";
    case OutputConstraint::Kind::kRegex: return "regex";
    case OutputConstraint::Kind::kChoice: return "choice";
    case OutputConstraint::Kind::kEbnf: return "ebnf";
    case OutputConstraint::Kind::kStructuralTag: return "structural_tag";
  }
  return "unknown";
}

GrammarError::GrammarError(std::string where, const std::string& message)
    : std::runtime_error(where.empty() ? message : where + ": " + message), where_(std::move(where)) {}

void GrammarCompilerConfig::validate() const {
  TESSERA_CHECK(vocab_size > 0, "grammar vocab_size must be positive, got " << vocab_size);
  TESSERA_CHECK(!stop_token_ids.empty(), "grammar stop_token_ids must name at least one token");
  for (const int32_t id : stop_token_ids) {
    TESSERA_CHECK(id >= 0 && id < vocab_size,
                  "grammar stop_token_ids: " << id << " is outside the vocabulary of " << vocab_size);
  }
  TESSERA_CHECK(threads >= 1, "grammar threads must be at least 1, got " << threads);
  TESSERA_CHECK(cache_bytes >= 0, "grammar cache_bytes must not be negative, got " << cache_bytes);
}

struct GrammarCompiler::Impl {
  Impl(const Tokenizer& tokenizer, const GrammarCompilerConfig& config)
      : config(config), vocabulary(tokenizer, config.stop_token_ids), cache(config.cache_bytes) {
    TESSERA_CHECK(config.vocab_size >= tokenizer.vocab_size(),
                  "grammar vocab_size " << config.vocab_size << " is below the tokenizer's "
                                        << tokenizer.vocab_size());
  }

  // The xgrammar compiler whose vocabulary keeps `markers` (special tokens) as text; one per set,
  // made on first use. Plain constraints use the empty set.
  xgrammar::GrammarCompiler& compiler_for(const std::vector<int32_t>& markers) {
    std::lock_guard lock(compilers_mutex);
    auto it = compilers.find(markers);
    if (it == compilers.end()) {
      xgrammar::TokenizerInfo info(vocabulary.encoded_vocab(markers), xgrammar_vocab_type(vocabulary.encoding()),
                                   config.vocab_size, config.stop_token_ids);
      // Our cache sits above; xgrammar's would hold every grammar a second time.
      auto compiler = std::make_unique<xgrammar::GrammarCompiler>(info, config.threads,
                                                                  /*cache_enabled=*/false);
      it = compilers.emplace(markers, std::move(compiler)).first;
    }
    return *it->second;
  }

  xgrammar::CompiledGrammar compile_uncached(const OutputConstraint& c);

  GrammarCompilerConfig config;
  Vocabulary vocabulary;
  GrammarCache cache;
  std::mutex compilers_mutex;
  std::map<std::vector<int32_t>, std::unique_ptr<xgrammar::GrammarCompiler>> compilers;
};

xgrammar::CompiledGrammar GrammarCompiler::Impl::compile_uncached(const OutputConstraint& c) {
  using Kind = OutputConstraint::Kind;
  switch (c.kind) {
    case Kind::kJsonObject:
      // Not xgrammar's builtin JSON grammar: that one admits a top-level array too. Non-strict
      // mode: an object schema without properties then admits any members.
      return compiler_for({}).CompileJSONSchema(R"({"type": "object"})", c.any_whitespace,
                                                std::nullopt, std::nullopt, /*strict_mode=*/false);
    case Kind::kJsonSchema:
      return compiler_for({}).CompileJSONSchema(grammar_detail::parse_and_check_json_schema(c.text).dump(),
                                                c.any_whitespace);
    case Kind::kRegex:
      return compiler_for({}).CompileRegex(c.text);
    case Kind::kChoice:
      return compiler_for({}).CompileGrammar(choice_grammar(c.choices), "root");
    case Kind::kEbnf:
      return compiler_for({}).CompileGrammar(c.text, "root");
    case Kind::kStructuralTag: {
      auto tag = nlohmann::ordered_json::parse(c.text, nullptr, /*allow_exceptions=*/false);
      if (tag.is_discarded()) throw GrammarError("", "the structural tag is not valid JSON");
      grammar_detail::check_structural_tag_schemas(tag);
      return compiler_for(vocabulary.special_tokens_in(c.text)).CompileStructuralTag(tag.dump());
    }
  }
  throw GrammarError("kind", "unknown constraint kind");
}

GrammarCompiler::GrammarCompiler(const Tokenizer& tokenizer, const GrammarCompilerConfig& config) {
  config.validate();
  impl_ = std::make_unique<Impl>(tokenizer, config);
  impl_->compiler_for({});  // the vocabulary's preprocessing, paid once here rather than per request
}

GrammarCompiler::~GrammarCompiler() = default;

std::shared_ptr<const CompiledGrammar> GrammarCompiler::compile(const OutputConstraint& constraint) {
  const std::string key = cache_key(constraint);
  if (auto cached = impl_->cache.find(key)) return cached;
  try {
    auto compiled = std::make_shared<const CompiledGrammar>(impl_->compile_uncached(constraint));
    return impl_->cache.insert(key, std::move(compiled));
  } catch (const GrammarError&) {
    throw;
  } catch (const std::exception& e) {
    throw GrammarError("", xgrammar_reason(e));
  }
}

int32_t GrammarCompiler::vocab_size() const { return impl_->config.vocab_size; }

int32_t GrammarCompiler::bitmask_words() const { return (impl_->config.vocab_size + 31) / 32; }

struct GrammarMatcher::Impl {
  explicit Impl(std::shared_ptr<const CompiledGrammar> compiled)
      : grammar(std::move(compiled)),
        matcher(grammar->xgrammar),
        vocab_size(grammar->xgrammar.GetTokenizerInfo().GetVocabSize()) {}

  std::shared_ptr<const CompiledGrammar> grammar;  // outlives the matcher that reads it
  xgrammar::GrammarMatcher matcher;
  int32_t vocab_size;
  int32_t accepted = 0;  // tokens that rollback may undo
};

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar) {
  TESSERA_CHECK(grammar != nullptr, "GrammarMatcher needs a compiled grammar");
  impl_ = std::make_unique<Impl>(std::move(grammar));
}

GrammarMatcher::~GrammarMatcher() = default;

bool GrammarMatcher::fill_next_token_bitmask(std::span<int32_t> row) {
  const int32_t words = (impl_->vocab_size + 31) / 32;
  TESSERA_CHECK(static_cast<int64_t>(row.size()) == words,
                "bitmask row has " << row.size() << " words, the vocabulary needs " << words);
  int64_t shape[1] = {words};
  DLTensor tensor{};
  tensor.data = row.data();
  tensor.device = DLDevice{kDLCPU, 0};
  tensor.ndim = 1;
  tensor.dtype = xgrammar::GetBitmaskDLType();
  tensor.shape = shape;
  return impl_->matcher.FillNextTokenBitmask(&tensor);
}

bool GrammarMatcher::accept_token(int32_t token) {
  if (token < 0 || token >= impl_->vocab_size || impl_->matcher.IsTerminated()) return false;
  if (!impl_->matcher.AcceptToken(token)) return false;
  ++impl_->accepted;
  return true;
}

void GrammarMatcher::rollback(int32_t n) {
  TESSERA_CHECK(n >= 0 && n <= impl_->accepted,
                "rollback of " << n << " tokens; " << impl_->accepted << " were accepted");
  if (n == 0) return;
  impl_->matcher.Rollback(n);
  impl_->accepted -= n;
}

bool GrammarMatcher::is_terminated() const { return impl_->matcher.IsTerminated(); }

}  // namespace tessera
