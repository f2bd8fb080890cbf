// engine/grammar/grammar.h: constrained decoding. A GrammarCompiler turns what a request's output
// must match (a JSON schema, any JSON object, a regex, one of some strings, an EBNF grammar, or a
// structural tag for tool calls) into a CompiledGrammar for one tokenizer, cached by a hash of the
// constraint. A GrammarMatcher walks one sequence's output through it: the set of tokens allowed
// next, as a bitmask over the vocabulary, and the tokens accepted so far.
//
// The engine under it is xgrammar's C++ core; nothing of xgrammar appears in this header.
//
// Thread safety: GrammarCompiler is safe from any thread. A CompiledGrammar is immutable and shared.
// A GrammarMatcher belongs to one sequence: one thread at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace tessera {

class Tokenizer;

// What a sequence's output must match.
struct OutputConstraint {
  enum class Kind {
    kJsonObject,     // any JSON object
    kJsonSchema,     // text: the schema (JSON)
    kRegex,          // text: the pattern
    kChoice,         // choices: exactly one of them
    kEbnf,           // text: the grammar, GBNF-style EBNF with a `root` rule
    kStructuralTag,  // text: an xgrammar structural tag (JSON): tool calls
  };
  Kind kind = Kind::kJsonObject;
  std::string text;
  std::vector<std::string> choices;
  // JSON kinds: whitespace between tokens is free (true), or exactly Python json.dumps's default
  // form (false): ", " and ": " as separators, no newlines.
  bool any_whitespace = true;
};
const char* constraint_kind_name(OutputConstraint::Kind kind);  // "json_object", "json_schema", ...

// A constraint the engine cannot compile. `where` names the place inside the constraint when it is
// known (e.g. "properties.age.format"), message what is wrong.
class GrammarError : public std::runtime_error {
 public:
  GrammarError(std::string where, const std::string& message);
  const std::string& where() const { return where_; }

 private:
  std::string where_;
};

class CompiledGrammar;

struct GrammarCompilerConfig {
  // Token ids that end a sequence: allowed (only) once the grammar is complete.
  std::vector<int32_t> stop_token_ids;
  // The model's logits width; may exceed the tokenizer's vocabulary (padded embeddings).
  int32_t vocab_size = 0;
  int32_t threads = 2;                 // compile threads
  int64_t cache_bytes = 256ll << 20;   // compiled grammars kept, by a hash of the constraint
  void validate() const;               // throws naming the field
};

class GrammarCompiler {
 public:
  GrammarCompiler(const Tokenizer& tokenizer, const GrammarCompilerConfig& config);
  ~GrammarCompiler();
  // Cached by the constraint's kind, text, choices and whitespace setting. Throws GrammarError.
  std::shared_ptr<const CompiledGrammar> compile(const OutputConstraint& constraint);
  int32_t vocab_size() const;
  // 32-bit words of one bitmask row: ceil(vocab_size / 32).
  int32_t bitmask_words() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);
  ~GrammarMatcher();
  // Bit t of the row (word t / 32, bit t % 32) is set when token t may come next. row has
  // bitmask_words() words. Returns false when every token is allowed (the row is then all ones and
  // need not be applied).
  bool fill_next_token_bitmask(std::span<int32_t> row);
  // Advances over `token`; false (and no change) when the grammar forbids it.
  bool accept_token(int32_t token);
  // Undoes the last n accepted tokens (a rejected speculative draft).
  void rollback(int32_t n);
  // The grammar is complete and a stop token was accepted: nothing may follow.
  bool is_terminated() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tessera
