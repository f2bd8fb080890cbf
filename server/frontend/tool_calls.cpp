// server/frontend/tool_calls.cpp: tool-call formats per chat template, the structural-tag constraint
// that keeps a model's calls parseable, and the streaming parser that splits output into content and
// calls.
#include "server/frontend/tool_calls.h"

#include <algorithm>
#include <initializer_list>

#include <nlohmann/json.hpp>

#include "common/error.h"

namespace tessera {
namespace {

using OrderedJson = nlohmann::ordered_json;

// ---- formats ---------------------------------------------------------------------------------

// The text that opens a call (or, for Mistral, the list of calls).
std::string_view call_opening(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kLlama3Json: return "{\"name\"";
    case ToolCallFormat::kMistral: return "[TOOL_CALLS]";
    case ToolCallFormat::kHermes: return "<tool_call>";
  }
  return "";
}

// The key the model writes its arguments under.
const char* arguments_key(ToolCallFormat format) {
  return format == ToolCallFormat::kLlama3Json ? "parameters" : "arguments";
}

// ---- constraint --------------------------------------------------------------------------------

OrderedJson parameters_schema(const ToolDefinition& tool) {
  if (tool.parameters.empty()) return OrderedJson{{"type", "object"}};
  try {
    // Ordered: xgrammar makes properties follow the schema's declared order.
    return OrderedJson::parse(tool.parameters);
  } catch (const nlohmann::json::exception& e) {
    TESSERA_FAIL("the parameters of tool '" << tool.name << "' are not valid JSON: " << e.what());
  }
}

// One tag per function: its begin carries the name, so the arguments that follow are checked
// against that function's parameters.
OrderedJson call_tag(ToolCallFormat format, const ToolDefinition& tool) {
  const std::string head = "{\"name\": " + OrderedJson(tool.name).dump() + ", \"" + arguments_key(format) + "\": ";
  std::string begin = head, end = "}";
  if (format == ToolCallFormat::kHermes) {
    begin = "<tool_call>\n" + head;
    end = "}\n</tool_call>";
  }
  return OrderedJson{{"type", "tag"},
                     {"begin", begin},
                     {"content", OrderedJson{{"type", "json_schema"}, {"json_schema", parameters_schema(tool)}}},
                     {"end", end}};
}

std::vector<const ToolDefinition*> callable_tools(const std::vector<ToolDefinition>& tools, const ToolChoice& choice) {
  std::vector<const ToolDefinition*> callable;
  for (const auto& tool : tools) {
    if (choice.mode != ToolChoice::Mode::kFunction || tool.name == choice.function) callable.push_back(&tool);
  }
  TESSERA_CHECK(!callable.empty(), "tool_choice names function '" << choice.function << "', which is not in tools");
  return callable;
}

// Mistral writes its calls as one JSON list after [TOOL_CALLS]: a tag for the list whose content is
// the calls, one tag per function, separated by ", ". [TOOL_CALLS] is a control token in v0.3's
// vocabulary; the grammar engine keeps the text of control tokens a structural tag names, so this
// string trigger matches that single token, and the same text in ordinary pieces where a vocabulary
// lacks it. A token-level trigger would not compile for such a vocabulary.
OrderedJson mistral_format(const OrderedJson& tags, bool must_call, bool parallel) {
  const OrderedJson calls{{"type", "tags_with_separator"},
                          {"tags", tags},
                          {"separator", ", "},
                          {"at_least_one", true},
                          {"stop_after_first", !parallel}};
  const OrderedJson list{{"type", "tag"}, {"begin", "[TOOL_CALLS] ["}, {"content", calls}, {"end", "]"}};
  return OrderedJson{{"type", "triggered_tags"},
                     {"triggers", OrderedJson::array({"[TOOL_CALLS]"})},
                     {"tags", OrderedJson::array({list})},
                     {"at_least_one", must_call},
                     {"stop_after_first", true}};
}

}  // namespace

const char* tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kLlama3Json: return "llama3_json";
    case ToolCallFormat::kMistral: return "mistral";
    case ToolCallFormat::kHermes: return "hermes";
  }
  return "unknown";
}

std::optional<ToolCallFormat> tool_call_format(ChatTemplateKind kind) {
  switch (kind) {
    case ChatTemplateKind::kChatML: return ToolCallFormat::kHermes;
    case ChatTemplateKind::kMistral: return ToolCallFormat::kMistral;
    case ChatTemplateKind::kLlama3: return ToolCallFormat::kLlama3Json;
    case ChatTemplateKind::kLlama2: return std::nullopt;
  }
  return std::nullopt;
}

std::optional<OutputConstraint> tool_call_constraint(ToolCallFormat format, const std::vector<ToolDefinition>& tools,
                                                     const ToolChoice& choice, bool parallel) {
  if (tools.empty() || choice.mode == ToolChoice::Mode::kNone) return std::nullopt;
  OrderedJson tags = OrderedJson::array();
  for (const ToolDefinition* tool : callable_tools(tools, choice)) tags.push_back(call_tag(format, *tool));
  const bool must_call = choice.mode != ToolChoice::Mode::kAuto;
  OrderedJson structure;
  if (format == ToolCallFormat::kMistral) {
    structure = mistral_format(tags, must_call, parallel);
  } else {
    // Every begin starts with the trigger, so text is free until a call opens.
    const std::string trigger = format == ToolCallFormat::kHermes ? "<tool_call>" : "{\"name\": ";
    structure = OrderedJson{{"type", "triggered_tags"},
                            {"triggers", OrderedJson::array({trigger})},
                            {"tags", tags},
                            {"at_least_one", must_call},
                            {"stop_after_first", !parallel}};
  }
  OutputConstraint constraint;
  constraint.kind = OutputConstraint::Kind::kStructuralTag;
  constraint.text = OrderedJson{{"type", "structural_tag"}, {"format", structure}}.dump();
  return constraint;
}

// ---- parser --------------------------------------------------------------------------------------

namespace {

enum class Match { kYes, kNo, kNeedMore };

// A position in the undecided text, for matching a call's header piece by piece.
struct Cursor {
  std::string_view text;
  size_t pos = 0;

  void skip_space() {
    while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\n' || text[pos] == '\t' || text[pos] == '\r')) {
      ++pos;
    }
  }
  // Whitespace may still follow at the end of the text: decided only once something else appears.
  Match space_then_more() {
    skip_space();
    return pos < text.size() ? Match::kYes : Match::kNeedMore;
  }
  Match literal(std::string_view want) {
    const std::string_view have = text.substr(pos, want.size());
    if (!want.starts_with(have)) return Match::kNo;
    if (have.size() < want.size()) return Match::kNeedMore;
    pos += want.size();
    return Match::kYes;
  }
  Match one_of(std::initializer_list<std::string_view> options) {
    bool partial = false;
    for (const auto option : options) {
      const Match m = literal(option);
      if (m == Match::kYes) return m;
      partial = partial || m == Match::kNeedMore;
    }
    return partial ? Match::kNeedMore : Match::kNo;
  }
  // A JSON string, decoded into out.
  Match json_string(std::string& out) {
    if (pos >= text.size()) return Match::kNeedMore;
    if (text[pos] != '"') return Match::kNo;
    for (size_t i = pos + 1; i < text.size(); ++i) {
      if (text[i] == '\\') {
        ++i;
      } else if (text[i] == '"') {
        try {
          out = nlohmann::json::parse(text.substr(pos, i + 1 - pos)).get<std::string>();
        } catch (const nlohmann::json::exception&) {
          return Match::kNo;
        }
        pos = i + 1;
        return Match::kYes;
      }
    }
    return Match::kNeedMore;
  }
};

// {"name": "<name>", "<arguments key>": — the header of a call, up to its arguments value.
Match match_call_header(Cursor& c, ToolCallFormat format, std::string& name) {
  const std::string key = std::string("\"") + arguments_key(format) + "\"";
  // Llama 3 models write "arguments" at times; the others only "arguments".
  const std::string alternative = format == ToolCallFormat::kLlama3Json ? "\"arguments\"" : key;
  Match m = c.literal("{");
  if (m == Match::kYes) m = c.space_then_more();
  if (m == Match::kYes) m = c.literal("\"name\"");
  if (m == Match::kYes) m = c.space_then_more();
  if (m == Match::kYes) m = c.literal(":");
  if (m == Match::kYes) m = c.space_then_more();
  if (m == Match::kYes) m = c.json_string(name);
  if (m == Match::kYes) m = c.space_then_more();
  if (m == Match::kYes) m = c.literal(",");
  if (m == Match::kYes) m = c.space_then_more();
  if (m == Match::kYes) m = c.one_of({key, alternative});
  if (m == Match::kYes) m = c.space_then_more();
  if (m == Match::kYes) m = c.literal(":");
  return m;
}

// The longest end of text that is a proper start of opening: it may still become the opening.
size_t partial_opening_at_end(std::string_view text, std::string_view opening) {
  for (size_t n = std::min(text.size(), opening.size() - 1); n > 0; --n) {
    if (opening.starts_with(text.substr(text.size() - n))) return n;
  }
  return 0;
}

void append_delta(ParsedOutput& out, int32_t index, const std::string& name, std::string_view arguments) {
  if (name.empty() && !out.tool_calls.empty() && out.tool_calls.back().index == index) {
    out.tool_calls.back().arguments += arguments;
    return;
  }
  out.tool_calls.push_back({index, name, std::string(arguments)});
}

}  // namespace

ToolCallParser::ToolCallParser(ToolCallFormat format) : format_(format) {}

int32_t ToolCallParser::calls_started() const { return calls_; }

ParsedOutput ToolCallParser::push(std::string_view text) {
  pending_ += text;
  ParsedOutput out;
  while (step(out)) {
  }
  return out;
}

ParsedOutput ToolCallParser::finish() {
  ParsedOutput out;
  while (step(out)) {
  }
  // What is left could not be decided: text that might have opened a call is content; a call's
  // trailer or list punctuation is dropped, its arguments already sent.
  if (state_ == State::kText) out.content += pending_;
  // A call that never got its name was text after all.
  if (state_ == State::kListOpen || state_ == State::kHeader) {
    const bool opening_consumed = format_ != ToolCallFormat::kLlama3Json;
    out.content += (opening_consumed ? std::string(call_opening(format_)) : "") + pending_;
  }
  pending_.clear();
  state_ = State::kText;
  return out;
}

bool ToolCallParser::step(ParsedOutput& out) {
  switch (state_) {
    case State::kText: return step_text(out);
    case State::kListOpen: return step_list_open(out);
    case State::kHeader: return step_header(out);
    case State::kArguments: return step_arguments(out);
    case State::kTrailer: return step_trailer();
    case State::kListNext: return step_list_next();
  }
  return false;
}

bool ToolCallParser::step_text(ParsedOutput& out) {
  const std::string_view opening = call_opening(format_);
  const size_t at = pending_.find(opening);
  if (at == std::string::npos) {
    const size_t keep = partial_opening_at_end(pending_, opening);
    out.content += pending_.substr(0, pending_.size() - keep);
    pending_.erase(0, pending_.size() - keep);
    return false;
  }
  out.content += pending_.substr(0, at);
  // Llama 3's opening is the start of the call's own JSON; the others precede it.
  pending_.erase(0, format_ == ToolCallFormat::kLlama3Json ? at : at + opening.size());
  state_ = format_ == ToolCallFormat::kMistral ? State::kListOpen : State::kHeader;
  return true;
}

bool ToolCallParser::step_list_open(ParsedOutput& out) {
  Cursor c{pending_};
  Match m = c.space_then_more();
  if (m == Match::kYes) m = c.literal("[");
  if (m == Match::kNeedMore) return false;
  if (m == Match::kNo) {
    // Not a list after all: what followed [TOOL_CALLS] is text.
    state_ = State::kText;
    out.content += "[TOOL_CALLS]";
    return true;
  }
  pending_.erase(0, c.pos);
  state_ = State::kHeader;
  return true;
}

bool ToolCallParser::step_header(ParsedOutput& out) {
  Cursor c{pending_};
  c.skip_space();
  std::string name;
  const Match m = match_call_header(c, format_, name);
  if (m == Match::kNeedMore) return false;
  if (m == Match::kNo) {
    // Not a call: give back the opening it consumed and read on as text.
    if (format_ == ToolCallFormat::kLlama3Json) {
      out.content += pending_[0];
      pending_.erase(0, 1);
    } else {
      out.content += std::string(call_opening(format_));
    }
    state_ = State::kText;
    return true;
  }
  pending_.erase(0, c.pos);
  append_delta(out, calls_, name, "");
  ++calls_;
  start_arguments();
  return true;
}

void ToolCallParser::start_arguments() {
  state_ = State::kArguments;
  depth_ = 0;
  in_string_ = escaped_ = value_started_ = false;
}

void ToolCallParser::emit_arguments(ParsedOutput& out, std::string_view fragment) {
  if (!fragment.empty()) append_delta(out, calls_ - 1, "", fragment);
}

bool ToolCallParser::scan_string(char ch) {
  if (in_string_) {
    if (escaped_) {
      escaped_ = false;
    } else if (ch == '\\') {
      escaped_ = true;
    } else if (ch == '"') {
      in_string_ = false;
    }
    return true;
  }
  in_string_ = ch == '"';
  return in_string_;
}

// Where the arguments value ends in pending_ (one past its last character), npos while it goes on.
// What was scanned is sent and cleared, so the scanning state carries over to the next text.
size_t ToolCallParser::arguments_end() {
  for (size_t i = 0; i < pending_.size(); ++i) {
    const char ch = pending_[i];
    if (scan_string(ch)) {
      if (!in_string_ && depth_ == 0) return i + 1;  // a string value
    } else if (ch == '{' || ch == '[') {
      ++depth_;
    } else if (ch == '}' || ch == ']') {
      if (depth_ == 0) return i;  // a scalar value ends at the call's close
      if (--depth_ == 0) return i + 1;
    } else if (depth_ == 0 && (ch == ',' || ch == ' ' || ch == '\n')) {
      return i;
    }
  }
  return std::string::npos;
}

// Streams the arguments value as it arrives, and ends it where its JSON ends.
bool ToolCallParser::step_arguments(ParsedOutput& out) {
  if (!value_started_) {
    Cursor c{pending_};
    const bool more = c.space_then_more() == Match::kNeedMore;
    pending_.erase(0, c.pos);
    if (more) return false;
    value_started_ = true;
  }
  const size_t end = arguments_end();
  if (end == std::string::npos) {
    emit_arguments(out, pending_);
    pending_.clear();
    return false;
  }
  emit_arguments(out, std::string_view(pending_).substr(0, end));
  pending_.erase(0, end);
  // The call object's own close comes next; Mistral may add keys (an id) before it.
  state_ = State::kTrailer;
  depth_ = 1;
  in_string_ = escaped_ = false;
  return true;
}

bool ToolCallParser::step_trailer() {
  if (format_ == ToolCallFormat::kHermes) {
    const size_t end = pending_.find("</tool_call>");
    if (end == std::string::npos) return false;
    pending_.erase(0, end + std::string_view("</tool_call>").size());
    state_ = State::kText;
    return true;
  }
  for (size_t i = 0; i < pending_.size(); ++i) {
    const char ch = pending_[i];
    if (scan_string(ch)) continue;
    if (ch == '{' || ch == '[') {
      ++depth_;
    } else if ((ch == '}' || ch == ']') && --depth_ == 0) {
      pending_.erase(0, i + 1);
      state_ = format_ == ToolCallFormat::kMistral ? State::kListNext : State::kText;
      return true;
    }
  }
  pending_.clear();
  return false;
}

bool ToolCallParser::step_list_next() {
  Cursor c{pending_};
  if (c.space_then_more() == Match::kNeedMore) return false;
  const char ch = pending_[c.pos];
  if (ch == ',') {
    pending_.erase(0, c.pos + 1);
    state_ = State::kHeader;
    return true;
  }
  // "]" closes the list; anything else ends it too, and is text.
  pending_.erase(0, ch == ']' ? c.pos + 1 : c.pos);
  state_ = State::kText;
  return true;
}

}  // namespace tessera
