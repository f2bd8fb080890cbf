// server/frontend/tool_calls.h: tool calling beside a model's chat template: the text form its
// model writes calls in, the grammar that keeps those calls parseable and their arguments valid
// against each tool's parameters, and the parser that turns streamed output back into content and
// OpenAI tool_calls.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/grammar/grammar.h"
#include "models/tokenizer/chat_template.h"

namespace tessera {

// How a template's model writes a call:
//   kLlama3Json: {"name": "f", "parameters": {...}}            (Llama 3.1/3.2, JSON tool calls)
//   kMistral:    [TOOL_CALLS] [{"name": "f", "arguments": {...}}, ...]   (Mistral v0.3)
//   kHermes:     <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>   (ChatML)
enum class ToolCallFormat { kLlama3Json, kMistral, kHermes };
const char* tool_call_format_name(ToolCallFormat format);  // "llama3_json", "mistral", "hermes"
// nullopt when the template has no tool format (Llama-2).
std::optional<ToolCallFormat> tool_call_format(ChatTemplateKind kind);

struct ToolChoice {
  enum class Mode { kNone, kAuto, kRequired, kFunction };
  Mode mode = Mode::kAuto;
  std::string function;  // kFunction: the tool's name
};

// The constraint for a request with tools: kRequired and kFunction must start with a call (of that
// function), kAuto may answer in text and constrains a call once it starts; parallel allows more
// than one call. nullopt for kNone or no tools.
std::optional<OutputConstraint> tool_call_constraint(ToolCallFormat format, const std::vector<ToolDefinition>& tools,
                                                     const ToolChoice& choice, bool parallel);

// Part of a call, in stream order: a call's first delta carries its name (and may carry argument
// text); later ones carry only argument fragments. Concatenating a call's fragments gives its
// arguments, a JSON object as text.
struct ToolCallDelta {
  int32_t index = 0;      // 0, 1, ... in the order the calls began
  std::string name;       // non-empty on the call's first delta only
  std::string arguments;  // the next fragment ("" allowed on the first delta)
};

struct ParsedOutput {
  std::string content;                  // text outside calls
  std::vector<ToolCallDelta> tool_calls;
};

// Splits a model's output, fed as it streams in any chunking, into content and calls. Whatever the
// chunking, the concatenated result is the same. Text that may still turn into a call's opening is
// held back until it can be decided.
class ToolCallParser {
 public:
  explicit ToolCallParser(ToolCallFormat format);
  ParsedOutput push(std::string_view text);
  // End of output: releases held-back text; a call left unfinished ends where it stands.
  ParsedOutput finish();
  int32_t calls_started() const;

 private:
  // kText: content, watching for a call's opening; kListOpen: Mistral's "[" after [TOOL_CALLS];
  // kHeader: {"name": "...", "arguments": up to the value; kArguments: the value, streamed;
  // kTrailer: what closes the call; kListNext: Mistral's ", " (next call) or "]".
  enum class State { kText, kListOpen, kHeader, kArguments, kTrailer, kListNext };
  // One transition over pending_; false when pending_ cannot be decided yet.
  bool step(ParsedOutput& out);
  bool step_text(ParsedOutput& out);
  bool step_list_open(ParsedOutput& out);
  bool step_header(ParsedOutput& out);
  bool step_arguments(ParsedOutput& out);
  bool step_trailer();
  bool step_list_next();
  size_t arguments_end();
  // Carries the JSON-string state (in_string_, escaped_) over ch: true when ch is part of a string,
  // its quotes included.
  bool scan_string(char ch);
  void emit_arguments(ParsedOutput& out, std::string_view fragment);
  void start_arguments();

  ToolCallFormat format_;
  std::string pending_;  // text not yet decided
  State state_ = State::kText;
  // The arguments value being scanned: nesting depth, inside a string, after a backslash.
  int32_t depth_ = 0;
  bool in_string_ = false;
  bool escaped_ = false;
  bool value_started_ = false;
  int32_t calls_ = 0;
};

}  // namespace tessera
